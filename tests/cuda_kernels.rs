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
