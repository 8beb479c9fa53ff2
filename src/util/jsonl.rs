//! Reading a JSONL input line by line, as `score` and `generate` do: every input line becomes
//! exactly one item, in order, so that it gets exactly one output line. A line that is not UTF-8
//! is that line's problem (an error line in the output), not the end of the run.

use std::io::BufRead;

/// One input line: its 1-based number and its text, or why it has none.
pub type Line = (usize, Result<String, String>);

/// The lines of `reader`, without their "\n" or "\r\n", and without a UTF-8 byte order mark
/// before line 1. Only an I/O error ends the iteration with an error.
pub struct JsonlLines<R> {
    reader: R,
    line: usize,
    buf: Vec<u8>,
}

impl<R: BufRead> JsonlLines<R> {
    pub fn new(reader: R) -> Self {
        JsonlLines {
            reader,
            line: 0,
            buf: Vec::new(),
        }
    }
}

impl<R: BufRead> Iterator for JsonlLines<R> {
    type Item = std::io::Result<Line>;

    fn next(&mut self) -> Option<Self::Item> {
        self.buf.clear();
        match self.reader.read_until(b'\n', &mut self.buf) {
            Err(e) => Some(Err(e)),
            Ok(0) => None,
            Ok(_) => {
                self.line += 1;
                let mut bytes = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
                bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
                if self.line == 1 {
                    bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
                }
                let text = std::str::from_utf8(bytes)
                    .map(str::to_owned)
                    .map_err(|e| format!("not UTF-8 (invalid byte at offset {})", e.valid_up_to()));
                Some(Ok((self.line, text)))
            }
        }
    }
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
}
