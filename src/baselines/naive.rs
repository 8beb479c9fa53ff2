//! The "naive" baseline (docs/benchmarks.md): scoring as most people first write it. For every
//! candidate, three independent forward passes (no call, call, call with result) over the whole
//! sequence, not cut after the last weighted token; full logits [B, T, vocab]; log-softmax over the
//! whole vocabulary; the loss picked out of that afterwards. Sequences are batched in input order,
//! `batch_size` at a time, right-padded to the longest of the batch.
//!
//! The model is causal, so the extra tokens after the window change no loss: the rows and targets
//! are exactly `variant_sequence`'s, only the work differs.

use candle_core::{Tensor, D};

use super::gptj::{right_padded_batch, CandleGptj};
use super::{backend_error, check_candidates, padded_tokens};
use crate::error::{Error, Result};
use crate::model::GptjConfig;
use crate::score::{
    variant_sequence, InvalidCandidate, Placement, ScoreOptions, TokenCandidate, Variant,
};

/// One variant of one candidate as the naive baseline runs it.
struct NaiveSequence {
    candidate: usize,
    variant: Variant,
    /// Prefix: z ++ x_1 .. x_n. Inline: x_1 .. x_{i-1} ++ z ++ x_i .. x_n. The whole text.
    ids: Vec<u32>,
    /// (row, token, weight): L = -sum weight * log p(token | ids[0..=row]).
    targets: Vec<(usize, u32, f64)>,
}

/// Every variant of every candidate, candidate-major, in input order.
fn sequences(candidates: &[TokenCandidate], options: &ScoreOptions) -> Vec<NaiveSequence> {
    candidates
        .iter()
        .enumerate()
        .flat_map(|(k, c)| {
            Variant::ALL.map(|variant| {
                let (z, x) = (c.prefix(variant), &c.text_ids[..]);
                let ids = match options.placement {
                    Placement::Prefix => [z, x].concat(),
                    Placement::Inline => [&x[..c.position], z, &x[c.position..]].concat(),
                };
                // The uncut sequence extends variant_sequence's, so its rows are the same.
                let targets = variant_sequence(c, variant, options).targets;
                NaiveSequence {
                    candidate: k,
                    variant,
                    ids,
                    targets,
                }
            })
        })
        .collect()
}

/// Whether every variant of `candidates` fits n_positions whole (call + the whole text), as the
/// naive baseline runs it; `naive_losses` checks it, and a caller can too before any model runs.
pub fn check_whole_texts_fit(config: &GptjConfig, candidates: &[TokenCandidate]) -> Result<()> {
    for (k, c) in candidates.iter().enumerate() {
        // The same length under either placement: z and the whole text.
        let longest = c.call_ids.len().max(c.call_result_ids.len()) + c.text_ids.len();
        if longest > config.n_positions {
            return Err(Error::candidate(
                k,
                InvalidCandidate::Other(format!(
                    "the naive baseline runs the whole text, and call + text is {longest} \
                     tokens, longer than n_positions ({})",
                    config.n_positions
                )),
            ));
        }
    }
    Ok(())
}

/// [L_none, L_call, L_call_result] per candidate, in order, by the naive method.
///
/// Candidates are validated as `Scorer::score` does. Because the whole text runs, call + text must
/// also fit in n_positions (the engine only needs call + text up to the window's end to).
pub fn naive_losses(
    model: &CandleGptj,
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
    batch_size: usize,
) -> Result<Vec<[f64; 3]>> {
    let config = model.config();
    check_candidates(config, candidates, options, batch_size)?;
    check_whole_texts_fit(config, candidates)?;
    let seqs = sequences(candidates, options);
    let mut losses = vec![[0.0; 3]; candidates.len()];
    for batch in seqs.chunks(batch_size) {
        let log_probs = batch_log_probs(model, batch).map_err(backend_error)?;
        let mut log_probs = log_probs.into_iter();
        for s in batch {
            for &(_, _, w) in &s.targets {
                let lp = log_probs.next().expect("one log-prob per target");
                losses[s.candidate][s.variant as usize] -= w * f64::from(lp);
            }
        }
    }
    Ok(losses)
}

/// log p(token | ids[0..=row]) for every target of every sequence of `batch`, in order.
fn batch_log_probs(model: &CandleGptj, batch: &[NaiveSequence]) -> candle_core::Result<Vec<f32>> {
    let seqs: Vec<&[u32]> = batch.iter().map(|s| &s.ids[..]).collect();
    let ids = right_padded_batch(&seqs, model.device())?; // [B, T]
    let (b, t) = ids.dims2()?;
    let hidden = model.forward_hidden(&ids)?; // [B, T, d]
    let logits = model.logits(&hidden)?; // [B, T, vocab]
    let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?; // [B, T, vocab]

    // Afterwards, the loss terms: the flat row b * T + row, then the target's column.
    let (rows, tokens): (Vec<u32>, Vec<u32>) = batch
        .iter()
        .enumerate()
        .flat_map(|(bi, s)| {
            s.targets
                .iter()
                .map(move |&(row, token, _)| ((bi * t + row) as u32, token))
        })
        .unzip();
    if rows.is_empty() {
        return Ok(Vec::new()); // every weight was zero
    }
    let n = rows.len();
    let vocab = log_probs.dim(D::Minus1)?;
    log_probs
        .reshape((b * t, vocab))? // [B * T, vocab]
        .index_select(&Tensor::from_vec(rows, n, model.device())?, 0)? // [N, vocab]
        .gather(&Tensor::from_vec(tokens, (n, 1), model.device())?, 1)? // [N, 1]
        .flatten_all()?
        .to_vec1::<f32>()
}

/// Tokens `naive_losses` pushes through the trunk with this `batch_size`, padding included. The
/// placement moves the call but not the count, so the options do not matter here.
pub fn naive_tokens(
    candidates: &[TokenCandidate],
    _options: &ScoreOptions,
    batch_size: usize,
) -> usize {
    let lengths = candidates.iter().flat_map(|c| {
        let n = c.text_ids.len();
        Variant::ALL.map(|v| c.prefix(v).len() + n)
    });
    padded_tokens(lengths, batch_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::call_at;

    /// The naive baseline runs every variant whole, not cut after its last weighted token (what
    /// `naive_tokens` counts), with the call where the placement puts it.
    #[test]
    fn sequences_are_whole_texts_with_the_call_placed() {
        let c = call_at(0..12, 2);
        let text: Vec<u32> = (0..12).collect();
        for (placement, call_result) in [
            (Placement::Prefix, [&[20, 21, 22][..], &text].concat()),
            (
                Placement::Inline,
                [&text[..2], &[20, 21, 22], &text[2..]].concat(),
            ),
        ] {
            let options = ScoreOptions {
                placement,
                ..Default::default()
            };
            let seqs = sequences(std::slice::from_ref(&c), &options);
            let lengths: Vec<usize> = seqs.iter().map(|s| s.ids.len()).collect();
            assert_eq!(lengths, [12, 14, 15], "{placement:?}");
            assert_eq!(seqs[0].ids, text, "{placement:?}");
            assert_eq!(seqs[2].ids, call_result, "{placement:?}");
            assert_eq!(
                naive_tokens(std::slice::from_ref(&c), &options, 1),
                lengths.iter().sum::<usize>()
            );
        }
    }
}
