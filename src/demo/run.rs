//! The two demo commands as library calls: `toolsift annotate --demo` ([`DemoRun`]) and
//! `toolsift eval-demo` ([`EvalRun`]). Each is prepared first (assets written, model and engine
//! opened, the earlier output cleared) and then run, so a caller can say where things go before
//! the long part starts; the CLI (src/cli/demo.rs) only parses flags and prints.
//!
//! The model and the engine are opened before anything is removed: a device that cannot start
//! (`Device::Cuda` without a GPU) fails without touching an earlier output.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::corpus::{DemoDoc, DEMO_TOOLS};
use super::eval::{self, EvalReport};
use super::{assets, remove_previous_output, tool_use};
use crate::annotate::{
    run_job_on, AnnotateConfig, Job, RunOutcome, Shard, Summary, ToolKind, ToolName,
};
use crate::backend::{engine_for, Device, Engine};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::util::fs::write_atomic;

/// What `annotate --demo` takes.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The backend for sampling and scoring (`--device`); opened before anything is removed.
    pub device: Device,
    /// Base seed; None: the embedded settings' seed.
    pub seed: Option<u64>,
    /// Annotate only the first N documents of the embedded corpus.
    pub docs: Option<usize>,
    /// None: the demo's tools (calculator, calendar).
    pub tools: Option<Vec<ToolKind>>,
    /// The C* file; rejects and summary go next to it. An earlier demo output there is
    /// replaced; another run's is refused (`remove_previous_output`).
    pub out: PathBuf,
    /// Show progress bars (false with `--no-progress`).
    pub progress: bool,
}

/// `annotate --demo`, ready to run.
pub struct DemoRun {
    /// The materialized assets: model, tokenizer, corpus.jsonl, annotate.toml.
    pub assets_dir: PathBuf,
    /// Documents that will be annotated.
    pub documents: u64,
    /// Earlier output files removed to make way for this run.
    pub replaced: Vec<PathBuf>,
    job: Job,
    opened: Opened,
}

impl DemoRun {
    /// Writes or reuses the assets, loads the model, opens the engine, checks the tools and
    /// `out`, then removes an earlier finished output at `out` (listed in `replaced`). Fails
    /// before anything is removed when one of those cannot be done or a file at `out` is not
    /// toolsift's (`remove_previous_output`).
    pub fn prepare(options: DemoOptions) -> Result<Self> {
        let opened = Opened::new(options.seed, options.device)?;
        let corpus = match options.docs {
            Some(n) => assets::corpus_prefix(&opened.dir, n)?,
            None => opened.dir.join(assets::CORPUS_FILE),
        };
        let documents = crate::annotate::corpus::count_lines(&corpus)?;
        let tools = options.tools.unwrap_or_else(|| DEMO_TOOLS.to_vec());
        // Checked before an earlier output is removed, as everything else that can fail early.
        let registry = crate::annotate::tools::ToolRegistry::from_config(&opened.config.tools)
            .map_err(|e| Error::input(e.to_string()))?;
        let names: Vec<ToolName> = tools.iter().map(|&t| t.into()).collect();
        crate::annotate::check_tools(&registry, &names)?;
        crate::annotate::check_out(&options.out)?;
        refuse_in_assets(&opened.dir, &options.out)?;
        let replaced = prepare_output(&options.out, false)?;
        let job = opened.job(corpus, options.out, names, options.progress);
        Ok(DemoRun {
            assets_dir: opened.dir.clone(),
            documents,
            replaced,
            job,
            opened,
        })
    }

    /// The C* file this run writes.
    pub fn out(&self) -> &Path {
        &self.job.out
    }

    /// Annotates the corpus into the C* file (resuming from the journal an interrupted demo
    /// run left there) and returns how the run ended.
    pub fn run(self) -> Result<RunOutcome> {
        self.opened.run(&self.job)
    }
}

/// What `eval-demo` takes.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Seed of the generated set (the embedded corpus uses another).
    pub seed: u64,
    /// Documents in the set.
    pub docs: usize,
    /// The backend for sampling, scoring and generation (`--device`).
    pub device: Device,
    /// Folder for the set (corpus.jsonl), its C* (cstar.jsonl, replaced) and eval.json.
    pub out_dir: PathBuf,
    /// Also compare generation with and without tools on the set's arithmetic prompts.
    pub tool_use: bool,
    /// Show progress bars (false with `--no-progress`).
    pub progress: bool,
}

/// `eval-demo`, ready to run: the set generated and written.
pub struct EvalRun {
    /// The materialized assets: model, tokenizer, corpus.jsonl, annotate.toml.
    pub assets_dir: PathBuf,
    /// The generated set, written as JSONL.
    pub corpus: PathBuf,
    /// Earlier output files removed to make way for this run (C*, rejects, summary, journal).
    pub replaced: Vec<PathBuf>,
    docs: Vec<DemoDoc>,
    options: EvalOptions,
    job: Job,
    opened: Opened,
    started: Instant,
    /// `out_dir`'s lock, held until the report is written (`lock_folder`).
    _lock: Option<std::fs::File>,
}

/// What an `eval-demo` run produced.
pub struct EvalOutcome {
    /// The annotate run's summary.
    pub summary: Summary,
    /// The metrics, targets and timings (what `--json` prints).
    pub report: EvalReport,
    /// Where the report was written (eval.json).
    pub report_path: PathBuf,
}

impl EvalRun {
    /// Writes or reuses the assets, loads the model, opens the engine, generates the set and
    /// writes it to `<out_dir>/corpus.jsonl`, after removing an earlier C* there (listed in
    /// `replaced`). Fails before any file in `out_dir` is written or removed when `out_dir` is
    /// not a folder, its corpus.jsonl or eval.json is not eval-demo's, or a C* file there is not
    /// toolsift's (`remove_previous_output`).
    pub fn prepare(options: EvalOptions) -> Result<Self> {
        let started = Instant::now();
        // One model and engine for the annotate run and the generation comparison after it.
        let opened = Opened::new(None, options.device)?;
        let out_dir = &options.out_dir;
        if out_dir.exists() && !out_dir.is_dir() {
            return Err(Error::input(format!(
                "{} (--out) is not a folder: give a folder for the set, its C* and eval.json",
                out_dir.display()
            )));
        }
        refuse_in_assets(&opened.dir, out_dir)?;
        std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
        let lock = lock_folder(out_dir)?;
        if !super::held_out(options.seed) {
            tracing::warn!(
                "eval-demo --seed {}: not a held-out set ({}); its figures say how the demo does \
                 on documents it has seen, not on new ones",
                options.seed,
                if options.seed == super::TRAIN_SEED {
                    "the demo model was trained on this seed's documents"
                } else {
                    "the embedded demo corpus is this seed's documents"
                }
            );
        }
        let docs = super::corpus::generate(options.seed, options.docs);
        let corpus = out_dir.join("corpus.jsonl");
        // Every file this replaces is checked before any is written or removed.
        refuse_foreign_corpus(&corpus)?;
        refuse_foreign_report(&out_dir.join("eval.json"))?;
        let cstar = out_dir.join("cstar.jsonl");
        // An interrupted earlier run's journal belongs to another set: removed too.
        let replaced = prepare_output(&cstar, true)?;
        let text = assets::docs_jsonl(&docs);
        write_atomic(&corpus, |w| {
            w.write_all(text.as_bytes())
                .map_err(|e| Error::io(&corpus, e))
        })?;
        let job = opened.job(
            corpus.clone(),
            cstar,
            DEMO_TOOLS.map(ToolName::from).to_vec(),
            options.progress,
        );
        Ok(EvalRun {
            assets_dir: opened.dir.clone(),
            corpus,
            replaced,
            docs,
            options,
            job,
            opened,
            started,
            _lock: lock,
        })
    }

    /// Documents in the set.
    pub fn documents(&self) -> usize {
        self.docs.len()
    }

    /// Seed of the set (`EvalOptions::seed`).
    pub fn seed(&self) -> u64 {
        self.options.seed
    }

    /// Annotates the set, measures the C* against the set's sites, optionally compares
    /// generation with and without tools, and writes eval.json.
    pub fn run(self) -> Result<EvalOutcome> {
        let summary = match self.opened.run(&self.job)? {
            RunOutcome::Done(summary, _) => *summary,
            RunOutcome::Stopped(n) => {
                return Err(Error::input(format!(
                    "the annotate run stopped after {n} documents"
                )))
            }
        };
        let cstar = &self.job.out;
        let records = eval::read_cstar(cstar)?;
        let metrics = eval::evaluate(&self.docs, &records);
        let unfiltered = eval::evaluate(&self.docs, &eval::unfiltered(&records));
        let tool_use = if self.options.tool_use {
            let tools = crate::generate::tools_from_config(None, None)?;
            let Opened { model, engine, .. } = &self.opened;
            Some(tool_use::compare(
                engine.as_ref(),
                model.tokenizer()?,
                &tools,
                &tool_use::arithmetic_prompts(&self.docs),
                model.config().n_positions,
            )?)
        } else {
            None
        };
        let mut report = EvalReport::new(
            self.options.seed,
            metrics,
            &summary,
            self.started.elapsed().as_secs_f64(),
            cstar,
        );
        report.tool_use = tool_use;
        report.unfiltered = Some(unfiltered);
        let json = serde_json::to_string(&report)
            .map_err(|e| Error::input(format!("serializing the report: {e}")))?;
        let report_path = self.options.out_dir.join("eval.json");
        write_atomic(&report_path, |w| {
            writeln!(w, "{json}").map_err(|e| Error::io(&report_path, e))
        })?;
        Ok(EvalOutcome {
            summary,
            report,
            report_path,
        })
    }
}

/// The demo's settings (annotate.toml as embedded; `seed` overrides its base seed).
pub fn settings(seed: Option<u64>) -> Result<AnnotateConfig> {
    let mut config = assets::demo_config()?;
    if let Some(seed) = seed {
        config.seed = seed;
        config.validate()?;
    }
    Ok(config)
}

/// What both commands open before they touch any output: the settings, the materialized
/// assets, the model and its engine.
struct Opened {
    config: AnnotateConfig,
    dir: PathBuf,
    device: Device,
    model: Model,
    engine: Box<dyn Engine>,
}

impl Opened {
    fn new(seed: Option<u64>, device: Device) -> Result<Self> {
        let config = settings(seed)?;
        let dir = assets::materialize()?;
        let model = Model::load(&dir)?;
        let engine = engine_for(&model, device)?;
        Ok(Opened {
            config,
            dir,
            device,
            model,
            engine,
        })
    }

    /// The annotate job over `corpus` into `out` with the demo's model and settings.
    fn job(&self, corpus: PathBuf, out: PathBuf, tools: Vec<ToolName>, progress: bool) -> Job {
        Job {
            model_dir: self.dir.clone(),
            corpus,
            out,
            config: self.config.clone(),
            tools: Some(tools),
            device: self.device,
            shard: Shard::default(),
            progress,
        }
    }

    fn run(&self, job: &Job) -> Result<RunOutcome> {
        run_job_on(job, &self.model, self.engine.as_ref())
    }
}

/// An existing `corpus` that is not an earlier evaluation set (its first line has no "kind" and
/// "sites", as `DemoDoc::to_json` writes) is an error: `eval-demo --out .` in a data folder must
/// not replace someone's corpus.jsonl.
fn refuse_foreign_corpus(corpus: &Path) -> Result<()> {
    refuse_foreign(corpus, false, "an eval-demo set", |v| {
        v.get("kind").is_some() && v["sites"].is_array()
    })
}

/// An existing `report` that is not an earlier eval.json (a JSON object with "seed" and
/// "metrics", as `EvalReport` is written) is an error, as a foreign corpus is.
fn refuse_foreign_report(report: &Path) -> Result<()> {
    refuse_foreign(report, true, "an eval-demo report", |v| {
        v.get("seed").is_some() && v.get("metrics").is_some()
    })
}

/// An error when `path` exists and its first line (`whole`: all of it) is neither empty nor
/// JSON that `ours` recognises; `what` names what it should have been.
fn refuse_foreign(
    path: &Path,
    whole: bool,
    what: &str,
    ours: impl Fn(&serde_json::Value) -> bool,
) -> Result<()> {
    // Not opened unless a regular file: a named pipe would block the read.
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => {
            return Err(Error::input(format!(
                "{} exists and is not a file, so not {what}; not replacing it (choose another \
                 --out)",
                path.display()
            )))
        }
        _ => {}
    }
    let Some(head) = crate::util::jsonl::read_head(path, whole)? else {
        return Ok(());
    };
    if head.is_empty() || serde_json::from_slice(&head).is_ok_and(|v| ours(&v)) {
        return Ok(());
    }
    Err(Error::input(format!(
        "{} exists and is not {what}; not replacing it (choose another --out)",
        path.display()
    )))
}

/// Refuses an output `out` (a file or a folder, existing or not) inside the demo's assets
/// folder `assets`: that folder is rewritten whenever it is found altered, which would lose the
/// output, and eval-demo's corpus.jsonl would replace the embedded one.
fn refuse_in_assets(assets: &Path, out: &Path) -> Result<()> {
    let Ok(assets) = std::fs::canonicalize(assets) else {
        return Ok(());
    };
    // `out` may not exist yet: its nearest existing ancestor says where it would go.
    for probe in out.ancestors() {
        let probe = if probe.as_os_str().is_empty() {
            Path::new(".")
        } else {
            probe
        };
        if let Ok(there) = std::fs::canonicalize(probe) {
            if there.starts_with(&assets) {
                return Err(Error::input(format!(
                    "{} (--out) is inside the demo's own folder {}, which toolsift rewrites \
                     whenever it finds it altered; choose another --out",
                    out.display(),
                    assets.display()
                )));
            }
            return Ok(());
        }
    }
    Ok(())
}

/// Takes `dir`'s exclusive advisory lock, held while the returned file is open: a second
/// eval-demo into the same folder would replace the set and C* this one is measuring. A
/// folder that cannot be opened or locked (no such locks on its file system) is a warning.
fn lock_folder(dir: &Path) -> Result<Option<std::fs::File>> {
    let file = match std::fs::File::open(dir) {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!(
                "{}: cannot open the folder to lock it ({e}); make sure no other eval-demo \
                 writes into it",
                dir.display()
            );
            return Ok(None);
        }
    };
    crate::util::fs::lock_in_place(
        &file,
        dir,
        || {
            format!(
                "{} (--out): another eval-demo run is writing into this folder; wait for it to \
                 finish or choose another --out",
                dir.display()
            )
        },
        || {
            format!(
                "{}: another process replaced or removed this folder while eval-demo started; \
                 rerun",
                dir.display()
            )
        },
    )?;
    Ok(Some(file))
}

/// Makes the parent folder of `out` and removes an earlier finished output there (see
/// [`remove_previous_output`]); returns what was removed.
fn prepare_output(out: &Path, journal_too: bool) -> Result<Vec<PathBuf>> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    remove_previous_output(out, journal_too)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--seed` replaces the embedded settings' base seed, and the settings are checked again
    /// with it (a seed past TOML's integers could not be recorded in the journal).
    #[test]
    fn settings_take_the_seed_given_and_check_it() {
        let embedded = settings(None).unwrap();
        assert_eq!(embedded, assets::demo_config().unwrap());
        let seeded = settings(Some(embedded.seed + 5)).unwrap();
        assert_eq!(seeded.seed, embedded.seed + 5);
        assert_eq!(
            AnnotateConfig {
                seed: embedded.seed,
                ..seeded
            },
            embedded
        );
        let e = settings(Some(u64::MAX)).unwrap_err().to_string();
        assert!(e.contains("past TOML's integer range"), "{e}");
    }

    /// A file eval-demo would replace is its own only when its JSON has both keys it writes
    /// ("kind" and "sites" for a set's first line, "seed" and "metrics" for a report); an
    /// empty or missing file is nobody's.
    #[test]
    fn a_foreign_file_needs_both_keys_to_pass_for_eval_demos() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.json");
        assert!(refuse_foreign_corpus(&path).is_ok() && refuse_foreign_report(&path).is_ok());
        let with = |text: &str| {
            std::fs::write(&path, text).unwrap();
            (
                refuse_foreign_corpus(&path).is_ok(),
                refuse_foreign_report(&path).is_ok(),
            )
        };
        assert_eq!(with(""), (true, true));
        assert_eq!(
            with("{\"kind\": \"x\", \"sites\": []}\n{}\n"),
            (true, false)
        );
        assert_eq!(with("{\"kind\": \"x\"}\n"), (false, false));
        assert_eq!(with("{\"sites\": []}\n"), (false, false));
        assert_eq!(with("{\"seed\": 2, \"metrics\": {}}\n"), (false, true));
        assert_eq!(with("{\"seed\": 2}\n"), (false, false));
        assert_eq!(with("{\"metrics\": {}}\n"), (false, false));
    }

    /// An eval.json is read whole: one pretty-printed over several lines is still the report's.
    #[test]
    fn a_report_over_several_lines_is_eval_demos() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eval.json");
        std::fs::write(&path, "{\n  \"seed\": 2,\n  \"metrics\": {}\n}\n").unwrap();
        assert!(refuse_foreign_report(&path).is_ok());
    }

    /// An output inside the demo's folder is refused by where it would go: a file or folder in
    /// it, one in a subfolder of it, or through a link to it; one beside it ("<assets>/../x"),
    /// once the first existing folder on its path is outside, is not.
    #[cfg(unix)]
    #[test]
    fn an_output_is_refused_by_where_it_would_land() {
        let dir = tempfile::tempdir().unwrap();
        let assets = dir.path().join("assets");
        std::fs::create_dir_all(assets.join("sub")).unwrap();
        std::fs::create_dir(dir.path().join("x")).unwrap();
        std::os::unix::fs::symlink(&assets, dir.path().join("link")).unwrap();
        std::fs::write(assets.join("corpus.jsonl"), "").unwrap();
        for inside in [
            assets.clone(),
            assets.join("c.jsonl"),
            assets.join("corpus.jsonl"),
            assets.join("sub").join("c.jsonl"),
            assets.join("sub").join("new").join("c.jsonl"),
            dir.path().join("link").join("c.jsonl"),
        ] {
            let err = refuse_in_assets(&assets, &inside).unwrap_err().to_string();
            assert!(err.contains("inside the demo's own folder"), "{err}");
        }
        for outside in [
            dir.path().join("c.jsonl"),
            assets.join("..").join("x").join("c.jsonl"),
            dir.path().join("x").join("new").join("c.jsonl"),
        ] {
            assert!(
                refuse_in_assets(&assets, &outside).is_ok(),
                "{}",
                outside.display()
            );
        }
    }
}
