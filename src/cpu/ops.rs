//! Row-wise operations of the CPU engine: embedding gather, LayerNorm, rotary, gelu_new. Each is
//! parallel over rows; the math is the reference's in f32 (statistics accumulated in f32,
//! two-pass). The loops over rows are `row_kernel!`s: compiled for the CPU's vectors too
//! (crate::cpu).

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

row_kernel! {
    /// LayerNorm of one row `x` (`[d]`, d = `x.len()`) into `out` (`[d]`): mean, then biased
    /// variance, both accumulated in f32 over the row, `eps` added to the variance.
    pub fn layer_norm_row / layer_norm_row_copies(
        x: &[f32],
        ln: &CpuLayerNorm,
        eps: f32,
        out: &mut [f32],
    ) {
        let d = x.len() as f32;
        let mean = x.iter().sum::<f32>() / d;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(&ln.weight).zip(&ln.bias) {
            *o = (v - mean) * inv * w + b;
        }
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
            rotate_row(&mut row[..2 * d], head_dim, cos, sin);
        });
}

row_kernel! {
    /// Rotary on the q and k heads of one row (`qk`: [2 d]) at the position whose `cos` and `sin`
    /// ([rotary_dim / 2]) are given.
    fn rotate_row / rotate_row_copies(
        qk: &mut [f32],
        head_dim: usize,
        cos: &[f32],
        sin: &[f32],
    ) {
        for head in qk.chunks_mut(head_dim) {
            for (i, (&c, &s)) in cos.iter().zip(sin).enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = b * c + a * s;
            }
        }
    }
}

/// x = gelu_new(x + bias) in place over rows of width `bias.len()`.
pub fn bias_gelu_new(x: &mut [f32], bias: &[f32]) {
    let f = bias.len();
    x.par_chunks_mut(f * ROWS_PER_TASK)
        .for_each(|rows| bias_gelu_rows(rows, bias));
}

row_kernel! {
    /// `bias_gelu_new` on whole rows of width `bias.len()`.
    fn bias_gelu_rows / bias_gelu_rows_copies(rows: &mut [f32], bias: &[f32]) {
        const K: f32 = 0.797_884_6; // sqrt(2 / pi)
        for row in rows.chunks_mut(bias.len()) {
            for (v, b) in row.iter_mut().zip(bias) {
                let u = *v + b;
                *v = 0.5 * u * (1.0 + tanh(K * (u + 0.044715 * u * u * u)));
            }
        }
    }
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

/// e^x for x <= 0 (a softmax's shifted scores and logits), branch-free so that the loops around
/// it vectorise, unlike libm's expf (a call per element: a fifth of the LM head's time). Cody-Waite
/// reduction by ln 2 and Cephes' degree-5 polynomial for e^r on |r| <= ln(2)/2; below -87 (near
/// the end of f32's normal range) it is 0, and NaN stays NaN. Under 1 ulp from f64 exp over
/// [-87, 0] (`fast_exp_matches_libm`); positive arguments are not its job.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    const FLOOR: f32 = -87.0;
    // 1.5 * 2^23: adding it rounds to an integer, which its low mantissa bits then hold.
    const ROUND: f32 = 12_582_912.0;
    // A select, not `max`, so that NaN is carried through.
    let xc = if x < FLOOR { FLOOR } else { x };
    let t = xc * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    // ln 2 in two parts (the first exact in a few bits), so n * ln 2 is subtracted exactly.
    let r = xc - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_2e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // 2^n from n's bits: n >= -126, a normal float.
    let two_n = (t.to_bits() as i32)
        .wrapping_sub(ROUND.to_bits() as i32)
        .wrapping_add(127)
        << 23;
    let v = e_r * f32::from_bits(two_n as u32);
    if x < FLOOR {
        0.0
    } else {
        v
    }
}

/// `x[t] += bias` for every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    let d = bias.len();
    x.par_chunks_mut(d * ROWS_PER_TASK)
        .for_each(|rows| add_bias_rows(rows, bias));
}

row_kernel! {
    /// `add_bias` on whole rows of width `bias.len()`.
    fn add_bias_rows / add_bias_rows_copies(rows: &mut [f32], bias: &[f32]) {
        for row in rows.chunks_mut(bias.len()) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row kernel's copies (baseline, AVX2, AVX-512: those this machine can run) give the
    /// same bits (crate::cpu's `row_kernel!`), at widths with remainders after every vector
    /// width, on values large and small.
    #[test]
    fn row_kernels_copies_give_the_same_bits() {
        use crate::cpu::{assert_same_bits, bits};
        let mut rng = crate::util::rng::Rng::new(5);
        for d in [1, 7, 31, 64, 77, 1024 + 13] {
            let mut random = |n: usize| -> Vec<f32> {
                (0..n)
                    .map(|_| rng.normal() * [0.01, 1.0, 30.0][n % 3])
                    .collect()
            };
            let (x, w, b) = (random(3 * d), random(d), random(d));
            let ln = CpuLayerNorm {
                weight: w,
                bias: b.clone(),
            };
            let normed = each_copy!(layer_norm_row_copies, |f| {
                let mut out = vec![0f32; d];
                f(&x[..d], &ln, 1e-5, &mut out);
                bits(&out)
            });
            assert_same_bits(&normed, &format!("layer_norm, d {d}"));
            let gelu = each_copy!(bias_gelu_rows_copies, |f| {
                let mut y = x.clone();
                f(&mut y, &b);
                bits(&y)
            });
            assert_same_bits(&gelu, &format!("gelu, d {d}"));
            let biased = each_copy!(add_bias_rows_copies, |f| {
                let mut y = x.clone();
                f(&mut y, &b);
                bits(&y)
            });
            assert_same_bits(&biased, &format!("bias, d {d}"));
            // Heads of 2 d with a rotary part of d (d pairs' cos and sin a head).
            let (cos, sin, qk) = (random(d), random(d), random(8 * d));
            let rotated = each_copy!(rotate_row_copies, |f| {
                let mut y = qk.clone();
                f(&mut y, 2 * d, &cos, &sin);
                bits(&y)
            });
            assert_same_bits(&rotated, &format!("rotary, d {d}"));
            // The dispatched kernel is one of the copies.
            let mut out = vec![0f32; d];
            layer_norm_row(&x[..d], &ln, 1e-5, &mut out);
            assert_eq!(bits(&out), normed[0].1);
        }
    }

    /// LayerNorm where epsilon matters: a flat row (variance 0) gives the bias exactly, not
    /// 0 / 0, and a row of variance 1e-6 (a tenth of epsilon) is scaled by 1 / sqrt(var + eps),
    /// the biased variance: both against f64.
    #[test]
    fn layer_norm_rows_of_tiny_variance_count_epsilon() {
        let d = 12;
        let ln = CpuLayerNorm {
            weight: (0..d).map(|i| 0.5 + i as f32 * 0.25).collect(),
            bias: (0..d).map(|i| i as f32 * 0.125 - 0.5).collect(),
        };
        let mut out = vec![0f32; d];
        layer_norm_row(&[0.75; 12], &ln, 1e-5, &mut out);
        assert_eq!(out, ln.bias);
        let x: Vec<f32> = (0..d).map(|i| 0.25 + [1e-3, -1e-3][i % 2]).collect();
        layer_norm_row(&x, &ln, 1e-5, &mut out);
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let mean = x64.iter().sum::<f64>() / d as f64;
        let var = x64.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        for (i, &got) in out.iter().enumerate() {
            let want =
                (x64[i] - mean) / (var + 1e-5).sqrt() * ln.weight[i] as f64 + ln.bias[i] as f64;
            // f32's rounding near 0.25 (~1.5e-8) against deviations of 1e-3: ~1e-5 relative;
            // an unbiased variance moves these by ~5e-3.
            assert!((got as f64 - want).abs() < 1e-4, "{i}: {got} vs {want}");
        }
    }

    /// gelu_new (bias added first) against transformers' formula in f64, out to |u| = 20 where
    /// tanh saturates (0 on the left, u on the right): tight enough for a constant off in its
    /// fifth digit (sqrt(2/pi), 0.044715), which moves a loss less than the engine tests' budget.
    #[test]
    fn bias_gelu_matches_f64_gelu_new() {
        let bias = [0.0f32, 0.375, -1.5];
        let mut x: Vec<f32> = (-2000..=2000).map(|k| k as f32 * 0.01).collect();
        x.truncate(x.len() / 3 * 3);
        let mut y = x.clone();
        bias_gelu_new(&mut y, &bias);
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let mut worst = (0f64, 0f64);
        for (i, (&v, &got)) in x.iter().zip(&y).enumerate() {
            let u = (v + bias[i % 3]) as f64;
            let want = 0.5 * u * (1.0 + (k * (u + 0.044715 * u * u * u)).tanh());
            let err = (got as f64 - want).abs() / u.abs().max(1.0);
            if err > worst.0 {
                worst = (err, u);
            }
        }
        assert!(
            worst.0 < 1e-6,
            "worst |error| / max(1, |u|) {:e} at u {}",
            worst.0,
            worst.1
        );
    }

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

    #[test]
    fn fast_exp_matches_libm() {
        // Error in ulps of the exact result (the f32 spacing at it), over [-87, 0] in steps of
        // ~1e-4, and the 16 floats on either side of each of the reduction's edges
        // (x = -(k + 1/2) ln 2, where the rounding of n turns over) and of each x = -k ln 2.
        let ulps = |x: f32| {
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            (got - want).abs() / 2f64.powi(want.log2().floor() as i32 - 23)
        };
        let mut worst = (0f64, 0f32);
        let edges = (1..252).flat_map(|h| {
            let c = (h as f64 * -0.5 * std::f64::consts::LN_2) as f32;
            (0..32u32).map(move |d| f32::from_bits(c.to_bits() + d - 16))
        });
        for x in (0..=870_000).map(|k| k as f32 * -1e-4).chain(edges) {
            if x >= -87.0 {
                let u = ulps(x);
                if u > worst.0 {
                    worst = (u, x);
                }
            }
        }
        assert!(worst.0 < 1.0, "worst {} ulp at {}", worst.0, worst.1);
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        for x in [-87.5f32, -1e30, f32::NEG_INFINITY] {
            assert_eq!(exp_nonpositive(x), 0.0, "{x}");
        }
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }
}
