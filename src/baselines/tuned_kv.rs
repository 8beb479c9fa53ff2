//! The "tuned + KV cache" baseline (docs/benchmarks.md): the tuned baseline, plus the one sharing a
//! careful candle user adds with a KV cache. In inline placement every variant of a candidate at
//! text position i starts with the text's x_<i; here the text runs once (the no-call pass, its
//! cache kept), and each call variant runs only from where it leaves the text, continuing the
//! text's cache cut at that point. What is left to toolsift's engine over it is engine quality
//! and the sharing a KV cache of the text alone does not give: toolsift's prefix tree also shares
//! e(c, eps)'s tokens with e(c, r)'s and the common start of calls at one position (here each
//! suffix runs whole), and it pads nothing.
//!
//! Per text: the no-call sequence (cut after its furthest weighted token, less that token) runs
//! once with its cache kept. A call variant's sequence shares the text's first `past` tokens,
//! `past` its common prefix with the text but no further than its first weighted row (the rows
//! it reads must be computed), so only the rest, its suffix, runs. Suffixes of one text and one
//! `past` are deduplicated and run in length-sorted, right-padded batches over that cut of the
//! cache. Variants that share nothing with the text (`past` 0: in prefix placement every call
//! variant whose z does not start as the text does) are deduplicated across all texts and run as
//! the tuned baseline runs them, so in prefix placement this baseline is the tuned one.

use std::collections::HashMap;

use candle_core::Tensor;

use super::gptj::{right_padded_batch, CandleGptj, KvCache};
use super::{backend_error, check_candidates, padded_tokens};
use crate::error::Result;
use crate::score::{variant_sequence, ScoreOptions, TokenCandidate, Variant};

/// Sequences that run over the same cache cut: `past` tokens of text `text` (`past` 0: no
/// cache, any text), each deduplicated sequence with the rows read from it.
struct Group {
    text: usize,
    past: usize,
    sequences: Vec<Vec<u32>>,
    reads: Vec<Vec<(usize, u32)>>,
    index: HashMap<Vec<u32>, usize>,
}

impl Group {
    fn new(text: usize, past: usize) -> Self {
        Group {
            text,
            past,
            sequences: Vec::new(),
            reads: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// The sequence's index in the group, added if new.
    fn add(&mut self, ids: &[u32]) -> usize {
        if let Some(&i) = self.index.get(ids) {
            return i;
        }
        self.sequences.push(ids.to_vec());
        self.reads.push(Vec::new());
        self.index.insert(ids.to_vec(), self.sequences.len() - 1);
        self.sequences.len() - 1
    }

    /// Records that row `row` of sequence `s` predicts `token`.
    fn read(&mut self, s: usize, row: usize, token: u32) {
        if !self.reads[s].contains(&(row, token)) {
            self.reads[s].push((row, token));
        }
    }

    /// Its sequences longest first (stable), in batches of `batch_size`.
    fn batches(&self, batch_size: usize) -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..self.sequences.len()).collect();
        order.sort_by_key(|&s| std::cmp::Reverse(self.sequences[s].len()));
        order
            .chunks(batch_size.max(1))
            .map(<[usize]>::to_vec)
            .collect()
    }
}

/// One loss term: weight * log p(token | the group's sequence up to row, after its past).
struct Term {
    candidate: usize,
    variant: Variant,
    group: usize,
    sequence: usize,
    row: usize,
    token: u32,
    weight: f64,
}

/// The work of a batch of candidates: the distinct texts (each its no-call sequence, run with
/// its cache kept: group `texts[t]`), the groups that continue them, and the terms.
struct Plan {
    /// Per text, the group holding its no-call sequence (sequence 0, past 0).
    texts: Vec<usize>,
    groups: Vec<Group>,
    terms: Vec<Term>,
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn plan(candidates: &[TokenCandidate], options: &ScoreOptions) -> Plan {
    // Each distinct text's no-call pass, up to the furthest window of its candidates.
    let mut text_of: HashMap<&[u32], usize> = HashMap::new();
    let mut text_end: Vec<usize> = Vec::new();
    let mut text_ids: Vec<&[u32]> = Vec::new();
    for c in candidates {
        let t = *text_of.entry(&c.text_ids[..]).or_insert_with(|| {
            text_ids.push(&c.text_ids[..]);
            text_end.push(0);
            text_end.len() - 1
        });
        text_end[t] = text_end[t].max(c.text_end(options));
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut texts = Vec::new();
    for (t, ids) in text_ids.iter().enumerate() {
        let mut group = Group::new(t, 0);
        // Less its last token, which is only ever a target.
        group.add(&ids[..text_end[t] - 1]);
        texts.push(groups.len());
        groups.push(group);
    }
    // Call variants by (text, past); past 0 shared across texts.
    let mut group_of: HashMap<(usize, usize), usize> = HashMap::new();
    let mut terms = Vec::new();
    for (k, c) in candidates.iter().enumerate() {
        let t = text_of[&c.text_ids[..]];
        for variant in Variant::ALL {
            let mut seq = variant_sequence(c, variant, options);
            if seq.targets.is_empty() {
                continue; // no weighted token (`validate` refuses such a candidate)
            }
            seq.ids.pop(); // every target's row is before the last token
            let (group, sequence, past) = if variant == Variant::None {
                (texts[t], 0, 0)
            } else {
                // Within the text's cache too: a call that starts as the text goes on (its
                // first token x_i, say) shares more than x_<i, up to the window's end.
                let first_row = seq.targets.iter().map(|&(row, _, _)| row).min();
                let past = common_prefix(&seq.ids, text_ids[t])
                    .min(first_row.unwrap_or(0))
                    .min(text_end[t] - 1);
                let key = if past == 0 {
                    (usize::MAX, 0)
                } else {
                    (t, past)
                };
                let g = *group_of.entry(key).or_insert_with(|| {
                    groups.push(Group::new(t, past));
                    groups.len() - 1
                });
                (g, groups[g].add(&seq.ids[past..]), past)
            };
            for (row, token, weight) in seq.targets {
                groups[group].read(sequence, row - past, token);
                terms.push(Term {
                    candidate: k,
                    variant,
                    group,
                    sequence,
                    row: row - past,
                    token,
                    weight,
                });
            }
        }
    }
    Plan {
        texts,
        groups,
        terms,
    }
}

/// [L_none, L_call, L_call_result] per candidate, in order, by the tuned method with a KV cache
/// of each text. Candidates are validated as `Scorer::score` does.
pub fn tuned_kv_losses(
    model: &CandleGptj,
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
    batch_size: usize,
) -> Result<Vec<[f64; 3]>> {
    check_candidates(model.config(), candidates, options, batch_size)?;
    let plan = plan(candidates, options);
    let mut log_probs: HashMap<(usize, usize, usize, u32), f32> = HashMap::new();
    let mut record = |g: usize, group: &Group, batch: &[usize], got: Vec<f32>| {
        let keys = batch.iter().flat_map(|&s| {
            group.reads[s]
                .iter()
                .map(move |&(row, token)| (g, s, row, token))
        });
        log_probs.extend(keys.zip(got));
    };
    // Groups that need no cache: shared across texts.
    for (g, group) in plan.groups.iter().enumerate() {
        if group.past == 0 && !plan.texts.contains(&g) {
            for batch in group.batches(batch_size) {
                let got = batch_log_probs(model, group, &batch, None).map_err(backend_error)?;
                record(g, group, &batch, got);
            }
        }
    }
    // Text by text, one cache alive at a time: the no-call pass, then what continues it.
    for (t, &g) in plan.texts.iter().enumerate() {
        let text = &plan.groups[g];
        let (got, cache) = text_pass(model, text).map_err(backend_error)?;
        record(g, text, &[0], got);
        for (g, group) in plan.groups.iter().enumerate() {
            if group.text != t || group.past == 0 {
                continue;
            }
            let past = cache.prefix(group.past).map_err(backend_error)?;
            for batch in group.batches(batch_size) {
                let got =
                    batch_log_probs(model, group, &batch, Some(&past)).map_err(backend_error)?;
                record(g, group, &batch, got);
            }
        }
    }
    let mut losses = vec![[0.0; 3]; candidates.len()];
    for t in &plan.terms {
        let lp = log_probs[&(t.group, t.sequence, t.row, t.token)];
        losses[t.candidate][t.variant as usize] -= t.weight * f64::from(lp);
    }
    Ok(losses)
}

/// The text's no-call sequence (its group's only sequence) with its cache kept, and the
/// log-probs of its reads.
fn text_pass(model: &CandleGptj, text: &Group) -> candle_core::Result<(Vec<f32>, KvCache)> {
    let ids = right_padded_batch(&[&text.sequences[0][..]], model.device())?; // [1, T]
    let (hidden, cache) = model.forward_cached(&ids, None, true)?;
    let cache = cache.ok_or_else(|| candle_core::Error::Msg("no cache kept".into()))?;
    Ok((head_log_probs(model, text, &[0], &hidden)?, cache))
}

/// log p(token | past ++ sequence[0..=row]) for every read of every sequence in `batch`, in
/// order: the trunk over the padded batch after `past`, then the LM head on the gathered rows.
fn batch_log_probs(
    model: &CandleGptj,
    group: &Group,
    batch: &[usize],
    past: Option<&KvCache>,
) -> candle_core::Result<Vec<f32>> {
    let seqs: Vec<&[u32]> = batch.iter().map(|&s| &group.sequences[s][..]).collect();
    let ids = right_padded_batch(&seqs, model.device())?; // [B, T]
    let (hidden, _) = model.forward_cached(&ids, past, false)?; // [B, T, d]
    head_log_probs(model, group, batch, &hidden)
}

/// The LM head's log-probs of the batch's reads from its hidden states [B, T, d].
fn head_log_probs(
    model: &CandleGptj,
    group: &Group,
    batch: &[usize],
    hidden: &Tensor,
) -> candle_core::Result<Vec<f32>> {
    let reads: Vec<&[(usize, u32)]> = batch.iter().map(|&s| &group.reads[s][..]).collect();
    model.read_log_probs(hidden, &reads)
}

/// Tokens `tuned_kv_losses` pushes through the trunk with this `batch_size`, padding included
/// (the cached tokens a batch attends to are not recomputed, so not counted). The candidates
/// must pass `validate`, as `tuned_kv_losses` checks (an empty text would panic here).
pub fn tuned_kv_tokens(
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
    batch_size: usize,
) -> usize {
    let plan = plan(candidates, options);
    plan.groups
        .iter()
        .map(|group| {
            let lengths = group
                .batches(batch_size)
                .concat()
                .into_iter()
                .map(|s| group.sequences[s].len());
            padded_tokens(lengths, batch_size)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group holds each sequence once and each (row, token) read of it once (the LM head runs
    /// once per read), and runs its sequences longest first in `batch_size` batches.
    #[test]
    fn a_group_deduplicates_sequences_and_reads_and_batches_longest_first() {
        let mut group = Group::new(0, 3);
        let short = group.add(&[1, 2]);
        let long = group.add(&[1, 2, 3, 4]);
        assert_eq!(group.add(&[1, 2]), short);
        let middle = group.add(&[5, 6, 7]);
        assert_eq!(group.sequences.len(), 3);
        group.read(long, 1, 9);
        group.read(long, 1, 9);
        group.read(long, 1, 8);
        assert_eq!(group.reads[long], [(1, 9), (1, 8)]);
        assert!(group.reads[short].is_empty());
        assert_eq!(group.batches(2), [vec![long, middle], vec![short]]);
        assert_eq!(group.batches(0), [vec![long], vec![middle], vec![short]]);
    }
}
