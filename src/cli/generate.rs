//! `toolsift generate`: decode with tool calls (interrupt, execute, resume).

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use toolsift::Device;
use toolsift::Model;

use super::streams::{
    check_io, exit_status, is_broken_pipe, is_std_stream, refuse_resume_on_std_streams,
    resume_point, set_stop_note, stream_name,
};
use super::values::{at_least_one, temperature};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("prompts").required(true).args(["prompt", "input"])))]
pub(crate) struct GenerateArgs {
    /// Hugging Face GPT-J folder with tokenizer.json.
    #[arg(long, required_unless_present = "demo")]
    model: Option<PathBuf>,
    /// Use the demo GPT-J built into the binary (docs/demo.md) instead of --model.
    #[arg(long, conflicts_with = "model")]
    demo: bool,
    /// One prompt; its completion line goes to --output (default: standard output).
    #[arg(long, allow_hyphen_values = true)]
    prompt: Option<String>,
    /// Prompts, JSONL lines {"id", "prompt"}; `-`: standard input.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Where to write the completions, JSONL (default, or `-`: standard output).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Go on from an interrupted run's --output (with the same flags): the lines it answers are
    /// checked against the input's and kept, a last line cut off is dropped, the rest is
    /// generated and appended (each prompt keeps its sampling stream).
    // Conflicting with --prompt said outright: clap does not require --input when --prompt,
    // which conflicts with it, is given.
    #[arg(long, requires_all = ["input", "output"], conflicts_with = "prompt")]
    resume: bool,
    /// TOML or JSON file whose `tools` table configures the tools (as for annotate).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Only these tools (comma-separated names, or "none"); default: all configured.
    #[arg(long, value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// A call starts when "[" or " [" is among the K most likely next tokens (1: only when
    /// greedy decoding would write it; 0: no calls).
    #[arg(long, default_value_t = 10)]
    top_k_call: usize,
    /// Most calls per prompt (the paper: one; 0: no calls). Every started call counts.
    #[arg(long, default_value_t = 1)]
    max_calls: usize,
    /// Most tokens per completion, tool results included.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Tokens after "[" without an arrow before the call is closed.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    max_call_tokens: usize,
    /// 0: greedy; otherwise sample at this temperature.
    #[arg(long, default_value_t = 0.0, value_parser = temperature, allow_negative_numbers = true)]
    temperature: f32,
    /// When sampling, only among the K most likely tokens (at least 1; omit it for all).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    top_k: Option<u64>,
    /// Seed of the sampling draws (each prompt and sample its own stream; unused when greedy).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Prompts decoded together.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    batch_size: usize,
    /// Where the model runs: the fast CPU engine, or CUDA (a build with --features cuda).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
}

/// `generate`: everything that can be checked before the model loads, then one completion line
/// per prompt.
pub(crate) fn run(args: GenerateArgs) -> Result<ExitCode> {
    use toolsift::generate::{self, jsonl::generate_jsonl_after, GenerateOptions};
    // What can be checked cheaply goes before the model load (minutes for a 6B checkpoint).
    let tools = generate::tools_from_config(args.config.as_deref(), args.tools.as_deref())?;
    // `-` is standard input or output: from here on, a path is a file.
    refuse_resume_on_std_streams(args.resume, args.input.iter().chain(&args.output))?;
    let input_stdin = args.input.as_deref().is_some_and(is_std_stream);
    let (input_path, output_path) = (
        args.input.as_deref().filter(|p| !is_std_stream(p)),
        args.output.as_deref().filter(|p| !is_std_stream(p)),
    );
    check_io(input_path, output_path, None)?;
    if let (Some(config), Some(output)) = (&args.config, output_path) {
        if toolsift::util::fs::is_same_file(config, output) {
            anyhow::bail!(
                "{}: the output is the --config file; writing it would destroy the config",
                output.display()
            );
        }
    }
    // Locked before it is read to resume, and held to the end, as score's.
    let locked = output_path
        .map(toolsift::util::jsonl::lock_output)
        .transpose()?;
    let mut resume_at = None;
    let input: Box<dyn std::io::BufRead> = match (input_path, &args.prompt) {
        _ if input_stdin => Box::new(std::io::stdin().lock()),
        (Some(path), _) => {
            if let Some(output) = output_path {
                resume_at = resume_point(args.resume, path, output, "completion")?;
            }
            let file = File::open(path).with_context(|| format!("{}", path.display()))?;
            Box::new(BufReader::new(file))
        }
        (None, prompt) => {
            // No id: a prompt given on the command line is no document of the tools' collections
            // (WikiSearch leaves out the document whose id the prompt has).
            let line = serde_json::json!({"prompt": prompt.as_deref().unwrap_or("")});
            Box::new(std::io::Cursor::new(line.to_string()))
        }
    };
    if args.temperature == 0.0 && (args.top_k.is_some() || args.seed != 0) {
        // Greedy decoding draws nothing: said, since a script that sets them expects sampling.
        note!("--temperature 0 decodes greedily: --top-k and --seed have no effect");
    }
    let mut options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        top_k_call: args.top_k_call,
        max_calls: args.max_calls,
        max_call_tokens: args.max_call_tokens,
        temperature: args.temperature,
        top_k: args.top_k.map(|k| k as usize),
        seed: args.seed,
        batch_size: args.batch_size,
        n_positions: None,
        vocab_size: None,
        stop_at_eos: true,
    };
    options.check()?;
    let model_dir = match &args.model {
        Some(dir) => dir.clone(),
        None => toolsift::demo::assets::materialize().context("writing the demo assets")?,
    };
    check_io(None, output_path, Some(&model_dir))?;
    let model = Model::load(&model_dir)?;
    let tokenizer = model
        .tokenizer_if_any()
        .with_context(|| format!("{}: no tokenizer.json", model_dir.display()))?;
    let limits = toolsift::generate::GenerateOptions::for_model(model.config());
    (options.n_positions, options.vocab_size) = (limits.n_positions, limits.vocab_size);
    // Before the output is touched: a model that cannot close a call is refused up front.
    toolsift::generate::check_close(tokenizer, &options)?;
    let decoder = toolsift::backend::decoder_for(&model, args.device)?;
    let output: Box<dyn std::io::Write> = match locked {
        Some(locked) => Box::new(BufWriter::new(toolsift::util::jsonl::start_output(
            locked, resume_at,
        )?)),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let name = |p: &Option<PathBuf>, none: &str, std_name: &str| {
        p.as_ref()
            .map_or(none.to_string(), |p| stream_name(p, std_name))
    };
    // Only where --resume can go on: prompts from a file, into a file.
    if let (Some(_), Some(output)) = (input_path, output_path) {
        set_stop_note(format!(
            "{} keeps the lines done; rerun with --resume to go on",
            output.display()
        ));
    }
    let skip = resume_at.map_or(0, |p| p.lines);
    let generated = generate_jsonl_after(
        skip,
        input,
        output,
        decoder.as_ref(),
        tokenizer,
        &tools,
        &options,
    );
    if output_path.is_none() && is_broken_pipe(&generated) {
        // A reader of stdout that has gone (`| head -1`) ends the output quietly, as `emit`.
        return Ok(ExitCode::SUCCESS);
    }
    let summary = generated.with_context(|| {
        format!(
            "generating from {} into {}",
            name(&args.input, "--prompt", "<stdin>"),
            name(&args.output, "<stdout>", "<stdout>")
        )
    })?;
    // A result the length cap cut off was still executed and spliced: it counts, and is said.
    let cut = summary.calls_with_result.saturating_sub(summary.calls_ok);
    let counted = |n: usize, noun: &str| format!("{n} {noun}{}", if n == 1 { "" } else { "s" });
    note!(
        "{}: {} generated ({}, {} with a result{}), {} failed",
        counted(summary.lines, "prompt"),
        summary.generated,
        counted(summary.calls, "call"),
        summary.calls_with_result,
        if cut > 0 {
            format!(", {cut} of them cut off by the length cap")
        } else {
            String::new()
        },
        summary.failed
    );
    Ok(exit_status(summary.failed, resume_at))
}
