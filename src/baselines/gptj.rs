//! GPT-J in candle (f32, CPU), written the way a typical candle user would write it: candle_nn
//! modules and ops, full causal attention per head ([T, T], or [T, P + T] after a cache of P
//! positions), nothing fused. It is the trunk the baselines run; toolsift's own engine is
//! benchmarked against it, so it must be ordinary, not tuned, and it must not be handicapped
//! either: its linear weights are stored [in, out] (`linear`), which made the tuned baseline
//! 1.13x faster (docs/benchmarks.md).
//!
//! The math is transformers' `GPTJForCausalLM` (see `crate::reference`, the f64 oracle): embedding;
//! per layer `h = ln_1(x)`, `x = x + attn(h) + mlp(h)`; "rotate every two" rotary on the first
//! `rotary_dim` dims of each head (base 10000); causal softmax attention scaled by
//! 1/sqrt(head_dim); `gelu_new`; `ln_f`; `lm_head` with bias.

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

/// For queries at positions past..past + T over keys at 0..past + T: 1 where the key is in the
/// query's future (j > past + i), 0 elsewhere: [T, past + T] u8.
fn causal_mask(t: usize, past: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<u8> = (0..t)
        .flat_map(|i| (0..past + t).map(move |j| u8::from(j > past + i)))
        .collect();
    Tensor::from_slice(&mask, (t, past + t), device)
}

/// Every layer's keys (rotated) and values at a sequence's first `len` positions, each
/// [1, H, len, hd]: what a KV-cached forward continues from (`CandleGptj::forward_cached`).
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    len: usize,
}

impl KvCache {
    /// Positions it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no position.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The cache of the first `len` positions (views, no copy).
    pub fn prefix(&self, len: usize) -> Result<KvCache> {
        if len > self.len {
            candle_core::bail!("a prefix of {len} positions of a cache of {}", self.len);
        }
        let layers = self
            .layers
            .iter()
            .map(|(k, v)| Ok((k.narrow(2, 0, len)?, v.narrow(2, 0, len)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache { layers, len })
    }
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
        Ok(self.forward_cached(ids, None, false)?.0)
    }

    /// `forward_hidden` continuing `past`: each row of `ids` [B, T] sits at positions
    /// `past.len()..` and attends to all of `past` (the same for every row) and causally to
    /// itself. With `keep` (B = 1) it also returns the cache of `past ++ ids`, for a later call
    /// to continue. Right-padded batches as in `forward_hidden`.
    pub fn forward_cached(
        &self,
        ids: &Tensor,
        past: Option<&KvCache>,
        keep: bool,
    ) -> Result<(Tensor, Option<KvCache>)> {
        let (b, t) = ids.dims2()?;
        let p = past.map_or(0, KvCache::len);
        if p + t > self.config.n_positions {
            candle_core::bail!(
                "sequence of {} tokens is longer than n_positions ({})",
                p + t,
                self.config.n_positions
            );
        }
        if keep && b != 1 {
            candle_core::bail!("a kept cache is one sequence's, not a batch of {b}");
        }
        let mask = causal_mask(t, p, &self.device)?; // [T, P + T]
        let mut x = self.wte.forward(ids)?; // [B, T, d]
        let mut kept = Vec::new();
        for (l, block) in self.blocks.iter().enumerate() {
            let h = block.ln_1.forward(&x)?; // [B, T, d]
            let layer_past = past.map(|c| &c.layers[l]);
            let (attn, kv) = self.attention(&h, block, &mask, layer_past)?; // [B, T, d]
            if keep {
                kept.push(kv);
            }
            let mlp = block.fc_out.forward(&block.fc_in.forward(&h)?.gelu()?)?; // [B, T, d]
            x = ((x + attn)? + mlp)?; // parallel residual
        }
        let cache = keep.then_some(KvCache {
            layers: kept,
            len: p + t,
        });
        Ok((self.ln_f.forward(&x)?, cache))
    }

    /// log p(token | row) for each `(row, token)` of `reads[b]`, batch row b of `hidden`
    /// ([B, T, n_embd]), in order: the LM head on the gathered rows only (the tuned baselines'
    /// head).
    pub fn read_log_probs(&self, hidden: &Tensor, reads: &[&[(usize, u32)]]) -> Result<Vec<f32>> {
        let (b, t, d) = hidden.dims3()?;
        let (rows, tokens): (Vec<u32>, Vec<u32>) = reads
            .iter()
            .enumerate()
            .flat_map(|(bi, r)| {
                r.iter()
                    .map(move |&(row, token)| ((bi * t + row) as u32, token))
            })
            .unzip();
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let gathered = hidden
            .reshape((b * t, d))? // [B * T, d]
            .index_select(&Tensor::from_vec(rows, n, &self.device)?, 0)?; // [N, d]
        let logits = self.logits(&gathered)?; // [N, vocab]
        candle_nn::ops::log_softmax(&logits, D::Minus1)? // [N, vocab]
            .gather(&Tensor::from_vec(tokens, (n, 1), &self.device)?, 1)? // [N, 1]
            .flatten_all()?
            .to_vec1::<f32>()
    }

    /// LM-head logits of hidden states: [.., n_embd] -> [.., vocab_size].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(hidden)
    }

    /// Causal self-attention of GPT-J (no biases) followed by out_proj: [B, T, d] -> [B, T, d],
    /// after `past`'s keys and values ([1, H, P, hd], shared by every row) when given. Also
    /// returns this layer's keys and values of past ++ h (for one row: a kept cache's).
    fn attention(
        &self,
        h: &Tensor,
        block: &Block,
        mask: &Tensor,
        past: Option<&(Tensor, Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (b, t, d) = h.dims3()?;
        let (n_head, head_dim) = (self.config.n_head, self.config.head_dim());
        let offset = past.map_or(Ok(0), |(k, _)| k.dim(2))?;
        let heads = |x: Tensor| -> Result<Tensor> {
            x.reshape((b, t, n_head, head_dim))?
                .transpose(1, 2)? // [B, H, T, hd]
                .contiguous()
        };
        let q = self.rotary(&heads(block.q_proj.forward(h)?)?, offset)?; // [B, H, T, hd]
        let mut k = self.rotary(&heads(block.k_proj.forward(h)?)?, offset)?; // [B, H, T, hd]
        let mut v = heads(block.v_proj.forward(h)?)?; // [B, H, T, hd]
        if let Some((past_k, past_v)) = past {
            let shape = (b, n_head, offset, head_dim);
            // [B, H, P + T, hd] each (candle's cat on an inner dim leaves a strided layout its
            // matmul refuses, hence contiguous).
            k = Tensor::cat(&[&past_k.broadcast_as(shape)?, &k], 2)?.contiguous()?;
            v = Tensor::cat(&[&past_v.broadcast_as(shape)?, &v], 2)?.contiguous()?;
        }
        let scale = 1.0 / (head_dim as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?; // [B, H, T, P + T]
        let scores = masked_fill(
            &scores,
            &mask.broadcast_as(scores.shape())?,
            f32::NEG_INFINITY,
        )?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?; // [B, H, T, P + T]
        let ctx = probs
            .matmul(&v)? // [B, H, T, hd]
            .transpose(1, 2)? // [B, T, H, hd]
            .reshape((b, t, d))?; // [B, T, d]
        Ok((block.out_proj.forward(&ctx)?, (k, v)))
    }

    /// GPT-J's interleaved ("rotate every two") rotary embedding on the first rotary_dim dims of
    /// each head, positions offset..offset + T: [B, H, T, hd] -> [B, H, T, hd]. candle_nn's
    /// `rope_i` is exactly this rotation of the pairs (x[2i], x[2i+1]); the remaining dims pass
    /// through.
    fn rotary(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (_b, _h, t, head_dim) = x.dims4()?;
        let rot = self.config.rotary_dim();
        if rot == 0 {
            return Ok(x.clone());
        }
        let cos = self.cos.narrow(0, offset, t)?; // [T, rot / 2]
        let sin = self.sin.narrow(0, offset, t)?; // [T, rot / 2]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DType;

    /// Every linear weight is held as the [out, in] view of an [in, out] buffer, so that the
    /// forward's `weight.t()` is contiguous (the layout that made the tuned baseline 1.13x
    /// faster; docs/benchmarks.md): the baselines must not be handicapped.
    #[test]
    fn linear_weights_are_stored_in_out() {
        let config = GptjConfig::small(1, 16, 2, 4, 40);
        let weights = GptjWeights::random(&config, 1, DType::F32);
        let model = CandleGptj::new(&config, &weights).unwrap();
        let b = &model.blocks[0];
        for (name, l) in [
            ("q_proj", &b.q_proj),
            ("k_proj", &b.k_proj),
            ("v_proj", &b.v_proj),
            ("out_proj", &b.out_proj),
            ("fc_in", &b.fc_in),
            ("fc_out", &b.fc_out),
            ("lm_head", &model.lm_head),
        ] {
            let w = l.weight();
            assert!(!w.is_contiguous(), "{name}");
            assert!(w.t().unwrap().is_contiguous(), "{name}");
        }
    }
}
