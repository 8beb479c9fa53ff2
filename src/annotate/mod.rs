//! The Toolformer driver: corpus in, C* out (docs/annotate.md).
//!
//! ```text
//! corpus.jsonl -> per tool: heuristics -> P(x) -> p("[") at every position (one forward) ->
//! top-k positions above tau_s -> m calls each (sampled off the shared prefix) -> parse ->
//! execute the tool -> score (L_none, L_call, L_call_result) -> keep iff delta >= tau_f ->
//! splice -> C* (one line per input document, input order) + rejects + summary
//! ```
//!
//! The driver is generic over `&dyn Sampler` and `&dyn Scorer`; `annotate` runs a whole corpus
//! resumably (writer.rs), `Annotator::annotate_document` one document.

pub mod calls;
pub mod config;
pub mod corpus;
pub mod document;
pub mod heuristics;
pub mod job;
pub mod positions;
pub mod prompts;
pub mod shard;
pub mod splice;
pub mod summary;
pub mod tool_kind;
pub mod tools;
pub mod writer;

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Value};

pub use config::{AnnotateConfig, ToolParams};
pub use corpus::{Document, Line};
pub use document::{Annotator, CStarRecord, CallRecord, DocStats, StageSecs, ToolStats};
pub use job::{run_job, run_job_on, Job};
pub use shard::Shard;
pub use summary::Summary;
pub use tool_kind::ToolKind;
pub use writer::OutputPaths;

use crate::error::{Error, Result};
use writer::{Journal, JournalEntry};

/// What to annotate and where to write it.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub corpus: PathBuf,
    /// `--out` as given; a sharded run writes `Shard::output_path(out)`.
    pub out: PathBuf,
    pub shard: Shard,
    /// Anything else that decides the output (model, device...): a journal written under other
    /// settings is refused.
    pub run_info: Value,
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Test hook: stop (as if killed) after this many documents of this invocation.
    pub stop_after: Option<u64>,
}

/// How a run ended.
#[derive(Debug)]
pub enum RunOutcome {
    /// Every line is done; the final files are written.
    Done(Summary, OutputPaths),
    /// `stop_after` was reached; the journal holds the progress.
    Stopped(u64),
}

/// Annotates `options.corpus` with `annotator`, resuming from the journal if there is one.
pub fn annotate(annotator: &Annotator, options: &RunOptions) -> Result<RunOutcome> {
    let started = Instant::now();
    let shard = options.shard;
    let paths = OutputPaths::new(&shard.output_path(&options.out));
    if paths.out.exists() && !paths.journal.exists() {
        return Err(Error::input(format!(
            "{} exists and no run is in progress (no {}): it is already complete; delete it to \
             annotate again",
            paths.out.display(),
            paths.journal.display()
        )));
    }
    let total = corpus::count_lines(&options.corpus)?;
    let run = json!({
        "config": annotator.config().to_toml(),
        "tools": annotator.tools().iter().map(|t| t.key()).collect::<Vec<_>>(),
        "shard": format!("{}/{}", shard.index, shard.count),
        "corpus": options.corpus.display().to_string(),
        "corpus_lines": total,
        "info": options.run_info,
    });
    let (mut journal, last_done) = Journal::open(&paths.journal, &run)?;
    let shard_total = shard.lines_of(total);
    let already = shard.lines_of(last_done);

    let bar = progress_bar(options.progress, shard_total, already);
    let file = std::fs::File::open(&options.corpus).map_err(|e| Error::io(&options.corpus, e))?;
    let mut corpus = corpus::Corpus::new(
        BufReader::with_capacity(1 << 20, file),
        &options.corpus,
        &annotator.config().text_field,
    );
    let (mut docs, mut candidates) = (0u64, 0u64);
    while let Some(line) = corpus.next_line(|n| n > last_done && shard.owns(n))? {
        let Some(line) = line else { continue };
        if options.stop_after.is_some_and(|n| docs >= n) {
            return Ok(RunOutcome::Stopped(docs));
        }
        let entry = match line {
            Line::Reject { line, reason } => JournalEntry {
                line,
                doc: None,
                reject: Some(reason),
                stats: None,
            },
            Line::Doc(doc) => match annotator.annotate_document(&doc) {
                Ok((record, stats)) => {
                    candidates += stats.candidates;
                    JournalEntry {
                        line: doc.line,
                        doc: Some(record),
                        reject: None,
                        stats: Some(stats),
                    }
                }
                // Something about this document's input (e.g. it cannot be tokenized): reject
                // it, with the reason, and go on. Backend and I/O errors stop the run (resumable).
                Err(Error::Input(msg)) => JournalEntry {
                    line: doc.line,
                    doc: None,
                    reject: Some(format!("annotation failed: {msg}")),
                    stats: None,
                },
                Err(e) => return Err(e),
            },
        };
        journal.append(&entry)?;
        docs += 1;
        bar.inc(1);
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!(
            "{:.2} docs/s, {:.1} candidates/s",
            docs as f64 / secs,
            candidates as f64 / secs
        ));
    }
    bar.finish_and_clear();
    drop(journal);
    let summary = finish(&paths, annotator.tools(), started.elapsed().as_secs_f64())?;
    Ok(RunOutcome::Done(summary, paths))
}

fn progress_bar(enabled: bool, total: u64, done: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} docs (eta {eta}) {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_position(done);
    bar
}

/// Writes C*, rejects and summary from a complete journal, then removes the journal.
fn finish(paths: &OutputPaths, tools: &[ToolKind], wall_secs: f64) -> Result<Summary> {
    let mut builder = summary::SummaryBuilder::new(tools);
    writer::write_atomic(&paths.rejects, |w| {
        for entry in writer::read_journal(&paths.journal)? {
            let entry = entry?;
            if let Some(reason) = &entry.reject {
                builder.reject();
                let line = json!({"line": entry.line, "reason": reason});
                writeln!(w, "{line}").map_err(|e| Error::io(&paths.rejects, e))?;
            }
        }
        Ok(())
    })?;
    writer::write_atomic(&paths.out, |w| {
        for entry in writer::read_journal(&paths.journal)? {
            let entry = entry?;
            if let Some(doc) = &entry.doc {
                builder.document(doc, &entry.stats.clone().unwrap_or_default());
                let line = serde_json::to_string(doc).map_err(|e| {
                    Error::input(format!("cannot serialise line {}: {e}", doc.line))
                })?;
                writeln!(w, "{line}").map_err(|e| Error::io(&paths.out, e))?;
            }
        }
        Ok(())
    })?;
    let summary = builder.finish(wall_secs);
    writer::write_atomic(&paths.summary, |w| {
        let text = serde_json::to_string_pretty(&summary)
            .map_err(|e| Error::input(format!("cannot serialise the summary: {e}")))?;
        writeln!(w, "{text}").map_err(|e| Error::io(&paths.summary, e))
    })?;
    std::fs::remove_file(&paths.journal).map_err(|e| Error::io(&paths.journal, e))?;
    Ok(summary)
}

/// What `merge` joined.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeReport {
    pub documents: u64,
    pub rejects: u64,
    /// Input lines in 1..=max covered by neither a document nor a reject (only counted when
    /// every input has its rejects file).
    pub missing: Option<u64>,
}

/// Joins shard outputs into one C* in input-line order (and their rejects files, where present,
/// into `<out stem>.rejects.jsonl`). A line that appears twice is an error.
pub fn merge(out: &Path, inputs: &[PathBuf]) -> Result<MergeReport> {
    #[derive(serde::Deserialize)]
    struct LineNo {
        line: u64,
    }
    fn read(files: &[PathBuf]) -> Result<Vec<(u64, String, usize)>> {
        let mut all = Vec::new();
        for (k, path) in files.iter().enumerate() {
            let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
            for (n, l) in text.lines().enumerate() {
                if l.trim().is_empty() {
                    continue;
                }
                let no: LineNo = serde_json::from_str(l).map_err(|e| {
                    Error::input(format!(
                        "{}:{}: no input line number: {e}",
                        path.display(),
                        n + 1
                    ))
                })?;
                all.push((no.line, l.to_string(), k));
            }
        }
        all.sort_by_key(|(line, _, _)| *line);
        for w in all.windows(2) {
            if w[0].0 == w[1].0 {
                return Err(Error::input(format!(
                    "input line {} is in both {} and {}",
                    w[0].0,
                    files[w[0].2].display(),
                    files[w[1].2].display()
                )));
            }
        }
        Ok(all)
    }
    let docs = read(inputs)?;
    let reject_files: Vec<PathBuf> = inputs
        .iter()
        .map(|p| OutputPaths::new(p).rejects)
        .filter(|p| p.exists())
        .collect();
    let rejects = read(&reject_files)?;
    let out_paths = OutputPaths::new(out);
    let write = |path: &Path, lines: &[(u64, String, usize)]| {
        writer::write_atomic(path, |w| {
            for (_, l, _) in lines {
                writeln!(w, "{l}").map_err(|e| Error::io(path, e))?;
            }
            Ok(())
        })
    };
    if !reject_files.is_empty() {
        write(&out_paths.rejects, &rejects)?;
    }
    let missing = (reject_files.len() == inputs.len()).then(|| {
        let mut lines: Vec<u64> = docs.iter().chain(&rejects).map(|d| d.0).collect();
        lines.sort_unstable();
        let max = lines.last().copied().unwrap_or(0);
        lines.dedup();
        max - lines.len() as u64
    });
    write(out, &docs)?;
    Ok(MergeReport {
        documents: docs.len() as u64,
        rejects: rejects.len() as u64,
        missing,
    })
}
