//! Every CUDA kernel against its CPU reference (STYLE.md 7), through proptest Problems: random
//! non-zero data, awkward sizes that straddle warp (32) and block edges, GPT-J-6B's real sizes
//! (n_embd 4096, 16 heads of 256 with rotary 64, n_inner 16384, vocab 50400), both 16-bit types,
//! and every launch configuration the launcher can pick (block sizes, grid caps, attention
//! variants, GEMM operand alignments).
//!
//! Without a GPU (or without kernels / CUDA libraries) each test prints "SKIPPED: ..." and
//! returns. TOOLSIFT_FUZZ_CASES raises the case count (scripts/gpu-check.sh does).
//!
//! Tolerances, with u the unit roundoff of the storage type (2^-8 bf16, 2^-11 f16):
//! - outputs stored in T carry one rounding: u * |want| on top of the f32 budget;
//! - f32 reductions (LayerNorm statistics, log-sum-exp) differ from the CPU's only in summation
//!   order: 1e-4 absolute on O(1) values, 2e-5 + 1e-6 relative for log-probs;
//! - GEMMs: f32 accumulation in a different order, bounded by 2e-5 * sum_k |a_ik w_jk|;
//! - attention: P is rounded to T before P.V while l sums unrounded p (<= 2u max|v| together),
//!   plus the output rounding u |want|.
#![cfg(feature = "cuda")]

mod cuda_common;

use std::sync::Arc;

use cuda_common::{compare, fuzz, gpu, random_vec};
use half::{bf16, f16};
use proptest::prelude::*;
use toolsift::cpu::weights::CpuLayerNorm;
use toolsift::cpu::{attention, gemm as cpu_gemm, ops};
use toolsift::cuda::cudarc::driver::CudaSlice;
use toolsift::cuda::layer_norm::Rows;
use toolsift::cuda::rotary::RotaryShape;
use toolsift::cuda::tree_attention::{AttentionShape, AttentionVariant, TreeTiles};
use toolsift::cuda::{
    embedding, gelu, layer_norm, lm_head_xent, rotary, stride, tree_attention, CudaDType,
    DeviceFloat, Gpu,
};
use toolsift::plan::Plan;
use toolsift::score::LossWeights;
use toolsift::util::rng::Rng;
use toolsift::{Placement, ScoreOptions, TokenCandidate};

type R = Result<(), TestCaseError>;

fn up<T: toolsift::cuda::cudarc::driver::DeviceRepr + Clone + Default>(
    gpu: &Gpu,
    v: &[T],
) -> CudaSlice<T> {
    let v = if v.is_empty() {
        vec![T::default()]
    } else {
        v.to_vec()
    };
    gpu.stream.clone_htod(&v).expect("upload")
}

fn down<T: toolsift::cuda::cudarc::driver::DeviceRepr + Default + Clone>(
    gpu: &Gpu,
    s: &CudaSlice<T>,
) -> Vec<T> {
    let v = gpu.stream.clone_dtoh(s).expect("download");
    gpu.sync().expect("kernel ran");
    v
}

fn to_t<T: DeviceFloat>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

fn widen<T: DeviceFloat>(v: &[T]) -> Vec<f32> {
    v.iter().map(|&x| x.to_f32()).collect()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Awkward widths around warp/block edges, plus GPT-J's.
fn width() -> impl Strategy<Value = usize> {
    prop_oneof![
        prop::sample::select(vec![
            1usize, 7, 31, 32, 33, 63, 65, 255, 257, 783, 1026, 4096
        ]),
        1usize..3000,
    ]
}

fn dtype() -> impl Strategy<Value = CudaDType> {
    prop::sample::select(vec![CudaDType::BF16, CudaDType::F16])
}

fn u(dt: CudaDType) -> f64 {
    dt.unit_roundoff()
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct EmbeddingProblem {
    dtype: CudaDType,
    vocab: usize,
    d: usize,
    ld_pad: usize,
    n: usize,
    seed: u64,
}

fn embedding_run<T: DeviceFloat>(gpu: &Gpu, p: &EmbeddingProblem) -> R {
    let ld = p.d + p.ld_pad;
    let wte_f = random_vec(p.seed, p.vocab * ld, 2.0);
    let wte: Vec<T> = to_t(&wte_f);
    let mut rng = Rng::new(p.seed ^ 1);
    let ids: Vec<u32> = (0..p.n).map(|_| rng.range(0, p.vocab - 1) as u32).collect();
    let (wte_d, ids_d) = (up(gpu, &wte), up(gpu, &ids));
    let mut x = gpu.stream.alloc_zeros::<f32>(p.n * ld).unwrap();
    embedding::embedding(
        gpu,
        &ids_d.as_view(),
        &wte_d.as_view(),
        p.vocab,
        &mut x.as_view_mut(),
        [p.n, p.d, ld, ld],
    )
    .unwrap();
    let got = down(gpu, &x);
    // Reference on the dense [vocab, d] table.
    let dense: Vec<f32> = (0..p.vocab)
        .flat_map(|r| widen(&wte[r * ld..r * ld + p.d]))
        .collect();
    let mut want = vec![0f32; p.n * p.d];
    ops::embed(&dense, &ids, p.d, &mut want);
    let got: Vec<f32> = (0..p.n)
        .flat_map(|r| got[r * ld..r * ld + p.d].to_vec())
        .collect();
    compare("embedding", &f64s(&got), &f64s(&want), 0.0, 0.0, None).map(|_| ())
}

#[test]
fn embedding_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let strategy = (
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
        });
    fuzz("embedding", 32, strategy, |p| match p.dtype {
        CudaDType::BF16 => embedding_run::<bf16>(&gpu, &p),
        CudaDType::F16 => embedding_run::<f16>(&gpu, &p),
    });
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct LayerNormProblem {
    dtype: CudaDType,
    d: usize,
    n_x: usize,
    /// 0: all rows, no residual bias; 1: all rows with residual bias (written back);
    /// 2: gathered rows with residual bias (x untouched).
    mode: u8,
    block: Option<u32>,
    seed: u64,
}

fn layer_norm_run<T: DeviceFloat>(gpu: &Gpu, p: &LayerNormProblem) -> R {
    let (d, ld) = (p.d, stride(p.d));
    let x_host = random_vec(p.seed, p.n_x * ld, 3.0);
    let rb = random_vec(p.seed ^ 2, d, 0.5);
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
    let n = rows.len();
    let mut x = up(gpu, &x_host);
    let (rb_d, rows_d) = (up(gpu, &rb), up(gpu, &rows));
    let (w_d, b_d) = (up(gpu, &ln.weight), up(gpu, &ln.bias));
    let mut out = gpu.stream.alloc_zeros::<T>(n * ld).unwrap();
    let rb_v = rb_d.as_view();
    let rows_v = rows_d.as_view();
    layer_norm::layer_norm(
        gpu,
        &mut x.as_view_mut(),
        p.n_x,
        Rows {
            gather: (p.mode == 2).then_some(&rows_v),
            residual_bias: (p.mode >= 1).then_some(&rb_v),
        },
        &w_d.as_view(),
        &b_d.as_view(),
        &mut out.as_view_mut(),
        [n, d, ld, ld],
        1e-5,
        p.block,
    )
    .unwrap();
    let got = widen(&down(gpu, &out));
    let x_after = down(gpu, &x);
    let (mut want, mut got_rows, mut x_want) = (Vec::new(), Vec::new(), x_host.clone());
    for (i, &r) in rows.iter().enumerate() {
        let r = r as usize;
        let mut row = x_host[r * ld..r * ld + d].to_vec();
        if p.mode >= 1 {
            row.iter_mut().zip(&rb).for_each(|(v, b)| *v += b);
        }
        if p.mode == 1 {
            x_want[r * ld..r * ld + d].copy_from_slice(&row);
        }
        let mut o = vec![0f32; d];
        ops::layer_norm_row(&row, &ln, 1e-5, &mut o);
        want.extend(o);
        got_rows.extend_from_slice(&got[i * ld..i * ld + d]);
    }
    compare(
        "layer_norm out",
        &f64s(&got_rows),
        &f64s(&want),
        1e-4,
        u(T::DTYPE),
        None,
    )?;
    compare(
        "layer_norm x",
        &f64s(&x_after),
        &f64s(&x_want),
        0.0,
        0.0,
        None,
    )
    .map(|_| ())
}

#[test]
fn layer_norm_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let block = prop_oneof![
        Just(None),
        prop::sample::select(layer_norm::BLOCK_CHOICES.to_vec()).prop_map(Some)
    ];
    let strategy = (dtype(), width(), 1usize..7, 0u8..3, block, any::<u64>()).prop_map(
        |(dtype, d, n_x, mode, block, seed)| LayerNormProblem {
            dtype,
            d,
            n_x,
            mode,
            block,
            seed,
        },
    );
    fuzz("layer_norm", 48, strategy, |p| match p.dtype {
        CudaDType::BF16 => layer_norm_run::<bf16>(&gpu, &p),
        CudaDType::F16 => layer_norm_run::<f16>(&gpu, &p),
    });
    // GPT-J's ln_1 / ln_f width at every block size.
    for block in layer_norm::BLOCK_CHOICES {
        let p = LayerNormProblem {
            dtype: CudaDType::BF16,
            d: 4096,
            n_x: 5,
            mode: 1,
            block: Some(block),
            seed: 9,
        };
        layer_norm_run::<bf16>(&gpu, &p).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct RotaryProblem {
    dtype: CudaDType,
    n: usize,
    n_head: usize,
    head_dim: usize,
    rotary_dim: usize,
    n_positions: usize,
    seed: u64,
}

fn rotary_run<T: DeviceFloat>(gpu: &Gpu, p: &RotaryProblem) -> R {
    let d = p.n_head * p.head_dim;
    let (ld, l3) = (stride(d), stride(3 * d));
    let qkv_host = random_vec(p.seed, p.n * l3, 2.0);
    let mut rng = Rng::new(p.seed ^ 7);
    let positions: Vec<u32> = (0..p.n)
        .map(|_| rng.range(0, p.n_positions - 1) as u32)
        .collect();
    let table = ops::RotaryTable::new(p.n_positions, p.rotary_dim);
    let (qkv_d, pos_d) = (up(gpu, &qkv_host), up(gpu, &positions));
    let (cos_d, sin_d) = (up(gpu, &table.cos), up(gpu, &table.sin));
    let mut q = gpu.stream.alloc_zeros::<T>(p.n * ld).unwrap();
    let mut k = gpu.stream.alloc_zeros::<T>(p.n * ld).unwrap();
    let mut v = gpu.stream.alloc_zeros::<T>(p.n * ld).unwrap();
    rotary::rotary(
        gpu,
        &qkv_d.as_view(),
        &pos_d.as_view(),
        &cos_d.as_view(),
        &sin_d.as_view(),
        &mut q.as_view_mut(),
        &mut k.as_view_mut(),
        &mut v.as_view_mut(),
        RotaryShape {
            n: p.n,
            n_head: p.n_head,
            head_dim: p.head_dim,
            rotary_dim: p.rotary_dim,
            ld_qkv: l3,
            ld,
            n_positions: p.n_positions,
        },
    )
    .unwrap();
    // Reference: the CPU's rotary on a dense [n, 3d] copy.
    let mut dense: Vec<f32> = (0..p.n)
        .flat_map(|r| qkv_host[r * l3..r * l3 + 3 * d].to_vec())
        .collect();
    ops::rotary_qk(&mut dense, &positions, &table, p.n_head, p.head_dim);
    for (name, buf, off) in [("q", &q, 0), ("k", &k, d), ("v", &v, 2 * d)] {
        let got = widen(&down(gpu, buf));
        let got: Vec<f64> = (0..p.n)
            .flat_map(|r| f64s(&got[r * ld..r * ld + d]))
            .collect();
        let want: Vec<f64> = (0..p.n)
            .flat_map(|r| f64s(&dense[r * 3 * d + off..r * 3 * d + off + d]))
            .collect();
        compare(
            &format!("rotary {name}"),
            &got,
            &want,
            1e-5,
            u(T::DTYPE),
            None,
        )?;
    }
    Ok(())
}

#[test]
fn rotary_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let strategy = (
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
        );
    fuzz("rotary", 48, strategy, |p| match p.dtype {
        CudaDType::BF16 => rotary_run::<bf16>(&gpu, &p),
        CudaDType::F16 => rotary_run::<f16>(&gpu, &p),
    });
    let gptj = RotaryProblem {
        dtype: CudaDType::BF16,
        n: 7,
        n_head: 16,
        head_dim: 256,
        rotary_dim: 64,
        n_positions: 2048,
        seed: 3,
    };
    rotary_run::<bf16>(&gpu, &gptj).unwrap();
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct GeluProblem {
    dtype: CudaDType,
    n: usize,
    f: usize,
    ld_pad: usize,
    grid: Option<u32>,
    seed: u64,
}

fn gelu_run<T: DeviceFloat>(gpu: &Gpu, p: &GeluProblem) -> R {
    let ld = p.f + p.ld_pad;
    let x_host: Vec<T> = to_t(&random_vec(p.seed, p.n * ld, 4.0));
    let bias = random_vec(p.seed ^ 1, p.f, 0.5);
    let mut x = up(gpu, &x_host);
    let b = up(gpu, &bias);
    gelu::gelu(
        gpu,
        &mut x.as_view_mut(),
        &b.as_view(),
        [p.n, p.f, ld],
        p.grid,
    )
    .unwrap();
    let got = widen(&down(gpu, &x));
    let mut want: Vec<f32> = (0..p.n)
        .flat_map(|r| widen(&x_host[r * ld..r * ld + p.f]))
        .collect();
    ops::bias_gelu_new(&mut want, &bias);
    let got_rows: Vec<f64> = (0..p.n)
        .flat_map(|r| f64s(&got[r * ld..r * ld + p.f]))
        .collect();
    compare("gelu", &got_rows, &f64s(&want), 1e-6, u(T::DTYPE), None)?;
    // Padding columns are untouched.
    for r in 0..p.n {
        for c in p.f..ld {
            prop_assert_eq!(got[r * ld + c], x_host[r * ld + c].to_f32());
        }
    }
    Ok(())
}

#[test]
fn gelu_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let grid = prop_oneof![Just(None), Just(Some(1u32)), Just(Some(3u32))];
    let strategy = (dtype(), 1usize..9, width(), 0usize..9, grid, any::<u64>()).prop_map(
        |(dtype, n, f, ld_pad, grid, seed)| GeluProblem {
            dtype,
            n,
            f,
            ld_pad,
            grid,
            seed,
        },
    );
    fuzz("gelu", 48, strategy, |p| match p.dtype {
        CudaDType::BF16 => gelu_run::<bf16>(&gpu, &p),
        CudaDType::F16 => gelu_run::<f16>(&gpu, &p),
    });
    let gptj = GeluProblem {
        dtype: CudaDType::BF16,
        n: 3,
        f: 16384,
        ld_pad: 0,
        grid: None,
        seed: 5,
    };
    gelu_run::<bf16>(&gpu, &gptj).unwrap();
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct XentProblem {
    rows: usize,
    vocab: usize,
    ld_pad: usize,
    logit_scale: f32,
    block: Option<u32>,
    seed: u64,
}

fn xent_run(gpu: &Gpu, p: &XentProblem) -> R {
    let ld = p.vocab + p.ld_pad;
    let logits = random_vec(p.seed, p.rows * ld, p.logit_scale);
    let bias = random_vec(p.seed ^ 1, p.vocab, 1.0);
    let mut rng = Rng::new(p.seed ^ 2);
    // 0..4 targets per row (rows without targets included); slots scattered.
    let mut offsets = vec![0u32];
    let mut tokens = Vec::new();
    for _ in 0..p.rows {
        for _ in 0..rng.range(0, 4) {
            tokens.push(rng.range(0, p.vocab - 1) as u32);
        }
        offsets.push(tokens.len() as u32);
    }
    let n_t = tokens.len();
    let mut slots: Vec<u32> = (0..n_t as u32).collect();
    for i in (1..n_t).rev() {
        slots.swap(i, rng.range(0, i));
    }
    let (l_d, b_d, o_d, t_d, s_d) = (
        up(gpu, &logits),
        up(gpu, &bias),
        up(gpu, &offsets),
        up(gpu, &tokens),
        up(gpu, &slots),
    );
    let mut out = gpu.stream.alloc_zeros::<f32>(n_t.max(1)).unwrap();
    lm_head_xent::lm_head_xent(
        gpu,
        &l_d.as_view(),
        &b_d.as_view(),
        &o_d.as_view(),
        &t_d.as_view(),
        &s_d.as_view(),
        &mut out.as_view_mut(),
        [p.rows, p.vocab, ld],
        n_t,
        p.block,
    )
    .unwrap();
    let got = down(gpu, &out);
    // f64 reference.
    let mut want = vec![0f64; n_t];
    for r in 0..p.rows {
        let row: Vec<f64> = (0..p.vocab)
            .map(|v| logits[r * ld + v] as f64 + bias[v] as f64)
            .collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        for t in offsets[r] as usize..offsets[r + 1] as usize {
            want[slots[t] as usize] = row[tokens[t] as usize] - lse;
        }
    }
    compare("lm_head_xent", &f64s(&got[..n_t]), &want, 2e-5, 1e-6, None).map(|_| ())
}

#[test]
fn lm_head_xent_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let block = prop_oneof![
        Just(None),
        prop::sample::select(lm_head_xent::BLOCK_CHOICES.to_vec()).prop_map(Some)
    ];
    let vocab = prop_oneof![
        prop::sample::select(vec![1usize, 2, 31, 32, 33, 1000, 1025, 50400]),
        1usize..5000
    ];
    let strategy = (
        1usize..6,
        vocab,
        0usize..9,
        prop::sample::select(vec![0.1f32, 3.0, 20.0]),
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
            },
        );
    fuzz("lm_head_xent", 48, strategy, xent_run_boxed(&gpu));
    for block in lm_head_xent::BLOCK_CHOICES {
        let p = XentProblem {
            rows: 4,
            vocab: 50400,
            ld_pad: 0,
            logit_scale: 20.0,
            block: Some(block),
            seed: 11,
        };
        xent_run(&gpu, &p).unwrap();
    }
}

fn xent_run_boxed(gpu: &Gpu) -> impl Fn(XentProblem) -> R + '_ {
    move |p| xent_run(gpu, &p)
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct GemmProblem {
    dtype: CudaDType,
    m: usize,
    n: usize,
    k: usize,
    f32_out: bool,
    accumulate: bool,
    /// Rows skipped at the start of each operand (changes pointer alignment: 256 B -> 16 B).
    offset_rows: usize,
    seed: u64,
}

fn gemm_run<T: DeviceFloat>(gpu: &Gpu, p: &GemmProblem) -> R {
    let (m, n, k) = (p.m, p.n, p.k);
    let (lda, ldo) = (stride(k), stride(n));
    let off = p.offset_rows;
    let a: Vec<T> = to_t(&random_vec(p.seed, (m + off) * lda, 1.0));
    let w: Vec<T> = to_t(&random_vec(p.seed ^ 1, (n + off) * lda, 1.0));
    let mut c0 = random_vec(p.seed ^ 2, (m + off) * ldo, 1.0);
    if !p.f32_out {
        c0 = widen(&to_t::<T>(&c0)); // the 16-bit C input is what the device accumulates onto
    }
    let (a_d, w_d) = (up(gpu, &a), up(gpu, &w));
    let dense = |v: &[T], rows: usize| -> Vec<f32> {
        (0..rows)
            .flat_map(|r| widen(&v[(r + off) * lda..(r + off) * lda + k]))
            .collect()
    };
    let (af, wf) = (dense(&a, m), dense(&w, n));
    let mut want: Vec<f32> = if p.accumulate {
        (0..m)
            .flat_map(|r| c0[(r + off) * ldo..(r + off) * ldo + n].to_vec())
            .collect()
    } else {
        vec![0.0; m * n]
    };
    cpu_gemm::matmul_wt(&af, &wf, &mut want, [m, n, k], p.accumulate, true);
    let (aa, wa): (Vec<f32>, Vec<f32>) = (
        af.iter().map(|x| x.abs()).collect(),
        wf.iter().map(|x| x.abs()).collect(),
    );
    let mut mag = vec![0f32; m * n];
    cpu_gemm::matmul_wt(&aa, &wa, &mut mag, [m, n, k], false, true);
    // f32 accumulation noise, plus, for a 16-bit C += A W: cuBLASLt may round A W to the
    // output type before adding C (seen twice on the H200, with and without split-K: a result
    // one ulp off where A W and C nearly cancel), so that rounding is charged to |A| |W| + |C|.
    // The engine itself accumulates only into f32 outputs (the residual stream).
    let u16_acc = if p.accumulate && !p.f32_out {
        u(T::DTYPE)
    } else {
        0.0
    };
    let abs_each: Vec<f64> = mag
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let c = c0[(i / n + off) * ldo + i % n].abs() as f64;
            2e-5 * x as f64 + u16_acc * (x as f64 + c)
        })
        .collect();
    let got: Vec<f32> = if p.f32_out {
        let mut o = up(gpu, &c0);
        gpu.blas
            .linear(
                &a_d.slice(off * lda..),
                lda,
                &w_d.slice(off * lda..),
                lda,
                &mut o.slice_mut(off * ldo..),
                ldo,
                [m, n, k],
                p.accumulate,
            )
            .unwrap();
        down(gpu, &o)
    } else {
        let mut o = up(gpu, &to_t::<T>(&c0));
        gpu.blas
            .linear(
                &a_d.slice(off * lda..),
                lda,
                &w_d.slice(off * lda..),
                lda,
                &mut o.slice_mut(off * ldo..),
                ldo,
                [m, n, k],
                p.accumulate,
            )
            .unwrap();
        widen(&down(gpu, &o))
    };
    let got: Vec<f64> = (0..m)
        .flat_map(|r| f64s(&got[(r + off) * ldo..(r + off) * ldo + n]))
        .collect();
    // A 16-bit output is rounded once.
    let rel = if p.f32_out { 0.0 } else { u(T::DTYPE) };
    compare("gemm", &got, &f64s(&want), 1e-6, rel, Some(&abs_each)).map(|_| ())
}

#[test]
fn gemm_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let dim = prop_oneof![
        prop::sample::select(vec![1usize, 7, 8, 33, 64, 129, 256]),
        1usize..300
    ];
    let strategy = (
        dtype(),
        dim.clone(),
        dim.clone(),
        dim,
        any::<bool>(),
        any::<bool>(),
        0usize..3,
        any::<u64>(),
    )
        .prop_map(
            |(dtype, m, n, k, f32_out, accumulate, offset_rows, seed)| GemmProblem {
                dtype,
                m,
                n,
                k,
                f32_out,
                accumulate,
                offset_rows,
                seed,
            },
        );
    fuzz("gemm", 32, strategy, |p| match p.dtype {
        CudaDType::BF16 => gemm_run::<bf16>(&gpu, &p),
        CudaDType::F16 => gemm_run::<f16>(&gpu, &p),
    });
    // GPT-J's shapes (few rows, so the CPU reference stays quick): qkv, fc_in, fc_out, lm_head.
    for (n, k, f32_out, acc) in [
        (12288, 4096, true, false),
        (16384, 4096, false, false),
        (4096, 16384, true, true),
        (50400, 4096, true, false),
    ] {
        let p = GemmProblem {
            dtype: CudaDType::BF16,
            m: 9,
            n,
            k,
            f32_out,
            accumulate: acc,
            offset_rows: 0,
            seed: 1,
        };
        gemm_run::<bf16>(&gpu, &p).unwrap();
    }
    eprintln!("gemm: {} cached cuBLASLt plans", gpu.blas.cached_plans());
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct AttentionProblem {
    dtype: CudaDType,
    n_head: usize,
    head_dim: usize,
    n_texts: usize,
    max_text: usize,
    inline: bool,
    vocab: usize,
    seed: u64,
}

/// A random plan from random candidates: shared prefixes, branches, single-token segments,
/// segments and contexts longer than one 64-row tile when texts are long.
fn random_plan(p: &AttentionProblem) -> Plan {
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

fn attention_run<T: DeviceFloat>(gpu: &Gpu, p: &AttentionProblem) -> R {
    let plan = random_plan(p);
    let (nh, hd) = (p.n_head, p.head_dim);
    let d = nh * hd;
    let n = plan.n_tokens();
    let ld = stride(d);
    // q, k, v as the device sees them (rounded to T); the reference gets the same values.
    let qkv_t: Vec<Vec<T>> = (0..3)
        .map(|i| to_t(&random_vec(p.seed ^ (10 + i), n * ld, 2.0)))
        .collect();
    let mut dense = vec![0f32; n * 3 * d];
    for r in 0..n {
        for (i, m) in qkv_t.iter().enumerate() {
            dense[r * 3 * d + i * d..r * 3 * d + (i + 1) * d]
                .copy_from_slice(&widen(&m[r * ld..r * ld + d]));
        }
    }
    let mut want = vec![0f32; n * d];
    attention::tree_attention(&plan, &dense, nh, hd, &mut want);
    let max_v = qkv_t[2]
        .iter()
        .map(|x| x.to_f32().abs())
        .fold(0f32, f32::max) as f64;
    let tiles = TreeTiles::from_plan(&plan, 0).upload(gpu).unwrap();
    let (q_d, k_d, v_d) = (up(gpu, &qkv_t[0]), up(gpu, &qkv_t[1]), up(gpu, &qkv_t[2]));
    let shape = AttentionShape {
        n_head: nh,
        head_dim: hd,
        ld,
        ld_out: ld,
    };
    let mut variants = vec![AttentionVariant::Scalar];
    if tree_attention::vec_allowed(gpu, shape, &q_d.as_view(), &k_d.as_view(), &v_d.as_view()) {
        variants.push(AttentionVariant::Vec);
    }
    for variant in variants {
        let mut out = gpu.stream.alloc_zeros::<T>(n * ld).unwrap();
        tree_attention::tree_attention(
            gpu,
            &q_d.as_view(),
            &k_d.as_view(),
            &v_d.as_view(),
            &tiles,
            &mut out.as_view_mut(),
            shape,
            Some(variant),
        )
        .unwrap();
        let got = widen(&down(gpu, &out));
        let got: Vec<f64> = (0..n)
            .flat_map(|r| f64s(&got[r * ld..r * ld + d]))
            .collect();
        let uu = u(T::DTYPE);
        compare(
            &format!(
                "tree_attention {variant:?} ({n} tokens, {} segments)",
                plan.segments.len()
            ),
            &got,
            &f64s(&want),
            2.0 * uu * max_v + 1e-5,
            uu,
            None,
        )?;
    }
    // decode_attention serves the same tiles (one row after another): same contract, P in f32.
    let mut out = gpu.stream.alloc_zeros::<T>(n * ld).unwrap();
    tree_attention::decode_attention(
        gpu,
        &q_d.as_view(),
        &k_d.as_view(),
        &v_d.as_view(),
        &tiles,
        &mut out.as_view_mut(),
        shape,
    )
    .unwrap();
    let got = widen(&down(gpu, &out));
    let got: Vec<f64> = (0..n)
        .flat_map(|r| f64s(&got[r * ld..r * ld + d]))
        .collect();
    let uu = u(T::DTYPE);
    compare(
        &format!(
            "decode_attention ({n} tokens, {} segments)",
            plan.segments.len()
        ),
        &got,
        &f64s(&want),
        2.0 * uu * max_v + 1e-5,
        uu,
        None,
    )?;
    Ok(())
}

#[test]
fn tree_attention_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let head_dim = prop_oneof![
        prop::sample::select(vec![1usize, 3, 8, 16, 17, 24, 64, 100, 128, 256]),
        1usize..257
    ];
    let strategy = (
        dtype(),
        1usize..5,
        head_dim,
        1usize..4,
        prop::sample::select(vec![8usize, 40, 150]),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(dtype, n_head, head_dim, n_texts, max_text, inline, seed)| AttentionProblem {
                dtype,
                n_head,
                head_dim,
                n_texts,
                max_text,
                inline,
                vocab: 13,
                seed,
            },
        );
    fuzz("tree_attention", 32, strategy, |p| match p.dtype {
        CudaDType::BF16 => attention_run::<bf16>(&gpu, &p),
        CudaDType::F16 => attention_run::<f16>(&gpu, &p),
    });
    // GPT-J: 16 heads of 256, a few hundred tokens of real tree structure, both placements.
    for inline in [false, true] {
        let p = AttentionProblem {
            dtype: CudaDType::BF16,
            n_head: 16,
            head_dim: 256,
            n_texts: 2,
            max_text: 150,
            inline,
            vocab: 50,
            seed: 21,
        };
        attention_run::<bf16>(&gpu, &p).unwrap();
    }
}

/// The host side of the attention tiles needs no GPU: every tile's context is its ancestors'
/// tokens root first, then its own segment, and tiles cover every token once.
#[test]
fn tree_tiles_cover_the_plan() {
    for seed in 0..20 {
        let p = AttentionProblem {
            dtype: CudaDType::BF16,
            n_head: 1,
            head_dim: 1,
            n_texts: 3,
            max_text: 150,
            inline: seed % 2 == 0,
            vocab: 7,
            seed,
        };
        let plan = random_plan(&p);
        let t = TreeTiles::from_plan(&plan, 0);
        let mut seen = vec![0u32; plan.n_tokens()];
        for i in 0..t.n_tiles() {
            let [q_start, q_len, q_pos, _] = t.tiles[4 * i..4 * i + 4] else {
                unreachable!()
            };
            assert!((1..=64).contains(&q_len));
            let ctx = &t.ctx_tokens[t.tile_ctx[i] as usize..];
            for r in 0..q_len {
                let tok = q_start + r;
                seen[tok as usize] += 1;
                // The query itself sits at its own context position, and that position is its
                // position id in the sequence.
                assert_eq!(ctx[(q_pos + r) as usize], tok);
                assert_eq!(plan.positions[tok as usize], q_pos + r);
            }
        }
        assert!(seen.iter().all(|&s| s == 1));
    }
}

/// The KV tree's tiles (new tokens per group over their context rows) are the plan's tiles when
/// the groups are a plan's segments (what prefill builds); decode groups are single queries.
#[test]
fn tree_tiles_from_groups_equal_the_plans() {
    for seed in 0..10 {
        let p = AttentionProblem {
            dtype: CudaDType::BF16,
            n_head: 1,
            head_dim: 1,
            n_texts: 3,
            max_text: 150,
            inline: seed % 2 == 1,
            vocab: 7,
            seed,
        };
        let plan = random_plan(&p);
        let groups: Vec<_> = plan
            .segments
            .iter()
            .enumerate()
            .map(|(s, seg)| {
                let mut ranges: Vec<std::ops::Range<usize>> = plan
                    .ancestors_of(s)
                    .iter()
                    .map(|&a| {
                        let a = plan.segments[a as usize];
                        a.start as usize..(a.start + a.len) as usize
                    })
                    .collect();
                ranges.push(seg.start as usize..(seg.start + seg.len) as usize);
                (ranges, seg.len as usize, seg.start as usize)
            })
            .collect();
        assert_eq!(
            TreeTiles::from_groups(&groups),
            TreeTiles::from_plan(&plan, 0)
        );
    }
    let decode =
        TreeTiles::from_groups(&[(vec![0..5, 9..10], 1, 0), (vec![0..3, 7..8, 10..11], 1, 1)]);
    assert!(decode.single_queries());
    assert_eq!(decode.tiles, vec![0, 1, 5, 0, 1, 1, 4, 0]);
    assert_eq!(decode.ctx_tokens, vec![0, 1, 2, 3, 4, 9, 0, 1, 2, 7, 10]);
    assert_eq!((decode.q_rows, decode.kv_rows), (2, 11));
}
