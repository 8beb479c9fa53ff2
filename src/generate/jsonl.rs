//! The `toolsift generate` file format: one prompt per JSONL line in, exactly one line out per
//! input line, in order.
//!
//! In: {"id", "prompt"}, optionally "date" and "url" (passed to the tools as the document's).
//! Out: {"id", "line", "completion", "calls": [{"position", "tool", "input", "result",
//! "status"}], "finish"}, or {"id", "line", "error"} for a line that cannot be generated from
//! ("line": the 1-based input line answered). "id" is echoed
//! as given: a string or an integer of at most 64 bits (null when absent or null). A line is a
//! JSON object; any other id (a float, an integer beyond 64 bits, which would come back as a
//! float, a boolean, an array or an object) makes that line an error line with id null, as
//! annotate rejects such a document.

use std::io::{BufRead, Write};

use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    check_close, generate_batch, prepare, CallTokens, Finish, GenerateOptions, Generation, Job,
    Prompt,
};
use crate::annotate::tools::ToolRegistry;
use crate::error::{Error, Result};
use crate::model::Tokenizer;
use crate::sample::Decoder;
use crate::util::json;
use crate::util::jsonl::JsonlLines;

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenerateSummary {
    /// Input lines answered by this call (lines skipped by a resumed run not counted).
    pub lines: usize,
    /// Of those, the lines answered with a completion.
    pub generated: usize,
    /// Of those, the lines answered with an error line (unusable line or prompt, failed batch).
    pub failed: usize,
    /// Calls started in the completions, whatever their status.
    pub calls: usize,
    /// Of those, the calls executed with a result (`CallStatus::Ok`).
    pub calls_ok: usize,
    /// Of those, the calls with a result spliced in, whole (`Ok`) or cut off where the
    /// completion reached its length cap (`Unfinished` with a result).
    pub calls_with_result: usize,
}

/// Other keys (e.g. an expected answer) are ignored.
#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    id: Value,
    prompt: String,
    #[serde(default)]
    date: Option<String>,
    #[serde(default)]
    url: Option<String>,
}

/// Generates a completion for every line of `input`, writing one line per input line to
/// `output`. Lines are read `options.batch_size` at a time. A batch whose prompts cannot be
/// generated from gets an error line per prompt, and the run goes on; a backend or I/O error
/// (`Error::Backend`, `Error::Io`: a lost device, out of memory) stops the run, naming the
/// batch's input lines, with every earlier batch written.
pub fn generate_jsonl(
    input: impl BufRead,
    output: impl Write,
    decoder: &dyn Decoder,
    tokenizer: &Tokenizer,
    tools: &ToolRegistry,
    options: &GenerateOptions,
) -> Result<GenerateSummary> {
    generate_jsonl_after(0, input, output, decoder, tokenizer, tools, options)
}

/// `generate_jsonl` for a resumed run: the first `skip_lines` input lines, which an earlier
/// run's output already answers (`util::jsonl::resume_point`), are read past; the lines after
/// them keep their numbers, and so their sampling streams.
pub fn generate_jsonl_after(
    skip_lines: usize,
    input: impl BufRead,
    mut output: impl Write,
    decoder: &dyn Decoder,
    tokenizer: &Tokenizer,
    tools: &ToolRegistry,
    options: &GenerateOptions,
) -> Result<GenerateSummary> {
    options.check()?;
    check_close(tokenizer, options)?;
    let tokens = CallTokens::from_tokenizer(tokenizer);
    let mut summary = GenerateSummary::default();
    let out_err = |e: std::io::Error| Error::io("<output>", e);
    let mut lines = JsonlLines::new(input);
    lines.skip_answered(skip_lines)?;
    let mut read = Vec::new();
    let mut chunk: Vec<(usize, String)> = Vec::new();
    let mut parsed: Vec<ParsedLine> = Vec::new();
    loop {
        // An input that fails to read mid-batch: the lines read before it are still generated
        // and written, then the run stops.
        let read_error = lines.next_chunk(options.batch_size, &mut read);
        if read.is_empty() && read_error.is_none() {
            break;
        }
        chunk.clear();
        parsed.clear();
        for (line_no, text) in read.drain(..) {
            // (id, prompt or why not)
            parsed.push(match &text {
                Ok(text) => parse_line(text, tokenizer, options, line_no),
                Err(why) => (Value::Null, Err(format!("line {line_no}: {why}"))),
            });
            chunk.push((line_no - 1, text.unwrap_or_default()));
        }
        let jobs: Vec<Job<'_>> = parsed
            .iter()
            .zip(&chunk)
            .filter_map(|((_, p), (k, _))| {
                p.as_ref().ok().map(|(prompt, ids)| Job {
                    ids: ids.clone(),
                    stream: *k,
                    prompt,
                })
            })
            .collect();
        let generated: std::result::Result<Vec<Generation>, String> =
            match generate_batch(decoder, tokenizer, &tokens, tools, &jobs, options) {
                Ok(g) => Ok(g),
                // The decoder or the files failed, not these prompts (a lost device, out of
                // memory): stop, naming the batch's lines, as `score` does; every earlier
                // batch is written, and `--resume` starts at this one's first line rather
                // than keeping error lines that a rerun could answer.
                Err(e @ (Error::Backend(_) | Error::OutOfMemory(_) | Error::Io { .. })) => {
                    output.flush().map_err(out_err)?;
                    let lines = match (chunk.first(), chunk.last()) {
                        (Some((first, _)), Some((last, _))) => {
                            format!("generating input lines {}-{}", first + 1, last + 1)
                        }
                        _ => "generating".to_string(),
                    };
                    return Err(e.context(lines));
                }
                Err(e) => Err(format!("generation failed: {e}")),
            };
        let mut generations = generated.as_ref().ok().map(|g| g.iter());
        for ((id, p), (k, _)) in parsed.iter().zip(&chunk) {
            summary.lines += 1;
            let line_no = k + 1;
            let value = match (p, &mut generations, &generated) {
                (Err(e), _, _) => {
                    summary.failed += 1;
                    json!({"id": id, "line": line_no, "error": e})
                }
                (Ok(_), Some(gens), _) => match gens.next().expect("one generation per line") {
                    g if g.finish == Finish::NotFinite => {
                        summary.failed += 1;
                        let error = format!(
                            "line {line_no}: the model's next-token scores are not finite (NaN \
                             or +inf) after {} completion tokens: the model overflowed",
                            g.tokens.len()
                        );
                        json!({"id": id, "line": line_no, "error": error})
                    }
                    g => {
                        summary.generated += 1;
                        summary.calls += g.calls.len();
                        summary.calls_ok += g
                            .calls
                            .iter()
                            .filter(|c| c.status == super::CallStatus::Ok)
                            .count();
                        summary.calls_with_result +=
                            g.calls.iter().filter(|c| !c.result.is_empty()).count();
                        json!({"id": id, "line": line_no, "completion": g.completion,
                           "calls": g.calls, "finish": g.finish})
                    }
                },
                (Ok(_), None, Err(e)) => {
                    summary.failed += 1;
                    json!({"id": id, "line": line_no, "error": e})
                }
                (Ok(_), None, Ok(_)) => unreachable!("generations exist when generation succeeded"),
            };
            writeln!(output, "{value}").map_err(out_err)?;
        }
        // A batch's rows go out as a whole, as `score`'s chunks do.
        output.flush().map_err(out_err)?;
        if let Some(e) = read_error {
            return Err(e);
        }
    }
    Ok(summary)
}

type ParsedLine = (Value, std::result::Result<(Prompt, Vec<u32>), String>);

fn parse_line(
    line: &str,
    tokenizer: &Tokenizer,
    options: &GenerateOptions,
    line_no: usize,
) -> ParsedLine {
    let (id, fields) = read_fields(line, line_no);
    let parsed = fields.and_then(|l| {
        let ids =
            prepare(tokenizer, &l.prompt, options).map_err(|e| format!("line {line_no}: {e}"))?;
        let doc_id = match &l.id {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        Ok((
            Prompt {
                text: l.prompt,
                id: doc_id,
                url: l.url,
                date: l.date,
            },
            ids,
        ))
    });
    (id, parsed)
}

/// The id to echo and the line's fields, or why the line has none. The id is null unless it is
/// one that is echoed exactly (a string, or an integer within i64/u64).
fn read_fields(line: &str, line_no: usize) -> (Value, std::result::Result<Line, String>) {
    let fail = |message: String| (Value::Null, Err(format!("line {line_no}: {message}")));
    // Other keys are ignored: checked, never built.
    let fields = json::struct_fields::<Line>();
    let reads = |key: &str| fields.contains(&key);
    let (value, duplicate) = match json::parse_line_reading(line, reads) {
        Ok(v) => v,
        Err(e) => return fail(e.message("malformed JSON")),
    };
    // serde would fill the struct from an array by position ("[1, 2]": "invalid type: integer
    // `2`, expected a string"), which says nothing useful.
    let Value::Object(obj) = value else {
        return fail(format!(
            "expected a JSON object, got {}",
            json::value_kind(&value)
        ));
    };
    // Only ids that are echoed exactly: an integer beyond 64 bits is read as a float
    // (18446744073709551616 would come back as 1.8446744073709552e19), as annotate refuses.
    // An id held twice (or holding a key twice) is none of the two.
    let id = match obj
        .get("id")
        .filter(|_| !json::field_holds_duplicate(line, "id", duplicate.as_ref()))
    {
        None | Some(Value::Null) => Value::Null,
        Some(v @ Value::String(_)) => v.clone(),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n.clone()),
        Some(Value::Number(_)) => {
            return fail(
                "field \"id\" is not an integer in the 64-bit range (use a string id)".into(),
            )
        }
        Some(_) => return fail("field \"id\" is not a string or an integer".into()),
    };
    if let Some(d) = duplicate {
        // One of the two would be ignored, silently.
        return (id, Err(format!("line {line_no}: {d}")));
    }
    let fields = json::from_object::<Line>(obj).map_err(|e| format!("line {line_no}: {e}"));
    (id, fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(line: &str) -> (Value, String) {
        let (id, fields) = read_fields(line, 3);
        (id, fields.err().expect("an error line"))
    }

    #[test]
    fn a_line_must_be_an_object() {
        for (line, kind) in [
            ("[1,2]", "an array"),
            (r#"["a", "b"]"#, "an array"),
            ("7", "a number"),
            (r#""prompt""#, "a string"),
            ("null", "null"),
        ] {
            let (id, e) = error(line);
            assert_eq!(id, Value::Null);
            assert_eq!(
                e,
                format!("line 3: expected a JSON object, got {kind}"),
                "{line}"
            );
        }
    }

    #[test]
    fn ids_are_echoed_exactly_or_refused() {
        let id = |line: &str| {
            let (id, fields) = read_fields(line, 1);
            if let Err(e) = &fields {
                panic!("{line}: {e}");
            }
            id
        };
        assert_eq!(id(r#"{"id": "x", "prompt": "p"}"#), Value::from("x"));
        assert_eq!(id(r#"{"prompt": "p"}"#), Value::Null);
        assert_eq!(id(r#"{"id": null, "prompt": "p"}"#), Value::Null);
        assert_eq!(id(r#"{"id": -7, "prompt": "p"}"#), Value::from(-7i64));
        let max = id(r#"{"id": 18446744073709551615, "prompt": "p"}"#);
        assert_eq!(max.to_string(), "18446744073709551615");
        let min = id(r#"{"id": -9223372036854775808, "prompt": "p"}"#);
        assert_eq!(min.to_string(), "-9223372036854775808");
        for line in [
            r#"{"id": 18446744073709551616, "prompt": "p"}"#,
            r#"{"id": -9223372036854775809, "prompt": "p"}"#,
            r#"{"id": 1.5, "prompt": "p"}"#,
            r#"{"id": 1e2, "prompt": "p"}"#,
        ] {
            let (id, e) = error(line);
            assert_eq!(id, Value::Null, "{line}");
            assert!(
                e.starts_with("line 3: ") && e.contains("\"id\"") && e.contains("64-bit"),
                "{line}: {e}"
            );
        }
        for line in [
            r#"{"id": true, "prompt": "p"}"#,
            r#"{"id": [1], "prompt": "p"}"#,
            r#"{"id": {"a": 1}, "prompt": "p"}"#,
        ] {
            let (id, e) = error(line);
            assert_eq!(id, Value::Null, "{line}");
            assert!(e.contains("not a string or an integer"), "{line}: {e}");
        }
        // Other errors still echo a valid id.
        let (id, fields) = read_fields(r#"{"id": 8}"#, 1);
        assert_eq!(id, Value::from(8));
        assert!(fields.err().unwrap().contains("prompt"));
    }

    #[test]
    fn a_key_held_twice_is_refused_naming_it() {
        for (line, id, want) in [
            (
                r#"{"id": "a", "prompt": "p", "prompt": ""}"#,
                Value::from("a"),
                r#"line 3: duplicate key "prompt""#,
            ),
            (
                r#"{"id": 4, "prompt": "p", "answer": 1, "answer": 2}"#,
                Value::from(4),
                r#"line 3: duplicate key "answer""#,
            ),
            (
                r#"{"id": 4, "prompt": "p", "meta": [{"k": 1, "k": 1}]}"#,
                Value::from(4),
                r#"line 3: duplicate key "k" in meta[0]"#,
            ),
            // Which id would it be? None is echoed.
            (
                r#"{"id": "a", "prompt": "p", "id": "b"}"#,
                Value::Null,
                r#"line 3: duplicate key "id""#,
            ),
            // Not even behind an earlier duplicate in a field no line has,
            (
                r#"{"meta": {"k": 1, "k": 1}, "id": "a", "prompt": "p", "id": "b"}"#,
                Value::Null,
                r#"line 3: duplicate key "id""#,
            ),
            // nor behind one in a field read, which is the one named.
            (
                r#"{"prompt": "p", "prompt": "q", "id": "a", "id": "b"}"#,
                Value::Null,
                r#"line 3: duplicate key "prompt""#,
            ),
        ] {
            assert_eq!(error(line), (id, want.to_string()), "{line}");
        }
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        for (line, want) in [
            (
                r#"{"id": "a", "prompt": 5}"#,
                r#"line 3: field "prompt": invalid type: integer `5`, expected a string"#,
            ),
            (
                r#"{"id": "a", "prompt": "p", "date": 5}"#,
                r#"line 3: field "date": invalid type: integer `5`, expected a string"#,
            ),
            (
                r#"{"id": "a", "prompt": "p", "url": [1]}"#,
                r#"line 3: field "url": invalid type: sequence, expected a string"#,
            ),
            (r#"{"id": "a"}"#, "line 3: missing field `prompt`"),
        ] {
            assert_eq!(error(line), (Value::from("a"), want.to_string()), "{line}");
        }
        // Null is an absent date or URL; other keys are ignored.
        let (_, fields) = read_fields(r#"{"prompt": "p", "date": null, "x": [1]}"#, 1);
        let l = fields.unwrap();
        assert_eq!((l.prompt.as_str(), l.date, l.url), ("p", None, None));
    }

    #[test]
    fn a_blank_line_is_called_one() {
        for line in ["", " ", "\t "] {
            assert_eq!(error(line), (Value::Null, "line 3: blank line".to_string()));
        }
        let (_, e) = error("{");
        assert!(
            e.starts_with("line 3: malformed JSON: EOF while parsing"),
            "{e}"
        );
    }
}
