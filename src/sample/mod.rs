//! The sampling steps of the Toolformer driver, behind one interface every backend implements:
//!
//! - `token_log_probs`: one forward over a long sequence (P(x) ++ x), and at every position the
//!   log-probability of a few given tokens (e.g. "[" and " [") with the log-sum-exp over the whole
//!   vocabulary — the API-call position probabilities p_i of the paper;
//! - `sample`: many continuations of a few prefixes (P(x) ++ x_1..x_{i-1} ++ "["), each prefix
//!   computed once and every sample branching off its cached KV, seeded and deterministic, stopped
//!   at a stop token ("]") or a length cap;
//! - `propose`: both over one sequence, the branches picked from its log-probs (the driver's
//!   positions) sampled off the KV that the log-probs were computed with, so P(x) ++ x is
//!   computed once per document and tool.

pub(crate) mod batch;
pub(crate) mod cached;
pub mod kv_tree;
pub mod reference;

pub use reference::ReferenceSampler;

use crate::error::{Error, Result};
use crate::util::rng::Rng;

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
    /// Token ids the continuations follow: not empty, each below vocab_size, its length plus
    /// `max_new_tokens` at most n_positions (every sampler refuses the request otherwise).
    pub prefix: Vec<u32>,
    /// Continuations to draw from it; sample s draws from `sample_rng(seed, r, s)`. Over one
    /// call, the samples times `max(max_new_tokens, 1)` may not exceed `u32::MAX` (the engines'
    /// row index): more is an input error.
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

/// Where `Sampler::propose` draws samples: after the first `at` tokens of its sequence and then
/// `token` (the request whose prefix is `ids[..at] ++ [token]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    /// Tokens of the sequence the branch keeps, `0..=ids.len()`: samples continue from
    /// `ids[..at]`, then `token`.
    pub at: usize,
    /// The token appended after `ids[..at]` (the driver's "[" or " [").
    pub token: u32,
    /// Continuations to draw from the branch (a `SampleRequest`'s `n_samples`).
    pub n_samples: usize,
}

/// The `sample` requests equivalent to `branches` of `ids` (request r: prefix `ids[..at_r] ++
/// [token_r]`, `n_samples_r` samples): what `Sampler::propose` must return the samples of. Fails
/// on a branch past the end of `ids`.
pub fn branch_requests(ids: &[u32], branches: &[Branch]) -> Result<Vec<SampleRequest>> {
    branches
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let head = ids.get(..b.at).ok_or_else(|| {
                Error::input(format!(
                    "branch {r}: at {} is past the end of the {}-token sequence",
                    b.at,
                    ids.len()
                ))
            })?;
            Ok(SampleRequest {
                prefix: [head, &[b.token]].concat(),
                n_samples: b.n_samples,
            })
        })
        .collect()
}

/// `Sampler::propose` as two calls on `sampler`: `token_log_probs`, then `sample` on the
/// branches `choose` picks. The trait's default, and the reference sampler's with `limits`
/// (vocab_size, n_positions) to check the branches as the cached samplers do
/// (`batch::choose_branches`: a bad one is named "branch r", not "request r").
pub(crate) fn propose_in_two_calls<S: Sampler + ?Sized>(
    sampler: &S,
    ids: &[u32],
    tokens: &[u32],
    choose: &mut Choose<'_>,
    options: &SampleOptions,
    limits: Option<(usize, usize)>,
) -> Result<Proposal> {
    let log_probs = sampler.token_log_probs(ids, tokens)?;
    let (branches, requests) = match limits {
        Some((vocab_size, n_positions)) => {
            batch::choose_branches(ids, &log_probs, choose, options, vocab_size, n_positions)?
        }
        None => {
            let branches = choose(&log_probs);
            let requests = branch_requests(ids, &branches)?;
            (branches, requests)
        }
    };
    let samples = sampler.sample(&requests, options)?;
    Ok(Proposal {
        log_probs,
        branches,
        samples,
    })
}

/// What `Sampler::propose` returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// `token_log_probs(ids, tokens)`.
    pub log_probs: Vec<Vec<f32>>,
    /// The branches `choose` picked, in its order.
    pub branches: Vec<Branch>,
    /// `samples[r][s]`: sample s of branch r.
    pub samples: Vec<Vec<Sample>>,
}

/// Picks the branches of `Sampler::propose` from the log-probs of its sequence.
pub type Choose<'a> = dyn FnMut(&[Vec<f32>]) -> Vec<Branch> + 'a;

/// The sampling interface of a backend (`Send + Sync`, as `Scorer`).
pub trait Sampler: Send + Sync {
    /// `out[i][j] = log p(tokens[j] | ids[0..=i])` for every position i of `ids`.
    fn token_log_probs(&self, ids: &[u32], tokens: &[u32]) -> Result<Vec<Vec<f32>>>;

    /// `out[r][s]`: sample s of request r.
    fn sample(
        &self,
        requests: &[SampleRequest],
        options: &SampleOptions,
    ) -> Result<Vec<Vec<Sample>>>;

    /// Both steps over one sequence: `token_log_probs(ids, tokens)`, then `sample` of the
    /// branches `choose` picks from those log-probs (request r: `ids[..at_r] ++ [token_r]`, drawing
    /// from `sample_rng(seed, r, s)` as `sample` does). A KV-cached backend computes `ids` once
    /// for both, where the two calls would prefill the branches' shared prefix again; the results
    /// are those of the two calls up to float rounding. `choose` must not call this engine: the
    /// CUDA engine holds its device through `choose` and refuses such a call with an error.
    fn propose(
        &self,
        ids: &[u32],
        tokens: &[u32],
        choose: &mut Choose<'_>,
        options: &SampleOptions,
    ) -> Result<Proposal> {
        propose_in_two_calls(self, ids, tokens, choose, options, None)
    }
}

/// Refuses draw settings that would silently mean something else: a temperature that is negative
/// or not finite, a `top_k` of 0 (None means the whole vocabulary). Shared by `sample`'s checks
/// and `generate`'s options.
pub fn check_draw_options(temperature: f32, top_k: Option<usize>) -> Result<()> {
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(Error::input(format!(
            "sampling temperature {temperature} must be finite and >= 0"
        )));
    }
    if top_k == Some(0) {
        return Err(Error::input(
            "top_k must be at least 1 (None samples from the whole vocabulary)",
        ));
    }
    Ok(())
}

/// The random stream of sample `s` of request `r`: independent of batching and backend.
pub fn sample_rng(seed: u64, request: usize, sample: usize) -> Rng {
    Rng::keyed(seed, &[request as u64, sample as u64])
}

/// Draws the next token from a row of log-probabilities under `options` (greedy when the
/// temperature is 0; ties go to the lowest id). `options` are taken as `check_draw_options`
/// passes them (the samplers check them first): here `top_k: Some(0)` keeps the whole
/// vocabulary, as None does. An empty row, or one with no finite value, gives id 0.
pub fn draw(log_probs: &[f32], options: &SampleOptions, rng: &mut Rng) -> u32 {
    let argmax = || {
        log_probs
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                if v > bv {
                    (i, v)
                } else {
                    (bi, bv)
                }
            })
            .0 as u32
    };
    if options.temperature <= 0.0 {
        return argmax();
    }
    let mut candidates: Vec<(u32, f32)> = log_probs
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if let Some(k) = options.top_k {
        if k > 0 && k < candidates.len() {
            // Highest first, ties to the lowest id: deterministic whatever the sort.
            candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            candidates.truncate(k);
        }
    }
    let t = options.temperature as f64;
    let max = candidates
        .iter()
        .fold(f64::NEG_INFINITY, |m, &(_, v)| m.max(v as f64 / t));
    let weights: Vec<f64> = candidates
        .iter()
        .map(|&(_, v)| (v as f64 / t - max).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    if !(total > 0.0 && total.is_finite()) {
        return argmax();
    }
    let mut u = rng.uniform() * total;
    for (&(id, _), w) in candidates.iter().zip(&weights) {
        if u < *w {
            return id;
        }
        u -= w;
    }
    // Rounding left u past the last weight: the last candidate that can be drawn (a masked or
    // -inf one has weight 0; total > 0 means one has more).
    candidates
        .iter()
        .zip(&weights)
        .rev()
        .find(|(_, &w)| w > 0.0)
        .map_or(0, |(c, _)| c.0)
}

/// Incremental decoding with a KV cache, for the interrupt-execute-resume loop of tool-calling
/// generation: sequences grow by any tokens (sampled ones, or a tool's result spliced in), and
/// only the new tokens are computed.
pub trait Decoder {
    /// A fresh cache for a batch of sequences. `Send`: a session may move to another thread
    /// (a worker, an async task across an await) while it borrows the engine.
    fn session(&self) -> Box<dyn DecodeSession + Send + '_>;
}

/// A batch of growing sequences sharing one KV cache.
pub trait DecodeSession {
    /// Adds an empty sequence; returns its index.
    fn new_sequence(&mut self) -> usize;

    /// Appends `tokens[k]` (at least one) to sequence `sequences[k]` for every k, in one batched
    /// forward; returns per k the log-softmax over the vocabulary after its last new token.
    /// A large call runs as several forwards within the engine's memory budget; the results are
    /// those of one forward up to float rounding.
    fn extend(&mut self, sequences: &[usize], tokens: &[Vec<u32>]) -> Result<Vec<Vec<f32>>>;

    /// A hint: the session's sequences will grow by about `rows` more tokens in all, so the cache
    /// can be sized once instead of growing (on CUDA by doubling, which can leave up to half of
    /// it unused and counted against the scorer's budget). Past it, `extend` grows as needed.
    fn reserve(&mut self, rows: usize) {
        let _ = rows;
    }

    /// Tokens in sequence `sequence`; 0 for an index that is no sequence of this session.
    fn len(&self, sequence: usize) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_top_1_pick_the_argmax() {
        let lp = [-3.0f32, -0.5, -0.5, -9.0];
        let mut rng = Rng::new(1);
        let greedy = SampleOptions {
            temperature: 0.0,
            ..Default::default()
        };
        assert_eq!(draw(&lp, &greedy, &mut rng), 1);
        let top1 = SampleOptions {
            top_k: Some(1),
            ..Default::default()
        };
        assert_eq!(draw(&lp, &top1, &mut rng), 1);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let lp = [0.7f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
        let mut rng = Rng::new(3);
        let mut counts = [0usize; 3];
        for _ in 0..20000 {
            counts[draw(&lp, &SampleOptions::default(), &mut rng) as usize] += 1;
        }
        assert!(
            (counts[0] as f64 / 20000.0 - 0.7).abs() < 0.02,
            "{counts:?}"
        );
        assert!(
            (counts[2] as f64 / 20000.0 - 0.1).abs() < 0.02,
            "{counts:?}"
        );
    }

    /// The temperature divides the log-probabilities (t = 2 turns 0.9 / 0.1 into 0.75 / 0.25;
    /// multiplying would give 0.99 / 0.01), and top-k keeps exactly k: with k one less than the
    /// row, the least likely token is never drawn, and every other one is.
    #[test]
    fn temperature_and_top_k_shape_the_draws() {
        let lp = [0.9f32.ln(), 0.1f32.ln()];
        let hot = SampleOptions {
            temperature: 2.0,
            ..Default::default()
        };
        let mut rng = Rng::new(5);
        let n = 20000;
        let ones = (0..n).filter(|_| draw(&lp, &hot, &mut rng) == 1).count();
        let want = 0.1f64.sqrt() / (0.9f64.sqrt() + 0.1f64.sqrt());
        assert!(
            (ones as f64 / n as f64 - want).abs() < 0.02,
            "{ones} of {n}"
        );
        let lp = [0.4f32.ln(), 0.3f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
        let top3 = SampleOptions {
            top_k: Some(3),
            temperature: 3.0,
            ..Default::default()
        };
        let mut seen = [0usize; 4];
        for _ in 0..5000 {
            seen[draw(&lp, &top3, &mut rng) as usize] += 1;
        }
        assert_eq!(seen[3], 0, "{seen:?}");
        assert!(seen[..3].iter().all(|&c| c > 500), "{seen:?}");
    }

    /// Draws of `draw(lp, options, ..)` over a few seeds: which ids came up.
    fn drawn(lp: &[f32], options: &SampleOptions) -> Vec<u32> {
        let mut rng = Rng::new(7);
        let mut ids: Vec<u32> = (0..200).map(|_| draw(lp, options, &mut rng)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// `draw` takes `top_k: Some(0)` as the whole vocabulary (its docs), not as no candidate
    /// at all, which would leave only the argmax fallback.
    #[test]
    fn top_k_of_0_in_draw_samples_the_whole_row() {
        let lp = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let options = SampleOptions {
            top_k: Some(0),
            ..Default::default()
        };
        assert_eq!(drawn(&lp, &options), [0, 1, 2]);
    }

    /// A low temperature scales the log-probs up past f64's exponent range (-693 / 0.0005):
    /// the weights are taken relative to the scaled maximum, so two equally likely tokens stay
    /// equally likely instead of underflowing to the argmax fallback.
    #[test]
    fn a_low_temperature_still_samples_among_equally_likely_tokens() {
        let lp = [0.5f32.ln(), 0.5f32.ln(), -50.0];
        let cold = SampleOptions {
            temperature: 0.0005,
            ..Default::default()
        };
        assert_eq!(drawn(&lp, &cold), [0, 1]);
    }

    /// A row whose weights are not finite (+inf: an overflowed logit) draws its argmax, the
    /// infinite token, as the limit of its probability; not the fallback's id 0.
    #[test]
    fn a_row_with_plus_infinity_draws_the_infinite_token() {
        let lp = [-1.0f32, f32::INFINITY, -2.0];
        assert_eq!(drawn(&lp, &SampleOptions::default()), [1]);
    }
}
