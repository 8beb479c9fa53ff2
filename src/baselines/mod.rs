//! The three candle baselines toolsift's engine is benchmarked against (docs/benchmarks.md), behind
//! the `baselines` feature so that the default build never compiles candle.
//!
//! - `naive`: what most people write first. Every variant of every candidate is its own full
//!   forward over the whole text, full logits, log-softmax over the vocabulary, loss afterwards.
//! - `tuned`: what a careful engineer writes without a custom engine. Sequences cut at the last
//!   weighted token, identical sequences run once, the LM head only at weighted rows,
//!   length-sorted batches.
//! - `tuned_kv`: the tuned baseline with a KV cache of each text: in inline placement a call
//!   variant runs only from where it leaves the text (DESIGN's tuned baseline does not share
//!   x_<i; this one does, so that "vs tuned-kv" inline measures the engine and the sharing a
//!   cache alone does not give, not x_<i's).
//!
//! All three run the same ordinary candle GPT-J (`gptj`) in f32 on the CPU and return
//! [L_none, L_call, L_call_result] per candidate, equal to `ReferenceScorer` up to f32 rounding.
//! Batches are right-padded with token 0; the pad tokens are counted in `*_tokens` because the
//! trunk computes them.

pub mod gptj;
pub mod naive;
pub mod tuned;
pub mod tuned_kv;

pub use gptj::CandleGptj;
pub use naive::{check_whole_texts_fit, naive_losses, naive_tokens};
pub use tuned::{tuned_losses, tuned_tokens};
pub use tuned_kv::{tuned_kv_losses, tuned_kv_tokens};

use crate::error::{Error, Result};
use crate::model::GptjConfig;
use crate::score::{validate, ScoreOptions, Scorer, TokenCandidate};

/// A candle error as toolsift's: the baselines are a backend, so it is a backend failure.
pub(crate) fn backend_error(e: candle_core::Error) -> Error {
    Error::Backend(format!("candle baseline: {e}"))
}

/// The checks `Scorer::score` makes, so that the free functions refuse what the engine refuses
/// (an id outside the vocabulary would otherwise fail deep inside candle, or not at all).
pub(crate) fn check_candidates(
    config: &GptjConfig,
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
    batch_size: usize,
) -> Result<()> {
    if batch_size == 0 {
        return Err(Error::input("batch_size must be at least 1"));
    }
    for (k, c) in candidates.iter().enumerate() {
        validate(c, config, options).map_err(|e| Error::candidate(k, e))?;
    }
    Ok(())
}

/// Trunk tokens of `lengths` run in consecutive batches of `batch_size` right-padded sequences:
/// each batch costs its size times its longest sequence.
pub(crate) fn padded_tokens(lengths: impl IntoIterator<Item = usize>, batch_size: usize) -> usize {
    let lengths: Vec<usize> = lengths.into_iter().collect();
    lengths
        .chunks(batch_size.max(1))
        .map(|b| b.len() * b.iter().copied().max().unwrap_or(0))
        .sum()
}

/// Which baseline a `BaselineScorer` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// `naive_losses`: three full forwards per candidate over the whole text, full logits.
    Naive,
    /// `tuned_losses`: cut, deduplicated, length-sorted sequences, the LM head at weighted rows.
    Tuned,
    /// `tuned_kv_losses`: the tuned method, with each call variant run from where it leaves the
    /// text, over the text's KV cache.
    TunedKv,
}

/// A baseline behind the `Scorer` trait, so that benchmarks and tests drive it like any backend.
#[derive(Debug, Clone)]
pub struct BaselineScorer {
    model: CandleGptj,
    baseline: Baseline,
    batch_size: usize,
}

impl BaselineScorer {
    /// Runs `baseline` on `model`, `batch_size` sequences per forward (0 makes every scoring
    /// call fail with an input error).
    pub fn new(model: CandleGptj, baseline: Baseline, batch_size: usize) -> Self {
        BaselineScorer {
            model,
            baseline,
            batch_size,
        }
    }

    /// The candle model it runs.
    pub fn model(&self) -> &CandleGptj {
        &self.model
    }

    /// Tokens this baseline pushes through the trunk for `candidates`, padding included.
    pub fn tokens(&self, candidates: &[TokenCandidate], options: &ScoreOptions) -> usize {
        match self.baseline {
            Baseline::Naive => naive_tokens(candidates, options, self.batch_size),
            Baseline::Tuned => tuned_tokens(candidates, options, self.batch_size),
            Baseline::TunedKv => tuned_kv_tokens(candidates, options, self.batch_size),
        }
    }
}

impl Scorer for BaselineScorer {
    fn name(&self) -> &str {
        match self.baseline {
            Baseline::Naive => "candle-naive",
            Baseline::Tuned => "candle-tuned",
            Baseline::TunedKv => "candle-tuned-kv",
        }
    }

    fn config(&self) -> &GptjConfig {
        self.model.config()
    }

    fn variant_losses_unchecked(
        &self,
        candidates: &[TokenCandidate],
        options: &ScoreOptions,
    ) -> Result<Vec<[f64; 3]>> {
        match self.baseline {
            Baseline::Naive => naive_losses(&self.model, candidates, options, self.batch_size),
            Baseline::Tuned => tuned_losses(&self.model, candidates, options, self.batch_size),
            Baseline::TunedKv => tuned_kv_losses(&self.model, candidates, options, self.batch_size),
        }
    }
}

/// The unit tests' hand-worked candidate: a call of 2 tokens (ids 20, 21) whose result adds one
/// (22), at `position` of a text whose token ids are `text`.
#[cfg(test)]
fn call_at(text: std::ops::Range<u32>, position: usize) -> TokenCandidate {
    TokenCandidate {
        text_ids: text.collect::<Vec<_>>().into(),
        position,
        call_ids: vec![20, 21],
        call_result_ids: vec![20, 21, 22],
        weights: None,
    }
}
