//! A call as written: e(c, r) and e(c, eps) (`call_text`), where it goes in a text and with
//! what separator (`spaced_at`, `call_insert`, `splice`, shared by scoring and C*), and whether it
//! reads back as the call it is (`check_call`).

use super::shown;
use crate::error::{Error, Result};
use crate::score::{CallForm, Placement};

/// e(c, r) when `result` is `Some`, e(c, eps) in `form` otherwise.
pub fn call_text(tool: &str, input: &str, result: Option<&str>, form: CallForm) -> String {
    match (result, form) {
        (Some(r), _) => format!("[{tool}({input}) -> {r}]"),
        (None, CallForm::Arrow) => format!("[{tool}({input}) ->]"),
        (None, CallForm::Bare) => format!("[{tool}({input})]"),
    }
}

/// Whether `text` continues with whitespace at byte `at`: an inline call there goes before the
/// whitespace, as " [" ... "]" (`call_insert`). Scoring, sampling and the splice into C* must
/// agree on it, so all three ask here. False past the end or inside a character.
pub fn spaced_at(text: &str, at: usize) -> bool {
    text.get(at..)
        .is_some_and(|rest| rest.starts_with(char::is_whitespace))
}

/// The call as it is inserted for scoring under `placement`, separator included; `spaced`:
/// whether the text continues with whitespace where an inline call goes (`spaced_at`).
pub fn call_insert(call: &str, placement: Placement, spaced: bool) -> String {
    match placement {
        Placement::Prefix => format!("{call} "),
        Placement::Inline if spaced => format!(" {call}"),
        Placement::Inline => call.to_string(),
    }
}

/// `text` with `calls` (byte offset, call text) inserted, as C* writes kept calls and inline
/// placement scores them (`call_insert`): with a space in front where the text continues with
/// whitespace (`spaced_at`), alone elsewhere; several at one offset each stand as they would
/// alone, in the order given. Offsets must be character boundaries (past the end is the end).
/// The calls are stably ordered by offset. An offset is where the text is cut, the end of
/// x_{i-1}, which is also where x_i starts unless the tokenizer trims offsets (leaves a space out
/// of x_i's span); with such a tokenizer, pass the previous token's end, as annotate does, to get
/// the text a `TextCandidate` at x_i scored.
///
/// # Panics
/// On an offset inside a character (the offsets `to_tokens` and annotate's positions give are
/// token boundaries).
pub fn splice(text: &str, calls: &[(usize, String)]) -> String {
    let mut order: Vec<&(usize, String)> = calls.iter().collect();
    order.sort_by_key(|(b, _)| *b);
    let mut out =
        String::with_capacity(text.len() + calls.iter().map(|c| c.1.len() + 1).sum::<usize>());
    let mut at = 0;
    let mut k = 0;
    while k < order.len() {
        let b = order[k].0.min(text.len());
        out.push_str(&text[at..b]);
        at = b;
        let spaced = spaced_at(text, b);
        while k < order.len() && order[k].0.min(text.len()) == b {
            if spaced {
                out.push(' ');
            }
            out.push_str(&order[k].1);
            k += 1;
        }
    }
    out.push_str(&text[at..]);
    out
}

/// Whether `name` can be a tool's name in a call: one word of letters (any script), digits and
/// "_". What annotate's parser accepts, custom tool names and `check_call` share this rule.
pub fn is_call_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Refuses a call that would not read as "[Tool(input) -> result]" with these parts: a tool
/// name that is empty or not one word of letters, digits and "_" (`annotate::calls::parse_call`'s
/// rule), an input that reader would read otherwise (leading or trailing whitespace, an arrow,
/// unbalanced parentheses), a result that is empty or has leading or trailing whitespace, or a
/// "[" or "]" in the input or the result. Exactly what annotate's parser accepts, with a result
/// as annotate cleans it (`annotate::calls::cleaned_answer`), passes.
pub fn check_call(tool: &str, input: &str, result: &str) -> Result<()> {
    if tool.is_empty() {
        return Err(Error::input("tool name is empty"));
    }
    if !is_call_name(tool) {
        return Err(Error::input(format!(
            "tool name {} is not one word of letters, digits and \"_\"",
            shown(tool)
        )));
    }
    // What `annotate::calls::parse_call` would read differently: it trims the input, ends it
    // at an arrow, and takes the ")" that closes the call from the parentheses' nesting.
    if input.trim() != input {
        return Err(Error::input(format!(
            "input {} has leading or trailing whitespace, which a call's reader trims",
            shown(input)
        )));
    }
    if input.contains("->") || input.contains('→') {
        return Err(Error::input(format!(
            "input {} contains an arrow, which would end the call's input when it is read",
            shown(input)
        )));
    }
    if !balanced(input) {
        return Err(Error::input(format!(
            "input {} has unbalanced parentheses, so the call's \")\" could not be told from \
             the input's",
            shown(input)
        )));
    }
    // annotate's results are cleaned (`annotate::calls::cleaned_answer`): never empty, never
    // padded. An empty one would make e(c, r) "[T(x) -> ]" (in the arrow form, e(c, eps) plus a
    // space), so delta would measure no result; a padded one would score spaces a C* line never
    // holds.
    if result.is_empty() {
        return Err(Error::input(
            "result is empty: e(c, r) would hold no result (\"[Tool(input) -> ]\"), so delta \
             would measure no result",
        ));
    }
    if result.trim() != result {
        return Err(Error::input(format!(
            "result {} has leading or trailing whitespace, which annotate's results never have",
            shown(result)
        )));
    }
    for (field, value) in [("input", input), ("result", result)] {
        if let Some(bracket) = value.chars().find(|&c| c == '[' || c == ']') {
            return Err(Error::input(format!(
                "{field} {} contains {:?}, which would {} the call",
                shown(value),
                bracket.to_string(),
                if bracket == ']' {
                    "end"
                } else {
                    "nest a call in"
                }
            )));
        }
    }
    Ok(())
}

/// Whether every "(" of `s` is closed by a later ")" and every ")" closes one.
pub(crate) fn balanced(s: &str) -> bool {
    let mut depth = 0usize;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => {}
        }
    }
    depth == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_forms() {
        assert_eq!(
            call_text("Calculator", "400 / 1400", Some("0.29"), CallForm::Arrow),
            "[Calculator(400 / 1400) -> 0.29]"
        );
        assert_eq!(
            call_text("Calculator", "400 / 1400", None, CallForm::Arrow),
            "[Calculator(400 / 1400) ->]"
        );
        assert_eq!(
            call_text("Calculator", "400 / 1400", None, CallForm::Bare),
            "[Calculator(400 / 1400)]"
        );
    }

    fn refusal(tool: &str, input: &str, result: &str) -> String {
        match check_call(tool, input, result) {
            Err(Error::Input(msg)) => msg,
            other => panic!("{tool:?} {input:?} {result:?}: {other:?}"),
        }
    }

    #[test]
    fn an_empty_or_padded_result_is_refused() {
        assert!(refusal("Calculator", "1 + 2", "").starts_with("result is empty"));
        for padded in [" 3", "3 ", "3\n", "\t3"] {
            let msg = refusal("Calculator", "1 + 2", padded);
            assert!(
                msg.starts_with(&format!(
                    "result {padded:?} has leading or trailing whitespace"
                )),
                "{msg}"
            );
        }
        assert!(check_call("Calculator", "1 + 2", "3 and 4").is_ok());
    }

    #[test]
    fn an_empty_tool_name_is_refused() {
        assert_eq!(refusal("", "1 + 2", "3"), "tool name is empty");
    }

    #[test]
    fn a_tool_name_that_is_not_one_word_is_refused() {
        for tool in [
            "Calc ulator",
            " Calculator",
            "Calculator\n",
            "Calc(",
            "Calc)",
            "Calc]",
            "Calc[",
            "Calc-1",
            "Calc.x",
        ] {
            let msg = refusal(tool, "1 + 2", "3");
            assert!(
                msg.starts_with(&format!("tool name {tool:?} is not one word")),
                "{msg}"
            );
        }
        // Letters of any script, digits and "_", as annotate's parser takes them.
        for tool in ["Calculator", "QA", "MT", "Wiki_Search2", "Überprüfer", "_"] {
            assert!(check_call(tool, "x", "y").is_ok(), "{tool}");
        }
    }

    #[test]
    fn brackets_in_the_input_are_refused() {
        let msg = refusal("QA", "What is [x]?", "y");
        assert_eq!(
            msg,
            "input \"What is [x]?\" contains \"[\", which would nest a call in the call"
        );
        let msg = refusal("QA", "a] b", "y");
        assert_eq!(
            msg,
            "input \"a] b\" contains \"]\", which would end the call"
        );
    }

    #[test]
    fn brackets_in_the_result_are_refused() {
        let msg = refusal("Calculator", "1 + 2", "3]");
        assert_eq!(
            msg,
            "result \"3]\" contains \"]\", which would end the call"
        );
        assert!(refusal("WikiSearch", "x", "see [1]").starts_with("result \"see [1]\""));
    }

    #[test]
    fn long_values_are_cut_in_refusals() {
        let long = format!("{}]", "a".repeat(500));
        let msg = refusal("QA", &long, "y");
        assert!(
            msg.starts_with(&format!(
                "input \"{}\"… (501 bytes) contains",
                "a".repeat(60)
            )),
            "{msg}"
        );
    }

    #[test]
    fn inputs_the_parser_would_read_otherwise_are_refused() {
        for (input, why) in [
            (" 25 * 12", "leading or trailing whitespace"),
            ("25 * 12\n", "leading or trailing whitespace"),
            ("25) -> (12", "contains an arrow"),
            ("25 → 12", "contains an arrow"),
            ("(25 * 12", "unbalanced parentheses"),
            ("25) * (12", "unbalanced parentheses"),
        ] {
            let msg = refusal("Calculator", input, "300");
            assert!(msg.contains(why), "{input:?}: {msg}");
        }
    }

    // Held to annotate's parser (the driver's module).
    #[cfg(feature = "annotate")]
    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// `check_call` passes exactly the calls that annotate's parser reads back as the same
        /// tool and input.
        #[test]
        fn check_call_passes_exactly_what_reads_back(
            tool in "[a-zA-Z_ é]{0,4}",
            input in "[-a-z0-9()>→\\[\\] \n]{0,10}",
        ) {
            use crate::annotate::calls::parse_call;
            let call = call_text(&tool, &input, Some("3"), CallForm::Arrow);
            let reads_back = parse_call(&call[1..]) == Ok((tool.clone(), input.clone()));
            proptest::prop_assert_eq!(check_call(&tool, &input, "3").is_ok(), reads_back);
        }
    }

    /// Several calls at one offset before whitespace each stand as they would alone: each with
    /// its space in front, in the order given (not only the first).
    #[test]
    fn calls_at_one_spaced_offset_each_get_their_space() {
        let calls = [(5, "[A() -> 1]".to_string()), (5, "[B() -> 2]".to_string())];
        assert_eq!(
            splice("is 42 Next", &calls),
            "is 42 [A() -> 1] [B() -> 2] Next"
        );
    }

    /// A long value is cut after 60 characters, not 60 bytes: a value of 2-byte characters
    /// shows 60 of them (a byte cut would show 30, or fall inside a character).
    #[test]
    fn long_values_are_cut_after_60_characters_not_bytes() {
        let long = format!("{}]", "é".repeat(100));
        let msg = refusal("QA", &long, "y");
        assert!(
            msg.starts_with(&format!(
                "input \"{}\"… (201 bytes) contains",
                "é".repeat(60)
            )),
            "{msg}"
        );
    }
}
