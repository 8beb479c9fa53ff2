//! The `toolsift` command line: parse arguments, call the library, print. Nothing else lives here:
//! this file dispatches, and each command is a module of `cli`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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

// After the macros, which its modules use.
mod cli;

use cli::{annotate, bench, convert, demo, generate, score};

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
    Score(score::ScoreArgs),
    /// Convert a checkpoint (e.g. pytorch_model.bin) into model.safetensors, without Python.
    Convert(convert::ConvertArgs),
    /// Time toolsift against the naive, tuned and tuned-kv candle baselines (standard workload;
    /// the baselines need a `--features baselines` build, else pass --skip-baselines).
    Bench(bench::BenchCli),
    /// Build C*: sample API calls over a corpus, execute them, keep those that help, splice.
    Annotate(annotate::AnnotateArgs),
    /// Build the WikiSearch BM25 index from a JSONL file of documents.
    Index(annotate::IndexArgs),
    /// Join shard outputs of `annotate` into one C*, in input-line order.
    Merge(annotate::MergeArgs),
    /// Generate with tool calls (interrupt, execute, resume): one output line per prompt.
    Generate(generate::GenerateArgs),
    /// Run the demo pipeline on a second generated demo set and measure it against its sites.
    EvalDemo(demo::EvalDemoArgs),
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
        Command::Score(args) => score::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Annotate(args) if args.demo => demo::annotate(args),
        Command::Annotate(args) => annotate::run(args),
        Command::Index(args) => annotate::index(args),
        Command::Merge(args) => annotate::merge(args),
        Command::Generate(args) => generate::run(args),
        Command::EvalDemo(args) => demo::eval(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            note!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
