//! Resumable output. While a run goes, every finished input line is appended to a journal,
//! `<out>.partial`, as one JSON line, and fsync'ed before the next document starts:
//!
//! ```text
//! {"journal": "toolsift-annotate/2", "run": {...the settings that decide the output...}}
//! {"line": 1, "doc": {C* line}, "stats": {...}, "crc32": "1c291ca3"}
//! {"line": 2, "reject": "invalid JSON: ...", "crc32": "0b4e5a87"}
//! ```
//!
//! Every entry ends with the CRC-32 of its line without that key, and must hold exactly one of a
//! document (of its own line, its calls at character boundaries of its text) and a reject, with
//! no other keys: an entry that was altered, or that another build wrote differently, is never
//! taken for a document that is done. (The format's number changes whenever a run would write
//! something else for the same settings, so a journal of an older build is refused.)
//!
//! Documents are processed strictly in input order, so the journal is always a prefix of the
//! shard's lines. On restart the journal is read back: a last line cut short by a crash (no
//! newline, or not a valid entry) is truncated away and done again, the lines already done are
//! skipped, and the run continues; an invalid line before the last is corruption, an error. A
//! journal written with other settings is refused. When every line is done,
//! the final files are written from the journal (C*, rejects, summary; each to a temporary
//! file, fsync'ed, then renamed into place) and the journal is removed. A crash at any point
//! therefore loses at most the document in progress, and a rerun of the same command produces
//! every line exactly once.
//!
//! The journal is locked (an exclusive advisory lock) from the moment it is opened until the
//! final files are written, so a second run on the same output (a user running the command
//! twice, a replacement pod started while the old one is still terminating) fails within a second
//! instead of interleaving its lines with the first run's.

mod outputs;
mod run_diff;

pub(crate) use outputs::{
    not_a_cstar, not_of_kind, recorded_run, OutputKind, RecordedRun, RejectRecord,
};
pub use outputs::{write_summary, OutputPaths};
pub(crate) use run_diff::run_differences;
use run_diff::without_hashed_paths;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::document::{CStarRecord, DocStats};
use crate::error::{Error, Result};
use crate::util::fs::{lock_in_place, same_file, sync_dir};

/// The journal format. /2: entries carry a checksum and are checked; sampling streams keyed
/// through `Rng::keyed` (a /1 journal may hold samples drawn from the streams before).
const MAGIC: &str = "toolsift-annotate/2";

/// The key an entry line ends with, then 8 hex digits and `"}`.
const CHECK_KEY: &str = ",\"crc32\":\"";
const CHECK_LEN: usize = CHECK_KEY.len() + 8 + 2;

/// One finished input line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalEntry {
    /// 1-based input line this entry finishes; entries are in strictly increasing order.
    pub line: u64,
    /// XXH3 of the corpus's bytes up to and including this line, as the run that wrote the
    /// entry read them (hex). A resumed run compares it with the corpus it reads, so entries made
    /// from text that has changed since are never trusted. (Absent in older journals.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus_xxh3: Option<String>,
    /// The line's C* record, when it was annotated; an entry holds exactly one of `doc` and
    /// `reject`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<CStarRecord>,
    /// Why the line was rejected (its "reason" in the rejects file), when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject: Option<String>,
    /// The document's counters and stage seconds for the summary; written with `doc` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<DocStats>,
}

impl JournalEntry {
    /// The entry as a journal line (no newline): its JSON, ending with the key "crc32", the
    /// CRC-32 of that JSON without the key.
    pub fn to_line(&self) -> Result<String> {
        let json = serde_json::to_string(self).map_err(json_err)?;
        let body = json
            .strip_suffix('}')
            .ok_or_else(|| Error::input("a journal entry is not a JSON object"))?;
        Ok(format!(
            "{body}{CHECK_KEY}{:08x}\"}}",
            crc32fast::hash(json.as_bytes())
        ))
    }

    /// A journal line (no newline) read back: its checksum verified, then parsed and checked
    /// (`check`). Errors say what is wrong.
    pub fn from_line(line: &[u8]) -> std::result::Result<JournalEntry, String> {
        let split = line
            .len()
            .checked_sub(CHECK_LEN)
            .filter(|&at| line[at..].starts_with(CHECK_KEY.as_bytes()) && line.ends_with(b"\"}"))
            .ok_or("no \"crc32\" key at its end")?;
        let digits = &line[split + CHECK_KEY.len()..line.len() - 2];
        let want = std::str::from_utf8(digits)
            .ok()
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or("its \"crc32\" is not 8 hex digits")?;
        let mut json = line[..split].to_vec();
        json.push(b'}');
        if crc32fast::hash(&json) != want {
            return Err("its checksum does not match (the line was altered)".into());
        }
        let entry: JournalEntry = serde_json::from_slice(&json).map_err(|e| e.to_string())?;
        entry.check()?;
        Ok(entry)
    }

    /// Exactly one of a document and a reject; the document is this line's, and each of its
    /// calls is at a character boundary of its text (where C* splices it).
    fn check(&self) -> std::result::Result<(), String> {
        match (&self.doc, &self.reject) {
            (Some(doc), None) => {
                if doc.line != self.line {
                    return Err(format!("its document is line {}", doc.line));
                }
                doc.check_call_positions()
            }
            (None, Some(_)) => Ok(()),
            _ => Err("an entry holds exactly one of \"doc\" and \"reject\"".into()),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    journal: String,
    run: Value,
}

/// Whether `bytes` could be the start of a journal's header as [`Journal::open`] writes it,
/// this format's or an earlier one's (`{"journal":"toolsift-annotate/<n>",...`): a header cut
/// short by a crash.
fn header_start_compatible(bytes: &[u8]) -> bool {
    let family = MAGIC.rsplit_once('/').map_or(MAGIC, |(family, _)| family);
    let start = format!("{{\"journal\":\"{family}/");
    let n = bytes.len().min(start.len());
    bytes[..n] == start.as_bytes()[..n]
}

/// Whether `line` (without its newline) is a journal's first line.
pub fn is_journal_header(line: &[u8]) -> bool {
    serde_json::from_slice::<Header>(line).is_ok_and(|h| h.journal == MAGIC)
}

/// Keys a run description gained in later versions (at any depth: "model_xxh3" is under
/// "info"): a journal written before one existed may lack it and still be resumed (what it
/// guards cannot be checked then).
const KEYS_ADDED_LATER: [&str; 2] = ["corpus_xxh3", "model_xxh3"];

/// The journal, open for appending and locked while this value lives.
pub struct Journal {
    file: File,
    path: PathBuf,
    created: bool,
    /// The last entry's `corpus_xxh3`.
    last_corpus_xxh3: Option<String>,
}

impl Journal {
    /// Opens (or creates) the journal at `path` for a run described by `run` and locks it.
    /// Returns it with the last input line already done (0 if none).
    pub fn open(path: &Path, run: &Value) -> Result<(Journal, u64)> {
        let io = |e| Error::io(path, e);
        // (A named pipe there would open, then block the first read forever.)
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => {
                return Err(Error::input(format!(
                    "{}: the journal's path holds something that is not a regular file; \
                     remove it or give another output",
                    path.display()
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(io)?;
        lock_in_place(
            &file,
            path,
            || {
                format!(
                    "{}: another toolsift run is writing this output (its journal is locked); \
                     wait for it to finish or stop it, then rerun",
                    path.display()
                )
            },
            // Finished and removed by another run: a lock on a file no one will see again.
            || {
                format!(
                    "{}: another toolsift run finished or removed this journal while this one \
                     started; rerun to see its state",
                    path.display()
                )
            },
        )?;
        // What earlier runs wrote, then truncated to its good end (a damaged last line cut away).
        let existing = read_existing(&mut file, path, run)?;
        file.set_len(existing.good_end).map_err(io)?;
        file.seek(SeekFrom::End(0)).map_err(io)?;
        let mut journal = Journal {
            file,
            path: path.to_owned(),
            created: existing.good_end == 0,
            last_corpus_xxh3: existing.last_corpus_xxh3,
        };
        if existing.good_end == 0 {
            let header = Header {
                journal: MAGIC.into(),
                run: run.clone(),
            };
            journal.append_json(&serde_json::to_string(&header).map_err(json_err)?)?;
        }
        Ok((journal, existing.last_line))
    }

    /// The hash of the corpus up to the last line done, as the run that did it read the corpus
    /// (`JournalEntry::corpus_xxh3`; None without entries, or from an older journal).
    pub fn last_corpus_xxh3(&self) -> Option<&str> {
        self.last_corpus_xxh3.as_deref()
    }

    /// Whether this run started the journal (no earlier run had written its header).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Every entry, read through the file this run holds locked (not by its path, which another
    /// run could have taken over): an error if the path no longer names it, deleted or replaced
    /// during the run, since the outputs and the journal's removal would then be another run's.
    pub fn entries(&self) -> Result<impl Iterator<Item = Result<JournalEntry>>> {
        if !same_file(&self.file, &self.path) {
            return Err(Error::input(format!(
                "{}: the journal was deleted or replaced during the run (another run may be \
                 writing this output now); nothing is written: rerun once no other run is",
                self.path.display()
            )));
        }
        let io = |e| Error::io(&self.path, e);
        let mut file = self.file.try_clone().map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        Ok(entries_of(file, &self.path))
    }

    /// Removes the journal of a finished run, by its path, if the path still names the file
    /// this run holds; false (left alone) if another run's journal has taken its place
    /// meanwhile, say after it was deleted by hand while C* was being written.
    pub fn remove_finished(&self) -> Result<bool> {
        if !same_file(&self.file, &self.path) {
            return Ok(false);
        }
        std::fs::remove_file(&self.path).map_err(|e| Error::io(&self.path, e))?;
        sync_dir(&self.path)?;
        Ok(true)
    }

    /// Removes a journal this run created and has not written to (for a run that refuses to
    /// go on after all).
    pub fn discard(self) -> Result<()> {
        if self.created {
            std::fs::remove_file(&self.path).map_err(|e| Error::io(&self.path, e))?;
        }
        Ok(())
    }

    /// Appends one finished line, durably.
    pub fn append(&mut self, entry: &JournalEntry) -> Result<()> {
        self.append_json(&entry.to_line()?)
    }

    fn append_json(&mut self, json: &str) -> Result<()> {
        let mut line = String::with_capacity(json.len() + 1);
        line.push_str(json);
        line.push('\n');
        let io = |e| Error::io(&self.path, e);
        self.file.write_all(line.as_bytes()).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

/// What [`Journal::open`] found in the journal's file (nothing, for a new one).
struct ExistingJournal {
    /// The last input line done (0 if none).
    last_line: u64,
    /// The last entry's `corpus_xxh3`.
    last_corpus_xxh3: Option<String>,
    /// The byte offset where the good lines end: a damaged last line after it is truncated away.
    good_end: u64,
}

/// Reads the journal open as `file` from its start: its header (`check_header`), then its
/// entries, in strictly increasing line order. Only the last line may be unreadable (cut short
/// by a crash); an unreadable line before it, or lines out of order, are errors.
fn read_existing(file: &mut File, path: &Path, run: &Value) -> Result<ExistingJournal> {
    let io = |e| Error::io(path, e);
    let mut last_line = 0;
    let mut last_corpus_xxh3 = None;
    let mut good_end = 0u64;
    // Why the line that ended the reading could not be used.
    let mut bad = String::from("cut short");
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut offset = 0u64;
    let mut n = 0u64;
    loop {
        buf.clear();
        let read = reader.read_until(b'\n', &mut buf).map_err(io)?;
        if read == 0 {
            break;
        }
        n += 1;
        let complete = buf.ends_with(b"\n");
        let parsed = if complete {
            Some(&buf[..buf.len() - 1])
        } else {
            None
        };
        let ok = match (n, parsed) {
            // A header cut short by a crash starts as every header does; anything
            // else there is someone's file, not to be emptied.
            (1, None) if !header_start_compatible(&buf) => {
                return Err(Error::input(format!(
                    "{}:1: not a toolsift journal (one line, without a newline, that \
                     does not start as a journal's header); remove it or give another \
                     output",
                    path.display()
                )))
            }
            (_, None) => false,
            (1, Some(bytes)) => {
                check_header(bytes, path, run)?;
                true
            }
            (_, Some(bytes)) => match JournalEntry::from_line(bytes) {
                Ok(e) if e.line > last_line => {
                    last_line = e.line;
                    last_corpus_xxh3 = e.corpus_xxh3;
                    true
                }
                Ok(e) => {
                    return Err(Error::input(format!(
                        "{}:{n}: input line {} after line {last_line}: the journal is \
                         corrupt; delete it to start over",
                        path.display(),
                        e.line
                    )))
                }
                Err(why) => {
                    bad = why;
                    false
                }
            },
        };
        if !ok {
            // Only the very last line may be damaged (a crash mid-write).
            let mut rest = Vec::new();
            reader.read_to_end(&mut rest).map_err(io)?;
            if !rest.is_empty() {
                return Err(Error::input(format!(
                    "{}:{n}: unreadable journal line before the end ({bad}); the \
                     journal is corrupt, delete it to start over",
                    path.display()
                )));
            }
            break;
        }
        offset += read as u64;
        good_end = offset;
    }
    Ok(ExistingJournal {
        last_line,
        last_corpus_xxh3,
        good_end,
    })
}

/// Checks a journal's first line (without its newline): a header of this format (`MAGIC`),
/// written by a run with the same settings as `run`.
fn check_header(bytes: &[u8], path: &Path, run: &Value) -> Result<()> {
    let header: Header = serde_json::from_slice(bytes)
        .map_err(|e| Error::input(format!("{}:1: not a toolsift journal: {e}", path.display())))?;
    if header.journal != MAGIC {
        return Err(Error::input(format!(
            "{}: journal format {:?}, expected {MAGIC:?} (written by \
             another toolsift build); delete it to start over",
            path.display(),
            header.journal
        )));
    }
    let (journal_run, this_run) = without_hashed_paths(&header.run, run);
    if !same_run(&journal_run, &this_run) {
        return Err(Error::input(format!(
            "{}: this journal was written by a run with other settings \
             ({}); rerun with the same command and corpus, or delete the \
             journal to start over",
            path.display(),
            run_differences(&header.run, run).join("; ")
        )));
    }
    Ok(())
}

/// Whether a journal's run description matches this run's, allowing `KEYS_ADDED_LATER` to be
/// absent from the journal's (objects are compared key by key, at every depth).
fn same_run(journal: &Value, run: &Value) -> bool {
    match (journal.as_object(), run.as_object()) {
        (Some(j), Some(r)) => {
            r.iter().all(|(k, v)| match j.get(k) {
                Some(jv) => same_run(jv, v),
                None => KEYS_ADDED_LATER.contains(&k.as_str()),
            }) && j.keys().all(|k| r.contains_key(k))
        }
        _ => journal == run,
    }
}

fn json_err(e: serde_json::Error) -> Error {
    Error::input(format!("cannot serialise: {e}"))
}

/// The entries of a finished journal, in order (header skipped).
pub fn read_journal(path: &Path) -> Result<impl Iterator<Item = Result<JournalEntry>>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    Ok(entries_of(file, path))
}

/// The entries of the journal open as `file` (read from its start), errors naming `path`.
fn entries_of(file: File, path: &Path) -> impl Iterator<Item = Result<JournalEntry>> {
    let path = path.to_owned();
    BufReader::new(file)
        .lines()
        .enumerate()
        .skip(1)
        .map(move |(k, l)| {
            let l = l.map_err(|e| Error::io(&path, e))?;
            JournalEntry::from_line(l.as_bytes()).map_err(|why| {
                Error::input(format!(
                    "{}:{}: {why}; the journal is corrupt, delete it to start over",
                    path.display(),
                    k + 1
                ))
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    fn entry(line: u64) -> JournalEntry {
        JournalEntry {
            corpus_xxh3: None,
            line,
            doc: None,
            reject: Some(format!("r{line}")),
            stats: None,
        }
    }

    /// The checksum is "crc32" with exactly 8 hex digits, closing the line: a line whose end was
    /// altered otherwise (its last byte, a sign that `from_str_radix` would read) is not an entry.
    #[test]
    fn a_checksum_is_8_hex_digits_at_the_lines_end() {
        let line = entry(1).to_line().unwrap();
        let last_altered = format!("{}]", &line[..line.len() - 1]);
        assert!(JournalEntry::from_line(last_altered.as_bytes())
            .unwrap_err()
            .contains("no \"crc32\" key"));
        // An entry whose checksum starts with 0, so that "+" and its 7 other digits read as it.
        let line = (1..)
            .map(|n| entry(n).to_line().unwrap())
            .find(|l| l[l.len() - 10..].starts_with('0'))
            .unwrap();
        let at = line.len() - 10;
        let signed = format!("{}+{}", &line[..at], &line[at + 1..]);
        assert!(JournalEntry::from_line(signed.as_bytes())
            .unwrap_err()
            .contains("not 8 hex digits"));
    }

    /// A journal reopened with its header written is not one this run created: `discard` (for
    /// a run that refuses to go on after opening it) leaves it, and the lines done, in place.
    #[test]
    fn only_a_journal_this_run_created_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl.partial");
        let run = json!({"seed": 1});
        let (mut j, _) = Journal::open(&p, &run).unwrap();
        assert!(j.created());
        j.append(&entry(1)).unwrap();
        drop(j);
        let before = std::fs::read(&p).unwrap();
        let (j, last) = Journal::open(&p, &run).unwrap();
        assert!(!j.created() && last == 1);
        j.discard().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), before);
        let (j, _) = Journal::open(&dir.path().join("new.jsonl.partial"), &run).unwrap();
        j.discard().unwrap();
        assert!(!dir.path().join("new.jsonl.partial").exists());
    }

    /// A journal of another format (an older build's, whose lines may differ from what this
    /// build would write) is refused with the same settings, and left for the user to delete.
    #[test]
    fn a_journal_of_another_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl.partial");
        let run = json!({"seed": 1});
        let old = format!(
            "{}\n",
            json!({"journal": "toolsift-annotate/1", "run": run})
        );
        std::fs::write(&p, &old).unwrap();
        let err = Journal::open(&p, &run).err().unwrap().to_string();
        assert!(
            err.contains("journal format \"toolsift-annotate/1\", expected"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), old);
        // Nor is it a journal of this build's for a demo run to replace (its error says to
        // delete one of an older toolsift).
        assert!(!is_journal_header(old.trim_end().as_bytes()));
    }

    /// `entries` reads the file the run holds, and only while its path still names it.
    #[test]
    fn entries_are_read_from_the_held_journal_while_it_is_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl.partial");
        let (mut j, _) = Journal::open(&p, &json!({"seed": 1})).unwrap();
        j.append(&entry(1)).unwrap();
        j.append(&entry(2)).unwrap();
        let lines =
            |j: &Journal| -> Vec<u64> { j.entries().unwrap().map(|e| e.unwrap().line).collect() };
        assert_eq!(lines(&j), vec![1, 2]);
        // Read again (from the start), and appended to after a read.
        j.append(&entry(3)).unwrap();
        assert_eq!(lines(&j), vec![1, 2, 3]);
        // Deleted, then another run's journal at the same path: not this run's to finish.
        std::fs::remove_file(&p).unwrap();
        let err = j.entries().err().unwrap().to_string();
        assert!(err.contains("deleted or replaced"), "{err}");
        let (other, _) = Journal::open(&p, &json!({"seed": 1})).unwrap();
        let err = j.entries().err().unwrap().to_string();
        assert!(err.contains("deleted or replaced"), "{err}");
        // Nor its to remove: the other run's journal stays; its own is removed.
        assert!(!j.remove_finished().unwrap());
        assert!(p.exists());
        assert!(other.remove_finished().unwrap());
        assert!(!p.exists());
    }

    #[test]
    fn resumes_and_truncates_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl.partial");
        let run = json!({"seed": 1});
        let (mut j, last) = Journal::open(&p, &run).unwrap();
        assert_eq!(last, 0);
        j.append(&entry(1)).unwrap();
        j.append(&entry(3)).unwrap();
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"line\": 4, \"rej").unwrap();
        drop(f);
        let (mut j, last) = Journal::open(&p, &run).unwrap();
        assert_eq!(last, 3);
        j.append(&entry(4)).unwrap();
        drop(j);
        let lines: Vec<u64> = read_journal(&p).unwrap().map(|e| e.unwrap().line).collect();
        assert_eq!(lines, vec![1, 3, 4]);
        // A line entered twice (or out of order) is corruption, refused where it stands.
        let twice = dir.path().join("twice.jsonl.partial");
        let (mut j, _) = Journal::open(&twice, &run).unwrap();
        j.append(&entry(2)).unwrap();
        j.append(&entry(2)).unwrap();
        drop(j);
        let err = Journal::open(&twice, &run).err().unwrap().to_string();
        assert!(err.contains(":3: input line 2 after line 2"), "{err}");
        let err = Journal::open(&p, &json!({"seed": 2}))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("other settings (run.seed: 1 vs 2)"), "{err}");
        // The corpus and model paths' spellings do not count where both runs hash what they
        // read; a path without its hash still does.
        let hashed = |corpus: &str, model: &str| {
            json!({"seed": 1, "corpus": corpus, "corpus_xxh3": "0f",
                   "info": {"model": model, "model_xxh3": "1e"}})
        };
        let q = dir.path().join("q.jsonl.partial");
        drop(Journal::open(&q, &hashed("c.jsonl", "m")).unwrap());
        drop(Journal::open(&q, &hashed("/w/c.jsonl", "m/")).unwrap());
        let mut other = hashed("c.jsonl", "m");
        other["corpus_xxh3"] = json!("00");
        let err = Journal::open(&q, &other).err().unwrap().to_string();
        assert!(err.contains("run.corpus_xxh3: \"0f\" vs \"00\""), "{err}");
    }

    /// A line that was altered, or that holds other than one document of its own line or one
    /// reject, is never taken for a line done: before the last it is corruption, as the last
    /// it is done again.
    #[test]
    fn entries_are_checksummed_and_checked() {
        let doc = |line: u64, position: usize| CStarRecord {
            line,
            id: json!(line),
            text: "café au lait".into(),
            annotated_text: "café au lait".into(),
            calls: vec![crate::annotate::document::CallRecord {
                position,
                tool: "Calculator".into(),
                input: "1 + 1".into(),
                result: Some("2".into()),
                l_none: None,
                l_call: None,
                l_call_result: None,
                delta: None,
                kept: false,
                error: None,
            }],
        };
        let with_doc = |line: u64, d: CStarRecord| JournalEntry {
            doc: Some(d),
            reject: None,
            ..entry(line)
        };
        let good = with_doc(2, doc(2, 5));
        let line = good.to_line().unwrap();
        assert!(
            line.ends_with("\"}") && line.contains("\"crc32\":\""),
            "{line}"
        );
        assert_eq!(JournalEntry::from_line(line.as_bytes()), Ok(good.clone()));
        let why = |e: &JournalEntry| JournalEntry::from_line(e.to_line().unwrap().as_bytes());
        assert!(why(&with_doc(3, doc(2, 5))).unwrap_err().contains("line 2"));
        assert!(why(&with_doc(2, doc(2, 4)))
            .unwrap_err()
            .contains("character boundary"));
        let both = JournalEntry {
            reject: Some("r".into()),
            ..good.clone()
        };
        assert!(why(&both).unwrap_err().contains("exactly one"));
        let neither = JournalEntry {
            doc: None,
            reject: None,
            ..entry(2)
        };
        assert!(why(&neither).unwrap_err().contains("exactly one"));
        let altered = line.replace("lait", "laid");
        assert!(JournalEntry::from_line(altered.as_bytes())
            .unwrap_err()
            .contains("checksum"));
        // A key this build does not know, at any depth (the entry, its document, a call, its
        // stats), even correctly summed, is not skipped over.
        let mut stats = DocStats {
            candidates: 3,
            ..DocStats::default()
        };
        stats.tools.insert("calculator".into(), Default::default());
        let good = JournalEntry {
            stats: Some(stats),
            ..good.clone()
        };
        for (key, unknown) in [
            ("\"doc\"", "\"dod\""),
            ("\"calls_kept\"", "\"calls_kepd\""),
            ("\"scoring\"", "\"scorin\""),
            ("\"annotated_text\"", "\"annotated\""),
            ("\"kept\"", "\"kep\""),
            ("\"candidates\"", "\"candidatez\""),
        ] {
            let json = serde_json::to_string(&good).unwrap();
            assert!(json.contains(key), "{key} in {json}");
            let json = json.replace(key, unknown);
            let body = json.strip_suffix('}').unwrap();
            let summed = format!(
                "{body},\"crc32\":\"{:08x}\"}}",
                crc32fast::hash(json.as_bytes())
            );
            let err = JournalEntry::from_line(summed.as_bytes()).unwrap_err();
            let unknown = unknown.trim_matches('"');
            assert!(
                err.contains(&format!("unknown field `{unknown}`")),
                "{unknown}: {err}"
            );
            assert!(JournalEntry::from_line(json.as_bytes())
                .unwrap_err()
                .contains("crc32"));
        }

        // In a journal: an altered last line is done again, an altered earlier line is an error.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl.partial");
        let run = json!({"seed": 1});
        let (mut j, _) = Journal::open(&p, &run).unwrap();
        j.append(&entry(1)).unwrap();
        j.append(&good).unwrap();
        drop(j);
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text.replace("lait", "laid")).unwrap();
        let (_, last) = Journal::open(&p, &run).unwrap();
        assert_eq!(last, 1, "the altered last entry is truncated away");
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        writeln!(f, "{}", altered).unwrap();
        writeln!(f, "{}", entry(3).to_line().unwrap()).unwrap();
        drop(f);
        let err = Journal::open(&p, &run).err().unwrap().to_string();
        assert!(
            err.contains(":3: unreadable journal line before the end") && err.contains("checksum"),
            "{err}"
        );
        let err = read_journal(&p)
            .unwrap()
            .find_map(|e| e.err())
            .unwrap()
            .to_string();
        assert!(err.contains(":3: its checksum"), "{err}");
    }

    #[test]
    fn a_journal_from_before_the_corpus_hash_resumes() {
        let now = json!({"seed": 1, "corpus_xxh3": "00ff"});
        assert!(same_run(&json!({"seed": 1}), &now));
        assert!(same_run(&now, &now));
        assert!(!same_run(&json!({"seed": 1, "corpus_xxh3": "0100"}), &now));
        assert!(!same_run(&json!({"seed": 2}), &now));
        assert!(!same_run(&json!({"seed": 1, "extra": 0}), &now));
        assert!(!same_run(&json!({}), &json!({"seed": 1})));
        // Nested: a journal from before the model hash (under "info") resumes; another model
        // hash does not.
        let now = json!({"info": {"model": "m", "model_xxh3": "01"}});
        assert!(same_run(&json!({"info": {"model": "m"}}), &now));
        assert!(!same_run(
            &json!({"info": {"model": "m", "model_xxh3": "02"}}),
            &now
        ));
        assert!(!same_run(&json!({"info": {"model": "n"}}), &now));
    }

    #[test]
    fn a_journal_in_use_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl.partial");
        let run = json!({"seed": 1});
        let (mut j, _) = Journal::open(&p, &run).unwrap();
        j.append(&entry(1)).unwrap();
        let err = Journal::open(&p, &run).err().unwrap().to_string();
        assert!(err.contains("another toolsift run"), "{err}");
        drop(j);
        let (_, last) = Journal::open(&p, &run).unwrap();
        assert_eq!(last, 1);
    }

    /// A header cut short by a crash (any prefix of a real one) starts over; someone's file
    /// of one line there, or a named pipe, is refused and left as it was.
    #[test]
    fn only_a_cut_header_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.jsonl.partial");
        let run = json!({"seed": 1});
        drop(Journal::open(&p, &run).unwrap());
        let header = std::fs::read(&p).unwrap();
        assert!(
            header_start_compatible(&header),
            "{:?}",
            String::from_utf8_lossy(&header)
        );
        for cut in [1, 5, 30, header.len() - 1] {
            std::fs::write(&p, &header[..cut]).unwrap();
            let (j, last) = Journal::open(&p, &run).unwrap();
            assert!(j.created() && last == 0);
            drop(j);
            assert_eq!(std::fs::read(&p).unwrap(), header);
        }
        // (A whole first line that is no header, too: it is not a cut one.)
        for precious in [
            "precious, one line, no newline",
            "{\"journal\":\"mine\"",
            "{\"mine\": 1}\n",
        ] {
            std::fs::write(&p, precious).unwrap();
            let err = Journal::open(&p, &run).err().unwrap().to_string();
            assert!(err.contains("not a toolsift journal"), "{err}");
            assert_eq!(std::fs::read_to_string(&p).unwrap(), precious);
        }
        std::fs::remove_file(&p).unwrap();
        #[cfg(unix)]
        {
            let fifo = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: mkfifo(3) with a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
            let err = Journal::open(&p, &run).err().unwrap().to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
    }
}
