//! The library as an embedder uses it: scorers shared across threads, checked entry points that
//! return errors (never panic) on bad candidates, text-level scoring in one call.

mod common;

use std::sync::Arc;

use common::tiny;
use toolsift::generate::GenerateOptions;
use toolsift::{
    score_texts, score_texts_each, scorer_for, CallForm, Device, Error, InvalidCandidate, Model,
    Placement, ReferenceScorer, ScoreOptions, Scorer, TextCandidate, TokenCandidate,
};

fn model() -> Model {
    Model::load(tiny("f32")).unwrap()
}

/// The JSON rows a `score_jsonl` run wrote.
fn rows(out: &[u8]) -> Vec<serde_json::Value> {
    std::str::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn candidate(text_ids: Vec<u32>) -> TokenCandidate {
    TokenCandidate {
        text_ids: text_ids.into(),
        position: 3,
        call_ids: vec![58, 344, 7, 19, 8, 60, 220],
        call_result_ids: vec![58, 344, 7, 19, 8, 342, 60, 220],
        weights: None,
    }
}

#[test]
fn scorers_are_shared_across_threads() {
    fn send_sync<T: Send + Sync + ?Sized>(_: &T) {}
    let model = model();
    let scorer: Arc<Box<dyn Scorer>> = Arc::new(scorer_for(&model, Device::Cpu).unwrap());
    send_sync(&scorer);
    send_sync(&toolsift::backend::engine_for(&model, Device::Cpu).unwrap());
    send_sync(&toolsift::backend::decoder_for(&model, Device::Cpu).unwrap());
    let batch = vec![candidate(vec![329, 266, 451, 455, 338, 11, 285])];
    let options = ScoreOptions::default();
    let alone = scorer.variant_losses(&batch, &options).unwrap();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|_| s.spawn(|| scorer.variant_losses(&batch, &options).unwrap()))
            .collect();
        for run in runs {
            assert_eq!(run.join().unwrap(), alone);
        }
    });
}

#[test]
fn checked_entry_points_refuse_what_the_unchecked_one_would_panic_on() {
    let model = model();
    let vocab = model.config().vocab_size as u32;
    let options = ScoreOptions::default();
    let fast = scorer_for(&model, Device::Cpu).unwrap();
    let reference = ReferenceScorer::new(&model);
    let out_of_vocab = candidate(vec![329, 266, 451, vocab + 12_800_000, 338]);
    let mut past_the_end = candidate(vec![329, 266, 451, 455]);
    past_the_end.position = 9;
    for scorer in [fast.as_ref(), &reference as &dyn Scorer] {
        let good = candidate(vec![329, 266, 451, 455, 338, 11, 285]);
        for (bad, why, expected) in [
            (
                &out_of_vocab,
                "outside the vocabulary",
                InvalidCandidate::OutOfVocabulary {
                    field: "text_ids",
                    index: 3,
                    id: vocab + 12_800_000,
                    vocab_size: vocab as usize,
                },
            ),
            (
                &past_the_end,
                "out of range",
                InvalidCandidate::PositionOutOfRange {
                    position: 9,
                    text_len: 4,
                },
            ),
        ] {
            let batch = [good.clone(), bad.clone()];
            for err in [
                scorer.variant_losses(&batch, &options).unwrap_err(),
                scorer.score(&batch, &options).unwrap_err(),
            ] {
                let msg = err.to_string();
                assert!(
                    matches!(&err, Error::Candidate { index: 1, reason, .. } if *reason == expected)
                        && err.is_input()
                        && msg.starts_with("candidate 1:")
                        && msg.contains(why),
                    "{}: {msg}",
                    scorer.name()
                );
            }
        }
    }
}

#[test]
fn score_texts_tokenizes_each_text_once_with_the_options_placement() {
    let model = model();
    let tokenizer = model.tokenizer().unwrap();
    let scorer = ReferenceScorer::new(&model);
    let text = "Out of 1400 participants, 400 (or 29%) passed the test.";
    let at = text.find(" 29%").unwrap();
    let mut cands: Vec<TextCandidate> = [("400 / 1400", "0.29"), ("1400 / 400", "3.5")]
        .iter()
        .map(|(input, result)| TextCandidate::new(text, at, "Calculator", *input, *result))
        .collect();
    // A candidate with weights of its own, as a JSONL line may give them.
    cands.push(TextCandidate {
        weights: Some(vec![1.0, 0.0, 0.5]),
        ..cands[0].clone()
    });
    for placement in [Placement::Prefix, Placement::Inline] {
        let options = ScoreOptions {
            placement,
            ..ScoreOptions::default()
        };
        let got = score_texts(&scorer, tokenizer, &cands, &options, CallForm::Arrow).unwrap();
        let tokens: Vec<TokenCandidate> = cands
            .iter()
            .map(|c| {
                c.to_tokens(tokenizer, placement, CallForm::Arrow, None)
                    .unwrap()
            })
            .collect();
        assert_eq!(
            got,
            scorer.score(&tokens, &options).unwrap(),
            "{placement:?}"
        );
        assert_eq!(tokens[2].weights, cands[2].weights);
        assert_ne!(
            got[2], got[0],
            "{placement:?}: its own weights, not the batch's"
        );
    }
    let bad_weights = TextCandidate {
        weights: Some(vec![-1.0]),
        ..cands[0].clone()
    };
    let err = score_texts(
        &scorer,
        tokenizer,
        &[bad_weights],
        &ScoreOptions::default(),
        CallForm::Arrow,
    )
    .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Candidate {
                index: 0,
                reason: InvalidCandidate::Weights(_),
                ..
            }
        ),
        "{err}"
    );
    // The error names the candidate: a position inside "é", a position past the text, the
    // first token (said in bytes: the caller gave no token position).
    for (position, why) in [
        (4, "character boundary"),
        (14, "past the end"),
        (0, "byte offset 0 is at the text's first token"),
    ] {
        let mut bad = cands.clone();
        bad[1].text = "café au lait".into();
        bad[1].position = position;
        let err = score_texts(
            &scorer,
            tokenizer,
            &bad,
            &ScoreOptions::default(),
            CallForm::Arrow,
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::Candidate { index: 1, reason, .. }
                if reason.to_string().contains(why)),
            "{err}"
        );
    }
}

/// What cannot fit the model is refused without being tokenized whole, and the error names the
/// first bad candidate in order, whichever check finds it.
#[test]
fn score_texts_refuses_what_cannot_fit_and_names_the_first_bad_candidate() {
    let model = model();
    let tokenizer = model.tokenizer().unwrap();
    let scorer = ReferenceScorer::new(&model);
    let text = "Out of 1400 participants, 400 (or 29%) passed the test.";
    let good = TextCandidate {
        text: text.into(),
        position: text.find(" 29%").unwrap(),
        tool: "Calculator".into(),
        input: "400 / 1400".into(),
        result: "0.29".into(),
        weights: None,
    };
    let long_text = format!("{}end.", "word ".repeat(1 << 20));
    let score = |cands: &[TextCandidate]| {
        score_texts(
            &scorer,
            tokenizer,
            cands,
            &ScoreOptions::default(),
            CallForm::Arrow,
        )
        .unwrap_err()
    };
    let cases = [
        TextCandidate {
            input: format!("{}1", "1 + ".repeat(4 << 20)),
            ..good.clone()
        },
        TextCandidate {
            text: long_text.as_str().into(),
            position: long_text.len() - 5,
            ..good.clone()
        },
        // Said as a token-level candidate's is.
        TextCandidate {
            text: "".into(),
            position: 0,
            ..good.clone()
        },
    ];
    for (bad, why) in cases.into_iter().zip([
        "is longer than the model's n_positions (256) tokens",
        "is past the first n_positions (256) tokens of the text",
        "text is empty",
    ]) {
        let err = score(&[good.clone(), bad]);
        assert!(
            matches!(&err, Error::Candidate { index: 1, reason, .. }
                if reason.to_string().contains(why)),
            "{err}"
        );
        // Too long, as a value: without an exact length, as the text was not tokenized whole.
        let Error::Candidate { reason, .. } = &err else {
            unreachable!()
        };
        assert_eq!(
            matches!(
                reason,
                InvalidCandidate::TextTooLong {
                    n_positions: 256,
                    ..
                }
            ),
            why.contains("n_positions"),
            "{reason:?}"
        );
    }
    // A text that cannot be cut for a head (no whitespace after a word in 9 MiB) is the
    // candidate's reason, not the tokenizer's failure.
    let blob = "x".repeat(9 << 20);
    let err = score(&[
        good.clone(),
        TextCandidate::new(blob.as_str(), 5, "Calculator", "1 + 1", "2"),
    ]);
    assert!(
        matches!(&err, Error::Candidate { index: 1, reason: InvalidCandidate::Text(why), .. }
            if why.contains("no head of it can be tokenized alone past there")),
        "{err}"
    );
    // Candidate 0's tool name is refused before candidate 1's position past the text.
    let past_the_end = TextCandidate {
        position: text.len() + 1,
        ..good.clone()
    };
    let no_tool = TextCandidate {
        tool: String::new(),
        ..good.clone()
    };
    let err = score(&[no_tool, past_the_end]);
    assert!(
        matches!(&err, Error::Candidate { index: 0, reason: InvalidCandidate::Call(why), .. }
            if why.contains("tool name is empty")),
        "{err}"
    );
}

/// A byte offset that is not a token boundary is refused with the token's bytes, so a caller
/// can move the call to a boundary and score it there; the first token and a position inside a
/// character are values too.
#[test]
fn an_offset_off_a_token_boundary_says_where_the_boundaries_are() {
    let model = model();
    let tokenizer = model.tokenizer().unwrap();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    let text = "Out of 1400 participants, 400 (or 29%) passed the test. Ünïcödé.";
    let at = |position: usize| TextCandidate::new(text, position, "Calculator", "1 + 1", "2");
    let inside = text.find("participants").unwrap() + 3;
    let umlaut = text.find('Ü').unwrap() + 1;
    let options = ScoreOptions::default();
    let each = score_texts_each(
        &*scorer,
        tokenizer,
        &[at(inside), at(0), at(umlaut)],
        &options,
        CallForm::Arrow,
    )
    .unwrap();
    let reason = |k: usize| match &each[k] {
        Err(Error::Candidate { reason, .. }) => reason.clone(),
        other => panic!("candidate {k}: {other:?}"),
    };
    let InvalidCandidate::InsideToken {
        offset, start, end, ..
    } = reason(0)
    else {
        panic!("{:?}", reason(0));
    };
    assert!(
        offset == inside && start < inside && inside < end,
        "{:?}",
        reason(0)
    );
    assert_eq!(reason(1), InvalidCandidate::AtFirstToken { offset: 0 });
    assert_eq!(
        reason(2),
        InvalidCandidate::NotCharBoundary {
            offset: umlaut,
            len: text.len()
        }
    );
    // Moved to the token's start, the call is scored.
    let moved = score_texts(&*scorer, tokenizer, &[at(start)], &options, CallForm::Arrow);
    assert!(moved.is_ok(), "{moved:?}");
}

/// Candidate by candidate: each bad one gets its own error in its place (an `Error::Candidate`
/// naming that place), and the good ones get what a batch of only them gets.
#[test]
fn score_texts_each_answers_every_candidate_in_its_place() {
    let model = model();
    let tokenizer = model.tokenizer().unwrap();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    let text = "Out of 1400 participants, 400 (or 29%) passed the test.";
    let good = |input: &str, result: &str| TextCandidate {
        text: text.into(),
        position: text.find(" 29%").unwrap(),
        tool: "Calculator".into(),
        input: input.into(),
        result: result.into(),
        weights: None,
    };
    let batch = [
        TextCandidate {
            tool: String::new(),
            ..good("1 + 1", "2")
        },
        good("400 / 1400", "0.29"),
        TextCandidate {
            position: text.len() + 1,
            ..good("1 + 1", "2")
        },
        good("400 / 1400", ""),
        good("1400 - 400", "1000"),
    ];
    let options = ScoreOptions::default();
    let each = score_texts_each(&*scorer, tokenizer, &batch, &options, CallForm::Arrow).unwrap();
    assert_eq!(each.len(), batch.len());
    // Each reason a value to act on: the call's wording, or where the offset is.
    let past = InvalidCandidate::PastText {
        offset: text.len() + 1,
        len: text.len(),
    };
    for (k, why) in [
        (0, "tool name is empty"),
        (2, "past the end"),
        (3, "result is empty"),
    ] {
        match &each[k] {
            Err(e @ Error::Candidate { index, reason, .. }) => assert!(
                *index == k
                    && (matches!(reason, InvalidCandidate::Call(_)) || *reason == past)
                    && reason.to_string().contains(why)
                    && e.is_input(),
                "{k}: {e}"
            ),
            other => panic!("candidate {k}: {other:?}"),
        }
    }
    let alone = score_texts(
        &*scorer,
        tokenizer,
        &[batch[1].clone(), batch[4].clone()],
        &options,
        CallForm::Arrow,
    )
    .unwrap();
    assert_eq!(each[1].as_ref().unwrap(), &alone[0]);
    assert_eq!(each[4].as_ref().unwrap(), &alone[1]);
    // score_texts fails the batch for the first bad one and names it.
    let err = score_texts(&*scorer, tokenizer, &batch, &options, CallForm::Arrow).unwrap_err();
    assert!(matches!(err, Error::Candidate { index: 0, .. }), "{err}");

    // A batch of bad candidates only is answered without the scorer; a scorer's own refusal
    // of a candidate (as the naive baseline's) names its place in the caller's batch.
    struct Refuses<'a>(&'a dyn Scorer, std::sync::atomic::AtomicUsize);
    impl Scorer for Refuses<'_> {
        fn name(&self) -> &str {
            "refuses the second"
        }
        fn config(&self) -> &toolsift::GptjConfig {
            self.0.config()
        }
        fn variant_losses_unchecked(
            &self,
            candidates: &[TokenCandidate],
            _: &ScoreOptions,
        ) -> toolsift::Result<Vec<[f64; 3]>> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(Error::candidate(candidates.len() - 1, "too long for me"))
        }
    }
    let refuses = Refuses(&*scorer, Default::default());
    let bad_only = [batch[0].clone(), batch[3].clone()];
    let each = score_texts_each(&refuses, tokenizer, &bad_only, &options, CallForm::Arrow).unwrap();
    assert!(each.iter().all(|r| r.is_err()));
    assert_eq!(refuses.1.load(std::sync::atomic::Ordering::Relaxed), 0);
    // It refuses the last candidate of every batch it is given: the two good ones in turn, each
    // answered with its refusal in its place, after three calls.
    let each = score_texts_each(&refuses, tokenizer, &batch, &options, CallForm::Arrow).unwrap();
    for (k, answer) in each.iter().enumerate() {
        match answer {
            Err(Error::Candidate {
                index,
                reason: InvalidCandidate::Other(why),
                ..
            }) if [1, 4].contains(&k) => {
                assert_eq!((*index, why.as_str()), (k, "too long for me"))
            }
            Err(Error::Candidate { index, .. }) => assert_eq!(*index, k),
            other => panic!("candidate {k}: {other:?}"),
        }
    }
    assert_eq!(refuses.1.load(std::sync::atomic::Ordering::Relaxed), 2);
}

/// A scorer written outside the crate, with a limit of its own: candidates whose text holds
/// `refused` are refused; `short` drops the last answer and `past_the_end` refuses a candidate
/// it was not given (bugs of that scorer).
#[derive(Clone, Copy)]
struct Picky<'a> {
    inner: &'a dyn Scorer,
    refused: u32,
    short: bool,
    past_the_end: bool,
}

impl Scorer for Picky<'_> {
    fn name(&self) -> &str {
        "picky"
    }
    fn config(&self) -> &toolsift::GptjConfig {
        self.inner.config()
    }
    fn variant_losses_unchecked(
        &self,
        candidates: &[TokenCandidate],
        options: &ScoreOptions,
    ) -> toolsift::Result<Vec<[f64; 3]>> {
        if self.past_the_end {
            return Err(Error::candidate(candidates.len(), "no such candidate"));
        }
        if let Some(k) = candidates
            .iter()
            .position(|c| c.text_ids.contains(&self.refused))
        {
            // A reason in words is `InvalidCandidate::Other`.
            return Err(Error::candidate(k, "not that token"));
        }
        let mut losses = self.inner.variant_losses_unchecked(candidates, options)?;
        if self.short {
            losses.pop();
        }
        Ok(losses)
    }
}

/// `score_jsonl` answers a line a scorer refuses with that line's error and scores the rest;
/// a scorer that answers the wrong number of candidates is an error naming it, in
/// `score_jsonl` and `score_each` alike, never a panic.
#[test]
fn a_scorers_own_refusal_is_its_lines_answer_and_a_miscount_an_error() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    let model = model();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    let line = |ids: &str| {
        format!(
            r#"{{"text_ids": [{ids}], "position": 3, "call_ids": [58, 344], "call_result_ids": [58, 344, 7]}}"#
        )
    };
    let lines = [
        line("329, 266, 451, 455, 338"),
        line("329, 266, 451, 300, 338"),
        line("329, 266, 451, 455, 11"),
    ];
    let input = lines.join("\n");
    let picky = Picky {
        inner: &*scorer,
        refused: 300,
        short: false,
        past_the_end: false,
    };
    let mut out = Vec::new();
    let options = JsonlOptions::default();
    let summary = score_jsonl(input.as_bytes(), &mut out, &picky, None, &options).unwrap();
    assert_eq!((summary.lines, summary.scored, summary.failed), (3, 2, 1));
    let answers = rows(&out);
    assert_eq!(answers[1]["error"], "line 2: not that token");
    // The others are what the plain scorer gives a batch of only them.
    let mut plain = Vec::new();
    let others = [lines[0].clone(), lines[2].clone()].join("\n");
    score_jsonl(others.as_bytes(), &mut plain, &*scorer, None, &options).unwrap();
    let plain: Vec<serde_json::Value> = String::from_utf8(plain)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (got, want) in [(&answers[0], &plain[0]), (&answers[2], &plain[1])] {
        assert_eq!(got["delta"], want["delta"]);
        assert_eq!(got["l_call_result"], want["l_call_result"]);
    }

    let short = Picky {
        short: true,
        ..picky
    };
    let err = score_jsonl(input.as_bytes(), Vec::new(), &short, None, &options).unwrap_err();
    assert!(
        matches!(&err, Error::Backend(m) if m.contains("scorer picky returned 1 results for 2")
            && m.starts_with("scoring input lines 1-3")),
        "{err}"
    );
    let past_the_end = Picky {
        past_the_end: true,
        ..picky
    };
    let err = score_jsonl(input.as_bytes(), Vec::new(), &past_the_end, None, &options).unwrap_err();
    assert!(
        matches!(&err, Error::Backend(m) if m.contains("refused candidate 3 of a batch of 3")),
        "{err}"
    );
    // score_each alike: the refused candidate's answer is the refusal, the others are scored.
    let mixed = [
        candidate(vec![329, 266, 451, 455, 338]),
        candidate(vec![329, 266, 451, 300, 338]),
        candidate(vec![329, 266, 451, 455, 11]),
    ];
    let each = toolsift::score_each(&picky, &mixed, &ScoreOptions::default()).unwrap();
    assert!(
        matches!(&each[1], Err(Error::Candidate { index: 1, reason: InvalidCandidate::Other(why), .. })
            if why == "not that token"),
        "{:?}",
        each[1]
    );
    let alone = scorer
        .score(
            &[mixed[0].clone(), mixed[2].clone()],
            &ScoreOptions::default(),
        )
        .unwrap();
    assert_eq!(each[0].as_ref().unwrap(), &alone[0]);
    assert_eq!(each[2].as_ref().unwrap(), &alone[1]);
    let batch = vec![candidate(vec![329, 266, 451, 455, 338]); 2];
    let err = toolsift::score_each(&short, &batch, &ScoreOptions::default()).unwrap_err();
    assert!(
        matches!(&err, Error::Backend(m) if m.contains("returned 1 results for 2")),
        "{err}"
    );
    let err = toolsift::score_each(&past_the_end, &batch, &ScoreOptions::default()).unwrap_err();
    assert!(
        matches!(&err, Error::Backend(m) if m.contains("refused candidate 2 of a batch of 2")),
        "{err}"
    );
    // The trait's own checked calls count the answer too.
    for err in [
        short.score(&batch, &ScoreOptions::default()).unwrap_err(),
        short
            .variant_losses(&batch, &ScoreOptions::default())
            .unwrap_err(),
    ] {
        assert!(
            matches!(&err, Error::Backend(m) if m.contains("scorer picky returned 1 results for 2")),
            "{err}"
        );
    }
}

/// A line a scorer refuses in a later chunk is named by its own line number, not by its place in
/// its chunk, in the row's "line" and in its error alike.
#[test]
fn a_refusal_in_a_later_chunk_names_its_own_line() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    let model = model();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    let line = |ids: &str| {
        format!(
            r#"{{"text_ids": [{ids}], "position": 3, "call_ids": [58, 344], "call_result_ids": [58, 344, 7]}}"#
        )
    };
    let input = [
        line("329, 266, 451, 455, 338"),
        line("329, 266, 451, 455, 11"),
        line("329, 266, 451, 455, 12"),
        line("329, 266, 451, 300, 338"),
    ]
    .join("\n");
    let picky = Picky {
        inner: &*scorer,
        refused: 300,
        short: false,
        past_the_end: false,
    };
    let options = JsonlOptions {
        chunk_lines: 2,
        ..JsonlOptions::default()
    };
    let mut out = Vec::new();
    let summary = score_jsonl(input.as_bytes(), &mut out, &picky, None, &options).unwrap();
    assert_eq!((summary.lines, summary.scored, summary.failed), (4, 3, 1));
    let answers = rows(&out);
    assert_eq!(answers[3]["line"], 4);
    assert_eq!(answers[3]["error"], "line 4: not that token");
}

/// `score_jsonl`'s summary counts what its rows say: every line, the scored ones, the failed
/// ones, and the scored lines kept at their own tau_f.
#[test]
fn the_jsonl_summary_counts_what_the_rows_say() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions, JsonlSummary};
    let model = model();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    let line = |tau_f: f64, position: usize| {
        format!(
            r#"{{"text_ids": [329, 266, 451, 455, 338], "position": {position}, "call_ids": [58, 344], "call_result_ids": [58, 344, 7], "tau_f": {tau_f}}}"#
        )
    };
    let input = [line(-1e9, 3), line(1e9, 3), line(-1e9, 0), line(-1e9, 2)].join("\n");
    let mut out = Vec::new();
    let summary = score_jsonl(
        input.as_bytes(),
        &mut out,
        &*scorer,
        None,
        &JsonlOptions::default(),
    )
    .unwrap();
    let rows = rows(&out);
    let kept: Vec<_> = rows.iter().map(|r| r["kept"].as_bool()).collect();
    assert_eq!(kept, [Some(true), Some(false), None, Some(true)]);
    assert_eq!(
        summary,
        JsonlSummary {
            lines: 4,
            scored: 3,
            failed: 1,
            kept: 2
        }
    );
}

/// A scorer that answers more candidates than it was asked is an error naming it, as a short
/// answer is: the extra answer is not silently dropped (nor the answers misplaced).
#[test]
fn a_long_answer_from_a_scorer_is_an_error() {
    struct LongAnswer<'a>(&'a dyn Scorer);
    impl Scorer for LongAnswer<'_> {
        fn name(&self) -> &str {
            "long"
        }
        fn config(&self) -> &toolsift::GptjConfig {
            self.0.config()
        }
        fn variant_losses_unchecked(
            &self,
            candidates: &[TokenCandidate],
            options: &ScoreOptions,
        ) -> toolsift::Result<Vec<[f64; 3]>> {
            let mut losses = self.0.variant_losses_unchecked(candidates, options)?;
            losses.push([2.0, 2.0, 0.0]);
            Ok(losses)
        }
    }
    let model = model();
    let inner = ReferenceScorer::new(&model);
    let long = LongAnswer(&inner);
    let options = ScoreOptions::default();
    let batch = [
        candidate(vec![329, 266, 451, 455, 338]),
        candidate(vec![329, 266, 451, 455, 11]),
    ];
    for err in [
        long.variant_losses(&batch, &options).unwrap_err(),
        long.score(&batch, &options).unwrap_err(),
        toolsift::score_each(&long, &batch, &options).unwrap_err(),
    ] {
        assert!(
            matches!(&err, Error::Backend(m) if m.contains("scorer long returned 3 results for 2 candidates")),
            "{err}"
        );
    }
}

/// A text-level `score` line is scored as `score_texts` scores its candidate: with the run's
/// placement (inline too), and with the line's own weights deciding how far its text is
/// tokenized (a window of 100 weights at the second token reads far past the head the default
/// window's would tokenize).
#[test]
fn text_level_lines_score_as_score_texts_does() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    let model = model();
    let tokenizer = model.tokenizer().unwrap();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    let text = "a b c d e f g h i j k l m n o p q r s t u v w x y z ".repeat(8);
    let text = text.as_str();
    let long = Some(vec![0.01; 100]);
    for (placement, position, weights) in [
        (Placement::Inline, text.find(" m").unwrap(), None),
        (Placement::Prefix, 1, long.clone()),
        (Placement::Inline, 1, long),
    ] {
        let c = TextCandidate {
            weights: weights.clone(),
            ..TextCandidate::new(text, position, "Calculator", "1 + 2", "3")
        };
        let options = ScoreOptions {
            placement,
            ..ScoreOptions::default()
        };
        let want = score_texts(&*scorer, tokenizer, &[c], &options, CallForm::Arrow).unwrap();
        let line = serde_json::json!({"text": text, "position": position, "tool": "Calculator",
                                      "input": "1 + 2", "result": "3", "weights": weights});
        let jsonl = JsonlOptions {
            score: options,
            ..JsonlOptions::default()
        };
        let mut out = Vec::new();
        score_jsonl(
            format!("{line}\n").as_bytes(),
            &mut out,
            &*scorer,
            Some(tokenizer),
            &jsonl,
        )
        .unwrap();
        let row: serde_json::Value = serde_json::from_slice(&out).unwrap();
        for (field, want) in [
            ("l_none", want[0].l_none),
            ("l_call", want[0].l_call),
            ("l_call_result", want[0].l_call_result),
        ] {
            assert_eq!(
                row[field].as_f64(),
                Some(want),
                "{placement:?} at {position}, {field}: {row}"
            );
        }
    }
}

/// A scorer that overrides `score` itself and drops the last answer: the text-level driver
/// counts what it gets back, so no candidate is silently left unscored.
#[test]
fn a_short_answer_from_an_overridden_score_is_an_error() {
    struct ShortScore<'a>(&'a dyn Scorer);
    impl Scorer for ShortScore<'_> {
        fn name(&self) -> &str {
            "short"
        }
        fn config(&self) -> &toolsift::GptjConfig {
            self.0.config()
        }
        fn variant_losses_unchecked(
            &self,
            candidates: &[TokenCandidate],
            options: &ScoreOptions,
        ) -> toolsift::Result<Vec<[f64; 3]>> {
            self.0.variant_losses_unchecked(candidates, options)
        }
        fn score(
            &self,
            candidates: &[TokenCandidate],
            options: &ScoreOptions,
        ) -> toolsift::Result<Vec<toolsift::Scores>> {
            let mut scores = self.0.score(candidates, options)?;
            scores.pop();
            Ok(scores)
        }
    }
    let model = model();
    let tokenizer = model.tokenizer().unwrap();
    let inner = ReferenceScorer::new(&model);
    let text = "Out of 1400 participants, 400 (or 29%) passed the test.";
    let at = text.find(" 29%").unwrap();
    let cands = vec![TextCandidate::new(text, at, "Calculator", "400 / 1400", "0.29"); 2];
    let options = ScoreOptions::default();
    let short = ShortScore(&inner);
    // score_jsonl goes through the scorer's own `score` too.
    let line = serde_json::json!({"text": text, "position": at, "tool": "Calculator",
                                  "input": "400 / 1400", "result": "0.29"})
    .to_string();
    let input = format!("{line}\n{line}\n");
    let jsonl = toolsift::score::jsonl::score_jsonl(
        input.as_bytes(),
        Vec::new(),
        &short,
        Some(tokenizer),
        &Default::default(),
    )
    .unwrap_err();
    for err in [
        score_texts(&short, tokenizer, &cands, &options, CallForm::Arrow).unwrap_err(),
        score_texts_each(&short, tokenizer, &cands, &options, CallForm::Arrow).unwrap_err(),
        jsonl,
    ] {
        assert!(
            matches!(&err, Error::Backend(m) if m.contains("scorer short returned 1 results for 2")),
            "{err}"
        );
    }
}

#[test]
fn generate_options_for_a_model_carry_its_limits() {
    let model = model();
    let o = GenerateOptions::for_model(model.config());
    assert_eq!(o.n_positions, Some(model.config().n_positions));
    assert_eq!(o.vocab_size, Some(model.config().vocab_size));
    assert_eq!(o.max_new_tokens, GenerateOptions::default().max_new_tokens);
}

/// The annotate driver from a program, with a tool the program registers (in place of the
/// built-in Calculator), on the embedded demo model: C* has every document, in order.
#[test]
fn annotate_runs_from_a_program_with_its_own_registry() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use toolsift::annotate::tools::{Calculator, DocContext, Tool, ToolError, ToolRegistry};
    use toolsift::annotate::{annotate, Annotator, CStarRecord, RunOptions, RunOutcome, ToolKind};

    /// The built-in calculator, counting its calls.
    struct Counted(Calculator, Arc<AtomicUsize>);
    impl Tool for Counted {
        fn name(&self) -> &str {
            "Calculator"
        }
        fn call(&self, input: &str, doc: &DocContext<'_>) -> Result<String, ToolError> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.call(input, doc)
        }
    }

    let model = Model::load(toolsift::demo::assets::materialize().unwrap()).unwrap();
    let config = toolsift::demo::assets::demo_config().unwrap();
    let engine = toolsift::backend::engine_for(&model, Device::Cpu).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut registry = ToolRegistry::new();
    registry.register(Counted(Calculator::new(), calls.clone()));
    let annotator = Annotator::new(
        model.tokenizer().unwrap(),
        engine.as_ref(),
        engine.as_ref(),
        &registry,
        &config,
        &[ToolKind::Calculator],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(
        &corpus,
        "{\"text\": \"Each of the boxes costs 25 dollars, so 12 of them cost 300 dollars.\"}\n\
         {\"text\": \"The river was quiet that morning.\"}\n",
    )
    .unwrap();
    let out = dir.path().join("cstar.jsonl");
    let RunOutcome::Done(_, paths) = annotate(&annotator, &RunOptions::new(&corpus, &out)).unwrap()
    else {
        panic!("the run stopped early");
    };
    let records: Vec<CStarRecord> = std::fs::read_to_string(&paths.out)
        .unwrap()
        .lines()
        .map(|l| toolsift::serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 2]);
    assert!(calls.load(Ordering::Relaxed) > 0, "the registered tool ran");
    let kept: Vec<_> = records[0].calls.iter().filter(|c| c.kept).collect();
    assert!(
        kept.iter().any(|c| c.input == "25 * 12"),
        "{:?}",
        records[0].annotated_text
    );
}

/// A program's own scorer that refuses one call (`Error::Candidate`): annotate answers that
/// call with the refusal, scores the document's other calls without it, and counts it as
/// unscorable; the document is not rejected.
#[test]
fn annotate_answers_a_call_its_scorer_refuses_and_scores_the_others() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use toolsift::annotate::tools::ToolRegistry;
    use toolsift::annotate::{annotate, Annotator, CStarRecord, RunOptions, RunOutcome, ToolKind};

    /// Refuses the first candidate of the first batch it is given, once.
    struct RefusesOnce<'a>(&'a dyn Scorer, AtomicBool);
    impl Scorer for RefusesOnce<'_> {
        fn name(&self) -> &str {
            "refuses once"
        }
        fn config(&self) -> &toolsift::GptjConfig {
            self.0.config()
        }
        fn variant_losses_unchecked(
            &self,
            candidates: &[TokenCandidate],
            options: &ScoreOptions,
        ) -> toolsift::Result<Vec<[f64; 3]>> {
            if !self.1.swap(true, Ordering::Relaxed) {
                return Err(Error::candidate(0, "not this one"));
            }
            self.0.variant_losses_unchecked(candidates, options)
        }
    }

    let model = Model::load(toolsift::demo::assets::materialize().unwrap()).unwrap();
    let config = toolsift::demo::assets::demo_config().unwrap();
    let engine = toolsift::backend::engine_for(&model, Device::Cpu).unwrap();
    let refuses = RefusesOnce(engine.as_ref(), AtomicBool::new(false));
    let registry = ToolRegistry::from_config(&config.tools).unwrap();
    let annotator = Annotator::new(
        model.tokenizer().unwrap(),
        engine.as_ref(),
        &refuses,
        &registry,
        &config,
        &[ToolKind::Calculator],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(
        &corpus,
        "{\"text\": \"Each of the boxes costs 25 dollars, so 12 of them cost 300 dollars.\"}\n",
    )
    .unwrap();
    let out = dir.path().join("cstar.jsonl");
    let RunOutcome::Done(summary, paths) =
        annotate(&annotator, &RunOptions::new(&corpus, &out)).unwrap()
    else {
        panic!("the run stopped early");
    };
    assert_eq!((summary.documents, summary.rejected), (1, 0));
    let records: Vec<CStarRecord> = std::fs::read_to_string(&paths.out)
        .unwrap()
        .lines()
        .map(|l| toolsift::serde_json::from_str(l).unwrap())
        .collect();
    let calls = &records[0].calls;
    let refused: Vec<_> = calls
        .iter()
        .filter(|c| c.error.as_deref() == Some("cannot be scored: not this one"))
        .collect();
    assert_eq!(refused.len(), 1, "{calls:?}");
    let scored = calls.iter().filter(|c| c.delta.is_some()).count();
    assert!(scored > 0, "the other calls are scored: {calls:?}");
    let stats = &summary.tools[0].stats;
    assert_eq!(stats.calls_unscorable, 1);
    assert_eq!(stats.calls_scored, scored as u64);
    assert_eq!(summary.candidates_scored, scored as u64);
}

/// `Model`'s parts are checked together: one without the lm_head bias cannot be built (its fields
/// are private, so `from_parts` is the only way in), and the error names the tensor.
#[test]
fn a_model_without_the_lm_head_bias_is_refused() {
    let (config, mut weights, tokenizer) = model().into_parts();
    weights.lm_head.bias = None;
    let err = Model::from_parts(config, weights, tokenizer).err().unwrap();
    assert!(
        matches!(&err, Error::Tensor { tensor, .. } if tensor == "lm_head.bias"),
        "{err}"
    );
}
