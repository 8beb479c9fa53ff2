//! The corpus: JSONL, one document per line (CCNet-like). The text is under a configurable field
//! (default "text"); "id" (string or integer), "url" and "date" (strings) are optional; other keys
//! are ignored. Lines are numbered from 1. A line that is not a usable document (invalid UTF-8 or
//! JSON, not an object, no text, a field of the wrong type, blank) is a `Line::Reject` with its
//! reason: the driver writes it to the rejects file, it is never dropped silently.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// One document of the corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// 1-based input line number: the document's identity for ordering, sharding and resuming.
    pub line: u64,
    /// The "id" field as given (string or integer), or null.
    pub id: Value,
    pub text: String,
    pub url: Option<String>,
    pub date: Option<String>,
}

impl Document {
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
    Doc(Document),
    Reject { line: u64, reason: String },
}

impl Line {
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
    let Ok(s) = std::str::from_utf8(bytes) else {
        return reject("invalid UTF-8".into());
    };
    let s = s.strip_suffix('\r').unwrap_or(s);
    if s.trim().is_empty() {
        return reject("blank line".into());
    }
    let value: Value = match serde_json::from_str(s) {
        Ok(v) => v,
        Err(e) => return reject(format!("invalid JSON: {e}")),
    };
    let Value::Object(mut obj) = value else {
        return reject("not a JSON object".into());
    };
    let text = match obj.remove(text_field) {
        Some(Value::String(t)) => t,
        Some(_) => return reject(format!("field {text_field:?} is not a string")),
        None => return reject(format!("no field {text_field:?}")),
    };
    let id = match obj.remove("id") {
        None | Some(Value::Null) => Value::Null,
        Some(v @ (Value::String(_) | Value::Number(_))) => v,
        Some(_) => return reject("field \"id\" is not a string or a number".into()),
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
}

impl<R: BufRead> Corpus<R> {
    pub fn new(reader: R, path: &Path, text_field: &str) -> Self {
        Corpus {
            reader,
            path: path.to_owned(),
            text_field: text_field.to_owned(),
            line: 0,
            buf: Vec::new(),
        }
    }

    /// The next line, with only its number when `want(number)` is false (not parsed).
    pub fn next_line(&mut self, want: impl Fn(u64) -> bool) -> Result<Option<Option<Line>>> {
        self.buf.clear();
        let n = self.reader.read_until(b'\n', &mut self.buf).map_err(|e| {
            Error::io(
                &self.path,
                std::io::Error::new(e.kind(), format!("line {}: {e}", self.line + 1)),
            )
        })?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        if !want(self.line) {
            return Ok(Some(None));
        }
        let bytes = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
        Ok(Some(Some(parse_line(self.line, bytes, &self.text_field))))
    }
}

/// Number of lines of a file (a last line without newline counts).
pub fn count_lines(path: &Path) -> Result<u64> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut n = 0;
    let mut last = b'\n';
    loop {
        let buf = reader.fill_buf().map_err(|e| Error::io(path, e))?;
        if buf.is_empty() {
            break;
        }
        n += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        last = buf[buf.len() - 1];
        let len = buf.len();
        reader.consume(len);
    }
    Ok(n + u64::from(last != b'\n'))
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
        assert!(reason(parse_line(1, b"  ", "text")).contains("blank"));
        assert!(reason(parse_line(1, b"{\"text\": \"\xff\"}", "text")).contains("UTF-8"));
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
}
