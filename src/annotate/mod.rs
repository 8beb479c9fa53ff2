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

use std::io::{BufReader, Write};
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
    Done(Box<Summary>, OutputPaths),
    /// `stop_after` was reached; the journal holds the progress.
    Stopped(u64),
}

/// Annotates `options.corpus` with `annotator`, resuming from the journal if there is one.
pub fn annotate(annotator: &Annotator, options: &RunOptions) -> Result<RunOutcome> {
    let started = Instant::now();
    let shard = options.shard;
    if options.out.is_dir() || options.out.file_name().is_none() {
        return Err(Error::input(format!(
            "--out {}: give a file name for C*, e.g. {}",
            options.out.display(),
            options.out.join("cstar.jsonl").display()
        )));
    }
    // The corpus is read twice (its lines are counted first, and a resumed run reads it again
    // from the start): a pipe would give an empty second read.
    let meta = std::fs::metadata(&options.corpus).map_err(|e| Error::io(&options.corpus, e))?;
    if !meta.is_file() {
        return Err(Error::input(format!(
            "{}: the corpus must be a regular file (it is read more than once); write it to a \
             file first",
            options.corpus.display()
        )));
    }
    let paths = OutputPaths::new(&shard.output_path(&options.out));
    if paths.out.exists() && !paths.journal.exists() {
        return Err(Error::input(format!(
            "{} exists and no run is in progress (no {}): it is already complete; delete it to \
             annotate again",
            paths.out.display(),
            paths.journal.display()
        )));
    }
    let corpus_id = corpus::fingerprint(&options.corpus)?;
    let total = corpus_id.lines;
    let run = json!({
        "config": annotator.config().to_toml(),
        "tools": annotator.tools().iter().map(|t| t.key()).collect::<Vec<_>>(),
        "shard": format!("{}/{}", shard.index, shard.count),
        "corpus": options.corpus.display().to_string(),
        "corpus_lines": total,
        "corpus_xxh3": format!("{:016x}", corpus_id.xxh3),
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
    let lines_read = std::cell::Cell::new(0u64);
    let want = |n: u64| {
        lines_read.set(n);
        n > last_done && shard.owns(n)
    };
    while let Some(line) = corpus.next_line(want)? {
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
    if lines_read.get() != total {
        return Err(Error::input(format!(
            "{}: {} lines when the run started, {} now: the corpus changed during the run; \
             the journal {} is kept",
            options.corpus.display(),
            total,
            lines_read.get(),
            paths.journal.display()
        )));
    }
    let run = RunSummary {
        shard,
        corpus_lines: total,
        wall_secs: started.elapsed().as_secs_f64(),
    };
    let summary = finish(&paths, annotator.tools(), &run)?;
    // Unlocked only now: a second run must not start on this output while it is being written.
    drop(journal);
    Ok(RunOutcome::Done(Box::new(summary), paths))
}

/// What `finish` records about the run besides the journal's entries.
struct RunSummary {
    shard: Shard,
    corpus_lines: u64,
    wall_secs: f64,
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

/// Writes C*, rejects and summary from a complete journal, then removes the journal. The
/// journal must hold exactly the shard's lines, in order; anything else is an error and leaves
/// the journal (and any earlier output) as it was.
fn finish(paths: &OutputPaths, tools: &[ToolKind], run: &RunSummary) -> Result<Summary> {
    let mut builder = summary::SummaryBuilder::new(tools);
    let mut out = writer::AtomicFile::create(&paths.out)?;
    let mut rejects = writer::AtomicFile::create(&paths.rejects)?;
    let mut expected = (1..=run.corpus_lines).filter(|&n| run.shard.owns(n));
    for entry in writer::read_journal(&paths.journal)? {
        let entry = entry?;
        if expected.next() != Some(entry.line) {
            return Err(Error::input(format!(
                "{}: input line {} is not the next line of shard {}/{}; the journal is \
                 corrupt, delete it to start over",
                paths.journal.display(),
                entry.line,
                run.shard.index,
                run.shard.count
            )));
        }
        if let Some(reason) = &entry.reject {
            builder.reject();
            let line = json!({"line": entry.line, "reason": reason});
            writeln!(rejects, "{line}").map_err(|e| Error::io(&paths.rejects, e))?;
        }
        if let Some(doc) = &entry.doc {
            builder.document(doc, &entry.stats.clone().unwrap_or_default());
            let line = serde_json::to_string(doc)
                .map_err(|e| Error::input(format!("cannot serialise line {}: {e}", doc.line)))?;
            writeln!(out, "{line}").map_err(|e| Error::io(&paths.out, e))?;
        }
    }
    if let Some(line) = expected.next() {
        return Err(Error::input(format!(
            "{}: input line {line} is missing from the journal of a finished run; delete the \
             journal to start over",
            paths.journal.display()
        )));
    }
    let mut summary = builder.finish(run.wall_secs);
    summary.shard = Some(run.shard);
    summary.corpus_lines = Some(run.corpus_lines);
    rejects.commit()?;
    out.commit()?;
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
    /// The shards joined (all of them: a missing one is an error).
    pub shards: u64,
    /// The corpus's line count; every line is in exactly one output.
    pub corpus_lines: u64,
}

/// Joins the outputs of every shard of one run into one C* in input-line order, and their
/// rejects into `<out stem>.rejects.jsonl`. Each input is a C* file (`*.shard-I-of-C.jsonl`);
/// its rejects and summary are read from beside it (a rejects or summary file given as an input
/// too, as a shell glob may, is skipped). The summaries say which shard each output is and how
/// many lines the corpus has: a missing or repeated shard, a line in two outputs or in none is
/// an error, and nothing is written then. Streams: memory does not grow with the corpus.
pub fn merge(out: &Path, inputs: &[PathBuf]) -> Result<MergeReport> {
    let outputs = merge_inputs(inputs)?;
    let Some(first) = outputs.first() else {
        return Err(Error::input("merge: no C* files given"));
    };
    let (count, corpus_lines) = (first.shard.count, first.corpus_lines);
    let mut seen = vec![None; count as usize];
    for o in &outputs {
        if o.shard.count != count || o.corpus_lines != corpus_lines {
            return Err(Error::input(format!(
                "{} is shard {}/{} of a {}-line corpus, but {} is shard {}/{} of a {}-line \
                 corpus: not outputs of one run",
                o.paths.out.display(),
                o.shard.index,
                o.shard.count,
                o.corpus_lines,
                first.paths.out.display(),
                first.shard.index,
                count,
                corpus_lines
            )));
        }
        if let Some(other) = seen[o.shard.index as usize].replace(&o.paths.out) {
            return Err(Error::input(format!(
                "shard {}/{count} is given twice: {} and {}",
                o.shard.index,
                other.display(),
                o.paths.out.display()
            )));
        }
    }
    let missing: Vec<String> = (0..count)
        .filter(|&i| seen[i as usize].is_none())
        .map(|i| {
            Shard { index: i, count }
                .output_path(out)
                .display()
                .to_string()
        })
        .collect();
    if !missing.is_empty() {
        return Err(Error::input(format!(
            "{} of {count} shards missing, e.g. {} (merge needs every shard's output)",
            missing.len(),
            missing[0]
        )));
    }
    let out_paths = OutputPaths::new(out);
    for o in &outputs {
        if [&o.paths.out, &o.paths.rejects].contains(&&out_paths.out)
            || [&o.paths.out, &o.paths.rejects].contains(&&out_paths.rejects)
        {
            return Err(Error::input(format!(
                "--out {} would overwrite an input",
                out.display()
            )));
        }
    }

    // One stream per file; a k-way merge on the input line number.
    let mut streams = Vec::new();
    for o in &outputs {
        streams.push(MergeStream::open(&o.paths.out, o.shard, false)?);
        streams.push(MergeStream::open(&o.paths.rejects, o.shard, true)?);
    }
    let mut heap = std::collections::BinaryHeap::new();
    for (k, s) in streams.iter_mut().enumerate() {
        if let Some(line) = s.advance()? {
            heap.push(std::cmp::Reverse((line, k)));
        }
    }
    let mut docs_file = writer::AtomicFile::create(&out_paths.out)?;
    let mut rejects_file = writer::AtomicFile::create(&out_paths.rejects)?;
    let (mut documents, mut rejects, mut next) = (0u64, 0u64, 1u64);
    while let Some(std::cmp::Reverse((line, k))) = heap.pop() {
        let s = &mut streams[k];
        if line != next || line > corpus_lines {
            let msg = if line < next {
                format!(
                    "input line {line} is in two outputs (the second: {})",
                    s.path.display()
                )
            } else if next <= corpus_lines {
                let owner = (next - 1) % count;
                format!(
                    "input line {next} is in no output (it belongs to shard {owner}/{count}, {})",
                    seen[owner as usize].map_or(String::new(), |p| p.display().to_string())
                )
            } else {
                format!(
                    "{}: input line {line} is beyond the corpus's {corpus_lines} lines",
                    s.path.display()
                )
            };
            return Err(Error::input(msg));
        }
        let (w, path) = if s.rejects {
            rejects += 1;
            (&mut rejects_file, &out_paths.rejects)
        } else {
            documents += 1;
            (&mut docs_file, &out_paths.out)
        };
        writeln!(w, "{}", s.current).map_err(|e| Error::io(path, e))?;
        next += 1;
        if let Some(line) = s.advance()? {
            heap.push(std::cmp::Reverse((line, k)));
        }
    }
    if next <= corpus_lines {
        let owner = (next - 1) % count;
        return Err(Error::input(format!(
            "input line {next} is in no output (it belongs to shard {owner}/{count})"
        )));
    }
    rejects_file.commit()?;
    docs_file.commit()?;
    Ok(MergeReport {
        documents,
        rejects,
        shards: count,
        corpus_lines,
    })
}

/// One shard's output as `merge` sees it.
struct MergeInput {
    paths: OutputPaths,
    shard: Shard,
    corpus_lines: u64,
}

/// The C* files among `inputs` with their summaries; rejects and summary files are skipped
/// when their C* file is among the inputs too.
fn merge_inputs(inputs: &[PathBuf]) -> Result<Vec<MergeInput>> {
    let mut outputs = Vec::new();
    for path in inputs {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let companion_of = [".rejects.jsonl", ".summary.json"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .map(|stem| path.with_file_name(format!("{stem}.jsonl")));
        if let Some(cstar) = companion_of {
            if inputs.contains(&cstar) {
                continue;
            }
            return Err(Error::input(format!(
                "{}: give merge the C* files ({} here); their rejects and summaries are read \
                 from beside them",
                path.display(),
                cstar.display()
            )));
        }
        let paths = OutputPaths::new(path);
        for companion in [&paths.out, &paths.rejects, &paths.summary] {
            if !companion.is_file() {
                return Err(Error::input(format!(
                    "{}: not found; {} is not the output of a finished run",
                    companion.display(),
                    path.display()
                )));
            }
        }
        let text =
            std::fs::read_to_string(&paths.summary).map_err(|e| Error::io(&paths.summary, e))?;
        let summary: Summary = serde_json::from_str(&text).map_err(|e| {
            Error::input(format!(
                "{}: not a toolsift summary: {e}",
                paths.summary.display()
            ))
        })?;
        let (Some(shard), Some(corpus_lines)) = (summary.shard, summary.corpus_lines) else {
            return Err(Error::input(format!(
                "{}: no shard and corpus_lines (written by an older toolsift); rerun that \
                 shard's annotate to merge it",
                paths.summary.display()
            )));
        };
        outputs.push(MergeInput {
            paths,
            shard,
            corpus_lines,
        });
    }
    Ok(outputs)
}

/// The lines of one C* or rejects file, each checked to be a record of its kind, in strictly
/// increasing input-line order and of its shard.
struct MergeStream {
    path: PathBuf,
    shard: Shard,
    rejects: bool,
    lines: std::io::Lines<BufReader<std::fs::File>>,
    file_line: u64,
    last: u64,
    current: String,
}

impl MergeStream {
    fn open(path: &Path, shard: Shard, rejects: bool) -> Result<Self> {
        use std::io::BufRead;
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        Ok(MergeStream {
            path: path.to_owned(),
            shard,
            rejects,
            lines: BufReader::with_capacity(1 << 20, file).lines(),
            file_line: 0,
            last: 0,
            current: String::new(),
        })
    }

    /// Reads the next record into `current`; returns its input line number.
    fn advance(&mut self) -> Result<Option<u64>> {
        #[derive(serde::Deserialize)]
        struct Doc {
            line: u64,
            #[allow(dead_code)]
            annotated_text: serde::de::IgnoredAny,
        }
        #[derive(serde::Deserialize)]
        struct Reject {
            line: u64,
            #[allow(dead_code)]
            reason: serde::de::IgnoredAny,
        }
        let Some(text) = self.lines.next() else {
            return Ok(None);
        };
        self.file_line += 1;
        let text = text.map_err(|e| Error::io(&self.path, e))?;
        let at = || format!("{}:{}", self.path.display(), self.file_line);
        let parsed = if self.rejects {
            serde_json::from_str::<Reject>(&text).map(|r| r.line)
        } else {
            serde_json::from_str::<Doc>(&text).map(|d| d.line)
        };
        let line = parsed.map_err(|e| {
            let kind = if self.rejects { "reject" } else { "C*" };
            Error::input(format!("{}: not a {kind} record: {e}", at()))
        })?;
        if line <= self.last || !self.shard.owns(line) {
            return Err(Error::input(format!(
                "{}: input line {line} {} (shard {}/{})",
                at(),
                if line <= self.last {
                    "out of order"
                } else {
                    "is not of this shard"
                },
                self.shard.index,
                self.shard.count
            )));
        }
        self.last = line;
        self.current = text;
        Ok(Some(line))
    }
}
