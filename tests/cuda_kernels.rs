//! Every CUDA kernel against its CPU reference, through proptest Problems: random
//! non-zero data, awkward sizes that straddle warp (32) and block edges, GPT-J-6B's real sizes
//! (n_embd 4096, 16 heads of 256 with rotary 64, n_inner 16384, vocab 50400), both 16-bit types,
//! and every launch configuration the launcher can pick (block sizes, grid caps, attention
//! variants, GEMM operand alignments). The cases and their tolerances live in tests/kernel_cases,
//! shared with the host emulator's run of the same kernels (tests/emu_kernels.rs); here they go
//! through the real launchers on the device.
//!
//! Without a GPU (or without kernels / CUDA libraries) each test prints "SKIPPED: ..." and
//! returns. TOOLSIFT_FUZZ_CASES raises the case count (scripts/gpu-check.sh does).
//!
//! GEMM tolerance (cuBLASLt, not a kernel of ours, so not in kernel_cases): f32 accumulation in a
//! different order, bounded by 2e-5 * sum_k |a_ik w_jk|.
#![cfg(feature = "cuda")]

mod cuda_common;
mod kernel_cases;

use cuda_common::{compare, fuzz, gpu, kernel_cases, mma_cases, random_vec};
use half::{bf16, f16};
use kernel_cases::*;
use proptest::prelude::*;
use toolsift::cpu::{attention, gemm as cpu_gemm};
use toolsift::cuda::cudarc::driver::CudaSlice;
use toolsift::cuda::layer_norm::Rows;
use toolsift::cuda::rotary::RotaryShape;
use toolsift::cuda::tree_attention::{AttentionShape, AttentionVariant, TreeTiles};
use toolsift::cuda::{
    embedding, gelu, layer_norm, lm_head_xent, rotary, stride, tree_attention, CudaDType,
    DeviceFloat, Gpu,
};
use toolsift::sample::kv_tree::Group;

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

// ---------------------------------------------------------------------------------------------

fn embedding_run<T: DeviceFloat>(gpu: &Gpu, p: &EmbeddingProblem) -> R {
    let c = EmbeddingCase::<T>::new(p);
    let (wte_d, ids_d) = (up(gpu, &c.wte), up(gpu, &c.ids));
    let mut x = gpu.stream.alloc_zeros::<f32>(p.n * c.ld_x).unwrap();
    embedding::embedding(
        gpu,
        &ids_d.as_view(),
        &wte_d.as_view(),
        p.vocab,
        &mut x.as_view_mut(),
        [p.n, p.d, c.ld, c.ld_x],
    )
    .unwrap();
    c.check(p, &down(gpu, &x))
}

// Rows closer than their width would overlap, blocks writing each other's elements: refused.
#[test]
fn launchers_refuse_a_row_stride_under_the_width() {
    let Some(gpu) = gpu() else { return };
    let (n, d, vocab) = (3, 8, 5);
    let ids = up(&gpu, &[0u32, 1, 2]);
    let wte = up(&gpu, &vec![bf16::ONE; vocab * d]);
    let mut x = gpu.stream.alloc_zeros::<f32>(n * d).unwrap();
    let shape = [n, d, d, d - 1];
    let err = embedding::embedding(
        &gpu,
        &ids.as_view(),
        &wte.as_view(),
        vocab,
        &mut x.as_view_mut(),
        shape,
    )
    .unwrap_err();
    assert!(err.to_string().contains("row stride"), "{err}");
    let (w, b) = (up(&gpu, &[1f32; 8]), up(&gpu, &[0f32; 8]));
    let mut out = gpu.stream.alloc_zeros::<bf16>(n * d).unwrap();
    let err = layer_norm::layer_norm(
        &gpu,
        &mut x.as_view_mut(),
        n,
        Rows {
            gather: None,
            residual_bias: None,
        },
        &w.as_view(),
        &b.as_view(),
        &mut out.as_view_mut(),
        [n, d, d, d - 1],
        1e-5,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("row stride"), "{err}");
}

/// A buffer one element short of what its shape spans (`(rows - 1) * ld + width`, the row
/// stride past the width) is refused before the launch; one of exactly that length runs.
#[test]
fn launchers_refuse_a_buffer_one_element_short_of_its_rows() {
    let Some(gpu) = gpu() else { return };
    let (n, d, ld_x, vocab) = (3, 8, 24, 5);
    let ids = up(&gpu, &[0u32, 1, 2]);
    let wte = up(&gpu, &vec![bf16::ONE; vocab * d]);
    let span = (n - 1) * ld_x + d;
    for (len, refused) in [(span - 1, true), (span, false)] {
        let mut x = gpu.stream.alloc_zeros::<f32>(len).unwrap();
        let got = embedding::embedding(
            &gpu,
            &ids.as_view(),
            &wte.as_view(),
            vocab,
            &mut x.as_view_mut(),
            [n, d, d, ld_x],
        );
        match (refused, got) {
            (true, Err(e)) => assert!(e.to_string().contains("buffers shorter"), "{e}"),
            (false, Ok(())) => assert_eq!(down(&gpu, &x)[(n - 1) * ld_x], 1.0),
            (_, got) => panic!("x of {len} elements for a span of {span}: {got:?}"),
        }
    }
}

#[test]
fn embedding_matches_reference() {
    let Some(gpu) = gpu() else { return };
    fuzz(
        "embedding",
        kernel_cases(48),
        embedding_problems(),
        |p| match p.dtype {
            CudaDType::BF16 => embedding_run::<bf16>(&gpu, &p),
            CudaDType::F16 => embedding_run::<f16>(&gpu, &p),
        },
    );
}

// ---------------------------------------------------------------------------------------------

fn layer_norm_run<T: DeviceFloat>(gpu: &Gpu, p: &LayerNormProblem) -> R {
    let c = LayerNormCase::new(p);
    let (d, ld, ld_out, n) = (p.d, c.ld, c.ld_out, c.rows.len());
    let mut x = up(gpu, &c.x);
    let (rb_d, rows_d) = (up(gpu, &c.residual_bias), up(gpu, &c.rows));
    let (w_d, b_d) = (up(gpu, &c.ln.weight), up(gpu, &c.ln.bias));
    let mut out = gpu.stream.alloc_zeros::<T>(n * ld_out).unwrap();
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
        [n, d, ld, ld_out],
        LayerNormCase::EPS,
        p.block,
    )
    .unwrap();
    c.check(p, T::DTYPE, &widen(&down(gpu, &out)), &down(gpu, &x))
}

#[test]
fn layer_norm_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let strategy = layer_norm_problems(&layer_norm::BLOCK_CHOICES);
    fuzz("layer_norm", kernel_cases(48), strategy, |p| {
        match p.dtype {
            CudaDType::BF16 => layer_norm_run::<bf16>(&gpu, &p),
            CudaDType::F16 => layer_norm_run::<f16>(&gpu, &p),
        }
    });
    for block in layer_norm::BLOCK_CHOICES {
        layer_norm_run::<bf16>(&gpu, &layer_norm_gptj(block)).unwrap();
        layer_norm_run::<bf16>(&gpu, &layer_norm_flat(block)).unwrap();
    }
}

/// The launcher's own block choice for a row wider than 8192 (no block given) is one it can
/// launch, and normalises the row.
#[test]
fn layer_norm_runs_its_default_block_past_8192_columns() {
    let Some(gpu) = gpu() else { return };
    let p = LayerNormProblem {
        d: 8200,
        n_x: 2,
        block: None,
        ..layer_norm_gptj(32)
    };
    layer_norm_run::<bf16>(&gpu, &p).unwrap();
}

// ---------------------------------------------------------------------------------------------

fn rotary_run<T: DeviceFloat>(gpu: &Gpu, p: &RotaryProblem) -> R {
    let c = RotaryCase::new(p);
    let (qkv_d, pos_d) = (up(gpu, &c.qkv), up(gpu, &c.positions));
    let (cos_d, sin_d) = (up(gpu, &c.table.cos), up(gpu, &c.table.sin));
    let mut q = gpu.stream.alloc_zeros::<T>(p.n * c.ld).unwrap();
    let mut k = gpu.stream.alloc_zeros::<T>(p.n * c.ld).unwrap();
    let mut v = gpu.stream.alloc_zeros::<T>(p.n * c.ld).unwrap();
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
            ld_qkv: c.l3,
            ld: c.ld,
            n_positions: p.n_positions,
        },
    )
    .unwrap();
    let [q, k, v] = [&q, &k, &v].map(|b| widen(&down(gpu, b)));
    c.check(p, T::DTYPE, [&q, &k, &v])
}

#[test]
fn rotary_matches_reference() {
    let Some(gpu) = gpu() else { return };
    fuzz("rotary", kernel_cases(48), rotary_problems(), |p| {
        match p.dtype {
            CudaDType::BF16 => rotary_run::<bf16>(&gpu, &p),
            CudaDType::F16 => rotary_run::<f16>(&gpu, &p),
        }
    });
    rotary_run::<bf16>(&gpu, &rotary_gptj()).unwrap();
}

// ---------------------------------------------------------------------------------------------

fn gelu_run<T: DeviceFloat>(gpu: &Gpu, p: &GeluProblem) -> R {
    let c = GeluCase::<T>::new(p);
    let mut x = up(gpu, &c.x);
    let b = up(gpu, &c.bias);
    gelu::gelu(
        gpu,
        &mut x.as_view_mut(),
        &b.as_view(),
        [p.n, p.f, c.ld],
        p.grid,
    )
    .unwrap();
    c.check(p, &widen(&down(gpu, &x)))
}

#[test]
fn gelu_matches_reference() {
    let Some(gpu) = gpu() else { return };
    fuzz("gelu", kernel_cases(48), gelu_problems(), |p| {
        match p.dtype {
            CudaDType::BF16 => gelu_run::<bf16>(&gpu, &p),
            CudaDType::F16 => gelu_run::<f16>(&gpu, &p),
        }
    });
    gelu_run::<bf16>(&gpu, &gelu_gptj()).unwrap();
}

// ---------------------------------------------------------------------------------------------

fn xent_run(gpu: &Gpu, p: &XentProblem) -> R {
    let c = XentCase::new(p);
    let n_t = c.tokens.len();
    let (l_d, b_d, o_d, t_d, s_d) = (
        up(gpu, &c.logits),
        up(gpu, &c.bias),
        up(gpu, &c.offsets),
        up(gpu, &c.tokens),
        up(gpu, &c.slots),
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
        [p.rows, p.vocab, c.ld],
        n_t,
        p.block,
    )
    .unwrap();
    c.check(p, &down(gpu, &out))?;
    let mut rows = gpu.stream.alloc_zeros::<f32>(p.rows * c.ld_out).unwrap();
    lm_head_xent::log_softmax(
        gpu,
        &l_d.as_view(),
        &b_d.as_view(),
        &mut rows.as_view_mut(),
        [p.rows, p.vocab, c.ld, c.ld_out],
        p.block,
    )
    .unwrap();
    c.check_log_softmax(p, &down(gpu, &rows), c.ld_out)
}

#[test]
fn lm_head_xent_and_log_softmax_match_reference() {
    let Some(gpu) = gpu() else { return };
    let strategy = xent_problems(&lm_head_xent::BLOCK_CHOICES);
    fuzz("lm_head_xent", kernel_cases(48), strategy, |p| {
        xent_run(&gpu, &p)
    });
    for block in lm_head_xent::BLOCK_CHOICES {
        xent_run(&gpu, &xent_gptj(block)).unwrap();
        xent_run(&gpu, &xent_masked(block)).unwrap();
        xent_run(&gpu, &xent_large_logits(block)).unwrap();
    }
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
    fuzz("gemm", kernel_cases(32), strategy, |p| match p.dtype {
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

/// `Blas::linear` reads `a` at its row stride and `w` at its own, and a cached plan is one
/// shape's and strides' only: products that differ from an earlier one in a single stride (of
/// a, of w or of the output) each come out exact (small integers, sums exact in f32).
#[test]
fn gemm_keeps_each_operands_row_stride_and_plans_per_stride() {
    let Some(gpu) = gpu() else { return };
    let (m, n, k) = (3, 5, 16);
    let value = |r: usize, c: usize, s: usize| ((r * 7 + c * 3 + s) % 5) as f32 - 2.0;
    for (lda, ldw, ldo) in [
        (16, 16, 8),
        (16, 24, 8),
        (16, 32, 8),
        (24, 16, 8),
        (16, 16, 16),
    ] {
        // Padding columns hold values too: a stride read wrong picks them up.
        let a: Vec<f32> = (0..m * lda).map(|i| value(i / lda, i % lda, 1)).collect();
        let w: Vec<f32> = (0..n * ldw).map(|i| value(i / ldw, i % ldw, 2)).collect();
        let (a_d, w_d) = (up(&gpu, &to_t::<bf16>(&a)), up(&gpu, &to_t::<bf16>(&w)));
        let mut out = gpu.stream.alloc_zeros::<f32>(m * ldo).unwrap();
        gpu.blas
            .linear(
                &a_d.as_view(),
                lda,
                &w_d.as_view(),
                ldw,
                &mut out.as_view_mut(),
                ldo,
                [m, n, k],
                false,
            )
            .unwrap();
        let got = down(&gpu, &out);
        for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
            let want: f32 = (0..k).map(|c| a[i * lda + c] * w[j * ldw + c]).sum();
            assert_eq!(
                got[i * ldo + j],
                want,
                "({i}, {j}) at lda {lda} ldw {ldw} ldo {ldo}"
            );
        }
    }
}

/// The 16-byte row loads are refused for rows whose stride is not a multiple of 8 elements
/// (every row after the first would start off a 16-byte boundary), and run at a stride that is.
#[test]
fn vector_attention_needs_a_row_stride_of_a_multiple_of_8() {
    let Some(gpu) = gpu() else { return };
    let groups = [Group {
        ranges: std::iter::once(0..2).collect(),
        n_new: 2,
        first_query: 0,
    }];
    let tiles = TreeTiles::from_groups(&groups).upload(&gpu).unwrap();
    for ld in [12, 16] {
        let qkv = up(&gpu, &vec![bf16::ONE; 2 * ld]);
        let mut out = gpu.stream.alloc_zeros::<bf16>(2 * ld).unwrap();
        let shape = AttentionShape {
            n_head: 1,
            head_dim: 8,
            ld,
            ld_out: ld,
        };
        let got = tree_attention::tree_attention(
            &gpu,
            &qkv.as_view(),
            &qkv.as_view(),
            &qkv.as_view(),
            &tiles,
            &mut out.as_view_mut(),
            shape,
            Some(AttentionVariant::Vec),
        );
        match (ld, got) {
            (12, Err(e)) => assert!(e.to_string().contains("vector variants"), "{e}"),
            (16, Ok(())) => assert_eq!(down(&gpu, &out)[ld + 7], bf16::ONE),
            (_, got) => panic!("ld {ld}: {got:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------

fn attention_run<T: DeviceFloat>(gpu: &Gpu, p: &AttentionProblem) -> R {
    let c = AttentionCase::<T>::new(p);
    let layouts = c.layouts.each_ref().map(|t| t.upload(gpu).unwrap());
    let (q_d, k_d, v_d) = (up(gpu, &c.qkv[0]), up(gpu, &c.qkv[1]), up(gpu, &c.qkv[2]));
    let shape = AttentionShape {
        n_head: p.n_head,
        head_dim: p.head_dim,
        ld: c.ld,
        ld_out: c.ld_out,
    };
    let mut variants = vec![AttentionVariant::Scalar, AttentionVariant::MmaScalar];
    if tree_attention::vec_allowed(gpu, shape, &q_d.as_view(), &k_d.as_view(), &v_d.as_view()) {
        variants.extend([AttentionVariant::Vec, AttentionVariant::MmaVec]);
    }
    let mma = mma_cases();
    variants.retain(|v| {
        mma.covers(matches!(
            v,
            AttentionVariant::MmaScalar | AttentionVariant::MmaVec
        ))
    });
    for (variant, tiles) in variants
        .into_iter()
        .flat_map(|v| layouts.iter().map(move |t| (v, t)))
    {
        let mut out = up(gpu, &c.out_init());
        tree_attention::tree_attention(
            gpu,
            &q_d.as_view(),
            &k_d.as_view(),
            &v_d.as_view(),
            tiles,
            &mut out.as_view_mut(),
            shape,
            Some(variant),
        )
        .unwrap();
        let what = format!("tree_attention {variant:?}, {} tiles", tiles.n_tiles);
        c.check(p, &what, &widen(&down(gpu, &out)))?;
    }
    // decode_attention serves the same (unpacked) tiles, one row after another: same contract,
    // P in f32. It never sees packed tiles: decoding steps are single queries.
    let mut out = up(gpu, &c.out_init());
    tree_attention::decode_attention(
        gpu,
        &q_d.as_view(),
        &k_d.as_view(),
        &v_d.as_view(),
        &layouts[0],
        &mut out.as_view_mut(),
        shape,
    )
    .unwrap();
    c.check(p, "decode_attention", &widen(&down(gpu, &out)))
}

#[test]
fn tree_attention_matches_reference() {
    let Some(gpu) = gpu() else { return };
    let strategy = attention_problems(1..5, vec![8, 40, 150]);
    fuzz("tree_attention", kernel_cases(32), strategy, |p| {
        match p.dtype {
            CudaDType::BF16 => attention_run::<bf16>(&gpu, &p),
            CudaDType::F16 => attention_run::<f16>(&gpu, &p),
        }
    });
    for inline in [false, true] {
        attention_run::<bf16>(&gpu, &attention_gptj(16, inline)).unwrap();
    }
    attention_run::<bf16>(&gpu, &attention_sharp()).unwrap();
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
            qk_scale: 2.0,
        };
        let plan = random_plan(&p);
        for t in [
            TreeTiles::from_plan(&plan, 0),
            TreeTiles::from_plan_unpacked(&plan, 0),
        ] {
            let mut seen = vec![0u32; plan.n_tokens()];
            for i in 0..t.n_tiles() {
                let [q_start, q_len, q_pos, packed] = t.tiles[4 * i..4 * i + 4] else {
                    unreachable!()
                };
                assert!((1..=64).contains(&q_len));
                let ctx = &t.ctx_tokens[t.tile_ctx[i] as usize..];
                for r in 0..q_len {
                    let tok = q_start + r;
                    seen[tok as usize] += 1;
                    // The query itself sits at its own context position. Its position id is
                    // the number of keys it sees before itself: in a packed tile, q_pos and the
                    // tile keys its mask holds (its own bit is the highest).
                    assert_eq!(ctx[(q_pos + r) as usize], tok);
                    if packed != 0 {
                        let m = row_mask(ctx, q_pos + q_len, r);
                        assert_eq!(64 - m.leading_zeros(), r + 1, "own bit highest");
                        assert_eq!(plan.positions[tok as usize], q_pos + m.count_ones() - 1);
                    } else {
                        assert_eq!(plan.positions[tok as usize], q_pos + r);
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1));
        }
    }
}

/// Row r's mask of visible tile keys in a packed tile whose context map has n_ctx entries.
fn row_mask(ctx: &[u32], n_ctx: u32, r: u32) -> u64 {
    let at = (n_ctx + 2 * r) as usize;
    ctx[at] as u64 | (ctx[at + 1] as u64) << 32
}

/// The kernel's contract on the host, in f64: every tile row attends to the context keys it may
/// see (keys before q_pos, then the tile keys its mask holds). Run on packed and unpacked
/// tiles, it must give the CPU engine's tree attention: this checks the packing (which sibling
/// segments share a tile, their context maps and row segment starts) without a GPU.
fn emulate_tiles(t: &TreeTiles, qkv: &[f32], n: usize, nh: usize, hd: usize) -> Vec<f32> {
    let d = nh * hd;
    let mut out = vec![0f32; n * d];
    for i in 0..t.n_tiles() {
        let [q_start, q_len, q_pos, packed] = t.tiles[4 * i..4 * i + 4] else {
            unreachable!()
        };
        let ctx = &t.ctx_tokens[t.tile_ctx[i] as usize..];
        let n_ctx = (q_pos + q_len) as usize;
        for r in 0..q_len as usize {
            let mask = if packed != 0 {
                row_mask(ctx, n_ctx as u32, r as u32)
            } else {
                u64::MAX
            };
            let (q_pos, row) = (q_pos as usize, q_start as usize + r);
            let visible: Vec<usize> = (0..=q_pos + r)
                .filter(|&j| j < q_pos || (mask >> (j - q_pos)) & 1 == 1)
                .map(|j| ctx[j] as usize)
                .collect();
            for h in 0..nh {
                let q = &qkv[row * 3 * d + h * hd..][..hd];
                let scores: Vec<f64> = visible
                    .iter()
                    .map(|&kt| {
                        let k = &qkv[kt * 3 * d + d + h * hd..][..hd];
                        q.iter().zip(k).map(|(a, b)| (*a * *b) as f64).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = w.iter().sum();
                for c in 0..hd {
                    let acc: f64 = visible
                        .iter()
                        .zip(&w)
                        .map(|(&vt, &wj)| wj * qkv[vt * 3 * d + 2 * d + h * hd + c] as f64)
                        .sum();
                    out[row * d + h * hd + c] = (acc / z) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn packed_tiles_keep_the_attention_of_the_plan() {
    let mut packed_tiles = 0;
    for seed in 0..24 {
        let p = AttentionProblem {
            dtype: CudaDType::BF16,
            n_head: 2,
            head_dim: 3,
            n_texts: 3,
            max_text: 90,
            inline: seed % 3 != 0,
            vocab: 5,
            seed,
            qk_scale: 2.0,
        };
        let plan = random_plan(&p);
        let (nh, hd) = (p.n_head, p.head_dim);
        let n = plan.n_tokens();
        let qkv = random_vec(seed ^ 77, n * 3 * nh * hd, 1.5);
        let mut want = vec![0f32; n * nh * hd];
        attention::tree_attention(&plan, &qkv, nh, hd, &mut want);
        let packed = TreeTiles::from_plan(&plan, 0);
        packed_tiles += (0..packed.n_tiles())
            .filter(|i| packed.tiles[4 * i + 3] != 0)
            .count();
        for t in [packed, TreeTiles::from_plan_unpacked(&plan, 0)] {
            let got = emulate_tiles(&t, &qkv, n, nh, hd);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() < 1e-4, "seed {seed} element {i}: {g} vs {w}");
            }
        }
    }
    assert!(
        packed_tiles > 10,
        "inline plans pack sibling candidates ({packed_tiles} tiles)"
    );
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
            qk_scale: 2.0,
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
                Group {
                    ranges,
                    n_new: seg.len as usize,
                    first_query: seg.start as usize,
                }
            })
            .collect();
        assert_eq!(
            TreeTiles::from_groups(&groups),
            TreeTiles::from_plan_unpacked(&plan, 0)
        );
    }
    let group = |ranges: Vec<std::ops::Range<usize>>, first_query| Group {
        ranges,
        n_new: 1,
        first_query,
    };
    let decode = TreeTiles::from_groups(&[
        group(vec![0..5, 9..10], 0),
        group(vec![0..3, 7..8, 10..11], 1),
    ]);
    assert!(decode.single_queries());
    assert_eq!(decode.tiles, vec![0, 1, 5, 0, 1, 1, 4, 0]);
    assert_eq!(decode.ctx_tokens, vec![0, 1, 2, 3, 4, 9, 0, 1, 2, 7, 10]);
    assert_eq!((decode.q_rows, decode.kv_rows), (2, 11));
}

// ---------------------------------------------------------------------------------------------
// From the hand mutation review of the emulated device (session 49).

/// The emulated device's own promises (kernels/emu/device), driven through cudarc directly: its
/// bounds and liveness checks, launch limits, events and host matmuls. Skipped on a GPU, whose
/// driver need not catch what these do on purpose.
#[cfg(feature = "emu")]
mod emulated_device {
    use super::*;
    use std::ffi::c_void;
    use toolsift::cuda::cudarc::cublaslt::{result as lt, sys as ltsys};
    use toolsift::cuda::cudarc::driver::{
        result as drv, sys, CudaContext, DevicePtr, DriverError, LaunchConfig, PushKernelArg,
    };
    use toolsift::cuda::cudarc::nvrtc::Ptx;

    /// Bytes of the raw allocations below: not a multiple of 16, so a byte past the end lands in
    /// the allocation's padding (a mutant that lets it through returns, rather than faulting).
    const N: usize = 13;

    fn emulated() -> Option<Gpu> {
        let gpu = gpu()?;
        if !gpu.name.contains("emulated") {
            eprintln!("SKIPPED: checks of the emulated device");
            return None;
        }
        gpu.ctx.bind_to_thread().unwrap();
        Some(gpu)
    }

    /// The emulated driver's reason for refusing `r` (its error string).
    fn reason<T: std::fmt::Debug>(r: Result<T, DriverError>) -> String {
        let e = r.expect_err("the emulated device accepted it");
        e.error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// A module whose PTX names `entries` (the emulated driver reads only the `.entry` names).
    fn module(
        ctx: &std::sync::Arc<CudaContext>,
        entries: &[&str],
    ) -> Result<std::sync::Arc<toolsift::cuda::cudarc::driver::CudaModule>, DriverError> {
        let mut ptx = String::from(".version 8.0\n.target sm_90\n");
        for e in entries {
            ptx += &format!(".visible .entry {e}(\n)\n{{\n}}\n");
        }
        ctx.load_module(Ptx::from_src(ptx))
    }

    /// `gelu_bf16(x, bias, n = 0, f, ld)` (touches no memory) with raw pointer arguments.
    fn launch_gelu(
        gpu: &Gpu,
        f: &toolsift::cuda::cudarc::driver::CudaFunction,
        x: u64,
        bias: u64,
        cfg: LaunchConfig,
    ) -> Result<(), DriverError> {
        let (n, width, ld) = (0u32, 4u32, 4u32);
        let mut b = gpu.stream.launch_builder(f);
        b.arg(&x).arg(&bias).arg(&n).arg(&width).arg(&ld);
        // SAFETY: n = 0: the kernel reads and writes nothing; the pointers are only checked.
        unsafe { b.launch(cfg) }.map(|_| ())
    }

    fn one_warp(smem: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: smem,
        }
    }

    /// Copies and memsets must lie inside one live allocation: a whole one, a tail from the
    /// middle and an empty copy at the end pass; one byte more, from the start or the middle, in
    /// any direction, is refused with its reason.
    #[test]
    fn copies_and_memsets_stop_at_the_end_of_an_allocation() {
        let Some(_gpu) = emulated() else { return };
        let bytes: Vec<u8> = (1..=N as u8 + 1).collect();
        let outside = "not inside one device allocation";
        // SAFETY: raw allocations of N bytes; every access that passes lies inside them.
        unsafe {
            let (p, q) = (drv::malloc_sync(N).unwrap(), drv::malloc_sync(N).unwrap());
            drv::memcpy_htod_sync(p, &bytes[..N]).unwrap();
            drv::memcpy_htod_sync(p + 5, &bytes[..N - 5]).unwrap();
            drv::memcpy_htod_sync(p + N as u64, &bytes[..0]).unwrap();
            for (at, n) in [(p, N + 1), (p + 5, N - 4)] {
                let why = reason(drv::memcpy_htod_sync(at, &bytes[..n]));
                assert!(
                    why.contains("cuMemcpyHtoD destination") && why.contains(outside),
                    "{why}"
                );
            }
            drv::memset_d8_sync(p + 2, 0xAB, N - 2).unwrap();
            let why = reason(drv::memset_d8_sync(p + 2, 0xAB, N - 1));
            assert!(why.contains("cuMemsetD8") && why.contains(outside), "{why}");
            drv::memcpy_dtod_sync(q, p, N).unwrap();
            let why = reason(drv::memcpy_dtod_sync(q + 1, p, N));
            assert!(why.contains("cuMemcpyDtoD destination"), "{why}");
            let why = reason(drv::memcpy_dtod_sync(q, p + 1, N));
            assert!(why.contains("cuMemcpyDtoD source"), "{why}");
            let mut back = [0u8; N + 1];
            let why = reason(drv::memcpy_dtoh_sync(&mut back[..], q));
            assert!(
                why.contains("cuMemcpyDtoH source") && why.contains(outside),
                "{why}"
            );
            drv::memcpy_dtoh_sync(&mut back[..N], q).unwrap();
            let mut want = vec![1u8, 2];
            want.extend([0xAB; N - 2]);
            assert_eq!(back[..N], want[..]);
            drv::free_sync(p).unwrap();
            drv::free_sync(q).unwrap();
        }
    }

    /// A launch checks every pointer argument (null, the middle or the end of a live allocation
    /// pass; a host pointer fails the launch, naming the first bad argument), the block, grid and
    /// dynamic shared memory limits, and the function attribute that raises the last; a module
    /// loads only kernels the host build has, and hands out one function per name.
    #[test]
    fn launches_check_pointer_arguments_and_limits() {
        let Some(gpu) = emulated() else { return };
        assert_eq!((gpu.sm_count, gpu.max_smem_optin), (132, 227 * 1024));
        let m = module(&gpu.ctx, &["gelu_bf16", "gelu_f16"]).unwrap();
        let (f, g) = (
            m.load_function("gelu_bf16").unwrap(),
            m.load_function("gelu_bf16").unwrap(),
        );
        let host_buffer = [0u8; 64];
        let host = host_buffer.as_ptr() as u64;
        // SAFETY: a raw allocation of N bytes, freed at the end; n = 0 launches touch nothing.
        let p = unsafe { drv::malloc_sync(N).unwrap() };
        for (x, bias) in [(p, 0), (p + 5, p + N as u64), (p + N as u64, p)] {
            launch_gelu(&gpu, &f, x, bias, one_warp(0)).unwrap();
        }
        for (x, bias, bad) in [(host, p, 0), (p, host, 1), (host, host, 0)] {
            let why = reason(launch_gelu(&gpu, &f, x, bias, one_warp(0)));
            let want = format!("kernel gelu_bf16: argument {bad} ");
            assert!(
                why.contains(&want) && why.contains("not in any device allocation"),
                "{why}"
            );
        }
        launch_gelu(&gpu, &f, p, p, one_warp(48 * 1024)).unwrap();
        let why = reason(launch_gelu(&gpu, &f, p, p, one_warp(48 * 1024 + 1)));
        assert!(why.contains("MAX_DYNAMIC_SHARED_SIZE_BYTES"), "{why}");
        let big = |grid_dim, block_dim| LaunchConfig {
            grid_dim,
            block_dim,
            shared_mem_bytes: 0,
        };
        for cfg in [big((1, 1, 1), (1025, 1, 1)), big((0, 1, 1), (32, 1, 1))] {
            let why = reason(launch_gelu(&gpu, &f, p, p, cfg));
            assert!(why.contains("out of range"), "{cfg:?}: {why}");
        }
        use sys::CUfunction_attribute_enum as Attr;
        const MAX_SMEM: Attr = Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let why = reason(f.set_attribute(MAX_SMEM, 227 * 1024 + 1));
        assert!(
            why.contains("MAX_DYNAMIC_SHARED_SIZE_BYTES 232449 is over the opt-in limit 232448"),
            "{why}"
        );
        f.set_attribute(MAX_SMEM, 227 * 1024).unwrap();
        // `g` is the same function as `f`, as on the device: the attribute holds for it.
        launch_gelu(&gpu, &g, p, p, one_warp(227 * 1024)).unwrap();
        // SAFETY: p is a live allocation of this test.
        unsafe { drv::free_sync(p).unwrap() };
        assert_eq!(
            m.load_function("layer_norm_bf16").unwrap_err().0,
            sys::CUresult::CUDA_ERROR_NOT_FOUND
        );
        let why = reason(module(&gpu.ctx, &["gelu_bf16", "no_such_kernel"]));
        assert!(
            why.contains("no_such_kernel") && why.contains("lacks"),
            "{why}"
        );
    }

    /// Events time what lies between their records through cudarc's `elapsed_ms`, which calls
    /// CUDA 13's `cuEventElapsedTime_v2`: the emulated driver had only the older name, so
    /// cudarc panicked on a missing symbol.
    #[test]
    fn events_time_what_lies_between_them() {
        let Some(gpu) = emulated() else { return };
        let new = || {
            gpu.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .unwrap()
        };
        let (start, end) = (new(), new());
        start.record(&gpu.stream).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        end.record(&gpu.stream).unwrap();
        let ms = start.elapsed_ms(&end).unwrap();
        assert!((19.0..10_000.0).contains(&ms), "{ms} ms");
    }

    /// Freeing and allocation accounting, and a freed pointer refused by copies and launches:
    /// in a process of its own (`lifecycle_child`), so no other test's allocation can take the
    /// freed address or the device's memory.
    #[test]
    fn freed_and_inner_pointers_and_the_whole_device() {
        cuda_common::run_child_on_a_small_device("emulated_device::lifecycle_child", 1 << 20);
    }

    #[test]
    #[ignore = "the child of freed_and_inner_pointers_and_the_whole_device"]
    fn lifecycle_child() {
        cuda_common::assert_run_by_its_parent();
        toolsift::emu::device::use_unless_gpu().unwrap();
        let ctx = CudaContext::new(0).unwrap();
        let stream = ctx.default_stream();
        let (free, total) = drv::mem_get_info().unwrap();
        assert_eq!((free, total), (1 << 20, 1 << 20));
        let f = module(&ctx, &["gelu_bf16"])
            .unwrap()
            .load_function("gelu_bf16")
            .unwrap();
        let launch = |x: u64, bias: u64| {
            let (n, width, ld) = (0u32, 4u32, 4u32);
            let mut b = stream.launch_builder(&f);
            b.arg(&x).arg(&bias).arg(&n).arg(&width).arg(&ld);
            // SAFETY: n = 0: the kernel touches nothing; the pointers are only checked.
            unsafe { b.launch(one_warp(0)) }.map(|_| ())
        };
        let not_start = "not the start of an allocation";
        // SAFETY: raw allocations; the accesses that pass lie inside live ones.
        unsafe {
            // The whole device in two allocations, and then not a byte more.
            let p = drv::malloc_sync(free / 2).unwrap();
            let q = drv::malloc_sync(free - free / 2).unwrap();
            assert_eq!(drv::mem_get_info().unwrap().0, 0);
            let oom = drv::malloc_sync(1).unwrap_err();
            assert_eq!(oom.0, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
            let why = reason(drv::free_sync(p + 4));
            assert!(why.contains(not_start), "{why}");
            drv::free_sync(p).unwrap();
            assert_eq!(drv::mem_get_info().unwrap().0, free / 2);
            let why = reason(drv::free_sync(p));
            assert!(why.contains(not_start), "{why}");
            let why = reason(drv::memcpy_htod_sync(p, &[0u8; 4]));
            assert!(why.contains("not inside one device allocation"), "{why}");
            let why = reason(launch(p, q));
            assert!(why.contains("argument 0"), "{why}");
            let why = reason(launch(q, p));
            assert!(why.contains("argument 1"), "{why}");
            launch(q, q).unwrap();
            drv::free_sync(q).unwrap();
            assert_eq!(drv::mem_get_info().unwrap().0, free);
        }
    }

    /// The stream (async) copies and memset, which cudarc's slices use, are checked like the
    /// blocking ones and go the same way: host to device, device to host, device to device from
    /// source to destination, with the value asked for.
    #[test]
    fn stream_copies_and_memsets_are_checked_and_go_the_right_way() {
        let Some(gpu) = emulated() else { return };
        let s = gpu.stream.cu_stream();
        let bytes: Vec<u8> = (1..=N as u8 + 1).collect();
        let outside = "not inside one device allocation";
        // SAFETY: raw allocations of N bytes; every access that passes lies inside them.
        unsafe {
            let (p, q) = (drv::malloc_sync(N).unwrap(), drv::malloc_sync(N).unwrap());
            let why = reason(drv::memcpy_htod_async(p + 1, &bytes[..N], s));
            assert!(
                why.contains("cuMemcpyHtoD destination") && why.contains(outside),
                "{why}"
            );
            drv::memcpy_htod_async(p, &bytes[..N], s).unwrap();
            drv::memset_d8_async(q, 0x5C, N, s).unwrap();
            let why = reason(drv::memset_d8_async(q + 3, 0x5C, N - 2, s));
            assert!(why.contains("cuMemsetD8") && why.contains(outside), "{why}");
            // q's first 4 bytes from p's bytes 2..6.
            drv::memcpy_dtod_async(q, p + 2, 4, s).unwrap();
            let why = reason(drv::memcpy_dtod_async(q, p + 2, N, s));
            assert!(why.contains("cuMemcpyDtoD source"), "{why}");
            let mut back = [0u8; N + 1];
            let why = reason(drv::memcpy_dtoh_async(&mut back[..], q, s));
            assert!(
                why.contains("cuMemcpyDtoH source") && why.contains(outside),
                "{why}"
            );
            drv::memcpy_dtoh_async(&mut back[..N], q, s).unwrap();
            let mut want = bytes[2..6].to_vec();
            want.extend([0x5C; N - 4]);
            assert_eq!(back[..N], want[..]);
            drv::memcpy_dtoh_async(&mut back[..N], p, s).unwrap();
            assert_eq!(back[..N], bytes[..N]);
            drv::free_sync(p).unwrap();
            drv::free_sync(q).unwrap();
        }
    }

    /// A launch refuses every grid or block past the device's limits with its reason: an
    /// empty grid in y or z, a grid past 65535 in y or z, a block past 64 in z or of no threads.
    #[test]
    fn launches_refuse_grids_and_blocks_past_each_limit() {
        let Some(gpu) = emulated() else { return };
        let f = module(&gpu.ctx, &["gelu_bf16"])
            .unwrap()
            .load_function("gelu_bf16")
            .unwrap();
        // SAFETY: a raw allocation of N bytes, freed at the end; n = 0 launches touch nothing.
        let p = unsafe { drv::malloc_sync(N).unwrap() };
        let cfg = |grid_dim, block_dim| LaunchConfig {
            grid_dim,
            block_dim,
            shared_mem_bytes: 0,
        };
        launch_gelu(&gpu, &f, p, p, cfg((2, 3, 2), (1, 1, 64))).unwrap();
        for c in [
            cfg((1, 0, 1), (32, 1, 1)),
            cfg((1, 1, 0), (32, 1, 1)),
            cfg((1, 65536, 1), (32, 1, 1)),
            cfg((1, 1, 65536), (32, 1, 1)),
            cfg((1, 1, 1), (1, 1, 65)),
            cfg((1, 1, 1), (0, 1, 1)),
        ] {
            let why = reason(launch_gelu(&gpu, &f, p, p, c));
            assert!(why.contains("is out of range"), "{c:?}: {why}");
        }
        // SAFETY: p is a live allocation of this test.
        unsafe { drv::free_sync(p).unwrap() };
    }

    /// MAX_DYNAMIC_SHARED_SIZE_BYTES reads back as set, a negative one is refused, and no other
    /// attribute moves the limit (a carveout of 50 leaves a 48 KiB launch allowed).
    #[test]
    fn only_the_shared_memory_attribute_sets_the_launch_limit_and_reads_back() {
        let Some(gpu) = emulated() else { return };
        use sys::CUfunction_attribute_enum as Attr;
        const MAX_SMEM: Attr = Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // A module of its own: the function's attributes start at the device's defaults.
        let f = module(&gpu.ctx, &["gelu_f16"])
            .unwrap()
            .load_function("gelu_f16")
            .unwrap();
        assert_eq!(f.get_attribute(MAX_SMEM).unwrap(), 48 * 1024);
        f.set_attribute(Attr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 50)
            .unwrap();
        // SAFETY: a raw allocation of N bytes, freed at the end; n = 0 launches touch nothing.
        let p = unsafe { drv::malloc_sync(N).unwrap() };
        launch_gelu(&gpu, &f, p, p, one_warp(48 * 1024)).unwrap();
        let why = reason(f.set_attribute(MAX_SMEM, -1));
        assert!(
            why.contains("MAX_DYNAMIC_SHARED_SIZE_BYTES -1 is negative"),
            "{why}"
        );
        f.set_attribute(MAX_SMEM, 100_000).unwrap();
        assert_eq!(f.get_attribute(MAX_SMEM).unwrap(), 100_000);
        // SAFETY: p is a live allocation of this test.
        unsafe { drv::free_sync(p).unwrap() };
    }

    /// An error given without a reason (out of memory) is not told with the reason of an earlier
    /// error of another code; text that is not PTX (no `.target`) is refused as an image.
    #[test]
    fn an_error_has_only_its_own_reason_and_a_module_needs_ptx() {
        let Some(gpu) = emulated() else { return };
        // SAFETY: a raw allocation of N bytes; the memset fails before it writes.
        unsafe {
            let p = drv::malloc_sync(N).unwrap();
            let why = reason(drv::memset_d8_sync(p, 0, N + 1));
            assert!(why.contains("cuMemsetD8"), "{why}");
            let oom = drv::malloc_sync(usize::MAX / 2).unwrap_err();
            assert_eq!(oom.0, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
            let why = reason::<()>(Err(oom));
            assert!(!why.contains("cuMemsetD8"), "{why}");
            drv::free_sync(p).unwrap();
        }
        let no_target = ".version 8.0\n.visible .entry gelu_bf16(\n)\n{\n}\n";
        let err = gpu.ctx.load_module(Ptx::from_src(no_target)).unwrap_err();
        assert_eq!(err.0, sys::CUresult::CUDA_ERROR_INVALID_IMAGE);
    }

    /// The device has one ordinal: 1 is an invalid device, not a second handle on device 0.
    #[test]
    fn only_device_0_exists() {
        let Some(_gpu) = emulated() else { return };
        assert_eq!(drv::device::get(0).unwrap(), 0);
        assert_eq!(
            drv::device::get(1).unwrap_err().0,
            sys::CUresult::CUDA_ERROR_INVALID_DEVICE
        );
    }

    /// The memory pool counts what stream allocations and frees hold, and its high-water mark,
    /// which a reset restarts at the bytes in use: in a process of its own (`pool_child`), so no
    /// other test's allocation moves the counts.
    #[test]
    fn the_pool_counts_stream_frees_and_its_high_water_mark() {
        cuda_common::run_child_on_a_small_device("emulated_device::pool_child", 1 << 30);
    }

    #[test]
    #[ignore = "the child of the_pool_counts_stream_frees_and_its_high_water_mark"]
    fn pool_child() {
        cuda_common::assert_run_by_its_parent();
        let gpu = cuda_common::gpu().unwrap();
        let pool = || gpu.pool_memory().unwrap().unwrap();
        // What the context holds itself.
        let z = pool().in_use;
        let (kept, freed) = (up(&gpu, &[1u8; 1000]), up(&gpu, &[2u8; 3000]));
        let both = pool();
        assert_eq!(both.in_use, z + 4000);
        assert!(both.high_water >= z + 4000, "{both:?}");
        drop(freed);
        let after = pool();
        assert_eq!(
            (after.in_use, after.high_water),
            (z + 1000, both.high_water)
        );
        gpu.reset_peak_memory().unwrap();
        let reset = pool();
        assert_eq!((reset.in_use, reset.high_water), (z + 1000, z + 1000));
        let more = up(&gpu, &[3u8; 500]);
        assert_eq!(pool().high_water, z + 1500);
        drop((kept, more));
        assert_eq!(pool().in_use, z);
    }

    /// `D = alpha op(A) op(B) + beta C` through the emulated cuBLASLt: `layouts` are (type,
    /// rows, cols, ld) of A, B, C and D, `ptrs` their device addresses.
    fn lt_matmul(
        trans: [i32; 2],
        layouts: [(ltsys::cudaDataType, u64, u64, i64); 4],
        ptrs: [u64; 4],
        [alpha, beta]: [f32; 2],
    ) -> Result<(), lt::CublasError> {
        use ltsys::cublasLtMatmulDescAttributes_t as Attr;
        let handle = lt::create_handle()?;
        let desc = lt::create_matmul_desc(
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_32F,
        )?;
        // SAFETY: i32 attribute buffers as documented; live descriptors and layouts; the
        // operands are device addresses the emulated cuBLASLt checks against its allocations.
        unsafe {
            for (attr, t) in [
                (Attr::CUBLASLT_MATMUL_DESC_TRANSA, &trans[0]),
                (Attr::CUBLASLT_MATMUL_DESC_TRANSB, &trans[1]),
            ] {
                lt::set_matmul_desc_attribute(desc, attr, t as *const i32 as *const c_void, 4)?;
            }
            let mut l = Vec::new();
            for (ty, rows, cols, ld) in layouts {
                l.push(lt::create_matrix_layout(ty, rows, cols, ld)?);
            }
            let pref = lt::create_matmul_pref()?;
            let h = lt::get_matmul_algo_heuristic(handle, desc, l[0], l[1], l[2], l[3], pref)?;
            lt::matmul(
                handle,
                desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                ptrs[0] as *const c_void,
                l[0],
                ptrs[1] as *const c_void,
                l[1],
                ptrs[2] as *const c_void,
                l[2],
                ptrs[3] as *mut c_void,
                l[3],
                &h.algo,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
            )?;
            for x in l {
                lt::destroy_matrix_layout(x)?;
            }
            lt::destroy_matmul_pref(pref)?;
            lt::destroy_matmul_desc(desc)?;
            lt::destroy_handle(handle)
        }
    }

    const F32: ltsys::cudaDataType = ltsys::cudaDataType::CUDA_R_32F;

    /// Every TRANSA / TRANSB pair, leading dimensions past the rows (each its own), alpha 2 and
    /// beta -1/2 on small integers: the emulated cuBLASLt is column-major BLAS exactly, leaves
    /// D's rows past m alone, and does not read C when beta is 0 (C all NaN).
    #[test]
    fn cublaslt_matmul_is_column_major_blas_for_every_transpose() {
        let Some(gpu) = emulated() else { return };
        let (m, n, k) = (3usize, 2usize, 4usize);
        let (ldc, pad) = (m + 3, 7777.0f32);
        for (ta, tb) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let (ar, ac) = if ta == 1 { (k, m) } else { (m, k) };
            let (br, bc) = if tb == 1 { (n, k) } else { (k, n) };
            let (lda, ldb) = (ar + 2, br + 1);
            let a: Vec<f32> = (0..lda * ac).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..ldb * bc).map(|i| (i % 5) as f32 - 2.0).collect();
            let c: Vec<f32> = (0..ldc * n).map(|i| (i % 4) as f32 + 1.0).collect();
            let op_a = |i: usize, p: usize| {
                if ta == 1 {
                    a[p + i * lda]
                } else {
                    a[i + p * lda]
                }
            };
            let op_b = |p: usize, j: usize| {
                if tb == 1 {
                    b[j + p * ldb]
                } else {
                    b[p + j * ldb]
                }
            };
            for (beta, c) in [(-0.5f32, c.clone()), (0.0, vec![f32::NAN; ldc * n])] {
                let mut want = vec![pad; ldc * n];
                for j in 0..n {
                    for i in 0..m {
                        let ab: f32 = (0..k).map(|p| op_a(i, p) * op_b(p, j)).sum();
                        let cij = if beta == 0.0 {
                            0.0
                        } else {
                            beta * c[i + j * ldc]
                        };
                        want[i + j * ldc] = 2.0 * ab + cij;
                    }
                }
                let (a_d, b_d, c_d) = (up(&gpu, &a), up(&gpu, &b), up(&gpu, &c));
                let d_d = up(&gpu, &vec![pad; ldc * n]);
                let ptrs = [
                    a_d.device_ptr(&gpu.stream).0,
                    b_d.device_ptr(&gpu.stream).0,
                    c_d.device_ptr(&gpu.stream).0,
                    d_d.device_ptr(&gpu.stream).0,
                ];
                let cd = (F32, m as u64, n as u64, ldc as i64);
                let layouts = [
                    (F32, ar as u64, ac as u64, lda as i64),
                    (F32, br as u64, bc as u64, ldb as i64),
                    cd,
                    cd,
                ];
                lt_matmul([ta, tb], layouts, ptrs, [2.0, beta]).unwrap();
                assert_eq!(
                    down(&gpu, &d_d),
                    want,
                    "TRANSA {ta} TRANSB {tb} beta {beta}"
                );
            }
        }
    }

    /// 16-bit outputs are rounded once, to nearest even (ties included, f16's subnormals and
    /// overflow too); an f16 subnormal input is read at its value.
    #[test]
    fn cublaslt_rounds_16_bit_outputs_to_nearest_even() {
        let Some(gpu) = emulated() else { return };
        let x: [f32; 8] = [
            1.0 + 3.0 / 512.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            -(1.0 + 3.0 / 4096.0),
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            1.5 / 16777216.0,
            70000.0,
        ];
        let m = x.len() as u64;
        let (x_d, one) = (up(&gpu, &x), up(&gpu, &[1f32]));
        let col = |ty| (ty, m, 1u64, m as i64);
        let one_by_one = (F32, 1u64, 1u64, 1i64);
        let bf = up(&gpu, &[bf16::ZERO; 8]);
        let hf = up(&gpu, &[f16::ZERO; 8]);
        let (xp, op) = (x_d.device_ptr(&gpu.stream).0, one.device_ptr(&gpu.stream).0);
        let (bp, hp) = (bf.device_ptr(&gpu.stream).0, hf.device_ptr(&gpu.stream).0);
        let bf_t = ltsys::cudaDataType::CUDA_R_16BF;
        let hf_t = ltsys::cudaDataType::CUDA_R_16F;
        let layouts = |out| [col(F32), one_by_one, col(out), col(out)];
        lt_matmul([0, 0], layouts(bf_t), [xp, op, bp, bp], [1.0, 0.0]).unwrap();
        lt_matmul([0, 0], layouts(hf_t), [xp, op, hp, hp], [1.0, 0.0]).unwrap();
        let want_bf: Vec<u16> = x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
        let want_hf: Vec<u16> = x.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
        let got_bf: Vec<u16> = down(&gpu, &bf).iter().map(|v| v.to_bits()).collect();
        let got_hf: Vec<u16> = down(&gpu, &hf).iter().map(|v| v.to_bits()).collect();
        assert_eq!(got_bf, want_bf, "bf16");
        assert_eq!(got_hf, want_hf, "f16");
        // 3 x 2^-24, an f16 subnormal, times 1 into f32.
        let (sub, h1) = (up(&gpu, &[f16::from_bits(3)]), up(&gpu, &[f16::ONE]));
        let out = up(&gpu, &[0f32]);
        let ptrs = [
            sub.device_ptr(&gpu.stream).0,
            h1.device_ptr(&gpu.stream).0,
            out.device_ptr(&gpu.stream).0,
            out.device_ptr(&gpu.stream).0,
        ];
        let h = (hf_t, 1u64, 1u64, 1i64);
        lt_matmul([0, 0], [h, h, one_by_one, one_by_one], ptrs, [1.0, 0.0]).unwrap();
        assert_eq!(down(&gpu, &out), [3.0 / 16777216.0]);
    }

    /// An operand that ends one element past its allocation is refused (one that ends exactly at
    /// it passes), and so are a leading dimension under the rows, op(A) and op(B) that disagree
    /// on k, and A and B of different types.
    #[test]
    fn cublaslt_refuses_operands_past_their_allocation_and_bad_shapes() {
        let Some(gpu) = emulated() else { return };
        // A 3 x 2 with ld 5 spans (2 - 1) * 5 + 3 = 8 elements; B 2 x 1; C = D 3 x 1.
        let a_layout = (F32, 3u64, 2u64, 5i64);
        let bcd = [(F32, 2u64, 1u64, 2i64), (F32, 3, 1, 3), (F32, 3, 1, 3)];
        let (b, d) = (up(&gpu, &[1f32, 2.0]), up(&gpu, &[0f32; 3]));
        let (bp, dp) = (b.device_ptr(&gpu.stream).0, d.device_ptr(&gpu.stream).0);
        for (len, fits) in [(8usize, true), (7, false)] {
            let a = up(&gpu, &vec![1f32; len]);
            let ptrs = [a.device_ptr(&gpu.stream).0, bp, dp, dp];
            let layouts = [a_layout, bcd[0], bcd[1], bcd[2]];
            let r = lt_matmul([0, 0], layouts, ptrs, [1.0, 0.0]);
            assert_eq!(r.is_ok(), fits, "A of {len} elements: {r:?}");
        }
        assert!(lt::create_matrix_layout(F32, 4, 2, 3).is_err());
        let nine = up(&gpu, &[0f32; 9]);
        let ptrs = [nine.device_ptr(&gpu.stream).0, bp, dp, dp];
        let k_differs = [(F32, 3u64, 3u64, 3i64), bcd[0], bcd[1], bcd[2]];
        assert!(lt_matmul([0, 0], k_differs, ptrs, [1.0, 0.0]).is_err());
        let bf_b = (ltsys::cudaDataType::CUDA_R_16BF, 2u64, 1u64, 2i64);
        let types_differ = [a_layout, bf_b, bcd[1], bcd[2]];
        assert!(lt_matmul([0, 0], types_differ, ptrs, [1.0, 0.0]).is_err());
    }

    /// NaN and infinite outputs stay so in bf16 and f16 (an all-ones NaN, which rounding would
    /// carry out of the word, included), and f16 inputs are read at their value: infinities,
    /// NaN, and a negative subnormal with its sign.
    #[test]
    fn cublaslt_keeps_nans_and_infinities_and_reads_f16_specials_at_their_value() {
        let Some(gpu) = emulated() else { return };
        let x = [
            f32::from_bits(0xffff_ffff),
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -2.5,
        ];
        let m = x.len() as u64;
        let (x_d, one) = (up(&gpu, &x), up(&gpu, &[1f32]));
        let col = |ty| (ty, m, 1u64, m as i64);
        let one_by_one = (F32, 1u64, 1u64, 1i64);
        let (bf, hf) = (up(&gpu, &[bf16::ZERO; 5]), up(&gpu, &[f16::ZERO; 5]));
        let (xp, op) = (x_d.device_ptr(&gpu.stream).0, one.device_ptr(&gpu.stream).0);
        let (bp, hp) = (bf.device_ptr(&gpu.stream).0, hf.device_ptr(&gpu.stream).0);
        let bf_t = ltsys::cudaDataType::CUDA_R_16BF;
        let hf_t = ltsys::cudaDataType::CUDA_R_16F;
        let layouts = |out| [col(F32), one_by_one, col(out), col(out)];
        lt_matmul([0, 0], layouts(bf_t), [xp, op, bp, bp], [1.0, 0.0]).unwrap();
        lt_matmul([0, 0], layouts(hf_t), [xp, op, hp, hp], [1.0, 0.0]).unwrap();
        let got_bf: Vec<f32> = down(&gpu, &bf).iter().map(|v| v.to_f32()).collect();
        let got_hf: Vec<f32> = down(&gpu, &hf).iter().map(|v| v.to_f32()).collect();
        for got in [&got_bf, &got_hf] {
            assert!(got[0].is_nan() && got[1].is_nan(), "{got:?}");
            assert_eq!(
                got[2..],
                [f32::INFINITY, f32::NEG_INFINITY, -2.5],
                "{got:?}"
            );
        }
        // f16 inputs times 1 into f32.
        let specials = [
            f16::INFINITY,
            f16::NEG_INFINITY,
            f16::NAN,
            f16::from_bits(0x8003),
            f16::from_bits(0x03ff),
        ];
        let (s_d, h1) = (up(&gpu, &specials), up(&gpu, &[f16::ONE]));
        let out = up(&gpu, &[0f32; 5]);
        let outp = out.device_ptr(&gpu.stream).0;
        let ptrs = [
            s_d.device_ptr(&gpu.stream).0,
            h1.device_ptr(&gpu.stream).0,
            outp,
            outp,
        ];
        let h = (hf_t, 1u64, 1u64, 1i64);
        lt_matmul([0, 0], [col(hf_t), h, col(F32), col(F32)], ptrs, [1.0, 0.0]).unwrap();
        let got = down(&gpu, &out);
        assert_eq!(got[..2], [f32::INFINITY, f32::NEG_INFINITY], "{got:?}");
        assert!(got[2].is_nan(), "{got:?}");
        assert_eq!(
            got[3..],
            [-3.0 / 16777216.0, 1023.0 / 16777216.0],
            "{got:?}"
        );
    }

    /// C and D must agree with op(A) op(B) and with each other (type and leading dimension),
    /// and only what is emulated is accepted: 8-bit types, an f16 scale type and a conjugate
    /// transpose (op 2) are refused.
    #[test]
    fn cublaslt_refuses_c_and_d_that_disagree_and_what_it_does_not_emulate() {
        let Some(gpu) = emulated() else { return };
        // A 3 x 2, B 2 x 1, so C = D 3 x 1; every buffer holds 8 f32, enough for each layout.
        let bufs: Vec<_> = (0..4).map(|_| up(&gpu, &[1f32; 8])).collect();
        let ptrs = [0, 1, 2, 3].map(|i| bufs[i].device_ptr(&gpu.stream).0);
        let (a, b) = ((F32, 3u64, 2u64, 3i64), (F32, 2u64, 1u64, 2i64));
        let cd = (F32, 3u64, 1u64, 3i64);
        lt_matmul([0, 0], [a, b, cd, cd], ptrs, [1.0, 0.5]).unwrap();
        let bf_t = ltsys::cudaDataType::CUDA_R_16BF;
        for (c, d) in [
            ((F32, 3, 1, 4), cd),
            ((bf_t, 3, 1, 3), cd),
            ((F32, 3, 2, 3), cd),
            ((F32, 3, 1, 4), (F32, 4, 1, 4)),
        ] {
            let r = lt_matmul([0, 0], [a, b, c, d], ptrs, [1.0, 0.5]);
            assert!(r.is_err(), "C {c:?}, D {d:?}");
        }
        // A stored 2 x 3, used transposed: op 1 passes, op 2 (conjugate) is refused.
        let at = (F32, 2u64, 3u64, 2i64);
        lt_matmul([1, 0], [at, b, cd, cd], ptrs, [1.0, 0.5]).unwrap();
        assert!(lt_matmul([2, 0], [at, b, cd, cd], ptrs, [1.0, 0.5]).is_err());
        assert!(lt::create_matrix_layout(ltsys::cudaDataType::CUDA_R_8I, 2, 2, 2).is_err());
        assert!(lt::create_matmul_desc(
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_16F
        )
        .is_err());
    }

    /// B, C and D are checked against their allocations like A: each one element short of its
    /// span is refused (C too when beta is 0 and it is not read).
    #[test]
    fn cublaslt_refuses_b_c_and_d_past_their_allocation() {
        let Some(gpu) = emulated() else { return };
        let layouts = [
            (F32, 3u64, 2u64, 3i64),
            (F32, 2, 1, 2),
            (F32, 3, 1, 3),
            (F32, 3, 1, 3),
        ];
        let spans = [6usize, 2, 3, 3];
        for short in 1..4 {
            let bufs: Vec<_> = (0..4)
                .map(|i| up(&gpu, &vec![1f32; spans[i] - (i == short) as usize]))
                .collect();
            let ptrs = [0, 1, 2, 3].map(|i| bufs[i].device_ptr(&gpu.stream).0);
            let r = lt_matmul([0, 0], layouts, ptrs, [1.0, 0.0]);
            assert!(r.is_err(), "operand {short} one element short");
        }
    }
}
