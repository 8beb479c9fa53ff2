//! The files of one output (C*, rejects, summary, journal): their names, and what a file found
//! at one of them is (toolsift's of that kind, or someone else's, which is never replaced).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::{is_journal_header, Header};
use crate::annotate::document::CStarRecord;
use crate::annotate::summary::Summary;
use crate::error::{Error, Result};
use crate::util::fs::{strip_ext, with_suffix, AtomicFile};

/// The files of one output: C*, rejects, summary, journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPaths {
    /// C*, as given (a sharded run's: `Shard::output_path` of `--out`).
    pub out: PathBuf,
    /// The rejects file: `<stem>.rejects.jsonl` beside C* (stem: C*'s name less ".jsonl").
    pub rejects: PathBuf,
    /// The summary: `<stem>.summary.json` beside C*.
    pub summary: PathBuf,
    /// The journal, `<C* name>.partial`: present only while a run is in progress or resumable.
    pub journal: PathBuf,
}

impl OutputPaths {
    /// Every file a run writes or may write: the four paths and the temporary names
    /// (`AtomicFile`) that the outputs are written under.
    pub fn written(&self) -> Vec<PathBuf> {
        let mut out = vec![self.journal.clone()];
        for p in [&self.out, &self.rejects, &self.summary] {
            out.push(p.clone());
            out.push(AtomicFile::tmp_path(p));
        }
        out
    }

    /// Where these outputs' temporary names (`AtomicFile::tmp_path`) meet another run's
    /// outputs, which `AtomicFile` would empty and rename away: a temporary name that is the C*
    /// of a run in progress (its journal beside it) or of a finished one (the C* and its
    /// summary), `--out x.tmp` beside `--out x`; or, the other way round, C* itself the
    /// temporary name of a run in progress on the name without ".tmp". Says why, naming the
    /// files; checked when a run starts and again before its outputs are written.
    pub fn temporary_clash(&self) -> Option<String> {
        let forward = [&self.out, &self.rejects, &self.summary]
            .into_iter()
            .map(|p| AtomicFile::tmp_path(p))
            .find_map(|tmp| {
                let theirs = OutputPaths::new(&tmp);
                let shown = if theirs.journal.is_file() {
                    theirs.journal
                } else if tmp.is_file() && theirs.summary.is_file() {
                    theirs.summary
                } else {
                    return None;
                };
                Some(format!(
                    "it is written under the temporary name {}, which is another run's output \
                     ({} beside it)",
                    tmp.display(),
                    shown.display()
                ))
            });
        forward.or_else(|| {
            let name = self.out.file_name()?;
            let base = strip_ext(name, "tmp")?;
            let theirs = OutputPaths::new(&self.out.with_file_name(base));
            theirs.journal.is_file().then(|| {
                format!(
                    "it is the temporary name a run on {} in progress writes its C* under ({} \
                     beside it)",
                    theirs.out.display(),
                    theirs.journal.display()
                )
            })
        })
    }

    /// The outputs of the other spelling of `--out` that shares these rejects and summary
    /// names: "x" for "x.jsonl", "x.jsonl" for "x".
    pub fn other_spelling(&self) -> OutputPaths {
        let name = self.out.file_name().unwrap_or(OsStr::new("out"));
        let other = match strip_ext(name, "jsonl") {
            Some(stem) => stem.to_owned(),
            None => with_suffix(name, ".jsonl"),
        };
        OutputPaths::new(&self.out.with_file_name(other))
    }

    /// For "cstar.jsonl": "cstar.rejects.jsonl", "cstar.summary.json", "cstar.jsonl.partial".
    /// Names are handled as OS strings: one that is not UTF-8 keeps its bytes.
    pub fn new(out: &Path) -> Self {
        let name = out.file_name().unwrap_or(OsStr::new("out"));
        let stem = strip_ext(name, "jsonl").unwrap_or(name);
        let sibling = |base: &OsStr, suffix: &str| out.with_file_name(with_suffix(base, suffix));
        OutputPaths {
            out: out.to_owned(),
            rejects: sibling(stem, ".rejects.jsonl"),
            summary: sibling(stem, ".summary.json"),
            journal: sibling(name, ".partial"),
        }
    }
}

/// Why the file at `path` is not a C* file (its first line is not a C* record), if it exists
/// and is not: an empty file is an empty C*.
pub(crate) fn not_a_cstar(path: &Path) -> Result<Option<String>> {
    use std::io::{BufRead, Read};
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return Ok(Some("it is not a regular file".into())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    }
    // (Not opened before it is known to be a file: opening a named pipe would block.)
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    // A C* line can be long, but its start says enough: read at most 1 MiB of it.
    let mut first = Vec::new();
    std::io::BufReader::new(file.take(1 << 20))
        .read_until(b'\n', &mut first)
        .map_err(|e| Error::io(path, e))?;
    if first.is_empty() {
        return Ok(None);
    }
    if !first.ends_with(b"\n") && first.len() == 1 << 20 {
        // A longer line: annotate writes every record's "line" first.
        return Ok((!first.starts_with(b"{\"line\":"))
            .then(|| "its first line does not start as a C* record".into()));
    }
    let Ok(text) = std::str::from_utf8(&first) else {
        return Ok(Some("its first line is not UTF-8".into()));
    };
    Ok(crate::util::json::object_from_str::<CStarRecord>(text)
        .err()
        .map(|e| format!("its first line: {e}")))
}

/// A rejects line as annotate writes it (`finish` in mod.rs), read as strictly: no other key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RejectRecord {
    pub line: u64,
    #[allow(dead_code)]
    pub reason: String,
}

/// The files of one output (`OutputPaths`), by kind: a run, a demo run or a merge replaces a
/// file there only when it is of the kind toolsift writes there (`not_of_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputKind {
    CStar,
    Rejects,
    Summary,
    Journal,
}

impl OutputKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            OutputKind::CStar => "C* file",
            OutputKind::Rejects => "rejects file",
            OutputKind::Summary => "summary",
            OutputKind::Journal => "journal",
        }
    }
}

/// Why the file at `path` is not of `kind` as toolsift writes it, if it exists and is not: a
/// C* (`not_a_cstar`), rejects file or journal whose first line is not one's, a summary that
/// is not one. An empty C*, rejects file or journal is one (an empty corpus, a run killed at
/// once).
pub(crate) fn not_of_kind(path: &Path, kind: OutputKind) -> Result<Option<String>> {
    let whole = match kind {
        OutputKind::CStar => return not_a_cstar(path),
        // One JSON value, over many lines.
        OutputKind::Summary => true,
        OutputKind::Rejects | OutputKind::Journal => false,
    };
    // (Not opened before it is known to be a file: opening a named pipe would block.)
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return Ok(Some("it is not a regular file".into())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    }
    let Some(head) = crate::util::jsonl::read_head(path, whole)? else {
        return Ok(None);
    };
    let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
    Ok(match kind {
        OutputKind::Summary => serde_json::from_slice::<Summary>(&head)
            .err()
            .map(|e| e.to_string()),
        _ if head.is_empty() => None,
        OutputKind::Rejects => serde_json::from_slice::<RejectRecord>(first)
            .err()
            .map(|e| format!("its first line: {e}")),
        OutputKind::Journal => {
            (!is_journal_header(first)).then(|| "its first line is not a journal's header".into())
        }
        // Answered above.
        OutputKind::CStar => None,
    })
}

/// The model folder and corpus of a run, as its summary or journal records them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RecordedRun {
    /// The run description's `info.model`.
    pub model: PathBuf,
    /// Its `corpus`, if it names one (as it was given: relative to the folder the run started in).
    pub corpus: Option<PathBuf>,
    /// Its `corpus_xxh3` (`corpus::fingerprint`'s, as 16 hex digits), if it records one.
    pub corpus_xxh3: Option<String>,
}

/// The model folder and corpus of the run that wrote the summary or journal at `path` (its run
/// description's `info.model` and `corpus`), or None when the file is not there or records no
/// model (an empty journal, a summary of a run without a journal). For files `not_of_kind` has
/// passed.
pub(crate) fn recorded_run(path: &Path, kind: OutputKind) -> Result<Option<RecordedRun>> {
    // (Not opened unless a file: a named pipe would block the read.)
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(None);
    }
    let Some(head) = crate::util::jsonl::read_head(path, kind == OutputKind::Summary)? else {
        return Ok(None);
    };
    let run = match kind {
        OutputKind::Summary => serde_json::from_slice::<Summary>(&head)
            .ok()
            .and_then(|s| s.run),
        OutputKind::Journal => {
            let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
            serde_json::from_slice::<Header>(first).ok().map(|h| h.run)
        }
        OutputKind::CStar | OutputKind::Rejects => None,
    };
    let text_at = |pointer: &str| {
        run.as_ref()
            .and_then(|run| run.pointer(pointer))
            .and_then(Value::as_str)
    };
    Ok(text_at("/info/model").map(|model| RecordedRun {
        model: PathBuf::from(model),
        corpus: text_at("/corpus").map(PathBuf::from),
        corpus_xxh3: text_at("/corpus_xxh3").map(str::to_owned),
    }))
}

/// Writes `summary` (pretty JSON) to `path`, atomically.
pub fn write_summary(path: &Path, summary: &Summary) -> Result<()> {
    crate::util::fs::write_atomic(path, |w| {
        let text = serde_json::to_string_pretty(summary)
            .map_err(|e| Error::input(format!("cannot serialise the summary: {e}")))?;
        writeln!(w, "{text}").map_err(|e| Error::io(path, e))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::Journal;
    use super::*;

    /// A file is a C* by its first line: one over the 1 MiB read of it by its start (a record's
    /// "line" key), and one that is not UTF-8 (a user's binary file) is none.
    #[test]
    fn a_cstar_is_told_by_its_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl");
        let long = "x".repeat(1 << 20);
        std::fs::write(&p, format!("{{\"line\":1,\"id\":null,\"text\":\"{long}\"")).unwrap();
        assert_eq!(not_a_cstar(&p).unwrap(), None);
        std::fs::write(&p, format!("{{\"mine\":\"{long}\"}}\n")).unwrap();
        assert!(not_a_cstar(&p)
            .unwrap()
            .unwrap()
            .contains("does not start as a C* record"));
        std::fs::write(&p, b"\xff\xfe\n").unwrap();
        assert!(not_a_cstar(&p).unwrap().unwrap().contains("not UTF-8"));
        // A short last line is read whole, not by its start: a user's file is not replaced.
        std::fs::write(&p, "{\"line\":1,\"mine\":true}").unwrap();
        assert!(not_a_cstar(&p).unwrap().is_some());
        // An empty file is an empty C* (every line rejected): a rerun may replace it.
        std::fs::write(&p, "").unwrap();
        assert_eq!(not_a_cstar(&p).unwrap(), None);
    }

    /// A journal is told from someone's file at its path by its header; an empty one (a run
    /// killed at once) is one.
    #[test]
    fn a_journal_is_of_its_kind_by_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl.partial");
        drop(Journal::open(&p, &json!({"seed": 1})).unwrap());
        assert_eq!(not_of_kind(&p, OutputKind::Journal).unwrap(), None);
        std::fs::write(&p, "").unwrap();
        assert_eq!(not_of_kind(&p, OutputKind::Journal).unwrap(), None);
        std::fs::write(&p, "{\"mine\": 1}\n").unwrap();
        assert!(not_of_kind(&p, OutputKind::Journal).unwrap().is_some());
    }

    #[test]
    fn output_paths() {
        let p = OutputPaths::new(Path::new("d/cstar.jsonl"));
        assert_eq!(p.rejects, Path::new("d/cstar.rejects.jsonl"));
        assert_eq!(p.summary, Path::new("d/cstar.summary.json"));
        assert_eq!(p.journal, Path::new("d/cstar.jsonl.partial"));
        let p = OutputPaths::new(Path::new("a.b.jsonl"));
        assert_eq!(p.summary, Path::new("a.b.summary.json"));
        let p = OutputPaths::new(Path::new("cstar"));
        assert_eq!(p.rejects, Path::new("cstar.rejects.jsonl"));
        assert_eq!(p.journal, Path::new("cstar.partial"));
    }

    /// The rejects file's and the summary's temporary names clash with another run's output as
    /// C*'s does: a run in progress on "c.rejects.jsonl.tmp", a finished one on
    /// "c.summary.json.tmp" (its C* and summary there).
    #[test]
    fn every_temporary_name_is_checked_for_another_runs_output() {
        let dir = tempfile::tempdir().unwrap();
        let paths = OutputPaths::new(&dir.path().join("c.jsonl"));
        assert_eq!(paths.temporary_clash(), None);
        let rejects_tmp = AtomicFile::tmp_path(&paths.rejects);
        let theirs = OutputPaths::new(&rejects_tmp);
        std::fs::write(&theirs.journal, "").unwrap();
        let why = paths
            .temporary_clash()
            .expect("a run in progress under the name");
        assert!(
            why.contains(&format!("{} beside it", theirs.journal.display())),
            "{why}"
        );
        std::fs::remove_file(&theirs.journal).unwrap();
        let summary_tmp = AtomicFile::tmp_path(&paths.summary);
        let theirs = OutputPaths::new(&summary_tmp);
        std::fs::write(&summary_tmp, "").unwrap();
        std::fs::write(&theirs.summary, "{}").unwrap();
        let why = paths
            .temporary_clash()
            .expect("a finished run under the name");
        assert!(
            why.contains(&format!("{} beside it", theirs.summary.display())),
            "{why}"
        );
    }

    /// A summary left at a temporary name's summary name with no C* beside it (removed by its
    /// user) is no run's output there: nothing at the temporary name is lost, no clash.
    #[test]
    fn a_summary_without_its_cstar_at_a_temporary_name_is_no_clash() {
        let dir = tempfile::tempdir().unwrap();
        let paths = OutputPaths::new(&dir.path().join("c.jsonl"));
        let tmp = AtomicFile::tmp_path(&paths.out);
        std::fs::write(OutputPaths::new(&tmp).summary, "{}").unwrap();
        assert_eq!(paths.temporary_clash(), None);
        std::fs::write(&tmp, "").unwrap();
        assert!(paths.temporary_clash().is_some());
    }

    /// A summary is written as pretty JSON ending in a newline, and its run record is read back
    /// whole (the model, the corpus and its hash), not from its first line alone; a journal's
    /// header gives the same.
    #[test]
    fn a_written_summary_and_a_journal_give_back_their_recorded_run() {
        let dir = tempfile::tempdir().unwrap();
        let run = json!({
            "corpus": "corpus.jsonl",
            "corpus_xxh3": "00ff00ff00ff00ff",
            "info": {"model": "demo-model"},
        });
        let recorded = Some(RecordedRun {
            model: PathBuf::from("demo-model"),
            corpus: Some(PathBuf::from("corpus.jsonl")),
            corpus_xxh3: Some("00ff00ff00ff00ff".into()),
        });
        let mut summary = crate::annotate::summary::SummaryBuilder::new(&[]).finish(1.5);
        summary.run = Some(run.clone());
        let p = dir.path().join("c.summary.json");
        write_summary(&p, &summary).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.ends_with("}\n") && text.lines().count() > 3, "{text}");
        assert_eq!(recorded_run(&p, OutputKind::Summary).unwrap(), recorded);
        let journal = dir.path().join("c.jsonl.partial");
        drop(Journal::open(&journal, &run).unwrap());
        assert_eq!(
            recorded_run(&journal, OutputKind::Journal).unwrap(),
            recorded
        );
    }
}
