//! The LM head at the plan's weighted rows only, fused with ln_f, log-softmax over all vocab_size
//! logits and the target gather. Logits exist one tile at a time, [HEAD_ROWS, VOCAB_BLOCK], never
//! for the whole batch nor for a whole row:
//!
//! - up to `HEAD_ROWS` rows go through ln_f together (passes of equal size: 548 rows as 274 +
//!   274, not 512 + 36);
//! - the vocabulary is cut into blocks of `VOCAB_BLOCK` columns of lm_head, one task each: a GEMM
//!   of all those rows by the block (the block's weights, packed once, serve every row), then per
//!   row the block's max and sum of exponentials, and the target logits that fall in the block;
//! - the blocks' (max, sum) pairs merge in block order into each row's log-sum-exp, so the result
//!   does not depend on the thread count.
//!
//! The head runs at ~73% of the f32 GEMM peak (225 of 309 GFLOP/s, its exponentials vectorised:
//! `sum_exp`). Chunks of 64 whole rows (the design before the tiles) reached ~46% (99 of 214):
//! the crate packs all of lm_head for every chunk, which 64 rows amortise poorly
//! (docs/benchmarks.md, "The LM head").

use rayon::prelude::*;

use super::gemm::matmul_cols;
use super::ops::{exp_nonpositive, layer_norm_row};
use super::weights::CpuWeights;
use crate::plan::Plan;

/// Head rows per pass (bounds the ln_f output to [HEAD_ROWS, d]).
const HEAD_ROWS: usize = 512;
/// Columns of lm_head per task: a [HEAD_ROWS, VOCAB_BLOCK] f32 tile of 2 MB.
const VOCAB_BLOCK: usize = 1024;
/// The tiles the engine runs [`log_probs_at`] in: `HEAD_ROWS` rows by `VOCAB_BLOCK` columns.
pub const TILES: [usize; 2] = [HEAD_ROWS, VOCAB_BLOCK];

/// One vocabulary block's share of a pass: per row, the max of the block's biased logits and the
/// sum of their exponentials relative to it; and (target, logit) for the targets in the block.
struct BlockSums {
    max_sum: Vec<(f32, f64)>,
    target_logits: Vec<(usize, f64)>,
}

/// log p(target | row) for every target of the plan, from the final residual stream `x`
/// ([n_tokens, d], before ln_f).
pub fn head_log_probs(
    plan: &Plan,
    x: &[f32],
    w: &CpuWeights,
    d: usize,
    vocab: usize,
    eps: f32,
) -> Vec<f64> {
    let targets: Vec<(u32, u32)> = plan.targets.iter().map(|t| (t.head_row, t.token)).collect();
    log_probs_at(x, &plan.head_rows, &targets, w, [d, vocab], eps, TILES)
}

/// log p(token | row) for every `(row, token)` of `targets`, where `row` indexes `rows` and
/// `rows` index the rows of `x` (the final residual stream, [n, d], before ln_f), in tiles of
/// at most `[pass_rows, vocab_block]` ([`TILES`]; tests use small ones).
///
/// # Panics
/// On a target's token not below `vocab` or its row not below `rows.len()`, or an empty tile.
pub fn log_probs_at(
    x: &[f32],
    rows: &[u32],
    targets: &[(u32, u32)],
    w: &CpuWeights,
    [d, vocab]: [usize; 2],
    eps: f32,
    [pass_rows, vocab_block]: [usize; 2],
) -> Vec<f64> {
    assert!(pass_rows > 0 && vocab_block > 0, "empty LM-head tiles");
    // Targets grouped by row: (target, token). A token past the vocabulary would match no
    // block and read as a logit of 0.
    let mut by_row: Vec<Vec<(usize, u32)>> = vec![Vec::new(); rows.len()];
    for (k, &(row, token)) in targets.iter().enumerate() {
        assert!(
            (token as usize) < vocab && (row as usize) < rows.len(),
            "target {k}: token {token} of row {row}, over {} rows and a vocabulary of {vocab}",
            rows.len()
        );
        by_row[row as usize].push((k, token));
    }
    let mut log_probs = vec![0f64; targets.len()];
    // Passes of equal size: every pass streams all of lm_head, so 548 rows run as 274 + 274
    // rather than 512 + 36, whose second pass would pay a whole sweep for 36 rows.
    let per_pass = rows
        .len()
        .div_ceil(rows.len().div_ceil(pass_rows).max(1))
        .max(1);
    for (c, rows) in rows.chunks(per_pass).enumerate() {
        let m = rows.len();
        let targets = &by_row[c * per_pass..][..m];
        let mut hidden = vec![0f32; m * d]; // [m, d]
        hidden
            .par_chunks_mut(d)
            .zip(rows.par_iter())
            .for_each(|(h, &r)| layer_norm_row(&x[r as usize * d..][..d], &w.ln_f, eps, h));
        let block_sums: Vec<BlockSums> = (0..vocab.div_ceil(vocab_block))
            .into_par_iter()
            .map_init(
                || vec![0f32; m * vocab_block], // [m, vocab_block]
                |logits, b| {
                    let j0 = b * vocab_block;
                    let nb = vocab_block.min(vocab - j0);
                    let logits = &mut logits[..m * nb]; // [m, nb]
                    matmul_cols(&hidden, &w.lm_head, logits, [m, nb, d], vocab, j0);
                    block_sums(logits, &w.lm_head_b[j0..j0 + nb], j0, targets)
                },
            )
            .collect();
        for (i, targets) in targets.iter().enumerate() {
            let lse = log_sum_exp(block_sums.iter().map(|s| s.max_sum[i]));
            for &(k, _) in targets {
                log_probs[k] = -lse;
            }
        }
        for (k, logit) in block_sums.iter().flat_map(|s| &s.target_logits) {
            log_probs[*k] += logit;
        }
    }
    log_probs
}

/// The block's [`BlockSums`] from its logits ([m, nb], bias not yet added) and its bias ([nb]):
/// exponentials in f32 (arguments <= 0), summed in f32 lanes and then in f64 ([`sum_exp`]).
fn block_sums(
    logits: &mut [f32],
    bias: &[f32],
    j0: usize,
    targets: &[Vec<(usize, u32)>],
) -> BlockSums {
    let nb = bias.len();
    let mut target_logits = Vec::new();
    let max_sum = logits
        .chunks_mut(nb)
        .zip(targets)
        .map(|(row, targets)| {
            let (max, sum) = biased_max_sum_exp(row, bias);
            for &(k, tok) in targets {
                let tok = tok as usize;
                if (j0..j0 + nb).contains(&tok) {
                    target_logits.push((k, row[tok - j0] as f64));
                }
            }
            (max, sum)
        })
        .collect();
    BlockSums {
        max_sum,
        target_logits,
    }
}

row_kernel! {
    /// Adds `bias` to a row of logits, and gives its max and [`sum_exp`] from it.
    fn biased_max_sum_exp / biased_max_sum_exp_copies(
        row: &mut [f32],
        bias: &[f32],
    ) -> (f32, f64) {
        for (l, &b) in row.iter_mut().zip(bias) {
            *l += b;
        }
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        (max, sum_exp(row, max))
    }
}

/// sum_v e^(row[v] - max), in f64 from f32 exponentials: 16 running f32 sums (64 terms each in a
/// block of 1024: their rounding is under 4e-6 relative at worst, ~1e-7 typically) so that the
/// loop vectorises, then in f64.
#[inline(always)]
fn sum_exp(row: &[f32], max: f32) -> f64 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&l| exp_nonpositive(l - max) as f64)
        .sum();
    for chunk in chunks {
        for (s, &l) in lanes.iter_mut().zip(chunk) {
            *s += exp_nonpositive(l - max);
        }
    }
    lanes.iter().map(|&s| s as f64).sum::<f64>() + tail
}

/// log sum_v exp(l_v) over a row from its blocks' (max, sum of exp(l - max)) pairs.
fn log_sum_exp(blocks: impl Iterator<Item = (f32, f64)> + Clone) -> f64 {
    let max = blocks.clone().fold(f32::NEG_INFINITY, |m, (b, _)| m.max(b)) as f64;
    let sum: f64 = blocks.map(|(b, s)| s * (b as f64 - max).exp()).sum();
    max + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DType, GptjConfig, GptjWeights};
    use crate::plan::Target;
    use crate::util::rng::Rng;

    /// The head's row kernel's copies (baseline, AVX2, AVX-512: those this machine can run) give
    /// the same bits (crate::cpu's `row_kernel!`), over widths with remainders and logits far
    /// apart.
    #[test]
    fn row_kernel_copies_give_the_same_bits() {
        let mut rng = Rng::new(3);
        for n in [1, 15, 16, 17, 1000, 1024, 1043] {
            let row: Vec<f32> = (0..n).map(|_| rng.normal() * 20.0).collect();
            let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let results = each_copy!(biased_max_sum_exp_copies, |f| {
                let mut biased = row.clone();
                let (max, sum) = f(&mut biased, &bias);
                (crate::cpu::bits(&biased), max.to_bits(), sum.to_bits())
            });
            crate::cpu::assert_same_bits(&results, &format!("{n} logits"));
        }
    }

    /// Tiled log-probs against whole rows in f64 (from the same ln_f output), at tiles that cut
    /// rows and vocabulary unevenly (a last pass of one row, a last block of one column), one
    /// tile for all, and the default tiles with two passes of rows (302 + 301) and a partial
    /// last block.
    /// (The remainders are asserted: a wrong target offset in a partial later pass once passed
    /// here because the row count divided evenly and stayed under one default pass.)
    #[test]
    fn a_target_outside_the_vocabulary_is_refused() {
        let config = GptjConfig::small(1, 8, 2, 4, 20);
        let w = CpuWeights::from_owned(&config, GptjWeights::random(&config, 5, DType::F32));
        let x = vec![0.5f32; 8];
        let eps = config.layer_norm_epsilon as f32;
        let probe = |targets: &[(u32, u32)], tiles| {
            std::panic::catch_unwind(|| {
                log_probs_at(&x, &[0], targets, &w, [8, 20], eps, tiles);
            })
            .is_err()
        };
        assert!(!probe(&[(0, 19)], TILES));
        // Token 20 matched no block and read as a logit of 0; row 1 does not exist.
        assert!(probe(&[(0, 20)], TILES));
        assert!(probe(&[(1, 3)], TILES));
        assert!(probe(&[(0, 3)], [0, 100]));
    }

    #[test]
    fn tiles_match_whole_rows() {
        let (d, vocab, n_tokens) = (16, 2 * VOCAB_BLOCK + 53, 2 * 603);
        let n_rows = n_tokens / 2;
        assert_eq!(
            (n_rows % 7, vocab % 100),
            (1, 1),
            "one row, one column left over"
        );
        assert!(n_rows > HEAD_ROWS && n_rows % HEAD_ROWS > 1 && vocab % VOCAB_BLOCK > 1);
        assert!(n_rows < 1000 && vocab < 5000);
        let config = GptjConfig::small(1, d, 2, 4, vocab);
        let w = CpuWeights::from_owned(&config, GptjWeights::random(&config, 5, DType::F32));
        let eps = config.layer_norm_epsilon as f32;
        let mut rng = Rng::new(6);
        let x: Vec<f32> = (0..n_tokens * d).map(|_| 3.0 * rng.normal()).collect();
        // Every other token is a head row; each has 1-3 targets, block edges included.
        let head_rows: Vec<u32> = (0..n_tokens as u32).step_by(2).collect();
        let edges = [0, 1, VOCAB_BLOCK - 1, VOCAB_BLOCK, vocab - 1];
        let targets: Vec<Target> = (0..head_rows.len())
            .flat_map(|r| (0..1 + r % 3).map(move |t| (r, t)))
            .map(|(r, t)| Target {
                head_row: r as u32,
                token: (if t == 1 {
                    edges[r % edges.len()]
                } else {
                    (r * 7919 + t) % vocab
                }) as u32,
                weight: 1.0,
                slot: 0,
            })
            .collect();
        let plan = Plan {
            head_rows,
            targets,
            ..Plan::default()
        };
        let want: Vec<f64> = plan
            .targets
            .iter()
            .map(|t| {
                let r = plan.head_rows[t.head_row as usize] as usize;
                let mut h = vec![0f32; d];
                layer_norm_row(&x[r * d..][..d], &w.ln_f, eps, &mut h);
                let logits: Vec<f64> = (0..vocab)
                    .map(|j| {
                        let dot = (0..d).map(|p| h[p] as f64 * w.lm_head[p * vocab + j] as f64);
                        dot.sum::<f64>() + w.lm_head_b[j] as f64
                    })
                    .collect();
                let max = logits.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(l));
                let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
                logits[t.token as usize] - lse
            })
            .collect();
        for tiles in [[7, 100], [1000, 5000], [HEAD_ROWS, VOCAB_BLOCK]] {
            let pairs: Vec<(u32, u32)> =
                plan.targets.iter().map(|t| (t.head_row, t.token)).collect();
            let got = log_probs_at(&x, &plan.head_rows, &pairs, &w, [d, vocab], eps, tiles);
            for (k, (g, e)) in got.iter().zip(&want).enumerate() {
                // f32 logits (16-term dot products of O(1) values) and f32 exponentials: ~1e-6
                // off; 1e-4 is far below a wrong block offset or a dropped block (O(0.1-10)).
                assert!(
                    (g - e).abs() < 1e-4,
                    "tiles {tiles:?} target {k}: {g} vs {e}"
                );
            }
        }
    }
}
