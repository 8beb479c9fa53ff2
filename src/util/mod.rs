//! Small helpers shared by several modules.

pub mod rng;
