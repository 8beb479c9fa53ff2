//! Attention on the CPU. Scoring runs tree (cascade) attention over a plan: every segment attends
//! to all tokens of its ancestor segments and causally to its own, one task per segment (rayon).
//! The decoder runs the same step over the rows of its KV tree (cpu/decode.rs). Both come down
//! to `attend`: queries that are the last rows of their context, over keys and values read
//! in place, row by row for a few queries, gathered per head into two small GEMMs for many.

use rayon::prelude::*;

use super::gemm::{matmul, matmul_wt};
use super::ops::exp_nonpositive;
use crate::plan::Plan;

/// ctx[t, h] = softmax(q[t, h] . K[ctx(t), h] / sqrt(head_dim)) V[ctx(t), h] for every token t of
/// the plan. `qkv` is [n_tokens, 3d] (q | k | v, rotary applied); `ctx` is [n_tokens, d].
pub fn tree_attention(plan: &Plan, qkv: &[f32], n_head: usize, head_dim: usize, ctx: &mut [f32]) {
    let d = n_head * head_dim;
    // One mutable slice of `ctx` per segment (segments are contiguous and in order).
    let ctx_len = ctx.len();
    let mut rest = ctx;
    let mut outs = Vec::with_capacity(plan.segments.len());
    for seg in &plan.segments {
        // Checked in release too (once per segment): `Plan`'s fields are public, and a plan out
        // of order would leave rows of ctx with the previous layer's values.
        assert_eq!(
            ctx_len - rest.len(),
            seg.start as usize * d,
            "segments out of order"
        );
        let (mine, tail) = rest.split_at_mut(seg.len as usize * d);
        outs.push(mine);
        rest = tail;
    }
    // Every row is written: `ctx` is not cleared between layers.
    assert!(rest.is_empty(), "segments leave rows of ctx unwritten");
    // Keys and values are the k and v columns of the same qkv rows.
    let kv = KeysValues {
        k: &qkv[d..],
        v: &qkv[2 * d..],
        stride: 3 * d,
        d,
        head_dim,
    };
    outs.into_par_iter().enumerate().for_each(|(s, out)| {
        let seg = plan.segments[s];
        let own = seg.start as usize..(seg.start + seg.len) as usize;
        // Context token rows: ancestors root first, then the segment itself.
        let rows: Vec<usize> = plan
            .ancestors_of(s)
            .iter()
            .flat_map(|&a| {
                let a = plan.segments[a as usize];
                a.start as usize..(a.start + a.len) as usize
            })
            .chain(own.clone())
            .collect();
        debug_assert_eq!(rows.len(), seg.depth as usize + own.len());
        attend(&rows, &qkv[own.start * 3 * d..own.end * 3 * d], kv, out);
    });
}

/// Keys and values of context rows, read in place: row r's key is `k[r * stride..][..d]` (head h
/// at columns h * head_dim..), its value likewise in `v`.
#[derive(Clone, Copy)]
pub(crate) struct KeysValues<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub stride: usize,
    /// n_embd: n_head * head_dim.
    pub d: usize,
    pub head_dim: usize,
}

impl KeysValues<'_> {
    #[inline(always)]
    fn key(&self, row: usize) -> &[f32] {
        &self.k[row * self.stride..][..self.d]
    }

    #[inline(always)]
    fn value(&self, row: usize) -> &[f32] {
        &self.v[row * self.stride..][..self.d]
    }
}

/// Queries with at most this many rows attend row by row ([`attend_direct`]); more gather their
/// context per head for two gemms ([`attend_gathered`]). A decoding step has one query per
/// sample: the gather copies the whole context per head for it, and gemm on a 1-row problem
/// costs more than the products (docs/benchmarks.md).
const DIRECT_MAX_QUERIES: usize = 4;

/// Attention of queries that are the last rows of their context `rows` (query a sees the
/// context up to and including itself). q: [n_q, 3d], the qkv rows of the queries (their q
/// columns are read); out: [n_q, d].
pub(crate) fn attend(rows: &[usize], q: &[f32], kv: KeysValues, out: &mut [f32]) {
    let n_q = out.len() / kv.d;
    debug_assert_eq!(q.len(), n_q * 3 * kv.d);
    debug_assert!(n_q <= rows.len());
    if n_q <= DIRECT_MAX_QUERIES {
        attend_direct(rows, q, kv, out);
    } else {
        let block = (SCORE_BYTES / (4 * rows.len().max(1))).min(QUERY_BLOCK);
        let parallel = n_q * rows.len() >= PARALLEL_HEADS_MIN_SCORES;
        attend_gathered(rows, q, kv, out, block, parallel);
    }
}

/// Queries per block of [`attend_gathered`]: a block's products stop at its last query's row,
/// so the smaller the block, the less of the causal mask's upper triangle is computed and
/// thrown away (one block of all queries computed twice the needed products for one long
/// sequence). 32, 64 and 128 measured the same; 64 rows keep the products wide enough for the
/// gemm microkernels (docs/benchmarks.md, "Causal query blocks").
const QUERY_BLOCK: usize = 64;

/// Queries x context at and above which [`attend_gathered`] runs its heads as parallel tasks:
/// a plan of one long segment (a document's P(x) ++ x, a group's prefill) would otherwise
/// attend on one thread while the others wait. Below it a head is too little work to be worth
/// a task and its own buffers. Each head's arithmetic is the same either way, so the results
/// depend neither on this nor on the thread count.
const PARALLEL_HEADS_MIN_SCORES: usize = 1 << 16;

row_kernel! {
    /// [`attend`] all heads at once, reading each context row's key and value whole.
    fn attend_direct / attend_direct_copies(
        rows: &[usize],
        q: &[f32],
        kv: KeysValues,
        out: &mut [f32],
    ) {
        let (d, head_dim) = (kv.d, kv.head_dim);
        let n_head = d / head_dim;
        let n_old = rows.len() - out.len() / d;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut p = vec![0f32; n_head * rows.len()]; // [n_head, n_visible]
        for (a, out) in out.chunks_mut(d).enumerate() {
            let q = &q[a * 3 * d..][..d];
            let visible = &rows[..n_old + a + 1];
            let n_vis = visible.len();
            for (j, &r) in visible.iter().enumerate() {
                let key = kv.key(r);
                for (h, (qh, kh)) in q.chunks(head_dim).zip(key.chunks(head_dim)).enumerate() {
                    p[h * n_vis + j] = dot(qh, kh) * scale;
                }
            }
            for ph in p[..n_head * n_vis].chunks_mut(n_vis) {
                softmax_in_place(ph);
            }
            out.fill(0.0);
            for (j, &r) in visible.iter().enumerate() {
                let value = kv.value(r);
                for (h, (oh, vh)) in out
                    .chunks_mut(head_dim)
                    .zip(value.chunks(head_dim))
                    .enumerate()
                {
                    let w = p[h * n_vis + j];
                    for (o, &x) in oh.iter_mut().zip(vh) {
                        *o += w * x;
                    }
                }
            }
        }
    }
}

/// Bytes of scores [`attend_gathered`] holds at once: queries go in blocks of at most
/// `SCORE_BYTES / (4 * n_ctx)` rows, so the [queries, n_ctx] block stays bounded however long
/// the context (a 2^20-position model would otherwise need 256 MiB per block of 64 queries).
/// 16 MiB is 64 queries over 65,536 rows: below that, [`QUERY_BLOCK`] sets the block.
const SCORE_BYTES: usize = 16 << 20;

/// [`attend`] head by head (the heads as parallel tasks with `parallel`): the context's keys and
/// values gathered into dense [n_ctx, head_dim] blocks, then, `query_block` queries at a time,
/// q K^T over the context rows the block sees, a masked softmax, and P V.
fn attend_gathered(
    rows: &[usize],
    q_rows: &[f32],
    kv: KeysValues,
    out: &mut [f32],
    query_block: usize,
    parallel: bool,
) {
    let n_head = kv.d / kv.head_dim;
    let block = (out.len() / kv.d).min(query_block).max(1);
    let scratch = || HeadScratch::new(block, rows.len(), kv.head_dim);
    let columns = HeadColumns::new(out, kv.d, kv.head_dim);
    let run = |s: &mut HeadScratch, h: usize| {
        // SAFETY: head h is attended by this call alone, and it writes only head h's columns.
        attend_head(rows, q_rows, kv, h, s, |a, o| unsafe {
            columns.write(h, a, o)
        });
    };
    if parallel {
        (0..n_head).into_par_iter().for_each_init(scratch, run);
    } else {
        let mut s = scratch();
        (0..n_head).for_each(|h| run(&mut s, h));
    }
}

/// One head's buffers for [`attend_head`], reused across the heads a task runs.
struct HeadScratch {
    block: usize,
    q: Vec<f32>,      // [block, head_dim]
    k: Vec<f32>,      // [n_ctx, head_dim]
    v: Vec<f32>,      // [n_ctx, head_dim]
    scores: Vec<f32>, // [block, n_ctx]
    o: Vec<f32>,      // [block, head_dim]
}

impl HeadScratch {
    fn new(block: usize, n_ctx: usize, head_dim: usize) -> Self {
        HeadScratch {
            block,
            q: vec![0f32; block * head_dim],
            k: vec![0f32; n_ctx * head_dim],
            v: vec![0f32; n_ctx * head_dim],
            scores: vec![0f32; block * n_ctx],
            o: vec![0f32; block * head_dim],
        }
    }
}

/// Head `h` of [`attend_gathered`]: `emit(a, o)` receives query a's output for this head
/// ([head_dim]).
fn attend_head(
    rows: &[usize],
    q_rows: &[f32],
    kv: KeysValues,
    h: usize,
    s: &mut HeadScratch,
    mut emit: impl FnMut(usize, &[f32]),
) {
    let (d, head_dim) = (kv.d, kv.head_dim);
    let (n_q, n_ctx) = (q_rows.len() / (3 * d), rows.len());
    let n_old = n_ctx - n_q;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let col = h * head_dim;
    for (j, &r) in rows.iter().enumerate() {
        s.k[j * head_dim..][..head_dim].copy_from_slice(&kv.key(r)[col..][..head_dim]);
        s.v[j * head_dim..][..head_dim].copy_from_slice(&kv.value(r)[col..][..head_dim]);
    }
    for a0 in (0..n_q).step_by(s.block) {
        let m = s.block.min(n_q - a0);
        for a in 0..m {
            s.q[a * head_dim..][..head_dim]
                .copy_from_slice(&q_rows[(a0 + a) * 3 * d + col..][..head_dim]);
        }
        // The block's last query sees the first n_seen context rows; no query sees past them.
        let n_seen = n_old + a0 + m;
        let scores = &mut s.scores[..m * n_seen]; // [m, n_seen]
        matmul_wt(
            &s.q[..m * head_dim],
            &s.k[..n_seen * head_dim],
            scores,
            [m, n_seen, head_dim],
            false,
            false,
        );
        // Query a0 + a sees every older row and the queries up to itself.
        masked_softmax_rows(scores, n_seen, n_old + a0 + 1, scale);
        let o = &mut s.o[..m * head_dim];
        matmul(
            scores,
            &s.v[..n_seen * head_dim],
            o,
            [m, head_dim, n_seen],
            false,
            false,
        );
        for (a, oa) in o.chunks(head_dim).enumerate() {
            emit(a0 + a, oa);
        }
    }
}

/// `out` ([n_q, d]) shared by head tasks that each write only their own head's columns,
/// h * head_dim..(h + 1) * head_dim of every row: the tasks' elements are disjoint.
struct HeadColumns<'a> {
    ptr: *mut f32,
    len: usize,
    d: usize,
    head_dim: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: the pointer is `out`'s, borrowed mutably for 'a; tasks write disjoint elements
// (`write`'s contract), so sharing it across threads is sharing disjoint slices of it.
unsafe impl Send for HeadColumns<'_> {}
unsafe impl Sync for HeadColumns<'_> {}

impl<'a> HeadColumns<'a> {
    fn new(out: &'a mut [f32], d: usize, head_dim: usize) -> Self {
        HeadColumns {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            d,
            head_dim,
            _out: std::marker::PhantomData,
        }
    }

    /// Writes query `a`'s output for head `h`.
    ///
    /// # Safety
    /// No other thread may write head `h`'s columns at the same time.
    unsafe fn write(&self, h: usize, a: usize, o: &[f32]) {
        let at = a * self.d + h * self.head_dim;
        // Head h's columns end within the row: no write reaches row a + 1, another task's.
        assert!(
            o.len() == self.head_dim
                && (h + 1) * self.head_dim <= self.d
                && at + o.len() <= self.len
        );
        // SAFETY: in bounds (asserted); the range is head h's columns of row a, which only the
        // caller writes (the contract above), and `out` is borrowed mutably for 'a.
        unsafe { std::ptr::copy_nonoverlapping(o.as_ptr(), self.ptr.add(at), o.len()) }
    }
}

row_kernel! {
    /// Scores ([m, n] rows of q . k) to probabilities: row a scaled by `scale` and softmaxed over
    /// its first `first_visible + a` columns, the rest zero (the causal mask).
    fn masked_softmax_rows / masked_softmax_rows_copies(
        scores: &mut [f32],
        n: usize,
        first_visible: usize,
        scale: f32,
    ) {
        for (a, row) in scores.chunks_mut(n).enumerate() {
            let visible = first_visible + a;
            for x in &mut row[..visible] {
                *x *= scale;
            }
            softmax_in_place(&mut row[..visible]);
            row[visible..].fill(0.0);
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums: independent lanes the compiler can vectorize (a single running sum is
    // a serial dependency it must keep in order).
    let mut acc = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Softmax of already scaled scores, in place. The exponentials and their sum in separate
/// loops, the sum in 8 running sums: both vectorise (one loop carrying a single f32 sum cannot).
#[inline(always)]
fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in x.iter_mut() {
        *s = exp_nonpositive(*s - max);
    }
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (l, &s) in lanes.iter_mut().zip(chunk) {
            *l += s;
        }
    }
    let sum = lanes.iter().sum::<f32>() + tail;
    let inv = 1.0 / sum;
    for s in x.iter_mut() {
        *s *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    /// Scores far past where exp overflows f32 (~88.7), as a peaked trained model's can reach:
    /// the softmax is shifted by its max, so these are 1 / (1 + e^-1) and e^-1 / (1 + e^-1).
    #[test]
    fn softmax_of_large_scores_is_finite() {
        for scale in [1.0f32, -1.0] {
            let mut x = [1000.0 * scale, 1000.0 * scale - 1.0, -1e30];
            softmax_in_place(&mut x);
            let e = (-1f32).exp();
            let want = [1.0 / (1.0 + e), e / (1.0 + e), 0.0];
            for (g, w) in x.iter().zip(want) {
                assert!((g - w).abs() < 1e-6, "{x:?}");
            }
        }
    }

    /// Queries in blocks give what all at once gives, and what row by row gives.
    #[test]
    fn query_blocks_do_not_change_attention() {
        let (n_head, head_dim, n_old, n_q) = (3, 8, 5, 11);
        let d = n_head * head_dim;
        let n_ctx = n_old + n_q;
        let mut rng = Rng::new(9);
        let qkv: Vec<f32> = (0..n_ctx * 3 * d)
            .map(|_| rng.uniform() as f32 * 2.0 - 1.0)
            .collect();
        let kv = KeysValues {
            k: &qkv[d..],
            v: &qkv[2 * d..],
            stride: 3 * d,
            d,
            head_dim,
        };
        // The context's rows out of order, as a tree's ancestors can be.
        let rows: Vec<usize> = (0..n_ctx).rev().collect();
        let q: Vec<f32> = rows[n_old..]
            .iter()
            .flat_map(|&r| qkv[r * 3 * d..(r + 1) * 3 * d].iter().copied())
            .collect();
        let run = |block: Option<(usize, bool)>| {
            let mut out = vec![0f32; n_q * d];
            match block {
                Some((b, parallel)) => attend_gathered(&rows, &q, kv, &mut out, b, parallel),
                None => attend_direct(&rows, &q, kv, &mut out),
            }
            out
        };
        let whole = run(Some((n_q, false)));
        for reference in [run(Some((1, false))), run(Some((4, false))), run(None)] {
            for (a, b) in whole.iter().zip(&reference) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
        // Each copy of the row kernels (baseline, AVX2, AVX-512: those this machine can run)
        // gives the same bits (crate::cpu's `row_kernel!`).
        let direct = each_copy!(attend_direct_copies, |f| {
            let mut out = vec![0f32; n_q * d];
            f(&rows, &q, kv, &mut out);
            crate::cpu::bits(&out)
        });
        crate::cpu::assert_same_bits(&direct, "attend_direct");
        assert_eq!(direct[0].1, crate::cpu::bits(&run(None)));
        let scores: Vec<f32> = (0..7 * 37).map(|_| rng.normal() * 30.0).collect();
        let softmaxed = each_copy!(masked_softmax_rows_copies, |f| {
            let mut s = scores.clone();
            f(&mut s, 37, 29, 0.125);
            crate::cpu::bits(&s)
        });
        crate::cpu::assert_same_bits(&softmaxed, "masked_softmax_rows");
        // Heads as parallel tasks: the same bits, whatever the pool.
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for b in [1, 4, n_q] {
                let parallel = pool.install(|| run(Some((b, true))));
                assert_eq!(
                    parallel,
                    run(Some((b, false))),
                    "block {b}, {threads} threads"
                );
            }
        }
    }
}
