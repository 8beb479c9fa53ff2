//! GPT-J's weights on the device: matrices in a 16-bit type T (bf16 or f16) with row strides
//! padded to 8 elements (`context::stride`), LayerNorm parameters and biases in f32 (they are
//! tiny, and f32 keeps the elementwise kernels' inputs exact). q, k and v are stacked into one
//! [3 * n_embd, n_embd] matrix, as on the CPU, so a layer starts with one GEMM.

use cudarc::driver::CudaSlice;
use rayon::prelude::*;

use super::context::{stride, DeviceFloat, Gpu};
use crate::error::{driver_err, Result};
use crate::model::weights::{GptjWeights, LayerNormWeights};
use crate::model::{GptjConfig, Tensor};

/// A LayerNorm's parameters on the device, in f32.
pub struct CudaLayerNorm {
    /// Scale (gamma), `[n_embd]`.
    pub weight: CudaSlice<f32>,
    /// Shift (beta), `[n_embd]`.
    pub bias: CudaSlice<f32>,
}

/// One transformer block's weights on the device: matrices in T as [out, stride(in)] (PyTorch's
/// [out, in], rows zero-padded), biases in f32.
pub struct CudaBlock<T> {
    /// ln_1, applied before both attention and the MLP (GPT-J's parallel residual).
    pub ln_1: CudaLayerNorm,
    /// [3 * n_embd, stride(n_embd)]: q_proj, k_proj, v_proj rows stacked (no biases in GPT-J).
    pub qkv: CudaSlice<T>,
    /// [n_embd, stride(n_embd)]: the attention output projection (no bias).
    pub out_proj: CudaSlice<T>,
    /// [n_inner, stride(n_embd)]: the MLP's input projection.
    pub fc_in: CudaSlice<T>,
    /// `[n_inner]`: fc_in's bias, added by the gelu kernel.
    pub fc_in_b: CudaSlice<f32>,
    /// [n_embd, stride(n_inner)]: the MLP's output projection.
    pub fc_out: CudaSlice<T>,
    /// `[n_embd]`: fc_out's bias, added to the residual stream by the next LayerNorm (the next
    /// block's ln_1, or ln_f).
    pub fc_out_b: CudaSlice<f32>,
}

/// GPT-J's weights on the device, in storage type T (bf16 or f16).
pub struct CudaWeights<T> {
    /// Token embeddings, [vocab_size, stride(n_embd)].
    pub wte: CudaSlice<T>,
    /// The blocks, in layer order.
    pub h: Vec<CudaBlock<T>>,
    /// The final LayerNorm, before the LM head.
    pub ln_f: CudaLayerNorm,
    /// LM head, [vocab_size, stride(n_embd)].
    pub lm_head: CudaSlice<T>,
    /// LM head bias, `[vocab_size]` (zeros when the model has none).
    pub lm_head_b: CudaSlice<f32>,
    /// Device bytes held.
    pub bytes: usize,
}

/// Stacks `tensors` (each [rows_i, cols]) into one [sum rows_i, ld] matrix of T on the host
/// (rounding to nearest; padding columns are zero), then uploads it.
fn upload_matrix<T: DeviceFloat>(
    gpu: &Gpu,
    tensors: &[&Tensor],
    cols: usize,
    ld: usize,
    bytes: &mut usize,
) -> Result<CudaSlice<T>> {
    let rows: usize = tensors.iter().map(|t| t.numel() / cols).sum();
    let mut host = vec![T::default(); rows * ld];
    let mut rest = host.as_mut_slice();
    for t in tensors {
        let r = t.numel() / cols;
        let (mine, tail) = rest.split_at_mut(r * ld);
        rest = tail;
        mine.par_chunks_mut(ld).enumerate().for_each_init(
            || vec![0f32; cols],
            |wide, (i, row)| {
                t.widen_into(i * cols, wide);
                for (v, &x) in row.iter_mut().zip(wide.iter()) {
                    *v = T::from_f32(x);
                }
            },
        );
    }
    *bytes += host.len() * std::mem::size_of::<T>();
    gpu.stream
        .clone_htod(&host)
        .map_err(driver_err("uploading weights"))
}

fn upload_f32(gpu: &Gpu, t: &Tensor, bytes: &mut usize) -> Result<CudaSlice<f32>> {
    let v = t.to_f32();
    *bytes += 4 * v.len();
    gpu.stream
        .clone_htod(&v)
        .map_err(driver_err("uploading weights"))
}

fn upload_ln(gpu: &Gpu, l: &LayerNormWeights, bytes: &mut usize) -> Result<CudaLayerNorm> {
    Ok(CudaLayerNorm {
        weight: upload_f32(gpu, &l.weight, bytes)?,
        bias: upload_f32(gpu, &l.bias, bytes)?,
    })
}

impl<T: DeviceFloat> CudaWeights<T> {
    /// Uploads `w`: matrices rounded to T on the host (to nearest), LayerNorms and biases in f32.
    /// Fails if a block's fc_in or fc_out has no bias, or an allocation or copy fails.
    pub fn new(gpu: &Gpu, config: &GptjConfig, w: &GptjWeights) -> Result<Self> {
        let _span = tracing::info_span!("cuda_upload_weights", dtype = T::DTYPE.name()).entered();
        let (d, f, vocab) = (config.n_embd, config.inner_dim(), config.vocab_size);
        let (ds, fs) = (stride(d), stride(f));
        let mut bytes = 0;
        let bias = |b: &Option<Tensor>, what: &str| -> Result<Tensor> {
            b.clone().ok_or_else(|| {
                crate::error::Error::Backend(format!("cuda: {what} has no bias (GPT-J has one)"))
            })
        };
        let mut h = Vec::with_capacity(w.h.len());
        for b in &w.h {
            let a = &b.attn;
            h.push(CudaBlock {
                ln_1: upload_ln(gpu, &b.ln_1, &mut bytes)?,
                qkv: upload_matrix(
                    gpu,
                    &[&a.q_proj.weight, &a.k_proj.weight, &a.v_proj.weight],
                    d,
                    ds,
                    &mut bytes,
                )?,
                out_proj: upload_matrix(gpu, &[&a.out_proj.weight], d, ds, &mut bytes)?,
                fc_in: upload_matrix(gpu, &[&b.mlp.fc_in.weight], d, ds, &mut bytes)?,
                fc_in_b: upload_f32(gpu, &bias(&b.mlp.fc_in.bias, "fc_in")?, &mut bytes)?,
                fc_out: upload_matrix(gpu, &[&b.mlp.fc_out.weight], f, fs, &mut bytes)?,
                fc_out_b: upload_f32(gpu, &bias(&b.mlp.fc_out.bias, "fc_out")?, &mut bytes)?,
            });
        }
        // A `Model` built field by field may lack it: zeros, as the reference reads it.
        let lm_head_b = match &w.lm_head.bias {
            Some(b) => upload_f32(gpu, b, &mut bytes)?,
            None => {
                bytes += 4 * vocab;
                gpu.stream
                    .alloc_zeros::<f32>(vocab)
                    .map_err(driver_err("allocating the lm_head bias"))?
            }
        };
        Ok(CudaWeights {
            wte: upload_matrix(gpu, &[&w.wte], d, ds, &mut bytes)?,
            h,
            ln_f: upload_ln(gpu, &w.ln_f, &mut bytes)?,
            lm_head: upload_matrix(gpu, &[&w.lm_head.weight], d, ds, &mut bytes)?,
            lm_head_b,
            bytes,
        })
    }
}
