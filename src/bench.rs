//! `toolsift bench`: the standard workload (docs/benchmarks.md) on one random GPT-J, run by
//! toolsift and by the three candle baselines in the same process, their losses checked against
//! each other, and one JSON line of figures. Ratios, not absolute times, are what this noisy
//! machine can vouch for: every engine is warmed up first, then the timed runs go in rounds
//! (toolsift, the GEMM peak, then in baseline rounds tuned, toolsift, naive, toolsift, tuned-kv,
//! toolsift), and each ratio is the median of its rounds' ratios, each baseline run over the
//! mean of the toolsift runs on either side of it, so that a change in the machine's load moves
//! both sides of a ratio together.

use std::time::Instant;

use serde::Serialize;

use crate::backend::Device;
use crate::cpu::CpuScorer;
use crate::error::{Error, Result};
use crate::model::{DType, GptjConfig, GptjWeights, Model};
use crate::run_stats::RunStats;
use crate::score::{LossWeights, Placement, ScoreOptions, Scorer, TokenCandidate};
use crate::workload::Workload;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// Where every variant's call goes; the workload's calls take the matching form
    /// (`Workload::generate`).
    pub placement: Placement,
    /// The random model's sizes; unused with `model_dir` (the folder's config.json decides).
    pub config: GptjConfig,
    /// Texts of the standard workload, 25 candidates each.
    pub n_texts: usize,
    /// Seed of the workload and of the random weights (`GptjWeights::random`).
    pub seed: u64,
    /// Timed rounds: toolsift runs in each of max(reps, baseline_reps), the baselines in the
    /// first `baseline_reps`; without baselines, max(reps, 1) rounds.
    pub reps: usize,
    /// Rounds the baselines are timed in, the first ones; at least 1 when `run_baselines`
    /// (`run` refuses 0).
    pub baseline_reps: usize,
    /// Sequences per padded batch in the baselines.
    pub batch_size: usize,
    /// Whether to run and time the candle baselines against toolsift; true needs the
    /// `baselines` feature and the CPU device (`run` refuses either, before any work).
    pub run_baselines: bool,
    /// Where toolsift's engine runs; the baselines always run on the CPU.
    pub device: Device,
    /// Benchmark these weights (a checkpoint folder) instead of random ones of `config`.
    pub model_dir: Option<std::path::PathBuf>,
}

/// A backend as the benchmark drives it: scores, and reports what its last run did.
trait Engine: Scorer {
    fn last_stats(&self) -> RunStats;
    fn weights_bytes(&self) -> usize;
    /// The machine's GEMM rate in GFLOP/s, measured now on the engine's own hardware.
    fn gemm_peak_gflops(&self) -> Result<f64>;
    /// Bytes of one K or V element as the engine stores them: 4 (the CPU's f32), 2 (CUDA's).
    fn kv_element_bytes(&self) -> usize;
    /// Restarts the high-water mark of the device memory the engine's buffers hold and returns
    /// the bytes held now; None for an engine whose memory is the process's (the CPU's).
    fn reset_device_peak(&self) -> Result<Option<u64>>;
    /// That high-water mark since `reset_device_peak` (which `held` is what it returned).
    fn device_peak(&self, held: u64) -> Result<Option<u64>>;
}

impl Engine for CpuScorer {
    fn last_stats(&self) -> RunStats {
        CpuScorer::last_stats(self)
    }
    fn weights_bytes(&self) -> usize {
        CpuScorer::weights_bytes(self)
    }
    fn gemm_peak_gflops(&self) -> Result<f64> {
        Ok(crate::cpu::gemm::measure_peak_gflops(1536, 5))
    }
    fn kv_element_bytes(&self) -> usize {
        4
    }
    fn reset_device_peak(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    fn device_peak(&self, _held: u64) -> Result<Option<u64>> {
        Ok(None)
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
    fn gemm_peak_gflops(&self) -> Result<f64> {
        self.gpu().measure_peak_gflops(5)
    }
    fn kv_element_bytes(&self) -> usize {
        2 // bf16 or f16
    }
    fn reset_device_peak(&self) -> Result<Option<u64>> {
        self.gpu().reset_peak_memory()?;
        Ok(self.gpu().pool_memory()?.map(|m| m.in_use))
    }
    fn device_peak(&self, held: u64) -> Result<Option<u64>> {
        // `held` too: the driver may restart the mark at 0 rather than at the bytes held.
        Ok(self.gpu().pool_memory()?.map(|m| m.high_water.max(held)))
    }
}

/// A baseline as the benchmark drives it: scores, and says how many tokens it pushed through
/// the trunk (padding included).
trait Baseline: Scorer {
    fn tokens(&self, candidates: &[TokenCandidate], options: &ScoreOptions) -> usize;
}

#[cfg(feature = "baselines")]
impl Baseline for crate::baselines::BaselineScorer {
    fn tokens(&self, candidates: &[TokenCandidate], options: &ScoreOptions) -> usize {
        crate::baselines::BaselineScorer::tokens(self, candidates, options)
    }
}

/// The candle baselines on the bench's weights: tuned, naive, tuned-kv.
#[cfg(feature = "baselines")]
fn open_baselines(args: &BenchArgs, config: &GptjConfig) -> Result<[Box<dyn Baseline>; 3]> {
    use crate::baselines::{Baseline as Which, BaselineScorer, CandleGptj};
    let weights = match &args.model_dir {
        Some(dir) => Model::load(dir)?.into_parts().1,
        None => GptjWeights::random(config, args.seed, DType::F32),
    };
    let model =
        CandleGptj::new(config, &weights).map_err(|e| Error::Backend(format!("candle: {e}")))?;
    drop(weights);
    let open = |which| Box::new(BaselineScorer::new(model.clone(), which, args.batch_size));
    Ok([open(Which::Tuned), open(Which::Naive), open(Which::TunedKv)])
}

#[cfg(not(feature = "baselines"))]
fn open_baselines(_: &BenchArgs, _: &GptjConfig) -> Result<[Box<dyn Baseline>; 3]> {
    run_baselines_unavailable()
}

/// The engine under test. Random CPU weights are converted and released tensor by tensor.
fn open_engine(args: &BenchArgs, model: Option<Model>) -> Result<Box<dyn Engine>> {
    match args.device {
        Device::Cpu => Ok(Box::new(match model {
            Some(m) => CpuScorer::from_model(m),
            None => CpuScorer::from_weights(
                &args.config,
                GptjWeights::random(&args.config, args.seed, DType::F32),
            )?,
        })),
        Device::Cuda => open_cuda(args, model),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(args: &BenchArgs, model: Option<Model>) -> Result<Box<dyn Engine>> {
    let model = match model {
        Some(m) => m,
        None => {
            let w = GptjWeights::random(&args.config, args.seed, DType::BF16);
            Model::from_parts(args.config.clone(), w, None)?
        }
    };
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
///
/// Times are wall-clock seconds of one run over the whole workload (`variant_losses_unchecked`
/// on every candidate; the warm-up run is not timed). "Naive", "tuned" and "tuned_kv" are the
/// three candle baselines (`baselines::naive`, `baselines::tuned`, `baselines::tuned_kv`); their
/// fields are None, 0 or empty when they were not run (`--skip-baselines`).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The placement every variant was scored in.
    pub placement: Placement,
    /// The model's shape, "gptj L{n_layer} d{n_embd} h{n_head} r{rotary_dim} v{vocab_size}".
    pub model: String,
    /// Candidates of the workload, scored in each run: 25 per text.
    pub candidates: usize,
    /// `candidates` over the naive baseline's median seconds (`baseline_secs`).
    pub baseline_cands_per_s: Option<f64>,
    /// `candidates` over the tuned baseline's median seconds (`tuned_secs`).
    pub tuned_cands_per_s: Option<f64>,
    /// `candidates` over toolsift's median seconds (`toolsift_secs`).
    pub toolsift_cands_per_s: f64,
    /// The naive baseline's time over toolsift's: the median of `speedup_rounds`.
    pub speedup: Option<f64>,
    /// The tuned baseline's time over toolsift's: the median of `speedup_vs_tuned_rounds`.
    pub speedup_vs_tuned: Option<f64>,
    /// Tokens toolsift's engine computed in the median round: its plans' unique tokens, summed
    /// over plan chunks (`RunStats::unique_tokens`).
    pub unique_tokens: usize,
    /// Tokens the naive baseline pushes through the trunk, padding included (every variant of
    /// every candidate over its whole text); 0 without baselines.
    pub baseline_tokens: usize,
    /// Tokens the tuned baseline pushes through the trunk, padding included; 0 without
    /// baselines.
    pub tuned_tokens: usize,
    /// `unique_tokens` over `toolsift_secs`.
    pub toolsift_tokens_per_s: f64,
    /// The machine's GEMM rate in GFLOP/s that the fractions below divide by, median over the
    /// rounds: on the CPU a 1536^3 f32 GEMM through the `gemm` crate, measured in every round
    /// right after toolsift's run; on CUDA an 8192^3 bf16 GEMM through cuBLASLt on the engine's
    /// device, measured the same way (until 2026-12-06 CUDA used the H200's 790,000, a constant,
    /// `peak_source` "h200-bf16-790-tflops").
    pub gemm_gflops_peak: f64,
    /// What toolsift's layer GEMMs reached, GFLOP/s, median over the rounds: unique tokens x
    /// `GptjConfig::trunk_flops_per_token` over the seconds in those GEMMs, or over the whole
    /// run where the backend does not time them (CUDA without `TOOLSIFT_CUDA_PROFILE`).
    pub trunk_gflops: f64,
    /// The largest |toolsift - baseline| over every loss of every candidate, every baseline
    /// (toolsift's losses of the warm-up run, each baseline's of its last round); infinite when
    /// a loss of either side is not finite. `toolsift bench` fails, after printing the report,
    /// when it is over `LOSS_TOLERANCE`.
    pub max_abs_diff: Option<f64>,
    // Additions beyond the contract.
    /// The device toolsift's engine ran on.
    pub device: Device,
    /// "measured": this machine's GEMM, in the same run (`gemm_gflops_peak`).
    pub peak_source: String,
    /// The layer GEMMs' FLOP rate over the peak: how well the GEMM calls run (the CPU times
    /// them; on CUDA, without `TOOLSIFT_CUDA_PROFILE`, it is the whole run's, as below).
    pub trunk_fraction_of_peak: f64,
    /// The trunk's FLOPs over the whole run's time, over the peak: what the run as a whole
    /// reaches (attention, norms, the head and everything else count as time), comparable with
    /// the baselines' figures below and with the GPU runs'.
    pub whole_run_fraction_of_peak: f64,
    /// The same for each baseline, its tokens (padding included) over its time. Trunk FLOPs
    /// only, as for toolsift: the naive baseline also runs the full-vocabulary head on every
    /// row, about as much work again at the bench's size, so its figure understates how well
    /// its GEMMs run (it measures useful work per second, as toolsift's does).
    pub baseline_fraction_of_peak: Option<f64>,
    /// The same for the tuned baseline: `tuned_tokens` x trunk FLOPs per token over
    /// `tuned_secs`, over the peak.
    pub tuned_fraction_of_peak: Option<f64>,
    /// Toolsift's seconds per run, the median over the `rounds`: one run per round, the extra
    /// runs after each baseline's not counted.
    pub toolsift_secs: f64,
    /// The naive baseline's seconds per run, the median over its `baseline_reps` rounds.
    pub baseline_secs: Option<f64>,
    /// The tuned baseline's seconds per run, the median over its `baseline_reps` rounds.
    pub tuned_secs: Option<f64>,
    /// Timed rounds: max(reps, baseline_reps) with the baselines, else max(reps, 1).
    pub rounds: usize,
    /// Each naive baseline round's ratio, in round order: its seconds over the mean of the
    /// toolsift runs just before and just after it (those after a baseline are extra runs, not
    /// in `toolsift_secs`); `speedup` is their median. Empty without baselines.
    pub speedup_rounds: Vec<f64>,
    /// The same for each tuned baseline round; `speedup_vs_tuned` is their median.
    pub speedup_vs_tuned_rounds: Vec<f64>,
    /// Seconds in tree attention in toolsift's median round (`RunStats::attention_secs`; 0 on
    /// CUDA without `TOOLSIFT_CUDA_PROFILE`).
    pub attention_secs: f64,
    /// Seconds in the LM head (ln_f, logits, log-softmax, targets) in the same round; 0 on
    /// CUDA without `TOOLSIFT_CUDA_PROFILE`.
    pub head_secs: f64,
    /// Rows through the LM head in the median round (weighted rows, deduplicated: fewer than
    /// the targets).
    pub head_rows: usize,
    /// The LM head's FLOP rate in GFLOP/s: `head_rows` x 2 x n_embd x vocab_size over
    /// `head_secs`.
    pub head_gflops: f64,
    /// This process's peak RSS while toolsift scores: its high-water mark is reset once the
    /// engine is built (`peak_rss_reset`) and read before the baselines load, so it is the
    /// engine's weights and the plan's activations (host memory: on CUDA the device's are not
    /// in it).
    pub peak_rss_bytes: Option<u64>,
    /// Bytes of the engine's weights: the CPU engine's f32 copy, or the CUDA engine's device
    /// copy (bf16 or f16).
    pub weights_bytes: usize,
    /// unique tokens x n_layer x 2 x d x the engine's element size (4 on the CPU, 2 on CUDA):
    /// a KV cache for the whole plan, the memory a cached engine would hold. The CPU engine
    /// holds none when it scores (each layer's K/V live in its activations, one layer at a
    /// time), so `memory_ratio` = peak / (weights + this) can be under 1; it is a yardstick,
    /// not the engine's accounting.
    pub kv_bytes: usize,
    /// CUDA: the most device memory the engine's buffers held at once in its first run over
    /// the workload (weights included), the device memory pool's high-water mark, which is what
    /// transformers' `torch.cuda.max_memory_allocated` counts; None on the CPU (its figure is
    /// `peak_rss_bytes`) or a device without memory pools.
    pub device_peak_bytes: Option<u64>,
    /// The engine's peak over (`weights_bytes` + `kv_bytes`): on the CPU `peak_rss_bytes`, on
    /// CUDA `device_peak_bytes`; None where that peak is unknown.
    pub memory_ratio: Option<f64>,
    /// Threads of the rayon pool `run` was called in (the global one unless the caller
    /// installed another): the CPU engine's and its GEMMs' parallelism.
    pub threads: usize,
    /// Whether the peak RSS was reset after the engine was built (Linux); false: the peak also
    /// holds the bench's random weights' construction.
    pub peak_rss_reset: bool,
    /// The third baseline, tuned-kv (`baselines::tuned_kv`): the tuned method with a KV cache
    /// of each text, so that in inline placement a call variant runs only from where it leaves
    /// the text (in prefix placement it is the tuned method). Its fields as the tuned
    /// baseline's: tokens pushed through the trunk (padding included, cached tokens not),
    /// candidates per second, median seconds, the median of its rounds' ratios and those
    /// ratios, and its trunk FLOPs over its time over the peak. It is in `max_abs_diff` too.
    pub tuned_kv_tokens: usize,
    /// See `tuned_kv_tokens`.
    pub tuned_kv_cands_per_s: Option<f64>,
    /// See `tuned_kv_tokens`.
    pub tuned_kv_secs: Option<f64>,
    /// See `tuned_kv_tokens`.
    pub speedup_vs_tuned_kv: Option<f64>,
    /// See `tuned_kv_tokens`.
    pub speedup_vs_tuned_kv_rounds: Vec<f64>,
    /// See `tuned_kv_tokens`.
    pub tuned_kv_fraction_of_peak: Option<f64>,
    /// Per timed round of the tuned baseline, `[its seconds, the mean of toolsift's two runs
    /// around it]`: each of `speedup_vs_tuned_rounds` is one quotient of these, so that the
    /// published ratio can be checked from the report (`toolsift_secs` is another median, over
    /// every round). Empty without baselines.
    pub tuned_round_secs: Vec<[f64; 2]>,
    /// As `tuned_round_secs`, for the naive baseline (`speedup_rounds`).
    pub baseline_round_secs: Vec<[f64; 2]>,
    /// As `tuned_round_secs`, for tuned + KV cache (`speedup_vs_tuned_kv_rounds`).
    pub tuned_kv_round_secs: Vec<[f64; 2]>,
    /// The threads candle's baselines run their matrix products on (its own count:
    /// RAYON_NUM_THREADS, else the CPU affinity mask or the physical cores; its element-wise
    /// pool follows CANDLE_NUM_THREADS where that is set), beside toolsift's `threads`; None
    /// without baselines.
    pub baseline_threads: Option<usize>,
    /// The CPU's model name (Linux: /proc/cpuinfo), None where unknown.
    pub cpu_model: Option<String>,
    /// The 1-minute load average when the timed rounds started and when they ended (Linux): a
    /// shared machine whose load moved during the run gives ratios to repeat.
    pub load_average: Option<[f64; 2]>,
    /// The toolsift version that ran (the package's version).
    pub toolsift_version: String,
    /// When the report was made, seconds since the Unix epoch.
    pub unix_time: u64,
}

/// The 1-minute load average (Linux: /proc/loadavg).
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The threads candle runs its baselines' matrix products on: its own count
/// (RAYON_NUM_THREADS, else the affinity mask or the physical cores), which can differ from
/// toolsift's rayon pool (logical CPUs) where cores have SMT siblings.
fn baseline_threads() -> Option<usize> {
    #[cfg(feature = "baselines")]
    return Some(candle_core::utils::get_num_threads());
    #[cfg(not(feature = "baselines"))]
    None
}

/// The CPU's model name (Linux: the first "model name" of /proc/cpuinfo).
fn cpu_model() -> Option<String> {
    proc_value("/proc/cpuinfo", "model name")
}

/// The value of the first `key: value` line of a Linux /proc file ("VmHWM:   1234 kB" gives
/// "1234 kB"); None where the file or the key is missing.
fn proc_value(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// A /proc value in kB ("1234 kB"), in bytes.
fn proc_kb_as_bytes(path: &str, key: &str) -> Option<u64> {
    let kb: u64 = proc_value(path, key)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The median (the mean of the middle two of an even count); NaN for none.
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Peak resident set size of this process so far (Linux), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_kb_as_bytes("/proc/self/status", "VmHWM:")
}

/// The largest |a - b| over every loss; infinite when a loss of either side is not finite
/// (`f64::max` would skip a NaN, so an engine returning NaN would look exact), or when the two
/// sides answered different numbers of candidates (a zip would compare only the shorter).
fn max_abs_diff(a: &[[f64; 3]], b: &[[f64; 3]]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| {
            let d = (x - y).abs();
            if d.is_finite() {
                d
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// The largest difference between toolsift's losses and a baseline's for which a speedup is
/// reported as a comparison of the same work (the tolerance of the fixtures' checks).
pub const LOSS_TOLERANCE: f64 = 1e-3;

/// Resets this process's peak RSS to its current RSS (Linux `clear_refs` 5), so that
/// [`peak_rss_bytes`] measures from here on: the bench's random weights are built with a copy
/// that would otherwise set the peak. False where that is not possible (the peak then includes
/// everything before).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Runs the benchmark `args` describes (the module's docs give the order of the runs) and
/// returns its figures. Fails before any work on a request it cannot serve (baselines not
/// built, on CUDA, or in 0 rounds; a random model too large for this machine's memory; a
/// workload that does not fit the model's n_positions), and on any engine's error.
pub fn run(args: &BenchArgs) -> Result<BenchReport> {
    check_baselines_request(args)?;
    let loaded = match &args.model_dir {
        Some(dir) => Some(Model::load(dir)?),
        None => None,
    };
    let config = loaded
        .as_ref()
        .map_or(args.config.clone(), |m| m.config().clone());
    let options = ScoreOptions {
        placement: args.placement,
        weights: LossWeights::default(),
    };
    let candidates = standard_workload(args, &config, &options, loaded.is_none())?;
    let c = &config;
    let model_name = format!(
        "gptj L{} d{} h{} r{} v{}",
        c.n_layer,
        c.n_embd,
        c.n_head,
        c.rotary_dim(),
        c.vocab_size
    );
    tracing::info!(%model_name, candidates = candidates.len(), "bench");

    // Warm-ups first: toolsift's full run gives the losses the baselines are checked against,
    // and the peak RSS is its own (reset once the engine is built: its weights, then the plan's
    // activations) since the baselines' model is not loaded yet. The baselines warm up
    // on their first `batch_size` candidates each, a few padded batches (candle's allocations,
    // the thread pool).
    let engine = open_engine(args, loaded)?;
    let peak_reset = reset_peak_rss();
    let device_held = engine.reset_device_peak()?;
    // Checked once here; the timed calls below run the engines alone.
    let ours = engine.variant_losses(&candidates, &options)?;
    let memory = Memory {
        peak_rss_bytes: peak_rss_bytes(),
        peak_rss_reset: peak_reset,
        device_peak_bytes: match device_held {
            Some(held) => engine.device_peak(held)?,
            None => None,
        },
        weights_bytes: engine.weights_bytes(),
        kv_element_bytes: engine.kv_element_bytes(),
    };
    let baselines = if args.run_baselines {
        let baselines = open_baselines(args, &config)?;
        let warm_up = &candidates[..candidates.len().min(args.batch_size.max(1))];
        for b in &baselines {
            b.variant_losses_unchecked(warm_up, &options)?;
        }
        Some(baselines)
    } else {
        None
    };
    let rounds = time_rounds(args, &*engine, baselines.as_ref(), &candidates, &options)?;
    drop(engine);
    let mut report = toolsift_report(args, &config, model_name, &candidates, &rounds, &memory);
    if let Some(baselines) = &baselines {
        add_baselines(
            &mut report,
            &config,
            baselines,
            &rounds,
            &ours,
            &candidates,
            &options,
        );
    }
    Ok(report)
}

/// Refuses a baseline comparison this build or device cannot run, before any work: the
/// comparison is the point of such a run.
fn check_baselines_request(args: &BenchArgs) -> Result<()> {
    if !args.run_baselines {
        return Ok(());
    }
    if !cfg!(feature = "baselines") {
        return run_baselines_unavailable();
    }
    if args.baseline_reps == 0 {
        return Err(Error::input(
            "baseline_reps is 0: the baselines run in at least one round (or not at all: \
             run_baselines false)",
        ));
    }
    if args.device == Device::Cuda {
        return Err(Error::input(
            "the candle baselines run on the CPU, so a ratio against the GPU engine compares \
             devices, not scorers: bench --device cuda with --skip-baselines (the GPU \
             comparison, against transformers on the same card, is scripts/gpu-check.sh)",
        ));
    }
    Ok(())
}

/// The standard workload for `config`, checked to fit it (and, when `random`, this machine's
/// memory) before any engine is built.
fn standard_workload(
    args: &BenchArgs,
    config: &GptjConfig,
    options: &ScoreOptions,
    random: bool,
) -> Result<Vec<TokenCandidate>> {
    let c = config;
    // A loaded model's config was checked as it loaded; a random one's comes from the size
    // flags, which the message names.
    c.validate().map_err(|e| {
        Error::input(format!(
            "the random model's sizes (--layers, --embd, --heads, --rotary, --vocab; in the \
             library, BenchArgs::config): {e}"
        ))
    })?;
    if random {
        check_fits_in_memory(c, args.n_texts)?;
    }
    let workload = Workload::standard(args.n_texts, args.seed);
    let candidates = workload.generate(c.vocab_size, args.placement);
    // The engines' `variant_losses` assume checked candidates (`Scorer::score` checks them); a
    // real checkpoint's n_positions may be too short for the workload's sequences.
    for cand in &candidates {
        crate::score::validate(cand, c, options).map_err(|e| {
            Error::input(format!(
                "the standard workload does not fit this model: {e} (its sequences need up to \
                 ~272 positions)"
            ))
        })?;
    }
    // The naive baseline runs whole texts: found out here, not after the engine's warm-up.
    #[cfg(feature = "baselines")]
    if args.run_baselines {
        crate::baselines::check_whole_texts_fit(c, &candidates).map_err(|e| {
            Error::input(format!(
                "the standard workload does not fit this model's n_positions for the naive \
                 baseline ({e}); --skip-baselines runs toolsift alone"
            ))
        })?;
    }
    Ok(candidates)
}

/// What the engine held, measured around its warm-up run.
struct Memory {
    peak_rss_bytes: Option<u64>,
    peak_rss_reset: bool,
    device_peak_bytes: Option<u64>,
    weights_bytes: usize,
    kv_element_bytes: usize,
}

/// One timed toolsift run: seconds, its stats, the GEMM peak measured right after (GFLOP/s).
struct ToolsiftRound {
    secs: f64,
    stats: RunStats,
    peak_gflops: f64,
}

/// The timed rounds' figures. Baselines in the order of `open_baselines`: tuned, naive,
/// tuned-kv.
struct Rounds {
    toolsift: Vec<ToolsiftRound>,
    /// Each baseline's seconds per round.
    baseline_secs: [Vec<f64>; 3],
    /// Each baseline's losses (its last round's).
    baseline_losses: [Vec<[f64; 3]>; 3],
    /// toolsift's seconds around each baseline round: the ratios' denominators.
    bracketing: [Vec<f64>; 3],
    /// The 1-minute load average at the start and at the end.
    load_average: Option<[f64; 2]>,
}

/// The timed rounds: toolsift, the GEMM peak, then (in the first `baseline_reps` rounds) each
/// baseline followed by toolsift again.
fn time_rounds(
    args: &BenchArgs,
    engine: &dyn Engine,
    baselines: Option<&[Box<dyn Baseline>; 3]>,
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
) -> Result<Rounds> {
    let rounds = args.reps.max(1).max(if baselines.is_some() {
        args.baseline_reps
    } else {
        0
    });
    let mut r = Rounds {
        toolsift: Vec::new(),
        baseline_secs: Default::default(),
        baseline_losses: Default::default(),
        bracketing: Default::default(),
        load_average: None,
    };
    let load_at_start = load_average();
    for round in 0..rounds {
        let t = Instant::now();
        engine.variant_losses_unchecked(candidates, options)?;
        let secs = t.elapsed().as_secs_f64();
        let peak_gflops = engine.gemm_peak_gflops()?;
        r.toolsift.push(ToolsiftRound {
            secs,
            stats: engine.last_stats(),
            peak_gflops,
        });
        let mut before = secs;
        for (i, b) in baselines.into_iter().flatten().enumerate() {
            if round < args.baseline_reps {
                let t = Instant::now();
                r.baseline_losses[i] = b.variant_losses_unchecked(candidates, options)?;
                r.baseline_secs[i].push(t.elapsed().as_secs_f64());
                // toolsift again right after: the ratio's toolsift time is the mean of the runs
                // on either side of the baseline's, so that a change of load during a
                // minute-long baseline run reaches both sides of it, not only the baseline's.
                let t = Instant::now();
                engine.variant_losses_unchecked(candidates, options)?;
                let after = t.elapsed().as_secs_f64();
                r.bracketing[i].push((before + after) / 2.0);
                before = after;
            }
        }
    }
    r.load_average = load_at_start.zip(load_average()).map(|(a, b)| [a, b]);
    Ok(r)
}

/// The report of toolsift's rounds (the baselines' fields empty).
fn toolsift_report(
    args: &BenchArgs,
    c: &GptjConfig,
    model: String,
    candidates: &[TokenCandidate],
    rounds: &Rounds,
    memory: &Memory,
) -> BenchReport {
    let toolsift = &rounds.toolsift;
    let flops_per_token = c.trunk_flops_per_token();
    let toolsift_secs = median(&toolsift.iter().map(|r| r.secs).collect::<Vec<_>>());
    let gemm_gflops_peak = median(&toolsift.iter().map(|r| r.peak_gflops).collect::<Vec<_>>());
    // The stats of the median round (the upper one of an even count).
    let mut by_time: Vec<&ToolsiftRound> = toolsift.iter().collect();
    by_time.sort_by(|a, b| a.secs.total_cmp(&b.secs));
    let stats = by_time[by_time.len() / 2].stats;
    // Trunk GEMM time when the backend measures it, else the whole run (a lower bound); each
    // round's rate over that round's peak.
    let gemm_secs = |r: &ToolsiftRound| {
        if r.stats.trunk_gemm_secs > 0.0 {
            r.stats.trunk_gemm_secs
        } else {
            r.secs
        }
    };
    let trunk_gflops_of =
        |r: &ToolsiftRound| r.stats.unique_tokens as f64 * flops_per_token / gemm_secs(r) / 1e9;
    let trunk_gflops = median(&toolsift.iter().map(trunk_gflops_of).collect::<Vec<_>>());
    let trunk_fraction_of_peak = median(
        &toolsift
            .iter()
            .map(|r| trunk_gflops_of(r) / r.peak_gflops)
            .collect::<Vec<_>>(),
    );
    let whole_run_fraction_of_peak = stats.unique_tokens as f64 * flops_per_token
        / toolsift_secs.max(1e-12)
        / 1e9
        / gemm_gflops_peak;
    let weights_bytes = memory.weights_bytes;
    let kv_bytes = stats.unique_tokens * c.n_layer * 2 * c.n_embd * memory.kv_element_bytes;
    let engine_peak = match args.device {
        Device::Cpu => memory.peak_rss_bytes,
        Device::Cuda => memory.device_peak_bytes,
    };
    let head_flops = stats.head_rows as f64 * 2.0 * c.n_embd as f64 * c.vocab_size as f64;
    let n = candidates.len() as f64;
    BenchReport {
        placement: args.placement,
        model,
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
        peak_source: "measured".into(),
        trunk_fraction_of_peak,
        whole_run_fraction_of_peak,
        baseline_fraction_of_peak: None,
        tuned_fraction_of_peak: None,
        toolsift_secs,
        baseline_secs: None,
        tuned_secs: None,
        rounds: toolsift.len(),
        speedup_rounds: Vec::new(),
        speedup_vs_tuned_rounds: Vec::new(),
        attention_secs: stats.attention_secs,
        head_secs: stats.head_secs,
        head_rows: stats.head_rows,
        head_gflops: head_flops / stats.head_secs.max(1e-12) / 1e9,
        peak_rss_bytes: memory.peak_rss_bytes,
        weights_bytes,
        kv_bytes,
        device_peak_bytes: memory.device_peak_bytes,
        memory_ratio: engine_peak.map(|p| p as f64 / (weights_bytes + kv_bytes) as f64),
        threads: rayon::current_num_threads(),
        peak_rss_reset: memory.peak_rss_reset,
        tuned_kv_tokens: 0,
        tuned_kv_cands_per_s: None,
        tuned_kv_secs: None,
        speedup_vs_tuned_kv: None,
        speedup_vs_tuned_kv_rounds: Vec::new(),
        tuned_kv_fraction_of_peak: None,
        tuned_round_secs: Vec::new(),
        baseline_round_secs: Vec::new(),
        tuned_kv_round_secs: Vec::new(),
        baseline_threads: None,
        cpu_model: cpu_model(),
        load_average: rounds.load_average,
        toolsift_version: env!("CARGO_PKG_VERSION").into(),
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

/// The baselines' figures in `report`: their rates, each speedup (the median of its rounds'
/// ratios), their fractions of the GEMM peak, and the largest difference of their losses from
/// toolsift's (`ours`).
fn add_baselines(
    report: &mut BenchReport,
    c: &GptjConfig,
    [tuned, naive, tuned_kv]: &[Box<dyn Baseline>; 3],
    rounds: &Rounds,
    ours: &[[f64; 3]],
    candidates: &[TokenCandidate],
    options: &ScoreOptions,
) {
    let (timed, bracketing) = (&rounds.baseline_secs, &rounds.bracketing);
    let n = candidates.len() as f64;
    // A run of `tokens` trunk tokens in `secs` against the GEMM peak, as toolsift's whole run.
    let (flops_per_token, peak) = (c.trunk_flops_per_token(), report.gemm_gflops_peak);
    let fraction =
        |tokens: usize, secs: f64| tokens as f64 * flops_per_token / secs.max(1e-12) / 1e9 / peak;
    // Per round, [baseline secs, toolsift secs around it], and their quotients.
    let pairs = |secs: &[f64], toolsift: &[f64]| -> Vec<[f64; 2]> {
        secs.iter().zip(toolsift).map(|(&b, &t)| [b, t]).collect()
    };
    let ratios = |pairs: &[[f64; 2]]| -> Vec<f64> { pairs.iter().map(|[b, t]| b / t).collect() };
    report.tuned_round_secs = pairs(&timed[0], &bracketing[0]);
    report.baseline_round_secs = pairs(&timed[1], &bracketing[1]);
    report.tuned_kv_round_secs = pairs(&timed[2], &bracketing[2]);
    let [tuned_secs, naive_secs] = [median(&timed[0]), median(&timed[1])];
    report.tuned_tokens = tuned.tokens(candidates, options);
    report.baseline_tokens = naive.tokens(candidates, options);
    report.tuned_cands_per_s = Some(n / tuned_secs);
    report.baseline_cands_per_s = Some(n / naive_secs);
    report.tuned_secs = Some(tuned_secs);
    report.baseline_secs = Some(naive_secs);
    report.speedup_vs_tuned_rounds = ratios(&report.tuned_round_secs);
    report.speedup_rounds = ratios(&report.baseline_round_secs);
    report.speedup_vs_tuned = Some(median(&report.speedup_vs_tuned_rounds));
    report.speedup = Some(median(&report.speedup_rounds));
    report.tuned_fraction_of_peak = Some(fraction(report.tuned_tokens, tuned_secs));
    report.baseline_fraction_of_peak = Some(fraction(report.baseline_tokens, naive_secs));
    let kv_secs = median(&timed[2]);
    report.tuned_kv_tokens = tuned_kv.tokens(candidates, options);
    report.tuned_kv_cands_per_s = Some(n / kv_secs);
    report.tuned_kv_secs = Some(kv_secs);
    report.speedup_vs_tuned_kv_rounds = ratios(&report.tuned_kv_round_secs);
    report.speedup_vs_tuned_kv = Some(median(&report.speedup_vs_tuned_kv_rounds));
    report.tuned_kv_fraction_of_peak = Some(fraction(report.tuned_kv_tokens, kv_secs));
    report.baseline_threads = baseline_threads();
    report.max_abs_diff = Some(
        rounds
            .baseline_losses
            .iter()
            .map(|o| max_abs_diff(ours, o))
            .fold(0.0, f64::max),
    );
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
    let total = proc_kb_as_bytes("/proc/meminfo", "MemTotal:").map(|b| b as f64);
    match total {
        Some(total) if bytes > total => Err(Error::input(format!(
            "this random model and workload need ~{:.1} GB (weights and K/V, f32), more than \
             this machine's {:.1} GB: lower --layers/--embd/--vocab or --texts",
            bytes / 1e9,
            total / 1e9
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loss that is not finite on either side is an infinite difference: `f64::max` alone
    /// skips a NaN, and an engine returning NaN looked exact.
    #[test]
    fn a_loss_that_is_not_finite_is_an_infinite_difference() {
        let ours = [[0.5, 1.0, 2.0], [1.0, 1.0, 1.0]];
        assert_eq!(max_abs_diff(&ours, &ours), 0.0);
        let close = [[0.5, 1.0, 2.0], [1.0, 1.0, 1.0 + 1e-6]];
        assert!((max_abs_diff(&ours, &close) - 1e-6).abs() < 1e-12);
        for bad in [f64::NAN, f64::INFINITY] {
            let broken = [[bad; 3], [bad; 3]];
            assert_eq!(max_abs_diff(&broken, &ours), f64::INFINITY);
            assert_eq!(max_abs_diff(&ours, &broken), f64::INFINITY);
            let one = [[0.5, 1.0, 2.0], [1.0, bad, 1.0]];
            assert_eq!(max_abs_diff(&ours, &one), f64::INFINITY);
        }
        // A side that answered fewer candidates is no comparison of the same work.
        assert_eq!(max_abs_diff(&ours, &ours[..1]), f64::INFINITY);
        assert_eq!(max_abs_diff(&ours[..1], &ours), f64::INFINITY);
    }

    /// The report's medians: the middle of the sorted values, the mean of the middle two of an
    /// even count (the ratios of two baseline rounds), NaN of none.
    #[test]
    fn median_is_the_sorted_middle_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[5.0]), 5.0);
        assert!(median(&[]).is_nan());
    }

    // From the second hand mutation review of src/bench.rs.

    /// A toolsift round of `secs` whose stats all differ from the other rounds', so that a
    /// figure read from the wrong round is seen.
    fn round(secs: f64, k: usize, peak_gflops: f64) -> ToolsiftRound {
        ToolsiftRound {
            secs,
            stats: RunStats {
                unique_tokens: 1000 + k,
                head_rows: 50 + k,
                chunks: 1,
                trunk_gemm_secs: secs / (2.0 + k as f64),
                attention_secs: 0.01 * (k + 1) as f64,
                head_secs: 0.1 * (k + 1) as f64,
                total_secs: secs,
            },
            peak_gflops,
        }
    }

    fn bench_args(device: Device) -> BenchArgs {
        BenchArgs {
            placement: Placement::Inline,
            config: GptjConfig::small(2, 64, 4, 16, 512),
            n_texts: 1,
            seed: 3,
            reps: 3,
            baseline_reps: 2,
            batch_size: 8,
            run_baselines: false,
            device,
            model_dir: None,
        }
    }

    fn rounds(toolsift: Vec<ToolsiftRound>) -> Rounds {
        Rounds {
            toolsift,
            baseline_secs: Default::default(),
            baseline_losses: Default::default(),
            bracketing: Default::default(),
            load_average: Some([0.5, 1.5]),
        }
    }

    fn memory() -> Memory {
        Memory {
            peak_rss_bytes: Some(7_000_000),
            peak_rss_reset: false,
            device_peak_bytes: Some(3_000_000),
            weights_bytes: 1_000_000,
            kv_element_bytes: 4,
        }
    }

    /// Rounds out of time order (3 s, 1 s, 2 s) and each with its own stats and GEMM peak: the
    /// report's stats are the median-time round's (the third), its peak the median of the
    /// peaks, the trunk rate from the GEMMs' own seconds (the backend timed them), its fraction
    /// of the peak the median of each round's own quotient, the K/V bytes over every layer, and
    /// the memory figures and the load average passed through as measured.
    #[test]
    fn the_report_takes_the_median_rounds_stats_and_the_median_of_per_round_figures() {
        let c = GptjConfig::small(2, 64, 4, 16, 512);
        let rounds = rounds(vec![
            round(3.0, 0, 100.0),
            round(1.0, 1, 300.0),
            round(2.0, 2, 200.0),
        ]);
        let report = toolsift_report(
            &bench_args(Device::Cpu),
            &c,
            "m".into(),
            &[],
            &rounds,
            &memory(),
        );
        let median_round = &rounds.toolsift[2];
        assert_eq!(report.unique_tokens, 1002);
        assert_eq!(report.head_rows, 52);
        assert_eq!(report.attention_secs, median_round.stats.attention_secs);
        assert_eq!(report.head_secs, median_round.stats.head_secs);
        assert_eq!(report.toolsift_secs, 2.0);
        assert_eq!(report.gemm_gflops_peak, 200.0);
        let per_token = c.trunk_flops_per_token();
        let rate = |r: &ToolsiftRound| {
            r.stats.unique_tokens as f64 * per_token / r.stats.trunk_gemm_secs / 1e9
        };
        let rates: Vec<f64> = rounds.toolsift.iter().map(rate).collect();
        assert_eq!(report.trunk_gflops, median(&rates));
        let fractions: Vec<f64> = rounds
            .toolsift
            .iter()
            .map(|r| rate(r) / r.peak_gflops)
            .collect();
        assert_eq!(report.trunk_fraction_of_peak, median(&fractions));
        // The quotient of the medians is another figure: these rounds tell them apart.
        assert_ne!(
            report.trunk_fraction_of_peak,
            report.trunk_gflops / report.gemm_gflops_peak
        );
        assert_eq!(report.kv_bytes, 1002 * 2 * 2 * 64 * 4);
        assert!(!report.peak_rss_reset);
        assert_eq!(report.peak_rss_bytes, Some(7_000_000));
        assert_eq!(report.device_peak_bytes, Some(3_000_000));
        let memory_bytes = (1_000_000 + report.kv_bytes) as f64;
        assert_eq!(report.memory_ratio, Some(7_000_000.0 / memory_bytes));
        assert_eq!(report.load_average, Some([0.5, 1.5]));
        // On CUDA the engine's peak is the device's, not the process's RSS.
        let cuda = toolsift_report(
            &bench_args(Device::Cuda),
            &c,
            "m".into(),
            &[],
            &rounds,
            &memory(),
        );
        assert_eq!(cuda.memory_ratio, Some(3_000_000.0 / memory_bytes));
    }

    /// A baseline that reports `tokens` and never runs.
    struct Fake {
        config: GptjConfig,
        tokens: usize,
    }

    impl Scorer for Fake {
        fn name(&self) -> &str {
            "fake"
        }
        fn config(&self) -> &GptjConfig {
            &self.config
        }
        fn variant_losses_unchecked(
            &self,
            candidates: &[TokenCandidate],
            _: &ScoreOptions,
        ) -> Result<Vec<[f64; 3]>> {
            Ok(vec![[1.0; 3]; candidates.len()])
        }
    }

    impl Baseline for Fake {
        fn tokens(&self, _: &[TokenCandidate], _: &ScoreOptions) -> usize {
            self.tokens
        }
    }

    /// Each baseline's figures are its own: tuned, naive and tuned-kv (`open_baselines`' order)
    /// with their own tokens, seconds, toolsift seconds around them and losses, so that a figure
    /// built from another baseline's is seen; the loss difference is the largest of all three.
    #[test]
    fn each_baselines_figures_are_built_from_its_own_tokens_seconds_and_losses() {
        let c = GptjConfig::small(2, 64, 4, 16, 512);
        let mut rounds = rounds(vec![round(2.0, 0, 100.0)]);
        rounds.baseline_secs = [vec![4.0], vec![40.0], vec![3.0]];
        rounds.bracketing = [vec![1.5], vec![2.5], vec![2.25]];
        let ours = vec![[1.0, 2.0, 3.0]];
        rounds.baseline_losses = [
            vec![[1.0, 2.0, 3.0001]],
            vec![[1.0, 2.0002, 3.0]],
            vec![[1.0005, 2.0, 3.0]],
        ];
        let args = bench_args(Device::Cpu);
        let mut report = toolsift_report(&args, &c, "m".into(), &[], &rounds, &memory());
        let fake = |tokens| -> Box<dyn Baseline> {
            Box::new(Fake {
                config: c.clone(),
                tokens,
            })
        };
        let baselines = [fake(1000), fake(9000), fake(700)];
        let options = ScoreOptions::default();
        add_baselines(&mut report, &c, &baselines, &rounds, &ours, &[], &options);
        assert_eq!(report.tuned_round_secs, [[4.0, 1.5]]);
        assert_eq!(report.baseline_round_secs, [[40.0, 2.5]]);
        assert_eq!(report.tuned_kv_round_secs, [[3.0, 2.25]]);
        assert_eq!(
            [
                report.tuned_tokens,
                report.baseline_tokens,
                report.tuned_kv_tokens
            ],
            [1000, 9000, 700]
        );
        let fraction = |tokens: f64, secs: f64| {
            Some(tokens * c.trunk_flops_per_token() / secs / 1e9 / report.gemm_gflops_peak)
        };
        assert_eq!(report.tuned_fraction_of_peak, fraction(1000.0, 4.0));
        assert_eq!(report.baseline_fraction_of_peak, fraction(9000.0, 40.0));
        assert_eq!(report.tuned_kv_fraction_of_peak, fraction(700.0, 3.0));
        let diff = report.max_abs_diff.unwrap();
        assert!((diff - 0.0005).abs() < 1e-9, "{diff}");
    }

    /// An engine whose runs take 20, 260, 140 and 20 ms in turn (a round with the baselines
    /// runs it four times) and that reports nothing else.
    struct Timed {
        config: GptjConfig,
        runs: std::sync::atomic::AtomicUsize,
    }

    const RUN_MS: [u64; 4] = [20, 260, 140, 20];

    impl Scorer for Timed {
        fn name(&self) -> &str {
            "timed"
        }
        fn config(&self) -> &GptjConfig {
            &self.config
        }
        fn variant_losses_unchecked(
            &self,
            candidates: &[TokenCandidate],
            _: &ScoreOptions,
        ) -> Result<Vec<[f64; 3]>> {
            let k = self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(RUN_MS[k % 4]));
            Ok(vec![[1.0; 3]; candidates.len()])
        }
    }

    impl Engine for Timed {
        fn last_stats(&self) -> RunStats {
            RunStats::default()
        }
        fn weights_bytes(&self) -> usize {
            0
        }
        fn gemm_peak_gflops(&self) -> Result<f64> {
            Ok(1.0)
        }
        fn kv_element_bytes(&self) -> usize {
            4
        }
        fn reset_device_peak(&self) -> Result<Option<u64>> {
            Ok(None)
        }
        fn device_peak(&self, _: u64) -> Result<Option<u64>> {
            Ok(None)
        }
    }

    /// With the baselines the rounds are max(reps, baseline_reps), and each baseline's toolsift
    /// time is the mean of the toolsift runs just before and just after it: 20 and 260 ms
    /// around tuned, 260 and 140 around naive, 140 and 20 around tuned-kv (the sleeps are lower
    /// bounds: only a shorter figure than these can be wrong, whatever the machine's load).
    #[test]
    fn each_baseline_round_is_bracketed_by_the_toolsift_runs_either_side_of_it() {
        let c = GptjConfig::small(1, 16, 2, 4, 64);
        let engine = Timed {
            config: c.clone(),
            runs: Default::default(),
        };
        let fake = || -> Box<dyn Baseline> {
            Box::new(Fake {
                config: c.clone(),
                tokens: 0,
            })
        };
        let baselines = [fake(), fake(), fake()];
        let args = BenchArgs {
            reps: 1,
            baseline_reps: 2,
            ..bench_args(Device::Cpu)
        };
        let options = ScoreOptions::default();
        let r = time_rounds(&args, &engine, Some(&baselines), &[], &options).unwrap();
        assert_eq!(r.toolsift.len(), 2, "max(reps, baseline_reps)");
        for (i, want_ms) in [140.0, 200.0, 80.0].into_iter().enumerate() {
            assert_eq!(r.baseline_secs[i].len(), 2);
            for (round, &got) in r.bracketing[i].iter().enumerate() {
                assert!(
                    got >= want_ms / 1e3,
                    "baseline {i} round {round}: {got} s, not under {want_ms} ms"
                );
            }
        }
        assert!(r.toolsift.iter().all(|t| t.secs >= 0.02));
    }

    /// The memory check counts 4 bytes per weight and per K/V element, the K/V of every text,
    /// and sizes whose parameter count overflows as too large: each is refused where the
    /// check without it would let the run start.
    #[test]
    fn the_memory_check_counts_f32_bytes_every_texts_kv_and_overflowing_sizes() {
        let Some(total) = proc_kb_as_bytes("/proc/meminfo", "MemTotal:") else {
            return; // not Linux: the check passes everything
        };
        let total = total as f64;
        let tiny = GptjConfig::small(1, 4, 1, 0, 64);
        check_fits_in_memory(&tiny, 1).unwrap();
        // Parameters of half the memory: 2x the memory in f32.
        let params = |v: usize| GptjConfig::small(1, 4, 1, 0, v).checked_n_params().unwrap();
        let per_token = (params(2) - params(1)) as f64;
        let vocab = ((total / 2.0 - params(0) as f64) / per_token) as usize;
        let half = GptjConfig::small(1, 4, 1, 0, vocab);
        let err = check_fits_in_memory(&half, 1).unwrap_err().to_string();
        assert!(err.contains("more than this machine"), "{err}");
        // K/V of 1000 tokens x 1 layer x 2 x 4 wide per text, 4 bytes each: 32 kB a text.
        let texts = (2.0 * total / 32_000.0) as usize;
        assert!(check_fits_in_memory(&tiny, texts).is_err());
        let overflowing = GptjConfig::small(1, 4, 1, 0, 1 << 62);
        assert!(overflowing.checked_n_params().is_none());
        assert!(check_fits_in_memory(&overflowing, 1).is_err());
    }

    /// A /proc value in kB is 1024 bytes a kB (the kernel's kB), from the first line with the
    /// key; a missing key or file is None.
    #[test]
    fn proc_values_in_kb_are_1024_bytes_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status");
        std::fs::write(
            &path,
            "Name:\ttoolsift\nVmHWM:\t    1234 kB\nVmRSS:\t 99 kB\n",
        )
        .unwrap();
        let path = path.to_str().unwrap();
        assert_eq!(proc_kb_as_bytes(path, "VmHWM:"), Some(1234 * 1024));
        assert_eq!(proc_kb_as_bytes(path, "VmSwap:"), None);
        assert_eq!(proc_kb_as_bytes(&format!("{path}.none"), "VmHWM:"), None);
    }
}
