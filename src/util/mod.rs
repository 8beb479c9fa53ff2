//! Small helpers shared by several modules.

pub mod jsonl;
pub mod rng;
