//! The transformer trunk, shared by scoring and decoding: embedding, then per layer ln_1, the
//! fused q/k/v GEMM, rotary, attention, the MLP and the parallel residual. The callers differ
//! only in attention: scoring attends over a plan's prefix tree (`attention::tree_attention`),
//! decoding stores the new K/V rows in its KV tree and attends over cached rows.

use std::time::Instant;

use super::gemm::matmul;
use super::{ops, CpuScorer};
use crate::run_stats::RunStats;

impl CpuScorer {
    /// The final residual stream ([n, d], before ln_f) of the tokens `ids` at `positions`.
    /// `attend(layer, qkv, ctx)` fills `ctx` ([n, d]) from this layer's rotated `qkv`
    /// ([n, 3d]: q, k, v per row). Time in GEMMs and in `attend` is added to `stats`.
    pub(crate) fn trunk(
        &self,
        ids: &[u32],
        positions: &[u32],
        mut attend: impl FnMut(usize, &[f32], &mut [f32]),
        stats: &mut RunStats,
    ) -> Vec<f32> {
        let c = &self.config;
        let (n, d, f) = (ids.len(), c.n_embd, c.inner_dim());
        let (n_head, head_dim) = (c.n_head, c.head_dim());
        let eps = c.layer_norm_epsilon as f32;
        let mut x = vec![0f32; n * d]; // [n, d] residual stream
        let mut h = vec![0f32; n * d]; // [n, d] ln_1 output
        let mut qkv = vec![0f32; n * 3 * d]; // [n, 3d]
        let mut ctx = vec![0f32; n * d]; // [n, d] attention output before out_proj
        let mut mlp = vec![0f32; n * f]; // [n, f]
        ops::embed(&self.weights.wte, ids, d, &mut x);
        for (l, block) in self.weights.h.iter().enumerate() {
            ops::layer_norm(&x, &block.ln_1, eps, d, &mut h);
            let t = Instant::now();
            matmul(&h, &block.qkv, &mut qkv, [n, 3 * d, d], false, true);
            stats.trunk_gemm_secs += t.elapsed().as_secs_f64();
            ops::rotary_qk(&mut qkv, positions, &self.rotary, n_head, head_dim);
            let t = Instant::now();
            attend(l, &qkv, &mut ctx);
            stats.attention_secs += t.elapsed().as_secs_f64();
            let t = Instant::now();
            matmul(&h, &block.fc_in, &mut mlp, [n, f, d], false, true);
            stats.trunk_gemm_secs += t.elapsed().as_secs_f64();
            ops::bias_gelu_new(&mut mlp, &block.fc_in_b);
            // Parallel residual: x += out_proj(ctx) + fc_out(mlp) + b, accumulated in place.
            let t = Instant::now();
            matmul(&ctx, &block.out_proj, &mut x, [n, d, d], true, true);
            matmul(&mlp, &block.fc_out, &mut x, [n, d, f], true, true);
            stats.trunk_gemm_secs += t.elapsed().as_secs_f64();
            ops::add_bias(&mut x, &block.fc_out_b);
        }
        x
    }
}
