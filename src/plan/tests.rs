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
    // Every (candidate, variant) has exactly the spec's targets, each predicted from the spec's context.
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
    // none: x[..13]; call: 1 2 3 | 4 x[..13]; result: 1 2 3 | 5 6 x[..13].
    assert_eq!(plan.n_tokens(), 13 + 3 + (1 + 13) + (2 + 13));
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
    // x[..8] shared; none continues x[8..13]; calls share 1 2 3 then branch.
    assert_eq!(plan.n_tokens(), 8 + 5 + 3 + (1 + 5) + (2 + 5));
    // A second position of the same text shares x[..8] and the no-call branch up to x[13].
    let c2 = cand(&x, 11, &[1, 2, 3, 4], &[1, 2, 3, 5, 6]);
    let both = [c, c2];
    let plan2 = Plan::build(&both, &o);
    check_plan(&plan2, &both, &o);
    // The no-call branch grows by x[13..16]; the calls branch off it after x[..11] and share 1 2 3.
    assert_eq!(
        plan2.n_tokens(),
        plan.n_tokens() + 3 + 3 + (1 + 5) + (2 + 5)
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
    let none_tokens = 5 + 3 * 3 + 5; // the longest no-call sequence covers the others
    let call_tokens: usize = (0..4)
        .map(|k| 1 + (5 + 3 * k + 5) + 1 + (5 + 3 * k + 5))
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
    assert_eq!(plan.n_tokens(), 10 + 11 + 11);
    let long = text(100);
    let c = cand(&long, 8, &[1], &[2]);
    let plan = Plan::build(std::slice::from_ref(&c), &o);
    assert_eq!(plan.n_tokens(), 13 * 3 + 2, "cut after x_(i+4)");
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
