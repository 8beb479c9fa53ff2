//! The LM head at the plan's weighted rows only, fused with ln_f, log-softmax over all vocab_size
//! logits, target gather: logits exist for one chunk of rows at a time, never for the whole batch.

use rayon::prelude::*;

use super::gemm::matmul;
use super::ops::layer_norm_row;
use super::weights::CpuWeights;
use crate::plan::Plan;

/// log p(target | row) for every target of the plan, from the final residual stream `x`
/// ([n_tokens, d], before ln_f). `chunk_rows` bounds the logits buffer to [chunk_rows, vocab].
pub fn head_log_probs(
    plan: &Plan,
    x: &[f32],
    w: &CpuWeights,
    d: usize,
    vocab: usize,
    eps: f32,
    chunk_rows: usize,
) -> Vec<f64> {
    // Targets grouped by head row.
    let mut by_row: Vec<Vec<usize>> = vec![Vec::new(); plan.head_rows.len()];
    for (k, t) in plan.targets.iter().enumerate() {
        by_row[t.head_row as usize].push(k);
    }
    let mut log_probs = vec![0f64; plan.targets.len()];
    let chunk_rows = chunk_rows.max(1);
    let mut hidden = vec![0f32; chunk_rows * d]; // [chunk, d]
    let mut logits = vec![0f32; chunk_rows * vocab]; // [chunk, vocab]
    for (c, rows) in plan.head_rows.chunks(chunk_rows).enumerate() {
        let m = rows.len();
        hidden[..m * d]
            .par_chunks_mut(d)
            .zip(rows.par_iter())
            .for_each(|(h, &r)| {
                layer_norm_row(&x[r as usize * d..][..d], &w.ln_f, eps, h);
            });
        matmul(&hidden, &w.lm_head, &mut logits, [m, vocab, d], false, true);
        let lse: Vec<f64> = logits[..m * vocab]
            .par_chunks(vocab)
            .map(|row| log_sum_exp_biased(row, &w.lm_head_b))
            .collect();
        for (i, lse) in lse.iter().enumerate() {
            for &k in &by_row[c * chunk_rows + i] {
                let tok = plan.targets[k].token as usize;
                let logit = logits[i * vocab + tok] as f64 + w.lm_head_b[tok] as f64;
                log_probs[k] = logit - lse;
            }
        }
    }
    log_probs
}

/// log sum_v exp(row[v] + bias[v]): exponentials in f32 (arguments <= 0), their sum in f64.
fn log_sum_exp_biased(row: &[f32], bias: &[f32]) -> f64 {
    let max = row
        .iter()
        .zip(bias)
        .fold(f32::NEG_INFINITY, |m, (&l, &b)| m.max(l + b));
    let sum: f64 = row
        .iter()
        .zip(bias)
        .map(|(&l, &b)| (l + b - max).exp() as f64)
        .sum();
    max as f64 + sum.ln()
}
