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
//! resumably (writer/), `Annotator::annotate_document` one document.

pub mod calls;
pub mod config;
pub mod corpus;
pub mod document;
pub mod heuristics;
pub mod job;
pub mod merge;
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
pub use document::{
    check_tools, Annotator, CStarRecord, CallRecord, DocStats, StageSecs, ToolStats,
};
pub use job::{run_job, run_job_on, run_job_with, Job};
pub use merge::{merge, MergeReport};
pub use shard::Shard;
pub use summary::Summary;
pub use tool_kind::{ToolKind, ToolName};
pub use writer::{JournalEntry, OutputPaths};

use crate::error::{Error, Result};
use crate::util::fs;
use writer::Journal;

/// What to annotate and where to write it.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The corpus JSONL; must be a regular file (it is read more than once, not a pipe).
    pub corpus: PathBuf,
    /// `--out` as given; a sharded run writes `Shard::output_path(out)`.
    pub out: PathBuf,
    /// The lines this run annotates (default 0/1: all of them).
    pub shard: Shard,
    /// Anything else that decides the output (model, device...): a journal written under other
    /// settings is refused.
    pub run_info: Value,
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Test hook: stop (as if killed) after this many documents of this invocation.
    #[doc(hidden)]
    pub stop_after: Option<u64>,
}

impl RunOptions {
    /// `corpus` -> `out`, unsharded, no extra run settings, no progress bar.
    pub fn new(corpus: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        RunOptions {
            corpus: corpus.into(),
            out: out.into(),
            shard: Shard::default(),
            run_info: Value::Object(Default::default()),
            progress: false,
            stop_after: None,
        }
    }
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
    let paths = check_outputs(options)?;
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
    if journal.created() && paths.out.exists() {
        // Another run finished this output while this one read the corpus.
        journal.discard()?;
        return Err(Error::input(format!(
            "{}: another run completed this output meanwhile; delete it to annotate again",
            paths.out.display()
        )));
    }
    // Again, now that the journal is held: a run on the other spelling may have started since.
    if let Some(e) = other_spelling_refusal(&paths)? {
        journal.discard()?;
        return Err(e);
    }
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
    // Lines past `total` (appended during the run) are never annotated: the journal stays
    // resumable once the corpus is restored.
    let want = |n: u64| n > last_done && n <= total && shard.owns(n);
    let journaled_xxh3 = journal.last_corpus_xxh3().map(str::to_owned);
    // The hash of lines 1-total as this run read them: equal to the start's unless a line the
    // run annotates changed (not only lines appended after them).
    let mut read_to_total = (total == 0).then_some(corpus.fingerprint());
    while let Some(line) = corpus.next_line(want)? {
        if corpus.lines_read() == total {
            read_to_total = Some(corpus.fingerprint());
        }
        // The lines done are trusted only if they are the text the journal was made from: a
        // corpus edited during an earlier run and then restored has the header's hash again.
        // (Hashed only at that line and at lines journaled, not at every line skipped.)
        if let (Some(journaled), true) = (&journaled_xxh3, corpus.lines_read() == last_done) {
            let now = format!("{:016x}", corpus.fingerprint().xxh3);
            if &now != journaled {
                return Err(Error::input(format!(
                    "{}: lines 1-{last_done}, which the journal {} answers, are not the text it \
                     was made from (XXH3 {journaled} then, {now} now: a line among them \
                     changed); if the corpus was edited since that run, restore it and rerun, \
                     else delete the journal to start over",
                    options.corpus.display(),
                    paths.journal.display()
                )));
            }
        }
        let Some(line) = line else { continue };
        let corpus_xxh3 = Some(format!("{:016x}", corpus.fingerprint().xxh3));
        if options.stop_after.is_some_and(|n| docs >= n) {
            return Ok(RunOutcome::Stopped(docs));
        }
        let entry = match line {
            Line::Reject { line, reason } => JournalEntry {
                line,
                corpus_xxh3,
                doc: None,
                reject: Some(reason),
                stats: None,
            },
            Line::Doc(doc) => match annotator.annotate_document(&doc) {
                Ok((record, stats)) => {
                    candidates += stats.candidates;
                    JournalEntry {
                        line: doc.line,
                        corpus_xxh3,
                        doc: Some(record),
                        reject: None,
                        stats: Some(stats),
                    }
                }
                // Something about this document's input (e.g. it cannot be tokenized): reject
                // it, with the reason, and go on. Backend and I/O errors stop the run (resumable).
                Err(e) if e.is_input() => JournalEntry {
                    line: doc.line,
                    corpus_xxh3,
                    doc: None,
                    reject: Some(format!("annotation failed: {e}")),
                    stats: None,
                },
                // Named by its line: the run resumes from it.
                Err(e) => {
                    return Err(e.context(format!(
                        "annotating {}:{}",
                        options.corpus.display(),
                        doc.line
                    )))
                }
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
    let read = corpus.fingerprint();
    if read != corpus_id {
        return Err(corpus_changed(
            options,
            &paths,
            corpus_id,
            read,
            read_to_total,
        ));
    }
    let mut settings = run;
    if let Some(map) = settings.as_object_mut() {
        map.remove("shard");
    }
    let run = RunSummary {
        shard,
        corpus_lines: total,
        settings,
        wall_secs: started.elapsed().as_secs_f64(),
        lines_resumed: already,
    };
    let summary = finish(&journal, &paths, annotator.tools(), &run)?;
    // Unlocked only now: a second run must not start on this output while it is being written.
    drop(journal);
    Ok(RunOutcome::Done(Box::new(summary), paths))
}

/// `annotate`'s checks before it reads the corpus; returns the run's output paths (their folder
/// made). Refuses an output that is no file for C*, a corpus that is not a regular file or is
/// one of the files this run writes, a temporary name that is another run's output, a run on
/// the other spelling, and a finished output without a journal: writing would replace a file
/// that is not this run's to replace.
fn check_outputs(options: &RunOptions) -> Result<OutputPaths> {
    check_out(&options.out)?;
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
    let paths = OutputPaths::new(&options.shard.output_path(&options.out));
    // Writing any of them would replace the corpus (C*'s temporary name is renamed onto C*).
    if let Some(clash) = paths
        .written()
        .into_iter()
        .find(|p| fs::is_same_file(&options.corpus, p))
    {
        return Err(Error::input(format!(
            "the corpus {} is {}, a file this run writes; give another output (--out)",
            options.corpus.display(),
            clash.display()
        )));
    }
    if let Some(why) = paths.temporary_clash() {
        return Err(temporary_clash(&paths.out, &why));
    }
    // A fresh output folder (a shard job's, say) is made, not an error about the journal.
    if let Some(dir) = paths.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    // A run on the other spelling ("x" / "x.jsonl") would write these rejects and summary
    // too; looked at before this run's own outputs (which may be that run's rejects and
    // summary, and the error should name its C*), and again once the journal is held, for a
    // run that started meanwhile.
    if let Some(e) = other_spelling_refusal(&paths)? {
        return Err(e);
    }
    check_no_finished_output(&paths)?;
    Ok(paths)
}

/// The refusal of a run whose rejects and summary a run on the other spelling of its C* ("x" /
/// "x.jsonl") writes too: that run in progress (its journal is there) or finished (its C* is).
/// An error reading that C* is returned as the `Err`, a refusal as `Ok(Some(_))`.
fn other_spelling_refusal(paths: &OutputPaths) -> Result<Option<Error>> {
    let other = paths.other_spelling();
    if other.journal.exists() {
        return Ok(Some(Error::input(format!(
            "a run on {} is in progress (its journal {} exists), and it writes the rejects \
             and summary this run would ({}, {}); let it finish or delete its journal, or give \
             another output (--out)",
            other.out.display(),
            other.journal.display(),
            paths.rejects.display(),
            paths.summary.display()
        ))));
    }
    // Its finished C* too: these rejects and summary would then sit beside it, of another run.
    let done = other.out.is_file() && writer::not_a_cstar(&other.out)?.is_none();
    Ok(done.then(|| {
        Error::input(format!(
            "{} is a finished run's C*, and its rejects and summary are the ones this run \
             would write ({}, {}); delete the three, or give another output (--out)",
            other.out.display(),
            paths.rejects.display(),
            paths.summary.display()
        ))
    }))
}

/// Refuses outputs of a finished run (no journal beside them): a C* file that is not C*, or any
/// of C*, rejects and summary, which a new run would replace.
fn check_no_finished_output(paths: &OutputPaths) -> Result<()> {
    // Without a journal, any of the three outputs is a finished run's: "--out x" and "--out
    // x.jsonl" share their rejects and summary names, so C* alone is not enough to look at.
    if !paths.journal.exists() {
        if let Some(what) = writer::not_a_cstar(&paths.out)? {
            return Err(Error::input(format!(
                "{} (--out) exists and is not a C* file ({what}); give another output",
                paths.out.display()
            )));
        }
        let done: Vec<String> = [&paths.out, &paths.rejects, &paths.summary]
            .into_iter()
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        if let [first, .., last] | [first @ last] = &done[..] {
            let all = match &done[..done.len() - 1] {
                [] => last.clone(),
                rest => format!("{} and {last}", rest.join(", ")),
            };
            return Err(Error::input(format!(
                "{first} exists and no run is in progress (no {}): it is a finished run's \
                 output; delete {all} to annotate again, or give another output (--out)",
                paths.journal.display(),
            )));
        }
    }
    Ok(())
}

/// The refusal of a run whose corpus read `read` at its end, not `start` as when it began:
/// its lines would not be the corpus's. `read_to_total` (the hash of lines 1 to `start.lines`
/// as read) picks the advice: whether, and how, the journal can still finish the run.
fn corpus_changed(
    options: &RunOptions,
    paths: &OutputPaths,
    start: corpus::Fingerprint,
    read: corpus::Fingerprint,
    read_to_total: Option<corpus::Fingerprint>,
) -> Error {
    let total = start.lines;
    // Lines only added after the run's: its journal holds the text it started from, and
    // resumes once they are removed. Unsharded, with lines 1..total read changed: the
    // journal's last line was read from the changed text, so neither text resumes it.
    // Otherwise (lines removed, or a shard whose own lines may not have changed) only the
    // resume's own check can tell.
    let journal = paths.journal.display();
    let advice = if read_to_total == Some(start) {
        format!(
            "lines were added after line {total}; the journal {journal} is kept: remove \
             them (restore the corpus) and rerun to finish, or delete the journal to start \
             over"
        )
    } else if options.shard.count == 1 && read_to_total.is_some() {
        format!(
            "a line among 1-{total} changed, so the journal {journal} holds lines read \
             from both texts and neither can resume it: delete the journal and rerun"
        )
    } else {
        format!(
            "the journal {journal} is kept: restore the corpus and rerun to finish; if the \
             rerun says the lines it has done changed, delete the journal and rerun"
        )
    };
    Error::input(format!(
        "{}: the corpus changed during the run ({} lines, XXH3 {:016x} when it started; {} \
         lines, {:016x} now); {advice}",
        options.corpus.display(),
        start.lines,
        start.xxh3,
        read.lines,
        read.xxh3,
    ))
}

/// The output (`--out`) must name a file for C* (not a folder). Errors here and in `annotate`
/// name the flag in brackets: the command's user knows it, a program knows what it passed.
pub fn check_out(out: &Path) -> Result<()> {
    let Some(problem) = fs::output_file_problem(out) else {
        return Ok(());
    };
    let example = if fs::folder_problem(out).is_some() {
        out.join("cstar.jsonl")
    } else {
        PathBuf::from("cstar.jsonl")
    };
    Err(Error::input(format!(
        "output {} (--out) {problem}: give a file name for C*, e.g. {}",
        out.display(),
        example.display()
    )))
}

/// `OutputPaths::temporary_clash`'s refusal, for `annotate` and `merge`.
pub(crate) fn temporary_clash(out: &Path, why: &str) -> Error {
    Error::input(format!(
        "output {} (--out): {why}: writing would replace the other run's output; let it finish \
         and move it, or give another output (--out)",
        out.display()
    ))
}

/// What `finish` records about the run besides the journal's entries.
struct RunSummary {
    shard: Shard,
    corpus_lines: u64,
    /// The journal's run description less the shard.
    settings: Value,
    wall_secs: f64,
    /// Lines of the shard the journal held when this run started.
    lines_resumed: u64,
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
fn finish(
    journal: &Journal,
    paths: &OutputPaths,
    tools: &[ToolName],
    run: &RunSummary,
) -> Result<Summary> {
    let mut builder = summary::SummaryBuilder::new(tools);
    // Again, now that the outputs are written: a run on a clashing name may have started since.
    if let Some(why) = paths.temporary_clash() {
        return Err(temporary_clash(&paths.out, &why));
    }
    let mut out = fs::AtomicFile::create(&paths.out)?;
    let mut rejects = fs::AtomicFile::create(&paths.rejects)?;
    let mut expected = (1..=run.corpus_lines).filter(|&n| run.shard.owns(n));
    for entry in journal.entries()? {
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
    summary.run = Some(run.settings.clone());
    summary.lines_resumed = run.lines_resumed;
    rejects.commit()?;
    out.commit()?;
    writer::write_summary(&paths.summary, &summary)?;
    if !journal.remove_finished()? {
        tracing::warn!(
            "{}: the journal was deleted or replaced while this run wrote its outputs \
             (another run may have started on them); what is there now is left alone",
            paths.journal.display()
        );
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reject(line: u64) -> JournalEntry {
        JournalEntry {
            corpus_xxh3: None,
            line,
            doc: None,
            reject: Some("r".into()),
            stats: None,
        }
    }

    /// The refusal of an --out that is no file for C* suggests one: inside it when it is a
    /// folder, else a plain name (not one under a device).
    #[cfg(unix)]
    #[test]
    fn check_out_suggests_a_file_name_inside_a_folder_only() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_out(dir.path()).unwrap_err().to_string();
        let inside = dir.path().join("cstar.jsonl");
        assert!(e.contains(&format!("e.g. {}", inside.display())), "{e}");
        let e = check_out(Path::new("/dev/null")).unwrap_err().to_string();
        assert!(e.ends_with("e.g. cstar.jsonl"), "{e}");
    }

    /// `finish` writes outputs only from a journal of exactly the shard's lines: one short of
    /// them, or with a gap, is refused and left in place with no output written.
    #[test]
    fn finish_refuses_a_journal_that_lacks_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let paths = OutputPaths::new(&dir.path().join("o.jsonl"));
        let run = RunSummary {
            shard: Shard::default(),
            corpus_lines: 3,
            settings: json!({}),
            wall_secs: 0.0,
            lines_resumed: 0,
        };
        for (lines, says) in [
            (
                &[1, 3][..],
                "input line 3 is not the next line of shard 0/1",
            ),
            (&[1, 2][..], "input line 3 is missing from the journal"),
        ] {
            let _ = std::fs::remove_file(&paths.journal);
            let (mut journal, _) = Journal::open(&paths.journal, &json!({})).unwrap();
            for &n in lines {
                journal.append(&reject(n)).unwrap();
            }
            let e = finish(&journal, &paths, &[], &run).unwrap_err().to_string();
            assert!(e.contains(says), "{lines:?}: {e}");
            assert!(paths.journal.exists() && !paths.out.exists() && !paths.summary.exists());
        }
        // The last one resumed and completed: finished, and the journal gone.
        let (mut journal, _) = Journal::open(&paths.journal, &json!({})).unwrap();
        journal.append(&reject(3)).unwrap();
        let summary = finish(&journal, &paths, &[], &run).unwrap();
        assert_eq!((summary.lines, summary.rejected), (3, 3));
        assert!(!paths.journal.exists());
    }
}
