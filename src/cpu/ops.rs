//! Row-wise operations of the CPU engine: embedding gather, LayerNorm, rotary, gelu_new. Each is
//! parallel over rows; the math is the reference's in f32 (statistics accumulated in f32, two-pass).

use rayon::prelude::*;

use super::weights::CpuLayerNorm;
use crate::model::rotary::RotaryTable;

/// Rows per rayon task for cheap row-wise ops: big enough to amortise scheduling.
const ROWS_PER_TASK: usize = 32;

/// `out[t] = wte[ids[t]]`: [n, d].
pub fn embed(wte: &[f32], ids: &[u32], d: usize, out: &mut [f32]) {
    out.par_chunks_mut(d)
        .zip(ids.par_iter())
        .for_each(|(row, &id)| row.copy_from_slice(&wte[id as usize * d..(id as usize + 1) * d]));
}

/// LayerNorm over rows of `x` ([n, d]) into `out`.
pub fn layer_norm(x: &[f32], ln: &CpuLayerNorm, eps: f32, d: usize, out: &mut [f32]) {
    out.par_chunks_mut(d * ROWS_PER_TASK)
        .zip(x.par_chunks(d * ROWS_PER_TASK))
        .for_each(|(o, x)| {
            for (o, x) in o.chunks_mut(d).zip(x.chunks(d)) {
                layer_norm_row(x, ln, eps, o);
            }
        });
}

/// LayerNorm of one row `x` (`[d]`, d = `x.len()`) into `out` (`[d]`): mean, then biased
/// variance, both accumulated in f32 over the row, `eps` added to the variance.
pub fn layer_norm_row(x: &[f32], ln: &CpuLayerNorm, eps: f32, out: &mut [f32]) {
    let d = x.len() as f32;
    let mean = x.iter().sum::<f32>() / d;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d;
    let inv = 1.0 / (var + eps).sqrt();
    for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(&ln.weight).zip(&ln.bias) {
        *o = (v - mean) * inv * w + b;
    }
}

/// GPT-J rotary ("rotate every two") on q and k inside `qkv` ([n, 3d]: q | k | v per row), each
/// row at its own position id.
pub fn rotary_qk(
    qkv: &mut [f32],
    positions: &[u32],
    table: &RotaryTable,
    n_head: usize,
    head_dim: usize,
) {
    let d = n_head * head_dim;
    qkv.par_chunks_mut(3 * d)
        .zip(positions.par_iter())
        .for_each(|(row, &pos)| {
            let cos = &table.cos[pos as usize * table.half..(pos as usize + 1) * table.half];
            let sin = &table.sin[pos as usize * table.half..(pos as usize + 1) * table.half];
            for head in row[..2 * d].chunks_mut(head_dim) {
                for i in 0..table.half {
                    let (a, b) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = a * cos[i] - b * sin[i];
                    head[2 * i + 1] = b * cos[i] + a * sin[i];
                }
            }
        });
}

/// x = gelu_new(x + bias) in place over rows of width `bias.len()`.
pub fn bias_gelu_new(x: &mut [f32], bias: &[f32]) {
    const K: f32 = 0.797_884_6; // sqrt(2 / pi)
    let f = bias.len();
    x.par_chunks_mut(f * ROWS_PER_TASK).for_each(|rows| {
        for row in rows.chunks_mut(f) {
            for (v, b) in row.iter_mut().zip(bias) {
                let u = *v + b;
                *v = 0.5 * u * (1.0 + tanh(K * (u + 0.044715 * u * u * u)));
            }
        }
    });
}

/// tanh as a [13/6] rational function on [-7.9, 7.9] (where f32 tanh saturates): branch-free, so
/// the gelu loop vectorises, unlike libm's tanhf (a call per element, a quarter of a layer's time).
/// Coefficients as in Eigen's float tanh; within 5e-7 absolute (a few f32 ulps) of f64 tanh
/// (`fast_tanh_matches_libm`).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let x = x.clamp(-7.905_311, 7.905_311);
    let x2 = x * x;
    let mut p = -2.760_768_5e-16_f32;
    p = p * x2 + 2.000_188e-13;
    p = p * x2 + -8.604_672e-11;
    p = p * x2 + 5.122_297e-8;
    p = p * x2 + 1.485_722_4e-5;
    p = p * x2 + 6.372_619_3e-4;
    p = p * x2 + 4.893_524_6e-3;
    let mut q = 1.198_258_4e-6_f32;
    q = q * x2 + 1.185_347e-4;
    q = q * x2 + 2.268_434_6e-3;
    q = q * x2 + 4.893_525e-3;
    x * p / q
}

/// `x[t] += bias` for every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    let d = bias.len();
    x.par_chunks_mut(d * ROWS_PER_TASK).for_each(|rows| {
        for row in rows.chunks_mut(d) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_tanh_matches_libm() {
        let mut worst = 0f64;
        for k in -200_000..=200_000 {
            let x = k as f32 * 1e-4;
            worst = worst.max((tanh(x) as f64 - (x as f64).tanh()).abs());
        }
        for x in [-1e30f32, -50.0, -9.0, 9.0, 50.0, 1e30] {
            worst = worst.max((tanh(x) as f64 - (x as f64).tanh()).abs());
        }
        assert!(worst < 5e-7, "worst |error| {worst:e}");
    }
}
