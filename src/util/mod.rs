//! Small helpers shared by several modules.

pub mod fs;
pub mod json;
pub mod jsonl;
pub mod rng;
