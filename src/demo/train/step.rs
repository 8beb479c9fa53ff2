//! One training step: AdamW (decay on matrices and embeddings only), gradient clipping, and
//! the time of each phase.

use std::time::Instant;

use anyhow::{ensure, Result};
use candle_core::backprop::GradStore;
use candle_core::Var;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use serde::Serialize;

use super::{Batch, TrainModel, TrainOptions};

/// The optimizer: AdamW with weight decay on matrices and embeddings, one without on biases and
/// LayerNorms, both on the same schedule.
pub struct Optim {
    decay: AdamW,
    no_decay: AdamW,
    vars: Vec<Var>,
    clip: f64,
}

impl Optim {
    /// Both AdamW optimizers over `model`'s parameters, with `o`'s lr, betas, eps and
    /// `grad_clip`: `o.weight_decay` on the parameters of rank 2 and up (embedding, matrices),
    /// none on the rest (biases, LayerNorms). Fails if candle cannot build an optimizer.
    pub fn new(model: &TrainModel, o: &TrainOptions) -> Result<Self> {
        let params = |weight_decay| ParamsAdamW {
            lr: o.lr,
            beta1: o.beta1,
            beta2: o.beta2,
            eps: o.adam_eps,
            weight_decay,
        };
        let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
        for (_, var) in model.named_vars() {
            if var.rank() >= 2 {
                decay.push(var.clone());
            } else {
                no_decay.push(var.clone());
            }
        }
        Ok(Optim {
            decay: AdamW::new(decay, params(o.weight_decay))?,
            no_decay: AdamW::new(no_decay, params(0.0))?,
            vars: model.named_vars().iter().map(|(_, v)| v.clone()).collect(),
            clip: o.grad_clip,
        })
    }

    /// Clips the global gradient norm, then steps both optimizers at `lr`. Returns the norm
    /// before clipping.
    pub fn step(&mut self, grads: &mut GradStore, lr: f64) -> Result<f64> {
        let mut sq = 0f64;
        for var in &self.vars {
            if let Some(g) = grads.get(var) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        let norm = sq.sqrt();
        if self.clip > 0.0 && norm > self.clip {
            let s = self.clip / norm;
            for var in &self.vars {
                if let Some(g) = grads.remove(var) {
                    grads.insert(var, (g * s)?);
                }
            }
        }
        self.decay.set_learning_rate(lr);
        self.no_decay.set_learning_rate(lr);
        self.decay.step(grads)?;
        self.no_decay.step(grads)?;
        Ok(norm)
    }
}

/// Seconds spent in each phase of a step.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PhaseTimes {
    /// Building the batch's tensors (set by the caller; `train_step` leaves it 0).
    pub batch: f64,
    /// The forward pass and the loss, read back as a number.
    pub forward: f64,
    /// candle's backward pass.
    pub backward: f64,
    /// The global gradient norm, clipping and both AdamW updates.
    pub optimizer: f64,
}

impl PhaseTimes {
    /// Seconds of the four phases together.
    pub fn total(&self) -> f64 {
        self.batch + self.forward + self.backward + self.optimizer
    }

    pub(super) fn add(&mut self, o: &PhaseTimes) {
        self.batch += o.batch;
        self.forward += o.forward;
        self.backward += o.backward;
        self.optimizer += o.optimizer;
    }

    pub(super) fn scaled(&self, s: f64) -> PhaseTimes {
        PhaseTimes {
            batch: self.batch * s,
            forward: self.forward * s,
            backward: self.backward * s,
            optimizer: self.optimizer * s,
        }
    }
}

/// One optimizer step on `batch`: (loss, gradient norm, phase times).
pub fn train_step(
    model: &TrainModel,
    optim: &mut Optim,
    batch: &Batch,
    lr: f64,
) -> Result<(f32, f64, PhaseTimes)> {
    let mut times = PhaseTimes::default();
    let t0 = Instant::now();
    let loss = model.loss(batch)?;
    let loss_value = loss.to_scalar::<f32>()?;
    ensure!(loss_value.is_finite(), "loss is {loss_value}");
    let t1 = Instant::now();
    let mut grads = loss.backward()?;
    let t2 = Instant::now();
    let norm = optim.step(&mut grads, lr)?;
    let t3 = Instant::now();
    times.forward = (t1 - t0).as_secs_f64();
    times.backward = (t2 - t1).as_secs_f64();
    times.optimizer = (t3 - t2).as_secs_f64();
    Ok((loss_value, norm, times))
}

#[cfg(test)]
mod tests {
    use candle_core::{Tensor, Var};

    use super::*;
    use crate::demo::train::Batch;

    fn tiny(o: &TrainOptions) -> TrainModel {
        let o = TrainOptions {
            n_layer: 1,
            n_embd: 8,
            n_head: 2,
            rotary_dim: 2,
            n_positions: 8,
            ..o.clone()
        };
        TrainModel::init(&o.gptj_config(16), 3).unwrap()
    }

    /// Gradients of `k * sum(every parameter)`: k in every entry (k != 0).
    fn constant_grads(model: &TrainModel, k: f64) -> GradStore {
        let mut loss = Tensor::new(0f32, &candle_core::Device::Cpu).unwrap();
        for (_, v) in model.named_vars() {
            loss = (loss + v.as_tensor().sum_all().unwrap()).unwrap();
        }
        (loss * k).unwrap().backward().unwrap()
    }

    fn values(model: &TrainModel) -> Vec<(String, usize, Vec<f32>)> {
        model
            .named_vars()
            .iter()
            .map(|(n, v)| {
                let t = v.as_tensor();
                (
                    n.clone(),
                    t.rank(),
                    t.flatten_all().unwrap().to_vec1().unwrap(),
                )
            })
            .collect()
    }

    fn global_norm(model: &TrainModel, grads: &GradStore) -> f64 {
        let sq: f64 = model
            .named_vars()
            .iter()
            .filter_map(|(_, v)| grads.get(v))
            .map(|g| {
                g.sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap() as f64
            })
            .sum();
        sq.sqrt()
    }

    /// The global norm is returned before clipping; above `grad_clip` the gradients are scaled
    /// down to it, below it they are left alone, and `grad_clip` 0 clips nothing.
    #[test]
    fn gradients_are_clipped_to_the_global_norm_only_above_it() {
        for (clip, clipped) in [(0.5, Some(0.5)), (1e9, None), (0.0, None)] {
            let o = TrainOptions {
                grad_clip: clip,
                ..TrainOptions::default()
            };
            let model = tiny(&o);
            let mut optim = Optim::new(&model, &o).unwrap();
            let mut grads = constant_grads(&model, 0.25);
            let n = model.config().n_params() as f64;
            let before = global_norm(&model, &grads);
            assert!((before - 0.25 * n.sqrt()).abs() < 1e-3 * before);
            let norm = optim.step(&mut grads, 0.0).unwrap();
            assert!((norm - before).abs() < 1e-9 * before, "{norm} {before}");
            let after = global_norm(&model, &grads);
            let want = clipped.unwrap_or(before);
            assert!(
                (after - want).abs() < 1e-4 * want,
                "clip {clip}: {after}, want {want}"
            );
        }
    }

    /// Weight decay (decoupled: theta * (1 - lr * wd)) applies to the embedding and matrices
    /// only: with zero gradients a step scales them and leaves LayerNorm weights at 1. A step at
    /// lr 0 changes nothing, though the optimizers were built with `o.lr`.
    #[test]
    fn weight_decay_scales_matrices_only_and_lr_zero_changes_nothing() {
        let o = TrainOptions {
            weight_decay: 0.1,
            grad_clip: 0.0,
            ..TrainOptions::default()
        };
        let model = tiny(&o);
        let mut optim = Optim::new(&model, &o).unwrap();
        let start = values(&model);
        optim.step(&mut constant_grads(&model, 1.0), 0.0).unwrap();
        assert!(values(&model) == start, "a step at lr 0 moved a parameter");
        let mut optim = Optim::new(&model, &o).unwrap(); // zero moments
        let mut zeros = constant_grads(&model, 1.0);
        for (_, v) in model.named_vars() {
            zeros.insert(v, v.as_tensor().zeros_like().unwrap());
        }
        optim.step(&mut zeros, 0.5).unwrap();
        for ((name, rank, a), (_, _, b)) in start.iter().zip(values(&model)) {
            let k = if *rank >= 2 { 0.95 } else { 1.0 };
            for (a, b) in a.iter().zip(&b) {
                assert!((a * k - b).abs() <= 1e-6 * a.abs(), "{name}: {a} -> {b}");
            }
        }
        assert!(start
            .iter()
            .any(|(n, _, v)| n.ends_with("ln_1.weight") && v[0] == 1.0));
    }

    /// AdamW's moments use beta1 for the gradient and beta2 for its square: two steps with
    /// gradients 1 then 2 on a bias (no decay) move it by the bias-corrected update of each.
    #[test]
    fn adamw_moments_use_beta1_and_beta2() {
        let o = TrainOptions {
            grad_clip: 0.0,
            ..TrainOptions::default()
        };
        let model = tiny(&o);
        let mut optim = Optim::new(&model, &o).unwrap();
        optim.step(&mut constant_grads(&model, 1.0), 0.1).unwrap();
        optim.step(&mut constant_grads(&model, 2.0), 0.1).unwrap();
        let (b1, b2, eps) = (o.beta1, o.beta2, o.adam_eps);
        let (m, v) = ((1.0 - b1) * (b1 + 2.0), (1.0 - b2) * (b2 + 4.0));
        let (m_hat, v_hat) = (m / (1.0 - b1 * b1), v / (1.0 - b2 * b2));
        let want = -0.1 / (1.0 + eps) - 0.1 * m_hat / (v_hat.sqrt() + eps);
        let bias = &values(&model)
            .into_iter()
            .find(|(n, ..)| n == "lm_head.bias")
            .unwrap()
            .2;
        assert!(
            bias.iter().all(|&x| (x as f64 - want).abs() < 1e-6),
            "{bias:?} {want}"
        );
    }

    /// A step whose loss is not finite fails before the optimizer moves anything.
    #[test]
    fn a_non_finite_loss_fails_the_step_and_updates_nothing() {
        let o = TrainOptions::default();
        let model = tiny(&o);
        let mut optim = Optim::new(&model, &o).unwrap();
        let (_, bias) = model
            .named_vars()
            .iter()
            .find(|(n, _)| n == "lm_head.bias")
            .unwrap();
        let nan = Tensor::full(f32::NAN, bias.dims(), &candle_core::Device::Cpu).unwrap();
        Var::set(bias, &nan).unwrap();
        let start = values(&model);
        let batch = Batch::new(&[vec![1, 2, 3]], &[0], 0).unwrap();
        let err = train_step(&model, &mut optim, &batch, 0.1).unwrap_err();
        assert!(err.to_string().contains("loss is NaN"), "{err}");
        let same = values(&model).iter().zip(&start).all(|(a, b)| {
            a.2.iter()
                .zip(&b.2)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        });
        assert!(same);
    }

    /// `add`, `scaled` and `total` take all four phases (the progress lines and `profile` show
    /// them each).
    #[test]
    fn phase_times_add_scale_and_total_every_phase() {
        let mut sum = PhaseTimes {
            batch: 1.0,
            forward: 2.0,
            backward: 4.0,
            optimizer: 8.0,
        };
        sum.add(&PhaseTimes {
            batch: 16.0,
            forward: 32.0,
            backward: 64.0,
            optimizer: 128.0,
        });
        let s = sum.scaled(0.5);
        assert_eq!(
            (s.batch, s.forward, s.backward, s.optimizer),
            (8.5, 17.0, 34.0, 68.0)
        );
        assert_eq!(s.total(), 127.5);
    }
}
