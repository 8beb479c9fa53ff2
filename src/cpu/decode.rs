//! Incremental decoding on the CPU: a tree of cached keys and values (a KV tree) and a forward
//! over new tokens that attend to it. The driver's sampling steps run on it: a batch of prefixes
//! is prefilled once as a prefix tree (shared prefixes computed once), then every sample forks
//! the KV of its prefix and decodes one token per step, all samples of the batch together.

use rayon::prelude::*;

use super::attention::{attend, KeysValues};
use super::gemm::matmul;
use super::{ops, CpuScorer};
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::run_stats::RunStats;
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
    /// An empty tree for a model of `n_layer` layers: no cached rows, no sequences (`root`
    /// starts one).
    pub fn new(n_layer: usize) -> Self {
        KvTree::with_store(HostKv {
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
        })
    }

    /// Room for exactly `extra` more rows of width `d` in every layer's K and V (a forward past
    /// it grows them by doubling): a cache whose size is known is allocated once, at that size.
    pub fn reserve_exact(&mut self, d: usize, extra: usize) -> Result<()> {
        let rows = self.rows().saturating_add(extra);
        let want = rows.saturating_mul(d);
        for buf in self.store.k.iter_mut().chain(self.store.v.iter_mut()) {
            buf.try_reserve_exact(want.saturating_sub(buf.len()))
                .map_err(|e| {
                    Error::Backend(format!(
                        "cpu: cannot allocate the KV cache for {rows} rows: {e}"
                    ))
                })?;
        }
        Ok(())
    }
}

impl CpuScorer {
    /// Runs `tokens[g]` at the end of sequence `nodes[g]` for every group g, extending the tree,
    /// and returns the final residual stream of the new tokens ([n_new, d], before ln_f) in order.
    /// A group may continue a node that another group of the same call creates tokens for only if
    /// it was forked from it beforehand (prefill of a prefix tree does exactly that).
    ///
    /// # Panics
    /// On what the samplers check first (`sample::batch::check_requests`, the `Decoder`'s
    /// sessions): a token id past `vocab_size`, a sequence past `n_positions`, a node not of
    /// `tree`, `nodes` and `tokens` of other lengths.
    pub fn extend(&self, tree: &mut KvTree, nodes: &[NodeId], tokens: &[Vec<u32>]) -> Vec<f32> {
        let (ids, positions, groups) = tree.append(nodes, tokens);
        super::on_pool(|| self.forward_new(tree, &ids, &positions, &groups))
    }

    /// Prefills a prefix tree: every segment of `plan` becomes a node of `tree` (returned per
    /// segment) holding its ancestors' rows and its own; returns the final residual stream of the
    /// plan's tokens ([n_tokens, d]).
    ///
    /// # Panics
    /// On a plan of candidates that were not validated (`score::validate`): ids past
    /// `vocab_size`, sequences past `n_positions`.
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
    ///
    /// # Panics
    /// When `x` is not whole rows (its length not a multiple of `n_embd`).
    pub fn log_softmax_rows(&self, x: &[f32]) -> Vec<f32> {
        let d = self.config.n_embd;
        assert!(
            x.len().is_multiple_of(d),
            "{} floats are not whole rows of n_embd = {d}",
            x.len()
        );
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
    // One slice of `out` per group, in order: group g's queries are rows first_query.. of qkv,
    // and its output the same rows of `out`.
    let out_len = out.len();
    let mut rest = out;
    let mut outs = Vec::with_capacity(groups.len());
    for g in groups {
        debug_assert!(
            g.n_new == 0 || out_len - rest.len() == g.first_query * d,
            "groups out of order"
        );
        let (mine, tail) = rest.split_at_mut(g.n_new * d);
        outs.push(mine);
        rest = tail;
    }
    outs.into_par_iter()
        .zip(groups.par_iter())
        .for_each(|(out, g)| {
            if g.n_new == 0 {
                return; // a group with no new tokens (an empty sequence) has nothing to attend
            }
            let rows: Vec<usize> = g.ranges.iter().flat_map(|r| r.clone()).collect();
            let q = &qkv[g.first_query * 3 * d..(g.first_query + g.n_new) * 3 * d];
            let kv = KeysValues {
                k,
                v,
                stride: d,
                d,
                head_dim,
            };
            attend(&rows, q, kv, out);
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::head;
    use crate::model::{DType, GptjConfig, GptjWeights, Tensor};
    use crate::sample::cached::KvEngine;
    use crate::util::rng::Rng;

    fn engine(config: &GptjConfig, edit: impl FnOnce(&mut GptjWeights)) -> CpuScorer {
        let mut weights = GptjWeights::random(config, 11, DType::F32);
        edit(&mut weights);
        CpuScorer::from_weights(config, weights).unwrap()
    }

    /// The decoder's full rows equal the scoring head's (`head::log_probs_at`) with logits near
    /// +-1000 (the LM head's bias shifted: a log-softmax does not move), far past where exp
    /// overflows or underflows (the rows are shifted by their max), and at rows whose ln_f
    /// needs its epsilon: a flat one (0 / 0 without it) and one of variance 1e-6.
    #[test]
    fn log_softmax_rows_match_the_scoring_head_past_exp_range_and_at_flat_rows() {
        let (d, vocab) = (8, 37);
        let config = GptjConfig::small(1, d, 2, 4, vocab);
        let mut rng = Rng::new(2);
        let mut x: Vec<f32> = (0..3 * d).map(|_| rng.normal()).collect();
        x.extend(vec![0.5f32; d]);
        x.extend((0..d).map(|i| 0.25 + [1e-3f32, -1e-3][i % 2]));
        for shift in [1000f32, -1000.0] {
            let cpu = engine(&config, |w| {
                let bias = w.lm_head.bias.as_ref().unwrap().to_f32();
                let shifted: Vec<f32> = bias.iter().map(|b| b + shift).collect();
                w.lm_head.bias = Some(Tensor::from_f32(vec![vocab], &shifted));
            });
            let got = cpu.log_softmax_rows(&x);
            let rows = [0u32, 1, 2, 3, 4];
            let targets: Vec<(u32, u32)> = rows
                .iter()
                .flat_map(|&r| (0..vocab as u32).map(move |t| (r, t)))
                .collect();
            let eps = config.layer_norm_epsilon as f32;
            let want = head::log_probs_at(
                &x,
                &rows,
                &targets,
                &cpu.weights,
                [d, vocab],
                eps,
                head::TILES,
            );
            // f32 logits near 1000 are rounded to ~6e-5.
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() < 1e-3,
                    "shift {shift}, {k}: {g} vs {w}"
                );
            }
        }
    }

    /// A sampled token's K/V bytes in the budget (`sample_budget`) are what the host store holds
    /// per row, K and V of every layer: half of it would let groups outgrow the budget.
    #[test]
    fn the_sample_budget_counts_the_kv_rows_the_store_holds() {
        let config = GptjConfig::small(3, 8, 2, 4, 37);
        let cpu = engine(&config, |_| {});
        let mut tree = KvTree::new(config.n_layer);
        let root = tree.root();
        cpu.extend(&mut tree, &[root], &[vec![1, 2, 3, 4, 5]]);
        assert_eq!(tree.rows(), 5);
        let floats: usize = tree.store.k.iter().chain(&tree.store.v).map(Vec::len).sum();
        assert_eq!(4 * floats, tree.rows() * cpu.sample_budget().0.kv);
    }
}
