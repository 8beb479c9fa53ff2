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

fn ln(l: &LayerNormWeights) -> CpuLayerNorm {
    CpuLayerNorm {
        weight: l.weight.to_f32(),
        bias: l.bias.to_f32(),
    }
}

impl CpuWeights {
    pub fn new(config: &GptjConfig, w: &GptjWeights) -> Self {
        let h =
            w.h.iter()
                .map(|b| {
                    let mut qkv = b.attn.q_proj.weight.to_f32();
                    qkv.extend(b.attn.k_proj.weight.to_f32());
                    qkv.extend(b.attn.v_proj.weight.to_f32());
                    CpuBlock {
                        ln_1: ln(&b.ln_1),
                        qkv,
                        out_proj: b.attn.out_proj.weight.to_f32(),
                        fc_in: b.mlp.fc_in.weight.to_f32(),
                        fc_in_b: b
                            .mlp
                            .fc_in
                            .bias
                            .as_ref()
                            .expect("fc_in has a bias")
                            .to_f32(),
                        fc_out: b.mlp.fc_out.weight.to_f32(),
                        fc_out_b: b
                            .mlp
                            .fc_out
                            .bias
                            .as_ref()
                            .expect("fc_out has a bias")
                            .to_f32(),
                    }
                })
                .collect();
        let lm_head_b = match &w.lm_head.bias {
            Some(b) => b.to_f32(),
            None => vec![0.0; config.vocab_size],
        };
        CpuWeights {
            wte: w.wte.to_f32(),
            h,
            ln_f: ln(&w.ln_f),
            lm_head: w.lm_head.weight.to_f32(),
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
