//! The oracle: GPT-J exactly as Hugging Face transformers computes it, in plain f64 loops.
//!
//! No SIMD, no blocking, no threads, one function per layer. Every faster path in this crate is
//! proven equal to this module, never the other way round. It converts the weights to f64 once, so
//! it is meant for the small models tests use, not for GPT-J-6B.
//!
//! Against the float64 golden fixtures it agrees to ~1e-12: the rotary table, the attention
//! scores and the softmax are all f64 (stock transformers builds the rotary table in f32).

use crate::model::weights::{GptjWeights, LayerNormWeights, Linear};
use crate::model::GptjConfig;

/// A dense row-major matrix of f64.
#[derive(Debug, Clone)]
pub struct Mat {
    /// Number of rows (tokens, for activations).
    pub rows: usize,
    /// Number of columns: the length of each row.
    pub cols: usize,
    /// The elements, row after row: (r, c) at `r * cols + c`; `rows * cols` of them.
    pub data: Vec<f64>,
}

impl Mat {
    /// A `rows` x `cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Mat {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// Row `r` (0-based), `cols` values; panics past the last row.
    pub fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Row `r`, writable.
    pub fn row_mut(&mut self, r: usize) -> &mut [f64] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }
}

struct RefLinear {
    weight: Mat, // [out, in]
    bias: Option<Vec<f64>>,
}

struct RefLayerNorm {
    weight: Vec<f64>,
    bias: Vec<f64>,
}

struct RefBlock {
    ln_1: RefLayerNorm,
    q_proj: RefLinear,
    k_proj: RefLinear,
    v_proj: RefLinear,
    out_proj: RefLinear,
    fc_in: RefLinear,
    fc_out: RefLinear,
}

/// GPT-J with f64 copies of its weights.
pub struct ReferenceModel {
    config: GptjConfig,
    wte: Mat, // [vocab_size, n_embd]
    h: Vec<RefBlock>,
    ln_f: RefLayerNorm,
    lm_head: RefLinear, // [vocab_size, n_embd] + [vocab_size]
}

fn to_linear(l: &Linear) -> RefLinear {
    let shape = l.weight.shape();
    RefLinear {
        weight: Mat {
            rows: shape[0],
            cols: shape[1],
            data: l.weight.to_f64(),
        },
        bias: l.bias.as_ref().map(|b| b.to_f64()),
    }
}

fn to_layer_norm(l: &LayerNormWeights) -> RefLayerNorm {
    RefLayerNorm {
        weight: l.weight.to_f64(),
        bias: l.bias.to_f64(),
    }
}

// By hand: the weights are gigabytes of f64.
impl std::fmt::Debug for ReferenceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceModel")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ReferenceModel {
    /// The weights widened to f64; `weights` must match `config` (a `Model`'s do).
    pub fn new(config: &GptjConfig, weights: &GptjWeights) -> Self {
        let h = weights
            .h
            .iter()
            .map(|b| RefBlock {
                ln_1: to_layer_norm(&b.ln_1),
                q_proj: to_linear(&b.attn.q_proj),
                k_proj: to_linear(&b.attn.k_proj),
                v_proj: to_linear(&b.attn.v_proj),
                out_proj: to_linear(&b.attn.out_proj),
                fc_in: to_linear(&b.mlp.fc_in),
                fc_out: to_linear(&b.mlp.fc_out),
            })
            .collect();
        ReferenceModel {
            config: config.clone(),
            wte: Mat {
                rows: config.vocab_size,
                cols: config.n_embd,
                data: weights.wte.to_f64(),
            },
            h,
            ln_f: to_layer_norm(&weights.ln_f),
            lm_head: to_linear(&weights.lm_head),
        }
    }

    /// The config the model was built with.
    pub fn config(&self) -> &GptjConfig {
        &self.config
    }

    /// The final hidden states (after ln_f) of `ids`, positions 0..n. The caller has checked that
    /// every id is < vocab_size and that n <= n_positions.
    pub fn hidden_states(&self, ids: &[u32]) -> Mat {
        let x = self.residual(ids, |_, _| {});
        layer_norm(&x, &self.ln_f, self.config.layer_norm_epsilon)
    }

    /// How much the LayerNorms can amplify a relative error in the residual stream's terms, per
    /// position of `ids` (same caller checks as `hidden_states`): the product, over the
    /// LayerNorms the position passes through (each layer's ln_1, then ln_f), of
    /// `max(1, |m| / sqrt(|x - mean(x)|^2 + n_embd * eps))`, where `x` is the residual at that
    /// norm's input and `m` the per-feature sum of the magnitudes of the terms added into it so
    /// far (the embedding, every earlier layer's attention and MLP outputs).
    ///
    /// Always >= 1 (each factor is; about 1 where the terms do not cancel). An engine that
    /// rounds each term to a storage type with unit roundoff u perturbs the residual by about
    /// u |m|, which the norm divides by the centred length it normalises: where random weights
    /// make the terms nearly cancel (more often at small widths), its error in the log-probs
    /// grows by this factor. The device tests scale their per-position budgets by it.
    pub fn layer_norm_gain(&self, ids: &[u32]) -> Vec<f64> {
        let eps = self.config.layer_norm_epsilon;
        let mut gain = vec![1.0; ids.len()];
        self.residual(ids, |x, magnitude| {
            for (r, g) in gain.iter_mut().enumerate() {
                let row = x.row(r);
                let mean = row.iter().sum::<f64>() / x.cols as f64;
                let centred = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>();
                let terms = magnitude.row(r).iter().map(|v| v * v).sum::<f64>();
                *g *= (terms / (centred + x.cols as f64 * eps)).sqrt().max(1.0);
            }
        });
        gain
    }

    /// The residual stream after every block, before ln_f: [n, n_embd]. Calls `at_norm(x,
    /// magnitude)` at each LayerNorm's input (each ln_1, then ln_f's), with `magnitude` the
    /// per-feature sum of |term| over the terms added into `x` so far.
    fn residual(&self, ids: &[u32], mut at_norm: impl FnMut(&Mat, &Mat)) -> Mat {
        let c = &self.config;
        let mut x = embed(&self.wte, ids); // [n, n_embd]
        let mut magnitude = x.clone();
        magnitude.data.iter_mut().for_each(|v| *v = v.abs());
        for block in &self.h {
            at_norm(&x, &magnitude);
            let h = layer_norm(&x, &block.ln_1, c.layer_norm_epsilon); // [n, n_embd]
            let attn = attention(&h, block, c); // [n, n_embd]
            let mlp = linear(&gelu_new(&linear(&h, &block.fc_in)), &block.fc_out); // [n, n_embd]
            for (((xi, mag), ai), mi) in x
                .data
                .iter_mut()
                .zip(&mut magnitude.data)
                .zip(&attn.data)
                .zip(&mlp.data)
            {
                *xi += ai + mi; // parallel residual: x + attn(ln_1 x) + mlp(ln_1 x)
                *mag += ai.abs() + mi.abs();
            }
        }
        at_norm(&x, &magnitude);
        x
    }

    /// log p(v | ids[0..=i]) for every position i and every v < vocab_size: [n, vocab_size].
    /// The caller has checked `ids` as for `hidden_states`.
    ///
    /// # Panics
    /// On an id past `vocab_size`. Past `n_positions` it computes what the rotary formula
    /// gives there, which no checkpoint was trained on.
    pub fn log_softmax(&self, ids: &[u32]) -> Mat {
        let hidden = self.hidden_states(ids);
        let mut logits = linear(&hidden, &self.lm_head); // [n, vocab_size]
        for r in 0..logits.rows {
            log_softmax_in_place(logits.row_mut(r));
        }
        logits
    }

    /// log p(target | ids[0..=row]) for each (row, target), computing the LM head only at those
    /// rows. The caller has checked `ids` as for `hidden_states`.
    ///
    /// # Panics
    /// On an id or a target past `vocab_size`, or a row past the end of `ids`.
    pub fn log_probs_at(&self, ids: &[u32], targets: &[(usize, u32)]) -> Vec<f64> {
        let hidden = self.hidden_states(ids);
        targets
            .iter()
            .map(|&(row, target)| {
                let mut logits = vec![0.0; self.config.vocab_size];
                for (v, l) in logits.iter_mut().enumerate() {
                    *l = dot(hidden.row(row), self.lm_head.weight.row(v))
                        + self.lm_head.bias.as_ref().map_or(0.0, |b| b[v]);
                }
                log_softmax_in_place(&mut logits);
                logits[target as usize]
            })
            .collect()
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Rows of `wte` for each id: [n, n_embd].
pub fn embed(wte: &Mat, ids: &[u32]) -> Mat {
    let mut out = Mat::zeros(ids.len(), wte.cols);
    for (i, &id) in ids.iter().enumerate() {
        out.row_mut(i).copy_from_slice(wte.row(id as usize));
    }
    out
}

/// LayerNorm over the last dim, biased variance, as torch.nn.LayerNorm.
fn layer_norm(x: &Mat, ln: &RefLayerNorm, eps: f64) -> Mat {
    let mut out = Mat::zeros(x.rows, x.cols);
    for r in 0..x.rows {
        let row = x.row(r);
        let mean = row.iter().sum::<f64>() / x.cols as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / x.cols as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for (c, o) in out.row_mut(r).iter_mut().enumerate() {
            *o = (row[c] - mean) * inv * ln.weight[c] + ln.bias[c];
        }
    }
    out
}

/// y = x W^T + b with W in PyTorch's [out, in] layout: [n, in] -> [n, out].
fn linear(x: &Mat, l: &RefLinear) -> Mat {
    let mut out = Mat::zeros(x.rows, l.weight.rows);
    for r in 0..x.rows {
        for o in 0..l.weight.rows {
            out.data[r * out.cols + o] =
                dot(x.row(r), l.weight.row(o)) + l.bias.as_ref().map_or(0.0, |b| b[o]);
        }
    }
    out
}

/// transformers' "gelu_new": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
fn gelu_new(x: &Mat) -> Mat {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let mut out = x.clone();
    for v in &mut out.data {
        *v = 0.5 * *v * (1.0 + (k * (*v + 0.044715 * *v * *v * *v)).tanh());
    }
    out
}

/// GPT-J's rotary embedding ("rotate every two") on the first `rotary_dim` dims of each head of
/// `x` ([n, n_head * head_dim]), at positions 0..n: the pair `(x[2i], x[2i+1])` is rotated by the
/// angle pos * 10000^(-2i / rotary_dim).
pub fn apply_rotary(x: &mut Mat, n_head: usize, head_dim: usize, rotary_dim: usize) {
    for pos in 0..x.rows {
        let row = x.row_mut(pos);
        for h in 0..n_head {
            let head = &mut row[h * head_dim..(h + 1) * head_dim];
            for i in 0..rotary_dim / 2 {
                let inv_freq = 1.0 / 10000f64.powf((2 * i) as f64 / rotary_dim as f64);
                let (sin, cos) = (pos as f64 * inv_freq).sin_cos();
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos - b * sin;
                head[2 * i + 1] = b * cos + a * sin;
            }
        }
    }
}

/// Causal multi-head self-attention of GPT-J (no biases), followed by out_proj: [n, n_embd].
fn attention(h: &Mat, block: &RefBlock, c: &GptjConfig) -> Mat {
    let (n, n_head, head_dim) = (h.rows, c.n_head, c.head_dim());
    let mut q = linear(h, &block.q_proj); // [n, n_embd]
    let mut k = linear(h, &block.k_proj); // [n, n_embd]
    let v = linear(h, &block.v_proj); // [n, n_embd]
    apply_rotary(&mut q, n_head, head_dim, c.rotary_dim());
    apply_rotary(&mut k, n_head, head_dim, c.rotary_dim());
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut ctx = Mat::zeros(n, c.n_embd); // [n, n_embd]
    for hd in 0..n_head {
        let cols = hd * head_dim..(hd + 1) * head_dim;
        for i in 0..n {
            // Scores against keys 0..=i (causal), softmax, weighted sum of values.
            let mut scores: Vec<f64> = (0..=i)
                .map(|j| dot(&q.row(i)[cols.clone()], &k.row(j)[cols.clone()]) * scale)
                .collect();
            softmax_in_place(&mut scores);
            let out = &mut ctx.row_mut(i)[cols.clone()];
            for (j, p) in scores.iter().enumerate() {
                for (o, vv) in out.iter_mut().zip(&v.row(j)[cols.clone()]) {
                    *o += p * vv;
                }
            }
        }
    }
    linear(&ctx, &block.out_proj)
}

fn softmax_in_place(x: &mut [f64]) {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

fn log_softmax_in_place(x: &mut [f64]) {
    let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + x.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    for v in x.iter_mut() {
        *v -= lse;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DType, GptjWeights, Tensor};

    /// With the attention and MLP outputs switched off (out_proj, fc_out zero), both norms see
    /// the embedding alone, so the gain is max(1, |e| / sqrt(|e - mean e|^2 + n eps))^2 for
    /// embedding row e: 1 for a centred row, large for a nearly constant one.
    #[test]
    fn layer_norm_gain_measures_how_much_the_residual_cancels() {
        let config = GptjConfig::small(1, 4, 1, 2, 3);
        let mut weights = GptjWeights::random(&config, 3, DType::F32);
        let zero = |t: &Tensor| Tensor::from_f32(t.shape().to_vec(), &vec![0.0; t.numel()]);
        let block = &mut weights.h[0];
        block.attn.out_proj.weight = zero(&block.attn.out_proj.weight);
        block.mlp.fc_out.weight = zero(&block.mlp.fc_out.weight);
        block.mlp.fc_out.bias = block.mlp.fc_out.bias.as_ref().map(zero);
        let rows: [[f32; 4]; 3] = [
            [1.0, -1.0, 2.0, -2.0],
            [1.0, 1.0, 1.0, 1.01],
            [0.5, 0.0, 0.0, 0.0],
        ];
        weights.wte = Tensor::from_f32(vec![3, 4], rows.as_flattened());
        let gain = ReferenceModel::new(&config, &weights).layer_norm_gain(&[0, 1, 2]);
        for (g, e) in gain.iter().zip(rows) {
            let e = e.map(f64::from);
            let mean = e.iter().sum::<f64>() / 4.0;
            let centred: f64 = e.iter().map(|v| (v - mean) * (v - mean)).sum();
            let norm: f64 = e.iter().map(|v| v * v).sum();
            let want = (norm / (centred + 4.0 * config.layer_norm_epsilon))
                .sqrt()
                .max(1.0)
                .powi(2);
            assert!((g - want).abs() <= 1e-12 * want, "{g} vs {want}");
        }
        assert!((gain[0] - 1.0).abs() < 1e-4, "centred row: {}", gain[0]);
        assert!(gain[1] > 1e4, "nearly constant row: {}", gain[1]);
        assert!(gain[2] > 1.0 && gain[2] < 2.0, "{}", gain[2]);
    }

    /// The MLP's output counts in the magnitude as the attention's does: with out_proj's and
    /// fc_out's weights zero, the MLP adds fc_out's bias b to every row, so ln_f's factor is
    /// max(1, ||e| + |b|| / sqrt(|x - mean x|^2 + n eps)) for x = e + b, here nearly cancelled.
    #[test]
    fn layer_norm_gain_counts_the_mlp_output() {
        let config = GptjConfig::small(1, 4, 1, 2, 1);
        let mut weights = GptjWeights::random(&config, 3, DType::F32);
        let zero = |t: &Tensor| Tensor::from_f32(t.shape().to_vec(), &vec![0.0; t.numel()]);
        let (e, b) = ([1.0f32, -1.0, 2.0, -2.0], [-1.0f32, 1.0, -2.0, 2.01]);
        let block = &mut weights.h[0];
        block.attn.out_proj.weight = zero(&block.attn.out_proj.weight);
        block.mlp.fc_out.weight = zero(&block.mlp.fc_out.weight);
        block.mlp.fc_out.bias = Some(Tensor::from_f32(vec![4], &b));
        weights.wte = Tensor::from_f32(vec![1, 4], &e);
        let gain = ReferenceModel::new(&config, &weights).layer_norm_gain(&[0]);
        let factor = |x: &[f64], magnitude: &[f64]| {
            let mean = x.iter().sum::<f64>() / 4.0;
            let centred: f64 = x.iter().map(|v| (v - mean) * (v - mean)).sum();
            let norm: f64 = magnitude.iter().map(|v| v * v).sum();
            (norm / (centred + 4.0 * config.layer_norm_epsilon))
                .sqrt()
                .max(1.0)
        };
        let (e, b) = (e.map(f64::from), b.map(f64::from));
        let x: Vec<f64> = e.iter().zip(&b).map(|(e, b)| e + b).collect();
        let m: Vec<f64> = e.iter().zip(&b).map(|(e, b)| e.abs() + b.abs()).collect();
        let want = factor(&e, &e.map(f64::abs)) * factor(&x, &m);
        assert!(want > 100.0, "{want}");
        assert!(
            (gain[0] - want).abs() <= 1e-12 * want,
            "{} vs {want}",
            gain[0]
        );
    }

    /// Logits near +-1000 (the LM head's bias shifted) give the log-softmax of the unshifted
    /// ones: the oracle shifts by the max before exp, which would overflow or underflow.
    #[test]
    fn log_softmax_does_not_move_with_a_shift_past_exp_range() {
        let config = GptjConfig::small(1, 4, 1, 2, 5);
        let mut weights = GptjWeights::random(&config, 3, DType::F32);
        let bias = weights.lm_head.bias.as_ref().unwrap().to_f32();
        for shift in [1000f32, -1000.0] {
            // Biases b + shift and (b + shift) - shift (exact in f32): logits `shift` apart.
            let mut with_bias = |bias: Vec<f32>| {
                weights.lm_head.bias = Some(Tensor::from_f32(vec![5], &bias));
                ReferenceModel::new(&config, &weights)
            };
            let shifted: Vec<f32> = bias.iter().map(|b| b + shift).collect();
            let base = with_bias(shifted.iter().map(|b| b - shift).collect());
            let base = base.log_softmax(&[1, 4, 2]);
            let model = with_bias(shifted);
            let got = model.log_softmax(&[1, 4, 2]);
            for (g, w) in got.data.iter().zip(&base.data) {
                assert!((g - w).abs() < 1e-9, "shift {shift}: {g} vs {w}");
            }
            let at = model.log_probs_at(&[1, 4, 2], &[(2, 3)]);
            assert!(
                (at[0] - base.row(2)[3]).abs() < 1e-9,
                "shift {shift}: {at:?}"
            );
        }
    }

    /// Each term of the parallel residual counts in the magnitude by its own size: on a random
    /// two-layer model, the gain is the product of the factors
    /// max(1, |m| / sqrt(|x - mean x|^2 + n eps)) recomputed here at each ln_1 and at ln_f, with
    /// m = |e| plus, over earlier layers, |attention| + |MLP| (not |attention + MLP|, which
    /// their signs would cancel).
    #[test]
    fn layer_norm_gain_adds_the_attention_and_mlp_magnitudes_of_every_layer() {
        let config = GptjConfig::small(2, 8, 2, 2, 11);
        let weights = GptjWeights::random(&config, 5, DType::F32);
        let model = ReferenceModel::new(&config, &weights);
        let ids = [3, 7, 1, 10, 3];
        let eps = config.layer_norm_epsilon;
        let factor = |x: &[f64], m: &[f64]| {
            let mean = x.iter().sum::<f64>() / 8.0;
            let centred: f64 = x.iter().map(|v| (v - mean) * (v - mean)).sum();
            let norm: f64 = m.iter().map(|v| v * v).sum();
            (norm / (centred + 8.0 * eps)).sqrt().max(1.0)
        };
        let mut x = embed(&model.wte, &ids);
        let mut m = x.clone();
        m.data.iter_mut().for_each(|v| *v = v.abs());
        let mut want = vec![1.0; ids.len()];
        let mut cancelled = 0.0f64;
        for block in &model.h {
            for (r, w) in want.iter_mut().enumerate() {
                *w *= factor(x.row(r), m.row(r));
            }
            let h = layer_norm(&x, &block.ln_1, eps);
            let a = attention(&h, block, &config);
            let f = linear(&gelu_new(&linear(&h, &block.fc_in)), &block.fc_out);
            for k in 0..x.data.len() {
                x.data[k] += a.data[k] + f.data[k];
                m.data[k] += a.data[k].abs() + f.data[k].abs();
                cancelled = cancelled
                    .max(a.data[k].abs() + f.data[k].abs() - (a.data[k] + f.data[k]).abs());
            }
        }
        for (r, w) in want.iter_mut().enumerate() {
            *w *= factor(x.row(r), m.row(r));
        }
        // The premise: the two terms have opposite signs somewhere, and the factors exceed 1.
        assert!(cancelled > 0.1, "{cancelled}");
        assert!(want.iter().all(|&w| w > 1.01), "{want:?}");
        let gain = model.layer_norm_gain(&ids);
        for (g, w) in gain.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-12 * w, "{gain:?} vs {want:?}");
        }
    }

    /// GPT-J's rotary ("rotate every two"): the pairs (x[2i], x[2i+1]) of the first rotary_dim
    /// dims of every head turn by pos * 10000^(-2i / rotary_dim), pos the row's own position
    /// from 0 (row 0 stays as it is); the head's other dims stay.
    #[test]
    fn apply_rotary_turns_each_pair_of_each_head_by_its_own_angle() {
        let (n_head, head_dim, rotary_dim, rows) = (3, 8, 6, 5);
        let cols = n_head * head_dim;
        let data: Vec<f64> = (0..rows * cols)
            .map(|k| ((k * 37 + 11) % 23) as f64 / 7.0 - 1.5)
            .collect();
        let before = Mat { rows, cols, data };
        let mut x = before.clone();
        apply_rotary(&mut x, n_head, head_dim, rotary_dim);
        for pos in 0..rows {
            for h in 0..n_head {
                let (was, got) = (before.row(pos), x.row(pos));
                let d = |k: usize| h * head_dim + k;
                for i in 0..rotary_dim / 2 {
                    let angle = pos as f64 * 10000f64.powf(-((2 * i) as f64) / rotary_dim as f64);
                    let (a, b) = (was[d(2 * i)], was[d(2 * i + 1)]);
                    let want = [
                        a * angle.cos() - b * angle.sin(),
                        b * angle.cos() + a * angle.sin(),
                    ];
                    for (g, w) in [got[d(2 * i)], got[d(2 * i + 1)]].iter().zip(want) {
                        assert!(
                            (g - w).abs() < 1e-12,
                            "pos {pos} head {h} pair {i}: {g} vs {w}"
                        );
                    }
                }
                assert_eq!(
                    &got[d(rotary_dim)..d(head_dim)],
                    &was[d(rotary_dim)..d(head_dim)]
                );
            }
        }
        assert_eq!(x.row(0), before.row(0));
    }

    /// Attention scores past exp's range give the softmax of the same scores near zero: the
    /// oracle shifts by the max before exp, which would overflow (or give 0 / 0) otherwise.
    #[test]
    fn attention_softmax_does_not_move_with_a_shift_past_exp_range() {
        let scores: [f64; 4] = [0.25, -1.5, 2.0, 0.75];
        let total: f64 = scores.iter().map(|s| s.exp()).sum();
        let want = scores.map(|s| s.exp() / total);
        for shift in [0.0, 1000.0, -1000.0] {
            let mut got = scores.map(|s| s + shift);
            softmax_in_place(&mut got);
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-12, "shift {shift}: {got:?} vs {want:?}");
            }
        }
    }
}
