//! The `toolsift score` file format: one request per JSONL line in, exactly one result line out per
//! input line, in order. A line that cannot be scored gets {"id", "line", "error"}; nothing is
//! dropped.
//!
//! Request lines are either text-level {"id", "text", "position" (byte offset), "tool", "input",
//! "result"} or token-level {"id", "text_ids", "position" (index of x_i), "call_ids",
//! "call_result_ids"}; both may carry "weights" (overriding the batch's) and "tau_f".

use std::io::{BufRead, Write};

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};

use super::text::TextHeads;
use super::{validate, CallForm, ScoreOptions, Scorer, Scores, TextCandidate, TokenCandidate};
use crate::error::{Error, Result};
use crate::model::tokenizer::check_vocab;
use crate::model::Tokenizer;
use crate::util::json;
use crate::util::jsonl::{JsonlLines, Line};

/// Settings of a `score` run.
#[derive(Debug, Clone)]
pub struct JsonlOptions {
    /// Placement and loss weights of every line; a line's own "weights" replace the latter.
    pub score: ScoreOptions,
    /// How a text-level line's call is written into tokens (token-level lines carry theirs).
    pub call_form: CallForm,
    /// Default filter threshold; a line may carry its own "tau_f".
    pub tau_f: f64,
    /// Lines scored together in one batch (bounds memory for huge inputs).
    pub chunk_lines: usize,
    /// Input lines an earlier run's output already answers (`util::jsonl::resume_point`): read
    /// past, not scored or written; the lines after them keep their numbers.
    pub skip_lines: usize,
    /// Why there is no tokenizer when the model folder's tokenizer.json failed to load
    /// (`Model::load_deferring_tokenizer`): each text-level line is refused with it. None: the
    /// folder has no tokenizer.json (or the tokenizer is given).
    pub tokenizer_error: Option<String>,
}

impl Default for JsonlOptions {
    fn default() -> Self {
        JsonlOptions {
            score: ScoreOptions::default(),
            call_form: CallForm::default(),
            tau_f: 1.0,
            chunk_lines: 4096,
            skip_lines: 0,
            tokenizer_error: None,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JsonlSummary {
    /// Input lines answered by this run, one output line each (the `skip_lines` not counted).
    pub lines: usize,
    /// Lines answered with scores (finite losses).
    pub scored: usize,
    /// Lines answered with an error line instead: `lines = scored + failed`.
    pub failed: usize,
    /// Scored lines whose call was kept at their tau_f (`Scores::kept`).
    pub kept: usize,
}

/// A token-level line. Keys other than these (and "id", "tau_f", read before) are refused: a
/// misspelled "weights" would otherwise be scored with the default weights, silently.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenLine {
    text_ids: Vec<u32>,
    position: usize,
    call_ids: Vec<u32>,
    call_result_ids: Vec<u32>,
    #[serde(default)]
    weights: Option<Vec<f64>>,
    #[serde(default, rename = "id")]
    _id: IgnoredAny,
    #[serde(default, rename = "tau_f")]
    _tau_f: IgnoredAny,
}

/// A text-level line; other keys are refused as for `TokenLine`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextLine {
    text: String,
    position: usize,
    tool: String,
    input: String,
    result: String,
    #[serde(default)]
    weights: Option<Vec<f64>>,
    #[serde(default, rename = "id")]
    _id: IgnoredAny,
    #[serde(default, rename = "tau_f")]
    _tau_f: IgnoredAny,
}

/// A parsed line: its id (echoed back as given), threshold, and the candidate or why there is none.
struct Parsed {
    id: Value,
    tau_f: f64,
    candidate: std::result::Result<TokenCandidate, String>,
}

/// Scores every line of `input`, writing one line per input line to `output`.
pub fn score_jsonl(
    input: impl BufRead,
    mut output: impl Write,
    scorer: &dyn Scorer,
    tokenizer: Option<&Tokenizer>,
    options: &JsonlOptions,
) -> Result<JsonlSummary> {
    let mut summary = JsonlSummary::default();
    let mut chunk: Vec<Line> = Vec::new();
    let out_err = |e: std::io::Error| Error::io("<output>", e);
    let mut lines = JsonlLines::new(input);
    lines.skip_answered(options.skip_lines)?;
    loop {
        // An input that fails to read mid-chunk: the lines read before it are still scored and
        // written, then the run stops.
        let read_error = lines.next_chunk(options.chunk_lines, &mut chunk);
        if chunk.is_empty() && read_error.is_none() {
            break;
        }
        let mut parsed = parse_chunk(&chunk, scorer, tokenizer, options);
        // A backend error (a lost device, out of memory) stops the run: named by the chunk's
        // lines, which the output does not hold yet (`--resume` starts at the first).
        let placed = |e: Error| match (chunk.first(), chunk.last()) {
            (Some((first, _)), Some((last, _))) => {
                e.context(format!("scoring input lines {first}-{last}"))
            }
            _ => e,
        };
        // Through `Scorer::score`, so that a scorer's own `score` or `variant_losses` runs; a
        // scorer's own refusal of one candidate (beyond `validate`) is its line's answer, and
        // the rest are scored again without it (`score_or_refuse`).
        let valid: Vec<(usize, TokenCandidate)> = parsed
            .iter()
            .enumerate()
            .filter_map(|(k, p)| Some((k, p.candidate.as_ref().ok()?.clone())))
            .collect();
        let mut scores: Vec<Option<Scores>> = vec![None; parsed.len()];
        for (k, answer) in super::score_or_refuse(scorer, valid, &options.score).map_err(placed)? {
            match answer {
                Ok(s) => scores[k] = Some(s),
                Err(e) => {
                    // A refusal: its reason, without the batch index the line replaces.
                    let why = match e {
                        Error::Candidate { reason, .. } => reason.to_string(),
                        e => e.to_string(),
                    };
                    parsed[k].candidate = Err(format!("line {}: {why}", chunk[k].0));
                }
            }
        }
        for (k, ((line_no, _), p)) in chunk.iter().zip(parsed).enumerate() {
            summary.lines += 1;
            // A valid line's scores, or why the line has none (a non-finite loss too).
            let scored = p.candidate.and_then(|_| {
                let s = scores[k]
                    .take()
                    .expect("one score per valid line, counted above");
                match s.not_finite() {
                    None => Ok(s),
                    Some(why) => Err(format!("line {line_no}: {why}")),
                }
            });
            let value = match scored {
                Ok(s) => {
                    let kept = s.kept(p.tau_f);
                    summary.scored += 1;
                    summary.kept += kept as usize;
                    json!({
                        "id": p.id, "line": line_no, "l_none": s.l_none, "l_call": s.l_call,
                        "l_call_result": s.l_call_result, "l_minus": s.l_minus,
                        "l_plus": s.l_plus, "delta": s.delta, "kept": kept,
                    })
                }
                Err(e) => {
                    summary.failed += 1;
                    json!({"id": p.id, "line": line_no, "error": e})
                }
            };
            writeln!(output, "{value}").map_err(out_err)?;
        }
        // A chunk's rows go out as a whole: a pipeline's next stage sees them now, and a run
        // killed later has them in its output for `--resume`.
        output.flush().map_err(out_err)?;
        if let Some(e) = read_error {
            return Err(e);
        }
    }
    Ok(summary)
}

fn parse_chunk(
    chunk: &[Line],
    scorer: &dyn Scorer,
    tokenizer: Option<&Tokenizer>,
    options: &JsonlOptions,
) -> Vec<Parsed> {
    // Candidates of one text share its tokenization.
    let mut texts = TextHeads::within(scorer.config().n_positions);
    chunk
        .iter()
        .map(|(line_no, line)| {
            let mut parsed = Parsed {
                id: Value::Null,
                tau_f: options.tau_f,
                candidate: Err(String::new()),
            };
            parsed.candidate = line
                .as_deref()
                .map_err(String::clone)
                .and_then(|line| {
                    parse_line(line, tokenizer, options, &mut texts, &mut parsed).and_then(
                        |(c, text_level)| {
                            if text_level {
                                // Ids no line wrote: the tokenizer's, not the line's, fault.
                                for ids in [&c.text_ids[..], &c.call_ids, &c.call_result_ids] {
                                    check_vocab(ids, scorer.config().vocab_size)?;
                                }
                            }
                            Ok(c)
                        },
                    )
                })
                .and_then(|c| {
                    validate(&c, scorer.config(), &options.score).map_err(|e| e.to_string())?;
                    Ok(c)
                })
                .map_err(|e| format!("line {line_no}: {e}"));
            parsed
        })
        .collect()
}

/// The candidate of one input line, and whether it was text-level (its ids are the
/// tokenizer's); `parsed` takes the line's id and tau_f as they are read.
fn parse_line(
    line: &str,
    tokenizer: Option<&Tokenizer>,
    options: &JsonlOptions,
    texts: &mut TextHeads,
    parsed: &mut Parsed,
) -> std::result::Result<(TokenCandidate, bool), String> {
    // A key neither line kind has is refused by name, without its value ever being built.
    let (token_fields, text_fields) = (
        json::struct_fields::<TokenLine>(),
        json::struct_fields::<TextLine>(),
    );
    let reads = |key: &str| token_fields.contains(&key) || text_fields.contains(&key);
    let (value, duplicate) =
        json::parse_line_reading(line, reads).map_err(|e| e.message("malformed JSON"))?;
    let Value::Object(obj) = value else {
        return Err(format!(
            "expected a JSON object, got {}",
            json::value_kind(&value)
        ));
    };
    // The id is echoed unless it is the key held twice (or holds one): which would it be?
    if !json::field_holds_duplicate(line, "id", duplicate.as_ref()) {
        parsed.id = obj.get("id").cloned().unwrap_or(Value::Null);
    }
    if let Some(n) = json::first_inexact_number(&parsed.id) {
        // An integer past 64 bits, at any depth, is read as a float and would come back as
        // another number (18446744073709551617 as 1.8446744073709552e19), so two ids could
        // collide.
        let message = if parsed.id.is_number() {
            format!("\"id\" {n} is not an integer in the 64-bit range (use a string id)")
        } else {
            format!(
                "\"id\" holds the number {n}, not an integer in the 64-bit range, which would be \
                 echoed changed (use a string there)"
            )
        };
        parsed.id = Value::Null;
        return Err(message);
    }
    if let Some(d) = duplicate {
        // Refused as an unknown key is: one of the two would be ignored, silently.
        return Err(d.to_string());
    }
    if let Some(t) = obj.get("tau_f") {
        parsed.tau_f = t
            .as_f64()
            .ok_or_else(|| format!("tau_f must be a number, got {t}"))?;
    }
    if obj.contains_key("text_ids") && obj.contains_key("text") {
        // Scoring one would silently ignore the other's fields.
        return Err(
            "a line is token-level (\"text_ids\") or text-level (\"text\"), not both".into(),
        );
    }
    if obj.contains_key("text_ids") {
        let t: TokenLine =
            json::from_object(obj).map_err(|e| format!("bad token-level line: {e}"))?;
        let c = TokenCandidate {
            text_ids: t.text_ids.into(),
            position: t.position,
            call_ids: t.call_ids,
            call_result_ids: t.call_result_ids,
            weights: t.weights,
        };
        Ok((c, false))
    } else if obj.contains_key("text") {
        let t: TextLine =
            json::from_object(obj).map_err(|e| format!("bad text-level line: {e}"))?;
        let tokenizer = tokenizer.ok_or_else(|| match &options.tokenizer_error {
            Some(e) => format!("text-level line, but the model's tokenizer did not load: {e}"),
            None => "text-level line, but the model folder has no tokenizer.json".into(),
        })?;
        // Only the head of the text the candidate reads is tokenized (a position past the text
        // is refused before anything is, and before its head is kept for later lines). A later
        // candidate of the same text that reads further tokenizes a longer head.
        let text = TextCandidate {
            text: t.text.into(),
            position: t.position,
            tool: t.tool,
            input: t.input,
            result: t.result,
            weights: t.weights,
        };
        let weights = text.weights(&options.score);
        let c = texts
            .tokens_for(
                tokenizer,
                &text,
                weights,
                options.score.placement,
                options.call_form,
            )
            .map_err(|e| e.to_string())?
            .map_err(|reason| reason.to_string())?;
        Ok((c, true))
    } else {
        Err(
            "neither a token-level line (\"text_ids\", ...) nor a text-level line (\"text\", ...)"
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line's echoed id and its error (the token-level ones need no tokenizer; a text-level
    /// one's fields are read before the tokenizer is asked for).
    fn error(line: &str) -> (Value, String) {
        let mut parsed = Parsed {
            id: Value::Null,
            tau_f: 1.0,
            candidate: Err(String::new()),
        };
        let options = JsonlOptions::default();
        let Err(e) = parse_line(line, None, &options, &mut TextHeads::default(), &mut parsed)
        else {
            panic!("{line}: scored");
        };
        (parsed.id, e)
    }

    const TOKENS: &str =
        r#""text_ids": [1, 2, 3], "position": 1, "call_ids": [4], "call_result_ids": [5]"#;
    const TEXT: &str = r#""text": "a b", "position": 1, "tool": "T", "input": "1", "result": "2""#;

    #[test]
    fn a_key_held_twice_is_refused_naming_it() {
        for (line, id, want) in [
            (
                format!(r#"{{"id": "a", {TEXT}, "text": ""}}"#),
                Value::from("a"),
                "duplicate key \"text\"",
            ),
            (
                format!(r#"{{"id": 7, {TOKENS}, "weights": [1], "weights": [0]}}"#),
                Value::from(7),
                "duplicate key \"weights\"",
            ),
            (
                format!(r#"{{"id": 7, {TOKENS}, "tau_f": 0, "tau_f": 9}}"#),
                Value::from(7),
                "duplicate key \"tau_f\"",
            ),
            (
                format!(r#"{{"id": {{"k": 1, "k": 2}}, {TOKENS}}}"#),
                Value::Null,
                "duplicate key \"k\" in id",
            ),
            // Which id would it be? None is echoed.
            (
                format!(r#"{{"id": "a", {TOKENS}, "id": "b"}}"#),
                Value::Null,
                "duplicate key \"id\"",
            ),
            // Not even behind an earlier duplicate in a field the line should not have,
            (
                format!(r#"{{"x": {{"k": 1, "k": 2}}, "id": "a", {TOKENS}, "id": "b"}}"#),
                Value::Null,
                "duplicate key \"id\"",
            ),
            // nor behind one in a field read, which is the one named.
            (
                format!(r#"{{"weights": [1], "weights": [0], "id": "a", {TOKENS}, "id": "b"}}"#),
                Value::Null,
                "duplicate key \"weights\"",
            ),
        ] {
            assert_eq!(error(&line), (id, want.to_string()), "{line}");
        }
        // An id that could not come back exactly, at any depth, is still not echoed.
        for bad in [
            "1.5",
            "18446744073709551617",
            r#"{"n": 18446744073709551617}"#,
            "[1, [12345678901234567890123]]",
            r#"{"a": "x", "b": [0.25]}"#,
        ] {
            let (id, e) = error(&format!(r#"{{"id": {bad}, {TOKENS}, "position": 2}}"#));
            assert_eq!(id, Value::Null, "{bad}");
            assert!(e.contains("64-bit range"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let with = |fields: &str, key: &str, value: &str| {
            let mut v: serde_json::Map<String, Value> =
                serde_json::from_str(&format!("{{\"id\": \"x\", {fields}}}")).unwrap();
            v.insert(key.into(), serde_json::from_str(value).unwrap());
            error(&Value::Object(v).to_string())
        };
        for (fields, key, value, want) in [
            (
                TEXT,
                "position",
                r#""33""#,
                r#"bad text-level line: field "position": invalid type: string "33", expected usize"#,
            ),
            (
                TEXT,
                "result",
                "null",
                r#"bad text-level line: field "result": invalid type: null, expected a string"#,
            ),
            (
                TOKENS,
                "call_ids",
                "[1, -2]",
                r#"bad token-level line: field "call_ids[1]": invalid value: integer `-2`, expected u32"#,
            ),
            (
                TOKENS,
                "weights",
                r#"{"a": 1}"#,
                r#"bad token-level line: field "weights": invalid type: map, expected a sequence"#,
            ),
        ] {
            assert_eq!(
                with(fields, key, value),
                (Value::from("x"), want.to_string())
            );
        }
        // Errors about the line as a whole are serde's, as before.
        let (_, e) = error(r#"{"text_ids": [1, 2], "position": 1, "call_ids": [3]}"#);
        assert_eq!(e, "bad token-level line: missing field `call_result_ids`");
        let (_, e) = error(&format!(r#"{{{TOKENS}, "wieghts": [1]}}"#));
        assert!(
            e.starts_with("bad token-level line: unknown field `wieghts`"),
            "{e}"
        );
    }

    #[test]
    fn a_blank_line_is_called_one() {
        for line in ["", "  ", "\t"] {
            assert_eq!(error(line), (Value::Null, "blank line".to_string()));
        }
        let (_, e) = error("{\"id\": 1,");
        assert!(e.starts_with("malformed JSON: EOF while parsing"), "{e}");
    }

    /// A "tau_f" that is not a number is the line's error, not the run's default threshold.
    #[test]
    fn a_tau_f_that_is_not_a_number_is_refused() {
        for bad in [r#""0.5""#, "null", "[1]", "true", r#"{"t":1}"#] {
            let (id, e) = error(&format!(r#"{{"id": 3, {TOKENS}, "tau_f": {bad}}}"#));
            assert_eq!(id, Value::from(3), "{bad}");
            assert_eq!(e, format!("tau_f must be a number, got {bad}"));
        }
    }
}
