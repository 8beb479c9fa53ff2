//! `toolsift bench`: the standard workload (docs/benchmarks.md) on one random GPT-J, run by toolsift and
//! by both candle baselines in the same process, their losses checked against each other, and one
//! JSON line of figures. Ratios, not absolute times, are what this noisy machine can vouch for.

use std::time::Instant;

use serde::Serialize;

use crate::backend::Device;
use crate::cpu::{CpuScorer, RunStats};
use crate::error::{Error, Result};
use crate::model::{DType, GptjConfig, GptjWeights, Model};
use crate::score::{LossWeights, Placement, ScoreOptions, Scorer, TokenCandidate};
use crate::workload::Workload;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    pub placement: Placement,
    pub config: GptjConfig,
    pub n_texts: usize,
    pub seed: u64,
    /// Timed repetitions of toolsift (median reported); the baselines run `baseline_reps` times.
    pub reps: usize,
    pub baseline_reps: usize,
    /// Sequences per padded batch in the baselines.
    pub batch_size: usize,
    pub run_baselines: bool,
    pub device: Device,
    /// Benchmark these weights (a checkpoint folder) instead of random ones of `config`.
    pub model_dir: Option<std::path::PathBuf>,
}

/// A backend as the benchmark drives it: scores, and reports what its last run did.
trait Engine: Scorer {
    fn last_stats(&self) -> RunStats;
    fn weights_bytes(&self) -> usize;
}

impl Engine for CpuScorer {
    fn last_stats(&self) -> RunStats {
        CpuScorer::last_stats(self)
    }
    fn weights_bytes(&self) -> usize {
        CpuScorer::weights_bytes(self)
    }
}

#[cfg(feature = "cuda")]
impl Engine for crate::cuda::CudaScorer {
    fn last_stats(&self) -> RunStats {
        crate::cuda::CudaScorer::last_stats(self)
    }
    fn weights_bytes(&self) -> usize {
        crate::cuda::CudaScorer::weights_bytes(self)
    }
}

/// The engine under test. Random CPU weights are converted and released tensor by tensor.
fn open_engine(args: &BenchArgs, model: Option<Model>) -> Result<Box<dyn Engine>> {
    match args.device {
        Device::Cpu => Ok(Box::new(match model {
            Some(m) => CpuScorer::from_weights(&m.config, m.weights),
            None => CpuScorer::from_weights(
                &args.config,
                GptjWeights::random(&args.config, args.seed, DType::F32),
            ),
        })),
        Device::Cuda => open_cuda(args, model),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(args: &BenchArgs, model: Option<Model>) -> Result<Box<dyn Engine>> {
    let model = model.unwrap_or_else(|| {
        let w = GptjWeights::random(&args.config, args.seed, DType::BF16);
        Model::from_parts(args.config.clone(), w, None)
    });
    Ok(Box::new(crate::cuda::CudaScorer::new(
        &model,
        &crate::cuda::CudaOptions::default(),
    )?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_: &BenchArgs, _: Option<Model>) -> Result<Box<dyn Engine>> {
    Err(crate::backend::cuda_not_built())
}

/// The contract line printed last by `toolsift bench` (field names are an interface).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub placement: Placement,
    pub model: String,
    pub candidates: usize,
    pub baseline_cands_per_s: Option<f64>,
    pub tuned_cands_per_s: Option<f64>,
    pub toolsift_cands_per_s: f64,
    pub speedup: Option<f64>,
    pub speedup_vs_tuned: Option<f64>,
    pub unique_tokens: usize,
    pub baseline_tokens: usize,
    pub tuned_tokens: usize,
    pub toolsift_tokens_per_s: f64,
    pub gemm_gflops_peak: f64,
    pub trunk_gflops: f64,
    pub max_abs_diff: Option<f64>,
    // Additions beyond the contract.
    pub device: Device,
    /// "measured" (this machine's f32 GEMM, same run) or the H200's measured bf16 rate.
    pub peak_source: String,
    pub trunk_fraction_of_peak: f64,
    pub toolsift_secs: f64,
    pub baseline_secs: Option<f64>,
    pub tuned_secs: Option<f64>,
    pub attention_secs: f64,
    pub head_secs: f64,
    pub peak_rss_bytes: Option<u64>,
    pub weights_bytes: usize,
    pub kv_bytes: usize,
    pub memory_ratio: Option<f64>,
    pub threads: usize,
}

#[cfg(feature = "baselines")]
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Peak resident set size of this process so far (Linux), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(feature = "baselines")]
fn max_abs_diff(a: &[[f64; 3]], b: &[[f64; 3]]) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

pub fn run(args: &BenchArgs) -> Result<BenchReport> {
    if args.run_baselines && !cfg!(feature = "baselines") {
        // Before any work: the comparison is the point of the run.
        return run_baselines_unavailable();
    }
    let loaded = match &args.model_dir {
        Some(dir) => Some(Model::load(dir)?),
        None => None,
    };
    let config = loaded
        .as_ref()
        .map_or(args.config.clone(), |m| m.config.clone());
    let c = &config;
    c.validate().map_err(Error::input)?;
    if loaded.is_none() {
        check_fits_in_memory(c, args.n_texts)?;
    }
    let workload = Workload::standard(args.n_texts, args.seed);
    let candidates = workload.generate(c.vocab_size, args.placement);
    let options = ScoreOptions {
        placement: args.placement,
        weights: LossWeights::default(),
    };
    // The engines' `variant_losses` assume checked candidates (`Scorer::score` checks them); a
    // real checkpoint's n_positions may be too short for the workload's sequences.
    for cand in &candidates {
        crate::score::validate(cand, c, &options).map_err(|e| {
            Error::input(format!(
                "the standard workload does not fit this model: {e} (its sequences need up to \
                 ~272 positions)"
            ))
        })?;
    }
    let model_name = format!(
        "gptj L{} d{} h{} r{} v{}",
        c.n_layer,
        c.n_embd,
        c.n_head,
        c.rotary_dim(),
        c.vocab_size
    );
    tracing::info!(%model_name, candidates = candidates.len(), "bench");

    // toolsift first, so that the peak RSS below is its own (weights converted and released
    // tensor by tensor, then the plan's activations).
    let engine = open_engine(args, loaded)?;
    let mut ours = Vec::new();
    let mut runs = Vec::new();
    for _ in 0..args.reps.max(1) {
        let t = Instant::now();
        ours = engine.variant_losses(&candidates, &options)?;
        runs.push((t.elapsed().as_secs_f64(), engine.last_stats()));
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (toolsift_secs, stats) = runs[runs.len() / 2];
    let peak = peak_rss_bytes();
    let weights_bytes = engine.weights_bytes();
    let kv_bytes = stats.unique_tokens * c.n_layer * 2 * c.n_embd * 4;
    // Trunk GEMM time when the backend measures it, else the whole run (a lower bound).
    let gemm_secs = if stats.trunk_gemm_secs > 0.0 {
        stats.trunk_gemm_secs
    } else {
        toolsift_secs
    };
    let trunk_gflops =
        stats.unique_tokens as f64 * c.trunk_flops_per_token() / gemm_secs.max(1e-12) / 1e9;
    drop(engine);
    let (gemm_gflops_peak, peak_source) = match args.device {
        Device::Cpu => (crate::cpu::gemm::measure_peak_gflops(1536, 5), "measured"),
        // The H200's dense bf16 GEMM as measured there.
        Device::Cuda => (790_000.0, "h200-bf16-790-tflops"),
    };

    let n = candidates.len() as f64;
    let mut report = BenchReport {
        placement: args.placement,
        model: model_name,
        candidates: candidates.len(),
        baseline_cands_per_s: None,
        tuned_cands_per_s: None,
        toolsift_cands_per_s: n / toolsift_secs,
        speedup: None,
        speedup_vs_tuned: None,
        unique_tokens: stats.unique_tokens,
        baseline_tokens: 0,
        tuned_tokens: 0,
        toolsift_tokens_per_s: stats.unique_tokens as f64 / toolsift_secs,
        gemm_gflops_peak,
        trunk_gflops,
        max_abs_diff: None,
        device: args.device,
        peak_source: peak_source.into(),
        trunk_fraction_of_peak: trunk_gflops / gemm_gflops_peak,
        toolsift_secs,
        baseline_secs: None,
        tuned_secs: None,
        attention_secs: stats.attention_secs,
        head_secs: stats.head_secs,
        peak_rss_bytes: peak,
        weights_bytes,
        kv_bytes,
        memory_ratio: peak.map(|p| p as f64 / (weights_bytes + kv_bytes) as f64),
        threads: rayon::current_num_threads(),
    };
    if args.run_baselines {
        let mut args = args.clone();
        args.config = config.clone();
        run_baselines(&args, &candidates, &options, &ours, &mut report)?;
    }
    Ok(report)
}

#[cfg(feature = "baselines")]
fn run_baselines(
    args: &BenchArgs,
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
    ours: &[[f64; 3]],
    report: &mut BenchReport,
) -> Result<()> {
    use crate::baselines::{naive_losses, naive_tokens, tuned_losses, tuned_tokens, CandleGptj};
    let weights = match &args.model_dir {
        Some(dir) => Model::load(dir)?.weights,
        None => GptjWeights::random(&args.config, args.seed, DType::F32),
    };
    let model = CandleGptj::new(&args.config, &weights)
        .map_err(|e| Error::Backend(format!("candle: {e}")))?;
    drop(weights);
    let n = candidates.len() as f64;
    let time = |f: &dyn Fn() -> Result<Vec<[f64; 3]>>| -> Result<(f64, Vec<[f64; 3]>)> {
        let mut out = Vec::new();
        let mut secs = Vec::new();
        for _ in 0..args.baseline_reps.max(1) {
            let t = Instant::now();
            out = f()?;
            secs.push(t.elapsed().as_secs_f64());
        }
        Ok((median(secs), out))
    };
    let (tuned_secs, tuned) = time(&|| tuned_losses(&model, candidates, options, args.batch_size))?;
    let (naive_secs, naive) = time(&|| naive_losses(&model, candidates, options, args.batch_size))?;
    report.baseline_tokens = naive_tokens(candidates, options, args.batch_size);
    report.tuned_tokens = tuned_tokens(candidates, options, args.batch_size);
    report.baseline_cands_per_s = Some(n / naive_secs);
    report.tuned_cands_per_s = Some(n / tuned_secs);
    report.speedup = Some(naive_secs / report.toolsift_secs);
    report.speedup_vs_tuned = Some(tuned_secs / report.toolsift_secs);
    report.baseline_secs = Some(naive_secs);
    report.tuned_secs = Some(tuned_secs);
    report.max_abs_diff = Some(max_abs_diff(ours, &naive).max(max_abs_diff(ours, &tuned)));
    Ok(())
}

#[cfg(not(feature = "baselines"))]
fn run_baselines(
    _: &BenchArgs,
    _: &[TokenCandidate],
    _: &ScoreOptions,
    _: &[[f64; 3]],
    _: &mut BenchReport,
) -> Result<()> {
    run_baselines_unavailable()
}

fn run_baselines_unavailable<T>() -> Result<T> {
    Err(Error::Backend(
        "the candle baselines are not built in; rebuild with `--features baselines` \
         (or pass --skip-baselines to time toolsift alone)"
            .into(),
    ))
}

/// Refuses a random model and workload that cannot fit in this machine's memory (f32 weights
/// and the workload's K/V), before allocating: a typo in a size flag should not end in an
/// allocation abort or the OOM killer.
fn check_fits_in_memory(c: &crate::GptjConfig, n_texts: usize) -> Result<()> {
    // The K/V in f64, so that absurd flags cannot overflow the estimate: ~700 unique tokens per
    // text in prefix placement (docs/benchmarks.md); 1000 is generous.
    let params = c.checked_n_params().map_or(f64::INFINITY, |n| n as f64);
    let kv = (n_texts as f64) * 1000.0 * c.n_layer as f64 * 2.0 * c.n_embd as f64;
    let bytes = (params + kv) * 4.0;
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<f64>().ok()
    });
    match total {
        Some(kb) if bytes > kb * 1024.0 => Err(Error::input(format!(
            "this random model and workload need ~{:.1} GB (weights and K/V, f32), more than \
             this machine's {:.1} GB: lower --layers/--embd/--vocab or --texts",
            bytes / 1e9,
            kb * 1024.0 / 1e9
        ))),
        _ => Ok(()),
    }
}
