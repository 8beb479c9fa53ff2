//! The `toolsift` command line: parse arguments, call the library, print. Nothing else lives here.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use toolsift::model::DType;
use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
use toolsift::score::LossWeights;
use toolsift::{CallForm, Model, Placement, ReferenceScorer, ScoreOptions};

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
        ..Default::default()
    };
    let scorer = ReferenceScorer::new(&model);
    let input = File::open(&args.input).with_context(|| format!("{}", args.input.display()))?;
    let output =
        File::create(&args.output).with_context(|| format!("{}", args.output.display()))?;
    let summary = score_jsonl(
        BufReader::new(input),
        BufWriter::new(output),
        &scorer,
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
