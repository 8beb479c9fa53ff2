//! The embedded demo: a synthetic corpus where tools help (`corpus`), the small GPT-J that the
//! project trains on it (`train`, feature `train`), and the assets built into the binary for
//! `toolsift annotate --demo`.

pub mod corpus;
#[cfg(feature = "train")]
pub mod train;
