//! The embedded demo: `annotate --demo` and `eval-demo`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use toolsift::Device;

use super::annotate::{report_run, set_resume_note, AnnotateArgs};
use super::streams::emit;
use super::values::eval_docs;

/// `annotate --demo`: the embedded model, corpus and settings; the output replaces an earlier
/// demo output at the same path.
pub(crate) fn annotate(args: AnnotateArgs) -> Result<ExitCode> {
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

/// The demo's `--tools`: built-ins only (the demo model knows no other).
fn parse_tools(keys: &[String]) -> toolsift::Result<Vec<toolsift::annotate::ToolKind>> {
    keys.iter()
        .map(|k| toolsift::annotate::ToolKind::from_key(k))
        .collect()
}

/// Says which files of an earlier demo output are being replaced.
fn report_replaced(removed: &[PathBuf]) {
    if !removed.is_empty() {
        let names: Vec<String> = removed.iter().map(|p| p.display().to_string()).collect();
        note!("demo: replacing the previous output ({})", names.join(", "));
    }
}

#[derive(clap::Args)]
pub(crate) struct EvalDemoArgs {
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

/// `eval-demo`: a second demo set from `--seed`, annotated like the demo, measured against its
/// sites.
pub(crate) fn eval(args: EvalDemoArgs) -> Result<ExitCode> {
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
