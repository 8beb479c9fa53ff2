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
/// trainer's seed (1) nor `eval-demo`'s default (2), so the model has not trained on it.
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

use crate::annotate::writer::{not_of_kind, OutputKind};
use crate::annotate::OutputPaths;
use crate::error::{Error, Result};

/// Removes a finished earlier output at `out` (C*, its rejects and summary files) so that a demo
/// run can write it again, and with `journal_too` also an interrupted run's journal. Returns
/// what was removed. Every one of those files that exists is checked first, and if any is not
/// the kind toolsift writes there (a C* whose first line is not a C* record, a summary that is
/// not a summary, ...), nothing is removed and it is an error: the demo replaces only its own
/// kind of output. Nothing is removed while another run holds the journal's lock (it is
/// writing this output), and the lock is held here until the removals are done.
pub fn remove_previous_output(out: &Path, journal_too: bool) -> Result<Vec<PathBuf>> {
    let paths = OutputPaths::new(out);
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
        let summary = crate::annotate::summary::SummaryBuilder::new(&[]).finish(0.0);
        std::fs::write(
            dir.path().join("c.summary.json"),
            serde_json::to_string(&summary).unwrap(),
        )
        .unwrap();
        std::fs::write(dir.path().join("c.rejects.jsonl"), "").unwrap();
        std::fs::write(dir.path().join("c.jsonl.partial"), "").unwrap();
        let removed = remove_previous_output(&out, false).unwrap();
        assert_eq!(removed.len(), 3, "{removed:?}");
        assert!(!out.exists() && dir.path().join("c.jsonl.partial").exists());
        assert_eq!(remove_previous_output(&out, true).unwrap().len(), 1);
        // An empty C* (an empty corpus) is one too.
        std::fs::write(&out, "").unwrap();
        assert_eq!(remove_previous_output(&out, false).unwrap().len(), 1);
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
        assert_eq!(remove_previous_output(&out, true).unwrap().len(), 1);

        // While a run holds the journal's lock, nothing is removed.
        std::fs::write(&out, &cstar).unwrap();
        let journal = dir.path().join("c.jsonl.partial");
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
        assert_eq!(remove_previous_output(&out, true).unwrap().len(), 2);
    }
}
