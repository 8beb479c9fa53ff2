//! toolsift: a fast engine for Toolformer's API-call filter.
//!
//! Toolformer (Schick et al., NeurIPS 2023) keeps a sampled API call only when its result lowers the
//! model's loss on the next few tokens. toolsift scores those candidates with a hand-written GPT-J
//! forward: a plain f64 reference (the oracle) and faster backends proven equal to it.
//!
//! ```no_run
//! use toolsift::{Model, ReferenceScorer, ScoreOptions, Scorer, TokenCandidate};
//! # fn main() -> toolsift::Result<()> {
//! let model = Model::load("tests/fixtures/tiny-gptj".as_ref())?;
//! let scorer = ReferenceScorer::new(&model);
//! let candidate = TokenCandidate {
//!     text_ids: vec![329, 266, 451, 455, 338, 11, 285].into(),
//!     position: 5,
//!     call_ids: vec![58, 344, 7, 19, 455, 8, 60, 220],
//!     call_result_ids: vec![58, 344, 7, 19, 455, 8, 342, 415, 60, 220],
//!     weights: None,
//! };
//! let scores = scorer.score(&[candidate], &ScoreOptions::default())?;
//! println!("delta = {}, kept = {}", scores[0].delta, scores[0].kept(1.0));
//! # Ok(()) }
//! ```

pub mod annotate;
pub mod backend;
#[cfg(feature = "baselines")]
pub mod baselines;
pub mod bench;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod demo;
#[cfg(feature = "emu")]
pub mod emu;
pub mod error;
pub mod generate;
pub mod model;
pub mod plan;
pub mod reference;
pub mod sample;
pub mod score;
pub mod util;
pub mod workload;

pub use backend::{scorer_for, Device};
pub use error::{Error, Result};
pub use model::{GptjConfig, Model};
pub use score::{
    CallForm, Placement, ReferenceScorer, ScoreOptions, Scorer, Scores, TextCandidate,
    TokenCandidate, Variant,
};
