//! The plan on hand-made batches: token counts, sharing, cuts, and that every variant's sequence
//! can be read back from the tree exactly as `variant_sequence` defines it.

use std::sync::Arc;

use super::*;
use crate::score::{LossWeights, Placement};

fn text(n: usize) -> Arc<[u32]> {
    (0..n as u32).map(|k| 100 + k).collect()
}

fn cand(text: &Arc<[u32]>, position: usize, call: &[u32], result: &[u32]) -> TokenCandidate {
    TokenCandidate {
        text_ids: text.clone(),
        position,
        call_ids: call.to_vec(),
        call_result_ids: result.to_vec(),
        weights: None,
    }
}

fn opts(placement: Placement) -> ScoreOptions {
    ScoreOptions {
        placement,
        weights: LossWeights::default(),
    }
}

/// Reads back the token sequence that ends at flat token `row`: its ancestors' tokens, then its own
/// segment up to `row`.
fn sequence_to(plan: &Plan, row: usize) -> Vec<u32> {
    let s = plan.token_segment[row] as usize;
    let mut out = Vec::new();
    for &a in plan.ancestors_of(s) {
        let seg = plan.segments[a as usize];
        out.extend_from_slice(&plan.tokens[seg.start as usize..(seg.start + seg.len) as usize]);
    }
    out.extend_from_slice(&plan.tokens[plan.segments[s].start as usize..=row]);
    out
}

/// Every structural invariant, and every target's context equal to the spec's.
pub(crate) fn check_plan(plan: &Plan, cands: &[TokenCandidate], options: &ScoreOptions) {
    let n = plan.n_tokens();
    assert_eq!(plan.positions.len(), n);
    assert_eq!(plan.token_segment.len(), n);
    assert_eq!(plan.ancestor_offsets.len(), plan.segments.len() + 1);
    let mut next = 0;
    for (s, seg) in plan.segments.iter().enumerate() {
        assert_eq!(seg.start, next, "segments are contiguous, in order");
        next += seg.len;
        assert!(seg.len > 0);
        let anc = plan.ancestors_of(s);
        assert_eq!(anc.last().copied(), seg.parent);
        let depth: u32 = anc.iter().map(|&a| plan.segments[a as usize].len).sum();
        assert_eq!(seg.depth, depth);
        for k in 0..seg.len {
            assert_eq!(plan.positions[(seg.start + k) as usize], seg.depth + k);
            assert_eq!(plan.token_segment[(seg.start + k) as usize], s as u32);
        }
        for &a in anc {
            assert!((a as usize) < s, "ancestors come first");
        }
    }
    assert_eq!(next as usize, n);
    assert!(plan.head_rows.windows(2).all(|w| w[0] < w[1]));
    // Every (candidate, variant) has exactly the spec's targets, each predicted from the spec's
    // context.
    let mut expected = 0;
    for (c, cand) in cands.iter().enumerate() {
        for v in Variant::ALL {
            let seq = variant_sequence(cand, v, options);
            let slot = (c * 3 + v as usize) as u32;
            let mine: Vec<&Target> = plan.targets.iter().filter(|t| t.slot == slot).collect();
            assert_eq!(mine.len(), seq.targets.len());
            for (t, &(row, token, weight)) in mine.iter().zip(&seq.targets) {
                assert_eq!(t.token, token);
                assert_eq!(t.weight, weight);
                let flat = plan.head_rows[t.head_row as usize] as usize;
                assert_eq!(sequence_to(plan, flat), seq.ids[..=row].to_vec());
            }
            expected += seq.targets.len();
        }
    }
    assert_eq!(plan.targets.len(), expected);
}

#[test]
fn one_candidate_in_prefix_placement() {
    let x = text(20);
    // e(c, eps) and e(c, r) share their first 3 tokens ("[Tool(input) ->").
    let c = cand(&x, 8, &[1, 2, 3, 4], &[1, 2, 3, 5, 6]);
    let o = opts(Placement::Prefix);
    let plan = Plan::build(std::slice::from_ref(&c), &o);
    check_plan(&plan, &[c], &o);
    // none: x[..12]; call: 1 2 3 | 4 x[..12]; result: 1 2 3 | 5 6 x[..12]. Each sequence ends
    // at x[11] (x_(i+3)), whose row predicts the last weighted token x[12]: x[12] is not fed.
    assert_eq!(plan.n_tokens(), 12 + 3 + (1 + 12) + (2 + 12));
    assert_eq!(plan.naive_tokens, 13 + 17 + 18);
    assert_eq!(plan.segments.len(), 4);
    assert_eq!(plan.targets.len(), 15);
    assert_eq!(plan.head_rows.len(), 15);
}

#[test]
fn inline_placement_shares_the_text_before_the_call() {
    let x = text(20);
    let c = cand(&x, 8, &[1, 2, 3, 4], &[1, 2, 3, 5, 6]);
    let o = opts(Placement::Inline);
    let plan = Plan::build(std::slice::from_ref(&c), &o);
    check_plan(&plan, std::slice::from_ref(&c), &o);
    // x[..8] shared; none continues x[8..12]; calls share 1 2 3 then branch (x[12], the last
    // weighted token, is not fed).
    assert_eq!(plan.n_tokens(), 8 + 4 + 3 + (1 + 4) + (2 + 4));
    // A second position of the same text shares x[..8] and the no-call branch up to x[13].
    let c2 = cand(&x, 11, &[1, 2, 3, 4], &[1, 2, 3, 5, 6]);
    let both = [c, c2];
    let plan2 = Plan::build(&both, &o);
    check_plan(&plan2, &both, &o);
    // The no-call branch grows by x[12..15]; the calls branch off it after x[..11] and share 1 2 3.
    assert_eq!(
        plan2.n_tokens(),
        plan.n_tokens() + 3 + 3 + (1 + 4) + (2 + 4)
    );
}

#[test]
fn no_call_variant_is_shared_by_all_candidates_of_a_text() {
    let x = text(30);
    let o = opts(Placement::Prefix);
    let cands: Vec<_> = (0..4)
        .map(|k| cand(&x, 5 + 3 * k, &[1, 10 + k as u32], &[1, 10 + k as u32, 7]))
        .collect();
    let plan = Plan::build(&cands, &o);
    check_plan(&plan, &cands, &o);
    // Each sequence is fed up to x_(i+3): the last weighted token is not fed.
    let none_tokens = 5 + 3 * 3 + 4; // the longest no-call sequence covers the others
    let call_tokens: usize = (0..4)
        .map(|k| 1 + (5 + 3 * k + 4) + 1 + (5 + 3 * k + 4))
        .sum();
    // "[" (token 1) is shared by every call; each call id token branches below it.
    assert_eq!(plan.n_tokens(), none_tokens + 1 + call_tokens);
}

#[test]
fn duplicate_candidates_cost_nothing_extra() {
    let x = text(20);
    let o = opts(Placement::Prefix);
    let c = cand(&x, 8, &[1, 2, 3, 4], &[1, 2, 3, 5, 6]);
    let one = Plan::build(std::slice::from_ref(&c), &o);
    let cands = vec![c.clone(), c.clone(), c];
    let three = Plan::build(&cands, &o);
    check_plan(&three, &cands, &o);
    assert_eq!(three.n_tokens(), one.n_tokens());
    assert_eq!(three.head_rows.len(), one.head_rows.len());
    assert_eq!(three.targets.len(), 3 * one.targets.len());
}

#[test]
fn windows_are_cut_at_the_end_of_the_text_and_nothing_after_the_window_is_computed() {
    let x = text(10);
    let o = opts(Placement::Prefix);
    let c = cand(&x, 8, &[1], &[2]);
    let plan = Plan::build(std::slice::from_ref(&c), &o);
    check_plan(&plan, std::slice::from_ref(&c), &o);
    assert_eq!(plan.targets.len(), 3 * 2);
    // Fed up to x[8], whose row predicts the text's last token x[9].
    assert_eq!(plan.n_tokens(), 9 + 10 + 10);
    let long = text(100);
    let c = cand(&long, 8, &[1], &[2]);
    let plan = Plan::build(std::slice::from_ref(&c), &o);
    assert_eq!(
        plan.n_tokens(),
        12 * 3 + 2,
        "fed up to x_(i+3), which predicts x_(i+4)"
    );
}

#[test]
fn reduce_sums_weighted_terms_into_slots() {
    let x = text(20);
    let o = opts(Placement::Prefix);
    let cands = [cand(&x, 8, &[1], &[2]), cand(&x, 9, &[1], &[3])];
    let plan = Plan::build(&cands, &o);
    let lp: Vec<f64> = plan.targets.iter().map(|t| -(t.token as f64)).collect();
    let losses = plan.reduce(&lp);
    for (c, cand) in cands.iter().enumerate() {
        for v in Variant::ALL {
            let want: f64 = variant_sequence(cand, v, &o)
                .targets
                .iter()
                .map(|&(_, tok, w)| w * tok as f64)
                .sum();
            assert!((losses[c][v as usize] - want).abs() < 1e-12);
        }
    }
}

#[test]
fn empty_batch_is_an_empty_plan() {
    let plan = Plan::build(&[], &opts(Placement::Prefix));
    assert_eq!(plan.n_tokens(), 0);
    assert!(plan.targets.is_empty());
    assert_eq!(plan.reduce(&[]), Vec::<[f64; 3]>::new());
}

#[test]
fn zero_weights_are_not_computed() {
    let x = text(20);
    let o = opts(Placement::Prefix);
    let c = cand(&x, 8, &[1, 2, 3, 4], &[1, 2, 3, 5, 6]);
    let plain = Plan::build(std::slice::from_ref(&c), &o);
    // Trailing zero weights: the same plan as without them.
    let mut padded = c.clone();
    let mut w = o.weights.as_slice().to_vec();
    w.extend([0.0; 10]);
    padded.weights = Some(w);
    let plan = Plan::build(std::slice::from_ref(&padded), &o);
    check_plan(&plan, std::slice::from_ref(&padded), &o);
    assert_eq!(plan.tokens, plain.tokens);
    assert_eq!(plan.targets, plain.targets);
    assert_eq!(plan.naive_tokens, plain.naive_tokens);
    // Every weight zero: nothing to run, losses 0.
    let mut zero = c.clone();
    zero.weights = Some(vec![0.0; 5]);
    let plan = Plan::build(std::slice::from_ref(&zero), &o);
    check_plan(&plan, std::slice::from_ref(&zero), &o);
    assert_eq!(plan.n_tokens(), 0);
    assert_eq!(plan.reduce(&[]), vec![[0.0; 3]]);
}

/// A batch of several texts, candidates at random positions, random calls sharing some tokens.
fn random_batch(seed: u64, n: usize) -> Vec<TokenCandidate> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    let texts: Vec<Arc<[u32]>> = (0..3).map(|k| text(8 + 6 * k)).collect();
    (0..n)
        .map(|_| {
            let x = &texts[next(texts.len())];
            let call: Vec<u32> = (0..1 + next(4)).map(|_| 1 + next(5) as u32).collect();
            let mut result = call.clone();
            result.extend((0..next(3)).map(|_| 1 + next(5) as u32));
            let mut c = cand(x, 1 + next(x.len() - 1), &call, &result);
            if next(6) == 0 {
                c.weights = Some(vec![0.0; 5]); // nothing to compute
            }
            c
        })
        .collect()
}

fn assert_same_plan(a: &Plan, b: &Plan) {
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.positions, b.positions);
    assert_eq!(a.token_segment, b.token_segment);
    assert_eq!(a.segments, b.segments);
    assert_eq!(a.ancestors, b.ancestors);
    assert_eq!(a.ancestor_offsets, b.ancestor_offsets);
    assert_eq!(a.head_rows, b.head_rows);
    assert_eq!(a.targets, b.targets);
    assert_eq!(a.n_candidates, b.n_candidates);
    assert_eq!(a.naive_tokens, b.naive_tokens);
}

#[test]
fn chunks_fill_up_to_the_limit_and_plan_as_build_does() {
    for seed in 0..40 {
        let o = opts(if seed % 2 == 0 {
            Placement::Prefix
        } else {
            Placement::Inline
        });
        let cands = random_batch(seed, 1 + seed as usize % 23);
        let whole = Plan::build(&cands, &o);
        for max_tokens in [0, 1, 7, 20, 45, whole.n_tokens() / 2, whole.n_tokens()] {
            let chunks: Vec<_> = chunked(&cands, &o, max_tokens).collect();
            let mut next = 0;
            for (range, plan) in &chunks {
                assert_eq!(range.start, next, "chunks are consecutive");
                assert!(!range.is_empty());
                next = range.end;
                // Undoing a candidate that did not fit leaves exactly the plan of the others.
                assert_same_plan(plan, &Plan::build(&cands[range.clone()], &o));
                check_plan(plan, &cands[range.clone()], &o);
                // Over the limit only by a first candidate, with what adds no token after it.
                let first = Plan::build(&cands[range.start..range.start + 1], &o);
                assert!(plan.n_tokens() <= max_tokens || plan.n_tokens() == first.n_tokens());
                if range.end < cands.len() {
                    let grown = Plan::build(&cands[range.start..range.end + 1], &o);
                    assert!(
                        grown.n_tokens() > max_tokens && grown.n_tokens() > plan.n_tokens(),
                        "the next candidate would fit"
                    );
                }
            }
            assert_eq!(next, cands.len(), "every candidate in one chunk");
            if whole.n_tokens() <= max_tokens {
                assert_eq!(chunks.len(), 1);
                assert_same_plan(&chunks[0].1, &whole);
            }
        }
    }
}

#[test]
fn an_empty_batch_is_one_empty_chunk() {
    let o = opts(Placement::Prefix);
    let chunks: Vec<_> = chunked(&[], &o, 10).collect();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].0, 0..0);
    assert_eq!(chunks[0].1.n_tokens(), 0);
}

#[test]
fn a_candidate_that_does_not_fit_after_one_with_nothing_to_compute_is_undone() {
    // The first candidate inserts nothing, so the second one creates the trie's root: undoing it
    // must remove the root too.
    let x = text(20);
    let o = opts(Placement::Prefix);
    let mut zero = cand(&x, 8, &[1], &[2]);
    zero.weights = Some(vec![0.0; 5]);
    let cands = [zero, cand(&x, 8, &[1], &[2]), cand(&x, 9, &[1], &[3])];
    let mut builder = PlanBuilder::new(&o);
    assert!(builder.push_within(&cands[0], 3));
    assert_eq!(builder.n_tokens(), 0);
    assert!(!builder.push_within(&cands[1], 3));
    assert_eq!(builder.n_tokens(), 0);
    assert_same_plan(&builder.finish(), &Plan::build(&cands[..1], &o));
    let ranges: Vec<_> = chunked(&cands, &o, 3).map(|(r, _)| r).collect();
    assert_eq!(ranges, [0..1, 1..2, 2..3]);
}

/// After a candidate larger than the limit, its duplicates (which add no token) join its chunk
/// instead of each being computed again in a chunk of its own.
#[test]
fn duplicates_of_an_oversized_candidate_share_its_chunk() {
    let x = text(40);
    let o = opts(Placement::Prefix);
    let big = cand(&x, 30, &[1, 2, 3], &[1, 2, 3, 4]);
    let cands = [big.clone(), big.clone(), big, cand(&x, 31, &[5], &[6])];
    let ranges: Vec<_> = chunked(&cands, &o, 10).map(|(r, _)| r).collect();
    assert_eq!(ranges, [0..3, 3..4]);
}

/// `cands` pushed one by one within half the tokens of their whole plan (so that some are
/// refused and later ones reuse what a refused one created): the builder and what it accepted.
fn push_within_half<'o>(
    cands: &[TokenCandidate],
    o: &'o ScoreOptions,
) -> (PlanBuilder<'o>, Vec<TokenCandidate>) {
    let limit = Plan::build(cands, o).n_tokens() / 2;
    let mut builder = PlanBuilder::new(o);
    let mut accepted = Vec::new();
    for c in cands {
        if builder.push_within(c, limit) {
            accepted.push(c.clone());
        }
    }
    (builder, accepted)
}

#[test]
fn a_refused_candidate_leaves_no_trace() {
    // Keep pushing after a refusal: later candidates reuse the prefixes the refused one created
    // and removed, and the plan must be that of the accepted candidates alone.
    for seed in 0..40 {
        let o = opts(Placement::Prefix);
        let cands = random_batch(seed, 30);
        let (builder, accepted) = push_within_half(&cands, &o);
        assert!(
            accepted.len() < cands.len(),
            "seed {seed}: something was refused"
        );
        assert_eq!(builder.n_candidates(), accepted.len());
        assert_same_plan(&builder.finish(), &Plan::build(&accepted, &o));
    }
}

/// Heap bytes of a plan, by capacity.
fn plan_bytes(plan: &Plan) -> usize {
    use std::mem::size_of;
    4 * (plan.tokens.capacity()
        + plan.positions.capacity()
        + plan.token_segment.capacity()
        + plan.ancestors.capacity()
        + plan.head_rows.capacity())
        + size_of::<Segment>() * plan.segments.capacity()
        + size_of::<usize>() * plan.ancestor_offsets.capacity()
        + size_of::<Target>() * plan.targets.capacity()
}

/// Heap bytes of a builder's trie and targets, by capacity (a hash map entry with its control
/// byte).
fn builder_bytes(b: &PlanBuilder) -> usize {
    use std::mem::size_of;
    let t = &b.trie;
    4 * (t.token.capacity()
        + t.parent.capacity()
        + t.first_child.capacity()
        + t.last_child.capacity()
        + t.next_sibling.capacity()
        + t.flat_index.capacity())
        + (size_of::<((u32, u32), u32)>() + 1) * t.children.capacity()
        + size_of::<(u32, u32, f64, u32)>() * b.raw_targets.capacity()
}

/// Inline candidates at every position of one text: the text's path splits into one-token
/// segments, each below as many segments as tokens, so the ancestor lists grow as the square
/// of the text's length while the tokens grow linearly.
fn every_position_inline(n: usize) -> Vec<TokenCandidate> {
    let x = text(n);
    (1..n).map(|i| cand(&x, i, &[1], &[1, 2])).collect()
}

/// The planner's estimate covers what an adversarial plan holds at its peak (trie, targets and
/// the plan itself), its ancestor lists included, which its tokens alone do not.
#[test]
fn an_adversarial_plans_estimate_covers_its_real_size() {
    let o = opts(Placement::Inline);
    let cands = every_position_inline(1200);
    let mut builder = PlanBuilder::new(&o);
    for c in &cands {
        builder.push(c);
    }
    let (estimate, bound) = (builder.planner_bytes(), builder.ancestors_bound());
    let held = builder_bytes(&builder);
    let plan = builder.finish();
    check_plan(&plan, &cands, &o);
    let real = held + plan_bytes(&plan);
    assert!(
        plan.ancestors.len() > 50 * plan.n_tokens(),
        "adversarial: {} ancestor entries for {} tokens",
        plan.ancestors.len(),
        plan.n_tokens()
    );
    assert!(bound >= plan.ancestors.len());
    // Exact but for the first segments' few (every segment above a branch is one token).
    assert!(bound - plan.ancestors.len() < plan.n_tokens(), "{bound}");
    assert!(estimate >= real, "estimate {estimate} < {real} bytes");
}

/// Chunks planned for a device hold its budget with the context map's ancestor entries
/// counted: on the adversarial batch (every segment a token deep in a long shared text) they
/// are smaller than chunks that count tokens alone, and each is the plan of its candidates.
#[test]
fn chunks_on_a_device_count_the_ancestor_lists() {
    let o = opts(Placement::Inline);
    let cands = every_position_inline(600);
    let (per_token, per_ancestor) = (64, 4);
    let budget = Plan::build(&cands, &o).n_tokens() * per_token / 4;
    let mut chunks = 0;
    for (range, plan) in chunked_on_device(&cands, &o, budget, per_token, per_ancestor) {
        chunks += 1;
        assert_same_plan(&Plan::build(&cands[range.clone()], &o), &plan);
        let bytes = plan.n_tokens() * per_token + plan.ancestors.len() * per_ancestor;
        assert!(
            bytes <= budget || range.len() == 1,
            "{range:?}: {bytes} bytes over the budget of {budget}"
        );
    }
    let by_tokens = chunked(&cands, &o, budget / per_token).count();
    assert!(
        chunks > 2 * by_tokens,
        "{chunks} chunks, {by_tokens} by tokens"
    );
}

/// Chunks planned within a byte budget hold it, ancestor lists included, on the adversarial
/// batch; and the bound holds the ancestors of every plan, and is restored when a candidate is
/// undone.
#[test]
fn chunks_in_bytes_hold_the_budget_and_the_bound_holds_every_plan() {
    let o = opts(Placement::Inline);
    let cands = every_position_inline(1200);
    let per_token = 64;
    let whole = Plan::build(&cands, &o);
    let budget = plan_bytes(&whole) / 4;
    let mut chunks = 0;
    for (range, plan) in chunked_in_bytes(&cands, &o, budget, per_token) {
        chunks += 1;
        let mut builder = PlanBuilder::new(&o);
        for c in &cands[range.clone()] {
            builder.push(c);
        }
        let held = builder_bytes(&builder);
        assert_same_plan(&builder.finish(), &plan);
        let real = plan.n_tokens() * per_token + held + plan_bytes(&plan);
        assert!(
            real <= budget || range.len() == 1,
            "{range:?}: {real} bytes over the budget of {budget}"
        );
    }
    assert!(chunks > 4, "{chunks} chunks");
    for seed in 0..40 {
        for placement in [Placement::Prefix, Placement::Inline] {
            let o = opts(placement);
            let cands = random_batch(seed, 30);
            let (builder, accepted) = push_within_half(&cands, &o);
            let mut fresh = PlanBuilder::new(&o);
            for c in &accepted {
                fresh.push(c);
            }
            assert_eq!(builder.ancestors_bound(), fresh.ancestors_bound());
            let plan = builder.finish();
            assert!(
                fresh.ancestors_bound() >= plan.ancestors.len(),
                "seed {seed}"
            );
        }
    }
}

/// The same call at every position of one text, prefixed, with a long loss window: every
/// candidate's sequences are the same few hundred tokens, but each brings hundreds of targets.
fn every_position_prefixed_with_a_long_window(n: usize) -> (Vec<TokenCandidate>, ScoreOptions) {
    let x = text(n);
    let o = ScoreOptions {
        placement: Placement::Prefix,
        weights: LossWeights::new(vec![1.0; n / 2]).unwrap(),
    };
    ((1..n).map(|i| cand(&x, i, &[1], &[1, 2])).collect(), o)
}

/// The planner's estimate counts the targets, which grow with candidates times their window,
/// not with tokens: on a batch that adds no token after its first candidate it still covers
/// the real size, and chunks under a byte budget stay within it (before, every candidate that
/// added no token joined the first chunk, whatever its targets).
#[test]
fn targets_count_in_the_planners_memory() {
    let (cands, o) = every_position_prefixed_with_a_long_window(400);
    let mut builder = PlanBuilder::new(&o);
    for c in &cands {
        builder.push(c);
    }
    let estimate = builder.planner_bytes();
    let held = builder_bytes(&builder);
    let plan = builder.finish();
    check_plan(&plan, &cands, &o);
    assert!(
        plan.targets.len() > 100 * plan.n_tokens(),
        "target-heavy: {} targets for {} tokens",
        plan.targets.len(),
        plan.n_tokens()
    );
    let real = held + plan_bytes(&plan);
    assert!(estimate >= real, "estimate {estimate} < {real} bytes");

    let budget = estimate / 4;
    let mut chunks = 0;
    for (range, plan) in chunked_in_bytes(&cands, &o, budget, 0) {
        chunks += 1;
        assert_same_plan(&Plan::build(&cands[range.clone()], &o), &plan);
        let mut alone = PlanBuilder::new(&o);
        for c in &cands[range.clone()] {
            alone.push(c);
        }
        assert!(
            alone.planner_bytes() <= budget || range.len() == 1,
            "{range:?}: {} bytes over the budget of {budget}",
            alone.planner_bytes()
        );
    }
    assert!(chunks >= 4, "{chunks} chunks");

    // Activations so large that the first candidate alone is over the budget: the candidates
    // that add no token after it join its chunk only while their targets fit the budget.
    let per_token = budget;
    let mut chunks = 0;
    for (range, plan) in chunked_in_bytes(&cands, &o, budget, per_token) {
        chunks += 1;
        let target_bytes = plan.targets.len() * PLANNER_BYTES_PER_TARGET;
        assert!(
            range.len() == 1 || target_bytes <= budget,
            "{range:?}: {target_bytes} bytes of targets over the budget of {budget}"
        );
    }
    assert!(chunks >= 4, "{chunks} chunks");
}
