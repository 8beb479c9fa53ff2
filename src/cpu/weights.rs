//! GPT-J's weights widened to f32 once and laid out for the CPU engine:
//!
//! - every matrix is stored [in, out], transposed from PyTorch's [out, in], so a linear layer is a
//!   row-major `x @ W` GEMM. The `gemm` crate packs a transposed right-hand side on every call,
//!   which costs as much as the product itself when few rows multiply it: with [in, out] storage
//!   the LM head's 64-row chunks and the decoder's steps (25-32 rows) run 2-3.5x faster, the wide
//!   trunk GEMMs 1.1-1.4x (docs/benchmarks.md has the measurement);
//! - q, k and v projections are stacked into one [n_embd, 3 * n_embd] matrix, so a layer starts
//!   with a single GEMM.

use rayon::prelude::*;

use crate::model::weights::{GptjWeights, LayerNormWeights};
use crate::model::GptjConfig;

pub struct CpuLayerNorm {
    pub weight: Vec<f32>, // [n_embd]
    pub bias: Vec<f32>,   // [n_embd]
}

/// One layer; matrices [in, out].
pub struct CpuBlock {
    pub ln_1: CpuLayerNorm,
    pub qkv: Vec<f32>, // [n_embd, 3 * n_embd]: columns of q_proj, then k_proj, then v_proj
    pub out_proj: Vec<f32>, // [n_embd, n_embd]
    pub fc_in: Vec<f32>, // [n_embd, n_inner]
    pub fc_in_b: Vec<f32>, // [n_inner]
    pub fc_out: Vec<f32>, // [n_inner, n_embd]
    pub fc_out_b: Vec<f32>, // [n_embd]
}

pub struct CpuWeights {
    pub wte: Vec<f32>, // [vocab_size, n_embd]: rows are looked up, not multiplied
    pub h: Vec<CpuBlock>,
    pub ln_f: CpuLayerNorm,
    pub lm_head: Vec<f32>,   // [n_embd, vocab_size]
    pub lm_head_b: Vec<f32>, // [vocab_size]
}

/// Consumes a tensor: its storage is freed on return unless shared.
fn f32_of(t: crate::model::Tensor) -> Vec<f32> {
    t.to_f32()
}

/// A PyTorch linear weight ([out, in], `rows` = out) widened and stored [in, out].
fn linear_of(t: crate::model::Tensor) -> Vec<f32> {
    let rows = t.shape().first().copied().unwrap_or(0);
    let w = f32_of(t);
    transposed(&w, rows, w.len() / rows.max(1))
}

/// `src` ([rows, cols], row-major) transposed to [cols, rows]. One task per 256 output rows;
/// within it, 256-row tiles of the source moved in 32 x 32 pieces, so reads and writes both stay
/// within a few hundred pages at a time (a plain column walk misses the TLB on every source row,
/// about half the speed on a 50400 x 4096 head: 0.4 against 0.8-1.1 GB/s on 2 cores).
pub(crate) fn transposed(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const TILE: usize = 256;
    const PIECE: usize = 32;
    let mut out = vec![0f32; rows * cols];
    if rows == 0 || cols == 0 {
        return out;
    }
    out.par_chunks_mut(TILE * rows)
        .enumerate()
        .for_each(|(b, block)| {
            let (j0, width) = (b * TILE, block.len() / rows);
            for i0 in (0..rows).step_by(TILE) {
                let i1 = (i0 + TILE).min(rows);
                for pi in (i0..i1).step_by(PIECE) {
                    for pj in (0..width).step_by(PIECE) {
                        let w = PIECE.min(width - pj);
                        for i in pi..(pi + PIECE).min(i1) {
                            for (dj, &v) in src[i * cols + j0 + pj..][..w].iter().enumerate() {
                                block[(pj + dj) * rows + i] = v;
                            }
                        }
                    }
                }
            }
        });
    out
}

fn ln(l: &LayerNormWeights) -> CpuLayerNorm {
    CpuLayerNorm {
        weight: l.weight.to_f32(),
        bias: l.bias.to_f32(),
    }
}

impl CpuWeights {
    /// Widens a borrowed checkpoint (the source stays mapped/owned by the caller).
    pub fn new(config: &GptjConfig, w: &GptjWeights) -> Self {
        Self::from_owned(config, w.clone())
    }

    /// Widens `w` tensor by tensor, releasing each source tensor as soon as it is converted, so
    /// that an owned checkpoint never exists twice in memory.
    pub fn from_owned(config: &GptjConfig, w: GptjWeights) -> Self {
        let GptjWeights {
            wte,
            h,
            ln_f,
            lm_head,
        } = w;
        let h = h
            .into_iter()
            .map(|b| {
                // [3d, d] (q, k, v rows), stored as its transpose [d, 3d].
                let mut qkv = f32_of(b.attn.q_proj.weight);
                qkv.extend(f32_of(b.attn.k_proj.weight));
                qkv.extend(f32_of(b.attn.v_proj.weight));
                let d = config.n_embd;
                CpuBlock {
                    ln_1: ln(&b.ln_1),
                    qkv: transposed(&qkv, 3 * d, d),
                    out_proj: linear_of(b.attn.out_proj.weight),
                    fc_in: linear_of(b.mlp.fc_in.weight),
                    fc_in_b: b.mlp.fc_in.bias.map(f32_of).expect("fc_in has a bias"),
                    fc_out: linear_of(b.mlp.fc_out.weight),
                    fc_out_b: b.mlp.fc_out.bias.map(f32_of).expect("fc_out has a bias"),
                }
            })
            .collect();
        let lm_head_b = match lm_head.bias {
            Some(b) => f32_of(b),
            None => vec![0.0; config.vocab_size],
        };
        CpuWeights {
            wte: f32_of(wte),
            h,
            ln_f: ln(&ln_f),
            lm_head: linear_of(lm_head.weight),
            lm_head_b,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let block: usize = self
            .h
            .iter()
            .map(|b| {
                b.ln_1.weight.len() * 2
                    + b.qkv.len()
                    + b.out_proj.len()
                    + b.fc_in.len()
                    + b.fc_in_b.len()
                    + b.fc_out.len()
                    + b.fc_out_b.len()
            })
            .sum();
        4 * (self.wte.len()
            + block
            + 2 * self.ln_f.weight.len()
            + self.lm_head.len()
            + self.lm_head_b.len())
    }
}

#[cfg(test)]
mod tests {
    use super::transposed;

    #[test]
    fn transposes_any_shape() {
        for (rows, cols) in [
            (1, 1),
            (3, 5),
            (64, 64),
            (65, 130),
            (130, 7),
            (300, 290),
            (257, 513),
        ] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = transposed(&src, rows, cols);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(t[j * rows + i], src[i * cols + j]);
                }
            }
        }
    }
}
