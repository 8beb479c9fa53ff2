//! Tree (cascade) attention on the CPU: every segment of the plan attends to all tokens of its
//! ancestor segments and causally to its own. One task per segment (rayon); per head, the keys and
//! values of the segment's context are gathered once, then two small GEMMs and a masked softmax.

use rayon::prelude::*;

use super::gemm::{matmul, matmul_wt};
use crate::plan::Plan;

/// ctx[t, h] = softmax(q[t, h] . K[ctx(t), h] / sqrt(head_dim)) V[ctx(t), h] for every token t of
/// the plan. `qkv` is [n_tokens, 3d] (q | k | v, rotary applied); `ctx` is [n_tokens, d].
pub fn tree_attention(plan: &Plan, qkv: &[f32], n_head: usize, head_dim: usize, ctx: &mut [f32]) {
    let d = n_head * head_dim;
    // One mutable slice of `ctx` per segment (segments are contiguous and in order).
    let mut rest = ctx;
    let mut outs = Vec::with_capacity(plan.segments.len());
    for seg in &plan.segments {
        let (mine, tail) = rest.split_at_mut(seg.len as usize * d);
        outs.push(mine);
        rest = tail;
    }
    outs.into_par_iter().enumerate().for_each(|(s, out)| {
        segment_attention(plan, s, qkv, n_head, head_dim, out);
    });
}

fn segment_attention(
    plan: &Plan,
    s: usize,
    qkv: &[f32],
    n_head: usize,
    head_dim: usize,
    out: &mut [f32], // [len, d]
) {
    let d = n_head * head_dim;
    let seg = plan.segments[s];
    let (len, n_anc) = (seg.len as usize, seg.depth as usize);
    let n_ctx = n_anc + len;
    // Context token rows: ancestors root first, then the segment itself.
    let rows: Vec<usize> = plan
        .ancestors_of(s)
        .iter()
        .flat_map(|&a| {
            let a = plan.segments[a as usize];
            a.start as usize..(a.start + a.len) as usize
        })
        .chain(seg.start as usize..(seg.start + seg.len) as usize)
        .collect();
    debug_assert_eq!(rows.len(), n_ctx);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut q = vec![0f32; len * head_dim]; // [len, head_dim]
    let mut k = vec![0f32; n_ctx * head_dim]; // [n_ctx, head_dim]
    let mut v = vec![0f32; n_ctx * head_dim]; // [n_ctx, head_dim]
    let mut scores = vec![0f32; len * n_ctx]; // [len, n_ctx]
    let mut o = vec![0f32; len * head_dim]; // [len, head_dim]
    for h in 0..n_head {
        let col = h * head_dim;
        for (i, row) in (seg.start as usize..(seg.start + seg.len) as usize).enumerate() {
            let src = &qkv[row * 3 * d + col..][..head_dim];
            q[i * head_dim..(i + 1) * head_dim].copy_from_slice(src);
        }
        for (j, &row) in rows.iter().enumerate() {
            k[j * head_dim..(j + 1) * head_dim]
                .copy_from_slice(&qkv[row * 3 * d + d + col..][..head_dim]);
            v[j * head_dim..(j + 1) * head_dim]
                .copy_from_slice(&qkv[row * 3 * d + 2 * d + col..][..head_dim]);
        }
        matmul_wt(&q, &k, &mut scores, [len, n_ctx, head_dim], false, false);
        for (i, srow) in scores.chunks_mut(n_ctx).enumerate() {
            // Token i of the segment sees every ancestor token and tokens 0..=i of its own.
            let visible = n_anc + i + 1;
            let max = srow[..visible]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| m.max(x * scale));
            let mut sum = 0f32;
            for x in &mut srow[..visible] {
                *x = (*x * scale - max).exp();
                sum += *x;
            }
            let inv = 1.0 / sum;
            for x in &mut srow[..visible] {
                *x *= inv;
            }
            srow[visible..].fill(0.0);
        }
        matmul(&scores, &v, &mut o, [len, head_dim, n_ctx], false, false);
        for i in 0..len {
            out[i * d + col..][..head_dim].copy_from_slice(&o[i * head_dim..(i + 1) * head_dim]);
        }
    }
}
