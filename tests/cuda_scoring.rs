//! Whole-plan scoring on the GPU against the f64 oracle: random small GPT-J configs (odd widths,
//! head_dim not a power of two, rotary_dim < head_dim, and multiples of 8 so the vector attention
//! path runs too), random non-zero weights stored in the device's type (bf16 or f16, so the
//! oracle sees exactly the device's weights), random candidate trees, both placements, memory
//! budgets that force the batch to be split, head chunks smaller than the head rows.
//!
//! Tolerance per loss: sum_t |w_t| g_t (A + R |log p_t|) approximated as
//! (sum_t |w_t| g_t) A + R g_max |loss|, with A = 16u (0.0625 bf16, 0.0078 f16), R = 4u, and g_t
//! the oracle's LayerNorm gain at the row that predicts target t: every GEMM input (h, ctx, mlp,
//! the head's hidden rows), q/k/v and P are rounded to the storage type once per layer (relative
//! error u each); the head's logits have magnitude ~4 (lm_head is sharpened on purpose by
//! `GptjWeights::random`), so one rounding of its inputs moves a logit by ~u * 4 and a log-prob
//! by up to ~2 * 4u = 8u; the trunk's 1-2 layers at most double that, times the gain where the
//! residual's terms nearly cancel (small widths, down to 2 here, now and then; tests/
//! cuda_sampling.rs's `tol` has the measurement). The test prints the largest fraction of the
//! budget used, to tighten it after GPU runs.
#![cfg(feature = "cuda")]

mod common;
mod cuda_common;

use cuda_common::{cases, gpu, mma_cases, MmaCases};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use toolsift::cuda::{CudaDType, CudaOptions, CudaScorer};
use toolsift::model::{DType, GptjConfig, GptjWeights};
use toolsift::reference::ReferenceModel;
use toolsift::score::LossWeights;
use toolsift::util::rng::Rng;
use toolsift::{Model, Placement, ReferenceScorer, ScoreOptions, Scorer, TokenCandidate};

#[derive(Debug, Clone)]
struct Problem {
    config: GptjConfig,
    dtype: CudaDType,
    seed: u64,
    n_texts: usize,
    max_text: usize,
    placement: Placement,
    budget_tokens: Option<usize>,
    head_chunk_rows: usize,
}

impl Problem {
    /// The problem's placement with the paper's loss weights.
    fn options(&self) -> ScoreOptions {
        ScoreOptions {
            placement: self.placement,
            weights: LossWeights::default(),
        }
    }

    /// Both attention tile layouts on alternate cases.
    fn pack_tiles(&self) -> bool {
        self.seed % 2 == 1
    }

    /// Both multi-query kernels on alternate pairs of cases, or one kernel only
    /// (TOOLSIFT_TEST_MMA).
    fn mma_attention(&self) -> bool {
        match mma_cases() {
            MmaCases::Without => false,
            MmaCases::Only => true,
            MmaCases::Both => self.seed % 4 >= 2,
        }
    }
}

fn problem() -> impl Strategy<Value = Problem> {
    (
        (
            1usize..=2,
            1usize..=4,
            1usize..=20,
            any::<bool>(),
            0usize..=4,
            20usize..=300,
        ),
        any::<u64>(),
        // Texts up to 160 tokens: one length in four gives segments longer than a 64-row query
        // tile, which the scorer splits into tiles of its own.
        (1usize..=3, prop::sample::select(vec![12usize, 30, 75, 160])),
        prop::sample::select(vec![CudaDType::BF16, CudaDType::F16]),
        any::<bool>(),
        prop::option::of(8usize..80),
        prop::sample::select(vec![1usize, 7, 64, 1024]),
    )
        .prop_map(
            |(
                (n_layer, n_head, half, mult8, rot, vocab),
                seed,
                (n_texts, max_text),
                dtype,
                inline,
                budget,
                head,
            )| {
                let head_dim = if mult8 {
                    8 * half.div_ceil(2)
                } else {
                    half + 1
                };
                let rotary_dim = (2 * rot).min(head_dim - head_dim % 2);
                let mut config =
                    GptjConfig::small(n_layer, n_head * head_dim, n_head, rotary_dim, vocab);
                config.n_positions = 128; // set to just what the candidates need in `check`
                config.n_inner = Some(3 * n_head * head_dim + 1);
                Problem {
                    config,
                    dtype,
                    seed,
                    n_texts,
                    max_text,
                    placement: if inline {
                        Placement::Inline
                    } else {
                        Placement::Prefix
                    },
                    budget_tokens: budget,
                    head_chunk_rows: head,
                }
            },
        )
}

fn candidates(p: &Problem, rng: &mut Rng) -> Vec<TokenCandidate> {
    common::random_candidates(rng, p.config.vocab_size, p.n_texts, p.max_text)
}

/// Returns the largest fraction of a tolerance budget used.
fn check(p: &Problem) -> Result<f64, TestCaseError> {
    let storage = match p.dtype {
        CudaDType::BF16 => DType::BF16,
        CudaDType::F16 => DType::F16,
    };
    let mut rng = Rng::new(p.seed ^ 0xABCD);
    let cands = candidates(p, &mut rng);
    let options = p.options();
    // n_positions at the longest sequence scored, or up to two past it.
    let longest = common::longest_sequence(&cands, &options);
    let mut config = p.config.clone();
    config.n_positions = longest + (p.seed % 3) as usize;
    let model = common::random_model(&config, p.seed, storage);
    let oracle = ReferenceScorer::new(&model)
        .score(&cands, &options)
        .unwrap();
    let opts = CudaOptions {
        dtype: Some(p.dtype),
        head_chunk_rows: p.head_chunk_rows,
        pack_tiles: p.pack_tiles(),
        mma_attention: p.mma_attention(),
        ..CudaOptions::default()
    };
    let mut gpu = CudaScorer::new(&model, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    if let Some(tokens) = p.budget_tokens {
        let bytes = tokens * gpu.bytes_per_token();
        gpu = gpu.with_memory_budget(bytes);
    }
    let got = gpu
        .score(&cands, &options)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(got.len(), oracle.len());
    let u = p.dtype.unit_roundoff();
    let reference = ReferenceModel::new(model.config(), model.weights());
    let mut worst = 0f64;
    for (k, (g, o)) in got.iter().zip(&oracle).enumerate() {
        for (variant, name, a, b) in common::variant_losses(g, o) {
            let tol =
                common::rounding_budget(&reference, &cands[k], variant, &options, u, b) + 1e-9;
            let used = (a - b).abs() / tol;
            worst = worst.max(used);
            prop_assert!(
                used <= 1.0,
                "candidate {k} {name}: cuda {a} vs reference {b}, |diff| {:.3e} ({:.0}% of the budget {tol:.3e})\n{p:?}",
                (a - b).abs(),
                100.0 * used
            );
        }
    }
    Ok(worst)
}

/// What a scoring call allocates on the device (the memory pool's peak over it, less what was
/// held before) stays within the scorer's own accounting: its largest chunk's activations and
/// attention context map (`bytes_per_token` a token, a u32 an ancestor entry; what
/// `plan_chunks` sizes chunks by) plus the LM head's scratch (`head_bytes`). The memory budget
/// is only as good as that accounting. Random problems as `cuda_matches_reference`'s, budgets
/// that split the batch included, in a process of their own: the pool is the whole process's.
#[test]
fn scoring_allocates_within_its_accounting() {
    if gpu().is_none() {
        return;
    }
    cuda_common::run_child("scoring_allocates_within_its_accounting_child", &[]);
}

#[test]
#[ignore = "the child of scoring_allocates_within_its_accounting"]
fn scoring_allocates_within_its_accounting_child() {
    if cuda_common::gpu_with_memory_pool().is_none() {
        return;
    }
    cuda_common::fuzz(
        "scoring_allocates_within_its_accounting",
        24,
        problem(),
        |p| {
            let cands = candidates(&p, &mut Rng::new(p.seed ^ 0xABCD));
            let options = p.options();
            let mut config = p.config.clone();
            config.n_positions = common::longest_sequence(&cands, &options) + 1;
            let p = Problem { config, ..p };
            let opts = CudaOptions {
                pack_tiles: p.pack_tiles(),
                mma_attention: p.mma_attention(),
                ..CudaOptions::default()
            };
            let scorer = scorer_with(&p, &opts);
            let gpu = scorer.gpu();
            let (_, memory) =
                cuda_common::device_memory_of(gpu, || scorer.score(&cands, &options).unwrap());
            let used = memory.allocated;
            let largest_chunk = scorer
                .plan_chunks(&cands, &options)
                .map(|(_, plan)| {
                    plan.tokens.len() * scorer.bytes_per_token() + 4 * plan.ancestors.len()
                })
                .max()
                .unwrap_or(0);
            let margin = cuda_common::pool_rounding_margin(gpu);
            let accounted = (largest_chunk + scorer.head_bytes()) as u64 + margin;
            prop_assert!(
                used <= accounted,
                "the call allocated {used} device bytes, over its accounting of {accounted} \
                 (largest chunk {largest_chunk}, head scratch {}, margin {margin})\n{p:?}",
                scorer.head_bytes()
            );
            Ok(())
        },
    );
}

#[test]
fn cuda_matches_reference() {
    if gpu().is_none() {
        return;
    }
    let n = cases(24);
    let mut runner = TestRunner::new(Config {
        cases: n,
        failure_persistence: None,
        ..Config::default()
    });
    let worst = std::sync::Mutex::new(0f64);
    runner
        .run(&problem(), |p| {
            let w = check(&p)?;
            let mut m = worst.lock().unwrap();
            *m = m.max(w);
            Ok(())
        })
        .unwrap();
    eprintln!(
        "cuda_matches_reference: {n} cases, worst loss used {:.1}% of its budget",
        100.0 * *worst.lock().unwrap()
    );
}

/// The scorer of `p` (bf16 weights from its seed), its budget `p.budget_tokens` if any.
fn scorer_for(p: &Problem) -> CudaScorer {
    scorer_with(p, &CudaOptions::default())
}

/// `scorer_for` with `options` but for its dtype and head chunk rows (`p`'s).
fn scorer_with(p: &Problem, options: &CudaOptions) -> CudaScorer {
    let model = common::random_model(&p.config, p.seed, DType::BF16);
    let opts = CudaOptions {
        dtype: Some(p.dtype),
        head_chunk_rows: p.head_chunk_rows,
        ..options.clone()
    };
    let scorer = CudaScorer::new(&model, &opts).unwrap();
    match p.budget_tokens {
        Some(tokens) => {
            let bytes = tokens * scorer.bytes_per_token();
            scorer.with_memory_budget(bytes)
        }
        None => scorer,
    }
}

/// One scorer shared by several threads (a budget small enough to split every batch): each
/// thread's losses are exactly those of the same batch scored alone, and the figures
/// `last_stats` keeps are one whole call's. A thread-safety check; that the calls wait for each
/// other is the next test's.
#[test]
fn concurrent_calls_on_one_scorer_equal_sequential_ones() {
    if gpu().is_none() {
        return;
    }
    let mut config = GptjConfig::small(2, 16, 2, 4, 97);
    config.n_positions = 128;
    let p = Problem {
        config,
        dtype: CudaDType::BF16,
        seed: 7,
        n_texts: 2,
        max_text: 30,
        placement: Placement::Prefix,
        budget_tokens: Some(24),
        head_chunk_rows: 7,
    };
    let scorer = scorer_for(&p);
    let options = p.options();
    let batches: Vec<Vec<TokenCandidate>> = (0..4u64)
        .map(|i| candidates(&p, &mut Rng::new(p.seed ^ (i + 1))))
        .collect();
    // Per batch: its losses and (unique tokens, head rows, chunks), scored one after another.
    let alone: Vec<_> = batches
        .iter()
        .map(|b| {
            let losses = scorer.variant_losses(b, &options).unwrap();
            let s = scorer.last_stats();
            assert!(s.chunks > 1, "the budget splits every batch");
            (losses, (s.unique_tokens, s.head_rows, s.chunks))
        })
        .collect();
    let together: Vec<Vec<[f64; 3]>> = std::thread::scope(|s| {
        let threads: Vec<_> = batches
            .iter()
            .map(|b| s.spawn(|| scorer.variant_losses(b, &options).unwrap()))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (k, (got, (want, _))) in together.iter().zip(&alone).enumerate() {
        let bits =
            |v: &[[f64; 3]]| -> Vec<[u64; 3]> { v.iter().map(|l| l.map(f64::to_bits)).collect() };
        assert_eq!(bits(got), bits(want), "batch {k}");
    }
    let s = scorer.last_stats();
    assert!(
        alone
            .iter()
            .any(|(_, f)| *f == (s.unique_tokens, s.head_rows, s.chunks)),
        "last_stats mixes calls: {s:?}"
    );
}

/// `last_stats` after a batch the budget splits: the unique tokens, head rows and chunks of every
/// plan chunk of the call added up (not the last chunk's alone), as `plan_chunks` cuts it.
#[test]
fn last_stats_add_up_every_chunk_of_a_call() {
    if gpu().is_none() {
        return;
    }
    let mut config = GptjConfig::small(1, 16, 2, 4, 61);
    config.n_positions = 128;
    let p = Problem {
        config,
        dtype: CudaDType::BF16,
        seed: 5,
        n_texts: 2,
        max_text: 30,
        placement: Placement::Inline,
        budget_tokens: Some(24),
        head_chunk_rows: 1024,
    };
    let scorer = scorer_for(&p);
    let options = p.options();
    let cands = candidates(&p, &mut Rng::new(p.seed));
    let (mut tokens, mut rows, mut chunks) = (0, 0, 0);
    for (_, plan) in scorer.plan_chunks(&cands, &options) {
        (tokens, rows, chunks) = (
            tokens + plan.n_tokens(),
            rows + plan.head_rows.len(),
            chunks + 1,
        );
    }
    assert!(chunks > 1, "the budget splits the batch");
    scorer.variant_losses(&cands, &options).unwrap();
    let s = scorer.last_stats();
    assert_eq!(
        (s.unique_tokens, s.head_rows, s.chunks),
        (tokens, rows, chunks)
    );
    assert!(s.total_secs > 0.0, "{s:?}");
}

/// `weights_bytes` counts every tensor as uploaded: matrices in the 16-bit storage type with
/// rows padded to 8 elements, LayerNorms and biases in f32.
#[test]
fn weights_bytes_count_the_uploaded_tensors() {
    use toolsift::cuda::stride;
    if gpu().is_none() {
        return;
    }
    let mut config = GptjConfig::small(2, 12, 2, 4, 37);
    config.n_inner = Some(21);
    let model = common::random_model(&config, 4, DType::F32);
    let (d, f, v) = (12, 21, 37);
    let (ds, fs) = (stride(d), stride(f));
    // Per layer: ln_1, qkv, out_proj, fc_in (+ bias), fc_out (+ bias); then wte, ln_f, lm_head
    // (+ bias).
    let layer = 2 * 4 * d + 2 * (3 * d * ds + d * ds + f * ds + d * fs) + 4 * (f + d);
    let want = 2 * layer + 2 * v * ds + 2 * 4 * d + 2 * v * ds + 4 * v;
    for dtype in [CudaDType::BF16, CudaDType::F16] {
        let opts = CudaOptions {
            dtype: Some(dtype),
            ..CudaOptions::default()
        };
        let scorer = CudaScorer::new(&model, &opts).unwrap();
        assert_eq!(scorer.weights_bytes(), want, "{dtype:?}");
    }
}

/// Row strides round a width up to a multiple of 8 elements (16 bytes of a 16-bit type) and
/// leave a multiple of 8 as it is: GPT-J's widths are stored unpadded.
#[test]
fn row_strides_round_up_to_8_and_leave_multiples_of_8_unpadded() {
    use toolsift::cuda::stride;
    let got: Vec<usize> = [1, 7, 8, 9, 16, 21, 4096, 16384, 50400]
        .map(stride)
        .to_vec();
    assert_eq!(got, [8, 8, 8, 16, 16, 24, 4096, 16384, 50400]);
}

/// The operand cap of `max_chunk_tokens` is set by the widest per-token operand, the MLP
/// hidden or qkv (3 x n_embd), whichever is wider; a budget that holds no token still runs one
/// at a time.
#[test]
fn max_chunk_tokens_caps_the_widest_operand_and_is_never_zero() {
    if gpu().is_none() {
        return;
    }
    let cap = i32::MAX as usize;
    for (n_inner, widest) in [(8, 48), (100, 104)] {
        let mut config = GptjConfig::small(1, 16, 2, 4, 61);
        config.n_inner = Some(n_inner);
        let model = common::random_model(&config, 8, DType::BF16);
        let scorer = CudaScorer::new(&model, &CudaOptions::default()).unwrap();
        let scorer = scorer.with_memory_budget(usize::MAX);
        assert_eq!(scorer.max_chunk_tokens(), cap / widest, "n_inner {n_inner}");
        let scorer = scorer.with_memory_budget(0);
        assert_eq!(scorer.max_chunk_tokens(), 1);
    }
}

/// `plan_chunks` counts the attention context map's u32 per ancestor entry, not only the
/// per-token margin: one call at every position of a text, inline, cuts the shared x_1..x_{i-1}
/// into one-token segments, and each position's branches list every segment before them. Each
/// chunk of several candidates stays within the budget (a test of the plan; nothing runs).
#[test]
fn chunks_of_a_deep_tree_fit_the_budget_with_their_context_map() {
    if gpu().is_none() {
        return;
    }
    let config = GptjConfig::small(1, 8, 2, 4, 29);
    let model = common::random_model(&config, 5, DType::BF16);
    let text: std::sync::Arc<[u32]> = (0..200).map(|t| t % 29).collect();
    let cands: Vec<TokenCandidate> = (1..text.len() - 5)
        .map(|position| TokenCandidate {
            text_ids: text.clone(),
            position,
            call_ids: vec![1, 2],
            call_result_ids: vec![1, 2, 3],
            weights: None,
        })
        .collect();
    let options = ScoreOptions {
        placement: Placement::Inline,
        weights: LossWeights::default(),
    };
    let scorer = CudaScorer::new(&model, &CudaOptions::default()).unwrap();
    let per_token = scorer.bytes_per_token();
    let budget = 2000 * per_token;
    let scorer = scorer.with_memory_budget(budget);
    let mut deep = false;
    for (range, plan) in scorer.plan_chunks(&cands, &options) {
        let (tokens, entries) = (plan.tokens.len(), plan.ancestors.len());
        deep |= 4 * entries > 64 * tokens;
        if range.len() > 1 {
            let need = tokens * per_token + 4 * entries;
            assert!(need <= budget, "{range:?}: {need} bytes over {budget}");
        }
    }
    assert!(deep, "no chunk's context map outgrew the per-token margin");
}

/// `head_chunk_rows` 0 counts as 1 (`CudaOptions`): the losses are those of head chunks of one
/// row (to f32 rounding: a GPU's cuBLASLt may sum a product of other rows in another order).
#[test]
fn a_head_chunk_of_zero_rows_counts_as_one() {
    if gpu().is_none() {
        return;
    }
    let mut config = GptjConfig::small(1, 16, 2, 4, 61);
    config.n_positions = 64;
    let p = |head_chunk_rows| Problem {
        config: config.clone(),
        dtype: CudaDType::BF16,
        seed: 9,
        n_texts: 1,
        max_text: 12,
        placement: Placement::Prefix,
        budget_tokens: None,
        head_chunk_rows,
    };
    let cands = candidates(&p(0), &mut Rng::new(9));
    let options = ScoreOptions::default();
    let [zero, one] = [0, 1].map(|rows| {
        scorer_for(&p(rows))
            .variant_losses(&cands, &options)
            .unwrap()
    });
    assert_eq!(zero.len(), one.len());
    for (z, o) in zero.iter().flatten().zip(one.iter().flatten()) {
        assert!((z - o).abs() <= 1e-4, "{z} vs {o}");
    }
}

/// A device ordinal past the machine's last device is refused by name, before any context is
/// created on it.
#[test]
fn a_device_ordinal_past_the_last_device_is_refused() {
    use toolsift::cuda::cudarc::driver::CudaContext;
    if gpu().is_none() {
        return;
    }
    let n = CudaContext::device_count().unwrap() as usize;
    let config = GptjConfig::small(1, 8, 2, 2, 16);
    let model = common::random_model(&config, 1, DType::BF16);
    let opts = CudaOptions {
        device: n,
        ..CudaOptions::default()
    };
    let err = CudaScorer::new(&model, &opts).unwrap_err().to_string();
    let want = format!("no CUDA device {n} (this machine has {n})");
    assert!(err.contains(&want), "{err}");
}

/// `execute` takes any plan, not only the checked candidates' of `score`: a token or target
/// outside the vocabulary, or a position past n_positions, is an error naming it, before any
/// kernel reads past a table. A valid plan runs.
#[test]
fn execute_refuses_a_plan_outside_the_vocabulary_or_the_positions() {
    use toolsift::plan::Plan;
    if gpu().is_none() {
        return;
    }
    let mut config = GptjConfig::small(1, 16, 2, 4, 61);
    config.n_positions = 32;
    let p = Problem {
        config,
        dtype: CudaDType::BF16,
        seed: 2,
        n_texts: 1,
        max_text: 12,
        placement: Placement::Prefix,
        budget_tokens: None,
        head_chunk_rows: 1024,
    };
    let scorer = scorer_for(&p);
    let cands = candidates(&p, &mut Rng::new(p.seed));
    let plan = Plan::build(&cands, &ScoreOptions::default());
    assert_eq!(scorer.execute(&plan).unwrap().len(), plan.targets.len());
    let mut bad = plan.clone();
    bad.tokens[0] = 61;
    let mut bad_target = plan.clone();
    bad_target.targets[0].token = 61;
    let mut bad_position = plan.clone();
    *bad_position.positions.last_mut().unwrap() = 32;
    for (plan, what) in [
        (bad, "a plan token is outside the vocabulary"),
        (bad_target, "a target token is outside the vocabulary"),
        (bad_position, "a plan position is beyond n_positions"),
    ] {
        let err = scorer.execute(&plan).unwrap_err().to_string();
        assert!(err.contains(what), "{err}");
    }
}

/// `CudaOptions::mma_attention` reaches the multi-query launches: the mma kernels take head_dim
/// <= 256, so a scorer asked for them at head_dim 264 fails with the kernel's own error, where
/// the WMMA kernel (the option off) scores. (Both kernels give the same losses, so a scorer that
/// ignored the option would pass `cuda_matches_reference`'s mma cases on the WMMA kernel.)
#[test]
fn the_mma_attention_option_selects_the_mma_kernels() {
    if gpu().is_none() {
        return;
    }
    let mut config = GptjConfig::small(1, 264, 1, 4, 29);
    config.n_positions = 64;
    let model = common::random_model(&config, 6, DType::BF16);
    let cands = common::random_candidates(&mut Rng::new(6), 29, 1, 12);
    let options = ScoreOptions::default();
    for mma in [false, true] {
        let opts = CudaOptions {
            dtype: Some(CudaDType::BF16),
            mma_attention: mma,
            ..CudaOptions::default()
        };
        let got = CudaScorer::new(&model, &opts)
            .unwrap()
            .variant_losses(&cands, &options);
        match (mma, got) {
            (false, got) => assert_eq!(got.unwrap().len(), cands.len()),
            (true, Err(e)) => assert!(e.to_string().contains("head_dim <= 256"), "{e}"),
            (true, Ok(_)) => panic!("mma attention ran at head_dim 264"),
        }
    }
}

/// Every entry point waits while another call holds the device: `propose` holds it while its
/// `choose` runs, and scoring, sampling, log-probs and a decode step started from other threads
/// inside `choose` do not finish before it returns; the same call from `choose`'s own thread is
/// an error, not a hang. A panic in `choose` (the device held) leaves the scorer usable.
#[test]
fn a_call_waits_for_the_one_in_flight_and_survives_its_panic() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use toolsift::sample::{Decoder, SampleOptions, SampleRequest, Sampler};
    if gpu().is_none() {
        return;
    }
    let mut config = GptjConfig::small(1, 16, 2, 4, 61);
    config.n_positions = 64;
    let p = Problem {
        config,
        dtype: CudaDType::BF16,
        seed: 3,
        n_texts: 1,
        max_text: 12,
        placement: Placement::Prefix,
        budget_tokens: None,
        head_chunk_rows: 1024,
    };
    let scorer = scorer_for(&p);
    let options = ScoreOptions::default();
    let cands = candidates(&p, &mut Rng::new(11));
    let want = scorer.variant_losses(&cands, &options).unwrap();
    let ids = [3u32, 5, 7, 11];
    let sample = SampleOptions::default();
    let requests = [SampleRequest {
        prefix: ids.to_vec(),
        n_samples: 2,
    }];
    let (started, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let entry_points = 4;
    let run = |call: &(dyn Fn() + Sync)| {
        started.fetch_add(1, Ordering::SeqCst);
        call();
        done.fetch_add(1, Ordering::SeqCst);
    };
    std::thread::scope(|s| {
        let mut choose = |_: &[Vec<f32>]| {
            let e = scorer.token_log_probs(&ids, &[0]).unwrap_err().to_string();
            assert!(e.contains("wait for itself"), "{e}");
            let (run, cands, options, want) = (&run, &cands, &options, &want);
            let (scorer, sample, requests) = (&scorer, &sample, &requests);
            s.spawn(move || {
                run(&|| assert_eq!(&scorer.variant_losses(cands, options).unwrap(), want))
            });
            s.spawn(move || run(&|| drop(scorer.token_log_probs(&ids, &[0]).unwrap())));
            s.spawn(move || run(&|| drop(scorer.sample(requests, sample).unwrap())));
            s.spawn(move || {
                run(&|| {
                    let mut session = scorer.session();
                    let k = session.new_sequence();
                    drop(session.extend(&[k], &[ids.to_vec()]).unwrap());
                })
            });
            while started.load(Ordering::SeqCst) < entry_points {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
            assert_eq!(
                done.load(Ordering::SeqCst),
                0,
                "a call ran while propose held the device"
            );
            Vec::new()
        };
        scorer.propose(&ids, &[0], &mut choose, &sample).unwrap();
    });
    assert_eq!(done.load(Ordering::SeqCst), entry_points);
    // The holder is cleared: the same thread's next call goes through.
    scorer.token_log_probs(&ids, &[0]).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut choose = |_: &[Vec<f32>]| -> Vec<toolsift::sample::Branch> {
            panic!("choose panics with the device held (expected)")
        };
        scorer.propose(&ids, &[0], &mut choose, &sample)
    }));
    assert!(panicked.is_err());
    assert_eq!(scorer.variant_losses(&cands, &options).unwrap(), want);
}

/// The fixture's filter cases (float16 weights, run in f16 on the device) against the float64
/// golden values. 0.02 absolute: f16 activations (u = 2^-11) move each log-prob by ~1e-3 on this
/// 2-layer model, and a weighted loss by up to 5.4e-3 (the emulated device, 2026-12-05: 36
/// losses, median 1.2e-3), so 0.02 is 3.7x the largest; the CPU f32 path is held to 1e-4.
#[test]
fn cuda_reproduces_the_golden_filter_cases() {
    if gpu().is_none() {
        return;
    }
    let cases = common::cases();
    let model = Model::load(common::tiny("f16")).unwrap();
    let cands: Vec<TokenCandidate> = cases
        .filter
        .iter()
        .map(|f| TokenCandidate {
            text_ids: f.text_ids.clone().into(),
            position: f.position,
            call_ids: f.call_ids.clone(),
            call_result_ids: f.call_result_ids.clone(),
            weights: Some(f.weights.clone()),
        })
        .collect();
    let scorer = CudaScorer::new(&model, &CudaOptions::default()).unwrap();
    assert_eq!(scorer.dtype(), CudaDType::F16);
    let got = scorer.score(&cands, &ScoreOptions::default()).unwrap();
    for (g, f) in got.iter().zip(&cases.filter) {
        common::assert_close(&f.text, g.l_none, f.l_none, 2e-2);
        common::assert_close(&f.text, g.l_call, f.l_call, 2e-2);
        common::assert_close(&f.text, g.l_call_result, f.l_call_result, 2e-2);
    }
}

/// A weight that f16 cannot hold, in a checkpoint of another dtype, is an error naming its
/// tensor when f16 storage is asked for (rounded, it would be inf, and every loss NaN); bf16,
/// the default for such a checkpoint, holds it.
#[test]
fn a_weight_past_the_f16_range_is_refused_for_f16_storage() {
    if gpu().is_none() {
        return;
    }
    let config = GptjConfig::small(2, 16, 2, 4, 32);
    let mut weights = GptjWeights::random(&config, 3, DType::F32);
    let fc_out = &mut weights.h[1].mlp.fc_out.weight;
    let mut values = fc_out.to_f32();
    values[5] = 1.0e5;
    *fc_out = toolsift::model::Tensor::from_f32(fc_out.shape().to_vec(), &values);
    let model = Model::from_parts(config, weights, None).unwrap();
    let f16 = CudaOptions {
        dtype: Some(CudaDType::F16),
        ..CudaOptions::default()
    };
    let err = CudaScorer::new(&model, &f16)
        .expect_err("f16 storage refused")
        .to_string();
    assert!(
        err.contains("`transformer.h.1.mlp.fc_out.weight`")
            && err.contains("100000")
            && err.contains("overflows f16"),
        "{err}"
    );
    assert!(CudaScorer::new(&model, &CudaOptions::default()).is_ok());
}

/// Asking for CUDA where it cannot run is an error that says why (checked on GPU-less machines).
/// A device with no memory left is `Error::OutOfMemory`, which a caller can tell from a lost
/// device (a smaller batch or budget may fit): on an emulated device of 1 MiB, where the
/// cuBLASLt workspace (32 MiB) cannot be allocated, in a process of its own. Skipped on a GPU.
#[test]
fn a_device_out_of_memory_is_its_own_error() {
    cuda_common::run_child_on_a_small_device("out_of_memory_child", 1 << 20);
}

#[test]
#[ignore = "the child of a_device_out_of_memory_is_its_own_error"]
fn out_of_memory_child() {
    cuda_common::assert_run_by_its_parent();
    // Not `gpu()`: its context's own workspace would fail first, outside the scorer.
    #[cfg(feature = "emu")]
    toolsift::emu::device::use_unless_gpu().unwrap();
    let config = GptjConfig::small(1, 32, 2, 4, 53);
    let m = common::random_model(&config, 5, DType::BF16);
    match CudaScorer::new(&m, &CudaOptions::default()) {
        Err(toolsift::Error::OutOfMemory(msg)) => {
            assert!(msg.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{msg}")
        }
        Err(other) => panic!("not OutOfMemory: {other:?}"),
        Ok(_) => panic!("1 MiB held the scorer"),
    }
}

/// With no budget given, a chunk may use 90% of what is free once the weights are up, less the
/// LM head's scratch (its [rows, vocab] logits and their log-softmax twin) and 1 GiB held back:
/// on an emulated device of 2 GiB, in a process of its own (`default_budget_child`), where no
/// other test allocates. Skipped on a GPU.
#[test]
fn the_default_budget_leaves_the_head_scratch_and_a_reserve_free() {
    cuda_common::run_child_on_a_small_device("default_budget_child", 2 << 30);
}

#[test]
#[ignore = "the child of the_default_budget_leaves_the_head_scratch_and_a_reserve_free"]
fn default_budget_child() {
    use toolsift::cuda::stride;
    cuda_common::assert_run_by_its_parent();
    let Some(_) = gpu() else { return };
    let config = GptjConfig::small(1, 64, 2, 4, 53);
    let m = common::random_model(&config, 5, DType::BF16);
    let scorer = CudaScorer::new(&m, &CudaOptions::default()).unwrap();
    let (free, _) = scorer.gpu().mem_info().unwrap();
    let head = 1024 * (2 * stride(64) + 2 * 4 * stride(53));
    let budget = (free - head - (1 << 30)) / 10 * 9;
    // Well under the operand cap, so the budget alone sets the chunk.
    assert_eq!(scorer.max_chunk_tokens(), budget / scorer.bytes_per_token());
}

#[test]
fn cuda_unavailable_is_a_clear_error() {
    let config = GptjConfig::small(1, 8, 2, 2, 16);
    let model = common::random_model(&config, 1, DType::BF16);
    match CudaScorer::new(&model, &CudaOptions::default()) {
        Ok(_) => eprintln!("a GPU is present; nothing to check"),
        Err(e) => {
            let msg = e.to_string();
            eprintln!("as expected without a GPU: {msg}");
            assert!(msg.starts_with("cuda:"), "{msg}");
        }
    }
}

/// GPU timing on a given model and workload, for scripts/gpu-check.sh (ignored by default):
/// TOOLSIFT_BENCH_MODEL (a GPT-J folder), TOOLSIFT_BENCH_INPUT (token-level JSONL lines with
/// text_ids, position, call_ids, call_result_ids), TOOLSIFT_BENCH_OUTPUT (JSON written there),
/// TOOLSIFT_BENCH_REPS (default 5), TOOLSIFT_BENCH_PLACEMENT (prefix|inline).
/// Times `variant_losses_unchecked` after one warm-up through the checked `variant_losses` (device
/// synchronised inside: the scorer reads the log-probs back), median of the reps, and writes the
/// losses for the agreement check.
#[test]
#[ignore]
fn cuda_bench() {
    let Ok(model_dir) = std::env::var("TOOLSIFT_BENCH_MODEL") else {
        eprintln!("SKIPPED: set TOOLSIFT_BENCH_MODEL and TOOLSIFT_BENCH_INPUT");
        return;
    };
    if gpu().is_none() {
        return;
    }
    let input = std::env::var("TOOLSIFT_BENCH_INPUT").expect("TOOLSIFT_BENCH_INPUT");
    let output =
        std::env::var("TOOLSIFT_BENCH_OUTPUT").unwrap_or_else(|_| "cuda_bench.json".into());
    let reps: usize = std::env::var("TOOLSIFT_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let placement = match std::env::var("TOOLSIFT_BENCH_PLACEMENT").as_deref() {
        Ok("inline") => Placement::Inline,
        _ => Placement::Prefix,
    };
    let t = std::time::Instant::now();
    let model = Model::load(&model_dir).unwrap();
    let load_secs = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let scorer = CudaScorer::new(&model, &CudaOptions::default()).unwrap();
    let upload_secs = t.elapsed().as_secs_f64();
    let cands: Vec<TokenCandidate> = std::fs::read_to_string(&input)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids = |k: &str| -> Vec<u32> {
                v[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            };
            TokenCandidate {
                text_ids: ids("text_ids").into(),
                position: v["position"].as_u64().unwrap() as usize,
                call_ids: ids("call_ids"),
                call_result_ids: ids("call_result_ids"),
                weights: None,
            }
        })
        .collect();
    let options = ScoreOptions {
        placement,
        weights: LossWeights::default(),
    };
    // The device memory pool's peak over every run, weights included: transformers' scorers
    // report torch.cuda.max_memory_allocated over theirs (`peak_mem_gib`).
    scorer.gpu().reset_peak_memory().unwrap();
    let held = scorer.gpu().pool_memory().unwrap();
    let losses = scorer.variant_losses(&cands, &options).unwrap(); // warm-up (and the answer)
    let mut times: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = std::time::Instant::now();
            scorer.variant_losses_unchecked(&cands, &options).unwrap(); // checked by the warm-up
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let stats = scorer.last_stats();
    let device_peak_bytes = held
        .zip(scorer.gpu().pool_memory().unwrap())
        .map(|(held, after)| after.peak_since(&held));
    // This card's dense bf16 GEMM rate, measured after the timed runs: the trunk's fraction of
    // it is the FLOP floor's figure (gpu-check's summary), whichever card ran.
    let gemm_peak_tflops = scorer.gpu().measure_peak_gflops(5).unwrap() / 1e3;
    let c = model.config();
    // Trunk FLOPs per token: 2 * (4 d^2 + 2 d f) per layer.
    let flop_per_token = 2.0
        * c.n_layer as f64
        * (4.0 * (c.n_embd * c.n_embd) as f64 + 2.0 * (c.n_embd * c.inner_dim()) as f64);
    let report = serde_json::json!({
        "device": scorer.gpu().name,
        "dtype": scorer.dtype().name(),
        "model": model_dir,
        "placement": format!("{placement:?}").to_lowercase(),
        "candidates": cands.len(),
        "unique_tokens": stats.unique_tokens,
        "head_rows": stats.head_rows,
        "chunks": stats.chunks,
        "load_secs": load_secs,
        "upload_secs": upload_secs,
        "secs_median": median,
        "secs_all": times,
        "cands_per_s": cands.len() as f64 / median,
        "tokens_per_s": stats.unique_tokens as f64 / median,
        "trunk_tflops": flop_per_token * stats.unique_tokens as f64 / median / 1e12,
        "gemm_peak_tflops": gemm_peak_tflops,
        "stage_secs_profiled": scorer.last_stage_secs(),
        // Weights plus the largest chunk's activations and K/V (the scorer's own accounting).
        "device_bytes_planned": scorer.weights_bytes()
            + stats.unique_tokens.div_ceil(stats.chunks.max(1)) * scorer.bytes_per_token(),
        // Measured: what the buffers held at most (None on a device without memory pools).
        "device_peak_bytes": device_peak_bytes,
        "peak_mem_gib": device_peak_bytes.map(|b| b as f64 / (1u64 << 30) as f64),
        "losses": losses,
    });
    std::fs::write(&output, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    eprintln!(
        "cuda_bench: {} candidates, {} unique tokens, median {:.4} s, {:.1} cands/s, trunk {:.1} TFLOP/s",
        cands.len(),
        stats.unique_tokens,
        median,
        cands.len() as f64 / median,
        flop_per_token * stats.unique_tokens as f64 / median / 1e12
    );
}
