//! Tool-calling generation: Toolformer's interrupt-execute-resume decoding loop (Schick et al.
//! 2023, §2 and §4.2), on any backend's [`Decoder`] (KV-cached incremental decoding).
//!
//! Per sequence, a small state machine:
//!
//! ```text
//! Normal --("[" or " [" within the top k, a call left: force the opener)--> InCall
//! InCall --(the call's text so far contains "->": execute, splice " {result}]")--> Normal
//! InCall --("]" written before any arrow, or max_call_tokens without one: close)--> Normal
//! any    --(end-of-text token, or the length cap)--> done
//! ```
//!
//! Outside a call the openers are never drawn (a call starts exactly when an opener is within
//! the top k and the budget allows one; with k = 0 or `max_calls` = 0 calls are disabled, the
//! paper's "Toolformer (disabled)"). Greedy by default; `temperature` > 0 samples, each prompt
//! from its own seeded stream. All live sequences of a batch advance together: one
//! `DecodeSession::extend` per step, with one token for most sequences and the sampled token plus
//! the spliced result for those that just got one. Conventions: docs/generate.md.

pub mod call;
pub mod jsonl;
mod tools;

use serde::Serialize;

use crate::annotate::calls::{cleaned_answer, input_problem};
use crate::annotate::tools::{DocContext, ToolRegistry};
use crate::error::{Error, Result};
use crate::model::tokenizer::check_vocab;
use crate::model::Tokenizer;
use crate::sample::{draw, sample_rng, DecodeSession, Decoder, SampleOptions};
use crate::util::rng::Rng;
pub use call::CallTokens;
pub use tools::tools_from_config;

/// How to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Most tokens in a completion, spliced tool results included.
    pub max_new_tokens: usize,
    /// A call starts when "[" or " [" is among the `top_k_call` most likely next tokens (the
    /// paper's k: 10 in its evaluation; 1 starts a call only when greedy decoding would).
    pub top_k_call: usize,
    /// Calls per prompt (the paper: at most one).
    pub max_calls: usize,
    /// Tokens the model may write after the opener without reaching the arrow before the call is
    /// closed with "]" as malformed.
    pub max_call_tokens: usize,
    /// 0: greedy (ties to the lowest id); otherwise the softmax temperature.
    pub temperature: f32,
    /// When sampling, draw only among the `top_k` most likely tokens (None: all).
    pub top_k: Option<usize>,
    /// Seed of the sampling streams: prompt `i` draws from `sample_rng(seed, i, 0)`.
    pub seed: u64,
    /// Prompts decoded together (one session, one `extend` per step).
    pub batch_size: usize,
    /// The model's sequence length limit (`n_positions`): completions stop there. None: no limit
    /// (the decoder's own checks still apply).
    pub n_positions: Option<usize>,
    /// The model's vocabulary size: a prompt with an id at or above it (a tokenizer with more ids
    /// than the model has rows) is that prompt's error. None: not checked here, and the decoder
    /// fails the prompt's whole batch.
    pub vocab_size: Option<usize>,
    /// Stop at the tokenizer's "<|endoftext|>" (not part of the completion).
    pub stop_at_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 64,
            top_k_call: 10,
            max_calls: 1,
            max_call_tokens: 32,
            temperature: 0.0,
            top_k: None,
            seed: 0,
            batch_size: 32,
            n_positions: None,
            vocab_size: None,
            stop_at_eos: true,
        }
    }
}

impl GenerateOptions {
    /// The defaults with the model's limits filled in (`n_positions`, `vocab_size`): completions
    /// stop at the length limit, and an id the model has no row for fails its own prompt.
    pub fn for_model(config: &crate::model::GptjConfig) -> Self {
        GenerateOptions {
            n_positions: Some(config.n_positions),
            vocab_size: Some(config.vocab_size),
            ..GenerateOptions::default()
        }
    }

    /// Refuses settings that would silently mean something else: `max_call_tokens` 0 (a call
    /// needs a token to name its tool), and what `sample::check_draw_options` refuses.
    pub fn check(&self) -> Result<()> {
        if self.max_call_tokens == 0 {
            return Err(Error::input("max_call_tokens must be at least 1"));
        }
        crate::sample::check_draw_options(self.temperature, self.top_k)
    }
}

/// One prompt and the document context its tool calls see.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    /// The prompt text the completion continues (the JSONL input's "prompt").
    pub text: String,
    /// Passed to tools as `DocContext::id`.
    pub id: String,
    /// Passed to tools (Calendar reads a date from it).
    pub url: Option<String>,
    /// Passed to tools (Calendar's first choice).
    pub date: Option<String>,
}

impl Prompt {
    /// A prompt of `text` with no id, URL or date.
    pub fn new(text: impl Into<String>) -> Self {
        Prompt {
            text: text.into(),
            ..Default::default()
        }
    }
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        Prompt::new(text)
    }
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive] // more outcomes of a call may come: a match outside the crate needs a `_` arm
pub enum CallStatus {
    /// Executed; " {result}]" was spliced after the arrow.
    Ok,
    /// The tool returned no result (error, timeout, panic): "]" was spliced after the arrow.
    ToolError,
    /// No tool of that name is registered: "]" was spliced after the arrow.
    UnknownTool,
    /// The text before the arrow is not `Tool(input)`: "]" was spliced after the arrow.
    Unparsable,
    /// The model wrote "]" before any arrow: nothing executed, nothing spliced.
    ClosedWithoutArrow,
    /// No arrow within `max_call_tokens`: "]" was spliced (cut off, like any splice, where the
    /// completion reaches its length cap).
    TooLong,
    /// Generation ended (end of text or length cap) inside the call.
    Unfinished,
}

/// One call of a completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CallRecord {
    /// Byte offset of the call's "[" in the completion.
    pub position: usize,
    /// The tool's name as written ("" until "Tool(" is written: `call::parse_partial_call`).
    pub tool: String,
    /// The input as written between the parentheses, or after the "(" as far as the call got.
    pub input: String,
    /// The spliced result ("" when none was).
    pub result: String,
    /// How the call ended (JSON: "ok", "tool_error", "unknown_tool", ...).
    pub status: CallStatus,
    /// Why there is no result, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive] // has grown before (NotFinite): a match outside the crate needs a `_` arm
pub enum Finish {
    /// The model wrote the end-of-text token.
    Eos,
    /// `max_new_tokens` or the model's `n_positions` was reached.
    Length,
    /// The decoder's next-token row held NaN or +inf (a model that overflowed, f16 weights
    /// past their range say): nothing can be drawn from it, so the completion ends there, as
    /// far as it got. `generate_jsonl` answers such a line with an error line.
    NotFinite,
}

/// One completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Generation {
    /// The decoded completion tokens (calls and results included).
    pub completion: String,
    /// Every call the model started, in completion order, whatever its status.
    pub calls: Vec<CallRecord>,
    /// Why the completion ended: end-of-text, the length cap, or a row not finite.
    pub finish: Finish,
    /// The completion's token ids.
    #[serde(skip)]
    pub tokens: Vec<u32>,
    /// Per completion token, the decoder's log-prob of it given everything before, for tokens the
    /// model chose (None for spliced tokens, and for the arrow's tokens where the drawn one also
    /// wrote past the arrow and was cut there: they are its text re-tokenized, not drawn). The
    /// end-of-text token is not included.
    #[serde(skip)]
    pub token_log_probs: Vec<Option<f32>>,
}

/// A tokenized prompt and its sampling stream.
pub(crate) struct Job<'a> {
    pub ids: Vec<u32>,
    pub stream: usize,
    pub prompt: &'a Prompt,
}

/// Generates a completion of every prompt, in order. A prompt that cannot be generated from
/// (empty, longer than `n_positions`) makes the whole call an error naming it; the JSONL driver
/// ([`jsonl::generate_jsonl`]) turns such prompts into error lines instead.
pub fn generate(
    decoder: &dyn Decoder,
    tokenizer: &Tokenizer,
    tools: &ToolRegistry,
    prompts: &[Prompt],
    options: &GenerateOptions,
) -> Result<Vec<Generation>> {
    options.check()?;
    check_close(tokenizer, options)?;
    let jobs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ids = prepare(tokenizer, &p.text, options)
                .map_err(|e| Error::input(format!("prompt {i}: {e}")))?;
            Ok(Job {
                ids,
                stream: i,
                prompt: p,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let tokens = CallTokens::from_tokenizer(tokenizer);
    let mut out = Vec::with_capacity(jobs.len());
    for batch in jobs.chunks(options.batch_size.max(1)) {
        out.extend(generate_batch(
            decoder, tokenizer, &tokens, tools, batch, options,
        )?);
    }
    Ok(out)
}

/// Refuses a tokenizer that writes "]" with an id the model has no row for (`vocab_size`, when
/// known): every call that fails or is malformed is closed with it, so the first such call would
/// fail its whole batch at the next step, where prompts, results and arrow cuts are checked.
/// `generate` and `generate_jsonl` call it first; a caller that prepares output before them
/// can call it earlier.
pub fn check_close(tokenizer: &Tokenizer, options: &GenerateOptions) -> Result<()> {
    let Some(vocab_size) = options.vocab_size else {
        return Ok(());
    };
    let ids = tokenizer.encode_ids("]")?;
    check_vocab(&ids, vocab_size)
        .map_err(|e| Error::input(format!("\"]\", which closes every call: {e}")))
}

/// Tokenizes a prompt and checks that generation can start from it: not empty, room left within
/// `n_positions`, and every id within `vocab_size` (each when known).
pub(crate) fn prepare(
    tokenizer: &Tokenizer,
    text: &str,
    options: &GenerateOptions,
) -> std::result::Result<Vec<u32>, String> {
    // Only a head of a prompt too long to generate from is tokenized: a line of megabytes
    // would take seconds and gigabytes to tokenize whole, only to be refused.
    let (ids, whole) = match options.n_positions {
        Some(n) => {
            let (encoding, whole) = tokenizer
                .encode_head_whole(text, n)
                .map_err(|e| e.to_string())?;
            (encoding.ids, whole)
        }
        None => (tokenizer.encode_ids(text).map_err(|e| e.to_string())?, true),
    };
    if ids.is_empty() {
        return Err("empty prompt: generation needs at least one token of context".into());
    }
    if let Some(n) = options.n_positions.filter(|&n| ids.len() >= n) {
        let at_least = if whole { "" } else { "more than " };
        return Err(format!(
            "prompt of {at_least}{} tokens leaves no room to generate within n_positions ({n})",
            ids.len()
        ));
    }
    if let Some(vocab_size) = options.vocab_size {
        check_vocab(&ids, vocab_size)?;
    }
    Ok(ids)
}

/// Where a sequence stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Normal,
    /// In a call whose opener is completion token `start`.
    InCall {
        start: usize,
    },
}

/// The shared, read-only context of a batch.
struct Ctx<'a> {
    tokenizer: &'a Tokenizer,
    tokens: &'a CallTokens,
    tools: &'a ToolRegistry,
    options: &'a GenerateOptions,
    sample: SampleOptions,
    /// The tokenizer's ids, ascending.
    known: Vec<u32>,
    /// The rows' ids that the tokenizer has no text for (GPT-J's 50400 rows over tokenizer.json's
    /// 50257 ids), found at the first row: never drawn, since decoding would drop them (a
    /// completion without a token the model wrote, a call run on an input it did not write).
    no_text: std::cell::OnceCell<Vec<u32>>,
}

impl Ctx<'_> {
    /// `row` with the ids that have no text at -inf (borrowed when there are none).
    fn without_textless<'r>(&self, row: &'r [f32]) -> std::borrow::Cow<'r, [f32]> {
        let no_text = self.no_text.get_or_init(|| {
            (0..row.len() as u32)
                .filter(|id| self.known.binary_search(id).is_err())
                .collect()
        });
        if no_text.is_empty() {
            return std::borrow::Cow::Borrowed(row);
        }
        let mut masked = row.to_vec();
        for &id in no_text {
            if let Some(v) = masked.get_mut(id as usize) {
                *v = f32::NEG_INFINITY;
            }
        }
        std::borrow::Cow::Owned(masked)
    }
}

struct Seq<'a> {
    sid: usize,
    prompt: &'a Prompt,
    /// Completion tokens at most.
    cap: usize,
    tokens: Vec<u32>,
    log_probs: Vec<Option<f32>>,
    calls: Vec<CallRecord>,
    /// Tokens to feed at the next step.
    pending: Vec<u32>,
    mode: Mode,
    rng: Rng,
    finish: Option<Finish>,
}

/// Decodes one batch of prompts in one session.
pub(crate) fn generate_batch(
    decoder: &dyn Decoder,
    tokenizer: &Tokenizer,
    tokens: &CallTokens,
    tools: &ToolRegistry,
    jobs: &[Job<'_>],
    options: &GenerateOptions,
) -> Result<Vec<Generation>> {
    let _span = tracing::info_span!("generate_batch", prompts = jobs.len()).entered();
    let ctx = Ctx {
        tokenizer,
        tokens,
        tools,
        options,
        sample: SampleOptions {
            max_new_tokens: options.max_new_tokens,
            stop_tokens: Vec::new(),
            temperature: options.temperature,
            top_k: options.top_k,
            seed: options.seed,
        },
        known: tokenizer.ids(),
        no_text: std::cell::OnceCell::new(),
    };
    let mut session: Box<dyn DecodeSession + '_> = decoder.session();
    let mut seqs: Vec<Seq<'_>> = jobs
        .iter()
        .map(|job| {
            let room = options
                .n_positions
                .map_or(usize::MAX, |n| n.saturating_sub(job.ids.len()));
            let cap = options.max_new_tokens.min(room);
            Seq {
                sid: session.new_sequence(),
                prompt: job.prompt,
                cap,
                tokens: Vec::new(),
                log_probs: Vec::new(),
                calls: Vec::new(),
                pending: job.ids.clone(),
                mode: Mode::Normal,
                rng: sample_rng(options.seed, job.stream, 0),
                finish: (cap == 0).then_some(Finish::Length),
            }
        })
        .collect();
    // Every fed token is a prompt token or one of the completion's, at most `cap` of those:
    // the session's cache is sized once.
    session.reserve(jobs.iter().zip(&seqs).fold(0usize, |n, (job, seq)| {
        n.saturating_add(job.ids.len().saturating_add(seq.cap))
    }));
    loop {
        let live: Vec<usize> = (0..seqs.len())
            .filter(|&i| seqs[i].finish.is_none())
            .collect();
        if live.is_empty() {
            break;
        }
        let ids: Vec<usize> = live.iter().map(|&i| seqs[i].sid).collect();
        let feed: Vec<Vec<u32>> = live
            .iter()
            .map(|&i| std::mem::take(&mut seqs[i].pending))
            .collect();
        let rows = session.extend(&ids, &feed)?;
        for (&i, row) in live.iter().zip(&rows) {
            if row.iter().any(|&v| v.is_nan() || v == f32::INFINITY) {
                // Every draw would be the lowest id, or argmax of what is left: no completion.
                seqs[i].finish = Some(Finish::NotFinite);
                seqs[i].unfinished_call(&ctx)?;
                continue;
            }
            seqs[i].step(row, &ctx)?;
        }
    }
    seqs.into_iter()
        .map(|s| {
            Ok(Generation {
                completion: tokenizer.decode(&s.tokens)?,
                calls: s.calls,
                finish: s.finish.expect("finished"),
                tokens: s.tokens,
                token_log_probs: s.log_probs,
            })
        })
        .collect()
}

/// Why an input could not stand in a call of C* (annotate refuses these: `check_call`), so that
/// the model, trained on C*, did not write a call there: a "[" (a call inside the call), a
/// ")" without its "(" or the reverse, or U+FFFD (a character cut between tokens).
fn unlike_cstar(input: &str) -> Option<String> {
    if input.contains('[') {
        Some("a \"[\" in the input: a call inside the call".into())
    } else if !crate::score::text::balanced(input) {
        Some("unbalanced parentheses in the input".into())
    } else if input.contains('\u{FFFD}') {
        Some("U+FFFD in the input: a character cut between tokens".into())
    } else {
        None
    }
}

impl Seq<'_> {
    /// Consumes the log-probs after the last fed token: chooses the next token(s) to feed, or ends.
    fn step(&mut self, row: &[f32], ctx: &Ctx<'_>) -> Result<()> {
        let row = &*ctx.without_textless(row);
        let opts = ctx.options;
        match self.mode {
            Mode::Normal => {
                let calls_left = self.calls.len() < opts.max_calls;
                let forced = calls_left
                    .then(|| call::opener_in_top_k(row, &ctx.tokens.openers, opts.top_k_call))
                    .flatten();
                if let Some(opener) = forced {
                    self.mode = Mode::InCall {
                        start: self.tokens.len(),
                    };
                    self.push(opener, row);
                    let position = ctx.tokenizer.decode(&self.tokens)?.len() - 1;
                    self.calls.push(CallRecord {
                        position,
                        tool: String::new(),
                        input: String::new(),
                        result: String::new(),
                        status: CallStatus::Unfinished,
                        error: None,
                    });
                    self.pending = vec![opener];
                } else {
                    let tok = self.draw_outside_call(row, ctx);
                    if opts.stop_at_eos && Some(tok) == ctx.tokens.eos {
                        self.finish = Some(Finish::Eos);
                        return Ok(());
                    }
                    self.push(tok, row);
                    self.pending = vec![tok];
                }
            }
            Mode::InCall { start } => {
                let tok = draw(row, &ctx.sample, &mut self.rng);
                if opts.stop_at_eos && Some(tok) == ctx.tokens.eos {
                    self.finish = Some(Finish::Eos);
                    self.unfinished_call(ctx)?;
                    return Ok(());
                }
                self.push(tok, row);
                self.pending = vec![tok];
                self.advance_call(start, ctx)?;
            }
        }
        if self.tokens.len() >= self.cap {
            self.tokens.truncate(self.cap);
            self.log_probs.truncate(self.cap);
            self.finish = Some(Finish::Length);
            if matches!(self.mode, Mode::InCall { .. }) {
                self.unfinished_call(ctx)?;
            }
        }
        Ok(())
    }

    /// Draws outside a call: openers masked (a call starts only through the top-k rule).
    fn draw_outside_call(&mut self, row: &[f32], ctx: &Ctx<'_>) -> u32 {
        let openers = &ctx.tokens.openers;
        if openers.iter().all(|&t| row.get(t as usize).is_none()) {
            return draw(row, &ctx.sample, &mut self.rng);
        }
        let mut masked = row.to_vec();
        for &t in openers {
            if let Some(v) = masked.get_mut(t as usize) {
                *v = f32::NEG_INFINITY;
            }
        }
        draw(&masked, &ctx.sample, &mut self.rng)
    }

    fn push(&mut self, token: u32, row: &[f32]) {
        self.tokens.push(token);
        self.log_probs.push(row.get(token as usize).copied());
    }

    /// Appends the tokens of `text`, tokenized on its own, as tokens the model did not draw (no
    /// log-prob) and feeds them at the next step.
    fn splice(&mut self, text: &str, ctx: &Ctx<'_>) -> Result<()> {
        let ids = ctx.tokenizer.encode_ids(text)?;
        self.splice_ids(&ids);
        Ok(())
    }

    /// `splice` for text already tokenized.
    fn splice_ids(&mut self, ids: &[u32]) {
        for &t in ids {
            self.tokens.push(t);
            self.log_probs.push(None);
            self.pending.push(t);
        }
    }

    /// After a token inside the call whose opener is at `start`: execute at the arrow, close a
    /// malformed call, or go on.
    fn advance_call(&mut self, start: usize, ctx: &Ctx<'_>) -> Result<()> {
        let mut body = ctx.tokenizer.decode(&self.tokens[start + 1..])?;
        // The arrow counts only before any "]": one token can close a call and write an arrow
        // after it ("]->"), and the model closed the call first.
        let arrow_of = |body: &str| {
            body.find("->")
                .filter(|&a| body.find(']').is_none_or(|c| a < c))
        };
        if let Some(arrow) = arrow_of(&body) {
            if !body[arrow + 2..].trim().is_empty()
                && self.cut_at_arrow(start, &body, arrow, ctx)?
            {
                body = ctx.tokenizer.decode(&self.tokens[start + 1..])?;
            }
        }
        if arrow_of(&body).is_some() && self.tokens.len() >= self.cap {
            // No room left for a result: the cap ends the completion inside the call
            // (`unfinished`), and the tool is not run for nothing.
            return Ok(());
        }
        let record = self.calls.last_mut().expect("a call is open");
        if let Some(arrow) = arrow_of(&body) {
            let tail = &body[arrow + 2..];
            // What follows the arrow, tokenized once: the result and "]", or "]" alone.
            let close = || ctx.tokenizer.encode_ids("]");
            let splice = match call::parse_call(&body[..arrow]) {
                None => {
                    record.status = CallStatus::Unparsable;
                    record.error = Some(format!(
                        "expected Tool(input) before the arrow, got {:?}",
                        &body[..arrow]
                    ));
                    // As much of the call as was written ("Calculator(1+2 ->": the input's ")"
                    // is missing), as for a call cut short.
                    if let Some((tool, input)) = call::parse_partial_call(&body[..arrow]) {
                        record.tool = tool.to_string();
                        record.input = input.to_string();
                    }
                    close()?
                }
                Some((tool, input)) => {
                    record.tool = tool.to_string();
                    record.input = input.to_string();
                    let problem =
                        input_problem(input, &ctx.tokens.special).or_else(|| unlike_cstar(input));
                    if let Some(problem) = problem {
                        record.status = CallStatus::Unparsable;
                        record.error = Some(problem);
                        close()?
                    } else if ctx.tools.get(tool).is_none() {
                        record.status = CallStatus::UnknownTool;
                        record.error = Some(format!("no tool named {tool:?} is registered"));
                        close()?
                    } else {
                        let doc = DocContext {
                            id: &self.prompt.id,
                            url: self.prompt.url.as_deref(),
                            date: self.prompt.date.as_deref(),
                        };
                        // Cleaned as annotate cleans it for C*: a "]" or newline in a result
                        // must not close the call early or leave the format the model knows.
                        let answer = ctx.tools.call(tool, input, &doc);
                        match cleaned_answer(answer, &ctx.tokens.special) {
                            Ok(result) => {
                                // The arrow token may carry the space after it ("-> ").
                                let sep = if tail.is_empty() || !tail.trim().is_empty() {
                                    " "
                                } else {
                                    ""
                                };
                                let splice = format!("{sep}{result}]");
                                // A result the tokenizer refuses, or with a token the model
                                // has no row for, would fail the whole batch (now, or at the
                                // next step): this call's failure instead.
                                let ids = ctx
                                    .tokenizer
                                    .encode_ids(&splice)
                                    .map_err(|e| format!("the result cannot be tokenized: {e}"))
                                    .and_then(|ids| match ctx.options.vocab_size {
                                        Some(v) => check_vocab(&ids, v)
                                            .map(|()| ids)
                                            .map_err(|e| format!("the result's {e}")),
                                        None => Ok(ids),
                                    });
                                match ids {
                                    Ok(ids) => {
                                        record.status = CallStatus::Ok;
                                        record.result = result;
                                        ids
                                    }
                                    Err(e) => {
                                        record.status = CallStatus::ToolError;
                                        record.error = Some(e);
                                        close()?
                                    }
                                }
                            }
                            Err(e) => {
                                record.status = CallStatus::ToolError;
                                record.error = Some(e.to_string());
                                close()?
                            }
                        }
                    }
                }
            };
            let executed = record.status == CallStatus::Ok;
            self.splice_ids(&splice);
            self.mode = Mode::Normal;
            if executed && self.tokens.len() > self.cap {
                // The completion will end inside the result: the call did not finish in it.
                let record = self.calls.last_mut().expect("a call is open");
                record.status = CallStatus::Unfinished;
                record.error = Some("the length cap cut the spliced result".into());
            }
        } else if body.contains(']') {
            record.status = CallStatus::ClosedWithoutArrow;
            record.error = Some("the call was closed before any arrow".into());
            self.fill_tool(&body);
            self.mode = Mode::Normal;
        } else if self.tokens.len() - start > ctx.options.max_call_tokens {
            record.status = CallStatus::TooLong;
            record.error = Some(format!(
                "no arrow within {} tokens",
                ctx.options.max_call_tokens
            ));
            self.fill_tool(&body);
            self.splice("]", ctx)?;
            self.mode = Mode::Normal;
        }
        Ok(())
    }

    /// The token that completed the arrow of the call at `start` also carries text after it
    /// ("->-": the sign of a guessed result, or "-> ]"): that text is not the model's to write, so
    /// the token (drawn, not yet fed) is replaced by its text up to the arrow's end, re-tokenized.
    /// `body` is the call's text, `arrow` where its "->" starts. False when the token's text cannot
    /// be told apart (a decode that is not a prefix, as in a split UTF-8 character) or its cut
    /// re-tokenizes to an id the model has no row for (`vocab_size`; a tokenizer with more ids than
    /// the model): the call then goes on as written.
    fn cut_at_arrow(
        &mut self,
        start: usize,
        body: &str,
        arrow: usize,
        ctx: &Ctx<'_>,
    ) -> Result<bool> {
        let last = self.tokens.len() - 1;
        let before = ctx.tokenizer.decode(&self.tokens[start + 1..last])?;
        let kept = match body.get(before.len()..arrow + 2) {
            Some(kept) if body.starts_with(&before) && !kept.is_empty() => kept,
            _ => return Ok(false),
        };
        let ids = ctx.tokenizer.encode_ids(kept)?;
        if let Some(vocab_size) = ctx.options.vocab_size {
            if check_vocab(&ids, vocab_size).is_err() {
                return Ok(false);
            }
        }
        self.tokens.truncate(last);
        self.log_probs.truncate(last);
        self.pending.clear();
        self.splice_ids(&ids);
        Ok(true)
    }

    /// Fills in the tool and input of the open call from its text so far, as far as it was
    /// written (`call::parse_partial_call`): a call closed, cut or left unfinished before its
    /// input's ")" keeps what it decoded, as one the length cap cuts does.
    fn fill_tool(&mut self, body: &str) {
        // Up to the first "]" or arrow, as `advance_call` reads it.
        let head = body.split(']').next().unwrap_or("");
        let head = head.split("->").next().unwrap_or(head);
        if let Some((tool, input)) = call::parse_partial_call(head) {
            let record = self.calls.last_mut().expect("a call is open");
            record.tool = tool.to_string();
            record.input = input.to_string();
        }
    }

    /// Generation ended inside a call: the record keeps what was decoded of it.
    fn unfinished_call(&mut self, ctx: &Ctx<'_>) -> Result<()> {
        if let Mode::InCall { start } = self.mode {
            let end = self.tokens.len().max(start + 1);
            let body = ctx
                .tokenizer
                .decode(&self.tokens[(start + 1).min(end)..end])?;
            // As far as it was written; up to the arrow when that is in (the cap left no room
            // for a result).
            self.fill_tool(&body);
            let record = self.calls.last_mut().expect("a call is open");
            if record.status == CallStatus::Unfinished {
                record.error = Some("generation ended inside the call".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs annotate would not put in C*, as generate's `unparsable` reasons.
    #[test]
    fn inputs_unlike_cstar_are_named() {
        assert_eq!(unlike_cstar("400 / 1400"), None);
        assert_eq!(unlike_cstar("(1 + 2) * 3"), None);
        for (input, why) in [
            ("308ants, 20 [Calculator(208", "a call inside the call"),
            ("(1 + 2", "unbalanced"),
            ("1 + 2)", "unbalanced"),
            ("6\u{FFFD} ", "U+FFFD"),
        ] {
            let problem = unlike_cstar(input).unwrap_or_default();
            assert!(problem.contains(why), "{input:?}: {problem:?}");
        }
    }

    /// The defaults are docs/generate.md's table: the paper's k = 10 and one call, 64 new
    /// tokens, 32 call tokens, greedy, batches of 32, stopping at end of text.
    #[test]
    fn the_defaults_are_the_documented_ones() {
        let o = GenerateOptions::default();
        assert_eq!(
            (
                o.max_new_tokens,
                o.top_k_call,
                o.max_calls,
                o.max_call_tokens
            ),
            (64, 10, 1, 32)
        );
        assert_eq!((o.temperature, o.top_k, o.seed), (0.0, None, 0));
        assert_eq!(o.batch_size, 32);
        assert_eq!(
            (o.n_positions, o.vocab_size, o.stop_at_eos),
            (None, None, true)
        );
    }
}
