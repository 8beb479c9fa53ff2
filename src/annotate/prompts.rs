//! The annotation prompts P(x), one per tool, in the paper's format (Schick et al. 2023, App. A.2):
//! an instruction, a few "Input: ... / Output: ..." examples where the output is the input with
//! calls written "[Tool(input)]", and "Input: {x}\nOutput: " for the text to annotate. The
//! examples are our own but for the first Calendar one, which is the paper's. They are
//! deliberately short and two per tool: P(x) contains x twice (once as the input, once
//! as the continuation being scored), and it all has to fit in n_positions.
//!
//! A config may replace any prompt (`[per_tool.<tool>] prompt = "..."`); "{x}" marks the text.

use super::tool_kind::ToolKind;

const CALCULATOR: &str = "Your task is to add calls to a Calculator API to a piece of text. \
The calls should help you get information required to complete the text. You can call the API by \
writing \"[Calculator(expression)]\" where \"expression\" is the expression to be computed. \
Here are some examples of API calls:
Input: The bus fare rose from 40 to 50 cents, an increase of 25%.
Output: The bus fare rose from 40 to 50 cents, an increase of [Calculator((50 - 40) / 40)] 25%.
Input: Of 120 guests, 30 left early, so 90 stayed.
Output: Of 120 guests, 30 left early, so [Calculator(120 - 30)] 90 stayed.
Input: {x}
Output: ";

const CALENDAR: &str = "Your task is to add calls to a Calendar API to a piece of text. \
The API call should help you get information required to complete the text. You can call the API \
by writing \"[Calendar()]\". Here are some examples of API calls:
Input: Today is the first Friday of the year.
Output: Today is the first [Calendar()] Friday of the year.
Input: The deadline is in three days, on Monday.
Output: The deadline is in three days, on [Calendar()] Monday.
Input: {x}
Output: ";

const WIKISEARCH: &str = "Your task is to complete a given piece of text. You can use a \
Wikipedia Search API to look up information. You can do so by writing \"[WikiSearch(term)]\" \
where \"term\" is the search term you want to look up. Here are some examples of API calls:
Input: The Eiffel Tower was completed in 1889.
Output: The Eiffel Tower was completed in [WikiSearch(Eiffel Tower construction)] 1889.
Input: Marie Curie was born in Warsaw.
Output: Marie Curie was born in [WikiSearch(Marie Curie birthplace)] Warsaw.
Input: {x}
Output: ";

const QA: &str = "Your task is to add calls to a Question Answering API to a piece of text. \
The questions should help you get information required to complete the text. You can call the \
API by writing \"[QA(question)]\" where \"question\" is the question you want to ask. Here are \
some examples of API calls:
Input: The capital of Kenya is Nairobi.
Output: The capital of Kenya is [QA(What is the capital of Kenya?)] Nairobi.
Input: Water boils at 100 degrees Celsius.
Output: Water boils at [QA(At what temperature does water boil?)] 100 degrees Celsius.
Input: {x}
Output: ";

const MT: &str = "Your task is to complete a given piece of text by using a Machine Translation \
API. You can do so by writing \"[MT(text)]\" where \"text\" is the text to be translated into \
English. Here are some examples of API calls:
Input: He said \"merci beaucoup\", which means thank you very much.
Output: He said \"merci beaucoup\", which means [MT(merci beaucoup)] thank you very much.
Input: The sign read \"Ausgang\", the exit.
Output: The sign read \"Ausgang\", [MT(Ausgang)] the exit.
Input: {x}
Output: ";

/// The built-in prompt of `tool`.
pub fn default_prompt(tool: ToolKind) -> &'static str {
    match tool {
        ToolKind::Calculator => CALCULATOR,
        ToolKind::Calendar => CALENDAR,
        ToolKind::WikiSearch => WIKISEARCH,
        ToolKind::Qa => QA,
        ToolKind::Mt => MT,
    }
}

/// The prompt split around "{x}": (before, after). The config validated that "{x}" occurs once.
pub fn split(prompt: &str) -> (&str, &str) {
    prompt.split_once("{x}").unwrap_or((prompt, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prompt_has_the_papers_shape() {
        for tool in ToolKind::ALL {
            let p = default_prompt(tool);
            assert_eq!(p.matches("{x}").count(), 1, "{tool:?}");
            assert!(p.ends_with("Input: {x}\nOutput: "), "{tool:?}");
            let call = format!("[{}(", tool.call_name());
            assert!(
                p.matches(&call).count() >= 3,
                "{tool:?}: examples use {call}"
            );
        }
    }

    /// Each example's output is its input with calls added ("[Tool(input)] " before a word),
    /// and a Calculator call computes the number after it (in percent before a "%"): an example
    /// with a wrong call teaches the model to propose wrong calls.
    #[test]
    fn the_examples_are_their_inputs_with_correct_calls() {
        use crate::annotate::tools::{evaluate, format_result};
        for tool in ToolKind::ALL {
            let (head, _) = split(default_prompt(tool));
            let lines: Vec<&str> = head.lines().collect();
            let mut examples = 0;
            for pair in lines.windows(2) {
                let (Some(input), Some(output)) = (
                    pair[0].strip_prefix("Input: "),
                    pair[1].strip_prefix("Output: "),
                ) else {
                    continue;
                };
                examples += 1;
                let (mut plain, mut rest) = (String::new(), output);
                while let Some(open) = rest.find('[') {
                    plain.push_str(&rest[..open]);
                    let close = open + rest[open..].find("] ").expect("a call ends in \"] \"");
                    let call = &rest[open + 1..close];
                    rest = &rest[close + 2..];
                    let args = call
                        .strip_prefix(tool.call_name())
                        .and_then(|c| c.strip_prefix('('))
                        .and_then(|c| c.strip_suffix(')'))
                        .unwrap_or_else(|| panic!("{tool:?}: {call} is not a call of it"));
                    if tool == ToolKind::Calculator {
                        let number: String = rest
                            .chars()
                            .take_while(|c| c.is_ascii_digit() || *c == '.')
                            .collect();
                        let percent = rest[number.len()..].starts_with('%');
                        let expr = if percent {
                            format!("({args}) * 100")
                        } else {
                            args.into()
                        };
                        assert_eq!(format_result(evaluate(&expr).unwrap()), number, "{call}");
                    }
                }
                plain.push_str(rest);
                assert_eq!(plain, input, "{tool:?}");
            }
            assert_eq!(examples, 2, "{tool:?}");
        }
    }
}
