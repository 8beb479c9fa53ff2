//! Small helpers shared by several modules.

#![warn(missing_docs)]

pub mod fs;
pub mod json;
pub mod jsonl;
pub mod rng;
