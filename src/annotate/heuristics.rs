//! The paper's per-tool heuristics (Schick et al. 2023, §4.1 / App. A): which texts a tool is
//! worth trying on. Each is a knob of `[per_tool.<tool>]`, so any tool may use any of them:
//!
//! - `min_numbers` (calculator: 3): the text has at least that many numbers;
//! - `require_date` (calendar): the document has a date: its "date" field, a date in its URL, or
//!   a configured fallback date (`[tools.calendar] date`);
//! - `min_foreign_words` (MT: 1): at least that many words containing a non-ASCII letter, a cheap
//!   stand-in for the paper's fastText "not English" classifier (documented in docs/annotate.md).

use super::config::ToolParams;
use super::corpus::Document;
use super::tools::Date;

/// Numbers in `text`: maximal runs of digits, with inner "." or "," between digits ("1,400.5" is
/// one number).
pub fn count_numbers(text: &str) -> usize {
    let b = text.as_bytes();
    let mut n = 0;
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            n += 1;
            while i < b.len()
                && (b[i].is_ascii_digit()
                    || ((b[i] == b'.' || b[i] == b',')
                        && i + 1 < b.len()
                        && b[i + 1].is_ascii_digit()))
            {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    n
}

/// Words with at least one non-ASCII alphabetic character.
pub fn count_foreign_words(text: &str) -> usize {
    text.split_whitespace()
        .filter(|w| w.chars().any(|c| !c.is_ascii() && c.is_alphabetic()))
        .count()
}

/// Whether a date is known for `doc`.
pub fn has_date(doc: &Document, fallback_date: Option<&str>) -> bool {
    doc.date.as_deref().and_then(Date::parse_iso).is_some()
        || doc.url.as_deref().and_then(Date::from_url).is_some()
        || fallback_date.and_then(Date::parse_iso).is_some()
}

/// Whether `params`' heuristics let the tool try `doc`.
pub fn applies(params: &ToolParams, doc: &Document, fallback_date: Option<&str>) -> bool {
    (params.min_numbers == 0 || count_numbers(&doc.text) >= params.min_numbers)
        && (params.min_foreign_words == 0
            || count_foreign_words(&doc.text) >= params.min_foreign_words)
        && (!params.require_date || has_date(doc, fallback_date))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_foreign_words() {
        assert_eq!(
            count_numbers("Out of 1,400 people, 400 (or 29%) said yes."),
            3
        );
        assert_eq!(count_numbers("no digits"), 0);
        assert_eq!(count_numbers("3.5, 4 and 5."), 3);
        assert_eq!(count_foreign_words("He said merci, très bien, Straße."), 2);
        assert_eq!(count_foreign_words("plain English"), 0);
    }
}
