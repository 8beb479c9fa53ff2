//! The `toolsift generate` file format: one prompt per JSONL line in, exactly one line out per
//! input line, in order.
//!
//! In: {"id", "prompt"}, optionally "date" and "url" (passed to the tools as the document's).
//! Out: {"id", "completion", "calls": [{"position", "tool", "input", "result", "status"}],
//! "finish"}, or {"id", "line", "error"} for a line that cannot be generated from. "id" is echoed
//! as given (any JSON value; null when absent).

use std::io::{BufRead, Write};

use serde::Deserialize;
use serde_json::{json, Value};

use super::{generate_batch, prepare, CallTokens, GenerateOptions, Generation, Job, Prompt};
use crate::annotate::tools::ToolRegistry;
use crate::error::{Error, Result};
use crate::model::Tokenizer;
use crate::sample::Decoder;
use crate::util::jsonl::JsonlLines;

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenerateSummary {
    pub lines: usize,
    pub generated: usize,
    pub failed: usize,
    /// Calls started, and those executed with a result.
    pub calls: usize,
    pub calls_ok: usize,
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
/// `output`. Lines are read `options.batch_size` at a time; a batch the decoder fails on gets an
/// error line per prompt, and the run goes on.
pub fn generate_jsonl(
    input: impl BufRead,
    mut output: impl Write,
    decoder: &dyn Decoder,
    tokenizer: &Tokenizer,
    tools: &ToolRegistry,
    options: &GenerateOptions,
) -> Result<GenerateSummary> {
    options.check()?;
    let tokens = CallTokens::from_tokenizer(tokenizer);
    let mut summary = GenerateSummary::default();
    let out_err = |e: std::io::Error| Error::io("<output>", e);
    let mut lines = JsonlLines::new(input);
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
            generate_batch(decoder, tokenizer, &tokens, tools, &jobs, options)
                .map_err(|e| format!("generation failed: {e}"));
        let mut generations = generated.as_ref().ok().map(|g| g.iter());
        for ((id, p), (k, _)) in parsed.iter().zip(&chunk) {
            summary.lines += 1;
            let line_no = k + 1;
            let value = match (p, &mut generations, &generated) {
                (Err(e), _, _) => {
                    summary.failed += 1;
                    json!({"id": id, "line": line_no, "error": e})
                }
                (Ok(_), Some(gens), _) => {
                    let g = gens.next().expect("one generation per valid line");
                    summary.generated += 1;
                    summary.calls += g.calls.len();
                    summary.calls_ok += g
                        .calls
                        .iter()
                        .filter(|c| c.status == super::CallStatus::Ok)
                        .count();
                    json!({"id": id, "completion": g.completion, "calls": g.calls,
                           "finish": g.finish})
                }
                (Ok(_), None, Err(e)) => {
                    summary.failed += 1;
                    json!({"id": id, "line": line_no, "error": e})
                }
                (Ok(_), None, Ok(_)) => unreachable!("generations exist when generation succeeded"),
            };
            writeln!(output, "{value}").map_err(out_err)?;
        }
        if let Some(e) = read_error {
            output.flush().map_err(out_err)?;
            return Err(e);
        }
    }
    output.flush().map_err(out_err)?;
    Ok(summary)
}

type ParsedLine = (Value, std::result::Result<(Prompt, Vec<u32>), String>);

fn parse_line(
    line: &str,
    tokenizer: &Tokenizer,
    options: &GenerateOptions,
    line_no: usize,
) -> ParsedLine {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return (
                Value::Null,
                Err(format!("line {line_no}: malformed JSON: {e}")),
            )
        }
    };
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    let parsed = serde_json::from_value::<Line>(value)
        .map_err(|e| format!("line {line_no}: {e}"))
        .and_then(|l| {
            let ids = prepare(tokenizer, &l.prompt, options)
                .map_err(|e| format!("line {line_no}: {e}"))?;
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
