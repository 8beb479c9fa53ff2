//! The Toolformer driver: corpus in, C* out. Prompts, position and call sampling, tools, filtering
//! with a scoring backend, splicing, resumable output.

pub mod tools;
