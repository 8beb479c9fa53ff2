//! The kernel fuzz cases shared by the GPU tests (tests/cuda_kernels.rs) and the host emulator's
//! (tests/emu_kernels.rs): per kernel a Problem (its proptest strategy and GPT-J's real shapes),
//! the random non-zero inputs it stands for, and the check of a kernel's output against the CPU
//! reference with the tolerances below. The runners only move data and launch.
//!
//! Tolerances, with u the unit roundoff of the storage type (2^-8 bf16, 2^-11 f16):
//! - outputs stored in T carry one rounding: u * |want| on top of the f32 budget;
//! - f32 reductions (LayerNorm statistics, log-sum-exp) differ from the CPU's only in summation
//!   order: 1e-4 absolute on O(1) values, 2e-5 + 1e-6 relative for log-probs;
//! - attention: P is rounded to T before P.V while l sums unrounded p (<= 2u max|v| together),
//!   plus the output rounding u |want|.
#![allow(dead_code)]

use std::sync::Arc;

use proptest::prelude::*;
use toolsift::cpu::weights::CpuLayerNorm;
use toolsift::cpu::{attention, ops};
use toolsift::cuda::tree_attention::TreeTiles;
use toolsift::cuda::{stride, CudaDType, DeviceFloat};
use toolsift::plan::Plan;
use toolsift::score::LossWeights;
use toolsift::util::rng::Rng;
use toolsift::{Placement, ScoreOptions, TokenCandidate};

use crate::cuda_common::{compare, random_vec};

pub type R = Result<(), TestCaseError>;

pub fn to_t<T: DeviceFloat>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

pub fn widen<T: DeviceFloat>(v: &[T]) -> Vec<f32> {
    v.iter().map(|&x| x.to_f32()).collect()
}

pub fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Rows `0..n` of an output buffer with row stride `ld`, filled with `fill` before the launch,
/// still hold `fill` past their width `d`: a kernel writes its rows' first `d` columns and nothing
/// else (a loop bound off by one writes the padding, which the comparison never reads).
pub fn padding_untouched(what: &str, v: &[f32], n: usize, d: usize, ld: usize, fill: f32) -> R {
    for r in 0..n {
        for c in d..ld {
            let x = v[r * ld + c];
            if x != fill {
                return Err(TestCaseError::fail(format!(
                    "{what}: row {r}, column {c} (padding past the width {d}) was written: {x}"
                )));
            }
        }
    }
    Ok(())
}

/// Rows `0..n` of width `d` out of a buffer with row stride `ld`, as f64.
pub fn rows_f64(v: &[f32], n: usize, d: usize, ld: usize) -> Vec<f64> {
    (0..n).flat_map(|r| f64s(&v[r * ld..r * ld + d])).collect()
}

/// Awkward widths around warp/block edges, plus GPT-J's.
pub fn width() -> impl Strategy<Value = usize> {
    prop_oneof![
        prop::sample::select(vec![
            1usize, 7, 31, 32, 33, 63, 65, 255, 257, 783, 1026, 4096
        ]),
        1usize..3000,
    ]
}

pub fn dtype() -> impl Strategy<Value = CudaDType> {
    prop::sample::select(vec![CudaDType::BF16, CudaDType::F16])
}

pub fn u(dt: CudaDType) -> f64 {
    dt.unit_roundoff()
}

// ---------------------------------------------------------------------------------------------

/// An output row padding for an input's `ld_pad` in 0..9 that is never equal to it: kernels
/// that take an input and an output stride are checked with the two apart.
pub fn other_pad(ld_pad: usize) -> usize {
    (ld_pad + 3) % 9
}

#[derive(Debug, Clone)]
pub struct EmbeddingProblem {
    pub dtype: CudaDType,
    pub vocab: usize,
    pub d: usize,
    pub ld_pad: usize,
    pub n: usize,
    pub seed: u64,
}

pub fn embedding_problems() -> impl Strategy<Value = EmbeddingProblem> {
    (
        dtype(),
        1usize..300,
        width(),
        0usize..9,
        1usize..20,
        any::<u64>(),
    )
        .prop_map(|(dtype, vocab, d, ld_pad, n, seed)| EmbeddingProblem {
            dtype,
            vocab,
            d,
            ld_pad,
            n,
            seed,
        })
}

/// A [vocab, d] table with row stride ld and n token ids; x has row stride ld_x, never ld (the
/// kernel must not read one stride for the other).
pub struct EmbeddingCase<T> {
    pub ld: usize,
    pub ld_x: usize,
    pub wte: Vec<T>,
    pub ids: Vec<u32>,
}

impl<T: DeviceFloat> EmbeddingCase<T> {
    pub fn new(p: &EmbeddingProblem) -> Self {
        let ld = p.d + p.ld_pad;
        let ld_x = p.d + other_pad(p.ld_pad);
        let wte = to_t(&random_vec(p.seed, p.vocab * ld, 2.0));
        let mut rng = Rng::new(p.seed ^ 1);
        let ids = (0..p.n).map(|_| rng.range(0, p.vocab - 1) as u32).collect();
        EmbeddingCase { ld, ld_x, wte, ids }
    }

    /// `x`: the kernel's [n, ld_x] output.
    pub fn check(&self, p: &EmbeddingProblem, x: &[f32]) -> R {
        let ld = self.ld;
        let dense: Vec<f32> = (0..p.vocab)
            .flat_map(|r| widen(&self.wte[r * ld..r * ld + p.d]))
            .collect();
        let mut want = vec![0f32; p.n * p.d];
        ops::embed(&dense, &self.ids, p.d, &mut want);
        compare(
            "embedding",
            &rows_f64(x, p.n, p.d, self.ld_x),
            &f64s(&want),
            0.0,
            0.0,
            None,
        )?;
        padding_untouched("embedding", x, p.n, p.d, self.ld_x, 0.0)
    }
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct LayerNormProblem {
    pub dtype: CudaDType,
    pub d: usize,
    pub n_x: usize,
    /// 0: all rows, no residual bias; 1: all rows with residual bias (written back);
    /// 2: gathered rows with residual bias (x untouched).
    pub mode: u8,
    pub block: Option<u32>,
    pub seed: u64,
    /// x is uniform in +-x_scale: 3, or 0.003 (variance ~3e-6, below eps = 1e-5, which then
    /// sets the scale of the output: a kernel that drops eps or adds it outside the root fails).
    pub x_scale: f32,
}

pub fn layer_norm_problems(blocks: &[u32]) -> impl Strategy<Value = LayerNormProblem> {
    let block = prop_oneof![
        Just(None),
        prop::sample::select(blocks.to_vec()).prop_map(Some)
    ];
    let x_scale = prop_oneof![3 => Just(3.0f32), 1 => Just(0.003f32)];
    (
        dtype(),
        width(),
        1usize..7,
        0u8..3,
        block,
        any::<u64>(),
        x_scale,
    )
        .prop_map(
            |(dtype, d, n_x, mode, block, seed, x_scale)| LayerNormProblem {
                dtype,
                d,
                n_x,
                mode,
                block,
                seed,
                x_scale,
            },
        )
}

/// GPT-J's ln_1 / ln_f width at one block size.
pub fn layer_norm_gptj(block: u32) -> LayerNormProblem {
    LayerNormProblem {
        dtype: CudaDType::BF16,
        d: 4096,
        n_x: 5,
        mode: 1,
        block: Some(block),
        seed: 9,
        x_scale: 3.0,
    }
}

/// Rows of near-constant values (variance ~3e-6, below eps) at GPT-J's width, no residual bias
/// (which would add its own variance): where eps matters.
pub fn layer_norm_flat(block: u32) -> LayerNormProblem {
    LayerNormProblem {
        mode: 0,
        x_scale: 0.003,
        ..layer_norm_gptj(block)
    }
}

/// x [n_x, ld] f32, the residual bias, the norm, and the rows normalised (n of them).
pub struct LayerNormCase {
    /// x's row stride.
    pub ld: usize,
    /// The output's row stride: apart from `ld`.
    pub ld_out: usize,
    pub x: Vec<f32>,
    pub residual_bias: Vec<f32>,
    pub ln: CpuLayerNorm,
    pub rows: Vec<u32>,
}

impl LayerNormCase {
    pub const EPS: f32 = 1e-5;

    pub fn new(p: &LayerNormProblem) -> Self {
        let (d, ld) = (p.d, stride(p.d));
        let x = random_vec(p.seed, p.n_x * ld, p.x_scale);
        let residual_bias = random_vec(p.seed ^ 2, d, 0.5);
        let ln = CpuLayerNorm {
            weight: random_vec(p.seed ^ 3, d, 1.5),
            bias: random_vec(p.seed ^ 4, d, 0.5),
        };
        let mut rng = Rng::new(p.seed ^ 5);
        let rows: Vec<u32> = match p.mode {
            2 => {
                let mut r: Vec<u32> = (0..p.n_x as u32).filter(|_| rng.range(0, 1) == 0).collect();
                if r.is_empty() {
                    r.push(p.n_x as u32 - 1);
                }
                r
            }
            _ => (0..p.n_x as u32).collect(),
        };
        LayerNormCase {
            ld,
            ld_out: ld + 5,
            x,
            residual_bias,
            ln,
            rows,
        }
    }

    /// `out`: the kernel's [rows, ld_out] output widened to f32; `x_after`: x after the launch.
    pub fn check(&self, p: &LayerNormProblem, dt: CudaDType, out: &[f32], x_after: &[f32]) -> R {
        let (d, ld) = (p.d, self.ld);
        let (mut want, mut x_want) = (Vec::new(), self.x.clone());
        for &r in &self.rows {
            let r = r as usize;
            let mut row = self.x[r * ld..r * ld + d].to_vec();
            if p.mode >= 1 {
                row.iter_mut()
                    .zip(&self.residual_bias)
                    .for_each(|(v, b)| *v += b);
            }
            if p.mode == 1 {
                x_want[r * ld..r * ld + d].copy_from_slice(&row);
            }
            let mut o = vec![0f32; d];
            ops::layer_norm_row(&row, &self.ln, Self::EPS, &mut o);
            want.extend(o);
        }
        compare(
            "layer_norm out",
            &rows_f64(out, self.rows.len(), d, self.ld_out),
            &f64s(&want),
            1e-4,
            u(dt),
            None,
        )?;
        padding_untouched("layer_norm out", out, self.rows.len(), d, self.ld_out, 0.0)?;
        compare(
            "layer_norm x",
            &f64s(x_after),
            &f64s(&x_want),
            0.0,
            0.0,
            None,
        )
        .map(|_| ())
    }
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct RotaryProblem {
    pub dtype: CudaDType,
    pub n: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub n_positions: usize,
    pub seed: u64,
}

pub fn rotary_problems() -> impl Strategy<Value = RotaryProblem> {
    (
        dtype(),
        1usize..40,
        1usize..6,
        1usize..40,
        0usize..20,
        1usize..300,
        any::<u64>(),
    )
        .prop_map(
            |(dtype, n, n_head, head_dim, rot, n_positions, seed)| RotaryProblem {
                dtype,
                n,
                n_head,
                head_dim,
                rotary_dim: (2 * rot).min(head_dim - head_dim % 2),
                n_positions,
                seed,
            },
        )
}

pub fn rotary_gptj() -> RotaryProblem {
    RotaryProblem {
        dtype: CudaDType::BF16,
        n: 7,
        n_head: 16,
        head_dim: 256,
        rotary_dim: 64,
        n_positions: 2048,
        seed: 3,
    }
}

/// qkv [n, l3] f32 (q, k, v side by side), positions, and the sin/cos table; outputs [n, ld].
pub struct RotaryCase {
    pub ld: usize,
    pub l3: usize,
    pub qkv: Vec<f32>,
    pub positions: Vec<u32>,
    pub table: toolsift::model::rotary::RotaryTable,
}

impl RotaryCase {
    pub fn new(p: &RotaryProblem) -> Self {
        let d = p.n_head * p.head_dim;
        let (ld, l3) = (stride(d), stride(3 * d));
        let qkv = random_vec(p.seed, p.n * l3, 2.0);
        let mut rng = Rng::new(p.seed ^ 7);
        let positions = (0..p.n)
            .map(|_| rng.range(0, p.n_positions - 1) as u32)
            .collect();
        let table = toolsift::model::rotary::RotaryTable::new(p.n_positions, p.rotary_dim);
        RotaryCase {
            ld,
            l3,
            qkv,
            positions,
            table,
        }
    }

    /// `q`, `k`, `v`: the kernel's [n, ld] outputs widened to f32.
    pub fn check(&self, p: &RotaryProblem, dt: CudaDType, [q, k, v]: [&[f32]; 3]) -> R {
        let d = p.n_head * p.head_dim;
        let mut dense: Vec<f32> = (0..p.n)
            .flat_map(|r| self.qkv[r * self.l3..r * self.l3 + 3 * d].to_vec())
            .collect();
        ops::rotary_qk(
            &mut dense,
            &self.positions,
            &self.table,
            p.n_head,
            p.head_dim,
        );
        for (name, got, off) in [("q", q, 0), ("k", k, d), ("v", v, 2 * d)] {
            let want: Vec<f64> = (0..p.n)
                .flat_map(|r| f64s(&dense[r * 3 * d + off..r * 3 * d + off + d]))
                .collect();
            compare(
                &format!("rotary {name}"),
                &rows_f64(got, p.n, d, self.ld),
                &want,
                1e-5,
                u(dt),
                None,
            )?;
            padding_untouched(&format!("rotary {name}"), got, p.n, d, self.ld, 0.0)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct GeluProblem {
    pub dtype: CudaDType,
    pub n: usize,
    pub f: usize,
    pub ld_pad: usize,
    pub grid: Option<u32>,
    pub seed: u64,
}

pub fn gelu_problems() -> impl Strategy<Value = GeluProblem> {
    let grid = prop_oneof![Just(None), Just(Some(1u32)), Just(Some(3u32))];
    (dtype(), 1usize..9, width(), 0usize..9, grid, any::<u64>()).prop_map(
        |(dtype, n, f, ld_pad, grid, seed)| GeluProblem {
            dtype,
            n,
            f,
            ld_pad,
            grid,
            seed,
        },
    )
}

pub fn gelu_gptj() -> GeluProblem {
    GeluProblem {
        dtype: CudaDType::BF16,
        n: 3,
        f: 16384,
        ld_pad: 0,
        grid: None,
        seed: 5,
    }
}

/// x [n, ld] in T (updated in place on columns < f) and the fc_in bias.
pub struct GeluCase<T> {
    pub ld: usize,
    pub x: Vec<T>,
    pub bias: Vec<f32>,
}

impl<T: DeviceFloat> GeluCase<T> {
    pub fn new(p: &GeluProblem) -> Self {
        let ld = p.f + p.ld_pad;
        GeluCase {
            ld,
            x: to_t(&random_vec(p.seed, p.n * ld, 4.0)),
            bias: random_vec(p.seed ^ 1, p.f, 0.5),
        }
    }

    /// `got`: x after the launch, widened to f32.
    pub fn check(&self, p: &GeluProblem, got: &[f32]) -> R {
        let ld = self.ld;
        let mut want: Vec<f32> = (0..p.n)
            .flat_map(|r| widen(&self.x[r * ld..r * ld + p.f]))
            .collect();
        ops::bias_gelu_new(&mut want, &self.bias);
        compare(
            "gelu",
            &rows_f64(got, p.n, p.f, ld),
            &f64s(&want),
            1e-6,
            u(T::DTYPE),
            None,
        )?;
        // Padding columns are untouched.
        for r in 0..p.n {
            for c in p.f..ld {
                prop_assert_eq!(got[r * ld + c], self.x[r * ld + c].to_f32());
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct XentProblem {
    pub rows: usize,
    pub vocab: usize,
    pub ld_pad: usize,
    pub logit_scale: f32,
    pub block: Option<u32>,
    pub seed: u64,
    /// The first `masked` tokens have bias -inf (masked out; none is a target): each thread's
    /// first logits are then -inf, which its running (max, sum) must skip, not turn into NaN.
    pub masked: usize,
}

pub fn xent_problems(blocks: &[u32]) -> impl Strategy<Value = XentProblem> {
    let block = prop_oneof![
        Just(None),
        prop::sample::select(blocks.to_vec()).prop_map(Some)
    ];
    let vocab = prop_oneof![
        prop::sample::select(vec![1usize, 2, 31, 32, 33, 1000, 1025, 50400]),
        1usize..5000
    ];
    (
        1usize..6,
        vocab,
        0usize..9,
        prop::sample::select(vec![0.1f32, 3.0, 20.0, 100.0]),
        block,
        any::<u64>(),
    )
        .prop_map(
            |(rows, vocab, ld_pad, logit_scale, block, seed)| XentProblem {
                rows,
                vocab,
                ld_pad,
                logit_scale,
                block,
                seed,
                masked: 0,
            },
        )
}

/// GPT-J's vocabulary at one block size.
pub fn xent_gptj(block: u32) -> XentProblem {
    XentProblem {
        rows: 4,
        vocab: 50400,
        ld_pad: 0,
        logit_scale: 20.0,
        block: Some(block),
        seed: 11,
        masked: 0,
    }
}

/// Logits in +-100 at one block size: exp overflows f32 past 88, so a log-sum-exp that does not
/// subtract the row's max comes out inf.
pub fn xent_large_logits(block: u32) -> XentProblem {
    XentProblem {
        rows: 3,
        vocab: 2000,
        logit_scale: 100.0,
        seed: 13,
        ..xent_gptj(block)
    }
}

/// Rows whose first 1500 of 3000 tokens are masked (-inf), at one block size: every thread's
/// first elements are -inf.
pub fn xent_masked(block: u32) -> XentProblem {
    XentProblem {
        rows: 3,
        vocab: 3000,
        ld_pad: 1,
        logit_scale: 3.0,
        block: Some(block),
        seed: 12,
        masked: 1500,
    }
}

/// logits [rows, ld] f32 without the bias; 0..4 targets per row (rows without targets
/// included), or in one row of four 1025..2100 (more than any block's threads), at scattered
/// output slots; full log-softmax rows out with stride ld_out, never ld.
pub struct XentCase {
    pub ld: usize,
    pub ld_out: usize,
    pub logits: Vec<f32>,
    pub bias: Vec<f32>,
    pub offsets: Vec<u32>,
    pub tokens: Vec<u32>,
    pub slots: Vec<u32>,
}

impl XentCase {
    pub fn new(p: &XentProblem) -> Self {
        let ld = p.vocab + p.ld_pad;
        let logits = random_vec(p.seed, p.rows * ld, p.logit_scale);
        let mut bias = random_vec(p.seed ^ 1, p.vocab, 1.0);
        bias[..p.masked].fill(f32::NEG_INFINITY);
        let mut rng = Rng::new(p.seed ^ 2);
        let mut offsets = vec![0u32];
        let mut tokens = Vec::new();
        for _ in 0..p.rows {
            // One row in four with more targets than a block has threads (up to 1024), so that
            // the kernel's per-row target loop goes round more than once.
            let n = if rng.range(0, 3) == 0 {
                rng.range(1025, 2100)
            } else {
                rng.range(0, 4)
            };
            for _ in 0..n {
                tokens.push(rng.range(p.masked, p.vocab - 1) as u32);
            }
            offsets.push(tokens.len() as u32);
        }
        let n_t = tokens.len();
        let mut slots: Vec<u32> = (0..n_t as u32).collect();
        for i in (1..n_t).rev() {
            slots.swap(i, rng.range(0, i));
        }
        XentCase {
            ld,
            ld_out: p.vocab + other_pad(p.ld_pad),
            logits,
            bias,
            offsets,
            tokens,
            slots,
        }
    }

    /// Row r's log-softmax in f64.
    fn log_softmax(&self, p: &XentProblem, r: usize) -> Vec<f64> {
        let row: Vec<f64> = (0..p.vocab)
            .map(|v| self.logits[r * self.ld + v] as f64 + self.bias[v] as f64)
            .collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        row.iter().map(|x| x - lse).collect()
    }

    /// `got`: lm_head_xent's output (one log-prob per target slot).
    pub fn check(&self, p: &XentProblem, got: &[f32]) -> R {
        let mut want = vec![0f64; self.tokens.len()];
        for r in 0..p.rows {
            let lp = self.log_softmax(p, r);
            for t in self.offsets[r] as usize..self.offsets[r + 1] as usize {
                want[self.slots[t] as usize] = lp[self.tokens[t] as usize];
            }
        }
        compare(
            "lm_head_xent",
            &f64s(&got[..want.len()]),
            &want,
            2e-5,
            1e-6,
            None,
        )
        .map(|_| ())
    }

    /// `got`: log_softmax's [rows, ld_out] output.
    pub fn check_log_softmax(&self, p: &XentProblem, got: &[f32], ld_out: usize) -> R {
        let want: Vec<f64> = (0..p.rows).flat_map(|r| self.log_softmax(p, r)).collect();
        compare(
            "log_softmax",
            &rows_f64(got, p.rows, p.vocab, ld_out),
            &want,
            2e-5,
            1e-6,
            None,
        )?;
        padding_untouched("log_softmax", got, p.rows, p.vocab, ld_out, 0.0)
    }
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct AttentionProblem {
    pub dtype: CudaDType,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_texts: usize,
    pub max_text: usize,
    pub inline: bool,
    pub vocab: usize,
    pub seed: u64,
    /// q and k are uniform in +-qk_scale: 2 gives scores ~N(0, 1.3); 17, one case in four,
    /// scores ~N(0, 100), past where exp overflows f32 (the online softmax must track its max).
    pub qk_scale: f32,
}

pub fn attention_problems(
    n_heads: std::ops::Range<usize>,
    max_texts: Vec<usize>,
) -> impl Strategy<Value = AttentionProblem> {
    let head_dim = prop_oneof![
        prop::sample::select(vec![1usize, 3, 8, 16, 17, 24, 64, 100, 128, 256]),
        1usize..257
    ];
    (
        dtype(),
        n_heads,
        head_dim,
        1usize..4,
        prop::sample::select(max_texts),
        any::<bool>(),
        any::<u64>(),
        prop_oneof![3 => Just(2.0f32), 1 => Just(17.0f32)],
    )
        .prop_map(
            |(dtype, n_head, head_dim, n_texts, max_text, inline, seed, qk_scale)| {
                AttentionProblem {
                    dtype,
                    n_head,
                    head_dim,
                    n_texts,
                    max_text,
                    inline,
                    vocab: 13,
                    seed,
                    qk_scale,
                }
            },
        )
}

/// GPT-J's heads (16 of 256, or fewer), a few hundred tokens of real tree structure.
pub fn attention_gptj(n_head: usize, inline: bool) -> AttentionProblem {
    AttentionProblem {
        dtype: CudaDType::BF16,
        n_head,
        head_dim: 256,
        n_texts: 2,
        max_text: 150,
        inline,
        vocab: 50,
        seed: 21,
        qk_scale: 2.0,
    }
}

/// One head of 40 with q and k in +-17 (scores ~N(0, 100), the random problems' sharp case) on
/// GPT-J-like tree structure: exp of an unshifted score overflows f32, so every max subtraction
/// of the online softmax and of decode_attention's merge of its warps is needed. 40 pads to 48,
/// less than the mma kernel's HD_MAX (64): its loops over dims must stop at the padded width.
pub fn attention_sharp() -> AttentionProblem {
    AttentionProblem {
        head_dim: 40,
        qk_scale: 17.0,
        ..attention_gptj(1, false)
    }
}

/// A random plan from random candidates: shared prefixes, branches, single-token segments,
/// segments and contexts longer than one 64-row tile when texts are long.
pub fn random_plan(p: &AttentionProblem) -> Plan {
    let mut rng = Rng::new(p.seed);
    let v = p.vocab;
    let mut cands = Vec::new();
    for _ in 0..p.n_texts {
        let n = rng.range(2, p.max_text);
        let text: Arc<[u32]> = (0..n).map(|_| rng.range(0, v - 1) as u32).collect();
        for _ in 0..rng.range(1, 4) {
            let position = rng.range(1, n - 1);
            let call: Vec<u32> = (0..rng.range(1, 6))
                .map(|_| rng.range(0, v - 1) as u32)
                .collect();
            let res: Vec<u32> = (0..rng.range(0, 4))
                .map(|_| rng.range(0, v - 1) as u32)
                .collect();
            cands.push(TokenCandidate {
                text_ids: text.clone(),
                position,
                call_ids: [&call[..], &[1]].concat(),
                call_result_ids: [&call[..], &[2], &res, &[1]].concat(),
                weights: None,
            });
        }
    }
    let options = ScoreOptions {
        placement: if p.inline {
            Placement::Inline
        } else {
            Placement::Prefix
        },
        weights: LossWeights::default(),
    };
    Plan::build(&cands, &options)
}

/// A random plan, q / k / v [n, ld] in T (rotated, as the kernels read them), the CPU engine's
/// tree attention on the same values, and both tile layouts of the plan (one tile per segment;
/// small subtrees packed).
pub struct AttentionCase<T> {
    pub plan: Plan,
    /// q, k and v's row stride.
    pub ld: usize,
    /// The output's row stride: apart from `ld` (every store is scalar, so any stride works).
    pub ld_out: usize,
    pub qkv: [Vec<T>; 3],
    pub want: Vec<f32>,
    pub max_v: f64,
    pub layouts: [TreeTiles; 2],
}

impl<T: DeviceFloat> AttentionCase<T> {
    /// What the output buffer holds before a launch: far from any output (|out| <= max |v| = 2)
    /// and exact in both 16-bit types.
    pub const OUT_FILL: f32 = 1000.0;

    /// The [n, ld_out] output buffer's contents before a launch.
    pub fn out_init(&self) -> Vec<T> {
        vec![T::from_f32(Self::OUT_FILL); self.plan.n_tokens() * self.ld_out]
    }

    pub fn new(p: &AttentionProblem) -> Self {
        let plan = random_plan(p);
        let (nh, hd) = (p.n_head, p.head_dim);
        let d = nh * hd;
        let n = plan.n_tokens();
        let ld = stride(d);
        let scale = [p.qk_scale, p.qk_scale, 2.0];
        let qkv: [Vec<T>; 3] =
            std::array::from_fn(|i| to_t(&random_vec(p.seed ^ (10 + i as u64), n * ld, scale[i])));
        let mut dense = vec![0f32; n * 3 * d];
        for r in 0..n {
            for (i, m) in qkv.iter().enumerate() {
                dense[r * 3 * d + i * d..r * 3 * d + (i + 1) * d]
                    .copy_from_slice(&widen(&m[r * ld..r * ld + d]));
            }
        }
        let mut want = vec![0f32; n * d];
        attention::tree_attention(&plan, &dense, nh, hd, &mut want);
        let max_v = qkv[2].iter().map(|x| x.to_f32().abs()).fold(0f32, f32::max) as f64;
        let layouts = [
            TreeTiles::from_plan_unpacked(&plan, 0),
            TreeTiles::from_plan(&plan, 0),
        ];
        AttentionCase {
            plan,
            ld,
            ld_out: ld + 5,
            qkv,
            want,
            max_v,
            layouts,
        }
    }

    /// `got`: an attention kernel's [n, ld_out] output widened to f32; `what` names the launch.
    pub fn check(&self, p: &AttentionProblem, what: &str, got: &[f32]) -> R {
        let d = p.n_head * p.head_dim;
        let n = self.plan.n_tokens();
        let uu = u(T::DTYPE);
        compare(
            &format!("{what} ({n} tokens, {} segments)", self.plan.segments.len()),
            &rows_f64(got, n, d, self.ld_out),
            &f64s(&self.want),
            2.0 * uu * self.max_v + 1e-5,
            uu,
            None,
        )?;
        // Past the last head's columns: a store loop one column too long writes the next head's
        // first column there (overwritten by that head's block, in whatever order they run), with
        // the zero of a padding dim, hence the fill.
        padding_untouched(what, got, n, d, self.ld_out, Self::OUT_FILL)
    }
}
