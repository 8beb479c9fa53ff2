//! The `toolsift` command line: parse arguments, call the library, print. Nothing else lives here.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use toolsift::model::DType;
use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
use toolsift::score::LossWeights;
use toolsift::Device;
use toolsift::{CallForm, Model, Placement, ReferenceScorer, ScoreOptions, Scorer};

/// `eprintln!` that cannot panic: progress and summaries go to stderr, and a stderr that cannot be
/// written (closed, full) must not turn a finished run into a failure that a scheduler reruns.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// [`note!`] without the newline.
macro_rules! note_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

/// Writes a command's result to stdout. A reader that has gone (`| head -1`) ends the output
/// quietly, as a closed pipe ends any Unix tool's; other write errors are errors.
fn emit(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// `-` as a path: standard input for `--input`, standard output for `--output`, as Unix filters
/// take it (neither can be locked, resumed from or read twice).
fn is_std_stream(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// A path as messages name it: `<stdin>` or `<stdout>` for `-`.
fn stream_name(path: &Path, std_name: &str) -> String {
    if is_std_stream(path) {
        std_name.to_string()
    } else {
        path.display().to_string()
    }
}

/// `--resume` goes on from an output file, after checking it against a re-readable input.
fn refuse_resume_on_std_streams<'a>(
    resume: bool,
    paths: impl IntoIterator<Item = &'a PathBuf>,
) -> Result<()> {
    if resume && paths.into_iter().any(|p| is_std_stream(p)) {
        anyhow::bail!(
            "--resume checks the output an earlier run wrote against the input, so both must be \
             files, not `-` (standard input or output)"
        );
    }
    Ok(())
}

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
    /// Time toolsift against the naive, tuned and tuned-kv candle baselines (standard workload;
    /// the baselines need a `--features baselines` build, else pass --skip-baselines).
    Bench(BenchCli),
    /// Build C*: sample API calls over a corpus, execute them, keep those that help, splice.
    Annotate(AnnotateArgs),
    /// Build the WikiSearch BM25 index from a JSONL file of documents.
    Index(IndexArgs),
    /// Join shard outputs of `annotate` into one C*, in input-line order.
    Merge(MergeArgs),
    /// Generate with tool calls (interrupt, execute, resume): one output line per prompt.
    Generate(GenerateArgs),
    /// Run the demo pipeline on a second generated demo set and measure it against its sites.
    EvalDemo(EvalDemoArgs),
}

#[derive(clap::Args)]
struct AnnotateArgs {
    /// Run the built-in demo: the embedded demo model, corpus and settings (docs/demo.md).
    #[arg(long)]
    demo: bool,
    /// Demo: annotate only the first N documents of the demo corpus (for quick checks).
    #[arg(long, requires = "demo", value_parser = at_least_one)]
    demo_docs: Option<usize>,
    /// Hugging Face GPT-J folder (config.json, weights, tokenizer.json).
    #[arg(long, required_unless_present_any = ["print_config", "demo"], conflicts_with = "demo")]
    model: Option<PathBuf>,
    /// The corpus, JSONL (the text under `text_field`; optional "id", "url", "date").
    #[arg(long, required_unless_present_any = ["print_config", "demo"], conflicts_with = "demo")]
    corpus: Option<PathBuf>,
    /// C* output, JSONL; rejects and summary are written next to it (--demo: default
    /// toolsift-demo/cstar.jsonl; an earlier demo output there is replaced, anything else
    /// refused).
    #[arg(long, required_unless_present_any = ["print_config", "demo"], value_parser = output_file)]
    out: Option<PathBuf>,
    /// Tools to use: built-ins by key, tools of the config's [per_tool.custom] by name
    /// (default: every configured one; calculator and calendar need no setup;
    /// --demo: calculator,calendar).
    #[arg(long, value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// TOML settings (see --print-config).
    #[arg(long, conflicts_with = "demo")]
    config: Option<PathBuf>,
    /// Print the settings in effect (defaults, or --config's) as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// Backend for the model: sampling (positions, calls) and the filter's scoring.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Base seed (overrides the config's `seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Corpus field holding the text (overrides the config's `text_field`); "id", "url" or
    /// "date" is read as the text and kept as that field too.
    #[arg(long, conflicts_with = "demo")]
    text_field: Option<String>,
    /// This process's shard, INDEX/COUNT (0-based); line L goes to shard (L-1) % COUNT.
    #[arg(long, conflicts_with = "demo")]
    shard: Option<String>,
    /// Shard count for JOB_COMPLETION_INDEX (Kubernetes Indexed Jobs) or Slurm arrays (--shard
    /// already holds its count).
    #[arg(long, conflicts_with_all = ["demo", "shard"], value_parser = clap::value_parser!(u64).range(1..))]
    shards: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

#[derive(clap::Args)]
struct EvalDemoArgs {
    /// Seed of the generated evaluation set (the embedded demo corpus uses another).
    #[arg(long, default_value_t = toolsift::demo::EVAL_SEED)]
    seed: u64,
    /// Documents in the evaluation set.
    #[arg(long, default_value_t = toolsift::demo::DEMO_CORPUS_DOCS, value_parser = eval_docs)]
    docs: usize,
    /// Backend for sampling and scoring.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Folder for the set (corpus.jsonl), its C* (cstar.jsonl, replaced) and eval.json.
    #[arg(long, default_value = "toolsift-demo-eval")]
    out: PathBuf,
    /// Print one JSON object (stdout) instead of the table.
    #[arg(long)]
    json: bool,
    /// Skip the generation comparison (the arithmetic prompts with and without tools).
    #[arg(long)]
    skip_generate: bool,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

#[derive(clap::Args)]
struct IndexArgs {
    /// Documents, JSONL: "id", optional "title", and the text.
    #[arg(long)]
    docs: PathBuf,
    /// New index folder.
    #[arg(long)]
    out: PathBuf,
    /// Document field holding the text to index.
    #[arg(long, default_value = "text")]
    text_field: String,
}

#[derive(clap::Args)]
struct MergeArgs {
    /// Merged C*; rejects and summary are written next to it.
    #[arg(long, value_parser = output_file)]
    out: PathBuf,
    /// Shard outputs.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
}

#[derive(clap::Args)]
struct BenchCli {
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

#[derive(clap::Args)]
struct ScoreArgs {
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
    #[arg(long, value_parser = mebibytes, conflicts_with = "reference")]
    memory_budget_mb: Option<usize>,
    /// Input lines planned and scored together.
    #[arg(long, default_value_t = 4096, value_parser = at_least_one)]
    chunk_lines: usize,
    /// Backend for the fast path.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("prompts").required(true).args(["prompt", "input"])))]
struct GenerateArgs {
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

#[derive(clap::Args)]
struct ConvertArgs {
    /// Source checkpoint folder (pytorch_model.bin or safetensors, with config.json).
    #[arg(long)]
    model: PathBuf,
    /// Destination folder: config.json, model.safetensors and tokenizer.json (if any). A model
    /// already there is replaced, as by an earlier conversion (its tokenizer.json removed when
    /// the source has none).
    #[arg(long)]
    out: PathBuf,
    /// Storage type of the written weights; default keeps each tensor's own.
    #[arg(long, value_parser = ["f32", "f16", "bf16"])]
    dtype: Option<String>,
}

fn main() -> ExitCode {
    // A dependency's panic that the library turns into an error (a corrupt tokenizer.json) is
    // reported once, as that error.
    toolsift::util::install_quiet_panic_hook();
    // The library's warnings read like the CLI's own notes: no colour codes in a log file, and
    // without RUST_LOG no timestamp or module path either (RUST_LOG asks for the full form).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env();
    let verbose = filter.is_ok();
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter.unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if verbose {
        log.init();
    } else {
        log.without_time().with_target(false).init();
    }
    let cli = Cli::parse();
    // Commands that run tools: a signal that ends the run ends what their command tools
    // started, too.
    #[cfg(unix)]
    if matches!(cli.command, Command::Annotate(_) | Command::Generate(_)) {
        if let Err(e) = toolsift::annotate::tools::stop_tools_on_signals() {
            note!("warning: cannot watch for signals ({e}): an interrupted run's command tools may leave processes behind");
        }
    }
    let result = match cli.command {
        Command::Score(args) => score(args),
        Command::Convert(args) => convert(args),
        Command::Bench(args) => bench(args),
        Command::Annotate(args) => annotate(args),
        Command::Index(args) => index(args),
        Command::Merge(args) => merge(args),
        Command::Generate(args) => generate(args),
        Command::EvalDemo(args) => eval_demo(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            note!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A size in MiB: at least 1, and small enough to count in bytes.
fn mebibytes(s: &str) -> std::result::Result<usize, String> {
    let v = at_least_one(s)?;
    v.checked_mul(1 << 20)
        .map(|_| v)
        .ok_or_else(|| "too large".to_string())
}

/// A count that must be at least 1.
fn at_least_one(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(e.to_string()),
    }
}

/// eval-demo's set size: 1 to 100,000 documents (the set is generated in memory; 100,000 take a
/// few hours to annotate on a CPU).
fn eval_docs(s: &str) -> std::result::Result<usize, String> {
    match at_least_one(s)? {
        v if v <= 100_000 => Ok(v),
        _ => Err("must be at most 100000".into()),
    }
}

/// One of `--weights`' numbers. The flag takes values that start with a hyphen (`-1,2` reaches
/// the weights' own check, which names the weight); a flag is not a number, so
/// `--weights --reference` says the list is missing, not that "--reference" is a bad float.
fn weight(s: &str) -> std::result::Result<f64, String> {
    if s.starts_with("--") {
        return Err(format!(
            "expected a number, got the flag {s}: give the weights right after \
                            --weights (--weights 1,0.5)"
        ));
    }
    s.parse::<f64>().map_err(|e| e.to_string())
}

/// A C* output of annotate or merge: a file, since its rejects, summary (and journal) go next to
/// it, so `-` is not standard output here as it is for score; it is refused rather than written
/// as a file named `-` (`./-` is that file).
fn output_file(s: &str) -> std::result::Result<PathBuf, String> {
    if s == "-" {
        return Err(
            "C* is written to a file, with its rejects and summary next to it, not to \
                    standard output (a file named - is ./-)"
                .into(),
        );
    }
    Ok(PathBuf::from(s))
}

/// A float flag that must be a finite number (NaN would compare false everywhere).
fn finite_f64(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err("must be a finite number".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A sampling temperature: finite and not negative.
fn temperature(s: &str) -> std::result::Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        // "1e39" parses, as f32's infinity.
        Ok(_) => Err("must be a number >= 0 within f32's range, at most 3.4e38 (0: greedy)".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Checks `--input` and `--output` before the model is loaded (minutes for a 6B checkpoint) and
/// before the output is created (which empties it): the input must not be a folder (it would
/// open, then fail on the first read), the output must be neither the input file nor a file of
/// the model folder (through any path), and its folder must exist.
fn check_io(input: Option<&Path>, output: Option<&Path>, model_dir: Option<&Path>) -> Result<()> {
    use toolsift::util::fs::is_same_file;
    if let Some(input) = input {
        let meta = std::fs::metadata(input).with_context(|| format!("{}", input.display()))?;
        if meta.is_dir() {
            anyhow::bail!("{}: is a folder; give a JSONL file", input.display());
        }
        if output.is_some_and(|output| is_same_file(input, output)) {
            anyhow::bail!(
                "{}: the output is the input file; writing it would destroy the input",
                input.display()
            );
        }
    }
    let Some(output) = output else {
        return Ok(());
    };
    if let Some(problem) = toolsift::util::fs::folder_problem(output) {
        anyhow::bail!(
            "{}: {problem}; give a file name for the output",
            output.display()
        );
    }
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            anyhow::bail!(
                "{}: the output's folder {} does not exist",
                output.display(),
                dir.display()
            );
        }
    }
    if let Some(model_dir) = model_dir {
        // Not an error here if the folder cannot be listed: the model load says why.
        for entry in std::fs::read_dir(model_dir).into_iter().flatten().flatten() {
            if is_same_file(&entry.path(), output) {
                anyhow::bail!(
                    "{}: is {}, a file of the model folder; writing it would destroy the model",
                    output.display(),
                    entry.path().display()
                );
            }
        }
    }
    Ok(())
}

/// With `--resume`, where an earlier run's `output` leaves off (None: no output yet, or no
/// `--resume`); said on stderr.
fn resume_point(
    resume: bool,
    input: &Path,
    output: &Path,
    answer_key: &str,
) -> Result<Option<toolsift::util::jsonl::ResumePoint>> {
    if !resume {
        return Ok(None);
    }
    let point = toolsift::util::jsonl::resume_point(input, output, answer_key)?;
    // The output exists by now (locking creates it), so an empty one is a fresh start.
    match point {
        Some(p) if p.lines > 0 => note!(
            "resuming: {} lines of {} already answered",
            p.lines,
            output.display()
        ),
        _ => note!(
            "resuming: {} holds no answered line yet; starting from the first",
            output.display()
        ),
    }
    Ok(point)
}

fn score(args: ScoreArgs) -> Result<ExitCode> {
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
    let memory_budget = args.memory_budget_mb.map(|mb| mb << 20);
    let scorer: Box<dyn Scorer> = match (args.reference, args.device) {
        (true, _) => Box::new(ReferenceScorer::new(&model)),
        // The scorer takes the weights; the checkpoint's mapping is released as they are
        // converted.
        (false, device) => toolsift::backend::scorer_from_model(model, device, memory_budget)?,
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

/// Whether a run into stdout ended because its reader went away.
fn is_broken_pipe<T>(result: &toolsift::Result<T>) -> bool {
    matches!(result, Err(toolsift::Error::Io { error, .. })
        if error.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The exit status of a `score` or `generate` run that wrote every line but some failed: not
/// 1, which a run that stopped (an unreadable input, a model that does not load, a full disk)
/// exits with, nor clap's 2 for a usage error.
const LINES_FAILED: u8 = 3;

/// [`LINES_FAILED`] when a line of the output failed, in this run or in the earlier one it
/// resumed (said, since this run's summary does not count those).
fn exit_status(
    failed_now: usize,
    resume_at: Option<toolsift::util::jsonl::ResumePoint>,
) -> ExitCode {
    let failed_before = resume_at.map_or(0, |p| p.failed);
    if failed_before > 0 {
        note!("the run this one resumed failed on {failed_before} of the output's lines");
    }
    if failed_now + failed_before > 0 {
        ExitCode::from(LINES_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

fn convert(args: ConvertArgs) -> Result<ExitCode> {
    let model = Model::load(&args.model)?;
    let dtype = args.dtype.as_deref().map(|d| match d {
        "f32" => DType::F32,
        "f16" => DType::F16,
        _ => DType::BF16,
    });
    let n = toolsift::model::checkpoint::convert(&model, &args.out, dtype)?;
    note!(
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

fn annotate(args: AnnotateArgs) -> Result<ExitCode> {
    use toolsift::annotate::{run_job_with, AnnotateConfig, Job, Shard};
    if args.demo {
        return annotate_demo(args);
    }
    let mut config = match &args.config {
        Some(path) => AnnotateConfig::from_file(path)?,
        None => AnnotateConfig::default(),
    };
    if let Some(seed) = args.seed {
        config.seed = seed;
    }
    if let Some(field) = args.text_field {
        config.text_field = field;
    }
    config.validate()?;
    // The flags are checked before --print-config prints: it shows the settings of a run those
    // flags could start.
    let shard_flag = args.shard.as_deref().map(str::parse::<Shard>).transpose()?;
    let shard = Shard::resolve(shard_flag, args.shards, |k| std::env::var(k).ok())?;
    // Built-ins by key, custom tools by the names the config gives them, each one the settings
    // make available (a WikiSearch without [tools.wikisearch] fails here, not after the load).
    // Without --tools the run takes every available built-in and every [per_tool.custom] tool,
    // and a custom tool needs its service here: the command registers the config's tools only.
    let tools = match &args.tools {
        Some(keys) => {
            let tools = keys
                .iter()
                .map(|k| config.tool_named(k))
                .collect::<toolsift::Result<Vec<_>>>()?;
            config.tools.check_provided(&tools)?;
            Some(tools)
        }
        None => {
            let custom = config.per_tool.custom.keys().map(|k| config.tool_named(k));
            config
                .tools
                .check_provided(&custom.collect::<toolsift::Result<Vec<_>>>()?)?;
            None
        }
    };
    if args.print_config {
        emit(&config.to_toml())?;
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(model_dir), Some(corpus), Some(out)) = (args.model, args.corpus, args.out) else {
        anyhow::bail!("--model, --corpus and --out are required");
    };
    // The tools open before the model loads (minutes at 6B): a WikiSearch index that is not one
    // is an error naming the config file now, not after the load.
    let registry = match toolsift::annotate::tools::ToolRegistry::from_config(&config.tools) {
        Ok(r) => r,
        Err(e) => match &args.config {
            Some(path) => anyhow::bail!("{}: {e}", path.display()),
            None => anyhow::bail!("{e}"),
        },
    };
    set_resume_note(&shard.output_path(&out));
    let job = Job {
        model_dir,
        corpus,
        out,
        config,
        tools,
        device: args.device,
        shard,
        progress: !args.no_progress,
    };
    report_run(run_job_with(&job, &registry)?);
    Ok(ExitCode::SUCCESS)
}

/// The demo's `--tools`: built-ins only (the demo model knows no other).
fn parse_tools(keys: &[String]) -> toolsift::Result<Vec<toolsift::annotate::ToolKind>> {
    keys.iter()
        .map(|k| toolsift::annotate::ToolKind::from_key(k))
        .collect()
}

/// Prints the summary and where the files went; returns the summary.
fn report_run(outcome: toolsift::annotate::RunOutcome) -> Option<toolsift::annotate::Summary> {
    use toolsift::annotate::RunOutcome;
    match outcome {
        RunOutcome::Done(summary, paths) => {
            note_part!("{}", summary.render());
            note!(
                "wrote {} ({} rejects in {}, summary in {})",
                paths.out.display(),
                summary.rejected,
                paths.rejects.display(),
                paths.summary.display()
            );
            if summary.lines > 0 && summary.rejected == summary.lines {
                // Rejects are data, so the run succeeded; but a whole corpus rejected is more
                // often a wrong --text-field or input file than a corpus of bad lines.
                let first = first_reject_reason(&paths.rejects)
                    .map(|r| format!("; the first: {r}"))
                    .unwrap_or_default();
                note!(
                    "warning: every one of the {} corpus lines was rejected{first}",
                    summary.lines
                );
            }
            Some(*summary)
        }
        RunOutcome::Stopped(n) => {
            note!("stopped after {n} documents");
            None
        }
    }
}

/// The reason of the first record in a rejects file, for the warning above (none if it cannot be
/// read: the warning is a hint, the file is the record).
fn first_reject_reason(path: &std::path::Path) -> Option<String> {
    let mut reader = std::io::BufReader::new(std::fs::File::open(path).ok()?);
    let mut line = Vec::new();
    toolsift::util::jsonl::read_line_capped(&mut reader, &mut line, 1 << 16, |_| {}).ok()?;
    let record: serde_json::Value = serde_json::from_slice(&line).ok()?;
    Some(format!(
        "line {}: {}",
        record.get("line")?,
        record.get("reason")?.as_str()?
    ))
}

/// `annotate --demo`: the embedded model, corpus and settings; the output replaces an earlier
/// demo output at the same path.
fn annotate_demo(args: AnnotateArgs) -> Result<ExitCode> {
    use toolsift::demo::run::{DemoOptions, DemoRun};
    let started = std::time::Instant::now();
    let tools = args.tools.as_deref().map(parse_tools).transpose()?;
    let settings = toolsift::demo::run::settings(args.seed)?;
    if let Some(tools) = &tools {
        let names: Vec<toolsift::annotate::ToolName> = tools.iter().map(|&t| t.into()).collect();
        settings.tools.check_provided(&names)?;
    }
    if args.print_config {
        emit(&settings.to_toml())?;
        return Ok(ExitCode::SUCCESS);
    }
    let demo = DemoRun::prepare(DemoOptions {
        device: args.device,
        seed: args.seed,
        docs: args.demo_docs,
        tools,
        out: args
            .out
            .unwrap_or_else(|| PathBuf::from("toolsift-demo").join("cstar.jsonl")),
        progress: !args.no_progress,
    })?;
    report_replaced(&demo.replaced);
    let shown = std::path::absolute(demo.out()).unwrap_or_else(|_| demo.out().to_owned());
    note!(
        "demo: model, corpus ({} documents) and settings from {}",
        demo.documents,
        demo.assets_dir.display()
    );
    note!("demo: C* will be written to {}", shown.display());
    set_resume_note(demo.out());
    report_run(demo.run()?);
    note!("C*: {}", shown.display());
    note!(
        "wall time: {:.2}s (assets, model load, annotate, write)",
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The stop note of an annotate run writing C* at `out`: where its journal is.
fn set_resume_note(out: &std::path::Path) {
    set_stop_note(format!(
        "run the same command again to resume from the journal {}",
        toolsift::annotate::OutputPaths::new(out).journal.display()
    ));
}

/// What a signal that ends the run prints (annotate and generate watch for them, on Unix).
fn set_stop_note(note: String) {
    #[cfg(unix)]
    toolsift::annotate::tools::set_stop_note(note);
    #[cfg(not(unix))]
    let _ = note;
}

fn report_replaced(removed: &[PathBuf]) {
    if !removed.is_empty() {
        let names: Vec<String> = removed.iter().map(|p| p.display().to_string()).collect();
        note!("demo: replacing the previous output ({})", names.join(", "));
    }
}

/// `eval-demo`: a second demo set from `--seed`, annotated like the demo, measured against its
/// sites.
fn eval_demo(args: EvalDemoArgs) -> Result<ExitCode> {
    use toolsift::demo::run::{EvalOptions, EvalRun};
    let eval = EvalRun::prepare(EvalOptions {
        seed: args.seed,
        docs: args.docs,
        device: args.device,
        out_dir: args.out,
        tool_use: !args.skip_generate,
        progress: !args.no_progress,
    })?;
    report_replaced(&eval.replaced);
    note!(
        "eval-demo: {} documents from seed {} in {}; model and settings from {}",
        eval.documents(),
        eval.seed(),
        eval.corpus.display(),
        eval.assets_dir.display()
    );
    let outcome = eval.run()?;
    if args.json {
        emit(&format!("{}\n", serde_json::to_string(&outcome.report)?))?;
    } else {
        note_part!("{}", outcome.summary.render());
        emit(&outcome.report.render())?;
        note!("wrote {}", outcome.report_path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn index(args: IndexArgs) -> Result<ExitCode> {
    let stats = toolsift::annotate::tools::build_index(&args.docs, &args.out, &args.text_field)?;
    note!(
        "indexed {} documents ({} blank lines skipped) into {}",
        stats.documents,
        stats.blank_lines,
        args.out.display()
    );
    if stats.duplicate_ids > 0 {
        note!(
            "warning: {} documents have an id an earlier document has; a WikiSearch call from a \
             corpus document with that id leaves all of them out",
            stats.duplicate_ids
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn merge(args: MergeArgs) -> Result<ExitCode> {
    let report = toolsift::annotate::merge(&args.out, &args.inputs)?;
    note_part!("{}", report.summary.render());
    let paths = toolsift::annotate::OutputPaths::new(&args.out);
    note!(
        "merged {} documents and {} rejects ({} corpus lines) from {} shards into {} (rejects \
         in {}, summary in {})",
        report.documents,
        report.rejects,
        report.corpus_lines,
        report.shards,
        args.out.display(),
        paths.rejects.display(),
        paths.summary.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn generate(args: GenerateArgs) -> Result<ExitCode> {
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
    note!(
        "{} prompts: {} generated ({} calls, {} with a result{}), {} failed",
        summary.lines,
        summary.generated,
        summary.calls,
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
