//! Row-wise operations of the CPU engine: embedding gather, LayerNorm, rotary, gelu_new. Each is
//! parallel over rows; the math is the reference's in f32 (statistics accumulated in f32, two-pass).

use rayon::prelude::*;

use super::weights::CpuLayerNorm;

/// Rows per rayon task for cheap row-wise ops: big enough to amortise scheduling.
const ROWS_PER_TASK: usize = 32;

/// out[t] = wte[ids[t]]: [n, d].
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

pub fn layer_norm_row(x: &[f32], ln: &CpuLayerNorm, eps: f32, out: &mut [f32]) {
    let d = x.len() as f32;
    let mean = x.iter().sum::<f32>() / d;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d;
    let inv = 1.0 / (var + eps).sqrt();
    for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(&ln.weight).zip(&ln.bias) {
        *o = (v - mean) * inv * w + b;
    }
}

/// cos/sin of pos * 10000^(-2i / rotary_dim), [max_pos, rotary_dim / 2] each; built in f64.
pub struct RotaryTable {
    pub half: usize,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RotaryTable {
    pub fn new(max_pos: usize, rotary_dim: usize) -> Self {
        let half = rotary_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for i in 0..half {
                let inv_freq = 1.0 / 10000f64.powf((2 * i) as f64 / rotary_dim as f64);
                let (s, c) = (p as f64 * inv_freq).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        RotaryTable { half, cos, sin }
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
                *v = 0.5 * u * (1.0 + (K * (u + 0.044715 * u * u * u)).tanh());
            }
        }
    });
}

/// x[t] += bias for every row of `x`.
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
