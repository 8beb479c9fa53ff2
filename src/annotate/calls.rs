//! Sampled calls: what the model wrote after "[" up to "]", parsed as "Tool(input)".
//!
//! Accepted: optional whitespace, a tool name (letters, digits, "_"), "(", the input, a ")"
//! (the first one followed by an arrow if there is one, else the last one before "]"), then
//! nothing or an arrow ("->" or "→" and anything up to "]", which is ignored:
//! the result always comes from the tool). The input is trimmed and must not contain "[" (a
//! nested call), an arrow (`generate`, and a model trained on C*, end a call's input at its
//! first arrow) or unbalanced parentheses (once a result follows, such a call would not read
//! back as the same call). Everything else is malformed: no "]" before the length cap, no "(",
//! no ")", text after ")", an empty or odd tool name; and (`input_problem`) an input with a line
//! break or a special token's text.

use super::tools::ToolError;
use crate::score::text::is_call_name;

/// Why a sample is not a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// No "]" within the length cap.
    Unterminated,
    /// Not of the form Tool(input).
    Syntax(String),
}

/// (tool, input) of a continuation of "[", e.g. "Calculator(400 / 1400)]".
pub fn parse_call(continuation: &str) -> Result<(String, String), Malformed> {
    let Some((body, _)) = continuation.split_once(']') else {
        return Err(Malformed::Unterminated);
    };
    let body = body.trim_start();
    let Some((name, rest)) = body.split_once('(') else {
        return Err(Malformed::Syntax("no \"(\"".into()));
    };
    let name = name.trim_end();
    if !is_call_name(name) {
        return Err(Malformed::Syntax(format!("bad tool name {name:?}")));
    }
    // The input ends at the first ")" that closes the call's "(" and is followed by an arrow (a
    // result written by the model may contain parentheses too), else at the last ")" (an input
    // may contain balanced parentheses; an arrow in it is refused below).
    let Some(close) = closing_paren_before_arrow(rest).or_else(|| rest.rfind(')')) else {
        return Err(Malformed::Syntax("no \")\"".into()));
    };
    let after = rest[close + 1..].trim();
    if !(after.is_empty() || starts_with_arrow(after)) {
        return Err(Malformed::Syntax(format!("text after \")\": {after:?}")));
    }
    let input = rest[..close].trim();
    if input.contains('[') {
        return Err(Malformed::Syntax("nested call".into()));
    }
    if input.contains("->") || input.contains('→') {
        return Err(Malformed::Syntax(
            "an arrow in the input (a generated call ends its input at the first arrow)".into(),
        ));
    }
    if !balanced(input) {
        return Err(Malformed::Syntax(
            "unbalanced parentheses in the input".into(),
        ));
    }
    Ok((name.to_string(), input.to_string()))
}

// Defined beside `check_call`, which refuses what this parser could not read back.
pub(crate) use crate::score::text::balanced;

/// The first ")" of `rest` at nesting depth 0 (it closes the call's "(") followed, after
/// optional whitespace, by an arrow.
fn closing_paren_before_arrow(rest: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth > 0 => depth -= 1,
            ')' if starts_with_arrow(rest[i + 1..].trim_start()) => return Some(i),
            _ => {}
        }
    }
    None
}

fn starts_with_arrow(s: &str) -> bool {
    s.starts_with("->") || s.starts_with('→')
}

/// Why a call's input cannot go to a tool as written, if it cannot: a line break (a
/// line-oriented tool reads only the first line, while C* would show the whole input before its
/// answer) or the text of one of the tokenizer's special tokens (`special`: it would be
/// tokenized as that token inside the call, an end of text in the middle of C*).
pub fn input_problem(input: &str, special: &[String]) -> Option<String> {
    if input.contains(['\n', '\r']) {
        return Some("a line break in the input".into());
    }
    special
        .iter()
        .find(|s| !s.is_empty() && input.contains(s.as_str()))
        .map(|s| format!("the special token {s:?} in the input"))
}

/// Whether a call at byte `at` of `text` only copies what the text says later: its input is
/// found after `at` and not before (`[per_tool.<tool>] drop_lookahead_inputs`, the paper's
/// post-filter for MT). Such a call "translates" the very words that follow it, so its result
/// lowers their loss by leaking them, not by helping. An empty input, or an `at` that is not a
/// character boundary of `text`, is never lookahead.
pub fn input_only_ahead(text: &str, at: usize, input: &str) -> bool {
    let input = input.trim();
    match (text.get(..at), text.get(at..)) {
        (Some(before), Some(after)) if !input.is_empty() => {
            after.contains(input) && !before.contains(input)
        }
        _ => false,
    }
}

/// A tool's result made safe to splice: the text of the tokenizer's special tokens (`special`,
/// e.g. "<|endoftext|>") is removed, since it would be tokenized as that token (an end of text
/// in the middle of the sequence); control characters become spaces and whitespace runs one
/// space; "[" and "]" become "(" and ")" so that the call stays parsable; and it is trimmed.
pub fn clean_result(result: &str, special: &[String]) -> String {
    // One pass, the longest special token at each place first; each becomes a space (the
    // halves around it cannot join into another one).
    let mut spaced = String::with_capacity(result.len());
    let mut rest = result;
    while let Some(c) = rest.chars().next() {
        let token = special
            .iter()
            .filter(|s| !s.is_empty() && rest.starts_with(s.as_str()))
            .max_by_key(|s| s.len());
        let skip = match token {
            Some(s) => {
                spaced.push(' ');
                s.len()
            }
            None => {
                // A control character (NUL, ESC, ...) is no text to train on: a space.
                spaced.push(if c.is_control() { ' ' } else { c });
                c.len_utf8()
            }
        };
        rest = &rest[skip..];
    }
    spaced
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('[', "(")
        .replace(']', ")")
}

/// A tool's answer as it is spliced: `clean_result`'s text, or a failure when cleaning leaves
/// nothing (special tokens and whitespace are no answer, as empty output is none).
pub fn cleaned_answer(
    answer: Result<String, ToolError>,
    special: &[String],
) -> Result<String, ToolError> {
    let text = clean_result(&answer?, special);
    if text.is_empty() {
        return Err(ToolError::Failed(
            "the answer is empty once special tokens and whitespace are removed".into(),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookahead_inputs_are_found_after_the_call_and_not_before() {
        let text = "Le chien dort. The dog sleeps, the dog dreams.";
        let at = text.find(" The").unwrap();
        assert!(input_only_ahead(text, at, "The dog sleeps"));
        assert!(input_only_ahead(text, at, " the dog "), "trimmed");
        // Whitespace the text lacks there: found only once trimmed.
        assert!(input_only_ahead(text, at, "The dog sleeps  "), "trimmed");
        // Seen before the call too, or not in the text at all: a real translation.
        assert!(!input_only_ahead(text, at, "Le chien"));
        assert!(
            !input_only_ahead(text, at, "chien dort. The"),
            "spans the call"
        );
        assert!(!input_only_ahead(text, at, "Der Hund"));
        let later = text.find(" the dog dreams").unwrap();
        assert!(!input_only_ahead(text, later, "dog"), "also before");
        assert!(!input_only_ahead(text, at, "  "));
        assert!(
            !input_only_ahead("café au lait", 4, "lait"),
            "not a boundary"
        );
        assert!(input_only_ahead("café au lait", 5, "lait"));
        assert!(!input_only_ahead(text, text.len() + 1, "dog"));
    }

    #[test]
    fn parses_calls() {
        let ok = |s: &str| parse_call(s).unwrap();
        assert_eq!(
            ok("Calculator(400 / 1400)]"),
            ("Calculator".into(), "400 / 1400".into())
        );
        assert_eq!(ok(" Calendar()] and more"), ("Calendar".into(), "".into()));
        // Whitespace between the name and "(" is skipped (docs/annotate.md, step 5).
        assert_eq!(
            ok("Calculator (1 + 2)]"),
            ("Calculator".into(), "1 + 2".into())
        );
        assert_eq!(
            ok("QA(What is (a)?) -> x]"),
            ("QA".into(), "What is (a)?".into())
        );
        assert_eq!(
            ok("QA(Who?) -> Paris (France)]"),
            ("QA".into(), "Who?".into())
        );
        assert_eq!(
            ok("Calculator(400 / 1400) -> 0.29 (29%)]"),
            ("Calculator".into(), "400 / 1400".into())
        );
        assert_eq!(
            ok("Calculator(400 / 1400)→ 0.29 (29%)]"),
            ("Calculator".into(), "400 / 1400".into())
        );
        assert_eq!(
            ok("Calculator((2 + 3) * 4)]"),
            ("Calculator".into(), "(2 + 3) * 4".into())
        );
        assert_eq!(
            ok("Calculator((2 + 3) * 4) -> 20]"),
            ("Calculator".into(), "(2 + 3) * 4".into())
        );
        assert_eq!(
            ok("Calculator((2 + 3) * 4) -> (20)]"),
            ("Calculator".into(), "(2 + 3) * 4".into())
        );
        assert_eq!(parse_call("Calculator(1+2"), Err(Malformed::Unterminated));
        for bad in [
            "Calculator 1+2]",
            "Calc(1+2]",
            "(1+2)]",
            "Calc(1) x]",
            "A b(1)]",
            "QA([x)]",
            // An arrow in the input: generation would end the input there ("What does f(x").
            "QA(What does f(x) -> y mean?)]",
            "QA(What does f(x) -> y mean?) -> a map (of sorts)]",
            "MT(a → b)]",
            // Unbalanced: "[WikiSearch(Paris (France) -> ... (and largest city) ...]" would not
            // read back.
            "WikiSearch(Paris (France)]",
            "Calculator(1+2))]",
            "QA(a ) ( b)]",
        ] {
            assert!(
                matches!(parse_call(bad), Err(Malformed::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn results_are_cleaned() {
        assert_eq!(clean_result(" a\n b [c] ", &[]), "a b (c)");
        assert_eq!(clean_result("a\0b\u{1b}[0m c\u{7f}", &[]), "a b (0m c");
        let eos = ["<|endoftext|>".to_string()];
        assert_eq!(clean_result("a<|endoftext|>b", &eos), "a b");
        // Replaced by a space, so the halves around it cannot join into another.
        assert_eq!(
            clean_result("<|endo<|endoftext|>ftext|> <|endoftext|>", &eos),
            "<|endo ftext|>"
        );
        // The longest special token at a place wins; a token that is a space cannot loop.
        let nested = ["<|a|>".to_string(), "<|a|>b".to_string(), " ".to_string()];
        assert_eq!(clean_result("x<|a|>by<|a|>z", &nested), "x y z");
        // Linear in the result's length (it used to rescan from the start per token).
        let many = "<|endoftext|>".repeat(200_000);
        assert_eq!(clean_result(&many, &eos), "");
    }

    #[test]
    fn answers_that_cleaning_empties_are_failures() {
        let eos = ["<|endoftext|>".to_string()];
        assert_eq!(cleaned_answer(Ok(" 4 ".into()), &eos), Ok("4".into()));
        assert!(matches!(
            cleaned_answer(Ok(" <|endoftext|>\n".into()), &eos),
            Err(ToolError::Failed(e)) if e.contains("empty")
        ));
        let failed = Err(ToolError::Failed("no hit".into()));
        assert_eq!(cleaned_answer(failed.clone(), &eos), failed);
    }

    #[test]
    fn inputs_with_line_breaks_or_special_tokens_are_refused() {
        let eos = ["<|endoftext|>".to_string()];
        assert_eq!(input_problem("Who is the president?", &eos), None);
        assert!(input_problem("Who is\nthe president?", &eos)
            .unwrap()
            .contains("line break"));
        assert!(input_problem("a\rb", &eos).unwrap().contains("line break"));
        // An empty special token is in every text: it must refuse nothing.
        assert_eq!(input_problem("Who rules?", &[String::new()]), None);
        assert!(input_problem("Who<|endoftext|>rules", &eos)
            .unwrap()
            .contains("<|endoftext|>"));
    }
}
