//! `toolsift score`: candidates in, one score row per line out.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
use toolsift::score::LossWeights;
use toolsift::Device;
use toolsift::{CallForm, Model, Placement, ReferenceScorer, ScoreOptions, Scorer};

use super::streams::{
    check_io, exit_status, is_broken_pipe, is_std_stream, refuse_resume_on_std_streams,
    resume_point, stream_name,
};
use super::values::{at_least_one, finite_f64, mebibytes, weight};

#[derive(clap::Args)]
pub(crate) struct ScoreArgs {
    /// Hugging Face GPT-J folder (config.json, weights, tokenizer.json for text-level input).
    #[arg(long, required_unless_present = "demo")]
    model: Option<PathBuf>,
    /// Use the demo GPT-J built into the binary (docs/demo.md) instead of --model.
    #[arg(long, conflicts_with = "model")]
    demo: bool,
    /// Candidates, JSONL (text-level or token-level lines); `-`: standard input.
    #[arg(long)]
    input: PathBuf,
    /// Where to write the scores, JSONL; `-`: standard output.
    #[arg(long)]
    output: PathBuf,
    /// Go on from an interrupted run's --output (with the same flags): the lines it answers are
    /// checked against the input's and kept, a last line cut off is dropped, the rest is
    /// scored and appended. Without an output yet, a fresh run.
    #[arg(long)]
    resume: bool,
    /// Where the call stands in each variant: prefix (the paper's) or inline.
    #[arg(long, value_enum, default_value_t = Placement::Prefix)]
    placement: Placement,
    /// Keep a call iff L- - L+ >= tau_f (a line's own "tau_f" wins). One threshold for every
    /// tool: annotate's paper defaults are 0.5 for Calculator and MT (give those lines
    /// "tau_f": 0.5 to decide as annotate does).
    #[arg(long, default_value_t = 1.0, value_parser = finite_f64, allow_negative_numbers = true)]
    tau_f: f64,
    /// How e(c, eps) is written for text-level lines: "[T(i) ->]" (arrow) or "[T(i)]" (bare).
    #[arg(long, value_enum, default_value_t = CallForm::Arrow)]
    call_form: CallForm,
    /// Loss weights w_0,w_1,... (default: the paper's 1,.8,.6,.4,.2 divided by 3).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true, value_parser = weight)]
    weights: Option<Vec<f64>>,
    /// Score with the plain f64 reference (the oracle; slow) instead of the fast engine.
    #[arg(long)]
    reference: bool,
    /// Memory per plan chunk, MiB: activations, and on the CPU the planner's own (on CUDA the
    /// attention context map); larger batches are split, and a candidate that needs more alone
    /// runs alone (default: 2048 on the CPU; on CUDA 90% of the device memory free after the
    /// weights, the LM head's scratch and 1 GiB).
    /// Not with --reference, which scores one sequence at a time.
    #[arg(long = "memory-budget-mb", value_name = "MEMORY_BUDGET_MB", value_parser = mebibytes)]
    #[arg(conflicts_with = "reference")]
    memory_budget: Option<usize>,
    /// Input lines planned and scored together.
    #[arg(long, default_value_t = 4096, value_parser = at_least_one)]
    chunk_lines: usize,
    /// Backend for the fast path.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
}

/// `score`: everything that can be checked before the model loads, then one score or error row
/// per input line.
pub(crate) fn run(args: ScoreArgs) -> Result<ExitCode> {
    // What can be checked cheaply goes before the model load (minutes for a 6B checkpoint).
    let weights = match args.weights {
        Some(w) => LossWeights::new(w).context("--weights")?,
        None => LossWeights::default(),
    };
    if args.reference && args.device != Device::Cpu {
        anyhow::bail!("--reference scores with the f64 oracle on the CPU: leave out --device");
    }
    refuse_resume_on_std_streams(args.resume, [&args.input, &args.output])?;
    let input_path = (!is_std_stream(&args.input)).then_some(args.input.as_path());
    let output_path = (!is_std_stream(&args.output)).then_some(args.output.as_path());
    let model_dir = match &args.model {
        Some(dir) => dir.clone(),
        None => toolsift::demo::assets::materialize().context("writing the demo assets")?,
    };
    check_io(input_path, output_path, Some(&model_dir))?;
    let input: Box<dyn std::io::BufRead> = match input_path {
        Some(path) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("{}", path.display()))?,
        )),
        None => Box::new(std::io::stdin().lock()),
    };
    let locked = output_path
        .map(toolsift::util::jsonl::lock_output)
        .transpose()?;
    let resume_at = match output_path {
        Some(output) => resume_point(args.resume, &args.input, output, "l_none")?,
        None => None,
    };
    // Token-level lines need no tokenizer: a tokenizer.json that does not load fails the
    // text-level lines only (each says why), not the run.
    let (mut model, tokenizer_error) = Model::load_deferring_tokenizer(&model_dir)?;
    if let Some(e) = &tokenizer_error {
        note!("warning: {e}; text-level lines will fail (token-level lines need no tokenizer)");
    }
    let options = JsonlOptions {
        score: ScoreOptions {
            placement: args.placement,
            weights,
        },
        call_form: args.call_form,
        tau_f: args.tau_f,
        chunk_lines: args.chunk_lines,
        skip_lines: resume_at.map_or(0, |p| p.lines),
        tokenizer_error: tokenizer_error.map(|e| e.to_string()),
    };
    let tokenizer = model.take_tokenizer();
    let scorer: Box<dyn Scorer> = match (args.reference, args.device) {
        (true, _) => Box::new(ReferenceScorer::new(&model)),
        // The scorer takes the weights; the checkpoint's mapping is released as they are
        // converted.
        (false, device) => toolsift::backend::scorer_from_model(model, device, args.memory_budget)?,
    };
    // Emptied (or cut to where it resumes) only now that the model has loaded.
    let output: Box<dyn std::io::Write> = match locked {
        Some(locked) => Box::new(BufWriter::new(toolsift::util::jsonl::start_output(
            locked, resume_at,
        )?)),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let output_name = stream_name(&args.output, "<stdout>");
    let scored = score_jsonl(input, output, scorer.as_ref(), tokenizer.as_ref(), &options);
    if output_path.is_none() && is_broken_pipe(&scored) {
        // A reader of stdout that has gone (`| head -1`) ends the output quietly, as `emit`.
        return Ok(ExitCode::SUCCESS);
    }
    let summary = scored.with_context(|| {
        format!(
            "scoring {} into {output_name}",
            stream_name(&args.input, "<stdin>")
        )
    })?;
    note!(
        "{} lines: {} scored ({} kept), {} failed -> {output_name}",
        summary.lines,
        summary.scored,
        summary.kept,
        summary.failed,
    );
    Ok(exit_status(summary.failed, resume_at))
}
