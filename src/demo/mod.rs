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

/// Seed of the demo corpus embedded in the binary (assets/demo/corpus.jsonl): held out, neither
/// the trainer's seed (1) nor `eval-demo`'s default (2).
pub const DEMO_CORPUS_SEED: u64 = 20261129;

/// Documents in the embedded demo corpus.
pub const DEMO_CORPUS_DOCS: usize = 240;

/// `toolsift eval-demo`'s default seed: a second set, generated at run time.
pub const EVAL_SEED: u64 = 2;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::annotate::{CStarRecord, OutputPaths};
use crate::error::{Error, Result};

/// Removes a finished earlier output at `out` (C*, its rejects and summary files) so that a demo
/// run can write it again, and with `journal_too` also an interrupted run's journal. Returns
/// what was removed. A file at `out` that is not a C* (its first line is not a C* record) is
/// left alone and is an error: the demo replaces only its own kind of output.
pub fn remove_previous_output(out: &Path, journal_too: bool) -> Result<Vec<PathBuf>> {
    let paths = OutputPaths::new(out);
    let mut removed = Vec::new();
    let mut remove = |p: &Path| -> Result<()> {
        match std::fs::remove_file(p) {
            Ok(()) => {
                removed.push(p.to_owned());
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(p, e)),
        }
    };
    match std::fs::File::open(out) {
        Ok(file) => {
            let mut first = String::new();
            BufReader::new(file)
                .read_line(&mut first)
                .map_err(|e| Error::io(out, e))?;
            if !first.trim().is_empty() && serde_json::from_str::<CStarRecord>(&first).is_err() {
                return Err(Error::input(format!(
                    "{} exists and is not a toolsift C* file; not replacing it (choose another \
                     --out)",
                    out.display()
                )));
            }
            remove(&paths.rejects)?;
            remove(&paths.summary)?;
            remove(out)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(out, e)),
    }
    if journal_too {
        remove(&paths.journal)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        std::fs::write(dir.path().join("c.summary.json"), "{}").unwrap();
        std::fs::write(dir.path().join("c.rejects.jsonl"), "").unwrap();
        std::fs::write(dir.path().join("c.jsonl.partial"), "").unwrap();
        let removed = remove_previous_output(&out, false).unwrap();
        assert_eq!(removed.len(), 3, "{removed:?}");
        assert!(!out.exists() && dir.path().join("c.jsonl.partial").exists());
        assert_eq!(remove_previous_output(&out, true).unwrap().len(), 1);
        // An empty C* (an empty corpus) is one too.
        std::fs::write(&out, "").unwrap();
        assert_eq!(remove_previous_output(&out, false).unwrap().len(), 1);
        // Anything else is not touched.
        std::fs::write(&out, "precious data\n").unwrap();
        let err = remove_previous_output(&out, false).unwrap_err().to_string();
        assert!(err.contains("not a toolsift C*"), "{err}");
        assert!(out.exists());
    }
}
