//! Incremental decoding on the CPU: a tree of cached keys and values (a KV tree) and a forward
//! over new tokens that attend to it. The driver's sampling steps run on it: a batch of prefixes
//! is prefilled once as a prefix tree (shared prefixes computed once), then every sample forks
//! the KV of its prefix and decodes one token per step, all samples of the batch together.

use rayon::prelude::*;

use super::gemm::{matmul, matmul_wt};
use super::{ops, CpuScorer, RunStats};
use crate::plan::Plan;
use crate::sample::kv_tree::Group;
pub use crate::sample::kv_tree::NodeId;

/// The CPU store of a KV tree: per layer, [rows, d] keys (rotary applied) and values.
#[derive(Default)]
pub struct HostKv {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// A KV tree on the host (`crate::sample::kv_tree`).
pub type KvTree = crate::sample::kv_tree::KvTree<HostKv>;

impl KvTree {
    pub fn new(n_layer: usize) -> Self {
        KvTree::with_store(HostKv {
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
        })
    }
}

impl CpuScorer {
    /// Runs `tokens[g]` at the end of sequence `nodes[g]` for every group g, extending the tree, and
    /// returns the final residual stream of the new tokens ([n_new, d], before ln_f) in order.
    /// A group may continue a node that another group of the same call creates tokens for only if
    /// it was forked from it beforehand (prefill of a prefix tree does exactly that).
    pub fn extend(&self, tree: &mut KvTree, nodes: &[NodeId], tokens: &[Vec<u32>]) -> Vec<f32> {
        let (ids, positions, groups) = tree.append(nodes, tokens);
        super::on_pool(|| self.forward_new(tree, &ids, &positions, &groups))
    }

    /// Prefills a prefix tree: every segment of `plan` becomes a node of `tree` (returned per
    /// segment) holding its ancestors' rows and its own; returns the final residual stream of the
    /// plan's tokens ([n_tokens, d]).
    pub fn prefill(&self, tree: &mut KvTree, plan: &Plan) -> (Vec<NodeId>, Vec<f32>) {
        let (nodes, groups) = tree.add_plan(plan);
        let x = super::on_pool(|| self.forward_new(tree, &plan.tokens, &plan.positions, &groups));
        (nodes, x)
    }

    /// The layer loop over new tokens whose store rows start at `tree.rows()` and whose groups'
    /// contexts are already recorded.
    fn forward_new(
        &self,
        tree: &mut KvTree,
        ids: &[u32],
        positions: &[u32],
        groups: &[Group],
    ) -> Vec<f32> {
        let c = &self.config;
        let (d, n_head, head_dim) = (c.n_embd, c.n_head, c.head_dim());
        let n = ids.len();
        let base = tree.rows();
        tree.commit(n);
        let mut stats = RunStats::default(); // decoding keeps no stage times
        self.trunk(
            ids,
            positions,
            |l, qkv, ctx| {
                // This layer's new K/V rows go to the store, then attend over cached rows.
                let (k, v) = (&mut tree.store.k[l], &mut tree.store.v[l]);
                k.resize((base + n) * d, 0.0);
                v.resize((base + n) * d, 0.0);
                for (t, row) in qkv.chunks(3 * d).enumerate() {
                    k[(base + t) * d..][..d].copy_from_slice(&row[d..2 * d]);
                    v[(base + t) * d..][..d].copy_from_slice(&row[2 * d..]);
                }
                cached_attention(groups, qkv, k, v, n_head, head_dim, ctx);
            },
            &mut stats,
        )
    }

    /// Full log-softmax rows ([rows, vocab]) from final residual rows ([rows, d]).
    pub fn log_softmax_rows(&self, x: &[f32]) -> Vec<f32> {
        super::on_pool(|| {
            let (d, vocab) = (self.config.n_embd, self.config.vocab_size);
            let rows = x.len() / d;
            let eps = self.config.layer_norm_epsilon as f32;
            let mut h = vec![0f32; rows * d];
            h.par_chunks_mut(d)
                .zip(x.par_chunks(d))
                .for_each(|(o, x)| ops::layer_norm_row(x, &self.weights.ln_f, eps, o));
            let mut logits = vec![0f32; rows * vocab];
            matmul(
                &h,
                &self.weights.lm_head,
                &mut logits,
                [rows, vocab, d],
                false,
                true,
            );
            logits.par_chunks_mut(vocab).for_each(|row| {
                for (l, b) in row.iter_mut().zip(&self.weights.lm_head_b) {
                    *l += b;
                }
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let lse = max
                    + row
                        .iter()
                        .map(|&v| (v - max).exp() as f64)
                        .sum::<f64>()
                        .ln() as f32;
                for l in row.iter_mut() {
                    *l -= lse;
                }
            });
            logits
        })
    }
}

/// Groups with at most this many new tokens attend row by row straight from the store
/// ([`attend_direct`]); larger ones (prefill) gather their context per head and use gemm.
/// Decoding steps have one new token per group: there the gather, which copies the whole context
/// per head for one query, and the gemm call on a 1-row problem cost more than the products.
const DIRECT_MAX_NEW: usize = 4;

/// Attention of new tokens over the KV tree: group g's new tokens are the last `n_new` rows of its
/// context `ctx`, and new token a sees the context up to and including itself.
fn cached_attention(
    groups: &[Group],
    qkv: &[f32],
    k: &[f32],
    v: &[f32],
    n_head: usize,
    head_dim: usize,
    out: &mut [f32],
) {
    let d = n_head * head_dim;
    let mut rest = out;
    let mut outs = Vec::with_capacity(groups.len());
    for (_, n_new, _) in groups {
        let (mine, tail) = rest.split_at_mut(n_new * d);
        outs.push(mine);
        rest = tail;
    }
    outs.into_par_iter()
        .zip(groups.par_iter())
        .for_each(|(out, (ranges, n_new, first))| {
            if *n_new == 0 {
                return; // a group with no new tokens (an empty sequence) has nothing to attend
            }
            let rows: Vec<usize> = ranges.iter().flat_map(|r| r.clone()).collect();
            let q = &qkv[first * 3 * d..(first + n_new) * 3 * d];
            let kv = Store { k, v, d, head_dim };
            if *n_new <= DIRECT_MAX_NEW {
                attend_direct(&rows, q, kv, out);
            } else {
                attend_gathered(&rows, q, kv, out);
            }
        });
}

/// One layer's cached keys and values, [rows, d] each, with the head size.
#[derive(Clone, Copy)]
struct Store<'a> {
    k: &'a [f32],
    v: &'a [f32],
    d: usize,
    head_dim: usize,
}

/// Attention for one group whose queries are the last `n_new` rows of its context `rows`, all
/// heads at once, reading each context row of K and V whole from the store.
/// q: [n_new, 3d] (the qkv rows of the new tokens); out: [n_new, d].
fn attend_direct(rows: &[usize], q: &[f32], kv: Store, out: &mut [f32]) {
    let Store { k, v, d, head_dim } = kv;
    let n_head = d / head_dim;
    let n_new = q.len() / (3 * d);
    let n_old = rows.len() - n_new;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut p = vec![0f32; n_head * rows.len()]; // [n_head, n_ctx]
    for (a, out) in out.chunks_mut(d).enumerate() {
        let q = &q[a * 3 * d..][..d];
        let visible = &rows[..n_old + a + 1];
        let n_vis = visible.len();
        for (j, &r) in visible.iter().enumerate() {
            let key = &k[r * d..][..d];
            for (h, (qh, kh)) in q.chunks(head_dim).zip(key.chunks(head_dim)).enumerate() {
                p[h * n_vis + j] = dot(qh, kh) * scale;
            }
        }
        for ph in p[..n_head * n_vis].chunks_mut(n_vis) {
            softmax_in_place(ph);
        }
        out.fill(0.0);
        for (j, &r) in visible.iter().enumerate() {
            let value = &v[r * d..][..d];
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

/// Attention for one group, head by head: its context's K and V gathered into dense [n_ctx,
/// head_dim] blocks, then two gemms. For groups with many new tokens (prefill).
fn attend_gathered(rows: &[usize], q_rows: &[f32], kv: Store, out: &mut [f32]) {
    let Store { k, v, d, head_dim } = kv;
    let n_head = d / head_dim;
    let n_new = q_rows.len() / (3 * d);
    let n_ctx = rows.len();
    let n_old = n_ctx - n_new;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut q = vec![0f32; n_new * head_dim];
    let mut kh = vec![0f32; n_ctx * head_dim];
    let mut vh = vec![0f32; n_ctx * head_dim];
    let mut scores = vec![0f32; n_new * n_ctx];
    let mut o = vec![0f32; n_new * head_dim];
    for hd in 0..n_head {
        let col = hd * head_dim;
        for a in 0..n_new {
            q[a * head_dim..][..head_dim].copy_from_slice(&q_rows[a * 3 * d + col..][..head_dim]);
        }
        for (j, &r) in rows.iter().enumerate() {
            kh[j * head_dim..][..head_dim].copy_from_slice(&k[r * d + col..][..head_dim]);
            vh[j * head_dim..][..head_dim].copy_from_slice(&v[r * d + col..][..head_dim]);
        }
        matmul_wt(&q, &kh, &mut scores, [n_new, n_ctx, head_dim], false, false);
        for (a, srow) in scores.chunks_mut(n_ctx).enumerate() {
            for x in srow.iter_mut() {
                *x *= scale;
            }
            let visible = n_old + a + 1;
            softmax_in_place(&mut srow[..visible]);
            srow[visible..].fill(0.0);
        }
        matmul(&scores, &vh, &mut o, [n_new, head_dim, n_ctx], false, false);
        for a in 0..n_new {
            out[a * d + col..][..head_dim].copy_from_slice(&o[a * head_dim..(a + 1) * head_dim]);
        }
    }
}

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

/// Softmax of already scaled scores, in place.
fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut sum = 0f32;
    for s in x.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    for s in x.iter_mut() {
        *s /= sum;
    }
}
