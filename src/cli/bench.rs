//! `toolsift bench`: toolsift against the candle baselines on the standard workload.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use toolsift::{Device, Placement};

use super::streams::emit;
use super::values::at_least_one;

#[derive(clap::Args)]
pub(crate) struct BenchCli {
    /// Where the call stands in each variant: prefix (the paper's) or inline.
    #[arg(long, value_enum, default_value_t = Placement::Prefix)]
    placement: Placement,
    /// Random model: layers.
    #[arg(long, default_value_t = 8)]
    layers: usize,
    /// Random model: embedding width (n_embd).
    #[arg(long, default_value_t = 512)]
    embd: usize,
    /// Random model: attention heads.
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Random model: rotary dims per head.
    #[arg(long, default_value_t = 32)]
    rotary: usize,
    /// Random model: vocabulary size.
    #[arg(long, default_value_t = 50400)]
    vocab: usize,
    /// Texts of the standard workload (25 candidates each).
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    texts: usize,
    /// Seed of the random weights and of the workload's texts and calls.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Timed rounds of toolsift (after one warm-up run; the median is reported).
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    reps: usize,
    /// Of those rounds (more if needed), how many also time each baseline; ratios are the
    /// median of the rounds' ratios.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    baseline_reps: usize,
    /// Sequences per padded batch in the baselines.
    #[arg(long, default_value_t = 8, value_parser = at_least_one)]
    batch_size: usize,
    /// Time toolsift alone (no candle baselines; speedup fields are null): needed without a
    /// `--features baselines` build, and with --device cuda.
    #[arg(long)]
    skip_baselines: bool,
    /// Backend under test.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Benchmark this checkpoint instead of random weights (the size flags are then ignored).
    #[arg(long)]
    model: Option<PathBuf>,
}

/// `bench`: one JSON report on stdout, its figures in words on stderr; an error after the report
/// when toolsift's losses and the baselines' differ.
pub(crate) fn run(args: BenchCli) -> Result<ExitCode> {
    let config =
        toolsift::GptjConfig::small(args.layers, args.embd, args.heads, args.rotary, args.vocab);
    let report = toolsift::bench::run(&toolsift::bench::BenchArgs {
        placement: args.placement,
        config,
        n_texts: args.texts,
        seed: args.seed,
        reps: args.reps,
        baseline_reps: args.baseline_reps,
        batch_size: args.batch_size,
        run_baselines: !args.skip_baselines,
        device: args.device,
        model_dir: args.model,
    })?;
    note!(
        "{}: {} candidates, {} unique tokens ({:.0}/candidate); toolsift {:.2} cand/s ({:.0} unique tokens/s), trunk GEMMs {:.1} GFLOP/s = {:.0}% of the {:.1} GFLOP/s GEMM peak ({:.0}% over the whole run)",
        report.model,
        report.candidates,
        report.unique_tokens,
        report.unique_tokens as f64 / report.candidates as f64,
        report.toolsift_cands_per_s,
        report.toolsift_tokens_per_s,
        report.trunk_gflops,
        100.0 * report.trunk_fraction_of_peak,
        report.gemm_gflops_peak,
        100.0 * report.whole_run_fraction_of_peak
    );
    if let (Some(s), Some(t)) = (report.speedup, report.speedup_vs_tuned) {
        let spread = |r: &[f64]| {
            let (lo, hi) = r.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
            if r.len() > 1 {
                format!(" (rounds {lo:.2}-{hi:.2})")
            } else {
                String::new()
            }
        };
        note!(
            "speedup {s:.2}x over naive{} ({} tokens, {:.0}% of peak over its run), {t:.2}x over tuned{} ({} tokens, {:.0}%); max |diff| {:.2e}",
            spread(&report.speedup_rounds),
            report.baseline_tokens,
            100.0 * report.baseline_fraction_of_peak.unwrap_or(f64::NAN),
            spread(&report.speedup_vs_tuned_rounds),
            report.tuned_tokens,
            100.0 * report.tuned_fraction_of_peak.unwrap_or(f64::NAN),
            report.max_abs_diff.unwrap_or(f64::NAN)
        );
        if let Some(kv) = report.speedup_vs_tuned_kv {
            note!(
                "speedup {kv:.2}x over tuned-kv{} ({} tokens, {:.0}%): the tuned method with a \
                 KV cache of each text",
                spread(&report.speedup_vs_tuned_kv_rounds),
                report.tuned_kv_tokens,
                100.0 * report.tuned_kv_fraction_of_peak.unwrap_or(f64::NAN),
            );
        }
    }
    if let Some(theirs) = report.baseline_threads.filter(|&n| n != report.threads) {
        note!(
            "warning: the candle baselines ran on {theirs} threads and toolsift on {} (candle \
             counts physical cores or the affinity mask): set RAYON_NUM_THREADS, which both \
             read, to compare them on equal terms",
            report.threads
        );
    }
    emit(&format!("{}\n", serde_json::to_string(&report)?))?;
    // After the report (its figures are the evidence): a speedup over different results is no
    // comparison of the same work. (Never NaN: a loss that is not finite makes it infinite.)
    if let Some(diff) = report.max_abs_diff {
        if diff > toolsift::bench::LOSS_TOLERANCE {
            anyhow::bail!(
                "toolsift's losses differ from the baselines' by up to {diff:.3e}, more than \
                 {:.0e}: the speedups above compare different results",
                toolsift::bench::LOSS_TOLERANCE
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
