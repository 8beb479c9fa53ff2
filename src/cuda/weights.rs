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

/// Stacks `tensors` (each [rows_i, cols], with its Hugging Face name) into one [sum rows_i, ld]
/// matrix of T on the host (rounding to nearest; padding columns are zero), then uploads it. A
/// weight that T cannot hold (|w| > 65504 stored as f16 from a bf16 or f32 checkpoint) is an
/// error naming its tensor: rounded, it would be inf, and every loss NaN.
fn upload_matrix<T: DeviceFloat>(
    gpu: &Gpu,
    tensors: &[(&Tensor, String)],
    cols: usize,
    ld: usize,
    bytes: &mut usize,
) -> Result<CudaSlice<T>> {
    let rows: usize = tensors.iter().map(|(t, _)| t.numel() / cols).sum();
    let mut host = vec![T::default(); rows * ld];
    let mut rest = host.as_mut_slice();
    for (t, name) in tensors {
        let r = t.numel() / cols;
        let (mine, tail) = rest.split_at_mut(r * ld);
        rest = tail;
        // The loader refused non-finite weights: one that is not finite now overflowed T.
        let overflow = mine
            .par_chunks_mut(ld)
            .enumerate()
            .map_init(
                || vec![0f32; cols],
                |wide, (i, row)| {
                    t.widen_into(i * cols, wide);
                    let mut overflow = None;
                    for (v, &x) in row.iter_mut().zip(wide.iter()) {
                        *v = T::from_f32(x);
                        if !v.to_f32().is_finite() {
                            overflow = Some(x);
                        }
                    }
                    overflow
                },
            )
            .find_any(Option::is_some)
            .flatten();
        if let Some(x) = overflow {
            return Err(crate::error::Error::Backend(format!(
                "cuda: tensor `{name}`: the weight {x} overflows {} storage; store the weights \
                 as bf16 or f32 (CudaOptions::dtype)",
                T::DTYPE.name()
            )));
        }
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
        for (i, b) in w.h.iter().enumerate() {
            let a = &b.attn;
            let name = |what: &str| format!("transformer.h.{i}.{what}.weight");
            h.push(CudaBlock {
                ln_1: upload_ln(gpu, &b.ln_1, &mut bytes)?,
                qkv: upload_matrix(
                    gpu,
                    &[
                        (&a.q_proj.weight, name("attn.q_proj")),
                        (&a.k_proj.weight, name("attn.k_proj")),
                        (&a.v_proj.weight, name("attn.v_proj")),
                    ],
                    d,
                    ds,
                    &mut bytes,
                )?,
                out_proj: upload_matrix(
                    gpu,
                    &[(&a.out_proj.weight, name("attn.out_proj"))],
                    d,
                    ds,
                    &mut bytes,
                )?,
                fc_in: upload_matrix(
                    gpu,
                    &[(&b.mlp.fc_in.weight, name("mlp.fc_in"))],
                    d,
                    ds,
                    &mut bytes,
                )?,
                fc_in_b: upload_f32(gpu, &bias(&b.mlp.fc_in.bias, "fc_in")?, &mut bytes)?,
                fc_out: upload_matrix(
                    gpu,
                    &[(&b.mlp.fc_out.weight, name("mlp.fc_out"))],
                    f,
                    fs,
                    &mut bytes,
                )?,
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
            wte: upload_matrix(
                gpu,
                &[(&w.wte, "transformer.wte.weight".into())],
                d,
                ds,
                &mut bytes,
            )?,
            h,
            ln_f: upload_ln(gpu, &w.ln_f, &mut bytes)?,
            lm_head: upload_matrix(
                gpu,
                &[(&w.lm_head.weight, "lm_head.weight".into())],
                d,
                ds,
                &mut bytes,
            )?,
            lm_head_b,
            bytes,
        })
    }
}
