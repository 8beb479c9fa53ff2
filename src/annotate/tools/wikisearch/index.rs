//! Building a WikiSearch index: a JSONL file of documents into a tantivy index directory,
//! written next to its place and moved in when complete, under a lock.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;

use tantivy::schema::{IndexRecordOption, Schema, TextFieldIndexing, TextOptions, STORED, STRING};
use tantivy::{Index, IndexWriter, TantivyDocument};

use super::{fields, io_err, IndexError, ID, TEXT_FIELD, TITLE};
use crate::util::fs::with_suffix;
use crate::util::jsonl::JsonlLines;

/// Longest document id accepted by [`build_index`], in bytes. The id is indexed as one term
/// for the exclusion, and tantivy drops a term longer than its `MAX_TOKEN_LEN` (65,530 bytes)
/// without an error: such a document could never be left out of its own searches.
pub const MAX_ID_BYTES: usize = 65_000;
const _: () = assert!(MAX_ID_BYTES <= tantivy::tokenizer::MAX_TOKEN_LEN);
/// Indexing memory per writer thread.
const WRITER_BYTES_PER_THREAD: usize = 64 << 20;

/// What [`build_index`] indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexStats {
    /// Documents added to the index.
    pub documents: u64,
    /// Blank lines passed over in the input.
    pub blank_lines: u64,
    /// Documents whose id an earlier document already has (`42` and `"42"` are one id). They
    /// are indexed, but a search from a corpus document with that id leaves all of them out.
    pub duplicate_ids: u64,
}

/// Title and text are lower-cased and Porter-stemmed ("en_stem"), close to the Lucene BM25
/// setup the paper's retriever used; the id is one raw term, for exact exclusion.
fn schema() -> Schema {
    let words = TextOptions::default().set_stored().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer("en_stem")
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let mut builder = Schema::builder();
    builder.add_text_field(ID, STRING | STORED);
    builder.add_text_field(TITLE, words.clone());
    builder.add_text_field(TEXT_FIELD, words);
    builder.build()
}

/// Indexes the documents in `docs_jsonl` into the new directory `out_dir`.
///
/// Each non-blank line must be a JSON object with a non-empty `"id"` (string or integer, at
/// most `MAX_ID_BYTES` bytes), an optional `"title"` (string or null) and the text under key
/// `text_field` (usually "text"); other keys are ignored. A UTF-8 byte order mark before line 1
/// is skipped, and a line may end in "\r\n"; a line over 64 MiB is malformed. The first
/// malformed line stops the build with an error naming the file and line: a silently skipped
/// document would make retrieval quietly worse. `out_dir` must not exist or be empty; the
/// index is built next to it, in `.{name}.partial`, and moved into place only when complete,
/// so a failed build leaves nothing behind. The build holds the lock of `.{name}.lock` (also
/// next to it, removed at the end): a second build into `out_dir` is refused while it runs, and
/// the next build removes the partial folder of one that was killed.
pub fn build_index(
    docs_jsonl: &Path,
    out_dir: &Path,
    text_field: &str,
) -> Result<IndexStats, IndexError> {
    let file = fs::File::open(docs_jsonl).map_err(io_err(docs_jsonl))?;
    let name = out_dir.file_name().ok_or_else(|| IndexError::Io {
        path: out_dir.to_path_buf(),
        error: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "output directory needs a name (not '.' or '/')",
        ),
    })?;
    // A fixed name, not one with this process's id: a killed build's folder is the next one's
    // to remove (under the lock, so never a live build's). Built as OS strings: two names that
    // differ only in bytes that are not UTF-8 get locks of their own.
    let hidden = |suffix: &str| {
        let mut hidden = std::ffi::OsString::from(".");
        hidden.push(name);
        out_dir.with_file_name(with_suffix(&hidden, suffix))
    };
    let partial = hidden(".partial");
    let lock_path = hidden(".lock");
    if let Some(parent) = out_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let lock = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(io_err(&lock_path))?;
    crate::util::fs::lock_in_place(
        &lock,
        &lock_path,
        || {
            format!(
                "{}: another toolsift run is writing this index (its lock {} is held); wait for \
                 it to finish or stop it, then rerun",
                out_dir.display(),
                lock_path.display()
            )
        },
        || {
            format!(
                "{}: another toolsift run finished or gave up this index while this one \
                 started; rerun",
                out_dir.display()
            )
        },
    )
    .map_err(|e| IndexError::Busy(e.to_string()))?;
    warn_of_legacy_partials(out_dir, &name.to_string_lossy());
    let result = build_locked(file, docs_jsonl, out_dir, &partial, text_field);
    // Removed while still held: a run that opened it meanwhile finds it gone and stops.
    let _ = fs::remove_file(&lock_path);
    drop(lock);
    result
}

/// `build_index`'s work once it holds the lock.
fn build_locked(
    file: fs::File,
    docs_jsonl: &Path,
    out_dir: &Path,
    partial: &Path,
    text_field: &str,
) -> Result<IndexStats, IndexError> {
    // Checked under the lock: a run that finished meanwhile has filled it.
    if !crate::util::fs::missing_or_empty(out_dir).map_err(io_err(out_dir))? {
        return Err(IndexError::OutDirNotEmpty(out_dir.to_path_buf()));
    }
    let write_err = |error: tantivy::TantivyError| IndexError::Write {
        out: out_dir.to_path_buf(),
        error,
    };
    // Left by a killed build (no live one: the lock is ours).
    match fs::symlink_metadata(partial) {
        Ok(_) => fs::remove_dir_all(partial).map_err(io_err(partial))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(partial)(e)),
    }
    fs::create_dir(partial).map_err(|e| write_err(e.into()))?;

    let result = index_into(
        BufReader::new(file),
        docs_jsonl,
        partial,
        text_field,
        &write_err,
    );
    let finish = result.and_then(|stats| {
        if out_dir.exists() {
            fs::remove_dir(out_dir).map_err(io_err(out_dir))?;
        }
        fs::rename(partial, out_dir).map_err(io_err(out_dir))?;
        Ok(stats)
    });
    if finish.is_err() {
        // Best effort: the error being returned matters more than a failed cleanup.
        let _ = fs::remove_dir_all(partial);
    }
    finish
}

/// Folders `.{name}.partial-<pid>` are what builds before the lock left when killed. Whether
/// that process still runs cannot be told portably, so they are named, not removed.
fn warn_of_legacy_partials(out_dir: &Path, name: &str) {
    let parent = match out_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let prefix = format!(".{name}.partial-");
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let legacy = file_name.to_str().is_some_and(|f| {
            f.strip_prefix(&prefix)
                .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
        });
        if legacy {
            tracing::warn!(
                "{}: left by an interrupted `toolsift index` of an older version; remove it if \
                 no index build into {} is running",
                out_dir.with_file_name(&file_name).display(),
                out_dir.display()
            );
        }
    }
}

fn index_into(
    reader: impl BufRead,
    docs_path: &Path,
    dir: &Path,
    text_field: &str,
    write_err: &dyn Fn(tantivy::TantivyError) -> IndexError,
) -> Result<IndexStats, IndexError> {
    let schema = schema();
    let (id_f, title_f, text_f) = fields(&schema, dir)?;
    let index = Index::create_in_dir(dir, schema).map_err(write_err)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let mut writer: IndexWriter = index
        .writer_with_num_threads(threads, threads * WRITER_BYTES_PER_THREAD)
        .map_err(write_err)?;

    let mut stats = IndexStats {
        documents: 0,
        blank_lines: 0,
        duplicate_ids: 0,
    };
    // Hashes of the ids seen (8 bytes a document, not the ids themselves).
    let mut ids = std::collections::HashSet::new();
    for line in JsonlLines::new(reader) {
        let (line_no, line) = line.map_err(io_err(docs_path))?;
        let malformed = |message: String| IndexError::Malformed {
            path: docs_path.to_path_buf(),
            line: line_no as u64,
            message,
        };
        let line = line.map_err(malformed)?;
        if line.trim().is_empty() {
            stats.blank_lines += 1;
            continue;
        }
        let doc = parse_doc(&line, text_field).map_err(malformed)?;
        if !ids.insert(xxhash_rust::xxh3::xxh3_64(doc.id.as_bytes())) {
            stats.duplicate_ids += 1;
        }
        let mut tdoc = TantivyDocument::default();
        tdoc.add_text(id_f, &doc.id);
        if let Some(title) = &doc.title {
            tdoc.add_text(title_f, title);
        }
        tdoc.add_text(text_f, &doc.text);
        if let Err(e) = writer.add_document(tdoc) {
            // add_document only says that an indexing thread died; commit joins the threads and
            // returns the first one's error, which holds the io::Error or its text ("No space
            // left on device").
            let cause = writer
                .commit()
                .err()
                .filter(|c| !matches!(c, tantivy::TantivyError::ErrorInThread(_)));
            return Err(write_err(cause.unwrap_or(e)));
        }
        stats.documents += 1;
    }
    if stats.documents == 0 {
        return Err(IndexError::NoDocuments(docs_path.to_path_buf()));
    }
    writer.commit().map_err(write_err)?;
    writer.wait_merging_threads().map_err(write_err)?;
    Ok(stats)
}

struct JsonDoc {
    id: String,
    title: Option<String>,
    text: String,
}

fn parse_doc(line: &str, text_field: &str) -> Result<JsonDoc, String> {
    let reads = |key: &str| [ID, TITLE, text_field].contains(&key);
    let (value, duplicate) = crate::util::json::parse_line_reading(line, reads)
        .map_err(|e| e.message("invalid JSON"))?;
    // A key held twice would be read as its first value: refuse it where the index reads it,
    // as the corpus refuses it anywhere (the same file may be both).
    if let Some(d) = duplicate.filter(|d| reads(&d.field)) {
        return Err(format!("{d} (which value is meant?)"));
    }
    let obj = value
        .as_object()
        .ok_or_else(|| "expected a JSON object".to_string())?;
    let id = match obj.get(ID) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
        Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
        Some(other) => {
            return Err(format!(
                "\"id\" must be a non-empty string or an integer, got {other}"
            ))
        }
        None => return Err("missing \"id\"".into()),
    };
    if id.len() > MAX_ID_BYTES {
        return Err(format!(
            "\"id\" is {} bytes long, over the limit of {MAX_ID_BYTES} bytes",
            id.len()
        ));
    }
    let title = match obj.get(TITLE) {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("\"title\" must be a string".into()),
    };
    let text = match obj.get(text_field) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(_) => return Err(format!("{text_field:?} must be a string")),
        None => return Err(format!("missing {text_field:?}")),
    };
    Ok(JsonDoc { id, title, text })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::WikiSearch;
    use super::*;
    use crate::annotate::tools::Tool;

    #[test]
    fn duplicate_ids_are_counted() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = format!("{DOCS}{{\"id\": \"42\", \"text\": \"Another steel text.\"}}\n");
        let stats = build_index(
            &write_docs(tmp.path(), docs),
            &tmp.path().join("ix"),
            "text",
        )
        .unwrap();
        assert_eq!((stats.documents, stats.duplicate_ids), (5, 1));
    }

    #[test]
    fn malformed_lines_are_errors_naming_file_and_line() {
        let tmp = tempfile::tempdir().unwrap();
        let cases: [(&[u8], u64, &str); 11] = [
            (
                b"{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"b\",\"text\":",
                2,
                "invalid JSON",
            ),
            (
                b"{\"id\":\"a\",\"text\":\"x\"}\n\n{\"text\":\"y\"}\n",
                3,
                "missing \"id\"",
            ),
            (b"{\"id\":\"\",\"text\":\"x\"}\n", 1, "\"id\""),
            (b"{\"id\":\"a\"}\n", 1, "missing \"text\""),
            (b"{\"id\":\"a\",\"text\":7}\n", 1, "must be a string"),
            (
                b"{\"id\":\"a\",\"title\":[1],\"text\":\"x\"}\n",
                1,
                "\"title\"",
            ),
            (b"[1,2]\n", 1, "object"),
            (b"{\"id\":\"a\",\"text\":\"x\"}\n\xFF\n", 2, "UTF-8"),
            (
                b"{\"id\":\"a\",\"text\":\"x\",\"id\":\"b\"}\n",
                1,
                "duplicate key \"id\"",
            ),
            (
                b"{\"id\":\"a\",\"title\":\"A\",\"title\":\"B\",\"text\":\"x\"}\n",
                1,
                "duplicate key \"title\"",
            ),
            // Behind a duplicate in a field the index does not read, too.
            (
                b"{\"x\":{\"k\":1,\"k\":2},\"id\":\"a\",\"text\":\"x\",\"text\":\"y\"}\n",
                1,
                "duplicate key \"text\"",
            ),
        ];
        for (content, line, needle) in cases {
            let docs = write_docs(tmp.path(), content);
            let out = tmp.path().join("never");
            let err = build_index(&docs, &out, "text").unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, IndexError::Malformed { line: l, .. } if l == line),
                "{}: {msg}",
                String::from_utf8_lossy(content)
            );
            assert!(msg.contains("docs.jsonl") && msg.contains(needle), "{msg}");
            assert!(!out.exists(), "a failed build leaves nothing behind");
        }
    }

    #[test]
    fn a_byte_order_mark_and_crlf_are_accepted() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(
            tmp.path(),
            "\u{feff}{\"id\":\"a\",\"text\":\"first zebra\"}\r\n{\"id\":\"b\",\"text\":\"second\"}\r\n",
        );
        let out = tmp.path().join("idx");
        let stats = build_index(&docs, &out, "text").unwrap();
        assert_eq!(stats.documents, 2);
        let wiki = WikiSearch::open(&out).unwrap();
        let hits = wiki.search("zebra", None, 2).unwrap();
        assert_eq!(hits[0].id, "a", "the BOM is not part of the id");
        // Only before line 1: elsewhere it is not JSON.
        let docs = write_docs(
            tmp.path(),
            "{\"id\":\"a\",\"text\":\"x\"}\n\u{feff}{\"id\":\"b\",\"text\":\"y\"}\n",
        );
        let err = build_index(&docs, &tmp.path().join("never"), "text").unwrap_err();
        assert!(
            matches!(err, IndexError::Malformed { line: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn ids_too_long_to_exclude_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        // The longest id accepted is excluded like any other.
        let longest = "i".repeat(MAX_ID_BYTES);
        let line = |id: &str, text: &str| serde_json::json!({"id": id, "text": text}).to_string();
        let docs = write_docs(
            tmp.path(),
            format!(
                "{}\n{}\n",
                line(&longest, "quokka marsupial"),
                line("other", "wombat")
            ),
        );
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let wiki = WikiSearch::open(&out).unwrap();
        assert_eq!(wiki.search("quokka", None, 5).unwrap().len(), 1);
        assert!(wiki.search("quokka", Some(&longest), 5).unwrap().is_empty());
        assert!(wiki.call("quokka", &doc(&longest)).is_err());

        // One byte more (tantivy would drop the term, so the document would find itself).
        let too_long = "i".repeat(MAX_ID_BYTES + 1);
        let docs = write_docs(
            tmp.path(),
            format!(
                "{}\n{}\n",
                line("other", "wombat"),
                line(&too_long, "quokka")
            ),
        );
        let err = build_index(&docs, &tmp.path().join("never"), "text").unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, IndexError::Malformed { line: 2, .. }),
            "{msg}"
        );
        assert!(
            msg.contains("docs.jsonl:2:") && msg.contains("\"id\"") && msg.contains("65000"),
            "{msg}"
        );
    }

    #[test]
    fn a_killed_builds_leftovers_are_removed_by_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(tmp.path(), "{\"id\":\"a\",\"text\":\"zebra\"}\n");
        let out = tmp.path().join("idx");
        // What `kill -9` mid-build leaves: a half-written index and an unlocked lock file.
        let partial = tmp.path().join(".idx.partial");
        fs::create_dir_all(partial.join("sub")).unwrap();
        fs::write(partial.join("meta.json"), "{").unwrap();
        fs::write(partial.join("sub").join("0.idx"), vec![7u8; 4096]).unwrap();
        fs::write(tmp.path().join(".idx.lock"), "").unwrap();
        let stats = build_index(&docs, &out, "text").unwrap();
        assert_eq!(stats.documents, 1);
        assert!(!partial.exists(), "the killed build's folder is left");
        let mut left: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["docs.jsonl", "idx"]);
        let wiki = WikiSearch::open(&out).unwrap();
        assert_eq!(wiki.num_docs(), 1);
        assert!(wiki.call("zebra", &doc("z")).unwrap().contains("zebra"));
    }

    #[test]
    fn a_build_into_an_out_dir_being_built_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(tmp.path(), "{\"id\":\"a\",\"text\":\"zebra\"}\n");
        let out = tmp.path().join("idx");
        // A live build: its lock held, its folder half-written.
        let lock = fs::File::create(tmp.path().join(".idx.lock")).unwrap();
        lock.try_lock().unwrap();
        let partial = tmp.path().join(".idx.partial");
        fs::create_dir(&partial).unwrap();
        fs::write(partial.join("meta.json"), "{").unwrap();
        let err = build_index(&docs, &out, "text").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("another toolsift run is writing this index") && msg.contains("idx"),
            "{msg}"
        );
        assert!(
            partial.join("meta.json").exists(),
            "the live build's work is gone"
        );
        assert!(!out.exists());
        drop(lock);
        build_index(&docs, &out, "text").expect("built once the lock is let go");
        assert!(!partial.exists());
    }

    /// Names that differ only in bytes that are not UTF-8 have locks of their own (a lossy
    /// name would give both ".idx\u{FFFD}.lock").
    #[cfg(unix)]
    #[test]
    fn out_dirs_named_by_other_bytes_lock_apart() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(tmp.path(), "{\"id\":\"a\",\"text\":\"zebra\"}\n");
        let name = |b: u8| std::ffi::OsStr::from_bytes(&[b'i', b'd', b'x', b]).to_owned();
        let mut busy = std::ffi::OsString::from(".");
        busy.push(name(0xff));
        busy.push(".lock");
        let lock = fs::File::create(tmp.path().join(busy)).unwrap();
        lock.try_lock().unwrap();
        assert!(build_index(&docs, &tmp.path().join(name(0xff)), "text").is_err());
        build_index(&docs, &tmp.path().join(name(0xfe)), "text").expect("a lock of its own");
    }

    #[test]
    fn an_out_dir_without_a_name_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(tmp.path(), "{\"id\":\"a\",\"text\":\"zebra\"}\n");
        let err = build_index(&docs, &tmp.path().join("sub").join(".."), "text").unwrap_err();
        assert!(
            matches!(err, IndexError::Io { .. }) && err.to_string().contains("needs a name"),
            "{err}"
        );
    }

    #[test]
    fn an_out_dirs_missing_parents_are_made() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(tmp.path(), "{\"id\":\"a\",\"text\":\"zebra\"}\n");
        let out = tmp.path().join("new").join("deeper").join("idx");
        build_index(&docs, &out, "text").unwrap();
        assert_eq!(WikiSearch::open(&out).unwrap().num_docs(), 1);
    }

    /// Each error names the path it is about: the documents file that has none, or cannot be
    /// read, and the out dir that cannot be checked (a file, not the partial folder).
    #[test]
    fn build_errors_name_the_file_they_are_about() {
        let tmp = tempfile::tempdir().unwrap();
        let blank = write_docs(tmp.path(), "\n \n");
        let err = build_index(&blank, &tmp.path().join("idx"), "text").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}: no documents", blank.display())
        );

        // A folder opens as a file, then fails to read.
        let folder = tmp.path().join("corpus");
        fs::create_dir(&folder).unwrap();
        let err = build_index(&folder, &tmp.path().join("idx"), "text").unwrap_err();
        assert!(
            matches!(&err, IndexError::Io { path, .. } if path == &folder),
            "{err}"
        );

        let docs = write_docs(tmp.path(), "{\"id\":\"a\",\"text\":\"zebra\"}\n");
        let file = tmp.path().join("taken");
        fs::write(&file, "").unwrap();
        let err = build_index(&docs, &file, "text").unwrap_err();
        assert!(
            matches!(&err, IndexError::Io { path, .. } if path == &file),
            "{err}"
        );
    }

    /// Integer ids of either sign and up to u64::MAX are ids, read as their digits.
    #[test]
    fn integer_ids_of_any_sign_and_size_are_read_as_text() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(
            tmp.path(),
            "{\"id\":-7,\"text\":\"zebra\"}\n{\"id\":18446744073709551615,\"text\":\"zebra\"}\n",
        );
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let wiki = WikiSearch::open(&out).unwrap();
        let hits = wiki.search("zebra", Some("-7"), 5).unwrap();
        let ids: Vec<_> = hits.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["18446744073709551615"]);
        let hits = wiki
            .search("zebra", Some("18446744073709551615"), 5)
            .unwrap();
        assert_eq!(hits[0].id, "-7");
    }

    /// The id's limit is in bytes (what tantivy's term limit counts): 32,501 two-byte
    /// characters are over it.
    #[test]
    fn the_id_limit_counts_bytes_not_characters() {
        let tmp = tempfile::tempdir().unwrap();
        let id = "\u{e9}".repeat(MAX_ID_BYTES / 2 + 1);
        let line = serde_json::json!({"id": id, "text": "zebra"});
        let docs = write_docs(tmp.path(), format!("{line}\n"));
        let err = build_index(&docs, &tmp.path().join("idx"), "text").unwrap_err();
        assert!(
            matches!(err, IndexError::Malformed { line: 1, .. })
                && err.to_string().contains("65002 bytes"),
            "{err}"
        );
    }

    /// The text's errors name the field the build reads it from.
    #[test]
    fn text_errors_name_the_text_field() {
        let tmp = tempfile::tempdir().unwrap();
        for (line, needle) in [
            ("{\"id\":\"a\",\"text\":\"x\"}\n", "missing \"body\""),
            ("{\"id\":\"a\",\"body\":7}\n", "\"body\" must be a string"),
        ] {
            let docs = write_docs(tmp.path(), line);
            let err = build_index(&docs, &tmp.path().join("idx"), "body").unwrap_err();
            assert!(err.to_string().contains(needle), "{err}");
        }
    }
}
