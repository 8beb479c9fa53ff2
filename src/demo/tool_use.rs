//! Does the demo model use its tools while it writes? `toolsift generate`'s loop on arithmetic
//! prompts from the demo generator, with tools and without, on the same prompts.
//!
//! A prompt is an arithmetic document cut right before a calculator site ("Out of 540 voters,
//! 108 (or"); the answer is the number the document writes there ("20"). A completion answers
//! correctly when its first number outside any call ("[...]"), with its sign, equals it. "With
//! tools" is the paper's setting (a call may start when "[" is within the top 10, at most one
//! call); "without" disables calls (`max_calls` 0: the openers are never written), as the
//! paper's "Toolformer (disabled)".

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::annotate::tool_kind::ToolKind;
use crate::annotate::tools::ToolRegistry;
use crate::error::Result;
use crate::generate::{generate, GenerateOptions, Generation, Prompt};
use crate::model::tokenizer::Tokenizer;
use crate::sample::Decoder;

use super::corpus::{number_after, DemoDoc};

/// One prompt and the number that should follow it.
#[derive(Debug, Clone)]
pub struct ArithmeticPrompt {
    /// The document's text up to the site, without the space before the answer; id
    /// `<document id>#<k>` (its k-th calculator site), and the document's date.
    pub prompt: Prompt,
    /// The number the document writes at the site, as written ("20").
    pub answer: String,
}

/// Every calculator site of `docs` as a prompt: the text up to the site (before its space).
pub fn arithmetic_prompts(docs: &[DemoDoc]) -> Vec<ArithmeticPrompt> {
    docs.iter()
        .flat_map(|doc| {
            doc.sites
                .iter()
                .filter(|s| s.tool == ToolKind::Calculator)
                .enumerate()
                .map(move |(k, s)| ArithmeticPrompt {
                    prompt: Prompt {
                        text: doc.text[..s.offset].to_string(),
                        id: format!("{}#{k}", doc.id),
                        url: None,
                        date: Some(doc.date.to_string()),
                    },
                    answer: s.answer.clone(),
                })
        })
        .collect()
}

/// The first number of `completion` outside calls: "[...]" spans (an unclosed "[" runs to the
/// end) are skipped. A "-" right before it is its sign ("-5" is not 5), unless a letter or
/// digit comes before the "-" (a hyphen: "A-5").
pub fn answer_in(completion: &str) -> Option<f64> {
    let mut outside = String::with_capacity(completion.len());
    let mut depth = 0usize;
    for c in completion.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => {
                depth -= 1;
                outside.push(' ');
            }
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    let start = outside.find(|c: char| c.is_ascii_digit())?;
    let value = number_after(&outside, start)?;
    let mut before = outside[..start].chars().rev();
    let signed = before.next() == Some('-') && !before.next().is_some_and(char::is_alphanumeric);
    Some(if signed { -value } else { value })
}

/// Correct answers with and without tools, on the same prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolUseReport {
    /// Prompts, each generated once with tools and once without.
    pub prompts: usize,
    /// Completions with tools whose first number outside calls is the answer.
    pub correct_with_tools: usize,
    /// The same with calls disabled (`max_calls` 0).
    pub correct_without_tools: usize,
    /// Completions (with tools) that made a call.
    pub calls_made: usize,
    /// Completions (with tools) with a call that returned a non-empty result.
    pub calls_with_result: usize,
    /// correct_with_tools / prompts (None, null in JSON, without prompts, as the other
    /// metrics without a value).
    pub accuracy_with_tools: Option<f64>,
    /// correct_without_tools / prompts (None without prompts).
    pub accuracy_without_tools: Option<f64>,
    /// Wall seconds of both generation passes and the counting.
    pub secs: f64,
    /// A few completions with tools, for the eye: (prompt, completion, answer).
    pub examples: Vec<(String, String, String)>,
}

impl ToolUseReport {
    /// The line `eval-demo` prints under its table (newline-terminated).
    pub fn render(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.3}"));
        format!(
            "tool use (generate, greedy, same {} arithmetic prompts): with tools {}/{} correct \
             ({}; {} made a call, {} got a result), without tools {}/{} ({}); {:.1} s\n",
            self.prompts,
            self.correct_with_tools,
            self.prompts,
            pct(self.accuracy_with_tools),
            self.calls_made,
            self.calls_with_result,
            self.correct_without_tools,
            self.prompts,
            pct(self.accuracy_without_tools),
            self.secs
        )
    }
}

fn correct(gen: &Generation, answer: &str) -> bool {
    match (answer_in(&gen.completion), answer.parse::<f64>()) {
        (Some(got), Ok(want)) => (got - want).abs() < 1e-9,
        _ => false,
    }
}

/// The two settings `compare` generates with, greedy and up to 40 new tokens within the
/// model's `n_positions`: the paper's (a call may start when "[" is within the top 10, at most
/// one call) and the same with calls disabled (`max_calls` 0).
fn settings(n_positions: usize) -> (GenerateOptions, GenerateOptions) {
    let with = GenerateOptions {
        max_new_tokens: 40,
        top_k_call: 10,
        max_calls: 1,
        temperature: 0.0,
        n_positions: Some(n_positions),
        ..GenerateOptions::default()
    };
    let without = GenerateOptions {
        max_calls: 0,
        ..with.clone()
    };
    (with, without)
}

/// Generates every prompt twice (tools on, tools off) with greedy decoding and counts correct
/// answers.
pub fn compare(
    decoder: &dyn Decoder,
    tokenizer: &Tokenizer,
    tools: &ToolRegistry,
    prompts: &[ArithmeticPrompt],
    n_positions: usize,
) -> Result<ToolUseReport> {
    let start = Instant::now();
    let texts: Vec<Prompt> = prompts.iter().map(|p| p.prompt.clone()).collect();
    let (with, without) = settings(n_positions);
    let gens_with = generate(decoder, tokenizer, tools, &texts, &with)?;
    let gens_without = generate(decoder, tokenizer, tools, &texts, &without)?;
    Ok(tally(prompts, &gens_with, &gens_without, start))
}

/// `compare`'s report from its two passes' completions (each in `prompts`' order), timed from
/// `start`.
fn tally(
    prompts: &[ArithmeticPrompt],
    gens_with: &[Generation],
    gens_without: &[Generation],
    start: Instant,
) -> ToolUseReport {
    let n = prompts.len();
    let count = |gens: &[Generation]| {
        gens.iter()
            .zip(prompts)
            .filter(|(g, p)| correct(g, &p.answer))
            .count()
    };
    let (cw, cwo) = (count(gens_with), count(gens_without));
    let ratio = |c: usize| (n > 0).then(|| c as f64 / n as f64);
    ToolUseReport {
        prompts: n,
        correct_with_tools: cw,
        correct_without_tools: cwo,
        calls_made: gens_with.iter().filter(|g| !g.calls.is_empty()).count(),
        calls_with_result: gens_with
            .iter()
            .filter(|g| g.calls.iter().any(|c| !c.result.is_empty()))
            .count(),
        accuracy_with_tools: ratio(cw),
        accuracy_without_tools: ratio(cwo),
        secs: start.elapsed().as_secs_f64(),
        examples: gens_with
            .iter()
            .zip(prompts)
            .take(3)
            .map(|(g, p)| {
                (
                    p.prompt.text.clone(),
                    g.completion.clone(),
                    p.answer.clone(),
                )
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::corpus::{generate as generate_docs, DocKind};

    /// No prompts (a set without calculator sites): no accuracy, as the other metrics without
    /// a value, not 0/0 = 0.
    #[test]
    fn no_prompts_is_no_accuracy() {
        let report = ToolUseReport {
            prompts: 0,
            correct_with_tools: 0,
            correct_without_tools: 0,
            calls_made: 0,
            calls_with_result: 0,
            accuracy_with_tools: None,
            accuracy_without_tools: None,
            secs: 0.0,
            examples: Vec::new(),
        };
        let text = report.render();
        assert!(
            text.contains("0/0 correct (n/a;") && text.contains("0/0 (n/a)"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert!(json["accuracy_with_tools"].is_null(), "{json}");
    }

    #[test]
    fn answers_skip_calls() {
        assert_eq!(
            answer_in(" [Calculator(108 / 540 * 100) -> 20] 20%)"),
            Some(20.0)
        );
        assert_eq!(answer_in(" 45%) stayed."), Some(45.0));
        assert_eq!(answer_in(" [Calculator(3 + 4) -> 7]"), None);
        assert_eq!(answer_in(" [Calculator(3 + 4"), None);
        assert_eq!(answer_in(" so 12.5 each"), Some(12.5));
        assert_eq!(answer_in(" none"), None);
    }

    #[test]
    fn prompts_stop_before_the_answer() {
        let docs = generate_docs(4, 100);
        let prompts = arithmetic_prompts(&docs);
        let sites: usize = docs
            .iter()
            .filter(|d| d.kind == DocKind::Arithmetic)
            .map(|d| d.sites.len())
            .sum();
        assert_eq!(prompts.len(), sites);
        for p in &prompts {
            assert!(!p.prompt.text.ends_with(' '));
            assert!(p.answer.parse::<f64>().is_ok());
        }
    }

    /// A prompt's id is its document's and the 0-based index of the calculator site it stops
    /// at, and it carries the document's date.
    #[test]
    fn prompts_are_named_by_document_and_site_and_dated() {
        let docs = generate_docs(4, 100);
        let two = docs
            .iter()
            .find(|d| d.sites.len() == 2)
            .expect("a document with two sites");
        let prompts = arithmetic_prompts(std::slice::from_ref(two));
        let ids: Vec<&str> = prompts.iter().map(|p| p.prompt.id.as_str()).collect();
        assert_eq!(ids, [format!("{}#0", two.id), format!("{}#1", two.id)]);
        for p in &prompts {
            assert_eq!(p.prompt.date, Some(two.date.to_string()));
        }
    }

    /// Outside calls, a "]" with no call open is text, and a call splits what is around it:
    /// "12[...]5" answers 12, not 125.
    #[test]
    fn a_stray_bracket_is_text_and_a_call_separates_numbers() {
        assert_eq!(answer_in("] 5"), Some(5.0));
        assert_eq!(answer_in("12[Calculator(3 + 4) -> 7]5"), Some(12.0));
    }

    /// A completion is correct when its number equals the answer (as numbers: "20.0" is "20"),
    /// not when it is near it.
    #[test]
    fn correct_means_the_same_number() {
        let gen = |completion: &str| Generation {
            completion: completion.into(),
            calls: Vec::new(),
            finish: crate::generate::Finish::Eos,
            tokens: Vec::new(),
            token_log_probs: Vec::new(),
        };
        assert!(correct(&gen(" 20%)"), "20"));
        assert!(correct(&gen(" 20.0%)"), "20"));
        assert!(!correct(&gen(" 20.25%)"), "20"));
        assert!(!correct(&gen(" 19%)"), "20"));
    }

    /// Each count of the report is printed in its own place.
    #[test]
    fn the_line_prints_each_count_in_its_place() {
        let report = ToolUseReport {
            prompts: 10,
            correct_with_tools: 9,
            correct_without_tools: 2,
            calls_made: 8,
            calls_with_result: 7,
            accuracy_with_tools: Some(0.9),
            accuracy_without_tools: Some(0.2),
            secs: 1.25,
            examples: Vec::new(),
        };
        assert_eq!(
            report.render(),
            "tool use (generate, greedy, same 10 arithmetic prompts): with tools 9/10 correct \
             (0.900; 8 made a call, 7 got a result), without tools 2/10 (0.200); 1.2 s\n"
        );
    }

    /// `compare` on the demo model: tools help (calls are disabled in the second pass), a call
    /// whose tool is not registered gets no result and is not counted as one, and no prompts
    /// give no accuracy.
    #[test]
    fn compare_on_the_demo_model() {
        let parent = tempfile::tempdir().unwrap();
        let model = crate::Model::load(crate::demo::assets::materialize_in(parent.path()).unwrap())
            .unwrap();
        let tokenizer = model.tokenizer().unwrap();
        let engine = crate::cpu::CpuScorer::new(&model);
        let n_positions = model.config().n_positions;
        let prompts: Vec<_> = arithmetic_prompts(&generate_docs(crate::demo::EVAL_SEED, 20))
            .into_iter()
            .take(4)
            .collect();
        let mut calculator = ToolRegistry::new();
        calculator.register(crate::annotate::tools::Calculator::new());
        let r = compare(&engine, tokenizer, &calculator, &prompts, n_positions).unwrap();
        assert_eq!(r.prompts, 4);
        assert!(
            r.calls_made > 0 && r.calls_with_result == r.calls_made,
            "{r:?}"
        );
        assert!(r.correct_with_tools > r.correct_without_tools, "{r:?}");
        let r = compare(
            &engine,
            tokenizer,
            &ToolRegistry::new(),
            &prompts,
            n_positions,
        )
        .unwrap();
        assert!(r.calls_made > 0 && r.calls_with_result == 0, "{r:?}");
        let r = compare(&engine, tokenizer, &calculator, &[], n_positions).unwrap();
        assert_eq!(
            (r.prompts, r.accuracy_with_tools, r.accuracy_without_tools),
            (0, None, None)
        );
    }

    /// Calls nest: what is inside a call's inner "[...]" and after it, up to the call's own
    /// "]", is still inside the call.
    #[test]
    fn a_nested_call_is_skipped_to_its_own_close() {
        assert_eq!(answer_in("[a[1]2] 5"), Some(5.0));
    }

    /// A minus sign belongs to the answer: a completion "-20" does not answer 20. A hyphen after
    /// a word or a number is not a sign.
    #[test]
    fn a_minus_sign_is_part_of_the_answer() {
        assert_eq!(answer_in(" -20 voters"), Some(-20.0));
        assert_eq!(answer_in("-3.5"), Some(-3.5));
        assert_eq!(answer_in(" [Calculator(1 - 2) -> -1] -1 left"), Some(-1.0));
        assert_eq!(answer_in(" A-5 won"), Some(5.0));
        assert_eq!(answer_in(" 2016-2020"), Some(2016.0));
        let twenty = Generation {
            completion: " -20".into(),
            ..generation("", &[])
        };
        assert!(!correct(&twenty, "20"));
        assert!(correct(&twenty, "-20"));
    }

    /// With tools is the paper's setting (greedy, a call when "[" is within the top 10, at most
    /// one call), without is the same with calls disabled; both stop at 40 new tokens and at
    /// the model's `n_positions`.
    #[test]
    fn the_two_settings_are_the_papers_and_calls_disabled() {
        let (with, without) = settings(77);
        assert_eq!(
            (with.top_k_call, with.max_calls, with.max_new_tokens),
            (10, 1, 40)
        );
        assert_eq!((with.temperature, with.n_positions), (0.0, Some(77)));
        assert_eq!(without.max_calls, 0);
        let back = GenerateOptions {
            max_calls: 1,
            ..without.clone()
        };
        assert_eq!(back, with);
    }

    fn prompt(text: &str, answer: &str) -> ArithmeticPrompt {
        ArithmeticPrompt {
            prompt: Prompt {
                text: text.into(),
                id: text.into(),
                url: None,
                date: None,
            },
            answer: answer.into(),
        }
    }

    fn generation(completion: &str, results: &[&str]) -> Generation {
        Generation {
            completion: completion.into(),
            calls: results
                .iter()
                .map(|r| crate::generate::CallRecord {
                    position: 0,
                    tool: "Calculator".into(),
                    input: String::new(),
                    result: r.to_string(),
                    status: crate::generate::CallStatus::Ok,
                    error: None,
                })
                .collect(),
            finish: crate::generate::Finish::Eos,
            tokens: Vec::new(),
            token_log_probs: Vec::new(),
        }
    }

    /// Each pass is counted on its own completions against its own prompt; a completion
    /// without a call neither made one nor got a result; the rates are over all prompts; the
    /// examples are the first three prompts' completions with tools, as (prompt, completion,
    /// answer).
    #[test]
    fn the_tally_counts_each_pass_against_its_prompts() {
        let prompts: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .zip(["1", "2", "3", "4"])
            .map(|(t, a)| prompt(t, a))
            .collect();
        let with = [
            generation(" [C() -> 1] 1", &["1"]),
            generation(" [C() ->] 2", &[""]),
            generation(" 3", &[]),
            generation(" 9", &[]),
        ];
        let without = [
            generation(" 1", &[]),
            generation(" 7", &[]),
            generation(" 7", &[]),
            generation(" 7", &[]),
        ];
        let r = tally(&prompts, &with, &without, Instant::now());
        assert_eq!(
            (r.prompts, r.correct_with_tools, r.correct_without_tools),
            (4, 3, 1)
        );
        assert_eq!((r.calls_made, r.calls_with_result), (2, 1));
        assert_eq!(
            (r.accuracy_with_tools, r.accuracy_without_tools),
            (Some(0.75), Some(0.25))
        );
        let examples: Vec<(&str, &str, &str)> = r
            .examples
            .iter()
            .map(|(p, c, a)| (p.as_str(), c.as_str(), a.as_str()))
            .collect();
        assert_eq!(
            examples,
            [
                ("a", " [C() -> 1] 1", "1"),
                ("b", " [C() ->] 2", "2"),
                ("c", " 3", "3")
            ]
        );
    }
}
