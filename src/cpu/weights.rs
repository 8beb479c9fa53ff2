//! GPT-J's weights widened to f32 once and laid out for the CPU engine:
//!
//! - every matrix is stored [in, out], transposed from PyTorch's [out, in], so a linear layer is a
//!   row-major `x @ W` GEMM: the `gemm` crate would repack a transposed right-hand side on every
//!   call, which costs as much as the product itself when few rows multiply it (the LM head's
//!   tiles, the decoder's 25-32 row steps; docs/benchmarks.md has the measurement);
//! - q, k and v projections are stacked into one [n_embd, 3 * n_embd] matrix, so a layer starts
//!   with a single GEMM;
//! - the transpose reads the checkpoint's bytes and widens them as it writes, so no f32 copy of a
//!   source matrix is ever made (half the load time of a bf16 checkpoint; docs/benchmarks.md).

use rayon::prelude::*;

use crate::model::tensor::{bf16_to_f32, f16_to_f32};
use crate::model::weights::{GptjWeights, LayerNormWeights};
use crate::model::{DType, GptjConfig, Tensor};

/// A LayerNorm's parameters in f32 (`ln_1`, `ln_f`).
pub struct CpuLayerNorm {
    /// The scale, `[n_embd]`.
    pub weight: Vec<f32>,
    /// The shift, `[n_embd]`.
    pub bias: Vec<f32>,
}

/// One layer; matrices [in, out], row-major.
pub struct CpuBlock {
    /// The block's LayerNorm, read by both attention and the MLP.
    pub ln_1: CpuLayerNorm,
    /// [n_embd, 3 * n_embd], stored [in, out]: columns of q_proj, then k_proj, then v_proj.
    pub qkv: Vec<f32>,
    /// [n_embd, n_embd], stored [in, out].
    pub out_proj: Vec<f32>,
    /// [n_embd, n_inner], stored [in, out].
    pub fc_in: Vec<f32>,
    /// fc_in's bias, `[n_inner]`.
    pub fc_in_b: Vec<f32>,
    /// [n_inner, n_embd], stored [in, out].
    pub fc_out: Vec<f32>,
    /// fc_out's bias, `[n_embd]`.
    pub fc_out_b: Vec<f32>,
}

/// The whole model in f32, as the CPU engine reads it (the module's docs give the layout).
pub struct CpuWeights {
    /// [vocab_size, n_embd], PyTorch's layout: rows are looked up, not multiplied.
    pub wte: Vec<f32>,
    /// The blocks in order, `n_layer` of them.
    pub h: Vec<CpuBlock>,
    /// The final LayerNorm before the LM head.
    pub ln_f: CpuLayerNorm,
    /// [n_embd, vocab_size], stored [in, out] (a transposed copy of `wte` when the embeddings
    /// are tied).
    pub lm_head: Vec<f32>,
    /// `[vocab_size]`; zeros when the weights had no LM head bias.
    pub lm_head_b: Vec<f32>,
}

/// Consumes a tensor: its storage is freed on return unless shared.
fn f32_of(t: Tensor) -> Vec<f32> {
    t.to_f32()
}

/// A PyTorch linear weight ([out, in]) stored [in, out], widened as it is transposed.
fn linear_of(t: Tensor) -> Vec<f32> {
    let rows = t.shape().first().copied().unwrap_or(0);
    let cols = t.numel() / rows.max(1);
    transposed_widened(&[&t], rows, cols)
}

/// The matrix stacking `parts` by rows (each [rows, cols], row-major, in its storage type)
/// transposed to [cols, parts.len() * rows] and widened to f32 in the same pass: no f32 copy of
/// the source is made (it would be a second fresh allocation as large as the result, and on a
/// large checkpoint the page faults of fresh memory are a third of the load).
fn transposed_widened(parts: &[&Tensor], rows: usize, cols: usize) -> Vec<f32> {
    fn elements<'a, const N: usize>(parts: &[&'a Tensor]) -> Vec<&'a [[u8; N]]> {
        parts.iter().map(|t| t.elements()).collect()
    }
    let dtype = parts.first().map_or(DType::F32, |t| t.dtype());
    if parts.iter().any(|t| t.dtype() != dtype) {
        // Mixed storage types: widen each part first.
        let wide: Vec<Vec<f32>> = parts.iter().map(|t| t.to_f32()).collect();
        let wide: Vec<&[f32]> = wide.iter().map(Vec::as_slice).collect();
        return transposed(&wide, rows, cols, |x| x);
    }
    match dtype {
        DType::F32 => transposed(&elements(parts), rows, cols, f32::from_le_bytes),
        DType::F16 => transposed(&elements(parts), rows, cols, f16_to_f32),
        DType::BF16 => transposed(&elements(parts), rows, cols, bf16_to_f32),
    }
}

/// The matrix stacking `parts` by rows (each [rows, cols], row-major) transposed to [cols,
/// parts.len() * rows], each element passed through `widen`. One task per 256 output rows;
/// within it, 256-row tiles of the source moved in 32 x 32 pieces, so reads and writes both stay
/// within a few hundred pages at a time (a plain column walk misses the TLB on every source row,
/// about half the speed on a 50400 x 4096 head: 0.4 against 0.8-1.1 GB/s on 2 cores).
fn transposed<E: Copy + Sync>(
    parts: &[&[E]],
    rows: usize,
    cols: usize,
    widen: impl Fn(E) -> f32 + Sync,
) -> Vec<f32> {
    const TILE: usize = 256;
    const PIECE: usize = 32;
    let total = parts.len() * rows; // rows of the stacked source = columns of the result
    let mut out = vec![0f32; total * cols];
    if total == 0 || cols == 0 {
        return out;
    }
    let row = |i: usize| &parts[i / rows][(i % rows) * cols..][..cols];
    out.par_chunks_mut(TILE * total)
        .enumerate()
        .for_each(|(b, block)| {
            let (j0, width) = (b * TILE, block.len() / total);
            for i0 in (0..total).step_by(TILE) {
                let i1 = (i0 + TILE).min(total);
                for pi in (i0..i1).step_by(PIECE) {
                    for pj in (0..width).step_by(PIECE) {
                        let w = PIECE.min(width - pj);
                        for i in pi..(pi + PIECE).min(i1) {
                            for (dj, &v) in row(i)[j0 + pj..][..w].iter().enumerate() {
                                block[(pj + dj) * total + i] = widen(v);
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
    /// Widens `w` tensor by tensor, releasing each source tensor as soon as it is converted, so
    /// that an owned checkpoint never exists twice in memory. `w` agrees with `config`.
    pub(crate) fn from_owned(config: &GptjConfig, w: GptjWeights) -> Self {
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
                let attn = &b.attn;
                let d = config.n_embd;
                let qkv = [
                    &attn.q_proj.weight,
                    &attn.k_proj.weight,
                    &attn.v_proj.weight,
                ];
                CpuBlock {
                    ln_1: ln(&b.ln_1),
                    qkv: transposed_widened(&qkv, d, d),
                    out_proj: linear_of(b.attn.out_proj.weight),
                    fc_in: linear_of(b.mlp.fc_in.weight),
                    fc_in_b: b.mlp.fc_in.bias.map(f32_of).expect("fc_in has a bias"),
                    fc_out: linear_of(b.mlp.fc_out.weight),
                    fc_out_b: b.mlp.fc_out.bias.map(f32_of).expect("fc_out has a bias"),
                }
            })
            .collect();
        // A `Model` built field by field may lack it: zeros, as the reference reads it.
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

    /// Bytes held by the f32 matrices and vectors (4 per element; capacity beyond the lengths
    /// and the structs themselves not counted).
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
    use super::*;

    /// Every parameter counted once, four bytes each (`GptjConfig::n_params`: both LayerNorm
    /// vectors of every norm, the LM head's bias included).
    #[test]
    fn bytes_are_four_per_parameter() {
        let config = GptjConfig::small(2, 12, 3, 2, 50);
        let w = CpuWeights::from_owned(&config, GptjWeights::random(&config, 1, DType::F32));
        assert_eq!(w.bytes(), 4 * config.n_params());
    }

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
            let t = transposed(&[&src[..]], rows, cols, |x| x);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(t[j * rows + i], src[i * cols + j]);
                }
            }
        }
    }

    /// Stacked parts in every storage type (and mixed) give the transpose of the widened
    /// stack: exactly, since widening is exact.
    #[test]
    fn transposes_and_widens_stacked_tensors() {
        let (rows, cols) = (37, 300);
        let mut rng = crate::util::rng::Rng::new(4);
        let values: Vec<Vec<f32>> = (0..3)
            .map(|_| (0..rows * cols).map(|_| rng.normal()).collect())
            .collect();
        let mixed = [DType::BF16, DType::F32, DType::F16];
        for dtypes in [[DType::F32; 3], [DType::F16; 3], [DType::BF16; 3], mixed] {
            let parts: Vec<Tensor> = values
                .iter()
                .zip(dtypes)
                .map(|(v, dt)| Tensor::from_f32_as(vec![rows, cols], v, dt))
                .collect();
            let refs: Vec<&Tensor> = parts.iter().collect();
            let got = transposed_widened(&refs, rows, cols);
            let stacked: Vec<f32> = parts.iter().flat_map(|t| t.to_f32()).collect();
            let total = 3 * rows;
            for i in 0..total {
                for j in 0..cols {
                    assert_eq!(
                        got[j * total + i],
                        stacked[i * cols + j],
                        "{dtypes:?} ({i}, {j})"
                    );
                }
            }
        }
    }
}
