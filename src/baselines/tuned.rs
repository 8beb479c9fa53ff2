//! The "tuned" baseline (docs/benchmarks.md): what a careful engineer writes with candle and no
//! custom engine. Each call variant is `variant_sequence(..).ids` (cut after the last weighted
//! token) less that last token, which is only ever a target (no row predicts from it; toolsift's
//! plan drops it too); the no-call pass runs once per text, up to the furthest window of its
//! candidates; identical sequences run once (a duplicated candidate costs nothing); the distinct
//! sequences are sorted by length and run in right-padded batches of up to `batch_size`, which
//! keeps padding small; the LM head runs only at the weighted rows (hidden rows gathered, one
//! matmul per batch).
//!
//! What it does not do, and toolsift's engine does: share a common prefix between sequences that
//! differ (a text's sequences at two positions, "[Tool(" across calls), or drop padding.

use std::collections::HashMap;

use super::gptj::{right_padded_batch, CandleGptj};
use super::{backend_error, check_candidates, padded_tokens};
use crate::error::Result;
use crate::score::{variant_sequence, ScoreOptions, TokenCandidate, Variant};

/// One loss term: weight * log p(token | unique[sequence][0..=row]).
struct Term {
    candidate: usize,
    variant: Variant,
    sequence: usize,
    row: usize,
    token: u32,
    weight: f64,
}

/// The work of a batch of candidates: the distinct sequences, the terms that read them, and the
/// batches (indices into `unique`) they run in.
struct Plan {
    unique: Vec<Vec<u32>>,
    terms: Vec<Term>,
    batches: Vec<Vec<usize>>,
}

fn plan(candidates: &[TokenCandidate], options: &ScoreOptions, batch_size: usize) -> Plan {
    // The no-call pass runs once per text: one sequence up to the furthest window of any of the
    // text's candidates, whose rows serve every position (the model is causal).
    let mut no_call_end: HashMap<&[u32], usize> = HashMap::new();
    for c in candidates {
        let end = no_call_end.entry(&c.text_ids[..]).or_insert(0);
        *end = (*end).max(c.text_end(options));
    }
    let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
    let mut unique: Vec<Vec<u32>> = Vec::new();
    let mut terms = Vec::new();
    for (k, c) in candidates.iter().enumerate() {
        for variant in Variant::ALL {
            let mut seq = variant_sequence(c, variant, options);
            if variant == Variant::None {
                seq.ids = c.text_ids[..no_call_end[&c.text_ids[..]]].to_vec();
            }
            if seq.targets.is_empty() {
                continue; // no weighted token (`validate` refuses such a candidate): nothing to run
            }
            // Every target's row is before the last token (targets: (row, ids[row + 1], w)).
            seq.ids.pop();
            let sequence = *index.entry(seq.ids.clone()).or_insert_with(|| {
                unique.push(seq.ids);
                unique.len() - 1
            });
            terms.extend(seq.targets.into_iter().map(|(row, token, weight)| Term {
                candidate: k,
                variant,
                sequence,
                row,
                token,
                weight,
            }));
        }
    }
    // Longest first (stable, so the order is deterministic): neighbours have similar lengths.
    let mut order: Vec<usize> = (0..unique.len()).collect();
    order.sort_by_key(|&u| std::cmp::Reverse(unique[u].len()));
    let batches = order
        .chunks(batch_size.max(1))
        .map(<[usize]>::to_vec)
        .collect();
    Plan {
        unique,
        terms,
        batches,
    }
}

/// [L_none, L_call, L_call_result] per candidate, in order, by the tuned method. Candidates are
/// validated as `Scorer::score` does.
pub fn tuned_losses(
    model: &CandleGptj,
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
    batch_size: usize,
) -> Result<Vec<[f64; 3]>> {
    check_candidates(model.config(), candidates, options, batch_size)?;
    let plan = plan(candidates, options, batch_size);
    // The distinct (sequence, row, token) reads of each sequence; several terms may share one.
    let mut reads: Vec<Vec<(usize, u32)>> = vec![Vec::new(); plan.unique.len()];
    for t in &plan.terms {
        if !reads[t.sequence].contains(&(t.row, t.token)) {
            reads[t.sequence].push((t.row, t.token));
        }
    }
    let mut log_probs: HashMap<(usize, usize, u32), f32> = HashMap::new();
    for batch in &plan.batches {
        let got = batch_log_probs(model, &plan.unique, &reads, batch).map_err(backend_error)?;
        let keys = batch
            .iter()
            .flat_map(|&u| reads[u].iter().map(move |&(row, token)| (u, row, token)));
        log_probs.extend(keys.zip(got));
    }
    let mut losses = vec![[0.0; 3]; candidates.len()];
    for t in &plan.terms {
        let lp = log_probs[&(t.sequence, t.row, t.token)];
        losses[t.candidate][t.variant as usize] -= t.weight * f64::from(lp);
    }
    Ok(losses)
}

/// log p(token | ids[0..=row]) for every read of every sequence in `batch`, in order: the trunk
/// over the padded batch, then the LM head on the gathered rows only.
fn batch_log_probs(
    model: &CandleGptj,
    unique: &[Vec<u32>],
    reads: &[Vec<(usize, u32)>],
    batch: &[usize],
) -> candle_core::Result<Vec<f32>> {
    let seqs: Vec<&[u32]> = batch.iter().map(|&u| &unique[u][..]).collect();
    let ids = right_padded_batch(&seqs, model.device())?; // [B, T]
    let hidden = model.forward_hidden(&ids)?; // [B, T, d]
    let reads: Vec<&[(usize, u32)]> = batch.iter().map(|&u| &reads[u][..]).collect();
    model.read_log_probs(&hidden, &reads)
}

/// Tokens `tuned_losses` pushes through the trunk with this `batch_size`, padding included. The
/// candidates must pass `validate`, as `tuned_losses` checks.
pub fn tuned_tokens(
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
    batch_size: usize,
) -> usize {
    let plan = plan(candidates, options, batch_size);
    let lengths = plan
        .batches
        .concat()
        .into_iter()
        .map(|u| plan.unique[u].len());
    padded_tokens(lengths, batch_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::call_at;

    /// The batches the tuned baseline runs are `batch_size` sequences each (the last the rest),
    /// longest first, and `tuned_tokens` counts exactly those batches.
    #[test]
    fn plan_batches_are_batch_size_long_longest_first_as_counted() {
        let a = call_at(0..10, 3);
        let c = TokenCandidate {
            position: 8,
            ..a.clone()
        };
        let candidates = [a, c];
        let options = ScoreOptions::default();
        for batch_size in [1, 2, 3, 4, 5, 6] {
            let plan = plan(&candidates, &options, batch_size);
            let lengths: Vec<Vec<usize>> = plan
                .batches
                .iter()
                .map(|b| b.iter().map(|&u| plan.unique[u].len()).collect())
                .collect();
            let flat = lengths.concat();
            assert_eq!(flat, [12, 11, 10, 9, 9], "batch {batch_size}");
            let sizes: Vec<usize> = lengths.iter().map(Vec::len).collect();
            let want: Vec<usize> = flat.chunks(batch_size).map(<[usize]>::len).collect();
            assert_eq!(sizes, want, "batch {batch_size}");
            let run: usize = lengths.iter().map(|b| b.len() * b[0]).sum();
            assert_eq!(
                tuned_tokens(&candidates, &options, batch_size),
                run,
                "batch {batch_size}"
            );
        }
    }
}
