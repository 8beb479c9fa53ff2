//! The hot ops as candle custom ops with explicit backward passes: candle's autograd of the same
//! math written from primitives builds a dozen full-size temporaries per op (gelu's backward alone
//! is ten tensor ops with a `powf`), which made a step three times slower. Each forward is the
//! plain formula, one pass over the rows (rayon, one row per task: deterministic); each backward
//! is one more custom op (no second derivatives are needed).

use std::sync::Arc;

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};
use rayon::prelude::*;

/// Rows of at most this many elements go to rayon in groups, so a task is not too small.
const MIN_TASK: usize = 4096;

fn f32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("{op}: expected f32")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("{op}: expected a contiguous tensor"),
    }
}

fn u32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [u32]> {
    let CpuStorage::U32(v) = s else {
        bail!("{op}: expected u32")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("{op}: expected a contiguous tensor"),
    }
}

fn min_rows(row: usize) -> usize {
    (MIN_TASK / row.max(1)).max(1)
}

/// sqrt(2 / pi).
const GELU_K: f32 = 0.797_884_6;

/// gelu_new(x) and its derivative, with the engine's vectorisable tanh (libm's tanhf was a
/// quarter of a training step).
#[inline(always)]
fn gelu_and_grad(x: f32) -> (f32, f32) {
    let t = crate::cpu::ops::tanh(GELU_K * (x + 0.044715 * x * x * x));
    let y = 0.5 * x * (1.0 + t);
    let dy = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * 0.044715 * x * x);
    (y, dy)
}

/// transformers' gelu_new (tanh approximation) of x + bias: (x [N, f], bias [f]) -> [N, f].
pub struct BiasGelu;

impl CustomOp2 for BiasGelu {
    fn name(&self) -> &'static str {
        "bias-gelu-new"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, b) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        let f = b.len();
        if l1.dims()[l1.dims().len() - 1] != f {
            bail!("bias-gelu: shapes {:?} {:?}", l1.dims(), l2.dims());
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(f)
            .zip(x.par_chunks(f))
            .with_min_len(min_rows(f))
            .for_each(|(o, x)| {
                for ((o, &x), &b) in o.iter_mut().zip(x).zip(b) {
                    *o = gelu_and_grad(x + b).0;
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = x.elem_count() / b.elem_count();
        let all = x.apply_op3_no_bwd(b, &grad.contiguous()?, &BiasGeluBwd)?;
        let dx = all.narrow(0, 0, n)?.reshape(x.shape())?;
        let db = all.narrow(0, n, 1)?.reshape(b.shape())?;
        Ok((Some(dx), Some(db)))
    }
}

/// (x [N, f], bias [f], dy [N, f]) -> [N + 1, f]: dx = dy * gelu_new'(x + bias) in rows 0..N,
/// d bias (the column sums of dx) in row N.
struct BiasGeluBwd;

impl CustomOp3 for BiasGeluBwd {
    fn name(&self) -> &'static str {
        "bias-gelu-new-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s1, l1, self.name())?;
        let b = f32s(s2, l2, self.name())?;
        let g = f32s(s3, l3, self.name())?;
        let f = b.len();
        let n = x.len() / f;
        let mut out = vec![0f32; (n + 1) * f];
        let (dx, db) = out.split_at_mut(n * f);
        dx.par_chunks_mut(f)
            .zip(x.par_chunks(f).zip(g.par_chunks(f)))
            .with_min_len(min_rows(f))
            .for_each(|(o, (x, g))| {
                for (((o, &x), &g), &b) in o.iter_mut().zip(x).zip(g).zip(b) {
                    *o = g * gelu_and_grad(x + b).1;
                }
            });
        column_sums(dx, db);
        Ok((CpuStorage::F32(out), Shape::from((n + 1, f))))
    }
}

/// out[c] = sum over rows r of x[r, c] (rows in order: deterministic).
fn column_sums(x: &[f32], out: &mut [f32]) {
    for row in x.chunks(out.len()) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}

/// Causal softmax over the last dim of [.., T, T]: row i of each matrix over columns 0..=i,
/// zeros above the diagonal (the key comes after the query).
pub struct CausalSoftmax;

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s, l, self.name())?;
        let dims = l.dims();
        let t = dims[dims.len() - 1];
        if dims.len() < 2 || dims[dims.len() - 2] != t {
            bail!("causal-softmax: expected [.., T, T], got {dims:?}");
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(t)
            .zip(x.par_chunks(t))
            .enumerate()
            .with_min_len(min_rows(t))
            .for_each(|(r, (o, x))| {
                let n = r % t + 1;
                let max = x[..n].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for (o, &x) in o[..n].iter_mut().zip(&x[..n]) {
                    *o = (x - max).exp();
                    sum += *o;
                }
                let inv = 1.0 / sum;
                o[..n].iter_mut().for_each(|o| *o *= inv);
            });
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(
            res.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBwd)?,
        ))
    }
}

/// (y, dy) -> y * (dy - sum(dy * y)) per row (the softmax backward).
struct SoftmaxBwd;

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "softmax-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (y, g) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        let t = l1.dims()[l1.dims().len() - 1];
        let mut out = vec![0f32; y.len()];
        out.par_chunks_mut(t)
            .zip(y.par_chunks(t).zip(g.par_chunks(t)))
            .with_min_len(min_rows(t))
            .for_each(|(o, (y, g))| {
                let dot: f32 = y.iter().zip(g).map(|(y, g)| y * g).sum();
                for ((o, &y), &g) in o.iter_mut().zip(y).zip(g) {
                    *o = y * (g - dot);
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// LayerNorm over the last dim (biased variance, as torch): (x [N, d], weight [d], bias [d]).
pub struct LayerNorm {
    pub eps: f64,
}

/// Mean and 1/sqrt(var + eps) of a row, accumulated in f64.
fn row_stats(x: &[f32], eps: f64) -> (f32, f32) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean as f32, (1.0 / (var + eps).sqrt()) as f32)
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s1, l1, self.name())?;
        let (w, b) = (f32s(s2, l2, self.name())?, f32s(s3, l3, self.name())?);
        let d = w.len();
        if b.len() != d || l1.dims()[l1.dims().len() - 1] != d {
            bail!(
                "layer-norm: shapes {:?} {:?} {:?}",
                l1.dims(),
                l2.dims(),
                l3.dims()
            );
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .with_min_len(min_rows(d))
            .for_each(|(o, x)| {
                let (mean, inv) = row_stats(x, self.eps);
                for c in 0..d {
                    o[c] = (x[c] - mean) * inv * w[c] + b[c];
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let n = x.elem_count() / w.elem_count();
        let all = x.apply_op3_no_bwd(w, &grad.contiguous()?, &LayerNormBwd { eps: self.eps })?;
        let dx = all.narrow(0, 0, n)?.reshape(x.shape())?;
        let dw = all.narrow(0, n, 1)?.reshape(w.shape())?;
        let db = all.narrow(0, n + 1, 1)?.reshape(w.shape())?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// (x [N, d], weight [d], dy [N, d]) -> [N + 2, d]: dx in rows 0..N, d weight in row N, d bias
/// in row N + 1 (one op returns one tensor; the backward narrows it).
struct LayerNormBwd {
    eps: f64,
}

impl CustomOp3 for LayerNormBwd {
    fn name(&self) -> &'static str {
        "layer-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s1, l1, self.name())?;
        let w = f32s(s2, l2, self.name())?;
        let g = f32s(s3, l3, self.name())?;
        let d = w.len();
        let n = x.len() / d;
        let mut out = vec![0f32; (n + 2) * d];
        let (dx, dwb) = out.split_at_mut(n * d);
        let stats: Vec<(f32, f32)> = dx
            .par_chunks_mut(d)
            .zip(x.par_chunks(d).zip(g.par_chunks(d)))
            .with_min_len(min_rows(d))
            .map(|(o, (x, g))| {
                let (mean, inv) = row_stats(x, self.eps);
                let (mut mg, mut mgx) = (0f32, 0f32);
                for c in 0..d {
                    let gy = g[c] * w[c];
                    mg += gy;
                    mgx += gy * (x[c] - mean) * inv;
                }
                let (mg, mgx) = (mg / d as f32, mgx / d as f32);
                for c in 0..d {
                    let xhat = (x[c] - mean) * inv;
                    o[c] = inv * (g[c] * w[c] - mg - xhat * mgx);
                }
                (mean, inv)
            })
            .collect();
        let (dw, db) = dwb.split_at_mut(d);
        for (r, &(mean, inv)) in stats.iter().enumerate() {
            let (x, g) = (&x[r * d..(r + 1) * d], &g[r * d..(r + 1) * d]);
            for c in 0..d {
                dw[c] += g[c] * (x[c] - mean) * inv;
                db[c] += g[c];
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((n + 2, d))))
    }
}

/// GPT-J's "rotate every two" on the first `2 * half` dims of each head of [B, T, H, hd], at
/// positions 0..T: the pair (x[2i], x[2i+1]) turns by +angle (or -angle when `inverse`, the
/// transpose, which is the backward). `cos`/`sin` are [n_positions, half].
#[derive(Clone)]
pub struct Rotary {
    pub cos: Arc<Vec<f32>>,
    pub sin: Arc<Vec<f32>>,
    pub half: usize,
    pub inverse: bool,
}

impl CustomOp1 for Rotary {
    fn name(&self) -> &'static str {
        "rotary-gptj"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s, l, self.name())?;
        let &[_, t, h, hd] = l.dims() else {
            bail!("rotary: expected [B, T, H, hd], got {:?}", l.dims())
        };
        let half = self.half;
        if 2 * half > hd || t * half > self.cos.len() {
            bail!("rotary: {half} pairs, head dim {hd}, {t} positions: tables too small");
        }
        let sign = if self.inverse { -1.0 } else { 1.0 };
        let row = h * hd;
        let mut out = x.to_vec();
        out.par_chunks_mut(row)
            .enumerate()
            .with_min_len(min_rows(row))
            .for_each(|(r, o)| {
                let pos = r % t;
                let (cos, sin) = (
                    &self.cos[pos * half..(pos + 1) * half],
                    &self.sin[pos * half..(pos + 1) * half],
                );
                for head in o.chunks_mut(hd) {
                    for i in 0..half {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        let (c, s) = (cos[i], sign * sin[i]);
                        head[2 * i] = a * c - b * s;
                        head[2 * i + 1] = b * c + a * s;
                    }
                }
            });
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let inverse = Rotary {
            inverse: !self.inverse,
            ..self.clone()
        };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&inverse)?))
    }
}

/// Per-row cross-entropy: (logits [M, V], targets [M] u32) -> logsumexp(row) - row[target]: [M].
pub struct CrossEntropy;

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let z = f32s(s1, l1, self.name())?;
        let targets = u32s(s2, l2, self.name())?;
        let v = l1.dims()[l1.dims().len() - 1];
        if z.len() != targets.len() * v {
            bail!(
                "cross-entropy: logits {:?}, targets {:?}",
                l1.dims(),
                l2.dims()
            );
        }
        let out: Vec<f32> = z
            .par_chunks(v)
            .zip(targets.par_iter())
            .with_min_len(min_rows(v))
            .map(|(z, &t)| {
                let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = z.iter().map(|&z| (z - max).exp()).sum();
                sum.ln() + max - z[t as usize]
            })
            .collect();
        Ok((CpuStorage::F32(out), Shape::from(targets.len())))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d = logits.apply_op3_no_bwd(targets, &grad.contiguous()?, &CrossEntropyBwd)?;
        Ok((Some(d), None))
    }
}

/// (logits [M, V], targets [M], dloss [M]) -> dloss_r * (softmax(row) - onehot(target)).
struct CrossEntropyBwd;

impl CustomOp3 for CrossEntropyBwd {
    fn name(&self) -> &'static str {
        "cross-entropy-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let z = f32s(s1, l1, self.name())?;
        let targets = u32s(s2, l2, self.name())?;
        let g = f32s(s3, l3, self.name())?;
        let v = l1.dims()[l1.dims().len() - 1];
        let mut out = vec![0f32; z.len()];
        out.par_chunks_mut(v)
            .zip(z.par_chunks(v).zip(targets.par_iter().zip(g.par_iter())))
            .with_min_len(min_rows(v))
            .for_each(|(o, (z, (&t, &g)))| {
                let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for (o, &z) in o.iter_mut().zip(z) {
                    *o = (z - max).exp();
                    sum += *o;
                }
                let k = g / sum;
                o.iter_mut().for_each(|o| *o *= k);
                o[t as usize] -= g;
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::super::tests::{max_diff, random, value_and_grads};
    use super::*;
    use crate::util::rng::Rng;

    /// Each op checks its inputs' shapes rather than reading short of or past them: a bias
    /// longer than the rows, a score tensor that is not [.., T, T], a LayerNorm bias of another
    /// length than its weight, more positions than the rotary tables hold, fewer targets than
    /// logit rows.
    #[test]
    fn each_fused_op_refuses_inputs_of_the_wrong_shape() {
        let mut rng = Rng::new(11);
        let x = random(&[4, 6], &mut rng, 1.0);
        let err = |r: Result<Tensor>| r.unwrap_err().to_string();
        let e = err(x.apply_op2(&random(&[8], &mut rng, 1.0), BiasGelu));
        assert!(e.contains("bias-gelu: shapes"), "{e}");
        let e = err(random(&[2, 3, 5], &mut rng, 1.0).apply_op1(CausalSoftmax));
        assert!(e.contains("expected [.., T, T]"), "{e}");
        let (w, b) = (random(&[6], &mut rng, 1.0), random(&[7], &mut rng, 1.0));
        let e = err(x.apply_op3(&w, &b, LayerNorm { eps: 1e-5 }));
        assert!(e.contains("layer-norm: shapes"), "{e}");
        let table = crate::model::rotary::RotaryTable::new(3, 4);
        let rotary = Rotary {
            cos: Arc::new(table.cos),
            sin: Arc::new(table.sin),
            half: table.half,
            inverse: false,
        };
        let e = err(random(&[1, 5, 2, 4], &mut rng, 1.0).apply_op1(rotary));
        assert!(e.contains("tables too small"), "{e}");
        let targets = Tensor::new(&[1u32, 2, 3], &Device::Cpu).unwrap();
        let e = err(x.apply_op2(&targets, CrossEntropy));
        assert!(e.contains("cross-entropy: logits"), "{e}");
    }

    /// The ops subtract each row's maximum over the entries they use, so exp neither overflows
    /// nor underflows far from zero: causal-softmax rows whose masked entries (after the query)
    /// are 200 above the rest, or whose entries are all 200 below zero, give the unshifted rows'
    /// probabilities; cross-entropy's value and gradient are the same with every logit shifted
    /// by +200 or -200.
    #[test]
    fn softmax_and_cross_entropy_hold_far_from_zero() {
        let mut rng = Rng::new(12);
        let t = 6;
        let x = random(&[2, t, t], &mut rng, 2.0);
        let want = x.apply_op1(CausalSoftmax).unwrap();
        let above: Vec<f32> = (0..t)
            .flat_map(|i| (0..t).map(move |j| if j > i { 200.0 } else { 0.0 }))
            .collect();
        let above = Tensor::from_vec(above, (t, t), &Device::Cpu).unwrap();
        let high = x.broadcast_add(&above).unwrap();
        let d = max_diff(&high.apply_op1(CausalSoftmax).unwrap(), &want);
        assert!(d < 1e-6, "masked entries 200 above: {d}");
        let low = (&x - 200.0).unwrap();
        let d = max_diff(&low.apply_op1(CausalSoftmax).unwrap(), &want);
        assert!(d < 1e-4, "every entry 200 below zero: {d}");

        let logits = random(&[5, 10], &mut rng, 3.0);
        let targets = Tensor::new(&[3u32, 0, 9, 9, 4], &Device::Cpu).unwrap();
        let probe = random(&[5], &mut rng, 1.0);
        let value_and_grad = |shift: f64| {
            let shifted = (&logits + shift).unwrap();
            value_and_grads(&[shifted], &probe, |t| {
                t[0].apply_op2(&targets, CrossEntropy).unwrap()
            })
        };
        let (v0, g0) = value_and_grad(0.0);
        for shift in [200.0, -200.0] {
            let (v, g) = value_and_grad(shift);
            let (dv, dg) = (max_diff(&v, &v0), max_diff(&g[0], &g0[0]));
            assert!(
                dv < 1e-3 && dg < 1e-4,
                "shift {shift}: value {dv}, gradient {dg}"
            );
        }
    }

    /// An op given a view into a larger tensor (rows 1..5 of a [6, d] tensor: contiguous, at an
    /// offset) reads only the view's elements: LayerNorm's value and gradients are those of the
    /// same rows copied, and cross-entropy takes such a view of logits.
    #[test]
    fn a_view_into_a_larger_tensor_is_read_as_its_own_elements() {
        let mut rng = Rng::new(13);
        let x = random(&[6, 16], &mut rng, 2.0);
        let (w, b) = (random(&[16], &mut rng, 1.0), random(&[16], &mut rng, 1.0));
        let probe = random(&[4, 16], &mut rng, 1.0);
        let value_and_grads_of = |copy: bool| {
            let inputs = [x.clone(), w.clone(), b.clone()];
            let (y, grads) = value_and_grads(&inputs, &probe, |t| {
                let mut rows = t[0].narrow(0, 1, 4).unwrap();
                if copy {
                    rows = (&rows * 1.0).unwrap();
                }
                rows.apply_op3(&t[1], &t[2], LayerNorm { eps: 1e-5 })
                    .unwrap()
            });
            [vec![y], grads].concat()
        };
        for (i, (a, b)) in value_and_grads_of(false)
            .iter()
            .zip(&value_and_grads_of(true))
            .enumerate()
        {
            let d = max_diff(a, b);
            assert!(
                d < 1e-6,
                "output {i} (value, then gradients) differs by {d}"
            );
        }

        let logits = random(&[6, 10], &mut rng, 3.0);
        let targets = Tensor::new(&[3u32, 0, 9, 4], &Device::Cpu).unwrap();
        let view = logits.narrow(0, 1, 4).unwrap();
        let copied = (&view * 1.0).unwrap();
        let d = max_diff(
            &view.apply_op2(&targets, CrossEntropy).unwrap(),
            &copied.apply_op2(&targets, CrossEntropy).unwrap(),
        );
        assert!(d < 1e-6, "{d}");
    }
}
