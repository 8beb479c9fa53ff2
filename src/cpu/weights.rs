//! GPT-J's weights widened to f32 once and laid out for the CPU engine: q, k and v projections
//! stacked into one [3 * n_embd, n_embd] matrix so a layer starts with a single GEMM.

use crate::model::weights::{GptjWeights, LayerNormWeights};
use crate::model::GptjConfig;

pub struct CpuLayerNorm {
    pub weight: Vec<f32>, // [n_embd]
    pub bias: Vec<f32>,   // [n_embd]
}

pub struct CpuBlock {
    pub ln_1: CpuLayerNorm,
    pub qkv: Vec<f32>, // [3 * n_embd, n_embd]: rows of q_proj, then k_proj, then v_proj
    pub out_proj: Vec<f32>, // [n_embd, n_embd]
    pub fc_in: Vec<f32>, // [n_inner, n_embd]
    pub fc_in_b: Vec<f32>, // [n_inner]
    pub fc_out: Vec<f32>, // [n_embd, n_inner]
    pub fc_out_b: Vec<f32>, // [n_embd]
}

pub struct CpuWeights {
    pub wte: Vec<f32>, // [vocab_size, n_embd]
    pub h: Vec<CpuBlock>,
    pub ln_f: CpuLayerNorm,
    pub lm_head: Vec<f32>,   // [vocab_size, n_embd]
    pub lm_head_b: Vec<f32>, // [vocab_size]
}

/// Consumes a tensor: its storage is freed on return unless shared.
fn f32_of(t: crate::model::Tensor) -> Vec<f32> {
    t.to_f32()
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
                let mut qkv = f32_of(b.attn.q_proj.weight);
                qkv.extend(f32_of(b.attn.k_proj.weight));
                qkv.extend(f32_of(b.attn.v_proj.weight));
                CpuBlock {
                    ln_1: ln(&b.ln_1),
                    qkv,
                    out_proj: f32_of(b.attn.out_proj.weight),
                    fc_in: f32_of(b.mlp.fc_in.weight),
                    fc_in_b: b.mlp.fc_in.bias.map(f32_of).expect("fc_in has a bias"),
                    fc_out: f32_of(b.mlp.fc_out.weight),
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
            lm_head: f32_of(lm_head.weight),
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
