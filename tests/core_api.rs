//! The scoring core as an embedder holds it, without the driver (`default-features = false`):
//! its types in the embedder's own structs, and what it needs to write C* as it scored.

use std::path::PathBuf;
use std::sync::Arc;

use toolsift::model::Tokenizer;
use toolsift::score::{splice, ReferenceScorer};
use toolsift::{cpu::CpuScorer, CallForm, Model, Placement, TextCandidate};
use toolsift::{engine_with_memory_budget, scorer_for, scorer_with_memory_budget, Device, Error};
use toolsift::{InvalidCandidate, ScoreOptions, Scorer, TokenCandidate};

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gptj")
}

/// The text inline placement scores for the call with its result: e(c, r) just before x_i.
fn inline_with_result(tok: &Tokenizer, t: &TokenCandidate) -> String {
    let scored = [
        &t.text_ids[..t.position],
        &t.call_result_ids,
        &t.text_ids[t.position..],
    ];
    tok.decode(&scored.concat()).unwrap()
}

/// A valid token-level candidate for the tiny fixture (vocabulary 512).
fn candidate() -> TokenCandidate {
    TokenCandidate {
        text_ids: vec![5, 6, 7, 8, 9, 10].into(),
        position: 2,
        call_ids: vec![1, 20, 21, 2],
        call_result_ids: vec![1, 20, 21, 30, 2],
        weights: None,
    }
}

/// A service's state derives Debug and clones its tokenizer per worker; the printout names the
/// model without dumping its weights or vocabulary.
#[test]
fn engines_and_models_are_debug_and_tokenizers_clone() {
    #[derive(Debug)]
    #[allow(dead_code)] // read by Debug alone
    struct State {
        model: Model,
        cpu: CpuScorer,
        reference: ReferenceScorer,
        sampler: toolsift::sample::ReferenceSampler,
        tokenizer: Tokenizer,
        boxed: Box<dyn Scorer>,
    }
    let model = Model::load(tiny()).unwrap();
    let tokenizer = model.tokenizer().unwrap().clone();
    let state = State {
        cpu: CpuScorer::new(&model),
        reference: ReferenceScorer::new(&model),
        sampler: toolsift::sample::ReferenceSampler::new(&model),
        tokenizer: tokenizer.clone(),
        boxed: scorer_for(&model, Device::Cpu).unwrap(),
        model,
    };
    let shown = format!("{state:?}");
    for name in [
        "Model",
        "CpuScorer",
        "ReferenceScorer",
        "Tokenizer",
        "vocab_size: 512",
        "Scorer { name: \"cpu\", .. }",
    ] {
        assert!(shown.contains(name), "{name} in {shown}");
    }
    assert!(
        shown.len() < 4000,
        "{} bytes: weights or vocabulary printed",
        shown.len()
    );
    let text = "Out of 1400 participants, 400 passed.";
    assert_eq!(
        tokenizer.encode_ids(text).unwrap(),
        state.tokenizer.encode_ids(text).unwrap()
    );
}

/// `splice` writes a kept call where inline placement scored it, space and all, without the
/// annotate feature.
#[test]
fn splice_writes_calls_as_inline_placement_scores_them() {
    let model = Model::load(tiny()).unwrap();
    let tok = model.tokenizer().unwrap();
    let text = "Out of 1400 participants, 400 (or 29%) passed.";
    for at in [text.find(" 29%").unwrap(), text.find("%)").unwrap()] {
        let c = TextCandidate {
            text: text.into(),
            position: at,
            tool: "Calculator".into(),
            input: "400 / 1400".into(),
            result: "0.29".into(),
            weights: None,
        };
        let t = c
            .to_tokens(tok, Placement::Inline, CallForm::Arrow, None)
            .unwrap();
        let call = toolsift::score::call_text(&c.tool, &c.input, Some(&c.result), CallForm::Arrow);
        assert_eq!(inline_with_result(tok, &t), splice(text, &[(at, call)]));
    }
    assert_eq!(
        splice("29%", &[(2, "[A() -> 1]".into()), (2, "[B() -> 2]".into())]),
        "29[A() -> 1][B() -> 2]%"
    );
}

/// Any Unicode whitespace after the offset counts as a space there (docs/conventions.md): a
/// call before a newline, a tab or an ideographic space is spliced, and scored inline, with a
/// space in front, as before " 29%".
#[test]
fn a_call_before_any_whitespace_gets_a_space_in_front() {
    for ws in ["\n", "\t", "\r\n", "\u{3000}"] {
        let text = format!("is 42{ws}Next");
        assert!(toolsift::score::text::spaced_at(&text, 5), "{ws:?}");
        assert_eq!(
            splice(&text, &[(5, "[A() -> 1]".into())]),
            format!("is 42 [A() -> 1]{ws}Next"),
            "{ws:?}"
        );
    }
    assert!(!toolsift::score::text::spaced_at("is 42.", 5));
    let model = Model::load(tiny()).unwrap();
    let tok = model.tokenizer().unwrap();
    let text = "The answer is 42\nand more.";
    let c = TextCandidate::new(text, text.find('\n').unwrap(), "Calculator", "6 * 7", "42");
    let t = c
        .to_tokens(tok, Placement::Inline, CallForm::Arrow, None)
        .unwrap();
    assert_eq!(
        inline_with_result(tok, &t),
        "The answer is 42 [Calculator(6 * 7) -> 42]\nand more."
    );
}

/// What `scorer_for` returns, or a scorer shared through an `Arc` or a reference, goes where
/// a generic `S: Scorer` is taken, and scores as the scorer itself does.
#[test]
fn boxed_shared_and_borrowed_scorers_are_scorers() {
    fn losses<S: Scorer>(scorer: S, batch: &[TokenCandidate]) -> Vec<[f64; 3]> {
        assert_eq!(scorer.name(), "cpu");
        scorer
            .variant_losses(batch, &ScoreOptions::default())
            .unwrap()
    }
    let model = Model::load(tiny()).unwrap();
    let batch = [candidate()];
    let cpu = CpuScorer::new(&model);
    let direct = cpu
        .variant_losses(&batch, &ScoreOptions::default())
        .unwrap();
    let boxed = scorer_for(&model, Device::Cpu).unwrap();
    assert_eq!(losses(&cpu, &batch), direct);
    assert_eq!(losses(&*boxed, &batch), direct);
    assert_eq!(losses(Arc::new(cpu), &batch), direct);
    assert_eq!(losses(boxed, &batch), direct);
}

/// A candidate whose call with its result is no token is refused, naming it: its L_call_result
/// would be L_none, and delta 0 would keep it at any tau_f <= 0.
#[test]
fn a_call_that_inserts_no_token_is_refused() {
    let model = Model::load(tiny()).unwrap();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    let good = candidate();
    let empty = TokenCandidate {
        call_ids: Vec::new(),
        call_result_ids: Vec::new(),
        ..good.clone()
    };
    match scorer.score(&[good, empty], &ScoreOptions::default()) {
        Err(e @ Error::Candidate { index: 1, .. }) => {
            let Error::Candidate { reason, .. } = &e else {
                unreachable!()
            };
            assert_eq!(*reason, InvalidCandidate::EmptyCallResult);
            assert!(
                e.to_string()
                    .starts_with("candidate 1: call_result_ids is empty"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// One engine scores, samples and decodes on one copy of the weights, under the budget given;
/// its decoding sessions are `Send`.
#[test]
fn one_engine_scores_and_decodes() {
    let model = Model::load(tiny()).unwrap();
    let batch = [candidate()];
    let options = ScoreOptions::default();
    let engine = engine_with_memory_budget(&model, Device::Cpu, Some(1)).unwrap();
    let scorer = scorer_with_memory_budget(&model, Device::Cpu, Some(1)).unwrap();
    assert_eq!(
        engine.variant_losses(&batch, &options).unwrap(),
        scorer.variant_losses(&batch, &options).unwrap()
    );
    let mut session = engine.session();
    let s = session.new_sequence();
    // A session moves to another thread (a worker, or an async task across an await).
    let (log_probs, session) = std::thread::scope(|scope| {
        scope
            .spawn(move || (session.extend(&[s], &[vec![5, 6, 7]]).unwrap(), session))
            .join()
            .unwrap()
    });
    assert_eq!(log_probs[0].len(), model.config().vocab_size);
    assert_eq!(session.len(s), 3);
}

/// A tokenizer held in memory loads as its file does; a bad one is named by the path given.
#[test]
fn a_tokenizer_loads_from_bytes() {
    let path = tiny().join("tokenizer.json");
    let bytes = std::fs::read(&path).unwrap();
    let label = std::path::Path::new("embedded/tokenizer.json");
    let from_bytes = Tokenizer::from_bytes(&bytes, label).unwrap();
    let from_file = Tokenizer::from_file(&path).unwrap();
    let text = "Out of 1400 participants, 400 passed.";
    assert_eq!(
        from_bytes.encode_ids(text).unwrap(),
        from_file.encode_ids(text).unwrap()
    );
    assert_eq!(from_bytes.path(), label);
    let err = Tokenizer::from_bytes(b"{\"not\": 1}", label).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("embedded/tokenizer.json") && msg.contains("not a Hugging Face tokenizer"),
        "{msg}"
    );
}

/// Token-level, candidate by candidate: a bad candidate gets its `validate` error in its place,
/// and the good ones the bits that a batch of only them gets.
#[test]
fn score_each_answers_every_token_candidate_in_its_place() {
    let model = Model::load(tiny()).unwrap();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    let options = ScoreOptions::default();
    let bad = TokenCandidate {
        call_ids: vec![600], // the vocabulary is 512
        ..candidate()
    };
    let other = TokenCandidate {
        position: 3,
        ..candidate()
    };
    let batch = [bad.clone(), candidate(), bad, other.clone()];
    let each = toolsift::score_each(&*scorer, &batch, &options).unwrap();
    let alone = scorer.score(&[candidate(), other], &options).unwrap();
    assert_eq!(each.len(), 4);
    for k in [0, 2] {
        let reason = InvalidCandidate::OutOfVocabulary {
            field: "call_ids",
            index: 0,
            id: 600,
            vocab_size: 512,
        };
        assert!(
            matches!(&each[k], Err(e @ Error::Candidate { index, reason: r, .. })
                if *index == k && *r == reason && e.is_input()
                    && e.to_string().contains("call_ids[0] = 600")),
            "{:?}",
            each[k]
        );
    }
    assert_eq!(each[1].as_ref().unwrap(), &alone[0]);
    assert_eq!(each[3].as_ref().unwrap(), &alone[1]);
    assert!(toolsift::score_each(&*scorer, &[], &options)
        .unwrap()
        .is_empty());
}
