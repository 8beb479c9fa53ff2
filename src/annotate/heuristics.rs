//! The paper's per-tool heuristics (Schick et al. 2023, §4.1 / App. A): which texts a tool is
//! worth trying on. Each is a knob of `[per_tool.<tool>]`, so any tool may use any of them:
//!
//! - `min_numbers` (calculator: 3): the text has at least that many numbers;
//! - `require_arithmetic` (opt-in, off by default): the paper's Calculator filter in full: the
//!   head of the text its positions are searched in shows arithmetic (`shows_arithmetic`), or,
//!   with a probability of 1% (`NUMBERS_ONLY_RATE`, a draw keyed by seed, line and tool), it
//!   merely passes `min_numbers`;
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

/// With `require_arithmetic`, the share of texts that only pass `min_numbers` that are tried
/// anyway: the paper's 1%.
pub const NUMBERS_ONLY_RATE: f64 = 0.01;
/// Numbers farther apart than this are not related by `shows_arithmetic`: the paper's window is
/// 100 tokens, and both a word and a number are at least one token, so two numbers are this far
/// apart in words or in numbers (text without spaces is one long word) before they are in tokens.
const ARITHMETIC_WINDOW: usize = 100;

/// A number of a text, as `shows_arithmetic` reads it.
#[derive(Debug, Clone, Copy)]
struct Number {
    value: f64,
    /// Digits after its ".": a result is compared at this precision.
    decimals: i32,
    /// Significant digits as written ("0.29": 2, "1400": 4, "0": 0).
    significant: u32,
    /// Followed by "%": a result is also compared as a percentage.
    percent: bool,
    /// The index of the whitespace-separated word it is in.
    word: usize,
}

/// The numbers of `text` (as `count_numbers` finds them; "," between digits is a thousands
/// separator).
fn numbers(text: &str) -> Vec<Number> {
    let b = text.as_bytes();
    let (mut out, mut word, mut i) = (Vec::new(), 0usize, 0usize);
    let mut in_space = true;
    while i < b.len() {
        if b[i].is_ascii_whitespace() {
            in_space = true;
            i += 1;
            continue;
        }
        if in_space {
            word += 1;
            in_space = false;
        }
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len()
            && (b[i].is_ascii_digit()
                || ((b[i] == b'.' || b[i] == b',') && i + 1 < b.len() && b[i + 1].is_ascii_digit()))
        {
            i += 1;
        }
        let digits: String = text[start..i].chars().filter(|&c| c != ',').collect();
        if let Ok(value) = digits.parse::<f64>() {
            let decimals = digits
                .split_once('.')
                .map_or(0, |(_, f)| f.len().min(9) as i32);
            let significant = digits
                .chars()
                .filter(char::is_ascii_digit)
                .skip_while(|&c| c == '0')
                .count() as u32;
            out.push(Number {
                value,
                decimals,
                significant,
                percent: b.get(i) == Some(&b'%'),
                word,
            });
        }
    }
    out
}

/// Whether `c` reads as `result`, an operation's result on two other numbers (the paper's (i)):
/// equal to it at `c`'s written precision, or as a percentage when "%" follows `c`. A match only
/// after rounding needs two significant digits: "29%" of 400/1400 reads as arithmetic, a "1" or
/// "0" near any two numbers whose quotient rounds to it does not.
fn is_result_of(result: f64, c: &Number) -> bool {
    let scale = 10f64.powi(c.decimals);
    let written = c.value * scale;
    let rounds_to = |r: f64| r.is_finite() && (r * scale).round() == written.round();
    let equals = |r: f64| r.is_finite() && (r * scale - written).abs() < 1e-6;
    equals(result)
        || (c.percent && equals(result * 100.0))
        || (c.significant >= 2 && (rounds_to(result) || (c.percent && rounds_to(result * 100.0))))
}

/// The results of +, -, *, / on `a` and `b` that are not trivial: no + or - of 0, no * or / by
/// 0 or 1, nothing from a and a alone (a - a, a / a).
fn results(a: f64, b: f64) -> impl Iterator<Item = f64> {
    let neutral = |x: f64| x == 0.0 || x == 1.0;
    let same = a == b;
    [
        (a + b, a != 0.0 && b != 0.0),
        (a - b, b != 0.0 && !same),
        (b - a, a != 0.0 && !same),
        (a * b, !neutral(a) && !neutral(b)),
        (a / b, !neutral(b) && a != 0.0 && !same),
        (b / a, !neutral(a) && b != 0.0 && !same),
    ]
    .into_iter()
    .filter_map(|(r, useful)| useful.then_some(r))
}

/// The paper's Calculator filter, conditions (i) and (ii) (App. A.1): three numbers within
/// `ARITHMETIC_WINDOW` words and numbers of each other, of which one is the result of +, -, *,
/// / on the other two (`is_result_of`: compared at the result's written precision, a number
/// followed by "%" also as a percentage: "400 (or 29%)" of 1400; trivial operations left out),
/// or "=" (not after a letter, as in a URL's "page=2"), "equals", "equal to", "total of" or
/// "average of" followed by a number. The window bounds the work: at most 200 neighbours per
/// number.
pub fn shows_arithmetic(text: &str) -> bool {
    let lower = text.to_lowercase();
    for key in ["=", "equals", "equal to", "total of", "average of"] {
        for (at, _) in lower.match_indices(key) {
            let before = lower[..at].chars().next_back();
            if key == "=" && before.is_some_and(|c| c.is_alphabetic() || c == '_') {
                continue;
            }
            let after = lower[at + key.len()..].trim_start_matches([' ', '$', '\t']);
            if after.starts_with(|c: char| c.is_ascii_digit()) {
                return true;
            }
        }
    }
    let nums = numbers(text);
    let near = |i: usize, j: usize| {
        i.abs_diff(j) <= ARITHMETIC_WINDOW
            && nums[i].word.abs_diff(nums[j].word) <= ARITHMETIC_WINDOW
    };
    for (ci, c) in nums.iter().enumerate() {
        let lo = ci.saturating_sub(ARITHMETIC_WINDOW);
        let hi = (ci + ARITHMETIC_WINDOW).min(nums.len() - 1);
        let others: Vec<usize> = (lo..=hi).filter(|&k| k != ci && near(k, ci)).collect();
        for (x, &ai) in others.iter().enumerate() {
            for &bi in &others[x + 1..] {
                if near(ai, bi)
                    && results(nums[ai].value, nums[bi].value).any(|r| is_result_of(r, c))
                {
                    return true;
                }
            }
        }
    }
    false
}

/// Whether `params`' heuristics let the tool try `doc`. `head` is the part of the text whose
/// positions are searched; `draw`, uniform in [0, 1) and keyed by the document and tool, decides
/// the 1% of `require_arithmetic`.
pub fn applies(
    params: &ToolParams,
    doc: &Document,
    head: &str,
    fallback_date: Option<&str>,
    draw: f64,
) -> bool {
    let enough_numbers = params.min_numbers == 0 || count_numbers(&doc.text) >= params.min_numbers;
    let numbers_pass = if params.require_arithmetic {
        shows_arithmetic(head) || (enough_numbers && draw < NUMBERS_ONLY_RATE)
    } else {
        enough_numbers
    };
    numbers_pass
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

    #[test]
    fn arithmetic_is_seen_as_the_paper_describes_it() {
        for yes in [
            "Out of 1,400 participants, 400 (or 29%) passed the test.",
            "He had 12 apples and bought 30 more, 42 in all.",
            "From 734 to 791, an increase of 57.",
            "Each box costs 2.50 dollars, so 4 of them cost 10 dollars.",
            "They paid 1/3 of 9 dollars: 3.",
            "The result equals 7.",
            "A total of 120 people came.",
            "x = 5",
            "an average of $30 per night",
        ] {
            assert!(shows_arithmetic(yes), "{yes:?}");
        }
        for no in [
            "In 2019, 17 teams and 240 players took part.",
            "Room 12 on floor 5, call 481.",
            "The total was large.",
            "no numbers at all",
            "7 and 9",
            // Trivial operations, and "results" that only rounding makes (one digit) are not.
            "Chapter 1. In 2019, 17 teams and 20 players took part.",
            "Room 0: in 2019, 17 teams and 240 players took part.",
            "Flat 2, 1998 edition, 1000 pages.",
            "Page 1. The 25 boxes cost 25 dollars.",
            "Page 0 of 7, section 7.",
            // "=" inside a URL's query is not an equation.
            "More at example.com/list?page=2 today.",
        ] {
            assert!(!shows_arithmetic(no), "{no:?}");
        }
        // Exact results count with any number of digits, rounded ones with two.
        assert!(shows_arithmetic("12 eggs in 4 boxes, 3 per box."));
        assert!(shows_arithmetic("1 of 4 people, 25% of them, said so."));
        assert!(shows_arithmetic("2+3=5"));
        assert!(shows_arithmetic("1;2;3"), "text without spaces is read too");
        // Related numbers more than 100 words apart are not.
        let far = format!(
            "He had 12 apples{} and 30 more, 42 in all.",
            " word".repeat(120)
        );
        assert!(!shows_arithmetic(&far));
        // ... nor more than 100 numbers apart in text without spaces, one long "word".
        let far = format!("12;30;{}42", "7;".repeat(120));
        assert!(!shows_arithmetic(&far));
        assert!(shows_arithmetic(&format!("12;30;{}42", "7;".repeat(90))));
    }

    /// The window bounds the work: a long run of numbers without spaces and without arithmetic
    /// (which would be every pair of every triple, cubic, if it were one word) is read in a
    /// bounded number of comparisons per number.
    #[test]
    fn numbers_without_spaces_are_read_in_linear_time() {
        let bomb = "7;".repeat(2_000);
        let start = std::time::Instant::now();
        assert!(!shows_arithmetic(&bomb));
        // Not a timing test: cubic took 83 s in release builds before (2000^3 / 6 triples x 6
        // operations); bounded it is 2000 x 200^2 / 2 pairs, well under a second.
        assert!(start.elapsed().as_secs() < 60);
    }

    #[test]
    fn require_arithmetic_lets_numbers_only_texts_through_one_time_in_a_hundred() {
        let mut params = ToolParams::paper(crate::annotate::ToolKind::Calculator);
        let doc = |text: &str| Document {
            line: 1,
            id: serde_json::Value::Null,
            text: text.into(),
            url: None,
            date: None,
        };
        let plain = doc("In 2019, 17 teams and 240 players took part.");
        let sums = doc("He had 12 apples and bought 30 more, 42 in all.");
        let few = doc("Only 2 numbers, 3 here.");
        let ok = |p: &ToolParams, d: &Document, draw: f64| applies(p, d, &d.text, None, draw);
        assert!(ok(&params, &plain, 0.5), "off: min_numbers alone");
        params.require_arithmetic = true;
        assert!(ok(&params, &sums, 0.5));
        assert!(!ok(&params, &plain, 0.5));
        assert!(ok(&params, &plain, 0.009));
        assert!(!ok(&params, &few, 0.009), "still needs min_numbers");
        // The head, not the whole text, must show the arithmetic.
        assert!(!applies(&params, &sums, "He had 12 apples", None, 0.5));
    }

    /// Words with a non-ASCII letter, not words with any non-ASCII character (a currency sign,
    /// a dash).
    #[test]
    fn foreign_words_need_a_non_ascii_letter() {
        assert_eq!(count_foreign_words("It costs 5€ — a bargain."), 0);
        assert_eq!(count_foreign_words("Un café — 2€"), 1);
    }

    /// A date that does not parse is no date; a fallback date is one (when it parses).
    #[test]
    fn a_date_is_known_when_one_parses() {
        let mut doc = Document {
            line: 1,
            id: serde_json::Value::Null,
            text: "Today.".into(),
            url: None,
            date: Some("last week".into()),
        };
        assert!(!has_date(&doc, None));
        assert!(!has_date(&doc, Some("soon")));
        assert!(has_date(&doc, Some("2023-01-30")));
        doc.date = Some("2021-03-04".into());
        assert!(has_date(&doc, None));
    }

    /// A document without a "date" field has one when its URL holds a date.
    #[test]
    fn a_date_in_the_url_is_a_known_date() {
        let mut doc = Document::new(1, "Today.");
        assert!(!has_date(&doc, None));
        doc.url = Some("https://example.com/2021/03/04/story".into());
        assert!(has_date(&doc, None));
    }

    /// Calendar is tried only on documents with a date (`require_date`), whatever their text.
    #[test]
    fn require_date_turns_away_documents_without_a_date() {
        let calendar = ToolParams::paper(crate::annotate::ToolKind::Calendar);
        let mut doc = Document::new(1, "The meeting is next Friday.");
        assert!(!applies(&calendar, &doc, &doc.text, None, 0.5));
        assert!(applies(&calendar, &doc, &doc.text, Some("2023-01-30"), 0.5));
        doc.date = Some("2023-01-30".into());
        assert!(applies(&calendar, &doc, &doc.text, None, 0.5));
    }

    /// The 1% of `require_arithmetic` is draw < 0.01, exactly.
    #[test]
    fn numbers_only_texts_pass_below_a_draw_of_one_percent() {
        let mut params = ToolParams::paper(crate::annotate::ToolKind::Calculator);
        params.require_arithmetic = true;
        let doc = Document {
            line: 1,
            id: serde_json::Value::Null,
            text: "In 2019, 17 teams and 240 players took part.".into(),
            url: None,
            date: None,
        };
        let ok = |draw: f64| applies(&params, &doc, &doc.text, None, draw);
        assert!(ok(0.0) && ok(0.0099));
        assert!(!ok(NUMBERS_ONLY_RATE) && !ok(0.015));
    }

    /// `min_numbers` and `min_foreign_words` read the whole document, not only the searched head
    /// (docs/annotate.md, "Heuristics read the whole document").
    #[test]
    fn counting_heuristics_read_the_whole_document() {
        let doc = Document {
            line: 1,
            id: serde_json::Value::Null,
            text: "Words first. Then 1, 2 and 3, très bien.".into(),
            url: None,
            date: None,
        };
        let head = "Words first.";
        let calc = ToolParams::paper(crate::annotate::ToolKind::Calculator);
        assert!(applies(&calc, &doc, head, None, 0.5));
        let mt = ToolParams::paper(crate::annotate::ToolKind::Mt);
        assert!(applies(&mt, &doc, head, None, 0.5));
    }

    /// The window's edges: numbers exactly 100 words apart are related, 101 are not; and two
    /// numbers on either side of a third must be within 100 numbers of each other too.
    #[test]
    fn the_arithmetic_window_includes_its_edge() {
        // "12" is word 3, "42" word 8 + n: 100 words apart for n = 95.
        let text = |n: usize| {
            format!(
                "He had 12 apples{} and 30 more, 42 in all.",
                " word".repeat(n)
            )
        };
        assert!(shows_arithmetic(&text(95)));
        assert!(!shows_arithmetic(&text(96)));
        // 42 = 12 + 30 with 12 and 30 200 numbers apart, each 100 from 42.
        let spread = format!("12;{}42;{}30", "7;".repeat(99), "7;".repeat(99));
        assert!(!shows_arithmetic(&spread));
        let close = format!("12;{}42;{}30", "7;".repeat(49), "7;".repeat(49));
        assert!(shows_arithmetic(&close));
    }

    /// "=" after a letter or "_" (a URL's query, a name) is no equation; a tab may come before
    /// the number.
    #[test]
    fn equals_signs_after_names_are_not_equations() {
        assert!(!shows_arithmetic("Set max_=3 in the file."));
        assert!(shows_arithmetic("x =\t5"));
    }

    /// Leading zeros are not significant: "0.3" (one digit) matches 1/3 only if exact.
    #[test]
    fn leading_zeros_are_not_significant_digits() {
        assert!(!shows_arithmetic("1 of 3 people, 0.3 of them, came."));
        assert!(shows_arithmetic("1 of 3 people, 0.33 of them, came."));
    }

    /// A number is not an operand twice: "24" is 12 + 12 only with a second "12".
    #[test]
    fn a_number_is_not_paired_with_itself() {
        assert!(!shows_arithmetic("Room 12 has 24 chairs."));
        assert!(shows_arithmetic("Rooms 12 and 12 have 24 chairs."));
    }

    /// A later number less an earlier one, rounded to the result's precision: 5 - 3.14 = 1.86
    /// reads as "1.9" (no other operation of the three gives one of them).
    #[test]
    fn a_rounded_difference_of_the_later_number_counts() {
        assert!(shows_arithmetic(
            "The score went from 3.14 to 5, a gain of 1.9."
        ));
    }

    /// A one-digit percentage is never matched by rounding, but an exact one counts: 1 of 20
    /// is 5%.
    #[test]
    fn an_exact_one_digit_percentage_counts() {
        assert!(shows_arithmetic("1 of 20 people, 5% of them, said so."));
        assert!(!shows_arithmetic("1 of 19 people, 5% of them, said so."));
    }
}
