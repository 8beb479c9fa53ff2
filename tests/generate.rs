//! Tool-calling generation (`toolsift::generate`): the interrupt-execute-resume loop.
//!
//! - on the tiny fixture with the real CPU decoder: every step of the loop (sampled tokens, forced
//!   openers, spliced results) equals a full forward of the same sequence by the f64 oracle;
//! - with a scripted mock decoder: a call starts exactly when "[" is within the top k, results are
//!   spliced and decoding resumes, the budget holds, malformed calls and failing tools are closed
//!   and decoding goes on;
//! - JSONL in/out (with error lines), the CLI, determinism for a seed whatever the batching;
//! - on the trained demo model (assets/demo), where calls are real: KV-cached rows equal the
//!   oracle, a call opens exactly when an opener is within the top k (k = 1 and 10), results are
//!   spliced and decoding resumes, the budget holds, and tools answer more arithmetic prompts
//!   than no tools.

mod common;

use std::sync::{Arc, Mutex};

use serde_json::Value;
use toolsift::annotate::tools::{Calculator, DocContext, Tool, ToolError, ToolRegistry};
use toolsift::cpu::CpuScorer;
use toolsift::generate::jsonl::generate_jsonl;
use toolsift::generate::{
    call, generate, CallStatus, CallTokens, Finish, GenerateOptions, Generation, Prompt,
};
use toolsift::model::Tokenizer;
use toolsift::reference::ReferenceModel;
use toolsift::sample::{draw, sample_rng, DecodeSession, Decoder, SampleOptions};
use toolsift::Model;

/// f32 engine vs f64 oracle on log-probs (as tests/sampling.rs).
const TOL: f64 = 2e-4;

fn tiny() -> Model {
    Model::load(common::tiny("f32")).unwrap()
}

fn tok(model: &Model) -> &Tokenizer {
    model.tokenizer().unwrap()
}

/// The JSON rows a run wrote.
fn rows(out: &[u8]) -> Vec<Value> {
    std::str::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `n` input lines, ids 0..n, each the prompt "Q".
fn q_lines(n: usize) -> String {
    (0..n)
        .map(|k| format!("{{\"id\": {k}, \"prompt\": \"Q\"}}\n"))
        .collect()
}

fn calculator() -> ToolRegistry {
    let mut tools = ToolRegistry::new();
    tools.register(Calculator::new());
    tools
}

// ---------------------------------------------------------------------------------------------
// A decoder that records what it computed, and optionally forces scripted tokens.

/// Every sequence the decoder computed (after its extension) and the row it returned.
type Log = Arc<Mutex<Vec<(Vec<u32>, Vec<f32>)>>>;

/// Wraps a real decoder: records, per `extend`, each sequence's full token list and the row the
/// real decoder returned; then, while a sequence's script lasts, returns a row that forces the
/// next scripted token instead.
struct Recording<'a> {
    inner: &'a dyn Decoder,
    scripts: Vec<Vec<u32>>,
    log: Log,
}

struct RecordingSession<'a> {
    inner: Box<dyn DecodeSession + Send + 'a>,
    scripts: Vec<Vec<u32>>,
    seqs: Vec<(Vec<u32>, usize)>,
    log: Log,
}

impl Decoder for Recording<'_> {
    fn session(&self) -> Box<dyn DecodeSession + Send + '_> {
        Box::new(RecordingSession {
            inner: self.inner.session(),
            scripts: self.scripts.clone(),
            seqs: Vec::new(),
            log: self.log.clone(),
        })
    }
}

impl DecodeSession for RecordingSession<'_> {
    fn new_sequence(&mut self) -> usize {
        self.seqs.push((Vec::new(), 0));
        self.inner.new_sequence()
    }
    fn extend(
        &mut self,
        sequences: &[usize],
        tokens: &[Vec<u32>],
    ) -> toolsift::Result<Vec<Vec<f32>>> {
        let mut rows = self.inner.extend(sequences, tokens)?;
        for ((&s, t), row) in sequences.iter().zip(tokens).zip(rows.iter_mut()) {
            self.seqs[s].0.extend(t);
            self.log
                .lock()
                .unwrap()
                .push((self.seqs[s].0.clone(), row.clone()));
            let (_, used) = &mut self.seqs[s];
            if let Some(&next) = self.scripts.get(s).and_then(|sc| sc.get(*used)) {
                *used += 1;
                row.iter_mut().for_each(|v| *v = -1e9);
                row[next as usize] = 0.0;
            }
        }
        Ok(rows)
    }
    fn len(&self, sequence: usize) -> usize {
        self.inner.len(sequence)
    }
}

fn assert_rows_match_oracle(model: &Model, log: &[(Vec<u32>, Vec<f32>)]) {
    let oracle = ReferenceModel::new(model.config(), model.weights());
    assert!(!log.is_empty());
    for (seq, row) in log {
        let want = oracle.log_softmax(seq);
        let want = want.row(seq.len() - 1);
        let (worst, diff) = row
            .iter()
            .zip(want)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .enumerate()
            .fold((0, 0.0), |a, (i, d)| if d > a.1 { (i, d) } else { a });
        assert!(
            diff < TOL,
            "sequence of {} tokens: token {worst}: {} vs {} (|diff| {diff:.2e} of {TOL})",
            seq.len(),
            row[worst],
            want[worst]
        );
    }
}

#[test]
fn every_step_of_the_loop_equals_a_full_forward_of_the_same_sequence() {
    let model = tiny();
    let tokenizer = tok(&model);
    let engine = CpuScorer::new(&model);
    // Prompt 0 is made to call the calculator (its script writes the call up to the arrow, the
    // result is spliced by the loop, then the real model goes on); prompt 1 is left to the
    // model, with k so large that it calls at once and writes a call the loop must close.
    let script = tokenizer.encode_ids("[Calculator(12+30) ->").unwrap();
    let recording = Recording {
        inner: &engine,
        scripts: vec![script, vec![]],
        log: Default::default(),
    };
    let prompts = [
        Prompt::new("The sum of 12 and 30 is"),
        Prompt::new("Out of 1400 participants,"),
    ];
    let options = GenerateOptions {
        max_new_tokens: 40,
        top_k_call: 1000,
        max_call_tokens: 16,
        ..Default::default()
    };
    let gens = generate(&recording, tokenizer, &calculator(), &prompts, &options).unwrap();
    assert!(
        gens[0].completion.starts_with("[Calculator(12+30) -> 42]"),
        "{:?}",
        gens[0].completion
    );
    assert_eq!(gens[0].calls.len(), 1);
    let c = &gens[0].calls[0];
    assert_eq!(
        (
            c.position,
            c.tool.as_str(),
            c.input.as_str(),
            c.result.as_str()
        ),
        (0, "Calculator", "12+30", "42")
    );
    assert_eq!(c.status, CallStatus::Ok);
    assert_eq!(gens[1].calls.len(), 1, "{:?}", gens[1]);
    assert_eq!(gens[1].calls[0].position, 0);
    // The final sequences are what the decoder was fed (the last token, never fed, aside).
    let log = recording.log.lock().unwrap();
    for (p, g) in prompts.iter().zip(&gens) {
        let mut full = tokenizer.encode_ids(&p.text).unwrap();
        full.extend(&g.tokens);
        let longest = log
            .iter()
            .map(|(s, _)| s)
            .filter(|s| full.starts_with(s))
            .max_by_key(|s| s.len())
            .unwrap();
        assert!(
            longest.len() + 1 >= full.len(),
            "all but the last token fed"
        );
    }
    assert_rows_match_oracle(&model, &log);
}

#[test]
fn recorded_log_probs_of_a_plain_run_equal_the_oracle() {
    let model = tiny();
    let tokenizer = tok(&model);
    let engine = CpuScorer::new(&model);
    let oracle = ReferenceModel::new(model.config(), model.weights());
    let prompts = [Prompt::new("The sum of"), Prompt::new("[Calculator(1")];
    for k in [0, 1, 600] {
        let options = GenerateOptions {
            max_new_tokens: 16,
            top_k_call: k,
            max_call_tokens: 3,
            ..Default::default()
        };
        let gens = generate(&engine, tokenizer, &calculator(), &prompts, &options).unwrap();
        for (p, g) in prompts.iter().zip(&gens) {
            let mut full = tokenizer.encode_ids(&p.text).unwrap();
            let n = full.len();
            full.extend(&g.tokens);
            let want = oracle.log_softmax(&full);
            assert_eq!(g.token_log_probs.len(), g.tokens.len());
            for (j, lp) in g.token_log_probs.iter().enumerate() {
                if let Some(lp) = lp {
                    let w = want.row(n + j - 1)[full[n + j] as usize];
                    assert!((*lp as f64 - w).abs() < TOL, "k {k} token {j}: {lp} vs {w}");
                }
            }
            if k == 0 {
                assert!(g.calls.is_empty());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A scripted mock decoder: rows are a function of the sequence so far.

type RowFn = dyn Fn(&[u32]) -> Vec<f32> + Send + Sync;

struct Mock {
    vocab: usize,
    f: Box<RowFn>,
    /// Every sequence the mock was asked about, after its extension.
    seen: Arc<Mutex<Vec<Vec<u32>>>>,
}

struct MockSession<'a> {
    mock: &'a Mock,
    seqs: Vec<Vec<u32>>,
}

impl Decoder for Mock {
    fn session(&self) -> Box<dyn DecodeSession + Send + '_> {
        Box::new(MockSession {
            mock: self,
            seqs: Vec::new(),
        })
    }
}

impl DecodeSession for MockSession<'_> {
    fn new_sequence(&mut self) -> usize {
        self.seqs.push(Vec::new());
        self.seqs.len() - 1
    }
    fn extend(
        &mut self,
        sequences: &[usize],
        tokens: &[Vec<u32>],
    ) -> toolsift::Result<Vec<Vec<f32>>> {
        Ok(sequences
            .iter()
            .zip(tokens)
            .map(|(&s, t)| {
                assert!(!t.is_empty());
                self.seqs[s].extend(t);
                self.mock.seen.lock().unwrap().push(self.seqs[s].clone());
                let row = (self.mock.f)(&self.seqs[s]);
                assert_eq!(row.len(), self.mock.vocab);
                row
            })
            .collect())
    }
    fn len(&self, sequence: usize) -> usize {
        self.seqs[sequence].len()
    }
}

const VOCAB: usize = 512;

/// A row where `order[0]` is the most likely token, then `order[1]`, ...; all others far below.
fn ranked(order: &[u32]) -> Vec<f32> {
    let mut row = vec![-100.0f32; VOCAB];
    for (i, &t) in order.iter().enumerate() {
        row[t as usize] = -(i as f32) - 1.0;
    }
    row
}

fn mock(f: impl Fn(&[u32]) -> Vec<f32> + Send + Sync + 'static) -> Mock {
    Mock {
        vocab: VOCAB,
        f: Box::new(f),
        seen: Default::default(),
    }
}

struct Ids {
    open: u32,
    x: u32,
    fillers: Vec<u32>,
}

fn ids(tokenizer: &Tokenizer) -> Ids {
    let one = |s: &str| {
        let v = tokenizer.encode_ids(s).unwrap();
        assert_eq!(v.len(), 1, "{s:?} is one token");
        v[0]
    };
    Ids {
        open: one("["),
        x: one(" a"),
        fillers: ["b", "c", "d", "e", "f", "g", "h", "i"]
            .iter()
            .map(|s| one(s))
            .collect(),
    }
}

/// Tokens written after the last opener of `seq`, if any.
fn after_last_opener<'s>(seq: &'s [u32], openers: &[u32]) -> Option<&'s [u32]> {
    let j = seq.iter().rposition(|t| openers.contains(t))?;
    Some(&seq[j + 1..])
}

/// A model that, in a call, writes `call` (then ` a`), and outside one puts "[" at rank
/// `rank_at(step)` behind " a" and fillers, `step` counting completion tokens so far.
fn scripted(
    tokenizer: &Tokenizer,
    prompt_len: usize,
    call: &str,
    rank_at: impl Fn(usize) -> usize + Send + Sync + 'static,
) -> Mock {
    let Ids { open, x, fillers } = ids(tokenizer);
    let call = tokenizer.encode_ids(call).unwrap();
    let close = tokenizer.encode_ids("]").unwrap()[0];
    let openers = CallTokens::from_tokenizer(tokenizer).openers;
    mock(move |seq| {
        if let Some(rest) = after_last_opener(seq, &openers) {
            if !rest.contains(&close) {
                return ranked(&[*call.get(rest.len()).unwrap_or(&x)]);
            }
        }
        let step = seq.len() - prompt_len;
        let r = rank_at(step);
        let mut order: Vec<u32> = std::iter::once(x).chain(fillers.iter().copied()).collect();
        order.insert(r.min(order.len()), open);
        ranked(&order)
    })
}

/// Options that take the prompts two to a batch, each writing at most `max_new_tokens`.
fn two_per_batch(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        batch_size: 2,
        ..Default::default()
    }
}

fn run(m: &Mock, tokenizer: &Tokenizer, tools: &ToolRegistry, o: &GenerateOptions) -> Generation {
    generate(m, tokenizer, tools, &[Prompt::new("Q")], o)
        .unwrap()
        .remove(0)
}

/// Rows (the fixture's 512) past the tokenizer's ids (its 500) have no text: one that is the most
/// likely is never drawn, outside a call or in one, so that the completion holds every token
/// the model wrote and the call runs on the input it wrote. (Drawn, it decoded to nothing.)
#[test]
fn ids_without_text_are_never_drawn() {
    let model = tiny();
    let tokenizer = tok(&model);
    let Ids { open, x, .. } = ids(tokenizer);
    let textless = 505u32;
    assert!(tokenizer.id_count() <= textless as usize);
    let call = tokenizer.encode_ids("Calculator(1 + 2) ->").unwrap();
    let openers = CallTokens::from_tokenizer(tokenizer).openers;
    let m = mock(move |seq| {
        // In the call, its next token behind the textless id; outside, "[" behind it.
        match after_last_opener(seq, &openers) {
            Some(rest) if rest.len() < call.len() => ranked(&[textless, call[rest.len()]]),
            _ => ranked(&[textless, open, x]),
        }
    });
    let o = GenerateOptions {
        max_new_tokens: 24,
        top_k_call: 1,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert!(!g.tokens.contains(&textless), "{:?}", g.tokens);
    assert_eq!(tokenizer.decode(&g.tokens).unwrap(), g.completion);
    let c = &g.calls[0];
    assert_eq!(
        (c.status, c.input.as_str(), c.result.as_str()),
        (CallStatus::Ok, "1 + 2", "3")
    );
    assert!(
        g.completion.contains("[Calculator(1 + 2) -> 3]"),
        "{}",
        g.completion
    );
}

/// A "Calculator" that answers with a fixed text.
struct Answers(String);

impl Tool for Answers {
    fn name(&self) -> &str {
        "Calculator"
    }
    fn call(&self, _: &str, _: &DocContext<'_>) -> Result<String, ToolError> {
        Ok(self.0.clone())
    }
}

/// Tools of one "Calculator" that answers `text` whatever it is asked.
fn answering(text: &str) -> ToolRegistry {
    let mut tools = ToolRegistry::new();
    tools.register(Answers(text.to_string()));
    tools
}

/// A result with a token the model has no row for (a tokenizer larger than the model) fails
/// that call, closed with "]", instead of the whole batch at the next step.
#[test]
fn a_result_outside_the_vocabulary_fails_its_call_only() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(400 / 1400) ->", |_| 0);
    // The model has rows for every token the prompt and the call use, and not for a word the
    // tool answers with.
    let written = tokenizer
        .encode_ids("Q [Calculator(400 / 1400) -> 1]")
        .unwrap();
    let vocab_size = *written.iter().max().unwrap() as usize + 1;
    let word = (vocab_size..tokenizer.id_count())
        .rev()
        .filter_map(|id| tokenizer.decode(&[id as u32]).ok())
        .map(|w| w.trim().to_string())
        .find(|w| !w.is_empty() && w.chars().all(char::is_alphanumeric))
        .expect("a word the small model has no row for");
    let tools = answering(&word);
    let o = GenerateOptions {
        max_new_tokens: 40,
        vocab_size: Some(vocab_size),
        ..Default::default()
    };
    let g = run(&m, tokenizer, &tools, &o);
    let call = &g.calls[0];
    assert_eq!(call.status, CallStatus::ToolError, "{:?}", g.completion);
    let err = call.error.as_deref().unwrap();
    assert!(err.contains("the result's token id"), "{err}");
    assert!(
        g.completion.starts_with("[Calculator(400 / 1400) ->]"),
        "{:?}",
        g.completion
    );
    // Without the model's size the result is spliced (and a real decoder would fail the batch).
    let o = GenerateOptions {
        vocab_size: None,
        ..o
    };
    let g = run(&m, tokenizer, &tools, &o);
    assert_eq!(g.calls[0].status, CallStatus::Ok, "{word}");
}

/// A result the tokenizer cannot encode (here a character its vocabulary lacks, with an unknown
/// token it does not have either) fails that call, closed with "]", and decoding goes on: it
/// failed the whole batch, every prompt in it an error line.
#[test]
fn a_result_the_tokenizer_cannot_encode_fails_its_call_only() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = &fixture_tokenizer_edited(dir.path(), |json| {
        // "~" is in no merge, so the rest of the vocabulary encodes as before.
        json["model"]["vocab"].as_object_mut().unwrap().remove("~");
        json["model"]["unk_token"] = "<unk>".into();
    });
    assert!(tokenizer.encode_ids("~").is_err());
    let m = scripted(tokenizer, 1, "Calculator(1 + 2) ->", |_| 0);
    let tools = answering("~");
    let o = GenerateOptions {
        max_new_tokens: 30,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &tools, &o);
    let call = &g.calls[0];
    assert_eq!(call.status, CallStatus::ToolError, "{:?}", g.completion);
    let err = call.error.as_deref().unwrap();
    assert!(err.contains("the result cannot be tokenized"), "{err}");
    assert!(err.contains("<unk>"), "{err}");
    assert!(
        g.completion.starts_with("[Calculator(1 + 2) ->] a"),
        "{:?}",
        g.completion
    );
}

/// A tokenizer that writes "]" with an id the model has no row for is refused before anything
/// is generated, by the library call and the JSONL driver: every failed or malformed call is
/// closed with it, so the first would fail its whole batch.
#[test]
fn a_close_outside_the_vocabulary_is_refused_up_front() {
    let model = tiny();
    let tokenizer = tok(&model);
    let close = tokenizer.encode_ids("]").unwrap();
    let prompt = tokenizer.encode_ids("Q").unwrap();
    let vocab_size = *close.iter().max().unwrap() as usize;
    assert!(
        prompt.iter().all(|&t| (t as usize) < vocab_size),
        "the prompt must fit the model"
    );
    let m = scripted(tokenizer, prompt.len(), "Calculator(1 + 2) ->", |_| 0);
    let o = GenerateOptions {
        max_new_tokens: 8,
        vocab_size: Some(vocab_size),
        ..Default::default()
    };
    let want = format!(
        "\"]\", which closes every call: token id {vocab_size} is outside the vocabulary \
         (vocab_size {vocab_size})"
    );
    let err = generate(&m, tokenizer, &calculator(), &[Prompt::new("Q")], &o)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&want), "{err}");
    let mut out = Vec::new();
    let input = "{\"prompt\": \"Q\"}\n";
    let err = generate_jsonl(input.as_bytes(), &mut out, &m, tokenizer, &calculator(), &o)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&want), "{err}");
    assert!(out.is_empty(), "nothing is written before the refusal");
    // One row more and it runs.
    let o = GenerateOptions {
        vocab_size: Some(vocab_size + 1),
        ..o
    };
    generate(&m, tokenizer, &calculator(), &[Prompt::new("Q")], &o).unwrap();
}

#[test]
fn a_call_starts_exactly_when_the_opener_is_within_the_top_k() {
    let model = tiny();
    let tokenizer = tok(&model);
    let prompt_len = tokenizer.encode_ids("Q").unwrap().len();
    let open = ids(tokenizer).open;
    // The opener's rank falls 6, 5, 4, ... 0 over the steps.
    for k in 1..=6 {
        let m = scripted(tokenizer, prompt_len, "Calculator(1+2) ->", |s| {
            6usize.saturating_sub(s)
        });
        let o = GenerateOptions {
            top_k_call: k,
            max_new_tokens: 20,
            ..Default::default()
        };
        let g = run(&m, tokenizer, &calculator(), &o);
        let first_call = g.tokens.iter().position(|&t| t == open).unwrap();
        assert_eq!(first_call, 6 - (k - 1), "k = {k}: {:?}", g.completion);
        // Before it, plain greedy: " a", never the (masked) opener.
        assert_eq!(
            g.completion,
            format!(
                "{}[Calculator(1+2) -> 3]{}",
                " a".repeat(first_call),
                " a".repeat(20)
            )[..g.completion.len()]
        );
        assert_eq!(g.calls[0].position, 2 * first_call);
    }
    // Ties go to the lowest id, as in greedy decoding: an opener tied with a lower id is second.
    let row = {
        let mut r = vec![-100.0f32; VOCAB];
        r[open as usize] = -1.0;
        r[0] = -1.0;
        r
    };
    assert_eq!(call::rank(&row, open), 1);
    assert_eq!(call::opener_in_top_k(&row, &[open], 1), None);
    assert_eq!(call::opener_in_top_k(&row, &[open], 2), Some(open));
}

/// With the " [" opener the call's space precedes it: `position` is the byte offset of the
/// call's "[", so that `completion[position..]` starts with it.
#[test]
fn a_call_opened_with_the_spaced_opener_is_positioned_at_its_bracket() {
    let model = tiny();
    let tokenizer = tok(&model);
    let x = ids(tokenizer).x;
    let spaced = tokenizer.encode_ids(" [").unwrap();
    assert_eq!(spaced.len(), 1, "\" [\" is one token");
    let spaced = spaced[0];
    assert!(CallTokens::from_tokenizer(tokenizer).is_opener(spaced));
    let call = tokenizer.encode_ids("Calculator(1+2) ->").unwrap();
    // " a" twice, then " [" first (and the call) until the call is made.
    let m = mock(move |seq| match seq.iter().rposition(|&t| t == spaced) {
        Some(j) => ranked(&[*call.get(seq.len() - j - 1).unwrap_or(&x)]),
        None if seq.len() < 3 => ranked(&[x]),
        None => ranked(&[spaced, x]),
    });
    let o = GenerateOptions {
        max_new_tokens: 20,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert!(
        g.completion.starts_with(" a a [Calculator(1+2) -> 3] a"),
        "{:?}",
        g.completion
    );
    let c = &g.calls[0];
    assert_eq!((c.status, c.position), (CallStatus::Ok, 5));
    assert!(g.completion[c.position..].starts_with("[Calculator("));
}

/// A call the model closes with "]" as the last token the cap allows is closed, not cut: the
/// cap ends the completion after the call. Likewise a call given up (`too_long`) at the cap.
#[test]
fn a_call_that_ends_at_the_caps_last_token_keeps_its_status() {
    let model = tiny();
    let tokenizer = tok(&model);
    let closed = "Calculator(1+2]";
    let m = scripted(tokenizer, 1, closed, |_| 0);
    let o = GenerateOptions {
        max_new_tokens: 1 + tokenizer.encode_ids(closed).unwrap().len(),
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert_eq!(g.completion, format!("[{closed}"));
    let c = &g.calls[0];
    assert_eq!(
        (c.status, c.input.as_str(), g.finish),
        (CallStatus::ClosedWithoutArrow, "1+2", Finish::Length)
    );
    // Given up at its 4th token, which is the cap's last: too long, its "]" cut by the cap.
    let m = scripted(tokenizer, 1, "Calculator(1+2+3+4+5+6", |_| 0);
    let o = GenerateOptions {
        max_new_tokens: 6,
        max_call_tokens: 4,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert_eq!(
        (g.calls[0].status, g.tokens.len(), g.finish),
        (CallStatus::TooLong, 6, Finish::Length),
        "{:?}",
        g.completion
    );
}

/// A special token's text written inside a call's input (here "<|endoftext|>" in pieces) is
/// not run: `unparsable`, as annotate puts no such call in C*.
#[test]
fn a_special_tokens_text_in_an_input_is_not_run() {
    let model = tiny();
    let tokenizer = tok(&model);
    let open = ids(tokenizer).open;
    let x = ids(tokenizer).x;
    let call: Vec<u32> = ["Calculator(1", "<|", "endoftext", "|>", "+2) ->"]
        .iter()
        .flat_map(|piece| tokenizer.encode_ids(piece).unwrap())
        .collect();
    assert_eq!(
        tokenizer.decode(&call).unwrap(),
        "Calculator(1<|endoftext|>+2) ->"
    );
    let openers = CallTokens::from_tokenizer(tokenizer).openers;
    let m = mock(move |seq| match after_last_opener(seq, &openers) {
        Some(rest) => ranked(&[*call.get(rest.len()).unwrap_or(&x)]),
        None => ranked(&[open, x]),
    });
    let o = GenerateOptions {
        max_new_tokens: 30,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    let c = &g.calls[0];
    assert_eq!(c.status, CallStatus::Unparsable, "{:?}", g.completion);
    assert!(
        c.error.as_deref().unwrap().contains("special token"),
        "{:?}",
        c.error
    );
    assert!(g
        .completion
        .starts_with("[Calculator(1<|endoftext|>+2) ->] a"));
}

/// The fixture's tokenizer with extra tokens that carry text past an arrow (" ->-", " ->]"), as
/// real vocabularies can (punctuation only: the pre-tokenizer splits digits and letters off).
fn tokenizer_with_arrow_tokens(dir: &std::path::Path) -> Tokenizer {
    fixture_tokenizer_edited(dir, |json| {
        let model = &mut json["model"];
        // In the vocabulary as in GPT-2's own file, or `tokenizers` would give it an id of the new
        // tokens'.
        model["vocab"]["<|endoftext|>"] = serde_json::json!(499);
        for (id, (merge, token)) in [
            (["\u{120}->", "-"], "\u{120}->-"),
            (["\u{120}->", "]"], "\u{120}->]"),
            (["-", ">"], "->"),
            (["]", "->"], "]->"),
        ]
        .into_iter()
        .enumerate()
        {
            model["vocab"][token] = serde_json::json!(500 + id);
            model["merges"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!(merge));
        }
    })
}

/// The fixture's tokenizer.json after `edit`, written to `dir` and loaded.
fn fixture_tokenizer_edited(dir: &std::path::Path, edit: impl FnOnce(&mut Value)) -> Tokenizer {
    let path = common::tiny("f32").join("tokenizer.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut json);
    let file = dir.join("tokenizer.json");
    std::fs::write(&file, json.to_string()).unwrap();
    Tokenizer::from_file(&file).unwrap()
}

/// A token that completes the arrow and carries text after it (a guess at the result, or the
/// closing bracket) is cut at the arrow: the result is spliced right after "->", and the text
/// the model wrote past the arrow is not in the completion.
#[test]
fn text_after_the_arrow_in_the_arrow_token_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = &tokenizer_with_arrow_tokens(dir.path());
    assert_eq!(tokenizer.token_id("<|endoftext|>"), Some(499));
    for (written, token) in [
        ("Calculator(1+2) ->-", " ->-"),
        ("Calculator(1+2) ->]", " ->]"),
    ] {
        let ids = tokenizer.encode_ids(written).unwrap();
        let one = tokenizer.encode_ids(token).unwrap();
        assert_eq!(one.len(), 1, "{token:?} is one token");
        assert_eq!(ids.last(), one.last());
        let m = scripted(tokenizer, 1, written, |_| 0);
        let o = GenerateOptions {
            max_new_tokens: 20,
            ..Default::default()
        };
        let g = run(&m, tokenizer, &calculator(), &o);
        assert!(
            g.completion.starts_with("[Calculator(1+2) -> 3] a"),
            "{written:?}: {:?}",
            g.completion
        );
        assert_eq!(g.calls[0].status, CallStatus::Ok);
        assert_eq!(g.calls[0].result, "3");
        // The decoder was fed the cut token, never the one drawn.
        let drawn = *ids.last().unwrap();
        assert!(m.seen.lock().unwrap().iter().all(|s| !s.contains(&drawn)));
        assert_eq!(g.tokens.len(), g.token_log_probs.len());
    }
}

/// Where the arrow token's cut re-tokenizes to an id the model has no row for (a tokenizer
/// with more ids than `vocab_size`: here " ->" holds " ->-"'s id past it), the drawn token
/// stays and the call goes on as written, instead of failing the batch at the next step.
#[test]
fn an_arrow_cut_the_model_cannot_read_is_left_as_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("arrows");
    std::fs::create_dir(&path).unwrap();
    tokenizer_with_arrow_tokens(&path);
    let file = path.join("tokenizer.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let vocab = &mut json["model"]["vocab"];
    let (cut, drawn) = ("\u{120}->", "\u{120}->-");
    let (a, b) = (vocab[cut].clone(), vocab[drawn].clone());
    (vocab[cut], vocab[drawn]) = (b, a);
    std::fs::write(&file, json.to_string()).unwrap();
    let tokenizer = &Tokenizer::from_file(&file).unwrap();
    let written = "Calculator(1+2) ->-";
    let ids = tokenizer.encode_ids(written).unwrap();
    let cut_id = tokenizer.encode_ids(" ->").unwrap()[0];
    let vocab_size = cut_id as usize;
    assert!(ids.iter().all(|&t| (t as usize) < vocab_size), "{ids:?}");
    let m = scripted(tokenizer, 1, written, |_| 0);
    let o = GenerateOptions {
        max_new_tokens: 20,
        vocab_size: Some(vocab_size),
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert!(
        g.completion.starts_with("[Calculator(1+2) ->- 3] a"),
        "{:?}",
        g.completion
    );
    assert_eq!(g.calls[0].status, CallStatus::Ok);
    assert!(m.seen.lock().unwrap().iter().all(|s| !s.contains(&cut_id)));
}

/// A token that closes the call and then writes an arrow ("]->") closes it: the arrow after
/// the "]" is text, not a request to run the tool, and nothing is spliced.
#[test]
fn a_token_that_closes_the_call_before_an_arrow_closes_it() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = &tokenizer_with_arrow_tokens(dir.path());
    let written = "Calculator(1+2]->";
    let ids = tokenizer.encode_ids(written).unwrap();
    assert_eq!(
        ids.last(),
        tokenizer.encode_ids("]->").unwrap().last(),
        "\"]->\" is one token"
    );
    let m = scripted(tokenizer, 1, written, |_| 0);
    let o = GenerateOptions {
        max_new_tokens: 20,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert_eq!(
        g.calls[0].status,
        CallStatus::ClosedWithoutArrow,
        "{:?}",
        g.completion
    );
    assert!(
        g.completion.starts_with("[Calculator(1+2]-> a"),
        "{:?}",
        g.completion
    );
}

#[test]
fn results_are_spliced_and_decoding_resumes_after_them() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(400 / 1400) ->", |_| 0);
    let o = GenerateOptions {
        max_new_tokens: 40,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    let rest = g
        .completion
        .strip_prefix("[Calculator(400 / 1400) -> 0.29]")
        .unwrap_or_else(|| panic!("{:?}", g.completion));
    assert!(
        !rest.is_empty() && rest == " a".repeat(rest.len() / 2),
        "{rest:?}"
    );
    assert_eq!(g.finish, Finish::Length);
    assert_eq!(g.tokens.len(), 40);
    let c = &g.calls[0];
    assert_eq!(
        (c.tool.as_str(), c.input.as_str(), c.result.as_str()),
        ("Calculator", "400 / 1400", "0.29")
    );
    assert_eq!(c.status, CallStatus::Ok);
    // The decoder was fed the spliced result in one step with the arrow, then resumed from it.
    let spliced = tokenizer.encode_ids(" 0.29]").unwrap();
    let seen = m.seen.lock().unwrap();
    let with_result = seen
        .iter()
        .find(|s| s.ends_with(&spliced))
        .expect("the result was fed");
    let arrow_step = seen.iter().position(|s| s == with_result).unwrap();
    assert!(!seen[arrow_step - 1].ends_with(&spliced[..1]));
    assert!(seen[arrow_step + 1].starts_with(with_result));
    // Spliced tokens carry no log-prob; the model's own do.
    let n_none = g.token_log_probs.iter().filter(|l| l.is_none()).count();
    assert_eq!(n_none, spliced.len());
}

#[test]
fn the_call_budget_holds_and_spent_budgets_mask_the_opener() {
    let model = tiny();
    let tokenizer = tok(&model);
    let open = ids(tokenizer).open;
    for max_calls in [0, 1, 2, 3] {
        // The opener is always the most likely token outside a call.
        let m = scripted(tokenizer, 1, "Calculator(2*3) ->", |_| 0);
        let o = GenerateOptions {
            max_calls,
            max_new_tokens: 60,
            ..Default::default()
        };
        let g = run(&m, tokenizer, &calculator(), &o);
        assert_eq!(g.calls.len(), max_calls, "{:?}", g.completion);
        assert!(g
            .calls
            .iter()
            .all(|c| c.status == CallStatus::Ok && c.result == "6"));
        assert_eq!(g.tokens.iter().filter(|&&t| t == open).count(), max_calls);
        assert!(g.completion.ends_with(" a a"), "{:?}", g.completion);
    }
}

struct Failing;
impl Tool for Failing {
    fn name(&self) -> &str {
        "Search"
    }
    fn call(&self, _input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
        Err(ToolError::Failed("service down".into()))
    }
}

/// A tool whose result would close the call early if spliced as is.
struct Bracketed;
impl Tool for Bracketed {
    fn name(&self) -> &str {
        "Calculator"
    }
    fn call(&self, _input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
        Ok("3] [x\n\n  y".into())
    }
}

#[test]
fn results_are_cleaned_as_in_cstar_before_splicing() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let mut tools = ToolRegistry::new();
    tools.register(Bracketed);
    let o = GenerateOptions {
        max_new_tokens: 40,
        ..Default::default()
    };
    let g = generate(&m, tokenizer, &tools, &[Prompt::new("Q")], &o).unwrap();
    assert_eq!(g[0].calls[0].result, "3) (x y");
    assert!(
        g[0].completion.starts_with("[Calculator(1+2) -> 3) (x y]"),
        "{:?}",
        g[0].completion
    );
}

/// A tool whose answer is only special tokens and whitespace: no answer once cleaned.
struct Blank;
impl Tool for Blank {
    fn name(&self) -> &str {
        "Blank"
    }
    fn call(&self, _input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
        Ok(" <|endoftext|>\n".into())
    }
}

#[test]
fn malformed_calls_and_failing_tools_are_closed_and_decoding_goes_on() {
    let model = tiny();
    let tokenizer = tok(&model);
    let mut tools = calculator();
    tools.register(Failing);
    tools.register(Blank);
    let cases = [
        // (what the model writes after "[", status, completion's call part)
        (
            "Search(weather) ->",
            CallStatus::ToolError,
            "[Search(weather) ->]",
        ),
        (
            "Calculator(1/0) ->",
            CallStatus::ToolError,
            "[Calculator(1/0) ->]",
        ),
        ("Blank(x) ->", CallStatus::ToolError, "[Blank(x) ->]"),
        ("Nope(1) ->", CallStatus::UnknownTool, "[Nope(1) ->]"),
        // A name annotate could splice (any script), unregistered here: unknown, not unparsable.
        ("Wétter(x) ->", CallStatus::UnknownTool, "[Wétter(x) ->]"),
        // A line-oriented tool would read "1+" only.
        (
            "Calculator(1+\n2) ->",
            CallStatus::Unparsable,
            "[Calculator(1+\n2) ->]",
        ),
        (
            "what is this ->",
            CallStatus::Unparsable,
            "[what is this ->]",
        ),
        // Unbalanced parentheses: annotate puts no such call in C*, so it is not run.
        (
            "Calculator((1+2) ->",
            CallStatus::Unparsable,
            "[Calculator((1+2) ->]",
        ),
        (
            "Calculator(1+2]",
            CallStatus::ClosedWithoutArrow,
            "[Calculator(1+2]",
        ),
        (
            "Calculator(1+2+3+4+5+6+7+8+9+10+11+12+13+14+15",
            CallStatus::TooLong,
            "",
        ),
    ];
    for (call, status, text) in cases {
        let m = scripted(tokenizer, 1, call, |_| 0);
        let o = GenerateOptions {
            max_new_tokens: 60,
            max_call_tokens: 16,
            ..Default::default()
        };
        let g = run(&m, tokenizer, &tools, &o);
        assert_eq!(g.calls.len(), 1, "{call}");
        let c = &g.calls[0];
        assert_eq!(c.status, status, "{call}: {:?}", g.completion);
        assert_eq!(c.result, "", "{call}");
        assert!(c.error.is_some(), "{call}");
        assert!(g.completion.starts_with(text), "{call}: {:?}", g.completion);
        assert!(
            g.completion.contains("] a a a"),
            "{call}: {:?}",
            g.completion
        );
        if status == CallStatus::TooLong {
            let body = tokenizer.encode_ids(call).unwrap();
            let written = tokenizer.decode(&body[..16]).unwrap();
            assert!(
                g.completion.starts_with(&format!("[{written}] a")),
                "{:?}",
                g.completion
            );
        }
        if status == CallStatus::ToolError {
            assert_eq!(
                c.input,
                &call[call.find('(').unwrap() + 1..call.find(')').unwrap()]
            );
        }
    }
}

/// Every call that did not parse fully keeps as much of its tool and input as was written, as
/// `parse_partial_call` reads a call the length cap cuts: closed, given up or unparsable at
/// the arrow, or cut at its arrow.
#[test]
fn every_status_keeps_the_tool_and_input_decoded_so_far() {
    let model = tiny();
    let tokenizer = tok(&model);
    let long = "Calculator(1+2+3+4+5+6+7+8+9+10+11+12+13+14+15";
    let body = tokenizer.encode_ids(long).unwrap();
    let written = tokenizer.decode(&body[..16]).unwrap();
    let cut = written.split_once('(').unwrap().1.trim_end();
    assert!(
        cut.starts_with("1+2+") && cut.len() < long.len() - 11,
        "{written:?}"
    );
    let cases = [
        // (what the model writes after "[", status, tool, input)
        (
            "Calculator(1+2]",
            CallStatus::ClosedWithoutArrow,
            "Calculator",
            "1+2",
        ),
        (
            "Calculator(]",
            CallStatus::ClosedWithoutArrow,
            "Calculator",
            "",
        ),
        // No "(": no tool, as for a cut call.
        ("Calculator]", CallStatus::ClosedWithoutArrow, "", ""),
        (long, CallStatus::TooLong, "Calculator", cut),
        (
            "Calculator(1+2 ->",
            CallStatus::Unparsable,
            "Calculator",
            "1+2",
        ),
        ("what is this ->", CallStatus::Unparsable, "", ""),
    ];
    for (call, status, tool, input) in cases {
        let m = scripted(tokenizer, 1, call, |_| 0);
        let o = GenerateOptions {
            max_new_tokens: 60,
            max_call_tokens: 16,
            ..Default::default()
        };
        let g = run(&m, tokenizer, &calculator(), &o);
        let c = &g.calls[0];
        assert_eq!(c.status, status, "{call}: {:?}", g.completion);
        assert_eq!((c.tool.as_str(), c.input.as_str()), (tool, input), "{call}");
    }
    // Cut by the cap at an arrow whose call does not parse: as far as it was written.
    let call = "Calculator(1+2 ->";
    let m = scripted(tokenizer, 1, call, |_| 0);
    let o = GenerateOptions {
        max_new_tokens: 1 + tokenizer.encode_ids(call).unwrap().len(),
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    let c = &g.calls[0];
    assert_eq!(c.status, CallStatus::Unfinished, "{:?}", g.completion);
    assert_eq!(g.completion, format!("[{call}"));
    assert_eq!((c.tool.as_str(), c.input.as_str()), ("Calculator", "1+2"));
}

#[test]
fn end_of_text_stops_generation_and_cuts_an_open_call() {
    let model = tiny();
    let tokenizer = tok(&model);
    let eos = tokenizer.token_id("<|endoftext|>").unwrap();
    let x = ids(tokenizer).x;
    // " a" three times, then end of text.
    let m = mock(move |seq| ranked(&[if seq.len() < 4 { x } else { eos }]));
    let g = run(&m, tokenizer, &calculator(), &GenerateOptions::default());
    assert_eq!((g.completion.as_str(), g.finish), (" a a a", Finish::Eos));
    // Inside a call.
    let open = ids(tokenizer).open;
    let m = mock(move |seq| ranked(&[if seq.len() < 3 { open } else { eos }]));
    let g = run(&m, tokenizer, &calculator(), &GenerateOptions::default());
    assert_eq!(g.finish, Finish::Eos);
    assert_eq!(g.calls[0].status, CallStatus::Unfinished);
    // Without stopping at end of text, the length cap ends it.
    let o = GenerateOptions {
        stop_at_eos: false,
        max_new_tokens: 7,
        ..Default::default()
    };
    let m = mock(move |seq| ranked(&[if seq.len() < 4 { x } else { eos }]));
    let g = run(&m, tokenizer, &calculator(), &o);
    assert_eq!((g.tokens.len(), g.finish), (7, Finish::Length));
}

#[test]
fn n_positions_caps_completions_and_rejects_prompts_without_room() {
    let model = tiny();
    let tokenizer = tok(&model);
    let x = ids(tokenizer).x;
    let m = mock(move |_| ranked(&[x]));
    let o = GenerateOptions {
        n_positions: Some(6),
        max_new_tokens: 100,
        ..Default::default()
    };
    let g = generate(&m, tokenizer, &calculator(), &[Prompt::new("Q Q")], &o).unwrap();
    assert_eq!(
        g[0].tokens.len(),
        6 - tokenizer.encode_ids("Q Q").unwrap().len()
    );
    let err = generate(
        &m,
        tokenizer,
        &calculator(),
        &[Prompt::new("Q Q Q Q Q Q")],
        &o,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("prompt 0") && err.contains("n_positions"),
        "{err}"
    );
    // A prompt of megabytes is refused on a head of it, not tokenized whole (seconds and
    // gigabytes for a line within the 64 MiB limit).
    let long = "Q ".repeat(1 << 20);
    let err = generate(&m, tokenizer, &calculator(), &[Prompt::new(&long)], &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prompt of more than") && err.contains("n_positions (6)"),
        "{err}"
    );
    let err = generate(&m, tokenizer, &calculator(), &[Prompt::new("")], &o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty prompt"), "{err}");
}

/// End of text inside a call leaves it `unfinished`, with the tool and input decoded so far and
/// the reason, as a call the length cap cuts.
#[test]
fn end_of_text_in_a_call_keeps_what_was_decoded_of_it() {
    let model = tiny();
    let tokenizer = tok(&model);
    let eos = tokenizer.token_id("<|endoftext|>").unwrap();
    let open = ids(tokenizer).open;
    let call = tokenizer.encode_ids("Calculator(1+2").unwrap();
    let openers = CallTokens::from_tokenizer(tokenizer).openers;
    let m = mock(move |seq| match after_last_opener(seq, &openers) {
        Some(rest) => ranked(&[*call.get(rest.len()).unwrap_or(&eos)]),
        None => ranked(&[open]),
    });
    let g = run(&m, tokenizer, &calculator(), &GenerateOptions::default());
    assert_eq!(
        (g.completion.as_str(), g.finish),
        ("[Calculator(1+2", Finish::Eos)
    );
    let c = &g.calls[0];
    assert_eq!(
        (
            c.status,
            c.tool.as_str(),
            c.input.as_str(),
            c.result.as_str()
        ),
        (CallStatus::Unfinished, "Calculator", "1+2", "")
    );
    assert_eq!(c.error.as_deref(), Some("generation ended inside the call"));
}

/// `max_new_tokens` 0 writes nothing: no token, no call, not even one the model would open or
/// an end of text it would write first; the completion ends for its length.
#[test]
fn max_new_tokens_zero_writes_nothing() {
    let model = tiny();
    let tokenizer = tok(&model);
    let open = ids(tokenizer).open;
    let eos = tokenizer.token_id("<|endoftext|>").unwrap();
    for first in [open, eos] {
        let m = mock(move |_| ranked(&[first]));
        let o = GenerateOptions {
            max_new_tokens: 0,
            ..Default::default()
        };
        let g = run(&m, tokenizer, &calculator(), &o);
        assert_eq!(
            (
                g.completion.as_str(),
                g.tokens.len(),
                g.calls.len(),
                g.finish
            ),
            ("", 0, 0, Finish::Length),
            "{first}"
        );
    }
}

/// Without stopping at end of text, an end-of-text token inside a call is text like any other:
/// the call goes on (here until it is given up) and the length cap ends the completion.
#[test]
fn without_stopping_at_end_of_text_a_call_goes_on_past_it() {
    let model = tiny();
    let tokenizer = tok(&model);
    let eos = tokenizer.token_id("<|endoftext|>").unwrap();
    let open = ids(tokenizer).open;
    let m = mock(move |seq| ranked(&[if seq.len() < 3 { open } else { eos }]));
    let o = GenerateOptions {
        stop_at_eos: false,
        max_new_tokens: 10,
        max_call_tokens: 4,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert_eq!((g.tokens.len(), g.finish), (10, Finish::Length));
    assert_eq!(g.calls[0].status, CallStatus::TooLong);
}

/// A prompt of exactly `n_positions` tokens leaves no room: refused; one position more leaves
/// room for one token.
#[test]
fn a_prompt_of_exactly_n_positions_tokens_is_refused() {
    let model = tiny();
    let tokenizer = tok(&model);
    let x = ids(tokenizer).x;
    let m = mock(move |_| ranked(&[x]));
    let n = tokenizer.encode_ids("Q Q").unwrap().len();
    let with_room = |n_positions| GenerateOptions {
        n_positions: Some(n_positions),
        ..Default::default()
    };
    let err = generate(
        &m,
        tokenizer,
        &calculator(),
        &[Prompt::new("Q Q")],
        &with_room(n),
    )
    .unwrap_err()
    .to_string();
    let want = format!("prompt of {n} tokens leaves no room to generate within n_positions ({n})");
    assert!(err.contains(&want), "{err}");
    let o = with_room(n + 1);
    let g = generate(&m, tokenizer, &calculator(), &[Prompt::new("Q Q")], &o).unwrap();
    assert_eq!(
        (g[0].completion.as_str(), g[0].finish),
        (" a", Finish::Length)
    );
}

/// `batch_size` 0 decodes the prompts one at a time, as 1 does.
#[test]
fn a_batch_size_of_zero_is_one() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let prompts = [Prompt::new("Q"), Prompt::new("Q")];
    let run_with = |batch_size| {
        let o = GenerateOptions {
            max_new_tokens: 12,
            batch_size,
            ..Default::default()
        };
        generate(&m, tokenizer, &calculator(), &prompts, &o).unwrap()
    };
    let one = run_with(1);
    assert_eq!(one.len(), 2);
    assert_eq!(run_with(0), one);
}

// ---------------------------------------------------------------------------------------------
// JSONL, CLI, determinism.

#[test]
fn jsonl_answers_every_line_in_order_with_error_lines() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let input = concat!(
        r#"{"id": "a", "prompt": "Q"}"#,
        "\n",
        "not json\n",
        r#"{"id": 7, "prompt": ""}"#,
        "\n",
        r#"{"id": 8}"#,
        "\n",
        r#"{"id": 9, "prompt": "Q", "answer": "3"}"#,
        "\n"
    );
    // A line that is not UTF-8 fails alone.
    let mut input = input.as_bytes().to_vec();
    input.extend(b"{\"id\": 10, \"prompt\": \"\xff\"}\n");
    let mut out = Vec::new();
    let o = two_per_batch(12);
    let summary =
        generate_jsonl(input.as_slice(), &mut out, &m, tokenizer, &calculator(), &o).unwrap();
    assert_eq!(
        (
            summary.lines,
            summary.generated,
            summary.failed,
            summary.calls,
            summary.calls_ok,
            summary.calls_with_result
        ),
        (6, 2, 4, 2, 2, 2)
    );
    let lines = rows(&out);
    assert_eq!(lines.len(), 6);
    assert!(lines[5]["error"].as_str().unwrap().contains("not UTF-8"));
    assert_eq!(lines[0]["id"], "a");
    assert!(lines[0]["completion"]
        .as_str()
        .unwrap()
        .starts_with("[Calculator(1+2) -> 3] a"));
    assert_eq!(lines[0]["finish"], "length");
    let call = &lines[0]["calls"][0];
    assert_eq!(call["position"], 0);
    assert_eq!(call["tool"], "Calculator");
    assert_eq!(call["input"], "1+2");
    assert_eq!(call["result"], "3");
    assert_eq!(call["status"], "ok");
    assert!(lines[1]["error"]
        .as_str()
        .unwrap()
        .contains("malformed JSON"));
    assert_eq!(lines[1]["line"], 2);
    assert_eq!(lines[2]["id"], 7);
    assert!(lines[2]["error"].as_str().unwrap().contains("empty prompt"));
    assert!(lines[3]["error"].as_str().unwrap().contains("prompt"));
    assert_eq!(lines[4]["id"], 9);
    assert_eq!(lines[4]["completion"], lines[0]["completion"]);
}

/// An input that fails to read partway through a batch: the lines read before the failure are
/// still answered, then the run stops with an error naming the line.
#[test]
fn lines_read_before_an_input_error_are_still_answered() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let input = q_lines(3);
    let o = two_per_batch(12);
    let mut out = Vec::new();
    let reader = std::io::BufReader::new(common::FailsAfter::new(input));
    let err = generate_jsonl(reader, &mut out, &m, tokenizer, &calculator(), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("<input line 4>") && err.contains("went away"),
        "{err}"
    );
    let lines = rows(&out);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (k, l) in lines.iter().enumerate() {
        assert_eq!(
            (l["id"].as_u64(), l["finish"].as_str()),
            (Some(k as u64), Some("length"))
        );
    }
}

/// An input that fails to read right after a whole batch (at a batch border) stops the run
/// too, every line before it answered: the failure is not taken for the end of the input.
#[test]
fn an_input_error_at_a_batch_border_stops_the_run() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let o = two_per_batch(4);
    let mut out = Vec::new();
    let reader = std::io::BufReader::new(common::FailsAfter::new(q_lines(2)));
    let err = generate_jsonl(reader, &mut out, &m, tokenizer, &calculator(), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("<input line 3>") && err.contains("went away"),
        "{err}"
    );
    assert_eq!(rows(&out).len(), 2);
}

/// A model whose next-token row holds NaN (it overflowed) ends that completion with
/// `Finish::NotFinite`, and `generate_jsonl` answers its line with an error line; the other
/// prompts of the batch are generated.
#[test]
fn a_row_that_is_not_finite_fails_its_line_alone() {
    let model = tiny();
    let tokenizer = tok(&model);
    let x = tokenizer.encode_ids("x").unwrap()[0];
    let poison = tokenizer.encode_ids("P").unwrap()[0];
    // A prompt ending in "P" gets NaN rows once it has 2 completion tokens.
    let m = mock(move |seq| {
        let p_at = seq.iter().position(|&t| t == poison);
        match p_at {
            Some(at) if seq.len() >= at + 3 => vec![f32::NAN; VOCAB],
            _ => ranked(&[x]),
        }
    });
    let input = concat!(
        r#"{"id": 1, "prompt": "Q"}"#,
        "\n",
        r#"{"id": 2, "prompt": "P"}"#,
        "\n",
    );
    let o = two_per_batch(6);
    let mut out = Vec::new();
    let summary =
        generate_jsonl(input.as_bytes(), &mut out, &m, tokenizer, &calculator(), &o).unwrap();
    assert_eq!((summary.generated, summary.failed), (1, 1));
    let lines = rows(&out);
    assert_eq!(lines[0]["finish"], "length", "{lines:?}");
    let error = lines[1]["error"].as_str().unwrap();
    assert!(
        error.starts_with("line 2: the model's next-token scores are not finite")
            && error.contains("after 2 completion tokens"),
        "{error}"
    );
    let g = generate(&m, tokenizer, &calculator(), &[Prompt::new("P")], &o).unwrap();
    assert_eq!((g[0].finish, g[0].tokens.len()), (Finish::NotFinite, 2));
}

/// A row holding +inf (an overflow) is not finite either: the completion ends there, as with
/// NaN, instead of drawing the infinite token.
#[test]
fn a_row_with_plus_infinity_is_not_finite() {
    let model = tiny();
    let tokenizer = tok(&model);
    let x = ids(tokenizer).x;
    let m = mock(move |seq| {
        let mut row = ranked(&[x]);
        if seq.len() >= 3 {
            row[7] = f32::INFINITY;
        }
        row
    });
    let o = GenerateOptions {
        max_new_tokens: 6,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert_eq!(
        (g.completion.as_str(), g.finish, g.tokens.len()),
        (" a a", Finish::NotFinite, 2)
    );
}

/// The (id, url, date) of every document a tool call saw.
type SeenDocs = Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>;

/// A tool that records the document context of every call (and answers as Calculator).
struct Docs(SeenDocs);
impl Tool for Docs {
    fn name(&self) -> &str {
        "Calculator"
    }
    fn call(&self, _input: &str, doc: &DocContext<'_>) -> Result<String, ToolError> {
        self.0.lock().unwrap().push((
            doc.id.to_string(),
            doc.url.map(String::from),
            doc.date.map(String::from),
        ));
        Ok("3".into())
    }
}

/// Tools see the prompt's document: its id (a JSONL string id as is, an integer id as its
/// digits, no id as ""), URL and date, each in its own field.
#[test]
fn tools_see_the_prompts_id_url_and_date() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tools = ToolRegistry::new();
    tools.register(Docs(seen.clone()));
    let o = GenerateOptions {
        max_new_tokens: 12,
        ..Default::default()
    };
    let prompt = Prompt {
        text: "Q".into(),
        id: "doc-1".into(),
        url: Some("https://example.com/2020/05/01/x".into()),
        date: Some("2023-01-30".into()),
    };
    generate(&m, tokenizer, &tools, &[prompt], &o).unwrap();
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        seen.lock().unwrap().drain(..).collect::<Vec<_>>(),
        vec![(
            "doc-1".to_string(),
            some("https://example.com/2020/05/01/x"),
            some("2023-01-30")
        )]
    );
    let input = concat!(
        r#"{"id": "s", "prompt": "Q", "url": "https://example.com/a", "date": "2021-02-03"}"#,
        "\n",
        r#"{"id": 7, "prompt": "Q"}"#,
        "\n",
        r#"{"prompt": "Q", "date": "2022-12-31"}"#,
        "\n",
    );
    let mut out = Vec::new();
    generate_jsonl(input.as_bytes(), &mut out, &m, tokenizer, &tools, &o).unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (
                "s".to_string(),
                some("https://example.com/a"),
                some("2021-02-03")
            ),
            ("7".to_string(), None, None),
            (String::new(), None, some("2022-12-31")),
        ]
    );
}

/// A line that cannot be read as text (not UTF-8) is answered with an error naming its own
/// line number, in the error and in "line".
#[test]
fn an_unreadable_line_names_its_own_line() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let mut input = q_lines(2).into_bytes();
    input.extend(b"{\"id\": 2, \"prompt\": \"\xff\"}\n");
    input.extend(q_lines(1).as_bytes());
    let o = two_per_batch(4);
    let mut out = Vec::new();
    generate_jsonl(input.as_slice(), &mut out, &m, tokenizer, &calculator(), &o).unwrap();
    let lines = rows(&out);
    assert_eq!(lines.len(), 4);
    let error = lines[2]["error"].as_str().unwrap();
    assert!(error.starts_with("line 3: not UTF-8"), "{error}");
    assert_eq!(
        (&lines[2]["line"], &lines[2]["id"]),
        (&Value::from(3), &Value::Null)
    );
    assert_eq!(lines[3]["line"], 4);
}

/// A backend error (a lost device, out of memory) stops the run, naming the batch's input
/// lines, with every earlier batch written: a `--resume` answers that batch, where error lines
/// would have been kept for good. A batch whose prompts fail still gets error lines.
#[test]
fn a_backend_error_stops_the_run_naming_its_batch() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// `inner`'s sessions, but the `fail_at`-th (0-based) fails with a backend error.
    struct FailsOnce<'a> {
        inner: &'a dyn Decoder,
        sessions: AtomicUsize,
        fail_at: usize,
    }
    struct Broken;
    impl DecodeSession for Broken {
        fn new_sequence(&mut self) -> usize {
            0
        }
        fn extend(&mut self, _: &[usize], _: &[Vec<u32>]) -> toolsift::Result<Vec<Vec<f32>>> {
            Err(toolsift::Error::Backend("cuda: the device was lost".into()))
        }
        fn len(&self, _: usize) -> usize {
            0
        }
    }
    impl Decoder for FailsOnce<'_> {
        fn session(&self) -> Box<dyn DecodeSession + Send + '_> {
            if self.sessions.fetch_add(1, Ordering::SeqCst) == self.fail_at {
                Box::new(Broken)
            } else {
                self.inner.session()
            }
        }
    }
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let failing = FailsOnce {
        inner: &m,
        sessions: AtomicUsize::new(0),
        fail_at: 1,
    };
    let input = q_lines(5);
    let o = two_per_batch(12);
    let mut out = Vec::new();
    let err = generate_jsonl(
        input.as_bytes(),
        &mut out,
        &failing,
        tokenizer,
        &calculator(),
        &o,
    )
    .unwrap_err();
    assert!(!err.is_input());
    assert_eq!(
        err.to_string(),
        "generating input lines 3-4: cuda: the device was lost"
    );
    let lines = rows(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines.iter().all(|l| l["completion"].is_string()),
        "{lines:?}"
    );
}

#[test]
fn sampling_is_deterministic_for_a_seed_whatever_the_batching() {
    let model = tiny();
    let tokenizer = tok(&model);
    let engine = CpuScorer::new(&model);
    let prompts: Vec<Prompt> = ["The sum of", "Out of 1400", "Q", "[", "Today is"]
        .into_iter()
        .map(Prompt::new)
        .collect();
    let run = |seed: u64, batch_size: usize| {
        let o = GenerateOptions {
            temperature: 1.0,
            seed,
            batch_size,
            max_new_tokens: 12,
            top_k_call: 50,
            max_call_tokens: 4,
            ..Default::default()
        };
        generate(&engine, tokenizer, &calculator(), &prompts, &o).unwrap()
    };
    // The choices, not the log-probs: batching changes float rounding in the last bits.
    let choices = |gens: Vec<Generation>| -> Vec<_> {
        gens.into_iter()
            .map(|g| (g.tokens, g.completion, g.calls, g.finish))
            .collect()
    };
    let a = choices(run(5, 8));
    assert_eq!(a, choices(run(5, 8)));
    assert_eq!(a, choices(run(5, 1)), "batching must not change samples");
    assert_eq!(a, choices(run(5, 2)));
    assert_ne!(a, choices(run(6, 8)), "another seed, other samples");
}

/// In a JSONL run each line samples from its own stream (its line number), whatever the batch
/// it falls in: the same completions as `generate` on the same prompts.
#[test]
fn jsonl_lines_sample_from_their_own_streams_whatever_the_batching() {
    let model = tiny();
    let tokenizer = tok(&model);
    let engine = CpuScorer::new(&model);
    let texts = ["The sum of", "Out of 1400", "Q", "[", "Today is"];
    let o = GenerateOptions {
        temperature: 1.0,
        seed: 5,
        max_new_tokens: 12,
        top_k_call: 50,
        max_call_tokens: 4,
        ..Default::default()
    };
    let prompts: Vec<Prompt> = texts.into_iter().map(Prompt::new).collect();
    let want: Vec<String> = generate(&engine, tokenizer, &calculator(), &prompts, &o)
        .unwrap()
        .into_iter()
        .map(|g| g.completion)
        .collect();
    let input: String = texts
        .iter()
        .map(|t| format!("{}\n", serde_json::json!({ "prompt": t })))
        .collect();
    for batch_size in [1, 2, 5] {
        let o = GenerateOptions {
            batch_size,
            ..o.clone()
        };
        let mut out = Vec::new();
        generate_jsonl(
            input.as_bytes(),
            &mut out,
            &engine,
            tokenizer,
            &calculator(),
            &o,
        )
        .unwrap();
        let got: Vec<String> = rows(&out)
            .iter()
            .map(|l| l["completion"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(got, want, "batch_size {batch_size}");
    }
}

/// A tool that counts its calls (Calculator's results).
struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);
impl Tool for Counting {
    fn name(&self) -> &str {
        "Calculator"
    }
    fn call(&self, input: &str, doc: &DocContext<'_>) -> Result<String, ToolError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Calculator::new().call(input, doc)
    }
}

#[test]
fn a_call_the_length_cap_cuts_is_unfinished() {
    let model = tiny();
    let tokenizer = tok(&model);
    let call = "Calculator(1+2) ->";
    let n = tokenizer.encode_ids(call).unwrap().len();
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tools = ToolRegistry::new();
    tools.register(Counting(runs.clone()));
    let m = scripted(tokenizer, 1, call, |_| 0);
    // "[" + the call: the arrow is the last token the cap allows. No room for a result, so the
    // tool is not run.
    let o = GenerateOptions {
        max_new_tokens: 1 + n,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &tools, &o);
    assert_eq!(g.completion, "[Calculator(1+2) ->");
    assert_eq!(g.calls[0].status, CallStatus::Unfinished);
    assert_eq!(g.calls[0].input, "1+2");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);
    // One more token: the result is spliced and cut before its "]".
    let o = GenerateOptions {
        max_new_tokens: 2 + n,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &tools, &o);
    assert!(!g.completion.ends_with(']'), "{:?}", g.completion);
    assert_eq!(g.calls[0].status, CallStatus::Unfinished);
    assert_eq!(g.calls[0].result, "3");
    assert!(g.calls[0].error.as_deref().unwrap().contains("cut"));
    // One log-prob per token kept: the cut drops the result's tail from both.
    assert_eq!(g.token_log_probs.len(), g.tokens.len());
    // A run's summary counts that call as one with a result, though not as ok.
    let mut out = Vec::new();
    let input = r#"{"prompt": "Q"}"#.to_string() + "\n";
    let summary =
        generate_jsonl(input.as_bytes(), &mut out, &m, tokenizer, &calculator(), &o).unwrap();
    assert_eq!(
        (summary.calls, summary.calls_ok, summary.calls_with_result),
        (1, 0, 1)
    );
    // Room for all of it: ok.
    let o = GenerateOptions {
        max_new_tokens: 40,
        ..Default::default()
    };
    assert_eq!(
        run(&m, tokenizer, &tools, &o).calls[0].status,
        CallStatus::Ok
    );
    // Room for exactly all of it: the result's "]" is the cap's last token, and the call is
    // ok (the cap cuts nothing).
    let status_at = |cap: usize| {
        let o = GenerateOptions {
            max_new_tokens: cap,
            ..Default::default()
        };
        run(&m, tokenizer, &tools, &o)
    };
    let exact = (1 + n..40)
        .find(|&cap| status_at(cap).calls[0].status == CallStatus::Ok)
        .expect("some cap leaves room for the result");
    let g = status_at(exact);
    assert!(g.completion.ends_with(" 3]"), "{:?}", g.completion);
    assert_eq!((g.tokens.len(), g.finish), (exact, Finish::Length));
}

#[test]
fn a_call_the_length_cap_cuts_keeps_what_was_decoded_of_it() {
    let model = tiny();
    let tokenizer = tok(&model);
    let call = "Calculator(108 / 540 * 100) ->";
    let n = tokenizer.encode_ids(call).unwrap().len();
    let m = scripted(tokenizer, 1, call, |_| 0);
    let mut seen = Vec::new();
    // "[" alone up to the arrow: every cut of the call.
    for cap in 1..=1 + n {
        let o = GenerateOptions {
            max_new_tokens: cap,
            ..Default::default()
        };
        let g = run(&m, tokenizer, &calculator(), &o);
        let c = &g.calls[0];
        assert_eq!(c.status, CallStatus::Unfinished, "{:?}", g.completion);
        seen.push((g.completion.clone(), c.tool.clone(), c.input.clone()));
    }
    let find = |completion: &str| {
        seen.iter()
            .find(|(c, _, _)| c == completion)
            .map(|(_, tool, input)| (tool.as_str(), input.as_str()))
    };
    // No "(" yet: the name may still grow, so it is no tool yet.
    assert_eq!(find("["), Some(("", "")), "{seen:?}");
    assert_eq!(find("[Calculator"), Some(("", "")), "{seen:?}");
    // The tool once "Tool(" is in, and the input as far as it goes.
    assert_eq!(find("[Calculator("), Some(("Calculator", "")), "{seen:?}");
    assert_eq!(
        find("[Calculator(108"),
        Some(("Calculator", "108")),
        "{seen:?}"
    );
    assert_eq!(
        find("[Calculator(108 / 540 * 100)"),
        Some(("Calculator", "108 / 540 * 100")),
        "{seen:?}"
    );
    assert_eq!(
        find("[Calculator(108 / 540 * 100) ->"),
        Some(("Calculator", "108 / 540 * 100")),
        "{seen:?}"
    );
    // Every cut after the "(" carries the tool, and an input that the completion shows.
    for (completion, tool, input) in &seen {
        if let Some((_, after)) = completion.split_once('(') {
            assert_eq!(tool, "Calculator", "{completion:?}");
            assert!(
                after.starts_with(input.as_str()),
                "{completion:?}: {input:?}"
            );
        }
    }
}

/// A tool whose result holds the end-of-text token's text.
struct EndOfText;
impl Tool for EndOfText {
    fn name(&self) -> &str {
        "Calculator"
    }
    fn call(&self, _input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
        Ok("3 <|endoftext|> 4".into())
    }
}

#[test]
fn a_special_tokens_text_in_a_result_is_not_spliced_as_that_token() {
    let model = tiny();
    let tokenizer = tok(&model);
    let eos = tokenizer.token_id("<|endoftext|>").unwrap();
    let mut tools = ToolRegistry::new();
    tools.register(EndOfText);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let o = GenerateOptions {
        max_new_tokens: 30,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &tools, &o);
    assert!(!g.tokens.contains(&eos), "{:?}", g.completion);
    assert_eq!(g.calls[0].result, "3 4");
}

#[test]
fn options_that_would_mean_something_else_are_errors() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    for (o, want) in [
        (
            GenerateOptions {
                max_call_tokens: 0,
                ..Default::default()
            },
            "max_call_tokens",
        ),
        (
            GenerateOptions {
                top_k: Some(0),
                ..Default::default()
            },
            "top_k",
        ),
    ] {
        let err = generate(&m, tokenizer, &calculator(), &[Prompt::new("Q")], &o)
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err}");
    }
    // "none" in any case: no tools.
    let none = toolsift::generate::tools_from_config(None, Some(&["None".to_string()])).unwrap();
    assert!(none.get("Calculator").is_none());
    // An empty or blank --tools (an unset shell variable) is no list, not "none".
    for blank in ["", " "] {
        let err = toolsift::generate::tools_from_config(None, Some(&[blank.to_string()]))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--tools none"), "{err}");
    }
}

#[test]
fn cli_refuses_to_overwrite_its_input_and_names_files_in_io_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_toolsift");
    let model = common::tiny("f32");
    let prompts = tmp.path().join("p.jsonl");
    let text = "{\"id\": 1, \"prompt\": \"The sum\"}\n";
    std::fs::write(&prompts, text).unwrap();
    // `generate --model <tiny> ARGS`.
    let generate = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new(bin)
            .args(["generate", "--model"])
            .arg(&model)
            .args(args)
            .output()
            .unwrap()
    };
    let out = generate(&[
        "--max-new-tokens".as_ref(),
        "3".as_ref(),
        "--input".as_ref(),
        prompts.as_ref(),
        "--output".as_ref(),
        tmp.path().join(".").join("p.jsonl").as_ref(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("the output is the input"));
    assert_eq!(std::fs::read_to_string(&prompts).unwrap(), text);
    // Nor its --config.
    let config = tmp.path().join("tools.toml");
    std::fs::write(&config, "[tools.calculator]\nenabled = true\n").unwrap();
    let out = generate(&[
        "--max-new-tokens".as_ref(),
        "3".as_ref(),
        "--input".as_ref(),
        prompts.as_ref(),
        "--config".as_ref(),
        config.as_ref(),
        "--output".as_ref(),
        config.as_ref(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("the output is the --config file"));
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "[tools.calculator]\nenabled = true\n"
    );
    // --resume goes on from a file of prompts, not from --prompt (it was silently ignored).
    let one = tmp.path().join("one.jsonl");
    let out = generate(&[
        "--prompt".as_ref(),
        "The sum".as_ref(),
        "--resume".as_ref(),
        "--output".as_ref(),
        one.as_ref(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    assert!(!tmp.path().join("one.jsonl").exists());
    // Flag values are refused as flags, naming them.
    for (flag, value, want) in [
        ("--max-call-tokens", "0", "must be at least 1"),
        ("--temperature", "1e39", "within f32's range"),
    ] {
        let out = generate(&[
            "--prompt".as_ref(),
            "The sum".as_ref(),
            flag.as_ref(),
            value.as_ref(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(flag) && stderr.contains(want),
            "{stderr}"
        );
    }

    let folder = tmp.path().join("prompts_dir");
    std::fs::create_dir(&folder).unwrap();
    let out = generate(&["--input".as_ref(), folder.as_ref()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("prompts_dir"),
        "{err}"
    );
}

#[test]
fn cli_generates_from_a_prompt_and_from_jsonl() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"id\": 1, \"prompt\": \"The sum\"}\n{\"id\": 2}\n",
    )
    .unwrap();
    let config = tmp.path().join("config.toml");
    std::fs::write(
        &config,
        "seed = 5\n[per_tool.calendar]\nk = 5\n[tools.calendar]\ndate = \"2023-01-30\"\n",
    )
    .unwrap();
    let output = tmp.path().join("out.jsonl");
    let bin = env!("CARGO_BIN_EXE_toolsift");
    let model = common::tiny("f32");
    let out = std::process::Command::new(bin)
        .args(["generate", "--max-new-tokens", "6", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .arg("--config")
        .arg(&config)
        .args(["--tools", "Calculator,Calendar"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a failed line fails the run");
    let lines: Vec<Value> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["id"], 1);
    assert!(lines[0]["completion"].is_string());
    assert!(lines[1]["error"].is_string());

    let out = std::process::Command::new(bin)
        .args([
            "generate",
            "--max-new-tokens",
            "4",
            "--prompt",
            "Hi",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["id"], Value::Null);

    let out = std::process::Command::new(bin)
        .args([
            "generate",
            "--prompt",
            "Hi",
            "--tools",
            "WikiSearch",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("WikiSearch"));
}

/// A model with fewer rows (256) than its tokenizer has ids (the tiny fixture's 500), and a
/// prompt whose tokens are all below 256 and one with a token above.
fn small_vocab_model() -> (Model, String, String, u32) {
    use toolsift::model::{DType, GptjConfig, GptjWeights};
    let tokenizer = Tokenizer::from_file(&common::tiny("f32").join("tokenizer.json")).unwrap();
    let config = GptjConfig::small(1, 32, 2, 4, 256);
    let weights = GptjWeights::random(&config, 7, DType::F32);
    let words = ["Q", "a b", "The sum", "participants", "Out of 1400"];
    let max_id = |w: &str| *tokenizer.encode_ids(w).unwrap().iter().max().unwrap();
    let inside = words.iter().find(|w| max_id(w) < 256).unwrap().to_string();
    let outside = words.iter().find(|w| max_id(w) >= 256).unwrap().to_string();
    let bad = tokenizer
        .encode_ids(&outside)
        .unwrap()
        .into_iter()
        .find(|&t| t >= 256)
        .unwrap();
    (
        Model::from_parts(config, weights, Some(tokenizer)).unwrap(),
        inside,
        outside,
        bad,
    )
}

/// A prompt with a token the model has no row for (a tokenizer with more ids than vocab_size)
/// is, with `vocab_size` given, an error of its own line, naming the token; the other lines of
/// its batch, and of later batches, are generated.
#[test]
fn a_prompt_outside_the_vocabulary_fails_alone() {
    let (model, inside, outside, bad) = small_vocab_model();
    let tokenizer = tok(&model);
    let engine = CpuScorer::new(&model);
    let o = GenerateOptions {
        max_new_tokens: 3,
        max_calls: 0,
        batch_size: 3,
        vocab_size: Some(model.config().vocab_size),
        ..Default::default()
    };
    let prompts = [&inside, &outside, &inside, &inside, &outside];
    let input: String = prompts
        .iter()
        .enumerate()
        .map(|(k, p)| format!("{}\n", serde_json::json!({"id": k, "prompt": p})))
        .collect();
    let mut out = Vec::new();
    let summary = generate_jsonl(
        input.as_bytes(),
        &mut out,
        &engine,
        tokenizer,
        &ToolRegistry::new(),
        &o,
    )
    .unwrap();
    assert_eq!((summary.generated, summary.failed), (3, 2));
    let lines = rows(&out);
    for (k, line) in lines.iter().enumerate() {
        assert_eq!(line["id"], k);
        if prompts[k] == &outside {
            let want = format!(
                "line {}: token id {bad} is outside the vocabulary (vocab_size 256)",
                k + 1
            );
            let err = line["error"].as_str().unwrap();
            assert!(err.starts_with(&want), "{err}");
        } else {
            assert!(line["completion"].is_string(), "{line}");
        }
    }
    // The library call names the prompt by its index.
    let err = generate(
        &engine,
        tokenizer,
        &ToolRegistry::new(),
        &[Prompt::new(inside.as_str()), Prompt::new(outside.as_str())],
        &o,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with(&format!("prompt 1: token id {bad} is outside")),
        "{err}"
    );
}

/// The CLI warns when a model's tokenizer has more ids than its vocab_size, and fails only the
/// line that has one.
#[test]
fn cli_warns_about_a_tokenizer_larger_than_the_vocabulary() {
    let (model, inside, outside, bad) = small_vocab_model();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    model.save(&dir).unwrap();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(
        &input,
        format!(
            "{}\n{}\n",
            serde_json::json!({"id": 1, "prompt": outside}),
            serde_json::json!({"id": 2, "prompt": inside})
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args([
            "generate",
            "--max-new-tokens",
            "2",
            "--tools",
            "none",
            "--model",
        ])
        .arg(&dir)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("tokenizer.json") && stderr.contains("vocab_size is 256"),
        "{stderr}"
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines[0]["error"]
            .as_str()
            .unwrap()
            .contains(&format!("line 1: token id {bad} is outside")),
        "{lines:?}"
    );
    assert!(lines[1]["completion"].is_string(), "{lines:?}");
}

/// `--config` is read as annotate's config: a misspelled table is an error naming it, before
/// the model is loaded.
#[test]
fn cli_refuses_a_config_with_an_unknown_table() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.toml");
    std::fs::write(&config, "[tool.calculator]\nenabled = false\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["generate", "--prompt", "Hi", "--model"])
        .arg(tmp.path().join("no-model-here"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("config.toml") && stderr.contains("`tool`"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// The same loop on the trained demo model (assets/demo), where calls are real: the model opens
// them, writes well-formed calculator inputs and copies the result it is given.

fn demo() -> Model {
    let dir = toolsift::demo::assets::materialize().unwrap();
    Model::load(&dir).unwrap()
}

fn demo_prompts(n: usize) -> Vec<toolsift::demo::tool_use::ArithmeticPrompt> {
    let docs = toolsift::demo::corpus::generate(toolsift::demo::EVAL_SEED, 60);
    let mut prompts = toolsift::demo::tool_use::arithmetic_prompts(&docs);
    prompts.truncate(n);
    prompts
}

/// How many tokens outrank the best opener in `row`.
fn opener_rank(row: &[f32], openers: &[u32]) -> usize {
    let best = openers
        .iter()
        .map(|&o| row[o as usize])
        .fold(f32::NEG_INFINITY, f32::max);
    row.iter().filter(|&&v| v > best).count()
}

#[test]
fn demo_model_kv_cached_loop_equals_full_forwards_and_calls_start_exactly_within_top_k() {
    let model = demo();
    let tokenizer = tok(&model);
    let engine = CpuScorer::new(&model);
    let prompts = demo_prompts(6);
    let texts: Vec<Prompt> = prompts.iter().map(|p| p.prompt.clone()).collect();
    let openers = CallTokens::from_tokenizer(tokenizer).openers;
    for k in [1usize, 10] {
        let recording = Recording {
            inner: &engine,
            scripts: vec![],
            log: Default::default(),
        };
        let options = GenerateOptions {
            max_new_tokens: 30,
            top_k_call: k,
            n_positions: Some(model.config().n_positions),
            ..Default::default()
        };
        let gens = generate(&recording, tokenizer, &calculator(), &texts, &options).unwrap();
        let log = recording.log.lock().unwrap();
        // KV-cache correctness: every row the loop used equals the oracle's full forward.
        assert_rows_match_oracle(&model, &log);
        for (p, g) in prompts.iter().zip(&gens) {
            // A call starts exactly when an opener is within the top k: before the opener, every
            // step's opener rank was >= k; at the opener it was < k.
            let prompt_ids = tokenizer.encode_ids(&p.prompt.text).unwrap();
            let mut seq = prompt_ids.clone();
            for &t in &g.tokens {
                let row = &log.iter().find(|(s, _)| *s == seq).expect("row logged").1;
                let rank = opener_rank(row, &openers);
                if openers.contains(&t) {
                    assert!(
                        rank < k,
                        "opened at rank {rank} with k {k}: {:?}",
                        g.completion
                    );
                    break;
                }
                assert!(
                    rank >= k,
                    "opener at rank {rank} < k {k} not taken: {:?}",
                    g.completion
                );
                seq.push(t);
            }
            // The model calls, the result is spliced, and decoding resumes after it.
            assert_eq!(g.calls.len(), 1, "{:?}", g.completion);
            let c = &g.calls[0];
            assert_eq!((c.tool.as_str(), c.status), ("Calculator", CallStatus::Ok));
            let spliced = format!("-> {}]", c.result);
            let after = g.completion.find(&spliced).expect("result spliced") + spliced.len();
            assert!(
                g.completion.len() > after,
                "decoding resumed: {:?}",
                g.completion
            );
        }
    }
}

#[test]
fn demo_model_budget_and_tools_on_versus_off() {
    let model = demo();
    let tokenizer = tok(&model);
    let engine = CpuScorer::new(&model);
    let prompts = demo_prompts(16);
    let texts: Vec<Prompt> = prompts.iter().map(|p| p.prompt.clone()).collect();
    let openers = CallTokens::from_tokenizer(tokenizer).openers;
    let base = GenerateOptions {
        max_new_tokens: 40,
        n_positions: Some(model.config().n_positions),
        ..Default::default()
    };
    let off = GenerateOptions {
        max_calls: 0,
        ..base.clone()
    };
    let with = generate(&engine, tokenizer, &calculator(), &texts, &base).unwrap();
    let without = generate(&engine, tokenizer, &calculator(), &texts, &off).unwrap();
    for (w, wo) in with.iter().zip(&without) {
        assert!(w.calls.len() <= 1, "budget of one call: {:?}", w.completion);
        assert!(wo.calls.is_empty() && !wo.tokens.iter().any(|t| openers.contains(t)));
    }
    let correct = |gens: &[Generation]| {
        gens.iter()
            .zip(&prompts)
            .filter(|(g, p)| {
                toolsift::demo::tool_use::answer_in(&g.completion)
                    == Some(p.answer.parse::<f64>().unwrap())
            })
            .count()
    };
    let (c_with, c_without) = (correct(&with), correct(&without));
    eprintln!(
        "demo model, {} arithmetic prompts: {c_with} correct with tools, {c_without} without",
        prompts.len()
    );
    assert!(
        c_with >= c_without + prompts.len() / 2,
        "{c_with} vs {c_without}"
    );
}

/// `n` prompt lines `{"id": k, "prompt": "The sum of k and"}` for the CLI tests.
fn sum_prompts(n: usize) -> String {
    (0..n)
        .map(|k| format!("{{\"id\": {k}, \"prompt\": \"The sum of {k} and\"}}\n"))
        .collect()
}

/// `--input -` reads the prompts from standard input and `--output -` writes to standard
/// output: the same lines as from and to files; `--resume` with `-` is refused.
#[test]
fn cli_a_dash_reads_stdin_and_writes_stdout() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let prompts = sum_prompts(3);
    std::fs::write(&input, &prompts).unwrap();
    let model = common::tiny("f32");
    let run = |input_arg: &std::ffi::OsStr, extra: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"));
        cmd.args(["generate", "--max-new-tokens", "4", "--model"])
            .arg(&model)
            .arg("--input")
            .arg(input_arg)
            .args(extra);
        common::output_with_stdin(&mut cmd, prompts.as_bytes())
    };
    let from_file = run(input.as_os_str(), &[]);
    assert!(from_file.status.success() && !from_file.stdout.is_empty());
    for extra in [&[][..], &["--output", "-"][..]] {
        let out = run("-".as_ref(), extra);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, from_file.stdout, "{extra:?}");
    }
    let output = tmp.path().join("out.jsonl");
    let output = output.to_str().unwrap();
    for (i, o) in [("-".as_ref(), output), (input.as_os_str(), "-")] {
        let out = run(i, &["--output", o, "--resume"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{i:?} {o}");
        assert!(stderr.contains("not `-`"), "{stderr}");
    }
    assert!(!std::path::Path::new(output).exists());
}

/// `generate --resume` goes on from an interrupted output: each prompt keeps its sampling
/// stream (its line number), so a run resumed after any line, or mid-line, writes the
/// uninterrupted run's output (one prompt per batch on both sides).
#[test]
fn cli_resume_goes_on_from_an_interrupted_output() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(&input, sum_prompts(5)).unwrap();
    let bin = env!("CARGO_BIN_EXE_toolsift");
    let model = common::tiny("f32");
    let run = |output: &std::path::Path, resume: bool| {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["generate", "--max-new-tokens", "5", "--temperature", "0.9"])
            .args(["--seed", "3", "--batch-size", "1", "--model"])
            .arg(&model)
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(output);
        if resume {
            cmd.arg("--resume");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let whole = tmp.path().join("whole.jsonl");
    run(&whole, false);
    let want = std::fs::read(&whole).unwrap();
    let out = tmp.path().join("out.jsonl");
    for cut in [0, 1, want.len() / 2, want.len() - 1] {
        std::fs::write(&out, &want[..cut]).unwrap();
        run(&out, true);
        assert_eq!(std::fs::read(&out).unwrap(), want, "cut at byte {cut}");
    }
    // --resume needs the files it reads.
    let out = std::process::Command::new(bin)
        .args(["generate", "--resume", "--prompt", "x", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// Sampling flags without a temperature are said to do nothing (greedy decoding draws nothing).
#[test]
fn cli_says_when_sampling_flags_have_no_effect() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["generate", "--model"])
        .arg(common::tiny("f32"))
        .args([
            "--prompt",
            "The sum",
            "--max-new-tokens",
            "2",
            "--top-k",
            "5",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--top-k and --seed have no effect"),
        "{stderr}"
    );
}

/// Output on stdout to a reader that has gone (`generate ... | head -1`): the run ends quietly
/// with success, as a closed pipe ends any Unix tool's, instead of an error about the pipe.
#[test]
fn cli_generate_to_a_closed_pipe_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("p.jsonl");
    let lines: String = (0..200)
        .map(|k| format!("{{\"id\": {k}, \"prompt\": \"The sum\"}}\n"))
        .collect();
    std::fs::write(&prompts, lines).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["generate", "--max-new-tokens", "2", "--model"])
        .arg(common::tiny("f32"))
        .arg("--input")
        .arg(&prompts)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes before the first line is written
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("Broken pipe"), "{err}");
}

/// `--top-k-call` and `--max-calls` reach the loop as themselves: on the demo model's arithmetic
/// prompts the defaults (10, 1) start one call a prompt, either flag at 0 starts none, room for
/// three starts a second, and `--top-k-call 1` (only where greedy decoding writes the opener)
/// starts one with room for three.
#[test]
fn cli_top_k_call_and_max_calls_are_the_loops() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let lines: String = demo_prompts(4)
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "{}\n",
                serde_json::json!({"id": i, "prompt": p.prompt.text})
            )
        })
        .collect();
    std::fs::write(&input, lines).unwrap();
    let calls_per_line = |flags: &[&str]| -> Vec<usize> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["generate", "--demo", "--max-new-tokens", "24", "--input"])
            .arg(&input)
            .args(flags)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["calls"].as_array().unwrap().len()
            })
            .collect()
    };
    assert_eq!(calls_per_line(&[]), [1, 1, 1, 1]);
    assert_eq!(calls_per_line(&["--max-calls", "0"]), [0, 0, 0, 0]);
    assert_eq!(calls_per_line(&["--top-k-call", "0"]), [0, 0, 0, 0]);
    // Room for three: a second call, at an opener among the top 10 that greedy would not write.
    assert_eq!(calls_per_line(&["--max-calls", "3"]), [2, 2, 2, 2]);
    let greedy = calls_per_line(&["--top-k-call", "1", "--max-calls", "3"]);
    assert_eq!(greedy, [1, 1, 1, 1]);
}

// ---- from the review of cli/annotate.rs, cli/generate.rs, generate/jsonl.rs, util/fs.rs ----

/// Makes the error a failing decoder fails with.
type MakeError = fn() -> toolsift::Error;

/// A decoder whose every session fails with the error its `MakeError` makes.
struct FailingDecoder(MakeError);
struct FailingSession(MakeError);
impl DecodeSession for FailingSession {
    fn new_sequence(&mut self) -> usize {
        0
    }
    fn extend(&mut self, _: &[usize], _: &[Vec<u32>]) -> toolsift::Result<Vec<Vec<f32>>> {
        Err((self.0)())
    }
    fn len(&self, _: usize) -> usize {
        0
    }
}
impl Decoder for FailingDecoder {
    fn session(&self) -> Box<dyn DecodeSession + Send + '_> {
        Box::new(FailingSession(self.0))
    }
}

/// Out of memory and an I/O error stop the run naming the batch's lines, as a backend error
/// does (a rerun can answer them); an error of the prompts' own answers each line and goes on.
#[test]
fn out_of_memory_and_io_errors_stop_the_run_other_errors_fail_the_lines() {
    let model = tiny();
    let tokenizer = tok(&model);
    let o = two_per_batch(4);
    let stops: [(MakeError, &str); 2] = [
        (
            || toolsift::Error::OutOfMemory("cuda: out of memory".into()),
            "out of memory",
        ),
        (
            || toolsift::Error::io("/dev/gpu", std::io::Error::other("gone")),
            "/dev/gpu",
        ),
    ];
    for (error, want) in stops {
        let mut out = Vec::new();
        let decoder = FailingDecoder(error);
        let input = q_lines(3);
        let err = generate_jsonl(
            input.as_bytes(),
            &mut out,
            &decoder,
            tokenizer,
            &calculator(),
            &o,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("generating input lines 1-2: ") && err.contains(want),
            "{err}"
        );
        assert!(out.is_empty());
    }
    let mut out = Vec::new();
    let decoder = FailingDecoder(|| toolsift::Error::input("no room for this prompt"));
    let input = q_lines(3);
    let summary = generate_jsonl(
        input.as_bytes(),
        &mut out,
        &decoder,
        tokenizer,
        &calculator(),
        &o,
    )
    .unwrap();
    assert_eq!((summary.lines, summary.failed), (3, 3));
    for (k, line) in rows(&out).iter().enumerate() {
        assert_eq!(line["line"], k + 1);
        let error = line["error"].as_str().unwrap();
        assert!(error.contains("no room for this prompt"), "{error}");
    }
}

/// Output that records, at each flush, how many lines had been written.
#[derive(Default)]
struct FlushLog {
    bytes: Vec<u8>,
    lines_at_flush: Vec<usize>,
}
impl std::io::Write for FlushLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let lines = self.bytes.iter().filter(|&&b| b == b'\n').count();
        self.lines_at_flush.push(lines);
        Ok(())
    }
}

/// Each batch's lines are flushed as the batch ends (a reader of a pipe sees them then), the
/// last, short one included.
#[test]
fn each_batch_is_flushed_as_it_ends() {
    let model = tiny();
    let tokenizer = tok(&model);
    let m = scripted(tokenizer, 1, "Calculator(1+2) ->", |_| 0);
    let o = two_per_batch(4);
    let mut out = FlushLog::default();
    let input = q_lines(5);
    generate_jsonl(input.as_bytes(), &mut out, &m, tokenizer, &calculator(), &o).unwrap();
    assert_eq!(out.lines_at_flush, [2, 4, 5]);
}

/// Prompt i draws from `sample_rng(seed, i, 0)` under the run's temperature and `top_k`
/// (docs/generate.md): each completion is exactly those draws, token for token.
#[test]
fn each_prompt_draws_from_its_own_stream_with_the_runs_settings() {
    let model = tiny();
    let tokenizer = tok(&model);
    let words = ids(tokenizer).fillers;
    let mut row = vec![f32::NEG_INFINITY; VOCAB];
    for (i, &t) in words.iter().enumerate() {
        row[t as usize] = -1.0 - 0.3 * i as f32;
    }
    let fixed = row.clone();
    let m = mock(move |_| fixed.clone());
    let o = GenerateOptions {
        temperature: 1.0,
        top_k: Some(3),
        seed: 7,
        top_k_call: 0,
        max_new_tokens: 24,
        ..Default::default()
    };
    let prompts = [Prompt::new("Q"), Prompt::new("Q")];
    let gens = generate(&m, tokenizer, &calculator(), &prompts, &o).unwrap();
    let settings = SampleOptions {
        temperature: 1.0,
        top_k: Some(3),
        ..Default::default()
    };
    for (i, g) in gens.iter().enumerate() {
        let mut rng = sample_rng(7, i, 0);
        let want: Vec<u32> = (0..24).map(|_| draw(&row, &settings, &mut rng)).collect();
        assert_eq!(g.tokens, want, "prompt {i}");
        assert!(g.tokens.iter().all(|t| words[..3].contains(t)), "top_k 3");
    }
    assert_ne!(gens[0].tokens, gens[1].tokens, "one stream per prompt");
}

/// A row that is not finite inside a call ends the completion there, and the call keeps what
/// was decoded of it, as at end of text or the length cap: its tool, its input, the reason.
#[test]
fn a_row_not_finite_inside_a_call_keeps_what_was_decoded_of_it() {
    let model = tiny();
    let tokenizer = tok(&model);
    let open = ids(tokenizer).open;
    let call = tokenizer.encode_ids("Calculator(1+2").unwrap();
    let openers = CallTokens::from_tokenizer(tokenizer).openers;
    let m = mock(move |seq| match after_last_opener(seq, &openers) {
        Some(rest) if rest.len() < call.len() => ranked(&[call[rest.len()]]),
        Some(_) => vec![f32::NAN; VOCAB],
        None => ranked(&[open]),
    });
    let g = run(&m, tokenizer, &calculator(), &GenerateOptions::default());
    assert_eq!(
        (g.completion.as_str(), g.finish),
        ("[Calculator(1+2", Finish::NotFinite)
    );
    let c = &g.calls[0];
    assert_eq!(
        (c.status, c.tool.as_str(), c.input.as_str()),
        (CallStatus::Unfinished, "Calculator", "1+2")
    );
    assert_eq!(c.error.as_deref(), Some("generation ended inside the call"));
}

/// Inside a call the openers are drawn like any token (they are masked only outside one): a
/// model that writes "[" in its input gets that input, refused as a call inside the call.
#[test]
fn an_opener_inside_a_call_is_drawn_as_written() {
    let model = tiny();
    let tokenizer = tok(&model);
    let Ids { open, x, .. } = ids(tokenizer);
    assert_eq!(tokenizer.encode_ids("Q").unwrap().len(), 1);
    let call = tokenizer.encode_ids("Calculator(1+[2) ->").unwrap();
    assert!(call.contains(&open));
    // The first opener of the completion starts the call; " a" is second everywhere.
    let m = mock(move |seq| match &seq[1..] {
        [] => ranked(&[open, x]),
        [first, rest @ ..] if *first == open && rest.len() < call.len() => {
            ranked(&[call[rest.len()], x])
        }
        _ => ranked(&[x]),
    });
    let o = GenerateOptions {
        max_new_tokens: 30,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    let c = &g.calls[0];
    assert_eq!(c.status, CallStatus::Unparsable, "{:?}", g.completion);
    assert!(
        c.error
            .as_deref()
            .unwrap()
            .contains("a call inside the call"),
        "{:?}",
        c.error
    );
    assert!(
        g.completion.starts_with("[Calculator(1+[2) ->] a"),
        "{:?}",
        g.completion
    );
}

/// An arrow token that carries the space after the arrow (" -> " as one token) is kept as
/// drawn, fed to the model, and the result follows it without a second space: `r + "]"`.
#[test]
fn an_arrow_token_carrying_the_space_is_kept_and_the_result_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = &fixture_tokenizer_edited(dir.path(), |json| {
        let model = &mut json["model"];
        model["vocab"]["<|endoftext|>"] = serde_json::json!(499);
        model["vocab"]["\u{120}->\u{120}"] = serde_json::json!(500);
    });
    let arrow = 500u32;
    assert_eq!(tokenizer.decode(&[arrow]).unwrap(), " -> ");
    let Ids { open, x, .. } = ids(tokenizer);
    let mut call = tokenizer.encode_ids("Calculator(1+2)").unwrap();
    call.push(arrow);
    let openers = CallTokens::from_tokenizer(tokenizer).openers;
    let m = mock(move |seq| match after_last_opener(seq, &openers) {
        Some(rest) if rest.len() < call.len() => ranked(&[call[rest.len()]]),
        Some(_) => ranked(&[x]),
        None => ranked(&[open]),
    });
    let o = GenerateOptions {
        max_new_tokens: 20,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert!(
        g.completion.starts_with("[Calculator(1+2) -> 3] a"),
        "{:?}",
        g.completion
    );
    assert_eq!(g.calls[0].status, CallStatus::Ok);
    let at = g.tokens.iter().position(|&t| t == arrow);
    let at = at.expect("the arrow token as drawn");
    assert!(g.token_log_probs[at].is_some());
    assert!(m.seen.lock().unwrap().iter().any(|s| s.contains(&arrow)));
}

/// Only openers that are single tokens open calls: in a vocabulary without " [" (written " "
/// then "["), "[" alone is an opener, and a space the model puts first opens nothing.
#[test]
fn only_single_token_openers_open_calls() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = &fixture_tokenizer_edited(dir.path(), |json| {
        let model = &mut json["model"];
        model["vocab"].as_object_mut().unwrap().remove("\u{120}[");
        let merge = serde_json::json!(["\u{120}", "["]);
        let merges = model["merges"].as_array_mut().unwrap();
        merges.retain(|m| *m != merge);
    });
    let space = tokenizer.encode_ids(" ").unwrap();
    assert_eq!(space.len(), 1);
    assert_eq!(tokenizer.encode_ids(" [").unwrap().len(), 2);
    let open = tokenizer.encode_ids("[").unwrap()[0];
    assert_eq!(CallTokens::from_tokenizer(tokenizer).openers, vec![open]);
    let space = space[0];
    let m = mock(move |_| ranked(&[space]));
    let o = GenerateOptions {
        max_new_tokens: 4,
        ..Default::default()
    };
    let g = run(&m, tokenizer, &calculator(), &o);
    assert_eq!((g.completion.as_str(), g.calls.len()), ("    ", 0));
}
