//! The embedded demo: a synthetic corpus where tools help (`corpus`), the small GPT-J that the
//! project trains on it (`train`, feature `train`), and the assets built into the binary for
//! `toolsift annotate --demo` (`assets`), the metrics of `toolsift eval-demo` (`eval`), and both
//! commands as library calls (`run`).
//! docs/demo.md describes all of it.

pub mod assets;
pub mod corpus;
pub mod eval;
pub mod run;
pub mod tool_use;
#[cfg(feature = "train")]
pub mod train;

/// Seed of the demo corpus embedded in the binary (assets/demo/corpus.jsonl): neither the
/// trainer's seed (1) nor `eval-demo`'s default (2), so it is not a draw of the training set;
/// but the generator's few templates repeat, so some of its short documents (73 of 240,
/// mostly plain and calendar ones) also occur word for word among the training documents.
pub const DEMO_CORPUS_SEED: u64 = 20261129;

/// Documents in the embedded demo corpus.
pub const DEMO_CORPUS_DOCS: usize = 240;

/// `toolsift eval-demo`'s default seed: a second set, generated at run time.
pub const EVAL_SEED: u64 = 2;

/// The seed of the demo model's training documents (`train-demo --data-seed`, default its
/// `--seed`): `corpus::generate(TRAIN_SEED, n)` is the first n documents it trained on.
pub const TRAIN_SEED: u64 = 1;

/// Whether a set generated with `seed` is held out from the demo model's training data and
/// from the embedded corpus (an eval-demo run with a seed that is not measures what the model
/// was trained on, or the documents the demo annotates).
pub fn held_out(seed: u64) -> bool {
    seed != TRAIN_SEED && seed != DEMO_CORPUS_SEED
}

use std::path::{Path, PathBuf};

use crate::annotate::writer::{not_of_kind, recorded_run, OutputKind, RecordedRun};
use crate::annotate::OutputPaths;
use crate::error::{Error, Result};

/// Removes a finished earlier output at `out` (C*, its rejects and summary files) so that a demo
/// run can write it again, and with `journal_too` also an interrupted run's journal. Returns
/// what was removed. Every one of those files that exists is checked first, and if any is not
/// the kind toolsift writes there (a C* whose first line is not a C* record, a summary that is
/// not a summary, ...), or the output was not written with the demo model (its summary, or the
/// journal's header, names another model folder; a C* without its summary cannot be told
/// apart), nothing is removed and it is an error: the demo replaces only its own output, never
/// a real run's C*. Nothing is removed while another run holds the journal's lock (it is
/// writing this output), and the lock is held here until the removals are done.
pub fn remove_previous_output(out: &Path, journal_too: bool) -> Result<Vec<PathBuf>> {
    let paths = OutputPaths::new(out);
    // (A named pipe there would block the open below; what a journal holds is checked below
    // when it is to be removed, else by the run that resumes it.)
    if std::fs::metadata(&paths.journal).is_ok_and(|m| !m.is_file()) {
        return Err(Error::input(format!(
            "{} exists and is not a regular file; not replacing it (choose another --out)",
            paths.journal.display()
        )));
    }
    let _lock = match std::fs::File::open(&paths.journal) {
        Ok(journal) => match crate::util::fs::lock_patiently(&journal) {
            Ok(false) => {
                return Err(Error::input(format!(
                    "{}: another toolsift run is writing this output (its journal is locked); \
                     wait for it to finish or stop it, then rerun",
                    paths.journal.display()
                )))
            }
            // A file system without locks: as `Journal::open`, go on.
            Ok(true) | Err(_) => Some(journal),
        },
        Err(_) => None,
    };
    let mut files = vec![
        (&paths.out, OutputKind::CStar),
        (&paths.rejects, OutputKind::Rejects),
        (&paths.summary, OutputKind::Summary),
    ];
    if journal_too {
        files.push((&paths.journal, OutputKind::Journal));
    }
    let mut doomed = Vec::new();
    for (path, kind) in files {
        if let Some(why) = not_of_kind(path, kind)? {
            return Err(Error::input(format!(
                "{} exists and is not a toolsift {} ({why}); not replacing it (choose another \
                 --out)",
                path.display(),
                kind.name()
            )));
        }
        doomed.push(path.clone());
    }
    check_demo_model(&paths, journal_too)?;
    let mut removed = Vec::new();
    for p in doomed {
        match std::fs::remove_file(&p) {
            Ok(()) => removed.push(p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&p, e)),
        }
    }
    Ok(removed)
}

/// Fails unless the output at `paths` was written by a demo run, as its summary records, or for
/// an output without a summary (a run killed between its final renames) its journal: the model
/// a folder [`assets::materialize`] writes (this version's or an earlier one's, named as
/// [`assets::is_folder_name`] says) and the corpus of `annotate --demo` (that folder's
/// corpus.jsonl or corpus.first-N.jsonl) or of `eval-demo` (corpus.jsonl beside the output).
/// Checks the finished files when one is there, and with `journal_too` the journal (one that
/// records no run, killed before its header was written, passes).
fn check_demo_model(paths: &OutputPaths, journal_too: bool) -> Result<()> {
    let why_not = |path: &Path, kind: OutputKind| -> Result<Option<String>> {
        Ok(match recorded_run(path, kind)? {
            Some(run) => not_a_demo_run(&run, &paths.out)
                .map(|why| format!("its {} names {why}, not the demo's", kind.name())),
            None if kind == OutputKind::Journal => None,
            None => Some(format!("its {} names no model", kind.name())),
        })
    };
    let finished = [&paths.out, &paths.rejects, &paths.summary];
    let mut why = None;
    if finished.iter().any(|p| p.exists()) {
        why = if paths.summary.exists() {
            why_not(&paths.summary, OutputKind::Summary)?
        } else if recorded_run(&paths.journal, OutputKind::Journal)?.is_some() {
            why_not(&paths.journal, OutputKind::Journal)?
        } else {
            Some(format!("it has no summary ({})", paths.summary.display()))
        };
    }
    if why.is_none() && journal_too {
        why = why_not(&paths.journal, OutputKind::Journal)?;
    }
    match why {
        None => Ok(()),
        Some(why) => Err(Error::input(format!(
            "{} is not an earlier demo output ({why}); not replacing it (choose another --out, \
             or delete it if it is one from an older toolsift)",
            paths.out.display()
        ))),
    }
}

/// What in `run` is not a demo run's ("the model X", "the corpus Y"), if anything: see
/// `check_demo_model`; `out` is the C* being replaced.
fn not_a_demo_run(run: &RecordedRun, out: &Path) -> Option<String> {
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_owned);
    if !name(&run.model).is_some_and(|n| assets::is_folder_name(&n)) {
        return Some(format!("the model {}", run.model.display()));
    }
    let Some(corpus) = &run.corpus else {
        return Some("no corpus".into());
    };
    let in_folder = |dir: Option<&Path>| {
        corpus
            .parent()
            .zip(dir)
            .is_some_and(|(a, b)| a == b || same_folder(a, b))
    };
    let corpus_name = name(corpus).unwrap_or_default();
    let first_n = corpus_name
        .strip_prefix("corpus.first-")
        .and_then(|n| n.strip_suffix(".jsonl"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let annotate_demo = (corpus_name == "corpus.jsonl" || first_n) && in_folder(Some(&run.model));
    // eval-demo's corpus was recorded as given, relative to where that run started: beside the
    // output by its path, or (from another folder) by its contents.
    let eval_demo = corpus_name == "corpus.jsonl"
        && (in_folder(out.parent()) || same_corpus_beside(out, run.corpus_xxh3.as_deref()));
    (!annotate_demo && !eval_demo).then(|| format!("the corpus {}", corpus.display()))
}

/// Whether the corpus.jsonl beside `out` is a regular file with the fingerprint `xxh3`.
fn same_corpus_beside(out: &Path, xxh3: Option<&str>) -> bool {
    let Some(xxh3) = xxh3 else {
        return false;
    };
    let beside = out.parent().unwrap_or(Path::new("")).join("corpus.jsonl");
    std::fs::metadata(&beside).is_ok_and(|m| m.is_file())
        && crate::annotate::corpus::fingerprint(&beside)
            .is_ok_and(|f| format!("{:016x}", f.xxh3) == xxh3)
}

/// Whether `a` and `b` are one existing folder (`util::fs::is_same_file`; a relative path that
/// is empty is the current folder).
fn same_folder(a: &Path, b: &Path) -> bool {
    let dot = |p: &Path| {
        if p.as_os_str().is_empty() {
            Path::new(".").to_path_buf()
        } else {
            p.to_path_buf()
        }
    };
    crate::util::fs::is_same_file(&dot(a), &dot(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotate::CStarRecord;

    #[test]
    fn removes_only_a_previous_cstar() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("c.jsonl");
        assert!(remove_previous_output(&out, true).unwrap().is_empty());
        let record = CStarRecord {
            line: 1,
            id: serde_json::json!("a"),
            text: "t".into(),
            annotated_text: "t".into(),
            calls: vec![],
        };
        std::fs::write(
            &out,
            format!("{}\n", serde_json::to_string(&record).unwrap()),
        )
        .unwrap();
        let summary_with = |model: &str, corpus: &str| {
            let mut summary = crate::annotate::summary::SummaryBuilder::new(&[]).finish(0.0);
            summary.run = Some(serde_json::json!({"info": {"model": model}, "corpus": corpus}));
            serde_json::to_string(&summary).unwrap()
        };
        let demo = "/tmp/toolsift-demo-0123456789ab-u1000";
        let summary_of = |model: &str| summary_with(model, &format!("{model}/corpus.jsonl"));
        let demo_summary = summary_of(demo);
        std::fs::write(dir.path().join("c.summary.json"), &demo_summary).unwrap();
        std::fs::write(dir.path().join("c.rejects.jsonl"), "").unwrap();
        std::fs::write(dir.path().join("c.jsonl.partial"), "").unwrap();
        let removed = remove_previous_output(&out, false).unwrap();
        assert_eq!(removed.len(), 3, "{removed:?}");
        assert!(!out.exists() && dir.path().join("c.jsonl.partial").exists());
        assert_eq!(remove_previous_output(&out, true).unwrap().len(), 1);
        // An empty C* (an empty corpus) is one too.
        std::fs::write(&out, "").unwrap();
        std::fs::write(dir.path().join("c.summary.json"), &demo_summary).unwrap();
        assert_eq!(remove_previous_output(&out, false).unwrap().len(), 2);
        // Anything else is not touched: a C* whose first line is blank or not a record, and any
        // companion that is not the kind toolsift writes there (nothing is removed then).
        for precious in ["precious data\n", "\nprecious data\n"] {
            std::fs::write(&out, precious).unwrap();
            let err = remove_previous_output(&out, false).unwrap_err().to_string();
            assert!(err.contains("not a toolsift C* file"), "{err}");
            assert_eq!(std::fs::read_to_string(&out).unwrap(), precious);
        }
        let cstar = format!("{}\n", serde_json::to_string(&record).unwrap());
        for (companion, what) in [
            ("c.rejects.jsonl", "rejects file"),
            ("c.summary.json", "summary"),
            ("c.jsonl.partial", "journal"),
        ] {
            std::fs::write(&out, &cstar).unwrap();
            let path = dir.path().join(companion);
            std::fs::write(&path, "my notes\n").unwrap();
            let err = remove_previous_output(&out, true).unwrap_err().to_string();
            assert!(err.contains(&format!("not a toolsift {what}")), "{err}");
            assert!(out.exists(), "nothing is removed when one file is not ours");
            std::fs::remove_file(&path).unwrap();
        }
        std::fs::write(dir.path().join("c.summary.json"), &demo_summary).unwrap();
        assert_eq!(remove_previous_output(&out, true).unwrap().len(), 2);

        // A real run's output is not the demo's: refused when its summary names another model,
        // when it has no summary (nothing tells), and when its journal names another model.
        let journal = dir.path().join("c.jsonl.partial");
        let real_summary = summary_of("/data/gpt-j-6b");
        for (summary, journal_header) in [
            (Some(real_summary.as_str()), None),
            (None, None),
            (Some(demo_summary.as_str()), Some("/data/gpt-j-6b")),
        ] {
            std::fs::write(&out, &cstar).unwrap();
            match summary {
                Some(s) => std::fs::write(dir.path().join("c.summary.json"), s).unwrap(),
                None => {
                    crate::util::fs::remove_if_exists(&dir.path().join("c.summary.json")).unwrap()
                }
            }
            if let Some(model) = journal_header {
                let header = serde_json::json!({
                    "journal": "toolsift-annotate/2", "run": {"info": {"model": model}}
                });
                std::fs::write(&journal, format!("{header}\n")).unwrap();
            }
            let err = remove_previous_output(&out, true).unwrap_err().to_string();
            assert!(err.contains("is not an earlier demo output"), "{err}");
            let why = match (summary, journal_header) {
                (None, _) => "it has no summary",
                (_, Some(_)) => "its journal names the model /data/gpt-j-6b",
                _ => "its summary names the model /data/gpt-j-6b",
            };
            assert!(err.contains(why), "{err}");
            assert_eq!(
                std::fs::read_to_string(&out).unwrap(),
                cstar,
                "nothing removed"
            );
        }
        // A C* without its summary whose journal names the demo model: a demo run killed
        // between its final renames.
        crate::util::fs::remove_if_exists(&dir.path().join("c.summary.json")).unwrap();
        let header = serde_json::json!({
            "journal": "toolsift-annotate/2",
            "run": {"info": {"model": demo}, "corpus": format!("{demo}/corpus.first-40.jsonl")}
        });
        std::fs::write(&journal, format!("{header}\n")).unwrap();
        assert_eq!(remove_previous_output(&out, true).unwrap().len(), 2);
        std::fs::write(dir.path().join("c.summary.json"), &demo_summary).unwrap();

        // Only a demo run's: a model folder named like the demo's but not made by it, the demo
        // model on another corpus, and a summary that names no corpus are refused; eval-demo's
        // corpus.jsonl beside its C* is the demo's.
        let beside = dir.path().join("corpus.jsonl");
        for (model, corpus, ok) in [
            (
                "/tmp/toolsift-demo-finetuned",
                "/tmp/toolsift-demo-finetuned/corpus.jsonl",
                false,
            ),
            (
                "/tmp/toolsift-demo-0123456789ab-u",
                "/tmp/toolsift-demo-0123456789ab-u/corpus.jsonl",
                false,
            ),
            (
                "/tmp/toolsift-demo-0123456789AB",
                "/tmp/toolsift-demo-0123456789AB/corpus.jsonl",
                false,
            ),
            (demo, "/data/my-corpus.jsonl", false),
            (demo, &format!("{demo}/corpus.first-x.jsonl"), false),
            (demo, &format!("{demo}/notes/corpus.jsonl"), false),
            (
                "/tmp/toolsift-demo-0123456789ab",
                "/tmp/toolsift-demo-0123456789ab/corpus.jsonl",
                true,
            ),
            (demo, &beside.display().to_string(), true),
        ] {
            std::fs::write(&out, &cstar).unwrap();
            let summary = summary_with(model, corpus);
            std::fs::write(dir.path().join("c.summary.json"), summary).unwrap();
            let got = remove_previous_output(&out, false);
            assert_eq!(got.is_ok(), ok, "{model} {corpus}: {got:?}");
            if !ok {
                let err = got.unwrap_err().to_string();
                assert!(err.contains("is not an earlier demo output"), "{err}");
                assert!(out.exists());
            }
        }
        let mut summary = crate::annotate::summary::SummaryBuilder::new(&[]).finish(0.0);
        summary.run = Some(serde_json::json!({"info": {"model": demo}}));
        std::fs::write(&out, &cstar).unwrap();
        std::fs::write(
            dir.path().join("c.summary.json"),
            serde_json::to_string(&summary).unwrap(),
        )
        .unwrap();
        let err = remove_previous_output(&out, false).unwrap_err().to_string();
        assert!(err.contains("its summary names no corpus"), "{err}");
        std::fs::write(dir.path().join("c.summary.json"), &demo_summary).unwrap();

        // While a run holds the journal's lock, nothing is removed.
        std::fs::write(&out, &cstar).unwrap();
        std::fs::write(&journal, "").unwrap();
        let held = std::fs::File::open(&journal).unwrap();
        held.try_lock().unwrap();
        for journal_too in [false, true] {
            let err = remove_previous_output(&out, journal_too)
                .unwrap_err()
                .to_string();
            assert!(err.contains("another toolsift run"), "{err}");
            assert!(out.exists() && journal.exists());
        }
        drop(held);
        assert_eq!(remove_previous_output(&out, true).unwrap().len(), 3);
    }

    /// A folder (or anything not a regular file) at the journal's path is refused before
    /// anything is removed, even when the journal is not to be removed.
    #[test]
    fn a_journal_that_is_not_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("c.jsonl");
        std::fs::write(&out, "").unwrap();
        std::fs::create_dir(dir.path().join("c.jsonl.partial")).unwrap();
        for journal_too in [false, true] {
            let err = remove_previous_output(&out, journal_too)
                .unwrap_err()
                .to_string();
            assert!(err.contains("is not a regular file"), "{err}");
            assert!(out.exists());
        }
    }

    /// Which corpora are the demo's: `corpus.first-N.jsonl` needs digits in N; eval-demo's is
    /// named corpus.jsonl even beside the output; and one recorded from another folder is the
    /// corpus.jsonl beside the output only when its fingerprint is that file's.
    #[test]
    fn a_demo_runs_corpus_is_named_and_placed_as_the_demo_writes_it() {
        let demo = Path::new("/tmp/toolsift-demo-0123456789ab-u0");
        let run = |corpus: &Path, xxh3: Option<&str>| RecordedRun {
            model: demo.to_path_buf(),
            corpus: Some(corpus.to_path_buf()),
            corpus_xxh3: xxh3.map(str::to_owned),
        };
        let out = Path::new("/data/ev/cstar.jsonl");
        for ok in ["corpus.first-12.jsonl", "corpus.jsonl"] {
            assert_eq!(
                not_a_demo_run(&run(&demo.join(ok), None), out),
                None,
                "{ok}"
            );
        }
        let first = demo.join("corpus.first-.jsonl");
        assert!(not_a_demo_run(&run(&first, None), out).is_some());
        assert_eq!(
            not_a_demo_run(&run(Path::new("/data/ev/corpus.jsonl"), None), out),
            None
        );
        let notes = Path::new("/data/ev/notes.jsonl");
        assert_eq!(
            not_a_demo_run(&run(notes, None), out).as_deref(),
            Some("the corpus /data/ev/notes.jsonl")
        );

        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("cstar.jsonl");
        let beside = dir.path().join("corpus.jsonl");
        std::fs::write(&beside, "{\"text\": \"a\"}\n").unwrap();
        let xxh3 = format!(
            "{:016x}",
            crate::annotate::corpus::fingerprint(&beside).unwrap().xxh3
        );
        let elsewhere = Path::new("no-such-folder/corpus.jsonl");
        assert_eq!(not_a_demo_run(&run(elsewhere, Some(&xxh3)), &out), None);
        for other in ["0000000000000000", ""] {
            assert!(not_a_demo_run(&run(elsewhere, Some(other)), &out).is_some());
        }
        assert!(not_a_demo_run(&run(elsewhere, None), &out).is_some());
    }

    /// What decides that an output is the demo's, past the first test's cases: a summary that
    /// records no run names no model and is refused; a rejects file alone (no C*, no summary)
    /// is refused as a C* alone is; without a summary the journal's model decides even when
    /// the journal is kept (`annotate --demo` resumes it, `journal_too` false), and a kept
    /// journal is not checked when the summary tells. A refusal names the C*; a companion that
    /// is not toolsift's is named itself.
    #[test]
    fn what_tells_an_output_is_the_demos_and_what_a_refusal_names() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("c.jsonl");
        let summary = dir.path().join("c.summary.json");
        let rejects = dir.path().join("c.rejects.jsonl");
        let journal = dir.path().join("c.jsonl.partial");
        let demo = "/tmp/toolsift-demo-0123456789ab-u0";
        let summary_with = |run: Option<serde_json::Value>| {
            let mut summary = crate::annotate::summary::SummaryBuilder::new(&[]).finish(0.0);
            summary.run = run;
            serde_json::to_string(&summary).unwrap()
        };
        let journal_of = |model: &str| {
            let header = serde_json::json!({
                "journal": "toolsift-annotate/2",
                "run": {"info": {"model": model}, "corpus": format!("{model}/corpus.jsonl")}
            });
            format!("{header}\n")
        };
        let refused = |journal_too: bool| {
            let err = remove_previous_output(&out, journal_too)
                .unwrap_err()
                .to_string();
            let lead = format!("{} is not an earlier demo output (", out.display());
            assert!(err.starts_with(&lead), "{err}");
            err
        };

        // A summary without a recorded run, beside an empty C*.
        std::fs::write(&out, "").unwrap();
        std::fs::write(&summary, summary_with(None)).unwrap();
        assert!(refused(false).contains("its summary names no model"));
        assert!(out.exists() && summary.exists());
        std::fs::remove_file(&out).unwrap();
        std::fs::remove_file(&summary).unwrap();

        // A rejects file alone.
        std::fs::write(&rejects, "").unwrap();
        assert!(refused(false).contains("it has no summary"));
        assert!(rejects.exists());

        // A C* and rejects file without a summary, the journal (kept) naming another model.
        std::fs::write(&out, "").unwrap();
        std::fs::write(&journal, journal_of("/data/gpt-j-6b")).unwrap();
        let err = refused(false);
        assert!(
            err.contains("its journal names the model /data/gpt-j-6b"),
            "{err}"
        );
        assert!(out.exists() && rejects.exists());

        // With the demo's summary, a journal that is kept is the resuming run's to check.
        let run =
            serde_json::json!({"info": {"model": demo}, "corpus": format!("{demo}/corpus.jsonl")});
        std::fs::write(&summary, summary_with(Some(run))).unwrap();
        assert_eq!(remove_previous_output(&out, false).unwrap().len(), 3);
        assert!(journal.exists());

        // A companion that is not toolsift's is named in the refusal, not the C*.
        std::fs::write(&out, "").unwrap();
        std::fs::write(&rejects, "my notes\n").unwrap();
        let err = remove_previous_output(&out, false).unwrap_err().to_string();
        let lead = format!(
            "{} exists and is not a toolsift rejects file",
            rejects.display()
        );
        assert!(err.starts_with(&lead), "{err}");
    }

    /// A recorded model path with no folder name ("/") is not the demo's; and a corpus recorded
    /// through another path to the same folder (a link) is in it, for annotate --demo (the
    /// model's folder) and eval-demo (the output's folder) alike, with no fingerprint to match.
    #[cfg(unix)]
    #[test]
    fn a_demo_folder_is_the_same_one_by_any_path_to_it() {
        let run = |model: &Path, corpus: &Path| RecordedRun {
            model: model.to_path_buf(),
            corpus: Some(corpus.to_path_buf()),
            corpus_xxh3: None,
        };
        let out = Path::new("/data/ev/cstar.jsonl");
        let root = Path::new("/");
        assert_eq!(
            not_a_demo_run(&run(root, Path::new("/corpus.jsonl")), out).as_deref(),
            Some("the model /")
        );

        let dir = tempfile::tempdir().unwrap();
        let demo = dir.path().join("toolsift-demo-0123456789ab-u0");
        let ev = dir.path().join("ev");
        std::fs::create_dir(&demo).unwrap();
        std::fs::create_dir(&ev).unwrap();
        std::os::unix::fs::symlink(&demo, dir.path().join("to-demo")).unwrap();
        std::os::unix::fs::symlink(&ev, dir.path().join("to-ev")).unwrap();
        let by_link = dir.path().join("to-demo").join("corpus.first-3.jsonl");
        assert_eq!(not_a_demo_run(&run(&demo, &by_link), out), None);
        let by_link = dir.path().join("to-ev").join("corpus.jsonl");
        assert_eq!(
            not_a_demo_run(&run(&demo, &by_link), &ev.join("cstar.jsonl")),
            None
        );
        // An empty relative folder is the current one.
        assert!(same_folder(Path::new(""), Path::new(".")));
        // Another demo folder is not that one.
        let other = dir.path().join("toolsift-demo-ba9876543210-u0");
        std::fs::create_dir(&other).unwrap();
        assert!(not_a_demo_run(&run(&other, &by_link), &ev.join("c.jsonl")).is_none());
        let by_link = dir.path().join("to-demo").join("corpus.jsonl");
        assert!(not_a_demo_run(&run(&other, &by_link), out).is_some());
    }
}
