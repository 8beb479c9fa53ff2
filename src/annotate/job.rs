//! One annotate run from paths and settings: load the model, build the tools and the engine,
//! annotate the corpus. What `toolsift annotate` (plain and `--demo`) and `toolsift eval-demo`
//! run.

use std::path::PathBuf;

use serde_json::json;

use super::config::AnnotateConfig;
use super::tool_kind::{ToolKind, ToolName};
use super::tools::{ToolRegistry, WikiSearch};
use super::{annotate, Annotator, RunOptions, RunOutcome, Shard};
use crate::backend::{engine_for, Device, Engine};
use crate::error::{Error, Result};
use crate::model::Model;

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Job {
    /// Hugging Face GPT-J folder with tokenizer.json.
    pub model_dir: PathBuf,
    /// The corpus JSONL (a regular file: it is read more than once).
    pub corpus: PathBuf,
    /// C* output (rejects and summary are written next to it).
    pub out: PathBuf,
    /// The run's settings (`--config`, else the defaults); `run_job` opens the tools of its
    /// `[tools]`.
    pub config: AnnotateConfig,
    /// The active tools; None: every tool the config makes available (the built-ins it
    /// configures), then every custom tool it has settings for (one without its service under
    /// `[tools.custom]` is then an error, not left out in silence).
    pub tools: Option<Vec<ToolName>>,
    /// Where the engine that samples and scores runs (CPU or CUDA).
    pub device: Device,
    /// The part of the corpus this run annotates; a sharded run writes
    /// `Shard::output_path(out)`.
    pub shard: Shard,
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
}

/// Runs `job` (resuming from its journal if there is one).
pub fn run_job(job: &Job) -> Result<RunOutcome> {
    super::check_out(&job.out)?;
    run_job_with(job, &open_tools(job)?)
}

/// As `run_job`, with the tools of `job.config` already opened (`ToolRegistry::from_config`):
/// the CLI opens them first, so that a bad WikiSearch index is reported naming the config file.
pub fn run_job_with(job: &Job, registry: &ToolRegistry) -> Result<RunOutcome> {
    // Before the load, which takes minutes for a 6B checkpoint.
    super::check_out(&job.out)?;
    // (`Annotator::new` checks them again, for the callers that come in below the load.)
    super::check_tools(registry, &run_tools(job, registry))?;
    let model = Model::load(&job.model_dir)?;
    // One engine samples positions and calls and scores the candidates.
    let engine = engine_for(&model, job.device)?;
    run_on(job, &model, engine.as_ref(), registry)
}

/// As `run_job`, on the model in `job.model_dir` already loaded and its engine already built
/// (`eval-demo` goes on to generate with the same ones).
pub fn run_job_on(job: &Job, model: &Model, engine: &dyn Engine) -> Result<RunOutcome> {
    run_on(job, model, engine, &open_tools(job)?)
}

/// The tools `job` runs: its `tools`, else every built-in `registry` holds and every tool of
/// `[per_tool.custom]`.
fn run_tools(job: &Job, registry: &ToolRegistry) -> Vec<ToolName> {
    match &job.tools {
        Some(t) => t.clone(),
        None => ToolKind::ALL
            .into_iter()
            .filter(|t| registry.get(t.call_name()).is_some())
            .map(ToolName::from)
            .chain(
                job.config
                    .per_tool
                    .custom
                    .keys()
                    .cloned()
                    .map(ToolName::Custom),
            )
            .collect(),
    }
}

fn open_tools(job: &Job) -> Result<ToolRegistry> {
    ToolRegistry::from_config(&job.config.tools).map_err(|e| Error::input(e.to_string()))
}

fn run_on(
    job: &Job,
    model: &Model,
    engine: &dyn Engine,
    registry: &ToolRegistry,
) -> Result<RunOutcome> {
    let tools = run_tools(job, registry);
    if tools.is_empty() {
        // A run would copy the corpus into C* unannotated, and succeed.
        return Err(Error::input(if job.tools.is_some() {
            "no tool to run: the job names none"
        } else {
            "no tool to run: the config disables every built-in tool ([tools.<tool>] enabled = \
             false) and configures no tool of its own ([per_tool.custom])"
        }));
    }
    let tokenizer = model.tokenizer()?;
    let annotator = Annotator::new(tokenizer, engine, engine, registry, &job.config, &tools)?;
    let mut run_info = json!({
        "model": job.model_dir.display().to_string(),
        // The path alone would let a resume go on with another checkpoint in that folder.
        "model_xxh3": format!("{:016x}", model.content_xxh3()?),
        "device": format!("{:?}", job.device),
    });
    // Likewise an index rebuilt in place. (QA and MT services cannot be told apart this way.)
    if let Some(wiki) = job
        .config
        .tools
        .wikisearch
        .as_ref()
        .filter(|_| tools.contains(&ToolKind::WikiSearch.into()))
    {
        // The index as the registry opened it, before a long model load; read now for a
        // registry assembled otherwise.
        let hash = match registry.wikisearch_index_xxh3() {
            Some(h) => h,
            None => WikiSearch::index_xxh3(&wiki.index).map_err(|e| Error::io(&wiki.index, e))?,
        };
        run_info["wikisearch_index_xxh3"] = json!(format!("{hash:016x}"));
    }
    let options = RunOptions {
        corpus: job.corpus.clone(),
        out: job.out.clone(),
        shard: job.shard,
        run_info,
        progress: job.progress,
        stop_after: None,
    };
    annotate(&annotator, &options)
}
