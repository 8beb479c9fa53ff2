//! `toolsift annotate` (build C*), and its tooling: `index` (WikiSearch's BM25 index) and
//! `merge` (shard outputs into one C*).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use toolsift::Device;

use super::streams::{emit, set_stop_note};
use super::values::{at_least_one, output_file};

#[derive(clap::Args)]
pub(crate) struct AnnotateArgs {
    /// Run the built-in demo: the embedded demo model, corpus and settings (docs/demo.md).
    #[arg(long)]
    pub(crate) demo: bool,
    /// Demo: annotate only the first N documents of the demo corpus (for quick checks).
    #[arg(long, requires = "demo", value_parser = at_least_one)]
    pub(crate) demo_docs: Option<usize>,
    /// Hugging Face GPT-J folder (config.json, weights, tokenizer.json).
    #[arg(long, required_unless_present_any = ["print_config", "demo"], conflicts_with = "demo")]
    pub(crate) model: Option<PathBuf>,
    /// The corpus, JSONL (the text under `text_field`; optional "id", "url", "date").
    #[arg(long, required_unless_present_any = ["print_config", "demo"], conflicts_with = "demo")]
    pub(crate) corpus: Option<PathBuf>,
    /// C* output, JSONL; rejects and summary are written next to it (--demo: default
    /// toolsift-demo/cstar.jsonl; an earlier demo output there is replaced, anything else
    /// refused).
    #[arg(long, required_unless_present_any = ["print_config", "demo"], value_parser = output_file)]
    pub(crate) out: Option<PathBuf>,
    /// Tools to use: built-ins by key, tools of the config's [per_tool.custom] by name
    /// (default: every configured one; calculator and calendar need no setup;
    /// --demo: calculator,calendar).
    #[arg(long, value_delimiter = ',')]
    pub(crate) tools: Option<Vec<String>>,
    /// TOML settings (see --print-config).
    #[arg(long, conflicts_with = "demo")]
    pub(crate) config: Option<PathBuf>,
    /// Print the settings in effect (defaults, or --config's) as TOML and exit.
    #[arg(long)]
    pub(crate) print_config: bool,
    /// Backend for the model: sampling (positions, calls) and the filter's scoring.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub(crate) device: Device,
    /// Base seed (overrides the config's `seed`).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Corpus field holding the text (overrides the config's `text_field`); "id", "url" or
    /// "date" is read as the text and kept as that field too.
    #[arg(long, conflicts_with = "demo")]
    pub(crate) text_field: Option<String>,
    /// This process's shard, INDEX/COUNT (0-based); line L goes to shard (L-1) % COUNT.
    #[arg(long, conflicts_with = "demo")]
    pub(crate) shard: Option<String>,
    /// Shard count for JOB_COMPLETION_INDEX (Kubernetes Indexed Jobs) or Slurm arrays (--shard
    /// already holds its count).
    #[arg(long, conflicts_with_all = ["demo", "shard"], value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) shards: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    pub(crate) no_progress: bool,
}

/// `annotate`: settings from --config and the flags, tools opened, then the corpus -> C* job
/// (`annotate --demo` is `demo::annotate`, chosen in main).
pub(crate) fn run(args: AnnotateArgs) -> Result<ExitCode> {
    use toolsift::annotate::{run_job_with, AnnotateConfig, Job, Shard};
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

/// Prints the summary and where the files went; returns the summary.
pub(crate) fn report_run(
    outcome: toolsift::annotate::RunOutcome,
) -> Option<toolsift::annotate::Summary> {
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

/// The stop note of an annotate run writing C* at `out`: where its journal is.
pub(crate) fn set_resume_note(out: &std::path::Path) {
    set_stop_note(format!(
        "run the same command again to resume from the journal {}",
        toolsift::annotate::OutputPaths::new(out).journal.display()
    ));
}

#[derive(clap::Args)]
pub(crate) struct IndexArgs {
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

/// `index`: WikiSearch's BM25 index from a JSONL file of documents.
pub(crate) fn index(args: IndexArgs) -> Result<ExitCode> {
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

#[derive(clap::Args)]
pub(crate) struct MergeArgs {
    /// Merged C*; rejects and summary are written next to it.
    #[arg(long, value_parser = output_file)]
    out: PathBuf,
    /// Shard outputs.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
}

/// `merge`: shard outputs of `annotate` into one C*, in input-line order.
pub(crate) fn merge(args: MergeArgs) -> Result<ExitCode> {
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
