//! The token- and text-level rules of a call during generation (docs/generate.md):
//!
//! - which tokens open a call ("[" and " [", when each is one token of the vocabulary);
//! - when an opener counts as "within the top k" (its rank, ties broken towards the lowest id,
//!   exactly as `sample::draw` breaks them);
//! - how the text written after the opener is parsed once the arrow appears: `Tool(input) ->`.

use crate::model::Tokenizer;
use crate::score::text::is_call_name;

/// The special tokens of the loop, resolved once from the tokenizer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallTokens {
    /// Tokens that open a call: "[" and " [" (those of the two that are single tokens).
    pub openers: Vec<u32>,
    /// The end-of-text token ("<|endoftext|>"), if the vocabulary has one.
    pub eos: Option<u32>,
    /// The special tokens' texts, removed from tool results before they are spliced.
    pub special: Vec<String>,
}

impl CallTokens {
    /// Resolves the openers and the end-of-text token of `tokenizer`.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Self {
        let mut openers = Vec::new();
        for text in ["[", " ["] {
            if let Ok(ids) = tokenizer.encode_ids(text) {
                if let [id] = ids[..] {
                    if !openers.contains(&id) {
                        openers.push(id);
                    }
                }
            }
        }
        CallTokens {
            openers,
            eos: tokenizer.token_id("<|endoftext|>"),
            special: tokenizer.special_tokens(),
        }
    }

    /// Whether `token` opens a call.
    pub fn is_opener(&self, token: u32) -> bool {
        self.openers.contains(&token)
    }
}

/// Rank of `token` in `row` (0: the most likely): the number of tokens with a higher log-prob,
/// plus those with an equal one and a lower id (ties go to the lowest id, as in `sample::draw`).
/// A NaN log-prob ranks last.
pub fn rank(row: &[f32], token: u32) -> usize {
    let Some(&v) = row.get(token as usize) else {
        return usize::MAX;
    };
    if v.is_nan() {
        return usize::MAX;
    }
    row.iter()
        .enumerate()
        .filter(|&(i, &x)| x > v || (x == v && (i as u32) < token))
        .count()
}

/// The opener to force when one is within the top `k` of `row`: the best-ranked one.
pub fn opener_in_top_k(row: &[f32], openers: &[u32], k: usize) -> Option<u32> {
    openers
        .iter()
        .map(|&t| (rank(row, t), t))
        .filter(|&(r, _)| r < k)
        .min()
        .map(|(_, t)| t)
}

/// Splits the text between the opener and the arrow, `Tool(input)` with optional surrounding
/// whitespace, into (tool, input). The tool name is letters, digits and '_'
/// (`score::text::is_call_name`, annotate's rule, so that any tool annotate splices into C* can
/// be called here); the input is everything between the first "(" and the last ")", as written.
pub fn parse_call(head: &str) -> Option<(&str, &str)> {
    let head = head.trim();
    let inner = head.strip_suffix(')')?;
    let open = inner.find('(')?;
    let tool = inner[..open].trim();
    is_call_name(tool).then(|| (tool, &inner[open + 1..]))
}

/// `parse_call` for a call that did not end as `Tool(input) ->` (cut off, closed or given up
/// before its arrow, or not `Tool(input)` at it): what was decoded of it.
/// The tool once "Tool(" is decoded (a name without its "(" may still grow, "Calc" into
/// "Calculator", so it is no tool yet); the input is everything after the "(", as `parse_call`
/// would read it were the call closed there: a final ")" is taken as the call's, and a lone "-"
/// after it as the first half of an arrow ("-" ">" as two tokens).
pub fn parse_partial_call(head: &str) -> Option<(&str, &str)> {
    let head = head.trim();
    let head = match head.strip_suffix('-') {
        Some(before) if before.trim_end().ends_with(')') => before,
        _ => head,
    };
    if let Some(call) = parse_call(head) {
        return Some(call);
    }
    let (tool, input) = head.split_once('(')?;
    let tool = tool.trim();
    is_call_name(tool).then_some((tool, input))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_break_ties_to_the_lowest_id() {
        let row = [-1.0f32, -0.5, -0.5, -2.0, f32::NAN];
        assert_eq!(rank(&row, 1), 0);
        assert_eq!(rank(&row, 2), 1);
        assert_eq!(rank(&row, 0), 2);
        assert_eq!(rank(&row, 3), 3);
        assert_eq!(rank(&row, 4), usize::MAX);
        assert_eq!(rank(&row, 9), usize::MAX);
        assert_eq!(opener_in_top_k(&row, &[3, 0], 3), Some(0));
        assert_eq!(opener_in_top_k(&row, &[3, 0], 2), None);
        assert_eq!(opener_in_top_k(&row, &[2, 1], 1), Some(1));
        assert_eq!(opener_in_top_k(&row, &[2, 1], 0), None);
        // Both openers within the top k: the better-ranked one, whichever is listed first.
        assert_eq!(opener_in_top_k(&row, &[3, 0], 4), Some(0));
        assert_eq!(opener_in_top_k(&row, &[0, 2], 4), Some(2));
    }

    #[test]
    fn calls_parse() {
        assert_eq!(
            parse_call("Calculator(400 / 1400) "),
            Some(("Calculator", "400 / 1400"))
        );
        assert_eq!(
            parse_call(" QA(who (really)?)"),
            Some(("QA", "who (really)?"))
        );
        assert_eq!(parse_call("Calendar()"), Some(("Calendar", "")));
        assert_eq!(parse_call("Calculator(1+2"), None);
        assert_eq!(parse_call("(1+2)"), None);
        assert_eq!(parse_call("Two words(x)"), None);
        // Any name annotate can splice into C*, a custom tool's in any script included.
        assert_eq!(parse_call("Wétter(Paris)"), Some(("Wétter", "Paris")));
        assert_eq!(parse_call(""), None);
    }

    #[test]
    fn cut_calls_parse_as_far_as_they_go() {
        assert_eq!(
            parse_partial_call("Calculator(108"),
            Some(("Calculator", "108"))
        );
        assert_eq!(
            parse_partial_call(" Calculator(108 / 540 "),
            Some(("Calculator", "108 / 540"))
        );
        assert_eq!(parse_partial_call("Calculator("), Some(("Calculator", "")));
        assert_eq!(
            parse_partial_call("QA(who (really"),
            Some(("QA", "who (really"))
        );
        // A closed input, with or without the first half of an arrow.
        assert_eq!(
            parse_partial_call("Calculator(1+2)"),
            Some(("Calculator", "1+2"))
        );
        assert_eq!(
            parse_partial_call("Calculator(1+2) -"),
            Some(("Calculator", "1+2"))
        );
        // A "-" inside the input is the input's.
        assert_eq!(
            parse_partial_call("Calculator(5 -"),
            Some(("Calculator", "5 -"))
        );
        // No "(" yet: the name may still grow.
        assert_eq!(parse_partial_call("Calcu"), None);
        assert_eq!(parse_partial_call("Calculator"), None);
        assert_eq!(parse_partial_call(""), None);
        assert_eq!(parse_partial_call("Two words(x"), None);
        assert_eq!(parse_partial_call("(1+2"), None);
    }

    /// The input is as written between the first "(" and the last ")": its spaces kept, and
    /// a ")" of its own (a function's, or a group's) part of it.
    #[test]
    fn inputs_keep_their_spaces_and_inner_parentheses() {
        assert_eq!(
            parse_call("Calculator( 1 + 2 )"),
            Some(("Calculator", " 1 + 2 "))
        );
        assert_eq!(
            parse_call("Calculator(sqrt(4))"),
            Some(("Calculator", "sqrt(4)"))
        );
        assert_eq!(
            parse_call("Calculator((1 + 2))"),
            Some(("Calculator", "(1 + 2)"))
        );
    }
}
