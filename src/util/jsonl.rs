//! Reading a JSONL input line by line, as `score` and `generate` do: every input line becomes
//! exactly one item, in order, so that it gets exactly one output line. A line that is not UTF-8
//! is that line's problem (an error line in the output), not the end of the run.

use std::io::BufRead;

/// The longest input line accepted (corpus, `score` and `generate` inputs), in bytes, newline
/// excluded: 64 MiB, far beyond any document the paper's pipeline annotates (a long document is
/// annotated on its head). A longer line is that line's error, read through without being held
/// in memory, so one runaway line (a file without newlines, say) cannot exhaust memory.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// The longest output line `resume_point` reads as a row: 8 times the longest input line, room
/// for a row echoing an id as long as its input line with every byte escaped (6 bytes each)
/// beside its answer. A longer line (a file with no newline, say) is refused without being
/// held in memory whole.
const MAX_ROW_BYTES: usize = 8 * MAX_LINE_BYTES;

/// Reads one line, through its "\n" if it has one, passing every byte to `seen` and appending
/// at most `keep` of them to `buf`. Returns the line's length in bytes, newline included (0 at
/// the end of the input), and whether it ended in a newline.
pub fn read_line_capped<R: BufRead>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    keep: usize,
    mut seen: impl FnMut(&[u8]),
) -> std::io::Result<(usize, bool)> {
    let (mut len, mut ended) = (0usize, false);
    while !ended {
        let chunk = match reader.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        let take = match memchr::memchr(b'\n', chunk) {
            Some(i) => {
                ended = true;
                i + 1
            }
            None => chunk.len(),
        };
        seen(&chunk[..take]);
        let kept = take.min(keep.saturating_sub(buf.len()));
        if buf.capacity() - buf.len() < kept {
            // Doubling, but never past `keep`: a line at the limit gets a buffer of its size,
            // not twice it.
            let grown = (buf.capacity() * 2).max(buf.len() + kept).min(keep);
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&chunk[..kept]);
        len += take;
        reader.consume(take);
    }
    Ok((len, ended))
}

/// The capacity a line buffer keeps from one line to the next: one that a long line grew past
/// it (to the line limit, or a `--resume` row's 128 MiB) is freed, not held for the rest of the
/// run. `JsonlLines` hands such a buffer over as the line's text instead.
const KEPT_BUFFER_BYTES: usize = 1 << 20;

/// Empties `buf` for the next line, freeing it if a long line grew it past `KEPT_BUFFER_BYTES`.
pub fn clear_line_buffer(buf: &mut Vec<u8>) {
    if buf.capacity() > KEPT_BUFFER_BYTES {
        *buf = Vec::new();
    } else {
        buf.clear();
    }
}

/// Why a line of `len` bytes, its newline ("\n" or "\r\n", as `end` saw it) included, is
/// refused, if its text is over `max` bytes.
pub fn over_limit(len: usize, end: &LineEnd, max: usize) -> Option<String> {
    let text_len = len - end.newline_bytes();
    (text_len > max).then(|| format!("line of {text_len} bytes, over the limit of {max} bytes"))
}

/// A file's bytes up to and including its first newline (`whole`: all of it, as for a summary,
/// which is one JSON value), or None when there is no such file. Reads at most 256 MiB, so a
/// huge file without newlines cannot exhaust memory (such a file is no C* line anyway).
#[cfg(feature = "annotate")]
pub(crate) fn read_head(
    path: &std::path::Path,
    whole: bool,
) -> crate::error::Result<Option<Vec<u8>>> {
    use crate::error::Error;
    use std::io::{BufReader, Read};
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let limit = 256 << 20;
    let mut head = Vec::new();
    let mut reader = BufReader::new(file);
    let read = if whole {
        reader.take(limit as u64).read_to_end(&mut head).map(drop)
    } else {
        read_line_capped(&mut reader, &mut head, limit, |_| {}).map(drop)
    };
    read.map_err(|e| Error::io(path, e))?;
    Ok(Some(head))
}

/// The last two bytes of a line, from the pieces `read_line_capped` passes to `seen` (which
/// sees the whole line where `buf` keeps only its start): how long its newline is.
#[derive(Debug, Default, Clone, Copy)]
pub struct LineEnd([u8; 2]);

impl LineEnd {
    /// Takes the next piece of the line.
    pub fn see(&mut self, bytes: &[u8]) {
        match *bytes {
            [] => {}
            [b] => self.0 = [self.0[1], b],
            [.., a, b] => self.0 = [a, b],
        }
    }

    /// The bytes a reader drops from the line's end: 2 for "\r\n", 1 for "\n" or for the
    /// "\r" that ends a last line without "\n", 0 otherwise.
    pub fn newline_bytes(&self) -> usize {
        match self.0 {
            [b'\r', b'\n'] => 2,
            [_, b'\n' | b'\r'] => 1,
            _ => 0,
        }
    }
}

/// One input line: its 1-based number and its text, or why it has none.
pub type Line = (usize, Result<String, String>);

/// The lines of `reader`, without their "\n" or "\r\n", and without a UTF-8 byte order mark
/// before line 1. Only an I/O error ends the iteration with an error; a line longer than the
/// limit (`MAX_LINE_BYTES` unless set) is that line's error.
pub struct JsonlLines<R> {
    reader: R,
    line: usize,
    buf: Vec<u8>,
    max_line_bytes: usize,
}

impl<R: BufRead> JsonlLines<R> {
    /// The lines of `reader` from its current position, numbered from 1, at most
    /// `MAX_LINE_BYTES` each.
    pub fn new(reader: R) -> Self {
        JsonlLines {
            reader,
            line: 0,
            buf: Vec::new(),
            max_line_bytes: MAX_LINE_BYTES,
        }
    }

    /// Another line limit (`usize::MAX`: none, for files this program wrote itself).
    pub fn with_max_line_bytes(mut self, max: usize) -> Self {
        self.max_line_bytes = max;
        self
    }
}

impl<R: BufRead> JsonlLines<R> {
    /// The next `n` lines (at least one) into `chunk`, which is cleared first. An I/O error
    /// ends the chunk early and is returned naming the line ("<input line N>"), so that a
    /// caller can answer the lines read before it and then stop: its output stays a prefix of
    /// the input, line for line. An empty chunk and no error: the end of the input.
    pub fn next_chunk(&mut self, n: usize, chunk: &mut Vec<Line>) -> Option<crate::error::Error> {
        chunk.clear();
        while chunk.len() < n.max(1) {
            match self.next()? {
                Ok(line) => chunk.push(line),
                Err(e) => {
                    let at = format!("<input line {}>", self.line + 1);
                    return Some(crate::error::Error::io(at, e));
                }
            }
        }
        None
    }
}

impl<R: BufRead> Iterator for JsonlLines<R> {
    type Item = std::io::Result<Line>;

    fn next(&mut self) -> Option<Self::Item> {
        clear_line_buffer(&mut self.buf);
        let keep = self.max_line_bytes.saturating_add(1);
        let mut end = LineEnd::default();
        let see = |bytes: &[u8]| end.see(bytes);
        let len = match read_line_capped(&mut self.reader, &mut self.buf, keep, see) {
            Err(e) => return Some(Err(e)),
            Ok((0, _)) => return None,
            Ok((len, _)) => len,
        };
        self.line += 1;
        if let Some(why) = over_limit(len, &end, self.max_line_bytes) {
            return Some(Ok((self.line, Err(why))));
        }
        for end in [b'\n', b'\r'] {
            if self.buf.last() == Some(&end) {
                self.buf.pop();
            }
        }
        let bom = "\u{feff}".as_bytes();
        if self.line == 1 && self.buf.starts_with(bom) {
            self.buf.drain(..bom.len());
        }
        // A long line's buffer becomes its text, not copied to it: one 64 MiB line is held
        // once. A short one is copied, and the buffer kept for the next.
        let bytes = if self.buf.capacity() > KEPT_BUFFER_BYTES {
            std::mem::take(&mut self.buf)
        } else {
            self.buf.clone()
        };
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            format!("not UTF-8 (invalid byte at offset {at})")
        });
        Some(Ok((self.line, text)))
    }
}

impl<R: BufRead> JsonlLines<R> {
    /// Reads past the first `n` lines, whatever they hold (a resumed run's, already answered).
    /// An error when the input has fewer, or cannot be read.
    pub fn skip_answered(&mut self, n: usize) -> crate::error::Result<()> {
        use crate::error::Error;
        for k in 1..=n {
            match self.next() {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(Error::io(format!("<input line {k}>"), e)),
                None => {
                    let at = k - 1;
                    return Err(Error::input(format!(
                        "the input ends at line {at}, before the {n} lines the output answers"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Where a run that writes one output line per input line resumes (`--resume` of `score` and
/// `generate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePoint {
    /// Input lines the earlier output answers.
    pub lines: usize,
    /// Bytes of the output that hold their answers; a last line cut off mid-way by a crash
    /// lies beyond them.
    pub output_bytes: u64,
    /// Of those lines, the error rows (an "error" key): a run that resumes fails as the
    /// uninterrupted one would, when any line of the whole output failed.
    pub failed: usize,
}

/// Reads an earlier run's `output` against its `input`, line by line, and says where to go on;
/// None when there is no output yet. Each complete output line (through its "\n") must be a
/// JSON object answering the input line of its number: an answer row (its `answer_key`: "l_none"
/// for `score`, "completion" for `generate`) or an error row ("error"), whose "line" (every
/// row's since 2026-12-02, an error row's before) is that number and whose "id", other than
/// null, is the input line's "id" (an output whose answers are not this input's, a copy of the
/// input say, is an error, never appended to). A last line without its "\n" was cut off by a
/// crash and is not counted, if it starts as a row does ("{"); otherwise the file is refused.
/// The check reads ids, not the settings: a run resumes with the flags it was started with.
pub fn resume_point(
    input: &std::path::Path,
    output: &std::path::Path,
    answer_key: &str,
) -> crate::error::Result<Option<ResumePoint>> {
    use crate::error::Error;
    use serde_json::Value;
    let file = match std::fs::File::open(output) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(output, e)),
    };
    // Read from a pipe or a terminal, it would wait for input that never comes.
    if !file.metadata().map_err(|e| Error::io(output, e))?.is_file() {
        return Err(Error::input(format!(
            "{}: --resume goes on from the output an earlier run wrote, so it must be a regular \
             file, not a pipe or a device",
            output.display()
        )));
    }
    let mut answers = std::io::BufReader::new(file);
    let input_file = std::fs::File::open(input).map_err(|e| Error::io(input, e))?;
    // Read here, then again by the run: a pipe would have nothing left the second time.
    if !input_file
        .metadata()
        .map_err(|e| Error::io(input, e))?
        .is_file()
    {
        return Err(Error::input(format!(
            "{}: --resume reads the input twice (to check the output against it, then to go \
             on), so it must be a regular file, not a pipe or a device; write it to a file first",
            input.display()
        )));
    }
    let mut questions = JsonlLines::new(std::io::BufReader::new(input_file));
    let not_ours = |k: usize, why: String| {
        Error::input(format!(
            "{} line {k}: {why}; it is not an output of {} (give another output, or remove it \
             to start over)",
            output.display(),
            input.display()
        ))
    };
    let (mut lines, mut output_bytes, mut failed, mut buf) = (0usize, 0u64, 0usize, Vec::new());
    loop {
        clear_line_buffer(&mut buf);
        let (len, ended) = read_line_capped(&mut answers, &mut buf, MAX_ROW_BYTES + 1, |_| {})
            .map_err(|e| Error::io(output, e))?;
        let k = lines + 1;
        if len == 0 {
            break;
        }
        if !ended {
            // A crash cuts a row after its first byte, "{", or not at all: anything else
            // without a newline (a binary file, a note with no "\n") is no output of ours, and
            // must not be cut away as a torn row.
            if buf.first() != Some(&b'{') || len > MAX_ROW_BYTES {
                return Err(not_ours(
                    k,
                    "its last line ends without a newline and is no row cut off by a crash".into(),
                ));
            }
            break;
        }
        if len > MAX_ROW_BYTES {
            return Err(not_ours(
                k,
                format!("a line of {len} bytes is longer than any row"),
            ));
        }
        if buf.trim_ascii().is_empty() {
            return Err(not_ours(k, "a blank line, which no run writes".into()));
        }
        // Only the fields checked are built: a row can be as long as its input line.
        let reads = |key: &str| matches!(key, "error" | "line" | "id") || key == answer_key;
        let answer = std::str::from_utf8(&buf)
            .map_err(|e| e.to_string())
            .and_then(|row| {
                crate::util::json::parse_line_reading(row, reads).map_err(|e| e.to_string())
            })
            .map_err(|e| not_ours(k, format!("not a JSON line ({e})")))?
            .0;
        let question = match questions.next() {
            Some(Ok((_, text))) => text.ok(),
            Some(Err(e)) => return Err(Error::io(input, e)),
            None => return Err(not_ours(k, "the input has fewer lines".into())),
        };
        let error = answer.get("error").is_some();
        if !error && answer.get(answer_key).is_none() {
            return Err(not_ours(
                k,
                format!("it is neither an answer (no \"{answer_key}\") nor an error row"),
            ));
        }
        if let Some(line) = answer.get("line").filter(|l| l.as_u64() != Some(k as u64)) {
            return Err(not_ours(k, format!("it answers line {line}")));
        }
        let id = answer.get("id").unwrap_or(&Value::Null);
        if !id.is_null() {
            // Read as the run read it (`json::parse_line_reading`): serde_json's own reader refuses
            // some lines the run answered, a lone surrogate in a key held twice, say.
            let asked = question
                .and_then(|t| crate::util::json::parse_line_reading(&t, |key| key == "id").ok())
                .and_then(|(v, _)| v.get("id").cloned());
            if asked.as_ref() != Some(id) {
                let asked = asked.map_or("none".to_string(), |a| a.to_string());
                return Err(not_ours(
                    k,
                    format!("it answers id {id}, the input's is {asked}"),
                ));
            }
        }
        lines = k;
        output_bytes += len as u64;
        failed += error as usize;
    }
    Ok(Some(ResumePoint {
        lines,
        output_bytes,
        failed,
    }))
}

/// An output opened and locked by [`lock_output`], not yet started by [`start_output`]. Dropped
/// before it is started (the run could not start: a model that does not load, a device that is
/// not there), it removes the file if this run created it and it is still empty, so a failed
/// start leaves no empty output behind; the lock goes with it.
#[derive(Debug)]
pub struct LockedOutput {
    file: Option<std::fs::File>,
    path: std::path::PathBuf,
    created: bool,
}

impl Drop for LockedOutput {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            // Still locked here, and checked to be the file at the path: another run's file
            // is never removed.
            let empty = file.metadata().is_ok_and(|m| m.is_file() && m.len() == 0);
            if self.created && empty && crate::util::fs::same_file(&file, &self.path) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Opens `output` (created if missing, nothing cut yet) and takes its exclusive lock, held while
/// the returned output is (and then the file [`start_output`] makes of it): a second run on the
/// same output is refused, instead of cutting the file and writing its lines over this run's.
/// Take it before reading the output to resume. A pipe or a device is opened unlocked.
///
/// Opened for writing only: a named pipe is then written as a shell's `>` writes it (opening
/// waits for a reader; a reader that leaves fails the next write). Opened for reading too, the
/// run would be the pipe's reader itself: no write would fail, and once the pipe was full it
/// would wait forever.
pub fn lock_output(output: &std::path::Path) -> crate::error::Result<LockedOutput> {
    let io = |e| crate::error::Error::io(output, e);
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    // Whether this run creates it: only then may a failed start remove it.
    let (file, created) = match options.clone().create_new(true).open(output) {
        Ok(file) => (file, true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => (
            options
                .create(true)
                .truncate(false)
                .open(output)
                .map_err(io)?,
            false,
        ),
        Err(e) => return Err(io(e)),
    };
    let locked = |file| LockedOutput {
        file: Some(file),
        path: output.to_owned(),
        created,
    };
    // A pipe or a device (/dev/null, /dev/stdout) is no file two runs could write over each
    // other: locked, it would keep unrelated runs from sharing it.
    if !file.metadata().map_err(io)?.is_file() {
        return Ok(locked(file));
    }
    crate::util::fs::lock_in_place(
        &file,
        output,
        || {
            format!(
                "{}: another toolsift run is writing this output; wait for it to finish or stop \
                 it, then rerun",
                output.display()
            )
        },
        || {
            format!(
                "{}: another run replaced or removed this output while this one started; rerun",
                output.display()
            )
        },
    )?;
    Ok(locked(file))
}

/// The locked output ([`lock_output`]) made ready to write: emptied, or cut to the answered
/// lines of `point` and positioned at their end. Not a regular file (a pipe, a device): written
/// as it is, as `File::create` would.
pub fn start_output(
    mut locked: LockedOutput,
    point: Option<ResumePoint>,
) -> crate::error::Result<std::fs::File> {
    use std::io::Seek;
    let output = locked.path.clone();
    let io = |e| crate::error::Error::io(&output, e);
    let mut file = locked
        .file
        .take()
        .expect("an unstarted output holds its file");
    if file.metadata().map_err(io)?.is_file() {
        file.set_len(point.map_or(0, |p| p.output_bytes))
            .map_err(io)?;
        file.seek(std::io::SeekFrom::End(0)).map_err(io)?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_is_an_item_in_order() {
        let input: &[u8] = b"\xef\xbb\xbf{\"a\":1}\r\n\n{\"b\":\xff}\n\xef\xbb\xbflast";
        let lines: Vec<Line> = JsonlLines::new(input).map(Result::unwrap).collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], (1, Ok("{\"a\":1}".into())));
        assert_eq!(lines[1], (2, Ok(String::new())));
        assert_eq!(lines[2].0, 3);
        assert!(lines[2].1.as_ref().unwrap_err().contains("not UTF-8"));
        // A byte order mark is only skipped before line 1.
        assert_eq!(lines[3], (4, Ok("\u{feff}last".into())));
    }

    #[test]
    fn a_resumed_output_is_checked_against_its_input() {
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
        std::fs::write(&input, "{\"id\": \"a\"}\nnot json\n{\"id\": 7}\n{}\n").unwrap();
        assert_eq!(resume_point(&input, &output, "x").unwrap(), None);
        let point = |text: &str| {
            std::fs::write(&output, text).unwrap();
            resume_point(&input, &output, "x")
        };
        let answered = "{\"id\":\"a\",\"x\":1}\n{\"id\":null,\"line\":2,\"error\":\"e\"}\n";
        // A last line cut off is not counted; its bytes are beyond the point.
        let p = point(&format!("{answered}{{\"id\":7,\"x"))
            .unwrap()
            .unwrap();
        assert_eq!(p.lines, 2);
        assert_eq!(p.output_bytes, answered.len() as u64);
        assert_eq!(p.failed, 1);
        let mut file = start_output(lock_output(&output).unwrap(), Some(p)).unwrap();
        std::io::Write::write_all(&mut file, b"{\"id\":7,\"x\":2}\n").unwrap();
        drop(file);
        assert_eq!(
            std::fs::read_to_string(&output).unwrap(),
            format!("{answered}{{\"id\":7,\"x\":2}}\n")
        );
        assert_eq!(point("").unwrap().unwrap().lines, 0);
        let blank = point("{\"id\":\"a\",\"x\":1}\n\n").unwrap_err();
        assert!(
            blank.to_string().contains("line 2: a blank line"),
            "{blank}"
        );
        // Answers that are not this input's.
        for (text, why) in [
            (
                "{\"id\":\"b\",\"x\":1}\n",
                "it answers id \"b\", the input's is \"a\"",
            ),
            (
                "{\"id\":\"a\",\"x\":1}\n{\"line\":3,\"error\":\"e\"}\n",
                "it answers line 3",
            ),
            // An answer row answers its line too.
            (
                "{\"id\":\"a\",\"line\":2,\"x\":true}\n",
                "line 1: it answers line 2",
            ),
            (
                "{\"x\":1}\n{\"x\":1}\n{\"x\":1}\n{\"x\":1}\n{\"x\":1}\n",
                "line 5: the input has fewer lines",
            ),
            ("oops\n", "line 1: not a JSON line"),
            // The input itself, or any other lines that are not this command's rows.
            (
                "{\"id\": \"a\"}\n",
                "line 1: it is neither an answer (no \"x\")",
            ),
            ("[1]\n", "line 1: it is neither an answer"),
        ] {
            let e = point(text).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("is not an output of"), "{e}");
        }
        // Skipping what is answered, and no more than the input has.
        let text = std::fs::read(&input).unwrap();
        let mut lines = JsonlLines::new(&text[..]);
        lines.skip_answered(2).unwrap();
        assert_eq!(lines.next().unwrap().unwrap().0, 3);
        let e = JsonlLines::new(&text[..])
            .skip_answered(5)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the input ends at line 4, before the 5 lines"),
            "{e}"
        );
    }

    /// A row is checked as an answer to its own line whatever its kind: an error row's id too,
    /// a "line" that is no integer (a string, a float), and an id where the input line has
    /// none (it is not JSON) are no answers of this input.
    #[test]
    fn every_row_must_answer_its_line_and_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
        std::fs::write(&input, "{\"id\": \"a\"}\nnot json\n").unwrap();
        let point = |text: &str| {
            std::fs::write(&output, text).unwrap();
            resume_point(&input, &output, "x")
        };
        let first = "{\"id\":\"a\",\"x\":1}\n";
        for (text, why) in [
            (
                "{\"id\":\"b\",\"line\":1,\"error\":\"e\"}\n".to_string(),
                "line 1: it answers id \"b\", the input's is \"a\"",
            ),
            (
                format!("{first}{{\"id\":\"z\",\"line\":2,\"error\":\"e\"}}\n"),
                "line 2: it answers id \"z\", the input's is none",
            ),
            (
                "{\"id\":\"a\",\"line\":\"1\",\"x\":1}\n".to_string(),
                "line 1: it answers line \"1\"",
            ),
            (
                "{\"id\":\"a\",\"line\":1.0,\"x\":1}\n".to_string(),
                "line 1: it answers line 1.0",
            ),
        ] {
            let e = point(&text).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("is not an output of"), "{e}");
        }
        // The same rows with the input's ids and lines are its answers.
        let ok = format!("{first}{{\"id\":null,\"line\":2,\"error\":\"e\"}}\n");
        assert_eq!(point(&ok).unwrap().unwrap().lines, 2);
    }

    /// A line over the limit is read through keeping only its first limit + 1 bytes, and a
    /// buffer that grew past `KEPT_BUFFER_BYTES` for it is freed at the next line: a runaway
    /// line costs the limit, once, not its length.
    #[test]
    fn a_line_over_the_limit_is_held_only_to_the_limit() {
        let max = 2 * KEPT_BUFFER_BYTES;
        let input = format!("{}\nshort\n", "x".repeat(3 * max));
        let reader = std::io::BufReader::with_capacity(4096, input.as_bytes());
        let mut lines = JsonlLines::new(reader).with_max_line_bytes(max);
        let (n, text) = lines.next().unwrap().unwrap();
        assert_eq!(n, 1);
        assert!(text.unwrap_err().starts_with("line of"));
        assert!(lines.buf.len() <= max + 1, "{}", lines.buf.len());
        assert!(lines.buf.capacity() <= max + 1, "{}", lines.buf.capacity());
        // Nor handed over as the next line's text.
        let (n, text) = lines.next().unwrap().unwrap();
        let text = text.unwrap();
        assert_eq!((n, text.as_str()), (2, "short"));
        assert!(text.capacity() <= KEPT_BUFFER_BYTES, "{}", text.capacity());
        assert!(lines.buf.capacity() <= KEPT_BUFFER_BYTES);
    }

    /// Found by tests/input_fuzz.rs: `score` echoes the id of a line whose other key, held
    /// twice, holds a lone surrogate (which serde_json's own reader refuses); resuming from
    /// that output was refused as "not an output of" its input.
    #[test]
    fn ids_are_read_back_as_the_run_read_them() {
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
        std::fs::write(
            &input,
            "{\"zz\": 0.1, \"zz\": \"\\ud800\", \"id\": false}\n{}\n",
        )
        .unwrap();
        let row = "{\"id\":false,\"line\":1,\"error\":\"line 1: duplicate key \\\"zz\\\"\"}\n";
        std::fs::write(&output, row).unwrap();
        let point = resume_point(&input, &output, "x").unwrap().unwrap();
        assert_eq!((point.lines, point.failed), (1, 1));
    }

    #[test]
    fn a_line_over_the_limit_is_that_lines_error() {
        // The limit is on the text: "\r\n" is not counted, at the limit or past it.
        let input = format!(
            "short\n{}\r\nnext\n{}\n{}\r\n",
            "y".repeat(20),
            "z".repeat(11),
            "w".repeat(10)
        );
        for capacity in [2, 5, 1 << 12] {
            let reader = std::io::BufReader::with_capacity(capacity, input.as_bytes());
            let lines: Vec<Line> = JsonlLines::new(reader)
                .with_max_line_bytes(10)
                .map(Result::unwrap)
                .collect();
            assert_eq!(
                lines,
                vec![
                    (1, Ok("short".into())),
                    (
                        2,
                        Err("line of 20 bytes, over the limit of 10 bytes".into())
                    ),
                    (3, Ok("next".into())),
                    (
                        4,
                        Err("line of 11 bytes, over the limit of 10 bytes".into())
                    ),
                    (5, Ok("w".repeat(10))),
                ],
                "capacity {capacity}"
            );
        }
    }

    #[test]
    fn a_long_line_becomes_its_text_and_its_buffer_is_not_kept() {
        let long = "x".repeat(3 * KEPT_BUFFER_BYTES + 5);
        let input = format!("{long}\nshort\n");
        // Read in pieces, as from a file, with the limit at the long line's length.
        let reader = std::io::BufReader::with_capacity(4096, input.as_bytes());
        let mut lines = JsonlLines::new(reader).with_max_line_bytes(long.len());
        let (n, text) = lines.next().unwrap().unwrap();
        let text = text.unwrap();
        assert_eq!((n, &text), (1, &long));
        // The buffer grew to the limit (and its newline), not past it, and was handed over.
        assert!(text.capacity() <= long.len() + 1, "{}", text.capacity());
        assert_eq!(lines.buf.capacity(), 0);
        assert_eq!(lines.next().unwrap().unwrap(), (2, Ok("short".into())));
        assert!(lines.buf.capacity() <= KEPT_BUFFER_BYTES);
    }

    /// A last line ended by a lone "\r" (no "\n" after it): the "\r" is its line end, not its
    /// text, for the length limit as for the text.
    #[test]
    fn a_last_line_ended_by_a_lone_carriage_return() {
        let input = format!("{}\n{}\r", "a".repeat(10), "w".repeat(10));
        let lines: Vec<Line> = JsonlLines::new(input.as_bytes())
            .with_max_line_bytes(10)
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            lines,
            vec![(1, Ok("a".repeat(10))), (2, Ok("w".repeat(10)))]
        );
    }

    /// An output this run did not create is left where it is when the run ends without writing
    /// (an empty file given as the output stays); one it created and left empty is removed.
    #[test]
    fn only_an_output_this_run_created_is_removed_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        let given = dir.path().join("given.jsonl");
        std::fs::write(&given, "").unwrap();
        drop(lock_output(&given).unwrap());
        assert!(given.is_file(), "an empty file the user made was removed");
        let new = dir.path().join("new.jsonl");
        drop(lock_output(&new).unwrap());
        assert!(
            !new.exists(),
            "an empty output this run made was left behind"
        );
    }
}
