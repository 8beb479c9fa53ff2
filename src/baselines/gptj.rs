//! GPT-J in candle (f32, CPU), written the way a typical candle user would write it: candle_nn
//! modules and ops, full [T, T] causal attention per head, nothing fused. It is the trunk both
//! baselines run; toolsift's own engine is benchmarked against it, so it must be ordinary, not
//! tuned, and it must not be handicapped either: its linear weights are stored [in, out]
//! (`linear`), which made the tuned baseline 1.13x faster (docs/benchmarks.md).
//!
//! The math is transformers' `GPTJForCausalLM` (see `crate::reference`, the f64 oracle): embedding;
//! per layer `h = ln_1(x)`, `x = x + attn(h) + mlp(h)`; "rotate every two" rotary on the first
//! `rotary_dim` dims of each head (base 10000); causal softmax attention scaled by 1/sqrt(head_dim);
//! `gelu_new`; `ln_f`; `lm_head` with bias.

use candle_core::{Device, Module, Result, Tensor, D};
use candle_nn::{Embedding, LayerNorm, Linear};

use crate::model::weights::{GptjWeights, LayerNormWeights, Linear as LinearWeights};
use crate::model::{GptjConfig, Tensor as CheckpointTensor};

/// A checkpoint tensor as an f32 candle tensor of the same shape.
fn to_candle(t: &CheckpointTensor, device: &Device) -> Result<Tensor> {
    Tensor::from_vec(t.to_f32(), t.shape(), device)
}

/// A `candle_nn::Linear` whose weight is stored [in, out]: it holds the [out, in] view that
/// `Linear::new` expects, and its forward's `weight.t()` is then contiguous, the layout the gemm
/// crate multiplies without repacking a transposed right-hand side on every call.
fn linear(l: &LinearWeights, device: &Device) -> Result<Linear> {
    let weight = to_candle(&l.weight, device)?; // [out, in]
    let weight = weight.t()?.contiguous()?.t()?; // [out, in], stored [in, out]
    let bias = l.bias.as_ref().map(|b| to_candle(b, device)).transpose()?;
    Ok(Linear::new(weight, bias))
}

fn layer_norm(l: &LayerNormWeights, eps: f64, device: &Device) -> Result<LayerNorm> {
    Ok(LayerNorm::new(
        to_candle(&l.weight, device)?,
        to_candle(&l.bias, device)?,
        eps,
    ))
}

/// `on_true` where `mask` is 1, `on_false` elsewhere (the helper candle's own models use).
fn masked_fill(on_false: &Tensor, mask: &Tensor, on_true: f32) -> Result<Tensor> {
    let on_true = Tensor::new(on_true, on_false.device())?.broadcast_as(mask.shape())?;
    mask.where_cond(&on_true, on_false)
}

/// 1 above the diagonal (key j > query i: the future), 0 elsewhere: [T, T] u8.
fn causal_mask(t: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<u8> = (0..t)
        .flat_map(|i| (0..t).map(move |j| u8::from(j > i)))
        .collect();
    Tensor::from_slice(&mask, (t, t), device)
}

#[derive(Debug, Clone)]
struct Block {
    ln_1: LayerNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    fc_in: Linear,
    fc_out: Linear,
}

/// GPT-J with candle tensors. Cloning is cheap (candle tensors share their storage).
#[derive(Debug, Clone)]
pub struct CandleGptj {
    config: GptjConfig,
    device: Device,
    wte: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    lm_head: Linear,
    /// Rotary tables for positions 0..n_positions: [n_positions, rotary_dim / 2]. Built in f64 and
    /// rounded once, so they carry no error beyond f32 rounding.
    cos: Tensor,
    sin: Tensor,
}

impl CandleGptj {
    /// Copies toolsift's in-memory weights (any storage dtype) into f32 candle tensors on the CPU.
    pub fn new(config: &GptjConfig, weights: &GptjWeights) -> Result<Self> {
        let device = Device::Cpu;
        let eps = config.layer_norm_epsilon;
        let blocks = weights
            .h
            .iter()
            .map(|b| {
                Ok(Block {
                    ln_1: layer_norm(&b.ln_1, eps, &device)?,
                    q_proj: linear(&b.attn.q_proj, &device)?,
                    k_proj: linear(&b.attn.k_proj, &device)?,
                    v_proj: linear(&b.attn.v_proj, &device)?,
                    out_proj: linear(&b.attn.out_proj, &device)?,
                    fc_in: linear(&b.mlp.fc_in, &device)?,
                    fc_out: linear(&b.mlp.fc_out, &device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (n_pos, half) = (config.n_positions, config.rotary_dim() / 2);
        let angles: Vec<f64> = (0..n_pos)
            .flat_map(|p| {
                (0..half).map(move |i| {
                    p as f64 / 10000f64.powf((2 * i) as f64 / config.rotary_dim() as f64)
                })
            })
            .collect();
        let table = |f: fn(f64) -> f64| {
            let v: Vec<f32> = angles.iter().map(|&a| f(a) as f32).collect();
            Tensor::from_vec(v, (n_pos, half), &device)
        };
        Ok(CandleGptj {
            config: config.clone(),
            wte: Embedding::new(to_candle(&weights.wte, &device)?, config.n_embd),
            blocks,
            ln_f: layer_norm(&weights.ln_f, eps, &device)?,
            lm_head: linear(&weights.lm_head, &device)?,
            cos: table(f64::cos)?,
            sin: table(f64::sin)?,
            device,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &GptjConfig {
        &self.config
    }

    /// Where its tensors live: always the CPU (`CandleGptj::new`).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Final hidden states (after ln_f) of a batch of token ids: [B, T] u32 -> [B, T, n_embd].
    ///
    /// Every row starts at position 0 and only the causal mask is applied, so a batch must be
    /// right-padded: pad tokens then come after every real token and cannot affect it.
    pub fn forward_hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let (_b, t) = ids.dims2()?;
        if t > self.config.n_positions {
            candle_core::bail!(
                "sequence of {t} tokens is longer than n_positions ({})",
                self.config.n_positions
            );
        }
        let mask = causal_mask(t, &self.device)?; // [T, T]
        let mut x = self.wte.forward(ids)?; // [B, T, d]
        for block in &self.blocks {
            let h = block.ln_1.forward(&x)?; // [B, T, d]
            let attn = self.attention(&h, block, &mask)?; // [B, T, d]
            let mlp = block.fc_out.forward(&block.fc_in.forward(&h)?.gelu()?)?; // [B, T, d]
            x = ((x + attn)? + mlp)?; // parallel residual
        }
        self.ln_f.forward(&x)
    }

    /// LM-head logits of hidden states: [.., n_embd] -> [.., vocab_size].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(hidden)
    }

    /// Causal self-attention of GPT-J (no biases) followed by out_proj: [B, T, d] -> [B, T, d].
    fn attention(&self, h: &Tensor, block: &Block, mask: &Tensor) -> Result<Tensor> {
        let (b, t, d) = h.dims3()?;
        let (n_head, head_dim) = (self.config.n_head, self.config.head_dim());
        let heads = |x: Tensor| -> Result<Tensor> {
            x.reshape((b, t, n_head, head_dim))?
                .transpose(1, 2)? // [B, H, T, hd]
                .contiguous()
        };
        let q = self.rotary(&heads(block.q_proj.forward(h)?)?)?; // [B, H, T, hd]
        let k = self.rotary(&heads(block.k_proj.forward(h)?)?)?; // [B, H, T, hd]
        let v = heads(block.v_proj.forward(h)?)?; // [B, H, T, hd]
        let scale = 1.0 / (head_dim as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?; // [B, H, T, T]
        let scores = masked_fill(
            &scores,
            &mask.broadcast_as(scores.shape())?,
            f32::NEG_INFINITY,
        )?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?; // [B, H, T, T]
        let ctx = probs
            .matmul(&v)? // [B, H, T, hd]
            .transpose(1, 2)? // [B, T, H, hd]
            .reshape((b, t, d))?; // [B, T, d]
        block.out_proj.forward(&ctx)
    }

    /// GPT-J's interleaved ("rotate every two") rotary embedding on the first rotary_dim dims of
    /// each head, positions 0..T: [B, H, T, hd] -> [B, H, T, hd]. candle_nn's `rope_i` is exactly
    /// this rotation of the pairs (x[2i], x[2i+1]); the remaining dims pass through.
    fn rotary(&self, x: &Tensor) -> Result<Tensor> {
        let (_b, _h, t, head_dim) = x.dims4()?;
        let rot = self.config.rotary_dim();
        if rot == 0 {
            return Ok(x.clone());
        }
        let cos = self.cos.narrow(0, 0, t)?; // [T, rot / 2]
        let sin = self.sin.narrow(0, 0, t)?; // [T, rot / 2]
        let rotated =
            candle_nn::rotary_emb::rope_i(&x.narrow(D::Minus1, 0, rot)?.contiguous()?, &cos, &sin)?; // [B, H, T, rot]
        if rot == head_dim {
            return Ok(rotated);
        }
        let pass = x.narrow(D::Minus1, rot, head_dim - rot)?; // [B, H, T, hd - rot]
        Tensor::cat(&[rotated, pass], D::Minus1)?.contiguous()
    }
}

/// Right-pads `seqs` with token 0 to the longest one: a [B, T] u32 tensor. Pads sit after every
/// real token, so the causal mask keeps them from influencing any real position.
pub fn right_padded_batch(seqs: &[&[u32]], device: &Device) -> Result<Tensor> {
    let t = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(seqs.len() * t);
    for s in seqs {
        ids.extend_from_slice(s);
        ids.resize(ids.len() + t - s.len(), 0);
    }
    Tensor::from_vec(ids, (seqs.len(), t), device)
}
