//! The parts the KV-cached samplers (CPU and CUDA) share: the checks of their inputs, the memory
//! groups, and the decoding loop that turns log-probability rows into samples. `super::cached`
//! puts them together into the `Sampler` algorithm; the decode sessions use the checks. Written
//! once, the policy (seeded stream per sample, `draw`, stop tokens, length cap, output order)
//! cannot differ between backends.

use super::{
    branch_requests, draw, sample_rng, Branch, Choose, Sample, SampleOptions, SampleRequest,
};
use crate::error::{Error, Result};
use std::ops::Range;

/// Fails unless every id is below `vocab_size`, naming `what` and the first bad id.
pub(crate) fn check_ids(what: &str, ids: &[u32], vocab_size: usize) -> Result<()> {
    match ids.iter().find(|&&t| t as usize >= vocab_size) {
        Some(bad) => Err(Error::input(format!(
            "{what}: token id {bad} is outside the vocabulary (vocab_size {vocab_size})"
        ))),
        None => Ok(()),
    }
}

/// `token_log_probs`'s precondition: ids and queried tokens in the vocabulary, the sequence
/// within `n_positions` (an empty one has no positions, so no rows; `propose` may still branch
/// at 0).
pub(crate) fn check_sequence(
    ids: &[u32],
    tokens: &[u32],
    vocab_size: usize,
    n_positions: usize,
) -> Result<()> {
    check_ids("sequence", ids, vocab_size)?;
    check_ids("queried tokens", tokens, vocab_size)?;
    if ids.len() > n_positions {
        return Err(Error::input(format!(
            "sequence of {} tokens is longer than n_positions ({n_positions})",
            ids.len()
        )));
    }
    Ok(())
}

/// `sample`'s precondition: options that mean something (a temperature that is finite and not
/// negative, a `top_k` of at least 1), every prefix non-empty, in the vocabulary, with room for
/// `max_new_tokens` more positions. Errors name the request as "`what` r" (`propose` checks its
/// branches as requests). Every sampler checks this, the reference included, so they fail alike.
pub(crate) fn check_requests(
    what: &str,
    requests: &[SampleRequest],
    options: &SampleOptions,
    vocab_size: usize,
    n_positions: usize,
) -> Result<()> {
    super::check_draw_options(options.temperature, options.top_k)?;
    for (r, req) in requests.iter().enumerate() {
        check_ids(&format!("{what} {r}"), &req.prefix, vocab_size)?;
        if req.prefix.is_empty() {
            return Err(Error::input(format!("{what} {r}: empty prefix")));
        }
        let fits = req
            .prefix
            .len()
            .checked_add(options.max_new_tokens)
            .is_some_and(|total| total <= n_positions);
        if !fits {
            return Err(Error::input(format!(
                "{what} {r}: prefix of {} tokens + {} new tokens exceeds n_positions \
                 ({n_positions})",
                req.prefix.len(),
                options.max_new_tokens
            )));
        }
    }
    let samples = requests
        .iter()
        .try_fold(0usize, |n, r| n.checked_add(r.n_samples));
    let rows = samples.and_then(|n| n.checked_mul(options.max_new_tokens.max(1)));
    if rows.is_none_or(|rows| rows > MAX_SAMPLED_ROWS) {
        let samples = requests.iter().map(|r| r.n_samples as u128).sum::<u128>();
        return Err(Error::input(format!(
            "{samples} samples of up to {} new tokens make more than {MAX_SAMPLED_ROWS} \
             token rows, the most one call can index (u32 rows); ask for fewer samples per call",
            options.max_new_tokens
        )));
    }
    Ok(())
}

/// The most rows (a sample's new tokens, or one per sample when `max_new_tokens` is 0) one
/// `sample` or `propose` call may ask for: the engines index rows with u32, and an absurd count
/// is the caller's mistake, not an allocation failure of the backend.
pub(crate) const MAX_SAMPLED_ROWS: usize = u32::MAX as usize;

/// `propose`'s middle step on a KV-cached backend: the branches `choose` picks from `log_probs`
/// and their `sample` requests, checked as `sample` checks its own (errors name the branch).
pub(crate) fn choose_branches(
    ids: &[u32],
    log_probs: &[Vec<f32>],
    choose: &mut Choose<'_>,
    options: &SampleOptions,
    vocab_size: usize,
    n_positions: usize,
) -> Result<(Vec<Branch>, Vec<SampleRequest>)> {
    let branches = choose(log_probs);
    let requests = branch_requests(ids, &branches)?;
    check_requests("branch", &requests, options, vocab_size, n_positions)?;
    Ok((branches, requests))
}

/// `DecodeSession::extend`'s precondition: each sequence at most once (its tokens are one
/// list), known, given tokens in the vocabulary and room for them. `nodes[s]` is sequence s's node
/// and `len(node)` its length; returns the nodes of `sequences`, in order.
pub(crate) fn check_extend(
    sequences: &[usize],
    tokens: &[Vec<u32>],
    nodes: &[usize],
    len: impl Fn(usize) -> usize,
    vocab_size: usize,
    n_positions: usize,
) -> Result<Vec<usize>> {
    if sequences.len() != tokens.len() {
        return Err(Error::input("extend: one token list per sequence"));
    }
    let mut out = Vec::with_capacity(sequences.len());
    let mut seen = vec![false; nodes.len()];
    for (&s, t) in sequences.iter().zip(tokens) {
        let &node = nodes
            .get(s)
            .ok_or_else(|| Error::input(format!("extend: no sequence {s}")))?;
        if std::mem::replace(&mut seen[s], true) {
            return Err(Error::input(format!(
                "extend: sequence {s} is given twice (put all its tokens in one list)"
            )));
        }
        if t.is_empty() {
            return Err(Error::input(format!("extend: no tokens for sequence {s}")));
        }
        check_ids(&format!("sequence {s}"), t, vocab_size)?;
        if len(node).saturating_add(t.len()) > n_positions {
            return Err(Error::input(format!(
                "sequence {s} would grow past n_positions ({n_positions})"
            )));
        }
        out.push(node);
    }
    Ok(out)
}

/// Runs one `DecodeSession::extend` as consecutive forwards of at most `max_tokens` new tokens
/// each, so that a large prefill stays within the memory budget (a sequence's tokens may run
/// across forwards, in order: each continues the cache the last one grew). `forward(nodes,
/// tokens, last)` computes one piece and returns the log-softmax rows after the tokens at rows
/// `last` of the piece (those of the sequences that end in it; none is an empty answer);
/// returns one row per sequence of the call, in its order. Only the piece that holds a
/// sequence's last token reads the head for it; the result is the one forward's, up to rounding.
pub(crate) fn extend_in_pieces(
    nodes: &[usize],
    tokens: &[Vec<u32>],
    max_tokens: usize,
    mut forward: impl FnMut(&[usize], &[Vec<u32>], &[u32]) -> Result<Vec<Vec<f32>>>,
) -> Result<Vec<Vec<f32>>> {
    let mut out = vec![Vec::new(); tokens.len()];
    for piece in extend_pieces(tokens, max_tokens) {
        let piece_nodes: Vec<usize> = piece.iter().map(|(k, _)| nodes[*k]).collect();
        let piece_tokens: Vec<Vec<u32>> = piece
            .iter()
            .map(|(k, range)| tokens[*k][range.clone()].to_vec())
            .collect();
        let (mut rows, mut last, mut ending) = (0u32, Vec::new(), Vec::new());
        for (k, range) in &piece {
            rows += range.len() as u32;
            if range.end == tokens[*k].len() {
                last.push(rows - 1);
                ending.push(*k);
            }
        }
        let answers = forward(&piece_nodes, &piece_tokens, &last)?;
        for (k, row) in ending.into_iter().zip(answers) {
            out[k] = row;
        }
    }
    Ok(out)
}

/// `tokens` (one list per sequence) cut into consecutive pieces of at most `max_tokens` (at
/// least 1): per piece, each sequence it continues and the range of its tokens. Every token is
/// in exactly one piece, a sequence at most once per piece, and its ranges follow each other.
fn extend_pieces(tokens: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<(usize, Range<usize>)>> {
    let max = max_tokens.max(1);
    let (mut pieces, mut piece, mut room) = (Vec::new(), Vec::new(), max);
    for (k, t) in tokens.iter().enumerate() {
        let mut at = 0;
        while at < t.len() {
            if room == 0 {
                pieces.push(std::mem::take(&mut piece));
                room = max;
            }
            let n = room.min(t.len() - at);
            piece.push((k, at..at + n));
            (at, room) = (at + n, room - n);
        }
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// What one token costs a sampler's memory: its activations while a forward computes it, and its
/// K/V in the cache for as long as the cache lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenBytes {
    pub activations: usize,
    pub kv: usize,
}

/// `requests` split into consecutive groups that a sampler runs one after another, each grown in
/// a KV cache of its own (prefill, first draws, decoding) that is freed before the next, so that a
/// group's cache (its prefixes and every sample's new tokens) and its activations fit `budget`
/// together. A request that alone does not fit is a group of its own (the cache allocation then
/// says whether the device can hold it). `computed(req)` is how many of a request's prefix tokens
/// the group computes: the whole prefix for `sample`; one for `propose`, whose branches fork a
/// sequence cached beforehand (its K/V is not the group's: take it out of `budget`). Prefixes
/// are counted whole, so a prefix shared within a group is counted once per request: groups are
/// smaller than they need be, never larger. Every sample keeps its stream (keyed by request and
/// sample) in any grouping.
pub(crate) fn sample_groups(
    requests: &[SampleRequest],
    options: &SampleOptions,
    budget: usize,
    bytes: TokenBytes,
    computed: impl Fn(&SampleRequest) -> usize,
) -> Vec<Range<usize>> {
    let per_token = bytes.activations.saturating_add(bytes.kv);
    // A decoding step holds one token's activations per live sample, its K/V for good.
    let cost = |req: &SampleRequest| {
        let new_tokens = req.n_samples.saturating_mul(options.max_new_tokens);
        computed(req)
            .saturating_mul(per_token)
            .saturating_add(new_tokens.saturating_mul(bytes.kv))
            .saturating_add(req.n_samples.saturating_mul(bytes.activations))
    };
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (r, req) in requests.iter().enumerate() {
        let c = cost(req);
        if r > start && bytes.saturating_add(c) > budget {
            groups.push(start..r);
            (start, bytes) = (r, 0);
        }
        bytes = bytes.saturating_add(c);
    }
    if start < requests.len() {
        groups.push(start..requests.len());
    }
    groups
}

/// Sample i of the batch in request order (request 0's samples first): its request.
pub(crate) fn sample_requests(requests: &[SampleRequest]) -> impl Iterator<Item = usize> + '_ {
    requests
        .iter()
        .enumerate()
        .flat_map(|(r, req)| std::iter::repeat_n(r, req.n_samples))
}

/// Every sample empty when nothing is to be drawn (`max_new_tokens` 0, or no request asks for a
/// sample): a sampler returns this before it computes anything.
pub(crate) fn nothing_to_draw(
    requests: &[SampleRequest],
    options: &SampleOptions,
) -> Option<Vec<Vec<Sample>>> {
    let none = options.max_new_tokens == 0 || requests.iter().all(|r| r.n_samples == 0);
    none.then(|| {
        let empty = Sample {
            tokens: Vec::new(),
            stopped: false,
        };
        requests
            .iter()
            .map(|req| vec![empty.clone(); req.n_samples])
            .collect()
    })
}

/// The first token of every sample of a group of requests, drawn as soon as its request's row
/// (the log-probabilities after the prefix) exists, so that a sampler keeps one chunk of
/// [rows, vocab] at a time instead of a row per request until decoding starts.
pub(crate) struct FirstDraws<'o> {
    options: &'o SampleOptions,
    /// The batch index of the group's first request: streams are keyed by batch index.
    first_request: usize,
    /// (request within the group, the sample's stream after its first draw, the token), in
    /// sample order.
    draws: Vec<(usize, crate::util::rng::Rng, u32)>,
    next_request: usize,
}

impl<'o> FirstDraws<'o> {
    /// First draws for the requests `first_request..` of the batch.
    pub(crate) fn new(options: &'o SampleOptions, first_request: usize) -> Self {
        FirstDraws {
            options,
            first_request,
            draws: Vec::new(),
            next_request: 0,
        }
    }

    /// Draws the first token of each of the group's request `r`'s samples from `row`. Requests
    /// come in order, each once.
    pub(crate) fn push(&mut self, r: usize, req: &SampleRequest, row: &[f32]) {
        debug_assert_eq!(r, self.next_request, "requests in order");
        self.next_request = r + 1;
        for s in 0..req.n_samples {
            let mut rng = sample_rng(self.options.seed, self.first_request + r, s);
            let tok = draw(row, self.options, &mut rng);
            self.draws.push((r, rng, tok));
        }
    }
}

/// The decoding loop, from each sample's first token (`first`, every request pushed) and its
/// cache node `nodes[i]` (in `sample_requests` order), forked from its prefix. Each round,
/// `step(nodes, tokens, each)` appends one token to each live sample's node and calls
/// `each(k, row)` with the log-probabilities after `tokens[k]`, for every k (in any order).
/// Returns `out[r][s]`, sample s of request r. Samplers return [`nothing_to_draw`] first, so
/// `max_new_tokens` is at least 1 here.
pub(crate) fn decode<N: Copy>(
    requests: &[SampleRequest],
    first: FirstDraws<'_>,
    nodes: Vec<N>,
    mut step: impl FnMut(&[N], &[Vec<u32>], &mut dyn FnMut(usize, &[f32])) -> Result<()>,
) -> Result<Vec<Vec<Sample>>> {
    struct Live<N> {
        r: usize,
        node: N,
        rng: crate::util::rng::Rng,
        tokens: Vec<u32>,
        stopped: bool,
    }
    let options = first.options;
    debug_assert_eq!(first.next_request, requests.len(), "every request drawn");
    debug_assert_eq!(first.draws.len(), nodes.len());
    let mut live: Vec<Live<N>> = first
        .draws
        .into_iter()
        .zip(nodes)
        .map(|((r, rng, tok), node)| Live {
            r,
            node,
            rng,
            stopped: options.stop_tokens.contains(&tok),
            tokens: vec![tok],
        })
        .collect();
    let active = |l: &Live<N>| !l.stopped && l.tokens.len() < options.max_new_tokens;
    loop {
        let round: Vec<usize> = (0..live.len()).filter(|&i| active(&live[i])).collect();
        if round.is_empty() {
            break;
        }
        let nodes: Vec<N> = round.iter().map(|&i| live[i].node).collect();
        let tokens: Vec<Vec<u32>> = round
            .iter()
            .map(|&i| vec![*live[i].tokens.last().expect("one token")])
            .collect();
        step(&nodes, &tokens, &mut |k, row| {
            let l = &mut live[round[k]];
            let tok = draw(row, options, &mut l.rng);
            l.stopped = options.stop_tokens.contains(&tok);
            l.tokens.push(tok);
        })?;
    }
    let mut out: Vec<Vec<Sample>> = requests.iter().map(|_| Vec::new()).collect();
    for l in live {
        out[l.r].push(Sample {
            tokens: l.tokens,
            stopped: l.stopped,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_pieces_cut_every_token_once_in_order() {
        let tokens = vec![vec![1; 5], vec![2; 1], vec![3; 7]];
        for max in 1..=14 {
            let pieces = extend_pieces(&tokens, max);
            let mut next = [0usize; 3];
            for piece in &pieces {
                let n: usize = piece.iter().map(|(_, r)| r.len()).sum();
                assert!((1..=max).contains(&n), "max {max}: a piece of {n}");
                let mut seen: Vec<usize> = piece.iter().map(|(k, _)| *k).collect();
                seen.dedup();
                assert_eq!(seen.len(), piece.len(), "max {max}: a sequence twice");
                for (k, r) in piece {
                    assert_eq!(r.start, next[*k], "max {max}: sequence {k} out of order");
                    next[*k] = r.end;
                }
            }
            assert_eq!(next, [5, 1, 7], "max {max}");
            assert_eq!(pieces.len(), 13usize.div_ceil(max), "max {max}");
        }
    }

    #[test]
    fn extend_in_pieces_answers_each_sequence_from_the_piece_it_ends_in() {
        let tokens = vec![vec![10, 11, 12], vec![20], vec![30, 31]];
        let nodes = [7, 8, 9];
        let mut calls = Vec::new();
        let rows = extend_in_pieces(&nodes, &tokens, 2, |n, t, last| {
            calls.push((n.to_vec(), t.to_vec(), last.to_vec()));
            // The answer names the token at each `last` row.
            let flat: Vec<u32> = t.concat();
            Ok(last
                .iter()
                .map(|&r| vec![flat[r as usize] as f32])
                .collect())
        })
        .unwrap();
        assert_eq!(rows, vec![vec![12.0], vec![20.0], vec![31.0]]);
        assert_eq!(
            calls,
            vec![
                (vec![7], vec![vec![10, 11]], vec![]),
                (vec![7, 8], vec![vec![12], vec![20]], vec![0, 1]),
                (vec![9], vec![vec![30, 31]], vec![1]),
            ]
        );
    }

    #[test]
    fn sample_groups_fill_up_to_the_budget_in_order() {
        let req = |n: usize, n_samples: usize| SampleRequest {
            prefix: vec![1; n],
            n_samples,
        };
        let options = SampleOptions {
            max_new_tokens: 2,
            ..Default::default()
        };
        let bytes = TokenBytes {
            activations: 3,
            kv: 1,
        };
        let whole = |r: &SampleRequest| r.prefix.len();
        // cost = 4 * prefix + 2 * n_samples (new tokens' K/V) + 3 * n_samples (a step's
        // activations): 17, 26, 41, 8, 13, 9.
        let requests = [
            req(3, 1),
            req(4, 2),
            req(9, 1),
            req(2, 0),
            req(2, 1),
            req(1, 1),
        ];
        assert_eq!(
            sample_groups(&requests, &options, 45, bytes, whole),
            [0..2, 2..3, 3..6]
        );
        let all = sample_groups(&requests, &options, 1000, bytes, whole);
        assert_eq!((all.len(), &all[0]), (1, &(0..6)));
        assert_eq!(sample_groups(&requests, &options, 1, bytes, whole).len(), 6);
        assert!(sample_groups(&[], &options, 5, bytes, whole).is_empty());
        let huge = TokenBytes {
            activations: usize::MAX,
            kv: usize::MAX,
        };
        assert_eq!(
            sample_groups(&requests, &options, 1000, huge, whole).len(),
            6
        );
        // `propose`'s branches compute one prefix token each: 4 + 5 * n_samples = 9, 14, 9, 4,
        // 9, 9.
        assert_eq!(
            sample_groups(&requests, &options, 23, bytes, |_| 1),
            [0..2, 2..5, 5..6]
        );
    }
}
