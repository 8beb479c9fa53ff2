//! The sampling steps of the Toolformer driver, behind one interface every backend implements:
//!
//! - `token_log_probs`: one forward over a long sequence (P(x) ++ x), and at every position the
//!   log-probability of a few given tokens (e.g. "[" and " [") with the log-sum-exp over the whole
//!   vocabulary — the API-call position probabilities p_i of the paper;
//! - `sample`: many continuations of a few prefixes (P(x) ++ x_1..x_{i-1} ++ "["), each prefix
//!   computed once and every sample branching off its cached KV, seeded and deterministic, stopped
//!   at a stop token ("]") or a length cap.

pub mod reference;

pub use reference::ReferenceSampler;

use crate::error::Result;

/// How continuations are drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleOptions {
    /// Maximum new tokens per sample (the stop token included).
    pub max_new_tokens: usize,
    /// Generation of a sample ends after any of these tokens (it is kept in `tokens`).
    pub stop_tokens: Vec<u32>,
    /// Softmax temperature; 0 means greedy (argmax, ties to the lowest id).
    pub temperature: f32,
    /// Sample only among the `top_k` most likely tokens (None: the whole vocabulary).
    pub top_k: Option<usize>,
    /// Base seed. Sample `s` of request `r` draws from its own stream derived from (seed, r, s), so
    /// results do not depend on batching, threads or backend.
    pub seed: u64,
}

impl Default for SampleOptions {
    fn default() -> Self {
        SampleOptions {
            max_new_tokens: 32,
            stop_tokens: Vec::new(),
            temperature: 1.0,
            top_k: None,
            seed: 0,
        }
    }
}

/// One prefix and how many continuations to draw from it.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRequest {
    pub prefix: Vec<u32>,
    pub n_samples: usize,
}

/// One continuation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The generated tokens, the stop token included when one was reached.
    pub tokens: Vec<u32>,
    /// Whether a stop token ended it (false: the length cap did).
    pub stopped: bool,
}

/// The sampling interface of a backend.
pub trait Sampler {
    /// `out[i][j] = log p(tokens[j] | ids[0..=i])` for every position i of `ids`.
    fn token_log_probs(&self, ids: &[u32], tokens: &[u32]) -> Result<Vec<Vec<f32>>>;

    /// `out[r][s]`: sample s of request r.
    fn sample(&self, requests: &[SampleRequest], options: &SampleOptions)
        -> Result<Vec<Vec<Sample>>>;
}
