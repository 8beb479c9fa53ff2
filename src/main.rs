//! The `toolsift` command line: parse arguments, call the library, print. Nothing else lives here.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use toolsift::cpu::CpuScorer;
use toolsift::model::DType;
use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
use toolsift::score::LossWeights;
use toolsift::Device;
use toolsift::{CallForm, Model, Placement, ReferenceScorer, ScoreOptions, Scorer};

#[derive(Parser)]
#[command(
    name = "toolsift",
    version,
    about = "Fast scoring for Toolformer's API-call filter"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Score candidate calls: one result line per input line, in order.
    Score(ScoreArgs),
    /// Convert a checkpoint (e.g. pytorch_model.bin) into model.safetensors, without Python.
    Convert(ConvertArgs),
    /// Time toolsift against the naive and tuned candle baselines on the standard workload.
    Bench(BenchCli),
    /// Generate with tool calls (interrupt, execute, resume): one output line per prompt.
    Generate(GenerateArgs),
}

#[derive(clap::Args)]
struct BenchCli {
    #[arg(long, value_enum, default_value_t = Placement::Prefix)]
    placement: Placement,
    #[arg(long, default_value_t = 8)]
    layers: usize,
    #[arg(long, default_value_t = 512)]
    embd: usize,
    #[arg(long, default_value_t = 8)]
    heads: usize,
    #[arg(long, default_value_t = 32)]
    rotary: usize,
    #[arg(long, default_value_t = 50400)]
    vocab: usize,
    /// Texts of the standard workload (25 candidates each).
    #[arg(long, default_value_t = 2)]
    texts: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Timed runs of toolsift (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Timed runs of each baseline.
    #[arg(long, default_value_t = 1)]
    baseline_reps: usize,
    /// Sequences per padded batch in the baselines.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Time toolsift alone (no candle baselines; speedup fields are null).
    #[arg(long)]
    skip_baselines: bool,
    /// Backend under test.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Benchmark this checkpoint instead of random weights (the size flags are then ignored).
    #[arg(long)]
    model: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ScoreArgs {
    /// Hugging Face GPT-J folder (config.json, weights, tokenizer.json for text-level input).
    #[arg(long)]
    model: PathBuf,
    /// Candidates, JSONL (text-level or token-level lines).
    #[arg(long)]
    input: PathBuf,
    /// Where to write the scores, JSONL.
    #[arg(long)]
    output: PathBuf,
    #[arg(long, value_enum, default_value_t = Placement::Prefix)]
    placement: Placement,
    /// Keep a call iff L- - L+ >= tau_f (a line's own "tau_f" wins).
    #[arg(long, default_value_t = 1.0)]
    tau_f: f64,
    /// How e(c, eps) is written for text-level lines: "[T(i) ->]" (arrow) or "[T(i)]" (bare).
    #[arg(long, value_enum, default_value_t = CallForm::Arrow)]
    call_form: CallForm,
    /// Loss weights w_0,w_1,... (default: the paper's 1,.8,.6,.4,.2 divided by 3).
    #[arg(long, value_delimiter = ',')]
    weights: Option<Vec<f64>>,
    /// Score with the plain f64 reference (the oracle; slow) instead of the fast engine.
    #[arg(long)]
    reference: bool,
    /// Activation memory per plan chunk, MiB; larger batches are split.
    #[arg(long, default_value_t = 2048)]
    memory_budget_mb: usize,
    /// Input lines planned and scored together.
    #[arg(long, default_value_t = 4096)]
    chunk_lines: usize,
    /// Backend for the fast path.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// Hugging Face GPT-J folder with tokenizer.json.
    #[arg(long)]
    model: PathBuf,
    /// One prompt; prints its completion line.
    #[arg(long, conflicts_with = "input", required_unless_present = "input")]
    prompt: Option<String>,
    /// Prompts, JSONL lines {"id", "prompt"}.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Where to write the completions, JSONL (default: stdout).
    #[arg(long)]
    output: Option<PathBuf>,
    /// TOML or JSON file whose `tools` table configures the tools (as for annotate).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Only these tools (comma-separated names, or "none"); default: all configured.
    #[arg(long, value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// A call starts when "[" is among the K most likely next tokens (1: only when greedy would).
    #[arg(long, default_value_t = 10)]
    top_k_call: usize,
    /// Calls per prompt.
    #[arg(long, default_value_t = 1)]
    max_calls: usize,
    /// Most tokens per completion, tool results included.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Tokens after "[" without an arrow before the call is closed.
    #[arg(long, default_value_t = 32)]
    max_call_tokens: usize,
    /// 0: greedy; otherwise sample at this temperature.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// When sampling, only among the K most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Prompts decoded together.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
}

#[derive(clap::Args)]
struct ConvertArgs {
    /// Source checkpoint folder (pytorch_model.bin or safetensors, with config.json).
    #[arg(long)]
    model: PathBuf,
    /// Destination folder: config.json, model.safetensors and tokenizer.json (if any).
    #[arg(long)]
    out: PathBuf,
    /// Storage type of the written weights; default keeps each tensor's own.
    #[arg(long, value_parser = ["f32", "f16", "bf16"])]
    dtype: Option<String>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Score(args) => score(args),
        Command::Convert(args) => convert(args),
        Command::Bench(args) => bench(args),
        Command::Generate(args) => generate(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn score(args: ScoreArgs) -> Result<ExitCode> {
    let model = Model::load(&args.model)?;
    let weights = match args.weights {
        Some(w) => LossWeights::new(w)?,
        None => LossWeights::default(),
    };
    let options = JsonlOptions {
        score: ScoreOptions {
            placement: args.placement,
            weights,
        },
        call_form: args.call_form,
        tau_f: args.tau_f,
        chunk_lines: args.chunk_lines,
    };
    let scorer: Box<dyn Scorer> = match (args.reference, args.device) {
        (true, _) => Box::new(ReferenceScorer::new(&model)),
        (false, Device::Cpu) => {
            Box::new(CpuScorer::new(&model).with_memory_budget(args.memory_budget_mb << 20))
        }
        (false, device) => toolsift::scorer_for(&model, device)?,
    };
    let input = File::open(&args.input).with_context(|| format!("{}", args.input.display()))?;
    let output =
        File::create(&args.output).with_context(|| format!("{}", args.output.display()))?;
    let summary = score_jsonl(
        BufReader::new(input),
        BufWriter::new(output),
        scorer.as_ref(),
        model.tokenizer.as_ref(),
        &options,
    )
    .with_context(|| format!("scoring {}", args.input.display()))?;
    eprintln!(
        "{} lines: {} scored ({} kept), {} failed -> {}",
        summary.lines,
        summary.scored,
        summary.kept,
        summary.failed,
        args.output.display()
    );
    Ok(if summary.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn convert(args: ConvertArgs) -> Result<ExitCode> {
    let model = Model::load(&args.model)?;
    let dtype = args.dtype.as_deref().map(|d| match d {
        "f32" => DType::F32,
        "f16" => DType::F16,
        _ => DType::BF16,
    });
    let n = toolsift::model::checkpoint::convert(&model, &args.out, dtype)?;
    eprintln!(
        "wrote {n} tensors to {}",
        args.out.join("model.safetensors").display()
    );
    Ok(ExitCode::SUCCESS)
}

fn bench(args: BenchCli) -> Result<ExitCode> {
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
    eprintln!(
        "{}: {} candidates, {} unique tokens ({:.0}/candidate); toolsift {:.2} cand/s, trunk {:.1} GFLOP/s = {:.0}% of the {:.1} GFLOP/s GEMM peak",
        report.model,
        report.candidates,
        report.unique_tokens,
        report.unique_tokens as f64 / report.candidates as f64,
        report.toolsift_cands_per_s,
        report.trunk_gflops,
        100.0 * report.trunk_fraction_of_peak,
        report.gemm_gflops_peak
    );
    if let (Some(s), Some(t)) = (report.speedup, report.speedup_vs_tuned) {
        eprintln!(
            "speedup {s:.2}x over naive ({} tokens), {t:.2}x over tuned ({} tokens); max |diff| {:.2e}",
            report.baseline_tokens,
            report.tuned_tokens,
            report.max_abs_diff.unwrap_or(f64::NAN)
        );
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(ExitCode::SUCCESS)
}

fn generate(args: GenerateArgs) -> Result<ExitCode> {
    use toolsift::generate::{self, jsonl::generate_jsonl, GenerateOptions};
    let model = Model::load(&args.model)?;
    let tokenizer = model
        .tokenizer
        .as_ref()
        .with_context(|| format!("{}: no tokenizer.json", args.model.display()))?;
    let tools = generate::tools_from_config(args.config.as_deref(), args.tools.as_deref())?;
    let options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        top_k_call: args.top_k_call,
        max_calls: args.max_calls,
        max_call_tokens: args.max_call_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        seed: args.seed,
        batch_size: args.batch_size,
        n_positions: Some(model.config.n_positions),
        stop_at_eos: true,
    };
    let decoder = toolsift::backend::decoder_for(&model, args.device)?;
    let input: Box<dyn std::io::BufRead> = match (&args.input, &args.prompt) {
        (Some(path), _) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("{}", path.display()))?,
        )),
        (None, prompt) => {
            let line = serde_json::json!({"id": 0, "prompt": prompt.as_deref().unwrap_or("")});
            Box::new(std::io::Cursor::new(line.to_string()))
        }
    };
    let output: Box<dyn std::io::Write> = match &args.output {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("{}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let summary = generate_jsonl(input, output, decoder.as_ref(), tokenizer, &tools, &options)?;
    eprintln!(
        "{} prompts: {} generated ({} calls, {} with a result), {} failed",
        summary.lines, summary.generated, summary.calls, summary.calls_ok, summary.failed
    );
    Ok(if summary.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
