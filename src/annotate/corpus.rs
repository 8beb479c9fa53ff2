//! The corpus: JSONL, one document per line (CCNet-like). The text is under a configurable field
//! (default "text"); "id" (string or integer of at most 64 bits, kept exactly), "url" and "date"
//! (strings) are optional; other keys are ignored. The text field may be one of those three: the
//! document then keeps it as well (`--text-field id`: the text is the id, and the id stays). A
//! UTF-8 byte order mark starting line 1 is skipped (starting a later line, it is that line's
//! reject). Lines are numbered from 1. A line that is not a usable document (invalid UTF-8 or
//! JSON, not an object, a key held twice at any depth, no text, a field of the wrong type, blank)
//! is a `Line::Reject` with its reason: the driver writes it to the rejects file, it is never
//! dropped silently.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::util::json;
use crate::util::jsonl::{
    clear_line_buffer, over_limit, read_line_capped, LineEnd, MAX_LINE_BYTES,
};

/// One document of the corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// 1-based input line number: the document's identity for ordering, sharding and resuming.
    pub line: u64,
    /// The "id" field as given (string, or integer within i64/u64), or null.
    pub id: Value,
    /// The text to annotate: the string under the configured text field ("text" by default).
    pub text: String,
    /// The "url" field, or None (also for null). Calendar and the `require_date` heuristic look
    /// for a date in its path.
    pub url: Option<String>,
    /// The "date" field as written, unparsed, or None (also for null): Calendar's first choice.
    pub date: Option<String>,
}

impl Document {
    /// A document of `text` at 1-based input line `line`, without id, URL or date.
    pub fn new(line: u64, text: impl Into<String>) -> Self {
        Document {
            line,
            id: Value::Null,
            text: text.into(),
            url: None,
            date: None,
        }
    }

    /// The id as a string ("" when absent), for tools (WikiSearch excludes the document itself).
    pub fn id_str(&self) -> String {
        match &self.id {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }
}

/// One line of the corpus.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// A usable document.
    Doc(Document),
    /// A line that is not a usable document; the driver writes it to the rejects file.
    Reject {
        /// 1-based input line number.
        line: u64,
        /// Why it was refused ("invalid JSON: ...", "no field \"text\"", ...).
        reason: String,
    },
}

impl Line {
    /// The line's 1-based input line number, document or reject.
    pub fn number(&self) -> u64 {
        match self {
            Line::Doc(d) => d.line,
            Line::Reject { line, .. } => *line,
        }
    }
}

/// Parses one line (without its newline).
pub fn parse_line(line: u64, bytes: &[u8], text_field: &str) -> Line {
    let reject = |reason: String| Line::Reject { line, reason };
    // A UTF-8 byte order mark can only start the file, i.e. line 1.
    let bytes = match bytes.strip_prefix(b"\xEF\xBB\xBF") {
        Some(rest) if line == 1 => rest,
        _ => bytes,
    };
    let Ok(s) = std::str::from_utf8(bytes) else {
        return reject("invalid UTF-8".into());
    };
    let s = s.strip_suffix('\r').unwrap_or(s);
    // Other keys are ignored: checked, never built.
    let reads = |key: &str| key == text_field || matches!(key, "id" | "url" | "date");
    let (value, duplicate) = match json::parse_line_reading(s, reads) {
        Ok(v) => v,
        Err(e) => return reject(e.message("invalid JSON")),
    };
    let Value::Object(mut obj) = value else {
        return reject("not a JSON object".into());
    };
    if let Some(d) = duplicate {
        // Which of the two would be the document's? (`{"text": "...", "text": ""}` would
        // otherwise be annotated as the last, silently.)
        return reject(d.to_string());
    }
    // A text field the record also reads ("--text-field id") is read, not taken: the record
    // keeps its id (URL, date) rather than losing it to the text.
    let field = match text_field {
        "id" | "url" | "date" => obj.get(text_field).cloned(),
        _ => obj.remove(text_field),
    };
    let text = match field {
        Some(Value::String(t)) => t,
        Some(_) => return reject(format!("field {text_field:?} is not a string")),
        None => return reject(format!("no field {text_field:?}")),
    };
    // Only ids that are kept exactly: a float, or an integer beyond 64 bits (which serde_json
    // reads as a float), would be written back changed and could collide with another id.
    let id = match obj.remove("id") {
        None | Some(Value::Null) => Value::Null,
        Some(v @ Value::String(_)) => v,
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n),
        Some(Value::Number(_)) => {
            return reject(
                "field \"id\" is not an integer in the 64-bit range (use a string id)".into(),
            )
        }
        Some(_) => return reject("field \"id\" is not a string or an integer".into()),
    };
    let mut opt = |key: &str| match obj.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(v)) => Ok(Some(v)),
        Some(_) => Err(format!("field {key:?} is not a string")),
    };
    let url = match opt("url") {
        Ok(v) => v,
        Err(e) => return reject(e),
    };
    let date = match opt("date") {
        Ok(v) => v,
        Err(e) => return reject(e),
    };
    Line::Doc(Document {
        line,
        id,
        text,
        url,
        date,
    })
}

/// The corpus's lines, in order, with their numbers. I/O errors name the file and line.
pub struct Corpus<R> {
    reader: R,
    path: PathBuf,
    text_field: String,
    line: u64,
    buf: Vec<u8>,
    max_line_bytes: usize,
    /// Of every byte read so far: at the end, the file's `fingerprint` as this pass saw it.
    hasher: xxhash_rust::xxh3::Xxh3,
}

impl<R: BufRead> Corpus<R> {
    /// Reads the corpus from `reader`, taking the text from `text_field`; `path` only names the
    /// file in errors. A line over [`MAX_LINE_BYTES`] is a reject.
    pub fn new(reader: R, path: &Path, text_field: &str) -> Self {
        Corpus {
            reader,
            path: path.to_owned(),
            text_field: text_field.to_owned(),
            line: 0,
            buf: Vec::new(),
            max_line_bytes: MAX_LINE_BYTES,
            hasher: xxhash_rust::xxh3::Xxh3::new(),
        }
    }

    /// Another line limit than [`MAX_LINE_BYTES`] (tests use a small one).
    pub fn with_max_line_bytes(mut self, max: usize) -> Self {
        self.max_line_bytes = max;
        self
    }

    /// The number of lines read so far.
    pub fn lines_read(&self) -> u64 {
        self.line
    }

    /// The lines read so far and the hash of their bytes: once `next_line` has returned `None`,
    /// equal to `fingerprint` of the file unless it changed since that was taken.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            lines: self.line,
            xxh3: self.hasher.digest(),
        }
    }

    /// The next line, with only its number when `want(number)` is false (not parsed, nor held
    /// in memory).
    pub fn next_line(&mut self, want: impl Fn(u64) -> bool) -> Result<Option<Option<Line>>> {
        let number = self.line + 1;
        let keep = want(number);
        clear_line_buffer(&mut self.buf);
        // Only enough of the line is kept to know it is too long; every byte is hashed.
        let room = if keep {
            self.max_line_bytes.saturating_add(1)
        } else {
            0
        };
        let hasher = &mut self.hasher;
        let mut end = LineEnd::default();
        let (len, _) = read_line_capped(&mut self.reader, &mut self.buf, room, |bytes| {
            hasher.update(bytes);
            end.see(bytes);
        })
        .map_err(|e| {
            Error::io(
                &self.path,
                std::io::Error::new(e.kind(), format!("line {number}: {e}")),
            )
        })?;
        if len == 0 {
            return Ok(None);
        }
        self.line = number;
        if !keep {
            return Ok(Some(None));
        }
        if let Some(why) = over_limit(len, &end, self.max_line_bytes) {
            return Ok(Some(Some(Line::Reject {
                line: number,
                reason: format!("{why} for a corpus line"),
            })));
        }
        let bytes = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
        Ok(Some(Some(parse_line(number, bytes, &self.text_field))))
    }
}

/// Number of lines of a file (a last line without newline counts).
pub fn count_lines(path: &Path) -> Result<u64> {
    Ok(fingerprint(path)?.lines)
}

/// What identifies a corpus file's content for resuming: its line count and a hash of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Number of lines (a last line without newline counts).
    pub lines: u64,
    /// XXH3-64 of the whole file (a stable, specified hash: a journal written by another build
    /// compares equal).
    pub xxh3: u64,
}

/// Reads `path` once: its line count and the hash of its content.
pub fn fingerprint(path: &Path) -> Result<Fingerprint> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut n = 0;
    let mut last = b'\n';
    loop {
        let buf = reader.fill_buf().map_err(|e| Error::io(path, e))?;
        if buf.is_empty() {
            break;
        }
        n += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        hasher.update(buf);
        last = buf[buf.len() - 1];
        let len = buf.len();
        reader.consume(len);
    }
    Ok(Fingerprint {
        lines: n + u64::from(last != b'\n'),
        xxh3: hasher.digest(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(l: Line) -> String {
        match l {
            Line::Reject { reason, .. } => reason,
            Line::Doc(d) => panic!("accepted {d:?}"),
        }
    }

    #[test]
    fn documents_and_rejects() {
        let Line::Doc(d) = parse_line(3, br#"{"id": 7, "text": "hi", "url": "u", "x": 1}"#, "text")
        else {
            panic!()
        };
        assert_eq!(
            (d.line, d.id_str(), d.text.as_str(), d.url.as_deref()),
            (3, "7".into(), "hi", Some("u"))
        );
        let Line::Doc(d) = parse_line(1, br#"{"body": "b"}"#, "body") else {
            panic!()
        };
        assert_eq!(d.id, Value::Null);
        assert!(reason(parse_line(1, b"{", "text")).contains("invalid JSON"));
        assert!(reason(parse_line(1, b"[1]", "text")).contains("not a JSON object"));
        assert!(reason(parse_line(1, br#"{"txt": "a"}"#, "text")).contains("no field \"text\""));
        assert!(reason(parse_line(1, br#"{"text": 3}"#, "text")).contains("not a string"));
        assert!(reason(parse_line(1, br#"{"text": "a", "id": []}"#, "text")).contains("id"));
        assert!(reason(parse_line(1, br#"{"text": "a", "date": 5}"#, "text")).contains("date"));
        // A date is kept as written: Calendar reads what it can, else the URL's date.
        match parse_line(1, br#"{"text": "a", "date": "Mon, 30 Jan 2023"}"#, "text") {
            Line::Doc(d) => assert_eq!(d.date.as_deref(), Some("Mon, 30 Jan 2023")),
            other => panic!("{other:?}"),
        }
        assert!(reason(parse_line(1, b"  ", "text")).contains("blank"));
        assert!(reason(parse_line(1, b"{\"text\": \"\xff\"}", "text")).contains("UTF-8"));
    }

    #[test]
    fn a_key_held_twice_is_a_reject_naming_it() {
        for (line, want) in [
            (
                &br#"{"id":"a","text":"Out of 540 voters, 108 (or 20%) finished.","text":""}"#[..],
                r#"duplicate key "text""#,
            ),
            (
                br#"{"id": 1, "id": 2, "text": "a"}"#,
                r#"duplicate key "id""#,
            ),
            (
                br#"{"text": "a", "url": "u", "url": "v"}"#,
                r#"duplicate key "url""#,
            ),
            // Other keys are ignored, but a line holding one twice is no sound document.
            (
                br#"{"text": "a", "meta": {"k": [{"x": 1, "x": 1}]}}"#,
                r#"duplicate key "x" in meta.k[0]"#,
            ),
        ] {
            assert_eq!(reason(parse_line(4, line, "text")), want);
        }
        // Under another text field, "text" is just another key.
        assert_eq!(
            reason(parse_line(4, br#"{"body": "b", "body": "c"}"#, "body")),
            r#"duplicate key "body""#
        );
        let Line::Doc(d) = parse_line(4, br#"{"body": "b", "text": {"a": 1}}"#, "body") else {
            panic!()
        };
        assert_eq!(d.text, "b");
    }

    #[test]
    fn a_text_field_that_is_also_id_url_or_date_is_kept_as_that_too() {
        let line = br#"{"id": "doc one", "url": "http://u", "date": "2023-01-30", "text": "t"}"#;
        for field in ["id", "url", "date"] {
            let Line::Doc(d) = parse_line(1, line, field) else {
                panic!("{field}")
            };
            assert_eq!(d.id, Value::from("doc one"), "{field}");
            assert_eq!(d.url.as_deref(), Some("http://u"), "{field}");
            assert_eq!(d.date.as_deref(), Some("2023-01-30"), "{field}");
        }
        let Line::Doc(d) = parse_line(1, line, "id") else {
            panic!()
        };
        assert_eq!(d.text, "doc one");
        // A text field must be a string, even when it is the id.
        let r = reason(parse_line(1, br#"{"id": 7, "text": "t"}"#, "id"));
        assert_eq!(r, "field \"id\" is not a string");
    }

    #[test]
    fn ids_are_kept_exactly() {
        let id = |s: &[u8]| match parse_line(1, s, "text") {
            Line::Doc(d) => d.id,
            Line::Reject { reason, .. } => panic!("rejected: {reason}"),
        };
        assert_eq!(id(br#"{"id": "x", "text": "a"}"#), Value::from("x"));
        assert_eq!(id(br#"{"id": -7, "text": "a"}"#), Value::from(-7i64));
        assert_eq!(
            id(br#"{"id": 18446744073709551615, "text": "a"}"#),
            Value::from(u64::MAX)
        );
        assert_eq!(
            id(br#"{"id": -9223372036854775808, "text": "a"}"#),
            Value::from(i64::MIN)
        );
        let Line::Doc(d) = parse_line(1, br#"{"id": 18446744073709551615, "text": "a"}"#, "text")
        else {
            panic!()
        };
        assert_eq!(d.id_str(), "18446744073709551615");
        for bad in [
            &br#"{"id": 18446744073709551617, "text": "a b"}"#[..],
            br#"{"id": -9223372036854775809, "text": "a"}"#,
            br#"{"id": 1e2, "text": "a"}"#,
            br#"{"id": 1.5, "text": "a"}"#,
            br#"{"id": 7.0, "text": "a"}"#,
        ] {
            let r = reason(parse_line(1, bad, "text"));
            assert!(r.contains("\"id\"") && r.contains("integer"), "{r}");
        }
        let r = reason(parse_line(1, br#"{"id": true, "text": "a"}"#, "text"));
        assert!(r.contains("\"id\""), "{r}");
    }

    #[test]
    fn bom_is_skipped_on_line_1_only() {
        let line = b"\xEF\xBB\xBF{\"id\": 1, \"text\": \"a\"}";
        let Line::Doc(d) = parse_line(1, line, "text") else {
            panic!()
        };
        assert_eq!((d.id_str(), d.text.as_str()), ("1".into(), "a"));
        // Past line 1 (files joined with `cat`), the reject says what it is.
        let r = reason(parse_line(2, line, "text"));
        assert!(
            r.contains("byte order mark") && !r.contains("column"),
            "{r}"
        );
        let data =
            b"\xEF\xBB\xBF{\"text\":\"a\"}\n{\"text\":\"b\"}\n\xEF\xBB\xBF{\"text\":\"c\"}\n";
        let mut c = Corpus::new(&data[..], Path::new("c.jsonl"), "text");
        let mut got = Vec::new();
        while let Some(Some(l)) = c.next_line(|_| true).unwrap() {
            got.push(match l {
                Line::Doc(d) => d.text,
                Line::Reject { line, reason } => format!("{line}: {reason}"),
            });
        }
        assert_eq!(got[..2], ["a", "b"]);
        assert!(
            got[2].starts_with("3: the line starts with a UTF-8 byte order mark"),
            "{got:?}"
        );
    }

    /// A null id, URL or date reads as the field left out, not as a reject.
    #[test]
    fn null_id_url_and_date_are_absent() {
        let line = br#"{"id": null, "url": null, "date": null, "text": "a"}"#;
        let Line::Doc(d) = parse_line(2, line, "text") else {
            panic!("{:?}", parse_line(2, line, "text"))
        };
        assert_eq!((d.id, d.url, d.date), (Value::Null, None, None));
    }

    /// What tools see as the document's id: a string id as it is (not quoted), none as "".
    #[test]
    fn id_str_is_the_id_unquoted_or_empty() {
        let mut d = Document::new(1, "t");
        assert_eq!(d.id_str(), "");
        d.id = Value::from("doc-1");
        assert_eq!(d.id_str(), "doc-1");
        d.id = Value::from(-3i64);
        assert_eq!(d.id_str(), "-3");
    }

    /// A read that fails mid-corpus names the file and the line it was reading.
    #[test]
    fn a_read_error_names_the_file_and_the_line() {
        struct Fails;
        impl std::io::Read for Fails {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("disk gone"))
            }
        }
        let reader = std::io::Read::chain(&b"{\"text\":\"a\"}\n"[..], Fails);
        let mut c = Corpus::new(
            std::io::BufReader::new(reader),
            Path::new("dir/c.jsonl"),
            "text",
        );
        assert!(matches!(
            c.next_line(|_| true),
            Ok(Some(Some(Line::Doc(_))))
        ));
        let e = c.next_line(|_| true).unwrap_err().to_string();
        assert!(
            e.contains("dir/c.jsonl") && e.contains("line 2: disk gone"),
            "{e}"
        );
    }

    /// A line's newline, "\n" or "\r\n", is no part of it: a line cut short inside a string is
    /// the same reject either way (not a control character found in the string).
    #[test]
    fn a_line_is_judged_without_its_newline() {
        let cut = br#"{"text":"a"#;
        let want = reason(parse_line(1, cut, "text"));
        assert!(want.contains("EOF while parsing a string"), "{want}");
        let data = [&cut[..], b"\n", cut, b"\r\n", cut, b"\r\n"].concat();
        let mut c = Corpus::new(&data[..], Path::new("c.jsonl"), "text");
        for n in 1..=3 {
            let line = c.next_line(|_| true).unwrap().unwrap().unwrap();
            assert_eq!(line.number(), n);
            assert_eq!(reason(line), want, "line {n}");
        }
    }

    #[test]
    fn numbered_lines() {
        let data = b"{\"text\":\"a\"}\nbad\n{\"text\":\"c\"}";
        let mut c = Corpus::new(&data[..], Path::new("c.jsonl"), "text");
        let mut got = Vec::new();
        while let Some(l) = c.next_line(|n| n != 1).unwrap() {
            got.push(l.map(|l| l.number()));
        }
        assert_eq!(got, vec![None, Some(2), Some(3)]);
    }

    #[test]
    fn a_line_over_the_limit_is_a_reject_and_the_next_lines_follow() {
        let long = format!("{{\"text\":\"{}\"}}", "x".repeat(40));
        let data = format!("{{\"text\":\"a\"}}\n{long}\n{long}\n{{\"text\":\"b\"}}\n{long}");
        // Small reads: lines span several of the reader's chunks.
        for capacity in [3, 7, 64, 1 << 16] {
            let reader = std::io::BufReader::with_capacity(capacity, data.as_bytes());
            let mut c = Corpus::new(reader, Path::new("c.jsonl"), "text").with_max_line_bytes(30);
            let mut got = Vec::new();
            // Line 3 is not wanted (another shard's): skipped, not judged.
            while let Some(l) = c.next_line(|n| n != 3).unwrap() {
                got.push(l.map(|l| match l {
                    Line::Doc(d) => d.text,
                    Line::Reject { line, reason } => format!("{line}: {reason}"),
                }));
            }
            let over = |n| {
                Some(format!(
                    "{n}: line of 51 bytes, over the limit of 30 bytes for a corpus line"
                ))
            };
            assert_eq!(
                got,
                vec![Some("a".into()), over(2), None, Some("b".into()), over(5)],
                "capacity {capacity}"
            );
            // Every byte is hashed, kept or not.
            let whole = Fingerprint {
                lines: 5,
                xxh3: xxhash_rust::xxh3::xxh3_64(data.as_bytes()),
            };
            assert_eq!(c.fingerprint(), whole);
        }
    }
}
