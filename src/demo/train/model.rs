//! GPT-J as candle `Var`s: initialisation, the training forward (with the fused ops), the
//! loss, and conversion to and from the checkpoint tensors.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{anyhow, ensure, Result};
use candle_core::{Device, Tensor, Var, D};

use super::{fused, Batch};
use crate::model::rotary::RotaryTable;
use crate::model::weights::expected_tensors;
use crate::model::{GptjConfig, Tensor as CheckpointTensor};
use crate::util::rng::Rng;

struct Block {
    ln_1_w: Var,
    ln_1_b: Var,
    q: Var,
    k: Var,
    v: Var,
    out: Var,
    fc_in_w: Var,
    fc_in_b: Var,
    fc_out_w: Var,
    fc_out_b: Var,
}

/// GPT-J's parameters as candle `Var`s, with the forward pass used for training.
pub struct TrainModel {
    config: GptjConfig,
    /// Every parameter under its HF name, in `expected_tensors` order.
    named: Vec<(String, Var)>,
    wte: Var,
    blocks: Vec<Block>,
    ln_f_w: Var,
    ln_f_b: Var,
    lm_head_w: Var,
    lm_head_b: Var,
    /// Rotary tables for positions 0..n_positions, built in f64 and rounded once.
    rotary: fused::Rotary,
}

/// Log-softmax over the last dim from primitives.
pub(super) fn log_softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let z = x.broadcast_sub(&max)?;
    let lse = z.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(z.broadcast_sub(&lse)?)
}

/// x W^T (+ b) with W in PyTorch's [out, in] layout: [N, in] -> [N, out].
fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.matmul(&w.t()?)?;
    Ok(match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

impl TrainModel {
    /// Weights drawn from `seed` with toolsift's SplitMix64, tensor by tensor in HF order:
    /// normal(0, 0.02) for embeddings and matrices, out_proj and fc_out scaled by
    /// 1/sqrt(2 n_layer) (GPT-2's residual scaling), LayerNorm weights 1, biases 0.
    pub fn init(config: &GptjConfig, seed: u64) -> Result<Self> {
        let mut rng = Rng::new(seed);
        let resid_std = 0.02 / (2.0 * config.n_layer as f64).sqrt();
        let mut values = Vec::new();
        for (name, shape) in expected_tensors(config) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.ends_with("ln_1.weight") || name.ends_with("ln_f.weight") {
                vec![1.0; n]
            } else if name.ends_with(".bias") {
                vec![0.0; n]
            } else {
                let std = if name.ends_with("out_proj.weight") || name.ends_with("fc_out.weight") {
                    resid_std
                } else {
                    0.02
                };
                (0..n).map(|_| (rng.normal() as f64 * std) as f32).collect()
            };
            values.push((name, shape, data));
        }
        Self::from_values(config, values)
    }

    /// A model from the weights of a loaded checkpoint (any storage dtype, converted to f32).
    pub fn from_weights(config: &GptjConfig, weights: &crate::model::GptjWeights) -> Result<Self> {
        let values = weights
            .named_tensors(config)
            .into_iter()
            .map(|(name, t)| (name, t.shape().to_vec(), t.to_f32()))
            .collect();
        Self::from_values(config, values)
    }

    fn from_values(
        config: &GptjConfig,
        values: Vec<(String, Vec<usize>, Vec<f32>)>,
    ) -> Result<Self> {
        config.validate().map_err(|e| anyhow!("config: {e}"))?;
        let device = Device::Cpu;
        let mut named = Vec::with_capacity(values.len());
        for (name, shape, data) in values {
            let var = Var::from_tensor(&Tensor::from_vec(data, shape, &device)?)?;
            named.push((name, var));
        }
        let by_name: HashMap<&str, &Var> = named.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let get = |name: &str| -> Result<Var> {
            by_name
                .get(name)
                .map(|v| (*v).clone())
                .ok_or_else(|| anyhow!("no tensor {name}"))
        };
        let blocks = (0..config.n_layer)
            .map(|i| {
                let p = format!("transformer.h.{i}");
                Ok(Block {
                    ln_1_w: get(&format!("{p}.ln_1.weight"))?,
                    ln_1_b: get(&format!("{p}.ln_1.bias"))?,
                    q: get(&format!("{p}.attn.q_proj.weight"))?,
                    k: get(&format!("{p}.attn.k_proj.weight"))?,
                    v: get(&format!("{p}.attn.v_proj.weight"))?,
                    out: get(&format!("{p}.attn.out_proj.weight"))?,
                    fc_in_w: get(&format!("{p}.mlp.fc_in.weight"))?,
                    fc_in_b: get(&format!("{p}.mlp.fc_in.bias"))?,
                    fc_out_w: get(&format!("{p}.mlp.fc_out.weight"))?,
                    fc_out_b: get(&format!("{p}.mlp.fc_out.bias"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // The engine's own table, so training and inference rotate by the same f32 values.
        let table = RotaryTable::new(config.n_positions, config.rotary_dim());
        Ok(TrainModel {
            config: config.clone(),
            wte: get("transformer.wte.weight")?,
            ln_f_w: get("transformer.ln_f.weight")?,
            ln_f_b: get("transformer.ln_f.bias")?,
            lm_head_w: get("lm_head.weight")?,
            lm_head_b: get("lm_head.bias")?,
            blocks,
            named,
            rotary: fused::Rotary {
                cos: Arc::new(table.cos),
                sin: Arc::new(table.sin),
                half: table.half,
                inverse: false,
            },
        })
    }

    /// The model's config (validated when the model was built).
    pub fn config(&self) -> &GptjConfig {
        &self.config
    }

    /// Every parameter under its HF name.
    pub fn named_vars(&self) -> &[(String, Var)] {
        &self.named
    }

    /// The weights as checkpoint tensors (f32) under their HF names.
    pub fn named_tensors(&self) -> Result<Vec<(String, CheckpointTensor)>> {
        self.named
            .iter()
            .map(|(name, var)| {
                let t = var.as_tensor();
                let values = t.flatten_all()?.to_vec1::<f32>()?;
                Ok((
                    name.clone(),
                    CheckpointTensor::from_f32(t.dims().to_vec(), &values),
                ))
            })
            .collect()
    }

    /// Final hidden states (after ln_f) of right-padded ids [B, T] (u32): [B * T, n_embd]. Every
    /// row starts at position 0 and only the causal mask applies, so padding after a sequence
    /// cannot affect it.
    pub fn hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        ensure!(
            t <= self.config.n_positions,
            "{t} tokens, n_positions is {}",
            self.config.n_positions
        );
        let mut x = self.wte.index_select(&ids.flatten_all()?, 0)?; // [N, d]
        for blk in &self.blocks {
            let h = self.layer_norm(&x, &blk.ln_1_w, &blk.ln_1_b)?; // [N, d]
            let attn = self.attention(&h, blk, b, t)?; // [N, d]
            let inner = linear(&h, &blk.fc_in_w, None)?.apply_op2(&blk.fc_in_b, fused::BiasGelu)?;
            let mlp = linear(&inner, &blk.fc_out_w, Some(&blk.fc_out_b))?; // [N, d]
            x = ((x + attn)? + mlp)?; // parallel residual
        }
        self.layer_norm(&x, &self.ln_f_w, &self.ln_f_b)
    }

    fn layer_norm(&self, x: &Tensor, w: &Var, b: &Var) -> Result<Tensor> {
        let eps = self.config.layer_norm_epsilon;
        Ok(x.apply_op3(w.as_tensor(), b.as_tensor(), fused::LayerNorm { eps })?)
    }

    /// LM-head logits of hidden rows: [M, n_embd] -> [M, vocab_size].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        linear(hidden, &self.lm_head_w, Some(&self.lm_head_b))
    }

    /// Causal self-attention (no biases) and out_proj: [B * T, d] -> [B * T, d].
    fn attention(&self, h: &Tensor, blk: &Block, b: usize, t: usize) -> Result<Tensor> {
        let c = &self.config;
        let (n_head, head_dim, d) = (c.n_head, c.head_dim(), c.n_embd);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let split = |x: Tensor| x.reshape((b, t, n_head, head_dim)); // [B, T, H, hd]
        let q = self.rotary(&split(linear(h, &blk.q, None)?)?)?;
        let q = (q.transpose(1, 2)? * scale)?; // [B, H, T, hd], contiguous
        let k = self.rotary(&split(linear(h, &blk.k, None)?)?)?;
        let k = k.transpose(1, 2)?.contiguous()?; // [B, H, T, hd]
        let v = split(linear(h, &blk.v, None)?)?
            .transpose(1, 2)?
            .contiguous()?; // [B, H, T, hd]
        let scores = q.matmul(&k.t()?)?; // [B, H, T, T]
        let probs = scores.apply_op1(fused::CausalSoftmax)?; // zeros above the diagonal
        let ctx = probs
            .matmul(&v)? // [B, H, T, hd]
            .transpose(1, 2)? // [B, T, H, hd]
            .reshape((b * t, d))?;
        linear(&ctx, &blk.out, None)
    }

    /// "Rotate every two" on the first rotary_dim dims of each head, positions 0..T:
    /// [B, T, H, hd] -> [B, T, H, hd].
    fn rotary(&self, x: &Tensor) -> Result<Tensor> {
        if self.rotary.half == 0 {
            return Ok(x.clone());
        }
        Ok(x.contiguous()?.apply_op1(self.rotary.clone())?)
    }

    /// Mean cross-entropy of a batch: the hidden state of each (row, position) in `rows` (flat
    /// indices into [B * T]) predicts the matching `targets` id.
    pub fn loss(&self, batch: &Batch) -> Result<Tensor> {
        let hidden = self.hidden(&batch.ids)?; // [B * T, d]
        let picked = hidden.index_select(&batch.rows, 0)?; // [M, d]
        let logits = self.logits(&picked)?; // [M, V]
        let per_row = logits.apply_op2(&batch.targets, fused::CrossEntropy)?; // [M]
        Ok(per_row.mean_all()?)
    }

    /// log p(v | ids[0..=i]) for every position i and id v, one sequence: [n, vocab_size] as rows.
    pub fn log_softmax(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        let ids = Tensor::from_slice(ids, (1, ids.len()), &Device::Cpu)?;
        let lp = log_softmax_last_dim(&self.logits(&self.hidden(&ids)?)?)?;
        Ok(lp.to_vec2::<f32>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::train::TrainOptions;

    fn config(n_layer: usize) -> GptjConfig {
        TrainOptions {
            n_layer,
            n_embd: 32,
            n_head: 4,
            rotary_dim: 4,
            n_positions: 16,
            ..TrainOptions::default()
        }
        .gptj_config(40)
    }

    /// `model` written as a folder (config.json, model.safetensors) and checked against the f64
    /// reference on two sequences.
    fn checked(model: &TrainModel) -> crate::demo::train::ReferenceCheck {
        let dir = tempfile::tempdir().unwrap();
        let tensors = model.named_tensors().unwrap();
        crate::demo::train::tests::write_checked_folder(dir.path(), model.config(), 39, &tensors);
        let seqs = vec![vec![1, 5, 9, 2, 33, 7], vec![3, 38, 0, 12]];
        crate::demo::train::check_against_reference(dir.path(), model, &seqs).unwrap()
    }

    /// Initial weights leave biases at 0 and LayerNorm weights at 1, which hides a forward that
    /// drops a bias or takes another epsilon; with every parameter drawn at random and an
    /// epsilon of 0.01 (a folder `check_folder` may be given), candle's forward is still the
    /// reference's.
    #[test]
    fn a_model_with_every_parameter_random_matches_the_reference() {
        let mut config = config(2);
        config.layer_norm_epsilon = 0.01;
        let model = TrainModel::init(&config, 4).unwrap();
        let mut rng = Rng::new(8);
        for (_, var) in model.named_vars() {
            let v: Vec<f32> = (0..var.elem_count()).map(|_| rng.normal() * 0.3).collect();
            var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap())
                .unwrap();
        }
        let check = checked(&model);
        assert!(check.max_abs_diff < 1e-4, "{check:?}");
    }

    /// GPT-J may rotate whole heads (rotary_dim = head_dim: every pair of each head); such a
    /// model runs and matches the reference.
    #[test]
    fn a_model_rotating_whole_heads_matches_the_reference() {
        let mut config = config(1);
        config.rotary_dim = Some(config.head_dim());
        let model = TrainModel::init(&config, 6).unwrap();
        let check = checked(&model);
        assert!(check.max_abs_diff < 1e-5, "{check:?}");
    }

    /// A sequence longer than n_positions is refused naming the limit (not by whatever check the
    /// rotary tables make); one of exactly n_positions runs.
    #[test]
    fn a_sequence_longer_than_n_positions_is_refused_naming_it() {
        let model = TrainModel::init(&config(1), 5).unwrap();
        let ids: Vec<u32> = (0..17).map(|i| (i * 7) % 40).collect();
        let err = model.log_softmax(&ids).unwrap_err().to_string();
        assert!(err.contains("17 tokens, n_positions is 16"), "{err}");
        assert_eq!(model.log_softmax(&ids[..16]).unwrap().len(), 16);
    }

    /// A config `validate` refuses (n_embd not a multiple of n_head) is refused by init.
    #[test]
    fn init_refuses_a_config_that_does_not_validate() {
        let mut c = config(1);
        c.n_embd = 30;
        match TrainModel::init(&c, 1) {
            Ok(_) => panic!("n_embd 30 over 4 heads was taken"),
            Err(e) => assert!(e.to_string().starts_with("config:"), "{e}"),
        }
    }

    /// A padded batch's loss is the mean, over the real positions of its rows, of -log p of the
    /// next token, as `log_softmax` gives it for each sequence alone (padding is not a target).
    #[test]
    fn the_loss_is_the_mean_next_token_cross_entropy_of_real_positions() {
        let model = TrainModel::init(&config(1), 5).unwrap();
        let seqs = vec![vec![1, 5, 9, 2], vec![3, 7], vec![4, 4, 8]];
        let batch = Batch::new(&seqs, &[0, 1, 2], 39).unwrap();
        let loss = model.loss(&batch).unwrap().to_scalar::<f32>().unwrap() as f64;
        let mut sum = 0f64;
        for s in &seqs {
            let lp = model.log_softmax(s).unwrap();
            for i in 0..s.len() - 1 {
                sum -= lp[i][s[i + 1] as usize] as f64;
            }
        }
        let want = sum / 6.0;
        assert!((loss - want).abs() < 1e-5, "{loss} vs {want}");
    }

    /// Initial weights: std 0.02, out_proj and fc_out 0.02 / sqrt(2 n_layer), LayerNorm
    /// weights 1, biases 0 (sample std of a seeded draw, within 10%).
    #[test]
    fn init_scales_the_residual_projections_by_one_over_sqrt_2_n_layer() {
        let model = TrainModel::init(&config(2), 1).unwrap();
        for (name, var) in model.named_vars() {
            let v: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            if name.ends_with("ln_1.weight") || name.ends_with("ln_f.weight") {
                assert!(v.iter().all(|&x| x == 1.0), "{name}");
                continue;
            }
            if name.ends_with(".bias") {
                assert!(v.iter().all(|&x| x == 0.0), "{name}");
                continue;
            }
            let want = if name.ends_with("out_proj.weight") || name.ends_with("fc_out.weight") {
                0.01
            } else {
                0.02
            };
            let std = (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
            assert!(
                (std / want - 1.0).abs() < 0.1,
                "{name}: std {std}, want {want}"
            );
        }
    }
}
