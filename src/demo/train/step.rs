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
