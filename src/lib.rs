//! toolsift: a fast engine for Toolformer's API-call filter.
//!
//! Toolformer (Schick et al., NeurIPS 2023) keeps a sampled API call only when its result lowers
//! the model's loss on the next few tokens. toolsift scores those candidates with a hand-written
//! GPT-J forward: a plain f64 reference (the oracle) and faster backends property-tested against
//! it within float tolerance.
//!
//! Text-level candidates on the fast CPU engine, with the demo model embedded in the crate
//! (`demo::assets::materialize` writes it to a folder once; any Hugging Face GPT-J folder loads
//! the same way):
//!
//! ```
//! use toolsift::{score_texts, scorer_for, CallForm, Device, Model, Placement, ScoreOptions};
//! use toolsift::TextCandidate;
//! # #[cfg(not(feature = "annotate"))] fn main() {} // the demo model comes with the driver
//! # #[cfg(feature = "annotate")]
//! # fn main() -> toolsift::Result<()> {
//! let model = Model::load(&toolsift::demo::assets::materialize()?)?;
//! // Send + Sync: threads can share it (each call holds up to its memory budget).
//! let scorer = scorer_for(&model, Device::Cpu)?;
//! let text = "Each of the boxes costs 25 dollars, so 12 of them cost 300 dollars.";
//! // Before " 300" (a byte offset on a token boundary): [Calculator(25 * 12) -> 300].
//! let position = text.find(" 300").unwrap();
//! let candidate = TextCandidate::new(text, position, "Calculator", "25 * 12", "300");
//! // The paper's weights; the call spliced into the text, as the demo model was trained to read it
//! // (the default is the paper's prefix placement).
//! let options = ScoreOptions { placement: Placement::Inline, ..ScoreOptions::default() };
//! let tokenizer = model.tokenizer()?;
//! let scores = score_texts(&*scorer, tokenizer, &[candidate], &options, CallForm::Arrow)?;
//! assert!(scores[0].kept(0.5)); // L- - L+ >= tau_f: the result helps predict " 300"
//! # Ok(()) }
//! ```
//!
//! Token-level candidates (`TokenCandidate`) go to `Scorer::score` directly; the annotate driver
//! that builds C* is `annotate::run_job`. With the scoring core alone (`default-features =
//! false`), on a random model built in memory (`Model::load` reads a folder the same way):
//!
//! ```
//! use toolsift::model::{DType, GptjWeights};
//! use toolsift::{scorer_for, Device, Error, GptjConfig, InvalidCandidate, Model};
//! use toolsift::{ScoreOptions, TokenCandidate};
//! # fn main() -> toolsift::Result<()> {
//! let config = GptjConfig::small(2, 32, 4, 8, 64); // n_layer, n_embd, n_head, rotary_dim, vocab
//! let weights = GptjWeights::random(&config, 1, DType::F32);
//! let model = Model::from_parts(config, weights, None)?;
//! let scorer = scorer_for(&model, Device::Cpu)?;
//! let candidate = TokenCandidate {
//!     text_ids: vec![5, 6, 7, 8, 9, 10].into(), // x_1 .. x_n
//!     position: 2,                              // x_i: the call goes before text_ids[2]
//!     call_ids: vec![1, 20, 21, 2],             // e(c, eps), separator included
//!     call_result_ids: vec![1, 20, 21, 30, 2],  // e(c, r)
//!     weights: None,                            // the options' (the paper's)
//! };
//! let scores = scorer.score(&[candidate.clone()], &ScoreOptions::default())?;
//! assert!(scores[0].delta.is_finite());
//! // A bad candidate fails the batch, naming it and why: drop it and score the rest (or
//! // `score_each`: each candidate's scores or its error, in its place).
//! let bad = TokenCandidate { call_ids: vec![64], ..candidate };
//! match scorer.score(&[bad], &ScoreOptions::default()) {
//!     Err(Error::Candidate {
//!         index,
//!         reason: InvalidCandidate::OutOfVocabulary { field, .. },
//!         ..
//!     }) => assert_eq!((index, field), (0, "call_ids")),
//!     other => panic!("{other:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! Features: the default, `cli`, is the `toolsift` command and the annotate driver (`annotate`:
//! annotate, generate, the demo and the tools). An embedder that only scores takes
//! `default-features = false`: model loading, the reference, the CPU engine, the planner and
//! sampling, without tantivy, ureq or clap; `cuda` adds the GPU engine to either.
//!
//! Stability: the API is what the crate root re-exports and the modules `score`, `model`,
//! `backend`, `sample`, `generate`, `annotate` and `error`. The engines' parts (`cpu`'s
//! kernels, `cuda`, `plan`, `reference`, `model::rotary`, `model::torch_bin`'s reader,
//! `sample::kv_tree`, and `sample::draw` and `sample_rng` with `util`'s `Rng`), `bench`,
//! `workload`, `util`, `emu` and `baselines` are public for the benchmarks, the kernel fuzz
//! tests, the CUDA engine and the CLI, and may change in any release;
//! so may the dependency types that show through (`Tokenizer::inner`'s `tokenizers` type,
//! `cuda`'s `cudarc`).

// Every public item is documented (CI denies warnings, so a new one without docs fails it).
#![warn(missing_docs)]

#[cfg(feature = "annotate")]
pub mod annotate;
pub mod backend;
#[cfg(feature = "baselines")]
pub mod baselines;
pub mod bench;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "annotate")]
pub mod demo;
#[cfg(feature = "emu")]
pub mod emu;
pub mod error;
#[cfg(feature = "annotate")]
pub mod generate;
pub mod model;
pub mod plan;
pub mod reference;
mod run_stats;
pub mod sample;
pub mod score;
pub mod util;
pub mod workload;

pub use backend::{
    decoder_for, engine_for, engine_with_memory_budget, scorer_for, scorer_from_model,
    scorer_with_memory_budget, Device, Engine, RunStats,
};
pub use error::{Error, Result};
pub use model::{GptjConfig, Model};
pub use score::{
    score_each, score_texts, score_texts_each, CallForm, InvalidCandidate, LossWeights, Placement,
    ReferenceScorer, ScoreOptions, Scorer, Scores, TextCandidate, TokenCandidate, Variant,
};
/// The JSON values of the public API (document ids, run settings, C* records).
pub use serde_json;
