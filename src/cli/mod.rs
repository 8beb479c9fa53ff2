//! The commands, one module each: its arguments (clap) and its `run`, which calls the library
//! and prints. What they share about files and streams is `streams`; flag values are checked in
//! `values`.

pub(crate) mod annotate;
pub(crate) mod bench;
pub(crate) mod convert;
pub(crate) mod demo;
pub(crate) mod generate;
pub(crate) mod score;
pub(crate) mod streams;
pub(crate) mod values;
