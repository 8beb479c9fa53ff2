//! `annotate` end to end on the tiny fixture model.
//!
//! Library level (a deterministic mock `Sampler` that writes known calls, the real CPU scorer):
//! calls parsed, executed, filtered and spliced; malformed and unknown-tool samples counted; a
//! failing external tool; bad corpus lines; determinism; resume after a stop.
//! Binary level (`toolsift annotate` with its real sampler): an uninterrupted run, and a crash
//! test that SIGKILLs the process at random points and resumes until done: byte-identical output.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use toolsift::annotate::tools::ToolRegistry;
use toolsift::annotate::{
    self, AnnotateConfig, Annotator, Document, RunOptions, RunOutcome, Shard, ToolKind, ToolName,
};
use toolsift::cpu::CpuScorer;
use toolsift::model::Tokenizer;
use toolsift::sample::{Sample, SampleOptions, SampleRequest, Sampler};
use toolsift::score::Scorer as _;
use toolsift::util::rng::Rng;
use toolsift::Model;

/// Every position gets p("[") = p(" [") = e^-1; sample s of request r is
/// `CONTINUATIONS[(seed + r + s) % len]`.
struct MockSampler {
    continuations: Vec<Vec<u32>>,
}

const CONTINUATIONS: [&str; 5] = [
    "Calculator(400 / 1400)]",
    "Calculator(1 +",
    "Calculator(12 * 3)]",
    "WikiSearch(x)]",
    "Calculator(1 / 0)]",
];

impl MockSampler {
    fn new(tok: &Tokenizer) -> Self {
        MockSampler {
            continuations: CONTINUATIONS
                .iter()
                .map(|c| tok.encode_ids(c).unwrap())
                .collect(),
        }
    }
}

impl Sampler for MockSampler {
    fn token_log_probs(&self, ids: &[u32], tokens: &[u32]) -> toolsift::Result<Vec<Vec<f32>>> {
        Ok(ids.iter().map(|_| vec![-1.0; tokens.len()]).collect())
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        options: &SampleOptions,
    ) -> toolsift::Result<Vec<Vec<Sample>>> {
        Ok(requests
            .iter()
            .enumerate()
            .map(|(r, req)| {
                (0..req.n_samples)
                    .map(|s| {
                        let k = (options.seed as usize % 97 + r + s) % self.continuations.len();
                        let tokens = self.continuations[k].clone();
                        Sample {
                            stopped: k != 1,
                            tokens,
                        }
                    })
                    .collect()
            })
            .collect())
    }
}

fn model() -> Model {
    Model::load(common::tiny("f32")).unwrap()
}

/// Short prompts: the fixture has n_positions 256 and P(x) holds x twice.
fn test_config() -> AnnotateConfig {
    let mut c = AnnotateConfig {
        max_call_tokens: 8,
        ..Default::default()
    };
    for t in ToolKind::ALL {
        let p = c.per_tool.get_mut(t);
        p.k = 2;
        p.m = 3;
        p.prompt = format!("[{}(1)] 1\nInput: {{x}}\nOutput: ", t.call_name());
    }
    c.per_tool.calculator.tau_f = -1e9; // keep every scored calculator call
    c.tools.calendar.date = Some("2023-01-30".into());
    c
}

/// The mock engine and the tools of a config, which an `Annotator` borrows.
struct Parts {
    model: Model,
    sampler: MockSampler,
    scorer: CpuScorer,
    registry: ToolRegistry,
}

impl Parts {
    fn new(config: &AnnotateConfig) -> Self {
        let model = model();
        Parts {
            sampler: MockSampler::new(model.tokenizer().unwrap()),
            scorer: CpuScorer::new(&model),
            registry: ToolRegistry::from_config(&config.tools).unwrap(),
            model,
        }
    }

    fn annotator(&self, config: &AnnotateConfig, tools: &[ToolKind]) -> Annotator<'_> {
        self.try_annotator(config, tools).unwrap()
    }

    fn try_annotator(
        &self,
        config: &AnnotateConfig,
        tools: &[ToolKind],
    ) -> toolsift::Result<Annotator<'_>> {
        self.try_annotator_sampling(&self.sampler, config, tools)
    }

    /// An annotator with these parts but `sampler` (one that draws what a test needs).
    fn annotator_sampling<'a>(
        &'a self,
        sampler: &'a dyn Sampler,
        config: &AnnotateConfig,
        tools: &[ToolKind],
    ) -> Annotator<'a> {
        self.try_annotator_sampling(sampler, config, tools).unwrap()
    }

    /// An annotator with these parts but `scorer` (one that refuses or fails as a test needs).
    fn annotator_scoring<'a>(
        &'a self,
        scorer: &'a dyn toolsift::score::Scorer,
        config: &AnnotateConfig,
        tools: &[ToolKind],
    ) -> Annotator<'a> {
        let tok = self.model.tokenizer().unwrap();
        Annotator::new(tok, &self.sampler, scorer, &self.registry, config, tools).unwrap()
    }

    fn try_annotator_sampling<'a>(
        &'a self,
        sampler: &'a dyn Sampler,
        config: &AnnotateConfig,
        tools: &[ToolKind],
    ) -> toolsift::Result<Annotator<'a>> {
        let tok = self.model.tokenizer().unwrap();
        Annotator::new(tok, sampler, &self.scorer, &self.registry, config, tools)
    }
}

/// The fixture's scorer behind `answer`, which gets it and each call's candidates and options:
/// a scorer that fails, refuses or overflows where a test needs it to.
struct Around<'a, F>(&'a CpuScorer, F);

impl<F> toolsift::score::Scorer for Around<'_, F>
where
    F: Fn(
            &CpuScorer,
            &[toolsift::score::TokenCandidate],
            &toolsift::score::ScoreOptions,
        ) -> toolsift::Result<Vec<[f64; 3]>>
        + Send
        + Sync,
{
    fn name(&self) -> &str {
        "around"
    }
    fn config(&self) -> &toolsift::GptjConfig {
        self.0.config()
    }
    fn variant_losses_unchecked(
        &self,
        candidates: &[toolsift::score::TokenCandidate],
        options: &toolsift::score::ScoreOptions,
    ) -> toolsift::Result<Vec<[f64; 3]>> {
        (self.1)(self.0, candidates, options)
    }
}

fn doc(line: u64, text: &str) -> Document {
    Document {
        line,
        id: json!(format!("d{line}")),
        text: text.into(),
        url: None,
        date: None,
    }
}

#[test]
fn calls_are_sampled_executed_filtered_and_spliced() {
    let mut config = test_config();
    config.per_tool.calculator.m = 5; // every mock continuation at every position
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let d = doc(5, "Out of 1400 people, 400 (or 29%) said yes.");
    let (record, stats) = a.annotate_document(&d).unwrap();
    let st = stats.tools["calculator"];
    assert_eq!(st.texts_considered, 1);
    assert_eq!(st.positions, 2);
    assert_eq!(st.calls_sampled, 10);
    assert_eq!((st.calls_malformed, st.calls_unknown_tool), (2, 2));
    assert_eq!((st.calls_executed, st.calls_failed), (6, 2));
    assert_eq!(
        st.calls_sampled,
        st.calls_malformed + st.calls_unknown_tool + st.calls_duplicate + st.calls_executed
    );
    assert!(
        st.calls_malformed >= 1 && st.calls_unknown_tool >= 1,
        "{st:?}"
    );
    assert!(st.calls_executed >= 1, "{st:?}");
    assert_eq!(
        st.calls_executed,
        st.calls_failed + st.calls_scored + st.calls_unscorable
    );
    assert_eq!(
        st.calls_kept, st.calls_scored,
        "tau_f = -1e9 keeps every scored call"
    );
    for c in &record.calls {
        assert_eq!(c.tool, "Calculator");
        if c.input == "1 / 0" {
            assert!(c.result.is_none() && c.error.is_some() && !c.kept);
        } else if c.result.is_some() {
            let (n, cr, d) = (c.l_none.unwrap(), c.l_call.unwrap(), c.delta.unwrap());
            assert!((d - (n.min(cr) - c.l_call_result.unwrap())).abs() < 1e-12);
            assert!(c.kept);
            let call = format!(
                "[Calculator({}) -> {}]",
                c.input,
                c.result.as_ref().unwrap()
            );
            assert!(
                record.annotated_text.contains(&call),
                "{}",
                record.annotated_text
            );
        }
    }
    // Removing the spliced calls gives the text back.
    let mut plain = record.annotated_text.clone();
    for c in record.calls.iter().filter(|c| c.kept) {
        let call = format!(
            " [Calculator({}) -> {}]",
            c.input,
            c.result.as_ref().unwrap()
        );
        plain = plain.replacen(&call, "", 1);
    }
    assert_eq!(plain, d.text);
    // Determinism: the same document gives the same record.
    assert_eq!(a.annotate_document(&d).unwrap().0, record);
}

/// Weights whose only positive one falls past the end of the text measure nothing: such calls
/// are unscorable, not scored 0 and kept at a tau_f <= 0.
#[test]
fn calls_with_no_weighted_token_are_unscorable_not_kept() {
    let mut config = test_config();
    config.per_tool.calculator.m = 5;
    config.weights = [vec![0.0; 40], vec![1.0]].concat();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let d = doc(5, "Out of 1400 people, 400 (or 29%) said yes.");
    let (record, stats) = a.annotate_document(&d).unwrap();
    let st = stats.tools["calculator"];
    assert!(st.calls_executed > st.calls_failed, "{st:?}");
    assert_eq!(
        (st.calls_scored, st.calls_kept),
        (0, 0),
        "tau_f = -1e9 would keep anything scored"
    );
    assert_eq!(st.calls_unscorable, st.calls_executed - st.calls_failed);
    for c in record.calls.iter().filter(|c| c.result.is_some()) {
        let why = c.error.as_deref().unwrap_or_default();
        assert!(
            why.contains("no positive weight falls on a text token"),
            "{why}"
        );
        assert!(!c.kept && c.delta.is_none());
    }
    assert_eq!(record.annotated_text, d.text);
}

#[test]
fn heuristics_and_too_long_texts_are_counted() {
    let mut config = test_config();
    config.per_tool.calendar.tau_s = 0.0;
    config.tools.calendar.date = None;
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator, ToolKind::Calendar]);
    let (r, s) = a.annotate_document(&doc(1, "only 2 numbers: 3")).unwrap();
    assert_eq!(s.tools["calculator"].texts_skipped_heuristic, 1);
    assert_eq!(
        s.tools["calendar"].texts_skipped_heuristic, 1,
        "no date known"
    );
    assert!(r.calls.is_empty());
    let mut dated = doc(2, "Today is Monday.");
    dated.url = Some("https://example.com/2021/03/04/news".into());
    let (_, s) = a.annotate_document(&dated).unwrap();
    assert_eq!(s.tools["calendar"].texts_considered, 1);
    assert_eq!(
        s.tools["calendar"].texts_truncated, 0,
        "the whole text fits"
    );
    // A text of one token has no position: neither considered nor too long.
    let word = Document {
        text: "x".into(),
        ..dated.clone()
    };
    let tok = parts.model.tokenizer().unwrap();
    assert_eq!(tok.encode_ids(&word.text).unwrap().len(), 1);
    let (_, s) = a.annotate_document(&word).unwrap();
    let st = s.tools["calendar"];
    assert_eq!(
        (
            st.texts_skipped_heuristic,
            st.texts_considered,
            st.texts_too_long
        ),
        (0, 0, 0)
    );
    // A text longer than the context is annotated on its beginning.
    let long = "1 2 3 ".repeat(200);
    let (_, s) = a.annotate_document(&doc(3, &long)).unwrap();
    assert_eq!(s.tools["calculator"].texts_truncated, 1);
}

/// `require_arithmetic` reads the text the Calculator's positions are searched in: arithmetic
/// past it (where no call could go) does not let the text through.
#[test]
fn require_arithmetic_reads_only_the_searched_head() {
    let mut config = test_config();
    config.per_tool.calculator.require_arithmetic = true;
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let sums = "He had 12 apples and bought 30 more, 42 in all.";
    // Line 1's 1% draw does not pass (the long text below is skipped), so only the arithmetic
    // decides.
    let (_, s) = a.annotate_document(&doc(1, sums)).unwrap();
    assert_eq!(s.tools["calculator"].texts_considered, 1);
    let late = format!("{}{sums}", "the ".repeat(400));
    let (_, s) = a.annotate_document(&doc(1, &late)).unwrap();
    assert_eq!(s.tools["calculator"].texts_skipped_heuristic, 1);
    // Far enough for the tokenizer's head to reach it (it reads past the searched head), not
    // far enough for the Calculator's positions.
    let just_past = format!("{}{sums}", "the ".repeat(150));
    let (_, s) = a.annotate_document(&doc(1, &just_past)).unwrap();
    assert_eq!(s.tools["calculator"].texts_skipped_heuristic, 1, "{s:?}");
}

/// A document of megabytes is tokenized only as far as the model reads it: its record is the
/// one of its first sentences, with the rest of the text after them as it was.
#[test]
fn a_long_document_is_annotated_on_its_head() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let sentence = "Out of 1400 people, 400 (or 29%) said yes. ";
    let long = sentence.repeat(50_000);
    // Twenty sentences hold more tokens than the fixture's context (256) has room for.
    let short = sentence.repeat(20);
    let (long_record, long_stats) = a.annotate_document(&doc(1, &long)).unwrap();
    let (short_record, short_stats) = a.annotate_document(&doc(1, &short)).unwrap();
    assert_eq!(long_stats.tools, short_stats.tools);
    assert_eq!(long_stats.tools["calculator"].texts_truncated, 1);
    assert!(long_stats.tools["calculator"].calls_kept > 0);
    assert_eq!(long_record.calls, short_record.calls);
    assert_eq!(
        long_record.annotated_text,
        short_record.annotated_text + &long[short.len()..]
    );
}

/// A model that overflows on some candidates: those calls get an error and no scores (not
/// nulls in place of numbers, not kept), the others are scored as usual.
#[test]
fn calls_whose_losses_are_not_finite_are_unscorable() {
    let mut config = test_config();
    config.per_tool.calculator.m = 5;
    let parts = Parts::new(&config);
    let overflowing = Around(&parts.scorer, |scorer: &CpuScorer, c: &[_], o: &_| {
        let mut losses = scorer.variant_losses_unchecked(c, o)?;
        losses[0][2] = f64::NAN;
        if let Some(l) = losses.get_mut(1) {
            l[0] = f64::INFINITY;
        }
        Ok(losses)
    });
    let a = parts.annotator_scoring(&overflowing, &config, &[ToolKind::Calculator]);
    let d = doc(5, "Out of 1400 people, 400 (or 29%) said yes.");
    let (record, stats) = a.annotate_document(&d).unwrap();
    let (reference, reference_stats) = parts
        .annotator(&config, &[ToolKind::Calculator])
        .annotate_document(&d)
        .unwrap();
    let (st, want) = (
        stats.tools["calculator"],
        reference_stats.tools["calculator"],
    );
    assert!(want.calls_scored >= 3, "{want:?}");
    assert_eq!(st.calls_scored, want.calls_scored - 2);
    assert_eq!(st.calls_unscorable, want.calls_unscorable + 2);
    assert_eq!(
        st.calls_kept,
        want.calls_kept - 2,
        "tau_f keeps every scored call"
    );
    let bad: Vec<_> = record
        .calls
        .iter()
        .filter(|c| c.error.as_deref().is_some_and(|e| e.contains("not finite")))
        .collect();
    assert_eq!(bad.len(), 2, "{:?}", record.calls);
    for c in bad {
        assert!(!c.kept && c.delta.is_none() && c.l_none.is_none(), "{c:?}");
        assert!(c.result.is_some());
    }
    assert_ne!(record.annotated_text, reference.annotated_text);
}

/// A sampler whose sample s of every request is `calls[s % len]` (`one_call`: always the same
/// call), with flat log-probs.
struct Cycling(Vec<Vec<u32>>);

impl Sampler for Cycling {
    fn token_log_probs(&self, ids: &[u32], t: &[u32]) -> toolsift::Result<Vec<Vec<f32>>> {
        Ok(ids.iter().map(|_| vec![-0.5; t.len()]).collect())
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        _: &SampleOptions,
    ) -> toolsift::Result<Vec<Vec<Sample>>> {
        Ok(requests
            .iter()
            .map(|r| {
                (0..r.n_samples)
                    .map(|s| Sample {
                        tokens: self.0[s % self.0.len()].clone(),
                        stopped: true,
                    })
                    .collect()
            })
            .collect())
    }
}

/// A `Cycling` sampler whose every sample is `call` (its tokens).
fn one_call(call: Vec<u32>) -> Cycling {
    Cycling(vec![call])
}

/// A sample holding a token the tokenizer has no text for (a model row past tokenizer.json's
/// vocabulary) is malformed: decoded without it, the call executed would not be the one the model
/// wrote.
#[test]
fn a_sample_with_a_token_the_tokenizer_cannot_write_is_malformed() {
    let model = model();
    let tok = model.tokenizer().unwrap();
    let row = (0..model.config().vocab_size as u32)
        .rev()
        .find(|&id| tok.decode(&[id]).unwrap().is_empty())
        .expect("the fixture has rows past its tokenizer");
    let scorer = CpuScorer::new(&model);
    let config = test_config();
    let registry = ToolRegistry::from_config(&config.tools).unwrap();
    let text = "Out of 1400 people, 400 (or 29%) said yes.";
    let run = |tokens: Vec<u32>| {
        let sampler = one_call(tokens);
        let a = Annotator::new(
            tok,
            &sampler,
            &scorer,
            &registry,
            &config,
            &[ToolKind::Calculator],
        )
        .unwrap();
        a.annotate_document(&doc(1, text)).unwrap().1.tools["calculator"]
    };
    let mut tokens = tok.encode_ids("Calculator(1 +").unwrap();
    let written = run([tokens.clone(), tok.encode_ids(" 2)]").unwrap()].concat());
    assert_eq!((written.calls_sampled, written.calls_executed), (6, 2));
    tokens.push(row);
    tokens.extend(tok.encode_ids(" 2)]").unwrap());
    assert_eq!(tok.decode(&tokens).unwrap(), "Calculator(1 + 2)]");
    let st = run(tokens);
    assert_eq!((st.calls_sampled, st.calls_malformed), (6, 6));
    assert_eq!(st.calls_executed, 0);
}

/// A QA service that always fails: every call fails, the run goes on.
#[test]
fn a_failing_external_tool_fails_its_calls_not_the_run() {
    let model = model();
    let tok = model.tokenizer().unwrap();
    let sampler = one_call(tok.encode_ids("QA(Who?)]").unwrap());
    let scorer = CpuScorer::new(&model);
    let mut config = test_config();
    config.tools.qa = Some(toolsift::annotate::tools::ExternalToolConfig {
        command: Some(vec!["false".into()]),
        retries: 0,
        timeout_ms: 2000,
        ..Default::default()
    });
    let registry = ToolRegistry::from_config(&config.tools).unwrap();
    let a = Annotator::new(tok, &sampler, &scorer, &registry, &config, &[ToolKind::Qa]).unwrap();
    let (r, s) = a
        .annotate_document(&doc(1, "The capital of Kenya is Nairobi."))
        .unwrap();
    let st = s.tools["qa"];
    assert_eq!(st.positions, 2);
    assert_eq!(st.calls_sampled, 6);
    assert_eq!(st.calls_duplicate, 4, "one distinct call per position");
    assert_eq!(
        (st.calls_executed, st.calls_failed, st.calls_kept),
        (2, 2, 0)
    );
    assert!(r.calls.iter().all(|c| c
        .error
        .as_deref()
        .is_some_and(|e| e.contains("tool failed"))));
    assert_eq!(r.annotated_text, r.text);
}

/// A tool of the user's own, by a name no built-in has: its prompt and thresholds from
/// `[per_tool.custom.Echo]`, a command under `[tools.custom.Echo]`; sampled, executed, scored,
/// kept and spliced as a built-in's calls are, counted under its own name.
#[test]
fn a_custom_tool_runs_like_a_built_in() {
    let model = model();
    let tok = model.tokenizer().unwrap();
    let sampler = one_call(tok.encode_ids("Echo(Nairobi)]").unwrap());
    let scorer = CpuScorer::new(&model);
    let config = AnnotateConfig::from_toml(
        r#"max_call_tokens = 8
[per_tool.custom.Echo]
k = 2
m = 3
tau_f = -1e9
prompt = "[Echo(a)] a\nInput: {x}\nOutput: "
[tools.custom.Echo]
command = ["cat"]
"#,
    )
    .unwrap();
    let registry = ToolRegistry::from_config(&config.tools).unwrap();
    assert!(registry.get("Echo").is_some());
    let echo = config.tool_named("Echo").unwrap();
    assert_eq!(echo, ToolName::custom("Echo").unwrap());
    let a = Annotator::new(
        tok,
        &sampler,
        &scorer,
        &registry,
        &config,
        std::slice::from_ref(&echo),
    )
    .unwrap();
    let (r, s) = a
        .annotate_document(&doc(1, "The capital of Kenya is Nairobi."))
        .unwrap();
    let st = s.tools["Echo"];
    assert_eq!(
        (st.positions, st.calls_sampled, st.calls_duplicate),
        (2, 6, 4)
    );
    assert_eq!(
        (st.calls_executed, st.calls_scored, st.calls_kept),
        (2, 2, 2)
    );
    assert!(r
        .calls
        .iter()
        .all(|c| c.tool == "Echo" && c.result.as_deref() == Some("Nairobi") && c.delta.is_some()));
    assert!(
        r.annotated_text.contains("[Echo(Nairobi) -> Nairobi]"),
        "{}",
        r.annotated_text
    );

    // Built-ins and custom tools side by side; each draws its samples from its own seed.
    assert_ne!(
        Annotator::doc_seed(0, 1, &echo),
        Annotator::doc_seed(0, 1, &ToolKind::Qa.into())
    );
    // A custom tool needs its settings; a program's ToolName is checked as the config's are.
    let mut bare = config.clone();
    bare.per_tool.custom.clear();
    bare.tools.custom.clear();
    let mut registry = ToolRegistry::from_config(&bare.tools).unwrap();
    registry.register_boxed(Box::new(
        toolsift::annotate::tools::ExternalTool::from_config("Echo", &config.tools.custom["Echo"])
            .unwrap(),
    ));
    let e = Annotator::new(tok, &sampler, &scorer, &registry, &bare, &[echo])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("[per_tool.custom.Echo]"), "{e}");
    let bad = ToolName::Custom("Calculator".into());
    let e = Annotator::new(tok, &sampler, &scorer, &registry, &config, &[bad])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("built-in"), "{e}");
}

/// The paper's MT post-filter, opt-in: a call whose input the text says only after the call's
/// position is dropped before it is executed; off, the same calls are executed.
#[test]
fn lookahead_inputs_are_dropped_when_asked() {
    let model = model();
    let sampler = one_call(
        model
            .tokenizer()
            .unwrap()
            .encode_ids("MT(the coffee is hot)]")
            .unwrap(),
    );
    let scorer = CpuScorer::new(&model);
    let text = "Le café est chaud: the coffee is hot.";
    let phrase = text.find(" the coffee").unwrap();
    let run = |drop: bool| {
        let mut config = test_config();
        config.per_tool.mt.k = 100; // every position
        config.per_tool.mt.drop_lookahead_inputs = drop;
        config.tools.mt = Some(toolsift::annotate::tools::ExternalToolConfig {
            command: Some(vec!["cat".into()]),
            ..Default::default()
        });
        let registry = ToolRegistry::from_config(&config.tools).unwrap();
        let tok = model.tokenizer().unwrap();
        let a =
            Annotator::new(tok, &sampler, &scorer, &registry, &config, &[ToolKind::Mt]).unwrap();
        a.annotate_document(&doc(1, text)).unwrap()
    };
    let (all, all_stats) = run(false);
    let (kept, stats) = run(true);
    let (all_st, st) = (all_stats.tools["mt"], stats.tools["mt"]);
    assert_eq!(all_st.calls_lookahead, 0);
    assert_eq!(all_st.calls_executed, all_st.positions);
    assert!(all
        .calls
        .iter()
        .all(|c| c.result.as_deref() == Some("the coffee is hot")));
    // Positions up to the phrase's space see it only ahead; later ones do not.
    let ahead = all.calls.iter().filter(|c| c.position <= phrase).count() as u64;
    assert!(
        ahead >= 3 && ahead < all_st.positions,
        "{ahead} of {all_st:?}"
    );
    assert_eq!(st.positions, all_st.positions);
    assert_eq!(st.calls_lookahead, ahead);
    assert_eq!(st.calls_executed, all_st.calls_executed - ahead);
    assert_eq!(
        st.calls_sampled,
        st.calls_malformed
            + st.calls_unknown_tool
            + st.calls_duplicate
            + st.calls_lookahead
            + st.calls_executed
    );
    assert!(kept.calls.iter().all(|c| c.position > phrase));
}

/// A call whose input a line-oriented tool would answer only in part (a line break) or that
/// carries a special token's text is malformed, not executed; an answer that cleaning empties
/// (special tokens only) is a failure, not a "[QA(x) -> ]" in C*.
#[test]
fn inputs_a_tool_cannot_take_whole_and_answers_that_clean_to_nothing_are_not_spliced() {
    let model = model();
    let tok = model.tokenizer().unwrap();
    let scorer = CpuScorer::new(&model);
    let text = "The capital of Kenya is Nairobi.";
    let run = |sample: &str, script: &str| {
        let mut config = test_config();
        config.per_tool.qa.tau_f = -1e9;
        config.tools.qa = Some(toolsift::annotate::tools::ExternalToolConfig {
            command: Some(vec!["sh".into(), "-c".into(), script.into()]),
            retries: 0,
            timeout_ms: 5000,
            ..Default::default()
        });
        let registry = ToolRegistry::from_config(&config.tools).unwrap();
        let sampler = one_call(tok.encode_ids(sample).unwrap());
        let a =
            Annotator::new(tok, &sampler, &scorer, &registry, &config, &[ToolKind::Qa]).unwrap();
        a.annotate_document(&doc(1, text)).unwrap()
    };
    for sample in ["QA(Who is\nthe president?)]", "QA(Who<|endoftext|>rules)]"] {
        let (r, s) = run(sample, "read l; echo \"ans $l\"");
        let st = s.tools["qa"];
        assert_eq!((st.calls_sampled, st.calls_malformed), (6, 6), "{sample:?}");
        assert_eq!(st.calls_executed, 0, "{sample:?}");
        assert!(r.calls.is_empty() && r.annotated_text == text, "{r:?}");
    }
    let (r, s) = run("QA(x)]", "echo ' <|endoftext|> '");
    let st = s.tools["qa"];
    assert_eq!(
        (st.calls_executed, st.calls_failed, st.calls_kept),
        (2, 2, 0)
    );
    assert!(r
        .calls
        .iter()
        .all(|c| c.result.is_none() && c.error.as_deref().is_some_and(|e| e.contains("empty"))));
    assert_eq!(r.annotated_text, text);
}

/// A sampler with one likely position (`peak`: p("[") + p(" [") = 0.6) and a runner-up whose
/// one opener is likelier (`decoy`: 0.5 + 0.0001); it records the sequence it was asked to score
/// and each request's prefix, and writes every sample as `call`.
struct Peaked {
    x_len: usize,
    peak: usize,
    decoy: usize,
    call: Vec<u32>,
    seen: std::sync::Mutex<(Vec<u32>, Vec<Vec<u32>>)>,
}

impl Sampler for Peaked {
    fn token_log_probs(&self, ids: &[u32], t: &[u32]) -> toolsift::Result<Vec<Vec<f32>>> {
        self.seen.lock().unwrap().0 = ids.to_vec();
        // The row predicting x_i is |P(x)| + i - 1, and ids = P(x) ++ x.
        let row = |i: usize| ids.len() - self.x_len + i - 1;
        Ok((0..ids.len())
            .map(|r| {
                let p = match r {
                    _ if r == row(self.peak) => [0.3f32, 0.3],
                    _ if r == row(self.decoy) => [0.5, 1e-4],
                    _ => [1e-6, 1e-6],
                };
                p[..t.len()].iter().map(|p| p.ln()).collect()
            })
            .collect())
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        _: &SampleOptions,
    ) -> toolsift::Result<Vec<Vec<Sample>>> {
        let mut seen = self.seen.lock().unwrap();
        seen.1.extend(requests.iter().map(|r| r.prefix.clone()));
        let sample = Sample {
            tokens: self.call.clone(),
            stopped: true,
        };
        Ok(requests
            .iter()
            .map(|r| vec![sample.clone(); r.n_samples])
            .collect())
    }
}

/// The position is the one whose row, the one before x_i, sums the most over "[" and " [";
/// P(x) holds the text; the call is sampled after x_1..x_{i-1} and the opener x_i's space asks
/// for, and spliced where x_i starts.
#[test]
fn calls_are_sampled_at_the_likeliest_position_after_its_prefix() {
    let mut config = test_config();
    config.per_tool.calculator.k = 1;
    config.per_tool.calculator.m = 1;
    let parts = Parts::new(&config);
    let tok = parts.model.tokenizer().unwrap();
    let text = "Out of 1400 people, 400 (or 29%) said yes.";
    let x = tok.encode_ids(text).unwrap();
    for (peak, decoy) in [(4, 2), (2, 4)] {
        let sampler = Peaked {
            x_len: x.len(),
            peak,
            decoy,
            call: tok.encode_ids("Calculator(12 * 3)]").unwrap(),
            seen: Default::default(),
        };
        let a = parts.annotator_sampling(&sampler, &config, &[ToolKind::Calculator]);
        let (r, s) = a.annotate_document(&doc(1, text)).unwrap();
        assert_eq!(s.tools["calculator"].positions, 1);
        let (ids, prefixes) = sampler.seen.into_inner().unwrap();
        let (before, after) = config.per_tool.calculator.prompt.split_once("{x}").unwrap();
        let (before, after) = (
            tok.encode_ids(before).unwrap(),
            tok.encode_ids(after).unwrap(),
        );
        assert_eq!(ids, [&before[..], &x, &after, &x].concat(), "P(x) ++ x");
        let at = r.calls[0].position;
        assert_eq!(
            tok.decode(&x[..peak]).unwrap(),
            text[..at],
            "x_{peak} starts there"
        );
        let open = if text[at..].starts_with(' ') {
            " ["
        } else {
            "["
        };
        let open = tok.encode_ids(open).unwrap();
        let p = ids.len() - x.len();
        assert_eq!(prefixes, vec![[&ids[..p + peak], &open[..]].concat()]);
    }
}

/// Two tools' calls at the same positions: C* lists them by position (not tool by tool), and
/// splices those at one position best delta first. A name is matched exactly ("calculator" is
/// no Calculator).
#[test]
fn calls_of_two_tools_are_listed_by_position_and_spliced_best_first() {
    let mut config = test_config();
    config.per_tool.calendar.tau_f = -1e9;
    config.per_tool.calculator.m = 3;
    config.per_tool.calendar.m = 3;
    let parts = Parts::new(&config);
    let tok = parts.model.tokenizer().unwrap();
    let sampler = Cycling(
        ["Calculator(12 * 3)]", "Calendar()]", "calculator(1 + 1)]"]
            .iter()
            .map(|c| tok.encode_ids(c).unwrap())
            .collect(),
    );
    let tools = [ToolKind::Calculator, ToolKind::Calendar];
    let a = parts.annotator_sampling(&sampler, &config, &tools);
    let text = "Out of 1400 people, 400 (or 29%) said yes.";
    let (r, s) = a.annotate_document(&doc(1, text)).unwrap();
    for key in ["calculator", "calendar"] {
        let st = s.tools[key];
        assert_eq!(
            (st.positions, st.calls_unknown_tool),
            (2, 4),
            "{key}: {st:?}"
        );
        assert_eq!(st.calls_kept, 2, "{key}: {st:?}");
    }
    assert!(
        r.calls.windows(2).all(|w| w[0].position <= w[1].position),
        "{:?}",
        r.calls
    );
    // At each position, the better call first.
    let mut kept: Vec<_> = r.calls.iter().collect();
    kept.sort_by(|a, b| {
        (a.position.cmp(&b.position)).then(b.delta.unwrap().total_cmp(&a.delta.unwrap()))
    });
    assert!(kept.windows(2).any(|w| w[0].position == w[1].position
        && w[0].delta != w[1].delta
        && w[0].tool != w[1].tool));
    let calls: Vec<(usize, String)> = kept
        .iter()
        .map(|c| {
            let call = format!(
                "[{}({}) -> {}]",
                c.tool,
                c.input,
                c.result.as_ref().unwrap()
            );
            (c.position, call)
        })
        .collect();
    assert_eq!(r.annotated_text, toolsift::score::splice(text, &calls));
}

fn write_corpus(path: &Path, n: usize) {
    let mut rng = Rng::new(7);
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "in", "June", "sold", "apples",
    ];
    let mut text = String::new();
    for i in 1..=n {
        let line = match i % 10 {
            3 => "{not json".to_string(),
            7 => json!({"id": i, "body": "no text field"}).to_string(),
            _ => {
                let mut t = String::new();
                for _ in 0..rng.range(4, 10) {
                    if rng.range(0, 3) == 0 {
                        t.push_str(&format!("{} ", rng.range(1, 999)));
                    } else {
                        t.push_str(words[rng.range(0, words.len() - 1)]);
                        t.push(' ');
                    }
                }
                json!({"id": format!("doc-{i}"), "text": t.trim_end(), "url": "https://x.org/2023/01/30/a"})
                    .to_string()
            }
        };
        text.push_str(&line);
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// A line over the limit is a reject with its reason, and the lines after it are annotated.
/// A whole, unsharded run of `corpus` into `out`, quiet, with no stop.
fn whole_run(corpus: &Path, out: PathBuf) -> RunOptions {
    RunOptions {
        corpus: corpus.to_path_buf(),
        out,
        shard: Shard::default(),
        run_info: json!(null),
        progress: false,
        stop_after: None,
    }
}

/// `base` run as each of `count` shards, to the end: their outputs, shard by shard.
fn run_shards(a: &Annotator, base: &RunOptions, count: u64) -> Vec<annotate::OutputPaths> {
    (0..count)
        .map(|i| {
            let o = RunOptions {
                shard: Shard::new(i, count).unwrap(),
                ..base.clone()
            };
            let RunOutcome::Done(_, paths) = annotate::annotate(a, &o).unwrap() else {
                panic!("shard {i}/{count} not done")
            };
            paths
        })
        .collect()
}

/// `<a>.jsonl` and `<b>.jsonl` in `dir` hold the same C*, and their rejects files the same lines.
fn assert_same_outputs(dir: &Path, a: &str, b: &str) {
    for kind in ["jsonl", "rejects.jsonl"] {
        let read = |stem: &str| std::fs::read(dir.join(format!("{stem}.{kind}"))).unwrap();
        assert_eq!(read(a), read(b), "{a}.{kind} vs {b}.{kind}");
    }
}

#[test]
fn a_line_over_64_mib_is_a_reject_not_an_out_of_memory() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    let huge = json!({"text": "7 ".repeat(toolsift::util::jsonl::MAX_LINE_BYTES / 2)}).to_string();
    let small = json!({"text": "Out of 1400 people, 400 said yes."}).to_string();
    std::fs::write(&corpus, format!("{small}\n{huge}\n{small}\n")).unwrap();
    let options = RunOptions {
        corpus: corpus.clone(),
        out: dir.path().join("out.jsonl"),
        shard: Shard::default(),
        run_info: json!(null),
        progress: false,
        stop_after: None,
    };
    let RunOutcome::Done(summary, paths) = annotate::annotate(&a, &options).unwrap() else {
        panic!("not done")
    };
    assert_eq!((summary.lines, summary.rejected), (3, 1));
    let rejects = std::fs::read_to_string(&paths.rejects).unwrap();
    assert!(
        rejects.contains("\"line\":2,") && rejects.contains("over the limit of 67108864 bytes"),
        "{rejects}"
    );
    assert_eq!(
        std::fs::read_to_string(&paths.out).unwrap().lines().count(),
        2
    );
}

/// A backend error (a device lost, out of memory) stops the run with the corpus line it was
/// annotating named; the lines before it stay journaled, and a rerun ends with the output of a
/// run that never failed.
#[test]
fn a_backend_error_stops_the_run_naming_its_line_and_the_rerun_finishes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut config = test_config();
    config.per_tool.calculator.min_numbers = 0; // every document scores calls
    let parts = Parts::new(&config);
    // Its 4th call is a backend error.
    let calls = AtomicUsize::new(0);
    let failing = Around(&parts.scorer, |scorer: &CpuScorer, c: &[_], o: &_| {
        if calls.fetch_add(1, Ordering::SeqCst) == 3 {
            return Err(toolsift::Error::Backend("cuda: the device was lost".into()));
        }
        scorer.variant_losses_unchecked(c, o)
    });
    let tools = [ToolKind::Calculator];
    let a = parts.annotator_scoring(&failing, &config, &tools);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 12);
    let opts = |out: &str| whole_run(&corpus, dir.path().join(out));
    let err = annotate::annotate(&a, &opts("c-out.jsonl")).expect_err("the 4th scoring fails");
    assert!(!err.is_input(), "a backend error stops the run: {err}");
    let msg = err.to_string();
    let at = format!("annotating {}:", corpus.display());
    let line: u64 = msg
        .strip_prefix(&at)
        .and_then(|rest| rest.split_once(": cuda: the device was lost"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{msg}"));
    let journal = std::fs::read_to_string(dir.path().join("c-out.jsonl.partial")).unwrap();
    // The header, then one entry per line before the failing one.
    assert_eq!(journal.lines().count() as u64, line, "{journal}");
    assert!(line > 1, "lines were annotated before the failure");

    let a = parts.annotator(&config, &tools);
    annotate::annotate(&a, &opts("c-out.jsonl")).unwrap();
    annotate::annotate(&a, &opts("fresh.jsonl")).unwrap();
    assert_same_outputs(dir.path(), "c-out", "fresh");
}

/// The journal goes only after every output is in place: a run whose summary cannot be
/// written (a folder where its temporary file goes) fails naming it, keeps its journal, and
/// the rerun finishes from the journal with the same outputs as a fresh run. (The kill -9 test
/// sees a wrong order only when a kill happens to land between the two.)
#[test]
fn a_run_whose_summary_cannot_be_written_keeps_its_journal() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 6);
    let opts = |out: &str| whole_run(&corpus, dir.path().join(out));
    let paths = annotate::OutputPaths::new(&dir.path().join("c-out.jsonl"));
    let blocker = PathBuf::from(format!("{}.tmp", paths.summary.display()));
    std::fs::create_dir(&blocker).unwrap();
    let err = annotate::annotate(&a, &opts("c-out.jsonl")).expect_err("no summary");
    assert!(
        err.to_string().contains(&blocker.display().to_string()),
        "{err}"
    );
    assert!(
        paths.journal.exists(),
        "the journal went before the summary was written"
    );
    assert!(!paths.summary.exists());
    std::fs::remove_dir(&blocker).unwrap();
    annotate::annotate(&a, &opts("c-out.jsonl")).unwrap();
    assert!(!paths.journal.exists() && paths.summary.exists());
    annotate::annotate(&a, &opts("fresh.jsonl")).unwrap();
    assert_same_outputs(dir.path(), "c-out", "fresh");
}

#[test]
fn library_run_resumes_after_a_stop_with_identical_output() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator, ToolKind::Calendar]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 23);
    let opts = |out: &str, stop_after| RunOptions {
        corpus: corpus.clone(),
        out: dir.path().join(out),
        shard: Shard::default(),
        run_info: json!(null),
        progress: false,
        stop_after,
    };
    let RunOutcome::Done(full, _) = annotate::annotate(&a, &opts("full.jsonl", None)).unwrap()
    else {
        panic!("not done")
    };
    assert_eq!((full.lines, full.rejected), (23, 5));
    for _ in 0..10 {
        match annotate::annotate(&a, &opts("stepped.jsonl", Some(4))).unwrap() {
            RunOutcome::Stopped(n) => assert_eq!(n, 4),
            RunOutcome::Done(s, _) => {
                assert_eq!(s.tools, full.tools);
                // The summary says the last run resumed after 20 lines (five stops of 4).
                assert_eq!((full.lines_resumed, s.lines_resumed), (0, 20));
                assert!(s.render().contains("(resumed after 20 lines:"));
                assert!(!full.render().contains("resumed"));
                break;
            }
        }
    }
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    assert_eq!(read("stepped.jsonl"), read("full.jsonl"));
    assert_eq!(read("stepped.rejects.jsonl"), read("full.rejects.jsonl"));
    let rejects = String::from_utf8(read("full.rejects.jsonl")).unwrap();
    assert!(
        rejects.contains("\"line\":3,") && rejects.contains("invalid JSON"),
        "{rejects}"
    );
    assert!(
        rejects.contains("\"line\":7,") && rejects.contains("no field"),
        "{rejects}"
    );
    // A finished output is not silently redone.
    assert!(annotate::annotate(&a, &opts("full.jsonl", None)).is_err());

    // Shards, merged, give the unsharded output.
    let parts: Vec<PathBuf> = run_shards(&a, &opts("sh.jsonl", None), 3)
        .into_iter()
        .map(|paths| paths.out)
        .collect();
    // A shell glob also matches the rejects and summaries: they are read beside their C*.
    let mut globbed = parts.clone();
    for p in &parts {
        let paths = annotate::OutputPaths::new(p);
        globbed.extend([paths.rejects, paths.summary]);
    }
    let report = annotate::merge(&dir.path().join("merged.jsonl"), &globbed).unwrap();
    assert_eq!(
        (
            report.documents,
            report.rejects,
            report.shards,
            report.corpus_lines
        ),
        (18, 5, 3, 23)
    );
    assert_eq!(read("merged.jsonl"), read("full.jsonl"));
    assert_eq!(read("merged.rejects.jsonl"), read("full.rejects.jsonl"));
    // The merged summary is the unsharded run's, but for the times: the same counts, the same
    // best and worst calls.
    let summary = |f: &str| -> annotate::Summary {
        let mut s: annotate::Summary = serde_json::from_slice(&read(f)).unwrap();
        (s.secs, s.wall_secs) = (Default::default(), 0.0);
        s
    };
    assert_eq!(summary("merged.summary.json"), summary("full.summary.json"));
    // Each says which build wrote it.
    assert_eq!(
        summary("merged.summary.json").toolsift_version.as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let mut reported = report.summary.clone();
    (reported.secs, reported.wall_secs) = (Default::default(), 0.0);
    assert_eq!(reported, summary("full.summary.json"));
    assert!(
        full.tools.iter().any(|t| !t.best.is_empty()),
        "no examples to compare"
    );
    let merge_err = |out: &str, inputs: &[PathBuf]| {
        let err = annotate::merge(&dir.path().join(out), inputs)
            .expect_err("merge should refuse")
            .to_string();
        assert!(
            !dir.path().join(out).exists(),
            "{out} written despite: {err}"
        );
        err
    };
    let err = merge_err("m2.jsonl", &[parts[0].clone(), parts[0].clone()]);
    assert!(err.contains("given twice"), "{err}");
    // The last shard lost: its lines are not silently missing from the merge.
    let err = merge_err("m3.jsonl", &parts[..2]);
    assert!(err.contains("1 of 3 shards missing"), "{err}");
    let third = annotate::OutputPaths::new(&parts[2]);
    assert!(
        err.contains(&format!(
            "its output {} is there, but was not given",
            parts[2].display()
        )),
        "{err}"
    );
    // A shard still running (or interrupted) is named by its journal.
    std::fs::write(&third.journal, "").unwrap();
    let err = merge_err("m3.jsonl", &parts[..2]);
    assert!(
        err.contains(&format!("its journal {} is there", third.journal.display())),
        "{err}"
    );
    std::fs::remove_file(&third.journal).unwrap();
    let err = merge_err("m4.jsonl", &[annotate::OutputPaths::new(&parts[0]).rejects]);
    assert!(err.contains("give merge the C* files"), "{err}");
    // A shard of a run with other settings does not merge with this run's.
    let RunOutcome::Done(_, other) = annotate::annotate(
        &a,
        &RunOptions {
            shard: Shard::new(2, 3).unwrap(),
            run_info: json!({"model": "another"}),
            ..opts("other.jsonl", None)
        },
    )
    .unwrap() else {
        panic!()
    };
    let err = merge_err("m6.jsonl", &[parts[0].clone(), parts[1].clone(), other.out]);
    assert!(
        err.contains(
            "other settings (in their summaries, run.info: null vs {\"model\":\"another\"})"
        ),
        "{err}"
    );
    let err = annotate::merge(dir.path(), &parts).unwrap_err().to_string();
    assert!(err.contains("give a file name"), "{err}");
    let err = annotate::merge(&dir.path().join("not-yet/"), &parts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("names a folder (ends in"), "{err}");
    let err = merge_err("m8.jsonl", &[parts[0].clone(), dir.path().to_owned()]);
    assert!(
        err.contains("is a folder; give merge the shards' C* files"),
        "{err}"
    );
    // A shard output that lost a line (edited, truncated) is caught.
    let cut = dir.path().join("cut.shard-00001-of-00003.jsonl");
    let src = annotate::OutputPaths::new(&parts[1]);
    let cut_paths = annotate::OutputPaths::new(&cut);
    let text = std::fs::read_to_string(&src.out).unwrap();
    let first_newline = text.find('\n').unwrap();
    std::fs::write(&cut, &text[first_newline + 1..]).unwrap();
    std::fs::copy(&src.rejects, &cut_paths.rejects).unwrap();
    std::fs::copy(&src.summary, &cut_paths.summary).unwrap();
    let err = merge_err(
        "m5.jsonl",
        &[parts[0].clone(), cut.clone(), parts[2].clone()],
    );
    assert!(err.contains("is missing from its shard's output"), "{err}");
    // Two lines swapped: the first one out of place is named, missing or out of order.
    let mut swapped: Vec<&str> = text.lines().collect();
    swapped.swap(0, 1);
    std::fs::write(&cut, swapped.join("\n") + "\n").unwrap();
    let err = merge_err(
        "m5.jsonl",
        &[parts[0].clone(), cut.clone(), parts[2].clone()],
    );
    assert!(err.contains("or out of order there"), "{err}");
    // A byte that is not UTF-8 is named by file and line.
    let mut bytes = std::fs::read(&src.out).unwrap();
    let second_line = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    bytes.insert(second_line + 1, 0xff);
    std::fs::write(&cut, bytes).unwrap();
    let err = merge_err(
        "m7.jsonl",
        &[parts[0].clone(), cut.clone(), parts[2].clone()],
    );
    assert!(
        err.contains("cut.shard-00001-of-00003.jsonl:2: not UTF-8"),
        "{err}"
    );
    // A second line that is not a record as annotate writes it is named by file and line: an
    // array of a record's fields (which serde alone reads as one), a key held twice, a key of
    // no record, an id annotate never writes.
    let lines: Vec<&str> = text.lines().collect();
    let second: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    let line_no = second["line"].clone();
    let mut unknown = second.clone();
    unknown["bogus"] = json!(1);
    let mut float_id = second.clone();
    float_id["id"] = json!(1.5);
    let record = |v: &serde_json::Value| v.to_string();
    for (bad, want) in [
        (
            json!([
                line_no,
                second["id"],
                second["text"],
                second["annotated_text"],
                []
            ])
            .to_string(),
            "not a JSON object (it is an array)",
        ),
        (
            record(&second).replacen('{', &format!("{{\"line\":{line_no},"), 1),
            "duplicate key \"line\"",
        ),
        (record(&unknown), "unknown field `bogus`"),
        (record(&float_id), "\"id\" is not a string"),
    ] {
        let mut edited: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        edited[1] = bad;
        std::fs::write(&cut, edited.join("\n") + "\n").unwrap();
        let err = merge_err(
            "m9.jsonl",
            &[parts[0].clone(), cut.clone(), parts[2].clone()],
        );
        assert!(
            err.contains("cut.shard-00001-of-00003.jsonl:2: not a C* record") && err.contains(want),
            "{want}: {err}"
        );
    }
    // A byte order mark at the start of a line (shards joined by hand, each with one) is not
    // copied into the merged C*.
    let marked: String = text.lines().map(|l| format!("\u{feff}{l}\n")).collect();
    std::fs::write(&cut, marked).unwrap();
    annotate::merge(
        &dir.path().join("m10.jsonl"),
        &[parts[0].clone(), cut.clone(), parts[2].clone()],
    )
    .unwrap();
    assert_eq!(read("m10.jsonl"), read("merged.jsonl"));

    // Inputs that would lose documents are refused before anything is written.
    let refused = |o: RunOptions| annotate::annotate(&a, &o).err().unwrap().to_string();
    // An --out that holds a file of another kind is not called a finished run's output.
    let notes = dir.path().join("notes.jsonl");
    std::fs::write(&notes, "{\"mine\": 1}\n").unwrap();
    let err = refused(RunOptions {
        out: notes.clone(),
        ..opts("unused.jsonl", None)
    });
    assert!(
        err.contains("exists and is not a C* file") && !err.contains("delete"),
        "{err}"
    );
    assert_eq!(std::fs::read(&notes).unwrap(), b"{\"mine\": 1}\n");
    // A shard's output path that is a named pipe is refused, not opened (which would block).
    #[cfg(unix)]
    {
        let fifo = dir.path().join("piped.shard-00000-of-00002.jsonl");
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let err = refused(RunOptions {
            shard: Shard::new(0, 2).unwrap(),
            ..opts("piped.jsonl", None)
        });
        assert!(err.contains("not a regular file"), "{err}");
    }
    let err = refused(RunOptions {
        out: dir.path().to_owned(),
        ..opts("unused.jsonl", None)
    });
    assert!(err.contains("give a file name for C*"), "{err}");
    // A folder by its spelling, though it does not exist yet: its journal would land beside
    // it and its final files could never be written.
    for folder in ["new/", "new/.", "new/.."] {
        let err = refused(RunOptions {
            out: dir.path().join(folder),
            ..opts("unused.jsonl", None)
        });
        assert!(
            err.contains("names a folder (ends in") && err.contains("give a file name for C*"),
            "{folder}: {err}"
        );
    }
    assert!(!dir.path().join("new").exists());
    #[cfg(unix)]
    {
        // The final rename would replace a device; a link to one is replaced itself.
        let err = refused(RunOptions {
            out: "/dev/null".into(),
            ..opts("unused.jsonl", None)
        });
        assert!(err.contains("is not a regular file"), "{err}");
        let link = dir.path().join("null.jsonl");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert!(annotate::check_out(&link).is_ok());
    }
    #[cfg(unix)]
    {
        // A pipe reads empty the second time (the lines are counted first).
        let fifo = dir.path().join("fifo");
        let made = Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            // Without the check the run would block opening the pipe: a writer after 5 s (and
            // again at each reopening) lets it read nothing and fail this test, not hang it.
            let pipe = fifo.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(5));
                while std::fs::OpenOptions::new().write(true).open(&pipe).is_ok() {}
            });
            let err = refused(RunOptions {
                corpus: fifo,
                ..opts("piped.jsonl", None)
            });
            assert!(err.contains("must be a regular file"), "{err}");
        }
    }

    // A corpus edited between a stop and the resume (same line count) is refused.
    let edited = dir.path().join("edited.jsonl");
    std::fs::copy(&corpus, &edited).unwrap();
    let edited_opts = |stop_after| RunOptions {
        corpus: edited.clone(),
        ..opts("from-edited.jsonl", stop_after)
    };
    assert!(matches!(
        annotate::annotate(&a, &edited_opts(Some(4))).unwrap(),
        RunOutcome::Stopped(4)
    ));
    let text = std::fs::read_to_string(&edited).unwrap();
    std::fs::write(&edited, text.replacen("doc-1", "doc-X", 1)).unwrap();
    let err = refused(edited_opts(None));
    assert!(err.contains("run.corpus_xxh3: "), "{err}");

    // An output folder that does not exist yet is made.
    let RunOutcome::Done(_, paths) =
        annotate::annotate(&a, &opts("new/folder/c.jsonl", None)).unwrap()
    else {
        panic!("not done")
    };
    assert_eq!(std::fs::read(paths.out).unwrap(), read("full.jsonl"));
}

// ---- the binary ----

fn bin_config(dir: &Path) -> PathBuf {
    let path = dir.join("toolsift.toml");
    std::fs::write(
        &path,
        r#"max_call_tokens = 4
[per_tool.calculator]
k = 2
m = 2
prompt = "[Calculator(1)] 1\nInput: {x}\nOutput: "
[per_tool.calendar]
k = 1
m = 2
prompt = "[Calendar()] x\nInput: {x}\nOutput: "
[tools.calendar]
date = "2023-01-30"
"#,
    )
    .unwrap();
    path
}

fn run_bin(dir: &Path, corpus: &Path, out: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolsift"));
    cmd.args(["annotate", "--no-progress", "--seed", "3", "--model"])
        .arg(common::tiny("f32"))
        .arg("--corpus")
        .arg(corpus)
        .arg("--out")
        .arg(dir.join(out))
        .arg("--config")
        .arg(bin_config(dir));
    cmd
}

#[test]
fn binary_annotates_and_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 30);
    let started = std::time::Instant::now();
    let out = run_bin(dir.path(), &corpus, "ref.jsonl").output().unwrap();
    let run_ms = started.elapsed().as_millis().max(20) as usize;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("sampling") && stderr.contains("Calculator"),
        "{stderr}"
    );
    let reference = std::fs::read_to_string(dir.path().join("ref.jsonl")).unwrap();
    let lines: Vec<Value> = reference
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 24, "30 lines, 6 rejected");
    for l in &lines {
        assert!(l["line"].as_u64().is_some() && l["text"].is_string() && l["calls"].is_array());
    }
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("ref.summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["rejected"], 6);
    assert!(summary["secs"]["sampling"].as_f64().unwrap() > 0.0);

    // Kill at random points, resume, until a run completes: after 5-120% of the uninterrupted
    // run's time (tens of milliseconds with the tiny model), so kills land anywhere from model
    // loading to the final write. A round that no kill interrupted midway (a run can finish
    // before the first kill) is repeated under a new name.
    let mut rng = Rng::new(42);
    for round in 0.. {
        let name = format!("crash{round}");
        let (kills, kills_mid_run) = kill_and_resume(dir.path(), &corpus, &name, run_ms, &mut rng);
        eprintln!("round {round}: killed {kills} times, {kills_mid_run} of them after some documents were done");
        let crashed = std::fs::read_to_string(dir.path().join(format!("{name}.jsonl"))).unwrap();
        assert_eq!(
            crashed, reference,
            "resumed output differs from the uninterrupted run"
        );
        assert_eq!(
            std::fs::read(dir.path().join(format!("{name}.rejects.jsonl"))).unwrap(),
            std::fs::read(dir.path().join("ref.rejects.jsonl")).unwrap()
        );
        assert!(!dir.path().join(format!("{name}.jsonl.partial")).exists());
        if kills_mid_run >= 1 {
            break;
        }
        assert!(
            round < 10,
            "no kill interrupted the run midway in 10 rounds: make it longer"
        );
    }
}

/// SIGTERM ends a run whose stderr is a full pipe nobody reads (`2>&1 | less` unpaged, a
/// stalled log driver): the main thread is blocked writing to it, holding stderr's lock, and
/// the stop note must not wait for that lock, or the signal would never end the process.
#[cfg(unix)]
#[test]
fn a_stop_signal_ends_a_run_whose_stderr_is_blocked() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 30);
    let mut fds = [0; 2];
    // SAFETY: pipe(2) writes two new descriptors into `fds`, each then owned exactly once.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Fill the pipe: non-blocking writes until it is full, then blocking again.
    // SAFETY: fcntl and write on a descriptor this test owns, from a live buffer.
    unsafe {
        let flags = libc::fcntl(fds[1], libc::F_GETFL);
        libc::fcntl(fds[1], libc::F_SETFL, flags | libc::O_NONBLOCK);
        let chunk = [b'x'; 4096];
        for len in [4096, 1] {
            while libc::write(fds[1], chunk.as_ptr().cast(), len) > 0 {}
        }
        libc::fcntl(fds[1], libc::F_SETFL, flags);
    }
    let mut child = run_bin(dir.path(), &corpus, "c.jsonl")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(write_end))
        .spawn()
        .unwrap();
    // Time to load the model and block on the first note.
    std::thread::sleep(Duration::from_millis(800));
    // SAFETY: kill(2) on the child this test started and has not waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(read_end);
    let status = status.expect("SIGTERM did not end the run in 20 s");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

/// The journal records the model's content hash, not only its folder: a journal from a run on
/// other weights (a checkpoint swapped in the same folder) is refused; the same hash resumes.
#[test]
fn a_journal_from_other_weights_in_the_same_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 6);
    let out = run_bin(dir.path(), &corpus, "ref.jsonl").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("ref.summary.json")).unwrap(),
    )
    .unwrap();
    let hash = summary["run"]["info"]["model_xxh3"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(hash.len(), 16, "{summary}");
    // A journal as a run with `model_xxh3` would have left it, with no line done yet.
    let journal_with = |model_xxh3: &str| {
        let mut run = summary["run"].clone();
        run["shard"] = json!("0/1");
        run["info"]["model_xxh3"] = json!(model_xxh3);
        format!(
            "{}\n",
            json!({"journal": "toolsift-annotate/2", "run": run})
        )
    };
    std::fs::write(
        dir.path().join("other.jsonl.partial"),
        journal_with("0123456789abcdef"),
    )
    .unwrap();
    let out = run_bin(dir.path(), &corpus, "other.jsonl")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("run.info.model_xxh3: "), "{stderr}");
    std::fs::write(dir.path().join("same.jsonl.partial"), journal_with(&hash)).unwrap();
    let out = run_bin(dir.path(), &corpus, "same.jsonl").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("same.jsonl")).unwrap(),
        std::fs::read(dir.path().join("ref.jsonl")).unwrap()
    );
}

/// A run with WikiSearch records its index's hash among the settings a resume must match, so a
/// journal is not resumed on an index rebuilt in place; a run without it, same config, does not
/// (it is not tied to an index it never reads).
#[test]
fn a_run_records_the_wikisearch_index_only_when_wikisearch_runs() {
    use toolsift::annotate::tools::{build_index, WikiSearch};
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 4);
    let docs = dir.path().join("wiki.jsonl");
    std::fs::write(
        &docs,
        "{\"id\": \"a\", \"text\": \"The cat sat on the mat.\"}\n",
    )
    .unwrap();
    let index = dir.path().join("idx");
    build_index(&docs, &index, "text").unwrap();
    let mut text = std::fs::read_to_string(bin_config(dir.path())).unwrap();
    text.push_str(&format!(
        "[tools.wikisearch]\nindex = {:?}\n[per_tool.wikisearch]\nk = 1\nm = 1\n\
         prompt = \"[WikiSearch(x)] x\\nInput: {{x}}\\nOutput: \"\n",
        index.display().to_string()
    ));
    let wiki_config = dir.path().join("wiki.toml");
    std::fs::write(&wiki_config, text).unwrap();
    let run_info = |tools: &str, out: &str| -> Value {
        let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["annotate", "--no-progress", "--tools", tools, "--model"])
            .arg(common::tiny("f32"))
            .arg("--corpus")
            .arg(&corpus)
            .arg("--out")
            .arg(dir.path().join(format!("{out}.jsonl")))
            .arg("--config")
            .arg(&wiki_config)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let summary = dir.path().join(format!("{out}.summary.json"));
        let summary: Value =
            serde_json::from_str(&std::fs::read_to_string(summary).unwrap()).unwrap();
        summary["run"]["info"].clone()
    };
    let want = format!("{:016x}", WikiSearch::index_xxh3(&index).unwrap());
    let info = run_info("calculator,wikisearch", "w");
    assert_eq!(info["wikisearch_index_xxh3"], json!(want));
    let info = run_info("calculator", "c");
    assert!(info["model_xxh3"].is_string(), "{info}");
    assert!(info.get("wikisearch_index_xxh3").is_none(), "{info}");
}

/// Runs annotate into `{name}.jsonl`, killing it (SIGKILL) after a random share of `run_ms` and
/// resuming, until a run completes (at most 12 kills, then one run to the end). Returns the kills
/// and those that landed after some documents were journaled and before the last.
fn kill_and_resume(
    dir: &Path,
    corpus: &Path,
    name: &str,
    run_ms: usize,
    rng: &mut Rng,
) -> (usize, usize) {
    let out = format!("{name}.jsonl");
    let journal = dir.join(format!("{name}.jsonl.partial"));
    let journaled =
        || std::fs::read_to_string(&journal).map_or(0, |j| j.lines().count().saturating_sub(1));
    let (mut kills, mut kills_mid_run) = (0, 0);
    loop {
        let mut child = run_bin(dir, corpus, &out)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let before = journaled();
        let wait_ms = rng.range(run_ms / 20, run_ms * 6 / 5);
        std::thread::sleep(Duration::from_millis(wait_ms as u64));
        if child.try_wait().unwrap().is_some() {
            let done = child.wait_with_output().unwrap();
            assert!(
                done.status.success(),
                "a resumed run failed: {}",
                String::from_utf8_lossy(&done.stderr)
            );
            return (kills, kills_mid_run);
        }
        child.kill().unwrap(); // SIGKILL: no chance to clean up
        child.wait().unwrap();
        kills += 1;
        if !journal.exists() && dir.join(&out).exists() {
            // The kill landed after the final files were written (while the run exited).
            return (kills, kills_mid_run);
        }
        let after = journaled();
        assert!(after >= before, "the journal lost finished documents");
        kills_mid_run += usize::from(after > before && after < 30);
        if kills >= 12 {
            let status = run_bin(dir, corpus, &out)
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success());
            return (kills, kills_mid_run);
        }
    }
}

/// A few hundred documents through the whole pipeline (mock sampler, real CPU scorer): the
/// summary splits the time between sampling, tools and scoring.
#[test]
fn a_few_hundred_documents_report_the_time_per_stage() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator, ToolKind::Calendar]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 300);
    let options = RunOptions {
        corpus,
        out: dir.path().join("o.jsonl"),
        shard: Shard::default(),
        run_info: json!(null),
        progress: false,
        stop_after: None,
    };
    let RunOutcome::Done(s, _) = annotate::annotate(&a, &options).unwrap() else {
        panic!()
    };
    eprint!("{}", s.render());
    assert_eq!((s.lines, s.documents, s.rejected), (300, 240, 60));
    assert!(
        s.secs.sampling > 0.0 && s.secs.tools > 0.0 && s.secs.scoring > 0.0,
        "{:?}",
        s.secs
    );
    assert!(s.candidates_scored > 0);
    let calc = &s.tools[0];
    assert_eq!(calc.tool, "Calculator");
    assert!(calc.stats.calls_kept > 0 && !calc.best.is_empty() && !calc.worst.is_empty());
    assert!(calc.best[0].delta >= calc.worst[0].delta);
}

/// `toolsift annotate` with a tool of the config's own: `--tools` names it as the config does,
/// the run counts it under its name; an unknown name lists the tools there are.
#[test]
fn the_binary_runs_a_custom_tool_named_in_its_config() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 4);
    let config = dir.path().join("custom.toml");
    std::fs::write(
        &config,
        r#"max_call_tokens = 4
[per_tool.custom.Echo]
k = 2
m = 2
prompt = "[Echo(a)] a\nInput: {x}\nOutput: "
[tools.custom.Echo]
command = ["cat"]
"#,
    )
    .unwrap();
    let run = |config: &Path, tools: Option<&str>, out: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolsift"));
        cmd.args(["annotate", "--no-progress", "--model"])
            .arg(common::tiny("f32"))
            .arg("--corpus")
            .arg(&corpus)
            .arg("--out")
            .arg(dir.path().join(out))
            .arg("--config")
            .arg(config);
        if let Some(tools) = tools {
            cmd.args(["--tools", tools]);
        }
        cmd.output().unwrap()
    };
    let out = run(&config, Some("Echo"), "c.jsonl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("c.summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["tools"][0]["tool"], "Echo", "{summary}");
    assert!(summary["tools"][0]["texts_considered"].as_u64().unwrap() > 0);
    assert_eq!(summary["run"]["tools"], json!(["Echo"]));

    // A program this machine lacks stops a run that would call it, before anything is
    // written; a run that does not call it (--tools leaves it out) does not look (it fails
    // later here: the tiny model has no room for the calculator's prompt).
    let missing = dir.path().join("missing.toml");
    std::fs::write(
        &missing,
        std::fs::read_to_string(&config).unwrap().replace(
            r#"command = ["cat"]"#,
            r#"command = ["/nonexistent/echo-tool"]"#,
        ),
    )
    .unwrap();
    let out = run(&missing, None, "m.jsonl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr
                .contains(r#"tool Echo: command's program "/nonexistent/echo-tool" cannot run"#),
        "{stderr}"
    );
    assert!(!dir.path().join("m.jsonl.partial").exists());
    let out = run(&missing, Some("calculator"), "m.jsonl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[per_tool.calculator] prompt") && !stderr.contains("cannot run"),
        "{stderr}"
    );

    // Settings without a service: an error naming the table to add, not a tool left out.
    let lonely = dir.path().join("lonely.toml");
    std::fs::write(
        &lonely,
        "[per_tool.custom.Lonely]\nprompt = \"[Lonely(a)] a\\nInput: {x}\\nOutput: \"\n",
    )
    .unwrap();
    let out = run(&lonely, None, "l.jsonl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("configure it under [tools.custom.Lonely]"),
        "{stderr}"
    );
    // --print-config refuses those settings too: they could start no run.
    let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["annotate", "--print-config", "--config"])
        .arg(&lonely)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && out.stdout.is_empty()
            && stderr.contains("configure it under [tools.custom.Lonely]"),
        "{stderr}"
    );

    let out = run(&config, Some("Ekho"), "d.jsonl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("unknown tool \"Ekho\"") && stderr.contains("custom tool: Echo"),
        "{stderr}"
    );

    // No tool at all: an error, not the corpus copied into C* unannotated.
    let none = dir.path().join("none.toml");
    std::fs::write(
        &none,
        "[tools.calculator]\nenabled = false\n[tools.calendar]\nenabled = false\n",
    )
    .unwrap();
    let out = run(&none, None, "n.jsonl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("no tool to run"),
        "{stderr}"
    );
    assert!(!dir.path().join("n.jsonl").exists());

    // A tool that cannot open is an error naming the config file.
    let wiki = dir.path().join("wiki.toml");
    std::fs::write(&wiki, "[tools.wikisearch]\nindex = \"/nonexistent\"\n").unwrap();
    let out = run(&wiki, None, "w.jsonl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("wiki.toml: tool WikiSearch"),
        "{stderr}"
    );
    assert!(
        stderr.contains("/nonexistent: No such file or directory"),
        "a missing index is said to be missing: {stderr}"
    );
}

#[test]
fn print_config_prints_parsable_defaults() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["annotate", "--print-config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        AnnotateConfig::from_toml(&text).unwrap(),
        AnnotateConfig::default()
    );
    // A config the run would refuse (a service URL with no usable port) is refused here too.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[tools.qa]\nurl = \"http://127.0.0.1:99999/qa\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["annotate", "--print-config", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{stderr}");
    assert!(
        stderr.contains("tool QA") && stderr.contains("99999"),
        "{stderr}"
    );
    // So are flags the run would refuse, and a seed a TOML file cannot hold.
    for (args, want) in [
        (&["--shard", "5/2"][..], "shard 5/2"),
        (&["--tools", "calculator,nope"], "unknown tool \"nope\""),
        (&["--demo", "--tools", "nope"], "unknown tool \"nope\""),
        (
            &["--seed", "18446744073709551615"],
            "past TOML's integer range",
        ),
        (
            &["--demo", "--seed", "18446744073709551615"],
            "past TOML's integer range",
        ),
        // A built-in the settings do not configure: a run would refuse it, so nothing prints.
        (
            &["--tools", "calculator,wikisearch"],
            "tool wikisearch is not available: configure it under [tools.wikisearch]",
        ),
        (
            &["--demo", "--tools", "qa"],
            "tool qa is not available: configure it under [tools.qa]",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["annotate", "--print-config"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && out.stdout.is_empty(),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

#[test]
fn a_prompt_that_leaves_no_room_for_a_text_is_an_error() {
    let mut config = test_config();
    // The tiny model has n_positions 256.
    config.per_tool.calendar.prompt = format!("{} {{x}}", "word ".repeat(300));
    let tools = [ToolKind::Calculator, ToolKind::Calendar];
    let err = Parts::new(&config)
        .try_annotator(&config, &tools)
        .err()
        .expect("a prompt longer than the context is refused")
        .to_string();
    assert!(
        err.contains("[per_tool.calendar] prompt") && err.contains("n_positions (256)"),
        "{err}"
    );
}

#[test]
fn a_huge_max_call_tokens_is_an_error_not_an_overflow() {
    let mut config = test_config();
    config.max_call_tokens = usize::MAX;
    let err = Parts::new(&config)
        .try_annotator(&config, &[ToolKind::Calculator])
        .err()
        .expect("no room for a text")
        .to_string();
    assert!(err.contains("max_call_tokens"), "{err}");
}

/// C* is written under `<out>.tmp` and renamed into place: where that name is another run's
/// output (`--out c.jsonl.tmp`, its summary or journal beside it), a run on `c.jsonl` is refused
/// before anything is written, and that output is left as it was; a leftover `.tmp` with no
/// run of its own (a crash's) is simply written over.
#[test]
fn a_temporary_name_that_is_another_runs_output_is_not_written_over() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 6);
    let held = dir.path().join("c.jsonl.tmp");
    annotate::annotate(&a, &whole_run(&corpus, held.clone())).unwrap();
    let before = std::fs::read(&held).unwrap();
    let out = dir.path().join("c.jsonl");
    let err = annotate::annotate(&a, &whole_run(&corpus, out.clone()))
        .expect_err("a run over another run's output")
        .to_string();
    assert!(
        err.contains("c.jsonl.tmp, which is another run's output")
            && err.contains("c.jsonl.tmp.summary.json beside it"),
        "{err}"
    );
    assert_eq!(std::fs::read(&held).unwrap(), before);
    assert!(!out.exists());
    // Without its summary it is a leftover, written over.
    std::fs::remove_file(dir.path().join("c.jsonl.tmp.summary.json")).unwrap();
    annotate::annotate(&a, &whole_run(&corpus, out.clone())).unwrap();
    assert!(out.is_file() && !held.exists());

    // A run on "d.jsonl.tmp" in progress (its journal, no C* yet) holds the name too; and the
    // other way round, "e.jsonl.tmp" is refused while a run on "e.jsonl" is in progress.
    std::fs::write(dir.path().join("d.jsonl.tmp.partial"), "").unwrap();
    let err = annotate::annotate(&a, &whole_run(&corpus, dir.path().join("d.jsonl")))
        .expect_err("a run under a run in progress")
        .to_string();
    assert!(err.contains("d.jsonl.tmp.partial beside it"), "{err}");
    assert!(!dir.path().join("d.jsonl").exists());
    std::fs::write(dir.path().join("e.jsonl.partial"), "").unwrap();
    let err = annotate::annotate(&a, &whole_run(&corpus, dir.path().join("e.jsonl.tmp")))
        .expect_err("a run on the temporary name of a run in progress")
        .to_string();
    assert!(
        err.contains("the temporary name a run on") && err.contains("e.jsonl.partial beside it"),
        "{err}"
    );
    assert!(!dir.path().join("e.jsonl.tmp").exists());
}

#[test]
fn a_run_never_writes_over_its_inputs_nor_trusts_a_stale_journal() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let dir = tempfile::tempdir().unwrap();
    let opts = |corpus: &Path, out: PathBuf, shard: Shard, stop_after| RunOptions {
        corpus: corpus.to_owned(),
        out,
        shard,
        run_info: json!(null),
        progress: false,
        stop_after,
    };
    let out = dir.path().join("c.jsonl");

    // A corpus that is one of the files the run writes (C*, rejects, summary, journal, or a
    // temporary name renamed onto C*) is refused, and left as it was.
    for name in [
        "c.jsonl",
        "c.rejects.jsonl",
        "c.summary.json",
        "c.jsonl.tmp",
        "c.jsonl.partial",
    ] {
        let corpus = dir.path().join(name);
        write_corpus(&corpus, 6);
        let before = std::fs::read(&corpus).unwrap();
        let err = annotate::annotate(&a, &opts(&corpus, out.clone(), Shard::default(), None))
            .err()
            .unwrap_or_else(|| panic!("--corpus {name} accepted"))
            .to_string();
        assert!(err.contains("a file this run writes"), "{name}: {err}");
        assert_eq!(std::fs::read(&corpus).unwrap(), before, "{name}");
        std::fs::remove_file(&corpus).unwrap();
    }

    // A finished run's outputs are not written over, even through another --out that shares
    // their rejects and summary names ("f.jsonl" and "f"), nor when only C* was deleted.
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 6);
    let done = dir.path().join("f.jsonl");
    annotate::annotate(&a, &opts(&corpus, done.clone(), Shard::default(), None)).unwrap();
    let finished = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    let before = [
        finished("f.jsonl"),
        finished("f.rejects.jsonl"),
        finished("f.summary.json"),
    ];
    let refusal = |out: &str| {
        annotate::annotate(
            &a,
            &opts(&corpus, dir.path().join(out), Shard::default(), None),
        )
        .err()
        .unwrap_or_else(|| panic!("--out {out} written over a finished run"))
        .to_string()
    };
    // Each refusal names the files that are there, and only those: the advice to delete them
    // must not send a user after a file of the other spelling, nor past the C* that blocks.
    let (f_jsonl, f) = (done.display().to_string(), dir.path().join("f"));
    let err = refusal("f.jsonl");
    assert!(err.contains("is a finished run's output"), "{err}");
    assert!(err.contains(&format!("delete {f_jsonl}, ")), "{err}");
    let err = refusal("f");
    assert!(
        err.starts_with(&format!("{f_jsonl} is a finished run's C*")),
        "{err}"
    );
    assert!(!err.contains(&format!("{}, ", f.display())), "{err}");
    std::fs::remove_file(&done).unwrap();
    let err = refusal("f.jsonl");
    assert!(err.contains("is a finished run's output"), "{err}");
    assert!(
        !err.contains(&format!("{f_jsonl},")),
        "names the deleted C*: {err}"
    );
    assert_eq!(
        [finished("f.rejects.jsonl"), finished("f.summary.json")],
        [before[1].clone(), before[2].clone()]
    );
    assert!(!dir.path().join("f").exists());
    // With only the C* left ("f.jsonl"), a run on its other spelling ("f") is still refused:
    // its rejects and summary would sit beside that C*, another run's. A file of the other
    // spelling that is no C* (nothing of a run's) does not stop a run.
    std::fs::write(&done, &before[0]).unwrap();
    for name in ["f.rejects.jsonl", "f.summary.json"] {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    let err = annotate::annotate(
        &a,
        &opts(&corpus, dir.path().join("f"), Shard::default(), None),
    )
    .expect_err("a run beside the other spelling's C*")
    .to_string();
    assert!(err.contains("is a finished run's C*"), "{err}");
    for name in ["f", "f.partial", "f.rejects.jsonl", "f.summary.json"] {
        assert!(!dir.path().join(name).exists(), "{name} written");
    }
    std::fs::write(dir.path().join("g"), "my notes\n").unwrap();
    annotate::annotate(
        &a,
        &opts(&corpus, dir.path().join("g.jsonl"), Shard::default(), None),
    )
    .unwrap();
    std::fs::remove_file(&corpus).unwrap();

    // A journal whose lines were made from other text than the corpus now holds (edited during
    // that run, then restored: the header's hash matches again) is not resumed.
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 12);
    let partial = opts(
        &corpus,
        dir.path().join("p.jsonl"),
        Shard::default(),
        Some(4),
    );
    assert!(matches!(
        annotate::annotate(&a, &partial).unwrap(),
        RunOutcome::Stopped(4)
    ));
    let journal = dir.path().join("p.jsonl.partial");
    let text = std::fs::read_to_string(&journal).unwrap();
    let (head, last) = text.trim_end().rsplit_once('\n').unwrap();
    let mut last = annotate::JournalEntry::from_line(last.as_bytes()).unwrap();
    assert!(last.corpus_xxh3.is_some(), "{last:?}");
    last.corpus_xxh3 = Some("0123456789abcdef".into());
    let tampered = format!("{head}\n{}\n", last.to_line().unwrap());
    std::fs::write(&journal, tampered).unwrap();
    let err = annotate::annotate(
        &a,
        &RunOptions {
            stop_after: None,
            ..partial
        },
    )
    .expect_err("a stale journal is refused")
    .to_string();
    assert!(err.contains("are not the text it"), "{err}");

    // While that run is in progress (its journal there), a run on the other spelling of its
    // --out ("p" for "p.jsonl": the same rejects and summary names) is refused, and writes
    // nothing, its own journal included.
    let journal_before = std::fs::read(&journal).unwrap();
    let err = annotate::annotate(
        &a,
        &opts(&corpus, dir.path().join("p"), Shard::default(), None),
    )
    .expect_err("another spelling's run in progress")
    .to_string();
    assert!(
        err.contains("is in progress") && err.contains("p.jsonl.partial") && !err.contains("  "),
        "{err}"
    );
    assert_eq!(std::fs::read(&journal).unwrap(), journal_before);
    for name in ["p", "p.partial", "p.rejects.jsonl", "p.summary.json"] {
        assert!(!dir.path().join(name).exists(), "{name} written");
    }

    // Shards whose merge output is an input under another spelling, or whose run did not
    // finish (a journal beside them), are refused; outputs named without ".jsonl" merge
    // from a glob.
    let base = opts(&corpus, dir.path().join("sh"), Shard::default(), None);
    let shards = run_shards(&a, &base, 2);
    assert!(!shards[0].out.to_string_lossy().ends_with(".jsonl"));
    let globbed: Vec<PathBuf> = shards
        .iter()
        .flat_map(|p| [p.out.clone(), p.rejects.clone(), p.summary.clone()])
        .collect();
    let merged = dir.path().join("all");
    // Another merge into the same --out, in progress (it holds its temporary file's lock):
    // this one is refused and leaves that file alone.
    let busy = dir.path().join("all.tmp");
    std::fs::write(&busy, "another merge's lines\n").unwrap();
    let holder = std::fs::File::open(&busy).unwrap();
    holder.lock().unwrap();
    let err = annotate::merge(&merged, &globbed).unwrap_err().to_string();
    assert!(err.contains("another toolsift process is writing"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&busy).unwrap(),
        "another merge's lines\n"
    );
    assert!(!merged.exists());
    drop(holder);
    annotate::merge(&merged, &globbed).unwrap();
    // While a run on that --out is in progress (its journal there), a merge into it is refused.
    std::fs::write(dir.path().join("all.partial"), "").unwrap();
    let err = annotate::merge(&merged, &globbed).unwrap_err().to_string();
    assert!(err.contains("a run on it is in progress"), "{err}");
    std::fs::remove_file(dir.path().join("all.partial")).unwrap();
    // Beside a file of the other spelling that is no C* (nothing of a run's), it merges.
    std::fs::write(dir.path().join("notes"), "my notes\n").unwrap();
    annotate::merge(&dir.path().join("notes.jsonl"), &globbed).unwrap();
    // Into the other spelling of that --out ("all.jsonl"): its rejects and summary are "all"'s,
    // so the merge is refused and "all"'s stay as they were.
    let summary_before = std::fs::read(dir.path().join("all.summary.json")).unwrap();
    let err = annotate::merge(&dir.path().join("all.jsonl"), &globbed)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("its rejects and summary are the ones"),
        "{err}"
    );
    assert!(!dir.path().join("all.jsonl").exists());
    assert_eq!(
        std::fs::read(dir.path().join("all.summary.json")).unwrap(),
        summary_before
    );
    // Over a file that is not a C* (an earlier merge's is replaced): refused, left as it was.
    let precious = dir.path().join("precious.jsonl");
    std::fs::write(&precious, "{\"mine\": 1}\n").unwrap();
    let err = annotate::merge(&precious, &globbed)
        .unwrap_err()
        .to_string();
    assert!(err.contains("exists and is not a C* file"), "{err}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"{\"mine\": 1}\n");
    // Into a folder that does not exist yet: made, as annotate makes its --out folder.
    let fresh = dir.path().join("new/sub/m.jsonl");
    annotate::merge(&fresh, &globbed).unwrap();
    assert_eq!(
        std::fs::read(&fresh).unwrap(),
        std::fs::read(&merged).unwrap()
    );
    let cstars: Vec<PathBuf> = shards.iter().map(|p| p.out.clone()).collect();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let respelled = dir
        .path()
        .join("sub/..")
        .join(shards[0].out.file_name().unwrap());
    let before = std::fs::read(&shards[0].out).unwrap();
    let err = annotate::merge(&respelled, &cstars)
        .unwrap_err()
        .to_string();
    assert!(err.contains("would overwrite the input"), "{err}");
    assert_eq!(std::fs::read(&shards[0].out).unwrap(), before);
    std::fs::write(&shards[1].journal, "").unwrap();
    let err = annotate::merge(&dir.path().join("m.jsonl"), &cstars)
        .unwrap_err()
        .to_string();
    assert!(err.contains("in progress or did not finish"), "{err}");
}

#[test]
fn shard_flags_that_contradict_each_other_are_refused() {
    let bin = env!("CARGO_BIN_EXE_toolsift");
    for (args, want) in [
        (
            &["--shard", "1/4", "--shards", "8"][..],
            "cannot be used with",
        ),
        (&["--shards", "0"][..], "0 is not in 1.."),
    ] {
        let out = Command::new(bin)
            .args(["annotate", "--model", "m", "--corpus", "c", "--out", "o"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "{args:?}: {err}"
        );
    }
}

/// Rejects are data and the run succeeds, but a corpus whose every line is rejected (most often
/// a wrong --text-field) is called out on stderr with the first reason.
#[test]
fn a_run_that_rejects_every_line_warns() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(
        &corpus,
        "{\"text\": \"the cat sat on 3 mats\"}\n{\"text\": \"2 dogs\"}\n",
    )
    .unwrap();
    let out = run_bin(dir.path(), &corpus, "all.jsonl")
        .args(["--text-field", "body"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: every one of the 2 corpus lines was rejected; the first: line 1:")
            && err.contains("no field \"body\""),
        "{err}"
    );

    let fine = run_bin(dir.path(), &corpus, "fine.jsonl").output().unwrap();
    let err = String::from_utf8_lossy(&fine.stderr);
    assert!(
        fine.status.success() && !err.contains("warning: every"),
        "{err}"
    );
}

/// `--text-field id` reads the id as the text and the record keeps its id: it is not taken away
/// to be the text (which left "id" null).
#[test]
fn a_text_field_that_is_the_id_keeps_the_id() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(
        &corpus,
        "{\"id\": \"the cat sat on 3 mats\", \"text\": \"x\"}\n{\"id\": \"2 dogs\"}\n",
    )
    .unwrap();
    let out = run_bin(dir.path(), &corpus, "ids.jsonl")
        .args(["--text-field", "id"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let written = std::fs::read_to_string(dir.path().join("ids.jsonl")).unwrap();
    let lines: Vec<Value> = written
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{written}");
    for (l, id) in lines.iter().zip(["the cat sat on 3 mats", "2 dogs"]) {
        assert_eq!((&l["id"], &l["text"]), (&json!(id), &json!(id)), "{l}");
    }
}

/// A 9-line corpus written in `dir`, annotated with the Calculator as 3 shards under sh/: their
/// outputs.
fn nine_lines_in_three_shards(dir: &Path) -> Vec<annotate::OutputPaths> {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let corpus = dir.join("corpus.jsonl");
    write_corpus(&corpus, 9);
    run_shards(&a, &RunOptions::new(&corpus, dir.join("sh/cstar.jsonl")), 3)
}

/// A merge replaces an earlier merge's rejects and summary beside its --out, never a file of
/// another kind there: that is refused before anything is written, naming the file, as a file
/// that is no C* at --out is.
#[test]
fn merge_never_replaces_a_foreign_rejects_file_or_summary() {
    let dir = tempfile::tempdir().unwrap();
    let cstars: Vec<PathBuf> = nine_lines_in_three_shards(dir.path())
        .into_iter()
        .map(|paths| paths.out)
        .collect();
    let out = dir.path().join("mx.jsonl");
    let rejects = dir.path().join("mx.rejects.jsonl");
    let summary = dir.path().join("mx.summary.json");
    let foreign_rejects = "{\"id\": 1, \"text\": \"someone else's records\"}\n";
    let foreign_summary = "{\"important\": true}\n";
    for (path, foreign, what) in [
        (&rejects, foreign_rejects, "rejects file"),
        (&summary, foreign_summary, "summary"),
    ] {
        std::fs::write(path, foreign).unwrap();
        let err = annotate::merge(&out, &cstars)
            .err()
            .unwrap_or_else(|| panic!("a foreign {what} at {} replaced", path.display()))
            .to_string();
        assert!(
            err.contains(&format!(
                "{} exists and is not a toolsift {what}",
                path.display()
            )),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(path).unwrap(), foreign);
        assert!(!out.exists(), "C* written despite: {err}");
        std::fs::remove_file(path).unwrap();
    }
    // Nor is a folder there (which the final rename could not replace anyway).
    std::fs::create_dir(&summary).unwrap();
    let err = annotate::merge(&out, &cstars).unwrap_err().to_string();
    assert!(err.contains("is not a toolsift summary"), "{err}");
    std::fs::remove_dir(&summary).unwrap();
    // An earlier merge's files, an empty rejects file among them, are replaced.
    annotate::merge(&out, &cstars).unwrap();
    let merged = std::fs::read(&out).unwrap();
    std::fs::write(&rejects, "").unwrap();
    annotate::merge(&out, &cstars).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), merged);
    assert!(std::fs::read_to_string(&rejects)
        .unwrap()
        .contains("\"reason\""));
}

/// A merge joins lines that add up to the corpus, each from its own shard's files once: shard
/// outputs edited into ones that do not (a line beyond the corpus, in two files, missing, in
/// another shard's file, a call off a character boundary, a summary naming no shard or another
/// split) are refused, each named, and nothing is written.
#[test]
fn merge_refuses_shard_outputs_that_do_not_add_up_to_the_corpus() {
    let dir = tempfile::tempdir().unwrap();
    // Lines 3 and 7 are rejects: shard 0/3 holds C* lines 1, 4 and reject 7; 1/3 holds 2, 5, 8;
    // 2/3 holds reject 3 and C* lines 6, 9.
    let shards = nine_lines_in_three_shards(dir.path());
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let records = |p: &Path| -> Vec<Value> {
        read(p)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let write = |p: &Path, records: &[Value]| {
        let text: String = records.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(p, text).unwrap();
    };
    let lines = |records: &[Value]| -> Vec<u64> {
        records
            .iter()
            .map(|r| r["line"].as_u64().unwrap())
            .collect()
    };
    let cstar: Vec<Vec<Value>> = shards.iter().map(|s| records(&s.out)).collect();
    assert_eq!(
        cstar.iter().map(|c| lines(c)).collect::<Vec<_>>(),
        [vec![1, 4], vec![2, 5, 8], vec![6, 9]]
    );
    let inputs: Vec<PathBuf> = shards.iter().map(|s| s.out.clone()).collect();
    let out = dir.path().join("m.jsonl");
    // `edit` changes one shard's files, the merge is refused with `want`, then they are restored.
    let refused = |shard: usize, edit: &dyn Fn(&annotate::OutputPaths), want: &str| {
        let files = [
            &shards[shard].out,
            &shards[shard].rejects,
            &shards[shard].summary,
        ];
        let before: Vec<String> = files.iter().map(|f| read(f)).collect();
        edit(&shards[shard]);
        let err = annotate::merge(&out, &inputs).expect_err(want).to_string();
        assert!(err.contains(want), "{want}: {err}");
        assert!(!out.exists(), "written despite: {err}");
        for (f, text) in files.iter().zip(before) {
            std::fs::write(f, text).unwrap();
        }
    };
    let with_line = |r: &Value, line: u64| {
        let mut r = r.clone();
        r["line"] = json!(line);
        r
    };
    // A record past the corpus's last line, of shard 0 by its number.
    refused(
        0,
        &|s| {
            write(
                &s.out,
                &[&cstar[0][..], &[with_line(&cstar[0][1], 10)][..]].concat(),
            )
        },
        "input line 10 is beyond the corpus's 9 lines",
    );
    // Line 4 both annotated and rejected.
    refused(
        0,
        &|s| {
            let text = format!("{{\"line\":4,\"reason\":\"x\"}}\n{}", read(&s.rejects));
            std::fs::write(&s.rejects, text).unwrap();
        },
        "input line 4 is in two outputs",
    );
    // Line 4 twice in one file.
    refused(
        0,
        &|s| write(&s.out, &[&cstar[0][..], &cstar[0][1..]].concat()),
        "input line 4 out of order (shard 0/3)",
    );
    // A line lost from the middle, then from the end, of shard 2's C*: its file is named.
    let shard_2 = format!("(shard 2/3, {})", shards[2].out.display());
    refused(
        2,
        &|s| write(&s.out, &cstar[2][1..]),
        &format!("input line 6 is missing from its shard's output {shard_2}"),
    );
    refused(
        2,
        &|s| write(&s.out, &cstar[2][..1]),
        &format!("input line 9 is missing from its shard's output {shard_2}"),
    );
    // Line 5 moved from shard 1's C* into shard 0's, in order: every line once, but not where
    // its shard's run wrote it.
    let moved = [&cstar[0][..], &cstar[1][1..2]].concat();
    refused(
        1,
        &|s| {
            write(&shards[0].out, &moved);
            write(&s.out, &[&cstar[1][..1], &cstar[1][2..]].concat());
        },
        "input line 5 is not of this shard (shard 0/3)",
    );
    write(&shards[0].out, &cstar[0]);
    // A call inside a character ("é"), where C* could not have spliced it.
    let mut off = cstar[1][0].clone();
    off["text"] = json!("café au lait");
    off["annotated_text"] = off["text"].clone();
    off["calls"] = json!([{"position": 4, "tool": "Calculator", "input": "1", "result": null,
        "l_none": null, "l_call": null, "l_call_result": null, "delta": null, "kept": false}]);
    refused(
        1,
        &|s| write(&s.out, &[&[off.clone()][..], &cstar[1][1..]].concat()),
        "not a C* record: a call at byte 4 is not at a character boundary",
    );
    // Summaries that name a shard past the count, or another split or length of the corpus.
    let summary_with = |s: &annotate::OutputPaths, key: &str, value: Value| {
        let mut summary: Value = serde_json::from_str(&read(&s.summary)).unwrap();
        summary[key] = value;
        std::fs::write(&s.summary, summary.to_string()).unwrap();
    };
    refused(
        0,
        &|s| summary_with(s, "shard", json!({"index": 3, "count": 3})),
        "shard 3/3 is not a shard",
    );
    refused(
        2,
        &|s| summary_with(s, "shard", json!({"index": 2, "count": 4})),
        "is shard 2/4 of a 9-line corpus, but",
    );
    // Not the first input's: its lines add up to the first's 9, yet its run read 10.
    refused(
        2,
        &|s| summary_with(s, "corpus_lines", json!(10)),
        "is shard 2/3 of a 10-line corpus, but",
    );
    // A shard's rejects file deleted: its outputs are not a finished run's.
    refused(
        1,
        &|s| std::fs::remove_file(&s.rejects).unwrap(),
        "not found; ",
    );
    // An input that is, under another name (a link), the temporary file the merged C* is
    // first written to: refused before that file is emptied.
    #[cfg(unix)]
    {
        let tmp = dir.path().join("m.jsonl.tmp");
        std::fs::copy(&shards[0].out, &tmp).unwrap();
        let alias = annotate::OutputPaths::new(&dir.path().join("alias.jsonl"));
        std::os::unix::fs::symlink(&tmp, &alias.out).unwrap();
        std::fs::copy(&shards[0].rejects, &alias.rejects).unwrap();
        std::fs::copy(&shards[0].summary, &alias.summary).unwrap();
        let aliased = [alias.out.clone(), inputs[1].clone(), inputs[2].clone()];
        let err = annotate::merge(&out, &aliased).unwrap_err().to_string();
        assert!(err.contains("would overwrite the input"), "{err}");
        assert_eq!(read(&tmp), read(&shards[0].out));
        std::fs::remove_file(&tmp).unwrap();
    }
    // Into "m.jsonl" while a run on "m" is in progress ("m.partial"): the rejects and summary
    // names are that run's.
    let journal = dir.path().join("m.partial");
    std::fs::write(&journal, "").unwrap();
    let err = annotate::merge(&out, &inputs).unwrap_err().to_string();
    assert!(
        err.contains("its rejects and summary are the ones"),
        "{err}"
    );
    std::fs::remove_file(&journal).unwrap();
    // Merged; then merged again where the new summary cannot be written (a folder at its
    // temporary name): the earlier summary is gone, not left beside a C* it does not describe.
    annotate::merge(&out, &inputs).unwrap();
    let paths = annotate::OutputPaths::new(&out);
    std::fs::create_dir(format!("{}.tmp", paths.summary.display())).unwrap();
    annotate::merge(&out, &inputs).expect_err("no summary");
    assert!(out.exists() && !paths.summary.exists());
}

/// `toolsift merge --out OUT INPUTS..` run in `dir`.
fn merge_in(dir: &Path, out: &str, inputs: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .current_dir(dir)
        .args(["merge", "--out", out])
        .args(inputs)
        .output()
        .unwrap()
}

/// `--out -` is not standard output for annotate and merge (their rejects, summary and journal
/// go next to C*): refused as a usage error, no file named `-` written.
#[test]
fn out_dash_is_refused_not_a_file_named_dash() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 2);
    let annotate = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .current_dir(dir.path())
        .args(["annotate", "--no-progress", "--model"])
        .arg(common::tiny("f32"))
        .arg("--corpus")
        .arg(&corpus)
        .args(["--out", "-"])
        .output()
        .unwrap();
    let merge = merge_in(dir.path(), "-", &["a.jsonl"]);
    for out in [annotate, merge] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("not to standard output"), "{stderr}");
    }
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["corpus.jsonl"]);
}

/// Shards are of one run when what decides the output agrees (config, tools, corpus and model
/// content hashes, device), however the corpus and the model folder are spelled on their
/// command lines; shards that differ are refused naming the differing fields of their
/// summaries, with both values.
#[test]
fn shards_merge_however_their_corpus_and_model_paths_are_spelled() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("corpus.jsonl"), 9);
    let config = bin_config(dir.path());
    let model = common::tiny("f32");
    let annotate = |corpus: &Path, model: &Path, seed: &str, out: &str, shard: u64| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .current_dir(dir.path())
            .args(["annotate", "--no-progress", "--seed", seed, "--model"])
            .arg(model)
            .arg("--corpus")
            .arg(corpus)
            .arg("--config")
            .arg(&config)
            .args(["--out", out, "--shard", &format!("{shard}/3")])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
    };
    let merge = |out: &str, inputs: &[&str]| merge_in(dir.path(), out, inputs);
    // Relative and absolute, the folder with and without a trailing "/".
    let relative = Path::new("corpus.jsonl");
    let absolute = dir.path().join("corpus.jsonl");
    let slashed = PathBuf::from(format!("{}/", model.display()));
    annotate(relative, &model, "3", "sh/c.jsonl", 0);
    annotate(&absolute, &slashed, "3", "sh/c.jsonl", 1);
    annotate(&absolute, &model, "3", "sh/c.jsonl", 2);
    let shards = [0, 1, 2].map(|i| format!("sh/c.shard-{i:05}-of-00003.jsonl"));
    let out = merge("all.jsonl", &shards.each_ref().map(String::as_str));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A merge into "m.jsonl.tmp" is another run's output, not a temporary file of a merge into
    // "m.jsonl": that one is refused and the first left as it was.
    let out = merge("m.jsonl.tmp", &shards.each_ref().map(String::as_str));
    assert!(out.status.success());
    let before = std::fs::read(dir.path().join("m.jsonl.tmp")).unwrap();
    let out = merge("m.jsonl", &shards.each_ref().map(String::as_str));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the temporary name m.jsonl.tmp, which is another run's output")
            && stderr.contains("m.jsonl.tmp.summary.json beside it"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("m.jsonl.tmp")).unwrap(),
        before
    );
    assert!(!dir.path().join("m.jsonl").exists());
    // Still a check on content: a shard of an edited corpus (as many lines), or of another
    // seed, is refused, and the message names the field and both values, not the paths.
    let edited = dir.path().join("edited.jsonl");
    let text = std::fs::read_to_string(&absolute).unwrap();
    std::fs::write(&edited, text.replacen("doc-1", "doc-X", 1)).unwrap();
    annotate(&edited, &model, "3", "ed/c.jsonl", 2);
    annotate(&absolute, &model, "4", "seed/c.jsonl", 2);
    for (other, want) in [
        ("ed/c.shard-00002-of-00003.jsonl", "run.corpus_xxh3: \""),
        (
            "seed/c.shard-00002-of-00003.jsonl",
            ": \"seed = 3\" vs \"seed = 4\"",
        ),
    ] {
        let out = merge("bad.jsonl", &[&shards[0], &shards[1], other]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{other} merged");
        assert!(
            stderr.contains("not shards of one run") && stderr.contains(want),
            "{want}: {stderr}"
        );
        assert!(
            !stderr.contains("run.corpus:") && !stderr.contains("run.info.model:"),
            "{stderr}"
        );
        assert!(!dir.path().join("bad.jsonl").exists());
    }
}

/// The WikiSearch index's path in the config is compared by the index's content hash, as the
/// corpus's and the model's are: shards configured with `idx`, `$PWD/idx` and `idx/` merge, and
/// a journal resumes under another spelling; another setting of the table is still named.
#[test]
fn shards_merge_and_journals_resume_however_their_wikisearch_index_is_spelled() {
    use toolsift::annotate::tools::{build_index, WikiSearchConfig};
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("corpus.jsonl"), 9);
    let docs = dir.path().join("wiki.jsonl");
    std::fs::write(
        &docs,
        "{\"id\": \"a\", \"text\": \"The cat sat on the mat.\"}\n",
    )
    .unwrap();
    let index = dir.path().join("idx");
    build_index(&docs, &index, "text").unwrap();
    let base = std::fs::read_to_string(bin_config(dir.path())).unwrap();
    let config = |name: &str, index: &str, snippet: u32| {
        let path = dir.path().join(name);
        let text = format!(
            "{base}[tools.wikisearch]\nindex = {index:?}\nmax_snippet_chars = {snippet}\n\
             [per_tool.wikisearch]\nk = 1\nm = 1\n\
             prompt = \"[WikiSearch(x)] x\\nInput: {{x}}\\nOutput: \"\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let absolute = index.display().to_string();
    let annotate = |config: &Path, out: &str, shard: u64| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .current_dir(dir.path())
            .args(["annotate", "--no-progress", "--seed", "3", "--model"])
            .arg(common::tiny("f32"))
            .args(["--corpus", "corpus.jsonl", "--config"])
            .arg(config)
            .args(["--out", out, "--shard", &format!("{shard}/3")])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
    };
    let merge = |out: &str, inputs: &[&str]| merge_in(dir.path(), out, inputs);
    annotate(&config("rel.toml", "idx", 300), "sh/c.jsonl", 0);
    annotate(&config("abs.toml", &absolute, 300), "sh/c.jsonl", 1);
    annotate(&config("slash.toml", "idx/", 300), "sh/c.jsonl", 2);
    let shards = [0, 1, 2].map(|i| format!("sh/c.shard-{i:05}-of-00003.jsonl"));
    let out = merge("all.jsonl", &shards.each_ref().map(String::as_str));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("all.summary.json")).unwrap(),
    )
    .unwrap();
    assert!(
        summary["run"]["info"]["wikisearch_index_xxh3"].is_string(),
        "{summary}"
    );
    // Another setting of the same table is still a difference, named with both values.
    annotate(&config("short.toml", "idx/", 200), "short/c.jsonl", 2);
    let out = merge(
        "bad.jsonl",
        &[&shards[0], &shards[1], "short/c.shard-00002-of-00003.jsonl"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "merged");
    assert!(
        stderr.contains("not shards of one run")
            && stderr.contains(": \"max_snippet_chars = 300\" vs \"max_snippet_chars = 200\""),
        "{stderr}"
    );
    assert!(!stderr.contains("index ="), "{stderr}");
    assert!(!dir.path().join("bad.jsonl").exists());

    // A journal started with one spelling resumes with another, as the uninterrupted run.
    let wiki = |index: PathBuf| {
        let mut c = test_config();
        c.tools.wikisearch = Some(WikiSearchConfig {
            index,
            max_snippet_chars: 300,
        });
        c
    };
    let run = |config: &AnnotateConfig, out: &str, stop_after| {
        let parts = Parts::new(config);
        let a = parts.annotator(config, &[ToolKind::Calculator, ToolKind::WikiSearch]);
        let hash = parts.registry.wikisearch_index_xxh3().unwrap();
        let options = RunOptions {
            corpus: dir.path().join("corpus.jsonl"),
            out: dir.path().join(out),
            shard: Shard::default(),
            run_info: json!({"wikisearch_index_xxh3": format!("{hash:016x}")}),
            progress: false,
            stop_after,
        };
        annotate::annotate(&a, &options)
    };
    let plain = wiki(index.clone());
    let slashed = wiki(PathBuf::from(format!("{absolute}/")));
    let dotted = wiki(dir.path().join(".").join("idx"));
    assert!(matches!(
        run(&plain, "full.jsonl", None).unwrap(),
        RunOutcome::Done(..)
    ));
    assert!(matches!(
        run(&plain, "stepped.jsonl", Some(3)).unwrap(),
        RunOutcome::Stopped(3)
    ));
    assert!(matches!(
        run(&slashed, "stepped.jsonl", Some(3)).unwrap(),
        RunOutcome::Stopped(3)
    ));
    match run(&dotted, "stepped.jsonl", None) {
        Ok(RunOutcome::Done(..)) => {}
        Ok(RunOutcome::Stopped(n)) => panic!("stopped after {n}"),
        Err(e) => panic!("{e}"),
    }
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    assert_eq!(read("stepped.jsonl"), read("full.jsonl"));
}

/// The Calculator, but its first call edits the corpus the run is reading (`edit`).
struct EditsTheCorpus {
    corpus: PathBuf,
    edit: fn(&Path),
    done: std::sync::atomic::AtomicBool,
}

impl toolsift::annotate::tools::Tool for EditsTheCorpus {
    fn name(&self) -> &str {
        "Calculator"
    }

    fn call(
        &self,
        input: &str,
        doc: &toolsift::annotate::tools::DocContext<'_>,
    ) -> Result<String, toolsift::annotate::tools::ToolError> {
        if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            (self.edit)(&self.corpus);
        }
        toolsift::annotate::tools::Calculator::new().call(input, doc)
    }
}

/// `c.jsonl` in `dir`: 12 documents, then 700 rejects (no text field) that cost nothing to
/// annotate, past the reader's 1 MiB buffer, so that a run reads the tail after its first call
/// (which a test's tool can use to change it). Returns the path and the text.
fn corpus_past_the_read_buffer(dir: &Path) -> (PathBuf, String) {
    let corpus = dir.join("c.jsonl");
    write_corpus(&corpus, 12);
    let mut text = std::fs::read_to_string(&corpus).unwrap();
    for i in 0..700 {
        text.push_str(&json!({"id": i, "body": "x".repeat(2200)}).to_string());
        text.push('\n');
    }
    std::fs::write(&corpus, &text).unwrap();
    (corpus, text)
}

/// A corpus changed during the run stops it before the final files, and the advice given is
/// the one that works: lines only appended, the journal resumes once they are removed; a line
/// the run annotated edited in place, neither text resumes it, and deleting it does.
#[test]
fn a_corpus_changed_during_the_run_gets_advice_that_works() {
    use toolsift::annotate::tools::Calculator;
    let config = test_config();
    let mut parts = Parts::new(&config);
    let dir = tempfile::tempdir().unwrap();
    let (corpus, text) = corpus_past_the_read_buffer(dir.path());
    let total = text.lines().count();
    let opts = RunOptions::new(&corpus, dir.path().join("out.jsonl"));
    let append: fn(&Path) = |p| {
        let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
        std::io::Write::write_all(&mut f, b"{\"id\": \"late\", \"text\": \"1 2 3\"}\n").unwrap();
    };
    let edit_last_line: fn(&Path) = |p| {
        let mut bytes = std::fs::read(p).unwrap();
        let at = bytes.len() - 10;
        assert_eq!(bytes[at], b'x');
        bytes[at] = b'y';
        std::fs::write(p, bytes).unwrap();
    };
    let truncate: fn(&Path) = |p| {
        let text = std::fs::read_to_string(p).unwrap();
        let without_last = text.trim_end().rsplit_once('\n').unwrap().0;
        std::fs::write(p, format!("{without_last}\n")).unwrap();
    };
    for (edit, advice) in [
        (append, format!("lines were added after line {total}")),
        (edit_last_line, format!("a line among 1-{total} changed")),
        (
            truncate,
            "restore the corpus and rerun to finish".to_string(),
        ),
    ] {
        parts.registry.register(EditsTheCorpus {
            corpus: corpus.clone(),
            edit,
            done: false.into(),
        });
        let a = parts.annotator(&config, &[ToolKind::Calculator]);
        let err = annotate::annotate(&a, &opts)
            .expect_err("the corpus changed")
            .to_string();
        assert!(err.contains("the corpus changed during the run"), "{err}");
        assert!(err.contains(&advice), "{err}");
        assert!(!opts.out.exists() && dir.path().join("out.jsonl.partial").exists());
        drop(a);
        std::fs::write(&corpus, &text).unwrap();
        parts.registry.register(Calculator::new());
        let a = parts.annotator(&config, &[ToolKind::Calculator]);
        match annotate::annotate(&a, &opts) {
            Ok(RunOutcome::Done(summary, _)) => {
                assert!(!advice.starts_with("a line among"), "{err}");
                assert_eq!(summary.lines, total as u64);
                // Resumed: nothing redone but the line the truncation took away.
                assert!(summary.lines_resumed + 1 >= total as u64, "{summary:?}");
            }
            Err(resumed) => {
                assert!(advice.starts_with("a line among"), "{resumed}");
                assert!(
                    resumed.to_string().contains("delete the journal"),
                    "{resumed}"
                );
                std::fs::remove_file(dir.path().join("out.jsonl.partial")).unwrap();
                assert!(matches!(
                    annotate::annotate(&a, &opts),
                    Ok(RunOutcome::Done(..))
                ));
            }
            Ok(other) => panic!("{other:?}"),
        }
        for name in ["out.jsonl", "out.rejects.jsonl", "out.summary.json"] {
            std::fs::remove_file(dir.path().join(name)).unwrap();
        }
    }
}

// Review of the driver

/// A sharded run resumed says how many of its own lines it resumed after (not the number of
/// the last corpus line its journal holds).
#[test]
fn a_sharded_resume_counts_its_own_lines_resumed() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 23);
    let opts = |stop_after| RunOptions {
        shard: Shard::new(1, 3).unwrap(),
        stop_after,
        ..whole_run(&corpus, dir.path().join("sh.jsonl"))
    };
    // Shard 1/3 owns lines 2, 5, ..., 23: two stops of 2 leave lines 2-11 done.
    for _ in 0..2 {
        let outcome = annotate::annotate(&a, &opts(Some(2))).unwrap();
        assert!(matches!(outcome, RunOutcome::Stopped(2)), "{outcome:?}");
    }
    let RunOutcome::Done(summary, _) = annotate::annotate(&a, &opts(None)).unwrap() else {
        panic!("not done")
    };
    assert_eq!((summary.lines, summary.lines_resumed), (8, 4));
}

/// A document the annotator refuses as input (here the sampler says so) is that line's
/// reject, with the reason, and the run goes on to finish; it does not stop the run.
#[test]
fn an_input_error_annotating_a_document_is_its_reject() {
    struct Refuses;
    impl Sampler for Refuses {
        fn token_log_probs(&self, _: &[u32], _: &[u32]) -> toolsift::Result<Vec<Vec<f32>>> {
            Err(toolsift::Error::input("a sequence the sampler cannot take"))
        }
        fn sample(
            &self,
            _: &[SampleRequest],
            _: &SampleOptions,
        ) -> toolsift::Result<Vec<Vec<Sample>>> {
            Err(toolsift::Error::input("a sequence the sampler cannot take"))
        }
    }
    let mut config = test_config();
    config.per_tool.calculator.min_numbers = 0; // every document reaches the sampler
    let parts = Parts::new(&config);
    let a = parts.annotator_sampling(&Refuses, &config, &[ToolKind::Calculator]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    std::fs::write(
        &corpus,
        "{\"text\": \"Out of 1400 people, 400 said yes.\"}\n{\"text\": \"3 cats\"}\n",
    )
    .unwrap();
    let RunOutcome::Done(summary, paths) =
        annotate::annotate(&a, &whole_run(&corpus, dir.path().join("o.jsonl"))).unwrap()
    else {
        panic!("not done")
    };
    assert_eq!((summary.lines, summary.rejected), (2, 2));
    let rejects = std::fs::read_to_string(&paths.rejects).unwrap();
    assert_eq!(rejects.lines().count(), 2, "{rejects}");
    assert!(
        rejects.contains("\"line\":2,")
            && rejects.contains("annotation failed: a sequence the sampler cannot take"),
        "{rejects}"
    );
}

/// A shard whose corpus changed during its run (a line of another shard edited) is told to
/// restore the corpus and rerun, which finishes it: not that its journal cannot be resumed.
#[test]
fn a_shard_whose_corpus_changed_is_told_to_restore_it_and_rerun() {
    let config = test_config();
    let mut parts = Parts::new(&config);
    let dir = tempfile::tempdir().unwrap();
    let (corpus, text) = corpus_past_the_read_buffer(dir.path());
    let total = text.lines().count() as u64;
    assert_eq!(total % 2, 0, "the last line is shard 1/2's");
    let opts = RunOptions {
        shard: Shard::new(0, 2).unwrap(),
        ..RunOptions::new(&corpus, dir.path().join("out.jsonl"))
    };
    parts.registry.register(EditsTheCorpus {
        corpus: corpus.clone(),
        edit: |p| {
            let mut bytes = std::fs::read(p).unwrap();
            let at = bytes.len() - 10;
            bytes[at] = b'y';
            std::fs::write(p, bytes).unwrap();
        },
        done: false.into(),
    });
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let err = annotate::annotate(&a, &opts)
        .expect_err("the corpus changed")
        .to_string();
    assert!(
        err.contains("the corpus changed during the run")
            && err.contains("restore the corpus and rerun to finish"),
        "{err}"
    );
    drop(a);
    std::fs::write(&corpus, &text).unwrap();
    parts
        .registry
        .register(toolsift::annotate::tools::Calculator::new());
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let RunOutcome::Done(summary, _) = annotate::annotate(&a, &opts).unwrap() else {
        panic!("not done")
    };
    assert_eq!(summary.lines, total / 2);
}

/// `toolsift annotate` refuses an --out that is a folder, and a tool that cannot run, before
/// it loads the model (minutes for a 6B checkpoint): here there is no model to load at all.
#[test]
fn the_output_and_the_tools_are_checked_before_the_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 2);
    let config = dir.path().join("custom.toml");
    std::fs::write(
        &config,
        "[per_tool.custom.Echo]\nprompt = \"[Echo(a)] a\\nInput: {x}\\nOutput: \"\n\
         [tools.custom.Echo]\ncommand = [\"/nonexistent/toolsift-no-such-program\"]\n",
    )
    .unwrap();
    let run = |out: &Path, tools: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["annotate", "--no-progress", "--tools", tools, "--model"])
            .arg(dir.path().join("no-model"))
            .arg("--corpus")
            .arg(&corpus)
            .arg("--out")
            .arg(out)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = run(dir.path(), "calculator");
    assert!(err.contains("give a file name for C*"), "{err}");
    let err = run(&dir.path().join("o.jsonl"), "Echo");
    assert!(
        err.contains("toolsift-no-such-program") && err.contains("cannot run"),
        "{err}"
    );
}

/// An output whose temporary name is another run's output is refused up front: no line is
/// annotated and no journal is left (not refused only when the final files are written).
#[test]
fn a_temporary_name_clash_is_refused_before_any_line_is_annotated() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    write_corpus(&corpus, 3);
    annotate::annotate(&a, &whole_run(&corpus, dir.path().join("c.jsonl.tmp"))).unwrap();
    let out = annotate::OutputPaths::new(&dir.path().join("c.jsonl"));
    let err = annotate::annotate(&a, &whole_run(&corpus, out.out.clone()))
        .expect_err("a run over another run's output")
        .to_string();
    assert!(err.contains("which is another run's output"), "{err}");
    for p in [&out.journal, &out.out, &out.rejects, &out.summary] {
        assert!(!p.exists(), "{} written", p.display());
    }
}

// Review of the per-document flow

/// The tokens of `prompt` around its "{x}", as the annotator counts them.
fn prompt_tokens(tok: &Tokenizer, prompt: &str) -> usize {
    let (before, after) = prompt.split_once("{x}").unwrap();
    tok.encode_ids(before).unwrap().len() + tok.encode_ids(after).unwrap().len()
}

/// A prompt and max_call_tokens that leave room for exactly 2 text tokens are accepted, and a
/// text is tried on its first 2; one call token more leaves no room: an error.
#[test]
fn a_prompt_that_leaves_room_for_exactly_two_text_tokens_is_accepted() {
    let mut config = test_config();
    config.per_tool.calculator.min_numbers = 0;
    let parts = Parts::new(&config);
    let tok = parts.model.tokenizer().unwrap();
    let n = parts.model.config().n_positions;
    let fixed = prompt_tokens(tok, &config.per_tool.calculator.prompt);
    config.max_call_tokens = n - fixed - 4;
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let (_, s) = a.annotate_document(&doc(1, "1 2 3 4 5 6")).unwrap();
    let st = s.tools["calculator"];
    assert_eq!(
        (st.texts_considered, st.texts_truncated, st.texts_too_long),
        (1, 1, 0)
    );
    assert_eq!(st.positions, 1, "x_1 x_2 has one position");
    config.max_call_tokens += 1;
    let e = parts
        .try_annotator(&config, &[ToolKind::Calculator])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("leave no room"), "{e}");
}

/// A long text is cut to as many tokens as the sampling prefix holds: P(x) ++ x twice plus a
/// call of max_call_tokens fits n_positions, and one text token more would not.
#[test]
fn the_sampling_prefix_holds_as_much_text_as_fits_and_no_more() {
    let config = test_config();
    let parts = Parts::new(&config);
    // No position is likely: the sampler only reads the sequence it is asked to score.
    let sampler = Peaked {
        x_len: 0,
        peak: 1,
        decoy: 1,
        call: Vec::new(),
        seen: Default::default(),
    };
    let a = parts.annotator_sampling(&sampler, &config, &[ToolKind::Calculator]);
    let (_, s) = a.annotate_document(&doc(1, &"1 2 3 ".repeat(200))).unwrap();
    assert_eq!(s.tools["calculator"].texts_truncated, 1);
    let (ids, _) = sampler.seen.into_inner().unwrap();
    let n = parts.model.config().n_positions;
    let used = ids.len() + config.max_call_tokens;
    assert!(used <= n && used + 2 > n, "{used} of {n}");
}

/// A tool's calls on a long text are the same whichever other tools run (the head tokenized is
/// the longest any tool reads, docs/annotate.md step 3), and they are scored on the whole loss
/// window past the tool's searched head: the last call's losses are those of the whole text.
#[test]
fn a_tools_calls_do_not_depend_on_the_other_tools_and_read_past_its_head() {
    let mut config = test_config();
    // A loss window of 100 tokens, and a text of long tokens (13 bytes each), so that the
    // tokenized head is not much longer than asked for.
    config.weights = vec![0.1; 100];
    let calc = &mut config.per_tool.calculator;
    (calc.tau_s, calc.k, calc.m, calc.min_numbers) = (0.0, 200, 1, 0);
    let parts = Parts::new(&config);
    let tok = parts.model.tokenizer().unwrap();
    let n = parts.model.config().n_positions;
    // Calendar's prompt leaves it a head of a few tokens only.
    let tail = "[Calendar()] 1\nInput: {x}\nOutput: ";
    let mut pad = String::new();
    while prompt_tokens(tok, &format!("{pad}{tail}")) + config.max_call_tokens + 14 < n {
        pad.push_str("day. ");
    }
    config.per_tool.calendar.prompt = format!("{pad}{tail}");
    let sampler = one_call(tok.encode_ids("Calculator(12 * 3)]").unwrap());
    let run = |tools: &[ToolKind], text: &str| {
        let a = parts.annotator_sampling(&sampler, &config, tools);
        a.annotate_document(&doc(1, text)).unwrap()
    };
    let text = "participants ".repeat(400);
    let (alone, alone_stats) = run(&[ToolKind::Calculator], &text);
    let (both, both_stats) = run(&[ToolKind::Calculator, ToolKind::Calendar], &text);
    let st = alone_stats.tools["calculator"];
    assert_eq!(both_stats.tools["calculator"], st);
    assert_eq!(st.texts_truncated, 1);
    assert!(st.calls_scored > 100, "{st:?}");
    assert_eq!(
        both.calls, alone.calls,
        "calendar samples no call of its own"
    );

    let last = alone.calls.last().unwrap();
    let candidate = toolsift::score::TextCandidate {
        text: text.as_str().into(),
        position: last.position,
        tool: last.tool.clone(),
        input: last.input.clone(),
        result: last.result.clone().unwrap(),
        weights: None,
    };
    let options = toolsift::score::ScoreOptions {
        placement: config.placement,
        weights: toolsift::score::LossWeights::new(config.weights.clone()).unwrap(),
    };
    let whole =
        toolsift::score::score_texts(&parts.scorer, tok, &[candidate], &options, config.call_form)
            .unwrap()[0];
    for (got, want) in [
        (last.l_none, whole.l_none),
        (last.l_call, whole.l_call),
        (last.l_call_result, whole.l_call_result),
    ] {
        assert!((got.unwrap() - want).abs() < 1e-6, "{last:?} {whole:?}");
    }
}

/// A tool given twice runs once.
#[test]
fn a_tool_given_twice_runs_once() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator, ToolKind::Calculator]);
    assert_eq!(a.tools(), [ToolName::from(ToolKind::Calculator)]);
    let d = doc(5, "Out of 1400 people, 400 (or 29%) said yes.");
    let once = parts.annotator(&config, &[ToolKind::Calculator]);
    let ((twice, twice_stats), (one, one_stats)) = (
        a.annotate_document(&d).unwrap(),
        once.annotate_document(&d).unwrap(),
    );
    assert_eq!(twice, one);
    assert_eq!(twice_stats.tools, one_stats.tools);
}

/// A one-token text that a tool's heuristics rule out is counted as ruled out (the heuristics
/// come first), not left out of the counters.
#[test]
fn a_one_token_text_the_heuristics_rule_out_is_counted_skipped() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let (_, s) = a.annotate_document(&doc(1, "x")).unwrap();
    assert_eq!(s.tools["calculator"].texts_skipped_heuristic, 1);
}

/// Each tool's calls are kept by its own tau_f, and only kept calls count as kept; C* lists the
/// calls at one position tool by tool, each's in sampling order.
#[test]
fn each_tools_calls_are_filtered_by_its_own_threshold() {
    let mut config = test_config();
    config.per_tool.calculator.tau_f = 1e9;
    config.per_tool.calendar.tau_f = -1e9;
    let parts = Parts::new(&config);
    let tok = parts.model.tokenizer().unwrap();
    let sampler = Cycling(
        ["Calculator(12 * 3)]", "Calendar()]", "Calculator(1 + 2)]"]
            .iter()
            .map(|c| tok.encode_ids(c).unwrap())
            .collect(),
    );
    let a = parts.annotator_sampling(
        &sampler,
        &config,
        &[ToolKind::Calculator, ToolKind::Calendar],
    );
    let text = "Out of 1400 people, 400 (or 29%) said yes.";
    let (r, s) = a.annotate_document(&doc(1, text)).unwrap();
    let (calc, cal) = (s.tools["calculator"], s.tools["calendar"]);
    assert_eq!((calc.calls_scored, calc.calls_kept), (4, 0), "{calc:?}");
    assert_eq!((cal.calls_scored, cal.calls_kept), (2, 2), "{cal:?}");
    for c in &r.calls {
        assert_eq!(c.kept, c.tool == "Calendar", "{c:?}");
    }
    assert!(!r.annotated_text.contains("[Calculator("));
    // C* order: by position, then tool, then sampling order.
    assert_eq!(r.calls.len(), 6);
    for at in r.calls.chunks(3) {
        let calls: Vec<_> = at
            .iter()
            .map(|c| (c.tool.as_str(), c.input.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                ("Calculator", "12 * 3"),
                ("Calculator", "1 + 2"),
                ("Calendar", "")
            ]
        );
        assert!(at.iter().all(|c| c.position == at[0].position));
    }
}

/// A call the scorer itself refuses (beyond `validate`) is unscorable, with the scorer's reason
/// and not the index of a batch the record does not show; the other calls are scored.
#[test]
fn a_call_the_scorer_refuses_is_unscorable_with_its_reason() {
    let mut config = test_config();
    config.per_tool.calculator.m = 5;
    let parts = Parts::new(&config);
    // Its first call refuses a candidate.
    let refused = std::sync::atomic::AtomicBool::new(false);
    let refusing = Around(&parts.scorer, |scorer: &CpuScorer, c: &[_], o: &_| {
        if !refused.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(toolsift::Error::candidate(1, "too odd for this scorer"));
        }
        scorer.variant_losses_unchecked(c, o)
    });
    let a = parts.annotator_scoring(&refusing, &config, &[ToolKind::Calculator]);
    let d = doc(5, "Out of 1400 people, 400 (or 29%) said yes.");
    let (r, s) = a.annotate_document(&d).unwrap();
    let (_, want) = parts
        .annotator(&config, &[ToolKind::Calculator])
        .annotate_document(&d)
        .unwrap();
    let (st, want) = (s.tools["calculator"], want.tools["calculator"]);
    assert_eq!(st.calls_scored, want.calls_scored - 1);
    assert_eq!(st.calls_unscorable, want.calls_unscorable + 1);
    assert_eq!(s.candidates, want.calls_scored - 1);
    let refused: Vec<_> = r
        .calls
        .iter()
        .filter(|c| c.error.as_deref().is_some_and(|e| e.contains("too odd")))
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", r.calls);
    let why = refused[0].error.as_deref().unwrap();
    assert_eq!(why, "cannot be scored: too odd for this scorer");
    assert!(!refused[0].kept && refused[0].delta.is_none());
}

/// A tokenizer with "[" but no " [" token samples calls with "[" alone (docs/annotate.md, step
/// 4: a tokenizer with only one of them uses that one).
#[test]
fn a_tokenizer_with_only_one_opener_annotates_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = common::fixture_dir("tiny-gptj").join("tokenizer.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    let model = json["model"].as_object_mut().unwrap();
    assert!(model["vocab"]
        .as_object_mut()
        .unwrap()
        .remove("Ġ[")
        .is_some());
    let merges = model["merges"].as_array_mut().unwrap();
    merges.retain(|m| m != &json!(["Ġ", "["]));
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let tok = Tokenizer::from_file(&path).unwrap();
    assert_eq!(tok.encode_ids(" [").unwrap().len(), 2);

    let config = test_config();
    let parts = Parts::new(&config);
    let sampler = one_call(tok.encode_ids("Calculator(12 * 3)]").unwrap());
    let a = Annotator::new(
        &tok,
        &sampler,
        &parts.scorer,
        &parts.registry,
        &config,
        &[ToolKind::Calculator],
    )
    .unwrap();
    let (r, s) = a
        .annotate_document(&doc(1, "Out of 1400 people, 400 (or 29%) said yes."))
        .unwrap();
    assert_eq!(s.tools["calculator"].positions, 2);
    assert!(r.calls.iter().all(|c| c.delta.is_some()), "{:?}", r.calls);
}

/// A sampler that records the draw options of every `sample` call and writes no call: every
/// position as likely as in `Cycling`.
struct RecordingOptions(std::sync::Mutex<Vec<SampleOptions>>);

impl Sampler for RecordingOptions {
    fn token_log_probs(&self, ids: &[u32], t: &[u32]) -> toolsift::Result<Vec<Vec<f32>>> {
        Ok(ids.iter().map(|_| vec![-0.5; t.len()]).collect())
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        options: &SampleOptions,
    ) -> toolsift::Result<Vec<Vec<Sample>>> {
        self.0.lock().unwrap().push(options.clone());
        let nothing = Sample {
            tokens: Vec::new(),
            stopped: false,
        };
        Ok(requests
            .iter()
            .map(|r| vec![nothing.clone(); r.n_samples])
            .collect())
    }
}

/// The run's draw settings reach the sampler as they are: the temperature, top_k_tokens (1 is
/// greedy among one token, 0 the whole vocabulary), max_call_tokens as the longest sample, and
/// the document's own seed for the tool.
#[test]
fn the_draw_settings_reach_the_sampler() {
    let mut config = test_config();
    (config.temperature, config.top_k_tokens, config.seed) = (0.5, 1, 11);
    let parts = Parts::new(&config);
    let text = "Out of 1400 people, 400 (or 29%) said yes.";
    let options = |config: &AnnotateConfig| {
        let sampler = RecordingOptions(Default::default());
        let a = parts.annotator_sampling(&sampler, config, &[ToolKind::Calculator]);
        a.annotate_document(&doc(3, text)).unwrap();
        let mut seen = sampler.0.into_inner().unwrap();
        assert_eq!(seen.len(), 1);
        seen.pop().unwrap()
    };
    let o = options(&config);
    assert_eq!(
        (o.temperature, o.top_k, o.max_new_tokens),
        (0.5, Some(1), 8)
    );
    let tool = ToolName::from(ToolKind::Calculator);
    assert_eq!(o.seed, Annotator::doc_seed(11, 3, &tool));
    config.top_k_tokens = 0;
    assert_eq!(options(&config).top_k, None);
}

/// `require_arithmetic` reads the searched head to its last token: arithmetic completed by the
/// last text token of the sampling prefix lets the text through, one token later it does not.
#[test]
fn require_arithmetic_reads_the_searched_heads_last_token() {
    let mut config = test_config();
    config.per_tool.calculator.require_arithmetic = true;
    let parts = Parts::new(&config);
    let tok = parts.model.tokenizer().unwrap();
    let n = parts.model.config().n_positions;
    let fixed = prompt_tokens(tok, &config.per_tool.calculator.prompt);
    let searched = (n - fixed - config.max_call_tokens) / 2;
    let sums = "He had 12 apples and bought 30 more, 42";
    let mut pad = String::new();
    while tok.encode_ids(&format!("{pad}{sums}")).unwrap().len() < searched {
        pad.push_str("the ");
    }
    assert_eq!(
        tok.encode_ids(&format!("{pad}{sums}")).unwrap().len(),
        searched
    );
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    // Line 1's 1% draw does not pass: only the arithmetic decides.
    let considered = |pad: &str| {
        let text = format!("{pad}{sums} in all.{}", " and so on".repeat(100));
        let (_, s) = a.annotate_document(&doc(1, &text)).unwrap();
        let st = s.tools["calculator"];
        assert_eq!(
            st.texts_considered + st.texts_skipped_heuristic,
            1,
            "{st:?}"
        );
        st.texts_considered == 1
    };
    assert!(considered(&pad));
    assert!(!considered(&format!("the {pad}")));
}

/// A prompt refused for leaving no room for a text is told with its tokens on both sides of
/// "{x}" and max_call_tokens.
#[test]
fn a_prompt_with_no_room_is_told_with_its_token_count() {
    let mut config = test_config();
    let prompt = format!("{} {{x}} {}", "word ".repeat(100), "more ".repeat(100));
    config.per_tool.calendar.prompt = prompt.clone();
    let parts = Parts::new(&config);
    let tokens = prompt_tokens(parts.model.tokenizer().unwrap(), &prompt);
    let err = parts
        .try_annotator(&config, &[ToolKind::Calendar])
        .err()
        .expect("no room for a text")
        .to_string();
    assert!(
        err.contains(&format!("its {tokens} tokens and max_call_tokens (8)")),
        "{err}"
    );
}

/// With m = 0 the positions are still chosen and counted, and no call is sampled.
#[test]
fn m_zero_counts_positions_and_samples_no_call() {
    let mut config = test_config();
    config.per_tool.calculator.m = 0;
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let (r, s) = a
        .annotate_document(&doc(1, "Out of 1400 people, 400 (or 29%) said yes."))
        .unwrap();
    let st = s.tools["calculator"];
    assert_eq!((st.positions, st.calls_sampled), (2, 0), "{st:?}");
    assert!(r.calls.is_empty());
}

/// A call whose delta is exactly its tool's tau_f passes the filter (delta >= tau_f).
#[test]
fn a_call_whose_delta_is_tau_f_is_kept() {
    let mut config = test_config();
    let parts = Parts::new(&config);
    let d = doc(5, "Out of 1400 people, 400 (or 29%) said yes.");
    let run = |config: &AnnotateConfig| {
        let a = parts.annotator(config, &[ToolKind::Calculator]);
        a.annotate_document(&d).unwrap().0
    };
    let first = run(&config).calls.into_iter().find(|c| c.delta.is_some());
    let first = first.expect("a scored call");
    config.per_tool.calculator.tau_f = first.delta.unwrap();
    let again = run(&config);
    let same = again
        .calls
        .iter()
        .find(|c| (c.position, &c.input, c.delta) == (first.position, &first.input, first.delta));
    assert!(
        same.is_some_and(|c| c.kept),
        "{first:?} in {:?}",
        again.calls
    );
}

/// A tokenizer with "[" but no " [" opens every call with "[", at a position whose token starts
/// with a space too (where " [" would go).
#[test]
fn a_tokenizer_without_a_spaced_opener_opens_spaced_positions_with_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = common::fixture_dir("tiny-gptj").join("tokenizer.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    let model = json["model"].as_object_mut().unwrap();
    model["vocab"].as_object_mut().unwrap().remove("Ġ[");
    let merges = model["merges"].as_array_mut().unwrap();
    merges.retain(|m| m != &json!(["Ġ", "["]));
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let tok = Tokenizer::from_file(&path).unwrap();

    let mut config = test_config();
    config.per_tool.calculator.k = 1;
    let parts = Parts::new(&config);
    let text = "Out of 1400 people, 400 (or 29%) said yes.";
    let x = tok.encode_ids(text).unwrap();
    // x_2 is " 1400": a spaced position.
    let sampler = Peaked {
        x_len: x.len(),
        peak: 2,
        decoy: 2,
        call: tok.encode_ids("Calculator(12 * 3)]").unwrap(),
        seen: Default::default(),
    };
    let a = Annotator::new(
        &tok,
        &sampler,
        &parts.scorer,
        &parts.registry,
        &config,
        &[ToolKind::Calculator],
    )
    .unwrap();
    let (r, _) = a.annotate_document(&doc(1, text)).unwrap();
    assert!(text[r.calls[0].position..].starts_with(' '), "{r:?}");
    let (_, prefixes) = sampler.seen.into_inner().unwrap();
    let open = tok.encode_ids("[").unwrap();
    assert_eq!(prefixes.len(), 1);
    assert_eq!(prefixes[0].last(), open.last(), "{prefixes:?}");
}

/// The MT post-filter reads the whole text, as C* holds it: an input the text says only past
/// the head the tools read is still said only ahead of the call.
#[test]
fn lookahead_inputs_are_looked_for_in_the_whole_text() {
    let model = model();
    let tok = model.tokenizer().unwrap();
    let sampler = one_call(tok.encode_ids("MT(the coffee is hot)]").unwrap());
    let scorer = CpuScorer::new(&model);
    let text = format!(
        "Le café est chaud.{} And the coffee is hot.",
        " Oui.".repeat(400)
    );
    let mut config = test_config();
    config.per_tool.mt.drop_lookahead_inputs = true;
    config.tools.mt = Some(toolsift::annotate::tools::ExternalToolConfig {
        command: Some(vec!["cat".into()]),
        ..Default::default()
    });
    let registry = ToolRegistry::from_config(&config.tools).unwrap();
    let a = Annotator::new(tok, &sampler, &scorer, &registry, &config, &[ToolKind::Mt]).unwrap();
    let (r, s) = a.annotate_document(&doc(1, &text)).unwrap();
    let st = s.tools["mt"];
    assert_eq!(st.texts_truncated, 1, "{st:?}");
    assert!(st.positions > 0, "{st:?}");
    assert_eq!(
        (st.calls_lookahead, st.calls_executed),
        (st.positions, 0),
        "{st:?}"
    );
    assert!(r.calls.is_empty());
}

// Second review of the driver

/// A run's summary records the settings a resume and a merge compare, as docs/annotate.md lists
/// them: the tools by key, the corpus's path, line count and hash, the run's info; not its shard
/// (the summary has its own field for that).
#[test]
fn a_runs_summary_records_its_tools_and_its_corpus_path_lines_and_hash() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator, ToolKind::Calendar]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 13);
    let options = RunOptions {
        run_info: json!({"model": "m"}),
        ..whole_run(&corpus, dir.path().join("o.jsonl"))
    };
    let RunOutcome::Done(summary, _) = annotate::annotate(&a, &options).unwrap() else {
        panic!("not done")
    };
    let run = summary.run.expect("the run's settings");
    assert_eq!(run["tools"], json!(["calculator", "calendar"]), "{run}");
    assert_eq!(run["corpus"], json!(corpus.display().to_string()), "{run}");
    assert_eq!(run["corpus_lines"], json!(13), "{run}");
    assert_eq!(run["corpus_xxh3"].as_str().map(str::len), Some(16), "{run}");
    assert_eq!(run["info"], json!({"model": "m"}), "{run}");
    assert!(run.get("shard").is_none(), "{run}");
}

/// A finished run's outputs are named in the refusal as they are: the C* first, then all three
/// in the advice to delete them ("a, b and c").
#[test]
fn a_finished_outputs_refusal_names_its_cstar_first_and_all_three_to_delete() {
    let config = test_config();
    let parts = Parts::new(&config);
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 4);
    let run = whole_run(&corpus, dir.path().join("o.jsonl"));
    annotate::annotate(&a, &run).unwrap();
    let err = annotate::annotate(&a, &run).unwrap_err().to_string();
    let p = annotate::OutputPaths::new(&run.out);
    let (out, rejects, summary) = (
        p.out.display().to_string(),
        p.rejects.display().to_string(),
        p.summary.display().to_string(),
    );
    assert!(
        err.starts_with(&format!("{out} exists and no run is in progress")),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "delete {out}, {rejects} and {summary} to annotate"
        )),
        "{err}"
    );
}

/// The corpus-changed refusal gives the line counts the right way round: as the run started,
/// then as it read the corpus at its end (one line appended meanwhile).
#[test]
fn a_corpus_changed_refusal_gives_the_line_counts_then_and_now() {
    let config = test_config();
    let mut parts = Parts::new(&config);
    let dir = tempfile::tempdir().unwrap();
    let (corpus, text) = corpus_past_the_read_buffer(dir.path());
    let total = text.lines().count();
    parts.registry.register(EditsTheCorpus {
        corpus: corpus.clone(),
        edit: |p| {
            let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
            std::io::Write::write_all(&mut f, b"{\"text\": \"1 2 3\"}\n").unwrap();
        },
        done: false.into(),
    });
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let err = annotate::annotate(&a, &whole_run(&corpus, dir.path().join("o.jsonl")))
        .expect_err("the corpus changed")
        .to_string();
    assert!(
        err.contains(&format!("({total} lines, XXH3 "))
            && err.contains(&format!(" when it started; {} lines, ", total + 1)),
        "{err}"
    );
}

/// A run on this output's temporary name that starts while this run annotates (its journal
/// appears beside "o.jsonl.tmp") stops this run before its final files: they would be
/// written over that run's output.
#[test]
fn a_run_on_the_temporary_name_started_meanwhile_stops_the_final_write() {
    let config = test_config();
    let mut parts = Parts::new(&config);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 12);
    // The tool's first call starts "the other run": its journal, at o.jsonl.tmp.partial.
    parts.registry.register(EditsTheCorpus {
        corpus: dir.path().join("o.jsonl.tmp.partial"),
        edit: |p| std::fs::write(p, "").unwrap(),
        done: false.into(),
    });
    let a = parts.annotator(&config, &[ToolKind::Calculator]);
    let paths = annotate::OutputPaths::new(&dir.path().join("o.jsonl"));
    let err = annotate::annotate(&a, &whole_run(&corpus, paths.out.clone()))
        .expect_err("a run started on the temporary name")
        .to_string();
    assert!(err.contains("which is another run's output"), "{err}");
    for p in [&paths.out, &paths.rejects, &paths.summary] {
        assert!(!p.exists(), "{} written", p.display());
    }
    assert!(paths.journal.exists(), "the journal is kept for a rerun");
}

/// `run_job`, the library's whole run, refuses an output that is a folder before it opens the
/// tools (here a WikiSearch index that is not there): the error is about --out, not the index.
#[test]
fn run_job_refuses_a_folder_out_before_it_opens_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 2);
    let settings = dir.path().join("wiki.toml");
    std::fs::write(
        &settings,
        "[tools.wikisearch]\nindex = \"/nonexistent/toolsift-index\"\n",
    )
    .unwrap();
    let job = annotate::Job {
        model_dir: common::tiny("f32"),
        corpus,
        out: dir.path().to_owned(),
        config: AnnotateConfig::from_file(&settings).unwrap(),
        tools: None,
        device: toolsift::Device::Cpu,
        shard: Shard::default(),
        progress: false,
    };
    let err = annotate::run_job(&job).unwrap_err().to_string();
    assert!(err.contains("give a file name for C*"), "{err}");
}

/// `run_job_on` (eval-demo's run) records the model's folder and the device among the run's
/// settings; a job with no tool is refused saying why: it names none, or its config disables
/// every built-in and has no tool of its own.
#[test]
fn run_job_on_records_model_and_device_and_says_why_there_is_no_tool() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    write_corpus(&corpus, 4);
    let model = model();
    let engine = toolsift::engine_for(&model, toolsift::Device::Cpu).unwrap();
    let job = annotate::Job {
        model_dir: common::tiny("f32"),
        corpus,
        out: dir.path().join("o.jsonl"),
        config: AnnotateConfig::from_file(&bin_config(dir.path())).unwrap(),
        tools: None,
        device: toolsift::Device::Cpu,
        shard: Shard::default(),
        progress: false,
    };
    let RunOutcome::Done(summary, _) = annotate::run_job_on(&job, &model, engine.as_ref()).unwrap()
    else {
        panic!("not done")
    };
    let info = &summary.run.as_ref().expect("the run's settings")["info"];
    let folder = job.model_dir.display().to_string();
    assert_eq!(info["model"], json!(folder), "{info}");
    assert_eq!(info["device"], json!("Cpu"), "{info}");

    let named_none = annotate::Job {
        tools: Some(vec![]),
        out: dir.path().join("n.jsonl"),
        ..job.clone()
    };
    let err = annotate::run_job_on(&named_none, &model, engine.as_ref())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no tool to run: the job names none"), "{err}");
    let off = dir.path().join("off.toml");
    std::fs::write(
        &off,
        "[tools.calculator]\nenabled = false\n[tools.calendar]\nenabled = false\n",
    )
    .unwrap();
    let all_off = annotate::Job {
        config: AnnotateConfig::from_file(&off).unwrap(),
        out: dir.path().join("d.jsonl"),
        ..job.clone()
    };
    let err = annotate::run_job_on(&all_off, &model, engine.as_ref())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no tool to run: the config disables every built-in tool"),
        "{err}"
    );
}
