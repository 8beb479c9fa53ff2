#![cfg(feature = "baselines")]
//! The candle baselines (feature `baselines`): the candle GPT-J against the float64 golden fixture,
//! and the three scorers against the f64 `ReferenceScorer` on the fixture's filter cases and on
//! random workloads that exercise what each baseline does differently (whole vs cut sequences,
//! deduplication, padding, gathered LM-head rows).
//!
//! Tolerances: the forward is held to the project's 1e-4 contract on log-probabilities; losses,
//! sums of up to five f32-computed log-probs, to 1e-3.

mod common;

use std::sync::Arc;

use candle_core::{Device, Tensor, D};
use common::{assert_close, cases, tiny};
use toolsift::baselines::gptj::right_padded_batch;
use toolsift::baselines::{
    naive_losses, naive_tokens, tuned_kv_losses, tuned_kv_tokens, tuned_losses, tuned_tokens,
    Baseline, BaselineScorer, CandleGptj,
};
use toolsift::model::DType;
use toolsift::score::LossWeights;
use toolsift::util::rng::Rng;
use toolsift::{
    GptjConfig, Model, Placement, ReferenceScorer, ScoreOptions, Scorer, TokenCandidate,
};

const FORWARD_TOL: f64 = 1e-4;
const LOSS_TOL: f64 = 1e-3;

fn candle_model(model: &Model) -> CandleGptj {
    CandleGptj::new(model.config(), model.weights()).unwrap()
}

/// log-softmax of the batch's logits as nested vectors: [B][T][vocab].
fn log_softmax(model: &CandleGptj, ids: &Tensor) -> Vec<Vec<Vec<f32>>> {
    let hidden = model.forward_hidden(ids).unwrap(); // [B, T, d]
    let logits = model.logits(&hidden).unwrap(); // [B, T, vocab]
    candle_nn::ops::log_softmax(&logits, D::Minus1)
        .unwrap()
        .to_vec3()
        .unwrap()
}

#[test]
fn candle_forward_matches_every_fixture_log_softmax_value() {
    let cases = cases();
    for variant in ["f32", "f16"] {
        let model = Model::load(tiny(variant)).unwrap();
        let candle = candle_model(&model);
        for case in &cases.forward {
            let ids = Tensor::new(case.ids.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap(); // [1, T]
            let got = &log_softmax(&candle, &ids)[0];
            assert_eq!(got.len(), case.ids.len());
            for (i, want_row) in case.log_softmax.iter().enumerate() {
                assert_eq!(got[i].len(), want_row.len());
                for (v, &want) in want_row.iter().enumerate() {
                    assert_close(
                        &format!("{variant} {:?} position {i} id {v}", case.name),
                        f64::from(got[i][v]),
                        want,
                        FORWARD_TOL,
                    );
                }
            }
        }
    }
}

/// All forward cases in one right-padded batch: the pads (after every real token) change nothing.
#[test]
fn candle_forward_right_padded_batch_matches_the_fixture() {
    let cases = cases();
    let model = Model::load(tiny("f32")).unwrap();
    let candle = candle_model(&model);
    let seqs: Vec<&[u32]> = cases.forward.iter().map(|c| c.ids.as_slice()).collect();
    let ids = right_padded_batch(&seqs, &Device::Cpu).unwrap();
    let longest = seqs.iter().map(|s| s.len()).max().unwrap();
    assert_eq!(ids.dims(), &[seqs.len(), longest]);
    let got = log_softmax(&candle, &ids);
    for (b, case) in cases.forward.iter().enumerate() {
        for (i, want_row) in case.log_softmax.iter().enumerate() {
            for (v, &want) in want_row.iter().enumerate() {
                assert_close(
                    &format!("batched {:?} position {i} id {v}", case.name),
                    f64::from(got[b][i][v]),
                    want,
                    FORWARD_TOL,
                );
            }
        }
    }
}

/// A forward continuing a kept cache gives the fixture's values at the continued positions, for a
/// right-padded batch of continuations sharing one cut of the cache; a cut past the cache, or a
/// kept cache of a batch, is refused.
#[test]
fn candle_forward_continuing_a_cache_matches_the_fixture() {
    let cases = cases();
    let model = Model::load(tiny("f32")).unwrap();
    let candle = candle_model(&model);
    for case in cases.forward.iter().filter(|c| c.ids.len() >= 4) {
        let n = case.ids.len();
        let ids = |s: &[u32]| right_padded_batch(&[s], &Device::Cpu).unwrap();
        let (_, cache) = candle
            .forward_cached(&ids(&case.ids[..n - 1]), None, true)
            .unwrap();
        let cache = cache.unwrap();
        assert_eq!(cache.len(), n - 1);
        assert!(cache.prefix(n).is_err());
        // Cut after 2 tokens; the rest, and a shorter continuation padded beside it.
        let past = cache.prefix(2).unwrap();
        let rest = &case.ids[2..];
        let batch = right_padded_batch(&[rest, &rest[..1]], &Device::Cpu).unwrap();
        let (hidden, kept) = candle.forward_cached(&batch, Some(&past), false).unwrap();
        assert!(kept.is_none());
        let got: Vec<Vec<Vec<f32>>> =
            candle_nn::ops::log_softmax(&candle.logits(&hidden).unwrap(), D::Minus1)
                .unwrap()
                .to_vec3()
                .unwrap();
        for (b, len) in [(0, rest.len()), (1, 1)] {
            for (i, row) in got[b].iter().take(len).enumerate() {
                for (v, &want) in case.log_softmax[2 + i].iter().enumerate() {
                    assert_close(
                        &format!("{:?} row {b} position {}", case.name, 2 + i),
                        f64::from(row[v]),
                        want,
                        FORWARD_TOL,
                    );
                }
            }
        }
        let err = candle
            .forward_cached(&batch, Some(&past), true)
            .unwrap_err();
        assert!(err.to_string().contains("not a batch of 2"), "{err}");
    }
}

fn options(placement: Placement) -> ScoreOptions {
    ScoreOptions {
        placement,
        weights: LossWeights::default(),
    }
}

/// The baselines at several batch sizes against the reference, every variant of every candidate.
fn check_baselines(model: &Model, candidates: &[TokenCandidate], what: &str) {
    let reference = ReferenceScorer::new(model);
    let candle = candle_model(model);
    for placement in [Placement::Prefix, Placement::Inline] {
        let options = options(placement);
        let want = reference.variant_losses(candidates, &options).unwrap();
        for batch_size in [1, 3, 64] {
            for (name, got) in [
                (
                    "naive",
                    naive_losses(&candle, candidates, &options, batch_size).unwrap(),
                ),
                (
                    "tuned",
                    tuned_losses(&candle, candidates, &options, batch_size).unwrap(),
                ),
                (
                    "tuned-kv",
                    tuned_kv_losses(&candle, candidates, &options, batch_size).unwrap(),
                ),
            ] {
                assert_eq!(got.len(), candidates.len());
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    for v in 0..3 {
                        assert_close(
                            &format!(
                                "{what} {name} {placement:?} batch {batch_size} candidate {k} \
                                 variant {v}"
                            ),
                            g[v],
                            w[v],
                            LOSS_TOL,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn baselines_match_the_reference_on_the_fixture_filter_cases() {
    let cases = cases();
    let model = Model::load(tiny("f32")).unwrap();
    let candidates: Vec<TokenCandidate> = cases
        .filter
        .iter()
        .map(|f| TokenCandidate {
            text_ids: f.text_ids.clone().into(),
            position: f.position,
            call_ids: f.call_ids.clone(),
            call_result_ids: f.call_result_ids.clone(),
            weights: Some(f.weights.clone()),
        })
        .collect();
    check_baselines(&model, &candidates, "fixture");
    // And the fixture's own numbers (prefix placement), through the Scorer trait.
    for baseline in [Baseline::Naive, Baseline::Tuned, Baseline::TunedKv] {
        let scorer = BaselineScorer::new(candle_model(&model), baseline, 4);
        let scores = scorer.score(&candidates, &ScoreOptions::default()).unwrap();
        for (f, s) in cases.filter.iter().zip(&scores) {
            let name = format!("{} {:?}", scorer.name(), f.text);
            assert_close(&format!("{name} L_none"), s.l_none, f.l_none, LOSS_TOL);
            assert_close(&format!("{name} L_call"), s.l_call, f.l_call, LOSS_TOL);
            assert_close(
                &format!("{name} L_call_result"),
                s.l_call_result,
                f.l_call_result,
                LOSS_TOL,
            );
            assert_close(&format!("{name} delta"), s.delta, f.delta, LOSS_TOL);
        }
    }
}

fn random_ids(rng: &mut Rng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|_| rng.range(0, vocab - 1) as u32).collect()
}

/// Texts with several candidates each, the call with result extending the call (as e(c, r) extends
/// e(c, eps)'s head), plus the awkward ones: windows cut by the end of the text, a duplicated
/// candidate, two calls at one position, weights of its own with a zero.
fn random_candidates(rng: &mut Rng, vocab: usize) -> Vec<TokenCandidate> {
    let mut out: Vec<TokenCandidate> = Vec::new();
    for _ in 0..4 {
        let n = rng.range(6, 30);
        let text: Arc<[u32]> = random_ids(rng, n, vocab).into();
        let candidate = |rng: &mut Rng, position: usize| {
            let (call_len, result_len) = (rng.range(1, 6), rng.range(1, 4));
            let call_ids = random_ids(rng, call_len, vocab);
            let mut call_result_ids = call_ids.clone();
            call_result_ids.extend(random_ids(rng, result_len, vocab));
            TokenCandidate {
                text_ids: text.clone(),
                position,
                call_ids,
                call_result_ids,
                weights: None,
            }
        };
        for _ in 0..rng.range(2, 4) {
            let position = rng.range(1, n - 1);
            out.push(candidate(rng, position));
        }
        out.push(candidate(rng, n - 2)); // two tokens left: the window is cut
        out.push(candidate(rng, n - 1)); // one token left
        let same_position = out.last().unwrap().position;
        out.push(candidate(rng, same_position)); // another call at the same position
        out.push(out[out.len() - 3].clone()); // a duplicate

        // Calls that share more than x_<i with the text, each bounding tuned-kv's cached part
        // its own way. One that begins as the text goes on (x_i, x_{i+1}): its first weighted
        // row and the text's cache both end at x_{n-1}.
        let mut echo = candidate(rng, n - 2);
        echo.call_ids = text[n - 2..].to_vec();
        echo.call_result_ids = [echo.call_ids.clone(), random_ids(rng, 2, vocab)].concat();
        // The same weighing only x_{i+1}: its first weighted row is past the cache's end.
        let late = TokenCandidate {
            weights: Some(vec![0.0, 1.0]),
            ..echo.clone()
        };
        // An empty call: e(c, eps) is the text itself, cut at its first weighted row.
        let position = rng.range(1, n - 2);
        let mut empty = candidate(rng, position);
        empty.call_ids.clear();
        out.extend([echo, late, empty]);
    }
    let mut own = out[0].clone();
    own.weights = Some(vec![0.5, 0.0, 0.25]);
    out.push(own);
    out
}

/// A candidate with nothing to measure (its only positive weight past the end of the text) is
/// refused by every scorer, the baselines as the engine, rather than given losses of 0.
#[test]
fn a_candidate_with_nothing_to_score_is_refused() {
    let config = GptjConfig::small(2, 48, 4, 8, 300);
    let model = common::random_model(&config, 3, DType::F32);
    let text: Arc<[u32]> = (0..20u32).collect::<Vec<_>>().into();
    let a = TokenCandidate {
        text_ids: text,
        position: 2,
        call_ids: vec![1],
        call_result_ids: vec![1, 2],
        weights: None,
    };
    let z = TokenCandidate {
        position: 18,
        weights: Some(vec![0.0, 0.0, 0.0, 1.0]),
        ..a.clone()
    };
    let (reference, candle) = (ReferenceScorer::new(&model), candle_model(&model));
    let both = [a, z];
    for placement in [Placement::Prefix, Placement::Inline] {
        let options = options(placement);
        let errors = [
            reference.variant_losses(&both, &options).map(drop),
            tuned_losses(&candle, &both, &options, 4).map(drop),
            tuned_kv_losses(&candle, &both, &options, 4).map(drop),
            naive_losses(&candle, &both, &options, 4).map(drop),
        ];
        for err in errors {
            let err = err.unwrap_err().to_string();
            assert!(
                err.contains("candidate 1: no positive weight falls on a text token"),
                "{placement:?}: {err}"
            );
        }
    }
}

#[test]
fn baselines_match_the_reference_on_a_random_model() {
    let config = GptjConfig::small(2, 48, 4, 8, 300);
    for seed in [1, 2] {
        let model = common::random_model(&config, seed, DType::F32);
        let mut rng = Rng::new(100 + seed);
        let candidates = random_candidates(&mut rng, config.vocab_size);
        check_baselines(&model, &candidates, &format!("seed {seed}"));
    }
}

/// A call of 2 tokens (ids 20, 21) whose result adds one (22), at `position` of the text
/// `text` (token ids in that range): the hand-worked candidates below.
fn call_at(text: std::ops::Range<u32>, position: usize) -> TokenCandidate {
    TokenCandidate {
        text_ids: text.collect::<Vec<_>>().into(),
        position,
        call_ids: vec![20, 21],
        call_result_ids: vec![20, 21, 22],
        weights: None,
    }
}

/// The counts the benchmark reports, worked by hand for a 10-token text, a call of 2 tokens and a
/// call with result of 3, candidates A (position 3), its duplicate, and C (position 8, cut).
#[test]
fn token_counts_include_padding_and_reflect_deduplication() {
    let a = call_at(0..10, 3);
    let c = TokenCandidate {
        position: 8,
        ..a.clone()
    };
    let candidates = [a.clone(), a, c];
    for placement in [Placement::Prefix, Placement::Inline] {
        let options = options(placement);
        // Naive: whole sequences of 10, 12 and 13 tokens per candidate, in input order.
        assert_eq!(naive_tokens(&candidates, &options, 1), 3 * 35);
        assert_eq!(naive_tokens(&candidates, &options, 3), 3 * (3 * 13));
        // Tuned: one no-call pass for the text, up to C's window (10); A's calls 10, 11 (its
        // duplicate shares them), C's calls 12, 13; each less its last token, only a target.
        assert_eq!(tuned_tokens(&candidates, &options, 1), 9 + 9 + 10 + 11 + 12);
        // Longest first: [12, 11, 10, 9] then [9].
        assert_eq!(tuned_tokens(&candidates, &options, 4), 4 * 12 + 9);
    }
    // Tuned-kv, inline: the text pass (9) with its cache kept; A's calls continue its first 3
    // tokens (suffixes of 6 and 7: the call, x_3 .. x_7, less the last), C's its first 8
    // (suffixes of 3 and 4). Prefix: no call variant shares the text's start, so the tuned
    // method's sequences, the calls in one batch across texts, the text pass on its own.
    let inline = options(Placement::Inline);
    assert_eq!(tuned_kv_tokens(&candidates, &inline, 1), 9 + 6 + 7 + 3 + 4);
    assert_eq!(tuned_kv_tokens(&candidates, &inline, 4), 9 + 2 * 7 + 2 * 4);
    let prefix = options(Placement::Prefix);
    assert_eq!(
        tuned_kv_tokens(&candidates, &prefix, 1),
        9 + 9 + 10 + 11 + 12
    );
    assert_eq!(tuned_kv_tokens(&candidates, &prefix, 4), 4 * 12 + 9);
}

#[test]
fn bad_input_is_refused_with_a_message() {
    let mut config = GptjConfig::small(1, 16, 2, 4, 50);
    config.n_positions = 12;
    let model = common::random_model(&config, 3, DType::F32);
    let candle = candle_model(&model);
    let options = ScoreOptions::default();
    let ok = TokenCandidate {
        text_ids: (0..8u32).collect::<Vec<_>>().into(),
        position: 2,
        call_ids: vec![1],
        call_result_ids: vec![1, 2],
        weights: None,
    };
    // No candidates: no losses, not an error.
    assert_eq!(
        naive_losses(&candle, &[], &options, 2).unwrap(),
        Vec::<[f64; 3]>::new()
    );
    assert_eq!(
        tuned_losses(&candle, &[], &options, 2).unwrap(),
        Vec::<[f64; 3]>::new()
    );
    assert_eq!(
        tuned_kv_losses(&candle, &[], &options, 2).unwrap(),
        Vec::<[f64; 3]>::new()
    );
    // The cut sequence (2 + 7) fits, the whole one (2 + 8) does too.
    assert!(naive_losses(&candle, std::slice::from_ref(&ok), &options, 2).is_ok());
    let long_call = TokenCandidate {
        call_result_ids: vec![1, 2, 3, 4, 5],
        ..ok.clone()
    };
    // 5 + 7 = 12 fits the engine's cut sequence; 5 + 8 = 13 does not fit the naive whole one.
    assert!(tuned_losses(&candle, std::slice::from_ref(&long_call), &options, 2).is_ok());
    assert!(tuned_kv_losses(&candle, std::slice::from_ref(&long_call), &options, 2).is_ok());
    let err = naive_losses(&candle, &[ok.clone(), long_call], &options, 2).unwrap_err();
    assert!(
        err.to_string().contains("candidate 1") && err.to_string().contains("n_positions"),
        "{err}"
    );
    let bad_id = TokenCandidate {
        call_ids: vec![50],
        ..ok.clone()
    };
    for result in [
        naive_losses(&candle, std::slice::from_ref(&bad_id), &options, 2),
        tuned_losses(&candle, std::slice::from_ref(&bad_id), &options, 2),
        tuned_kv_losses(&candle, std::slice::from_ref(&bad_id), &options, 2),
    ] {
        let err = result.unwrap_err().to_string();
        assert!(err.contains("call_ids[0] = 50"), "{err}");
    }
    let err = tuned_losses(&candle, std::slice::from_ref(&ok), &options, 0).unwrap_err();
    assert!(err.to_string().contains("batch_size"), "{err}");
    let err = tuned_kv_losses(&candle, &[ok], &options, 0).unwrap_err();
    assert!(err.to_string().contains("batch_size"), "{err}");
}

/// `toolsift bench` end to end on a small model: warm-ups, rounds, and figures that agree with
/// each other (each ratio the median of its rounds', the rounds' count, the work counted). More
/// rounds than baseline rounds: the baselines run in the first `baseline_reps` only, and an even
/// count of them has the mean of the middle two for its median.
#[test]
fn bench_reports_per_round_ratios_that_agree_with_its_figures() {
    use toolsift::backend::Device;
    use toolsift::bench::{run, BenchArgs};
    let config = GptjConfig::small(2, 64, 4, 16, 512);
    let report = run(&BenchArgs {
        placement: Placement::Inline,
        config: config.clone(),
        n_texts: 1,
        seed: 3,
        reps: 3,
        baseline_reps: 2,
        batch_size: 8,
        run_baselines: true,
        device: Device::Cpu,
        model_dir: None,
    })
    .unwrap();
    assert_eq!(report.candidates, 25);
    assert_eq!(report.rounds, 3, "max(reps, baseline_reps)");
    assert_eq!(
        report.speedup_rounds.len(),
        2,
        "the first baseline_reps rounds"
    );
    assert_eq!(report.speedup_vs_tuned_rounds.len(), 2);
    let median = |r: &[f64]| (r[0] + r[1]) / 2.0;
    assert_eq!(report.speedup, Some(median(&report.speedup_rounds)));
    assert_eq!(
        report.speedup_vs_tuned,
        Some(median(&report.speedup_vs_tuned_rounds))
    );
    assert_eq!(report.speedup_vs_tuned_kv_rounds.len(), 2);
    // Each baseline's seconds are the median of its own rounds' (the first of each pair), and
    // its candidates per second are over those.
    for (secs, cands_per_s, pairs) in [
        (
            report.tuned_secs,
            report.tuned_cands_per_s,
            &report.tuned_round_secs,
        ),
        (
            report.baseline_secs,
            report.baseline_cands_per_s,
            &report.baseline_round_secs,
        ),
        (
            report.tuned_kv_secs,
            report.tuned_kv_cands_per_s,
            &report.tuned_kv_round_secs,
        ),
    ] {
        let own = pairs.iter().map(|[b, _]| *b).collect::<Vec<_>>();
        assert_eq!(secs, Some(median(&own)), "{pairs:?}");
        assert_eq!(cands_per_s, Some(25.0 / secs.unwrap()));
    }
    assert_eq!(
        report.speedup_vs_tuned_kv,
        Some(median(&report.speedup_vs_tuned_kv_rounds))
    );
    assert!(report.tuned_kv_tokens > 0 && report.tuned_kv_cands_per_s.is_some());
    assert!(report.max_abs_diff.unwrap() < LOSS_TOL);
    let per_token = config.trunk_flops_per_token();
    let whole = report.unique_tokens as f64 * per_token
        / report.toolsift_secs
        / 1e9
        / report.gemm_gflops_peak;
    assert!((report.whole_run_fraction_of_peak - whole).abs() <= 1e-9 * whole);
    let tuned = report.tuned_tokens as f64 * per_token
        / report.tuned_secs.unwrap()
        / 1e9
        / report.gemm_gflops_peak;
    assert!((report.tuned_fraction_of_peak.unwrap() - tuned).abs() <= 1e-9 * tuned);
    // The head runs on deduplicated weighted rows: fewer than the 25 x 3 x 5 targets.
    assert!(report.head_rows > 0 && report.head_rows < 25 * 15);
    assert!(report.head_gflops > 0.0);
    // Every ratio can be checked from the raw seconds the report carries.
    for (pairs, ratios) in [
        (&report.tuned_round_secs, &report.speedup_vs_tuned_rounds),
        (&report.baseline_round_secs, &report.speedup_rounds),
        (
            &report.tuned_kv_round_secs,
            &report.speedup_vs_tuned_kv_rounds,
        ),
    ] {
        assert_eq!(pairs.len(), ratios.len());
        for ([b, t], r) in pairs.iter().zip(ratios) {
            assert_eq!(b / t, *r);
        }
    }
    assert!(report.baseline_threads.is_some_and(|n| n >= 1));
    assert!(!report.toolsift_version.is_empty() && report.unix_time > 0);
    if cfg!(target_os = "linux") {
        assert!(report.load_average.is_some());
    }
}

/// A run whose comparison would mean nothing is refused before any work: baselines in no round,
/// or against the GPU engine (they run on the CPU).
#[test]
fn bench_refuses_comparisons_that_mean_nothing() {
    use toolsift::backend::Device;
    use toolsift::bench::{run, BenchArgs};
    let args = BenchArgs {
        placement: Placement::Prefix,
        config: GptjConfig::small(1, 16, 2, 4, 64),
        n_texts: 1,
        seed: 3,
        reps: 1,
        baseline_reps: 0,
        batch_size: 8,
        run_baselines: true,
        device: Device::Cpu,
        model_dir: None,
    };
    let err = run(&args).unwrap_err().to_string();
    assert!(err.contains("baseline_reps is 0"), "{err}");
    let err = run(&BenchArgs {
        baseline_reps: 1,
        device: Device::Cuda,
        ..args.clone()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("--skip-baselines"), "{err}");
    // Without baselines, baseline_reps adds no rounds, and 0 reps is still one round.
    let alone = run(&BenchArgs {
        run_baselines: false,
        reps: 0,
        baseline_reps: 3,
        ..args
    })
    .unwrap();
    assert!(alone.speedup.is_none());
    assert_eq!(alone.rounds, 1);
    assert!(alone.toolsift_secs > 0.0 && alone.toolsift_cands_per_s.is_finite());
}

// From the hand mutation review of src/baselines/ (session 49).

/// A small random model (2 layers, head_dim 12, rotary 8) with `n_positions` positions and
/// layer-norm epsilon `eps`, as toolsift's `Model` and the candle copy of it.
fn small_model(n_positions: usize, eps: f64) -> (Model, CandleGptj) {
    let mut config = GptjConfig::small(2, 48, 4, 8, 300);
    config.n_positions = n_positions;
    config.layer_norm_epsilon = eps;
    let model = common::random_model(&config, 5, DType::F32);
    let candle = candle_model(&model);
    (model, candle)
}

/// Two calls on one 12-token text, at positions 3 and 6: in inline placement the tuned and the
/// tuned-kv baselines run different sequences (so different counts and rounding).
fn two_calls_on_one_text() -> Vec<TokenCandidate> {
    let a = call_at(40..52, 3);
    let b = TokenCandidate {
        position: 6,
        ..a.clone()
    };
    vec![a, b]
}

/// A `BaselineScorer` is the baseline it names: its name, its token count and its losses (to the
/// bit: the same candle code) are that baseline's, not another's.
#[test]
fn a_baseline_scorer_runs_counts_and_names_its_own_baseline() {
    let (_, candle) = small_model(2048, 1e-5);
    let candidates = two_calls_on_one_text();
    let inline = options(Placement::Inline);
    type Losses = fn(&CandleGptj, &[TokenCandidate], &ScoreOptions, usize) -> Vec<[f64; 3]>;
    type Tokens = fn(&[TokenCandidate], &ScoreOptions, usize) -> usize;
    let own: [(Baseline, &str, Losses, Tokens); 3] = [
        (
            Baseline::Naive,
            "candle-naive",
            |m, c, o, b| naive_losses(m, c, o, b).unwrap(),
            naive_tokens,
        ),
        (
            Baseline::Tuned,
            "candle-tuned",
            |m, c, o, b| tuned_losses(m, c, o, b).unwrap(),
            tuned_tokens,
        ),
        (
            Baseline::TunedKv,
            "candle-tuned-kv",
            |m, c, o, b| tuned_kv_losses(m, c, o, b).unwrap(),
            tuned_kv_tokens,
        ),
    ];
    // The three counts differ, so a scorer counting another baseline's work is seen.
    let counts: Vec<usize> = own.iter().map(|o| o.3(&candidates, &inline, 2)).collect();
    assert!(
        counts[0] != counts[1] && counts[1] != counts[2],
        "{counts:?}"
    );
    for (baseline, name, losses, tokens) in own {
        let scorer = BaselineScorer::new(candle.clone(), baseline, 2);
        assert_eq!(scorer.name(), name);
        assert_eq!(
            scorer.tokens(&candidates, &inline),
            tokens(&candidates, &inline, 2),
            "{name}"
        );
        let got = scorer.variant_losses(&candidates, &inline).unwrap();
        assert_eq!(got, losses(&candle, &candidates, &inline, 2), "{name}");
    }
}

/// n_positions is a limit, not one past it: the naive baseline runs call + whole text of exactly
/// n_positions tokens (and gets the reference's losses); one more is refused with the lengths,
/// by every baseline (the tuned ones through the engine's cut-sequence check), and a forward
/// past n_positions is refused with a message rather than failing inside candle.
#[test]
fn sequences_of_exactly_n_positions_run_and_longer_ones_are_refused_clearly() {
    let (model, candle) = small_model(12, 1e-5);
    let options = ScoreOptions::default();
    let fits = TokenCandidate {
        text_ids: (0..8u32).collect::<Vec<_>>().into(),
        position: 2,
        call_ids: vec![1],
        call_result_ids: vec![1, 2, 3, 4], // 4 + 8 = 12 whole; 4 + 7 = 11 cut
        weights: None,
    };
    toolsift::baselines::check_whole_texts_fit(candle.config(), std::slice::from_ref(&fits))
        .unwrap();
    let want = ReferenceScorer::new(&model)
        .variant_losses(std::slice::from_ref(&fits), &options)
        .unwrap();
    let got = naive_losses(&candle, std::slice::from_ref(&fits), &options, 1).unwrap();
    for v in 0..3 {
        assert_close(&format!("variant {v}"), got[0][v], want[0][v], LOSS_TOL);
    }
    let whole_too_long = TokenCandidate {
        call_result_ids: vec![1, 2, 3, 4, 5],
        ..fits.clone()
    };
    let err = naive_losses(&candle, &[whole_too_long], &options, 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("candidate 0") && err.contains("13 tokens") && err.contains("(12)"),
        "{err}"
    );
    let cut_too_long = TokenCandidate {
        call_result_ids: vec![1, 2, 3, 4, 5, 6], // 6 + 7 = 13 cut
        ..fits
    };
    for result in [
        naive_losses(&candle, std::slice::from_ref(&cut_too_long), &options, 1),
        tuned_losses(&candle, std::slice::from_ref(&cut_too_long), &options, 1),
        tuned_kv_losses(&candle, std::slice::from_ref(&cut_too_long), &options, 1),
    ] {
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("candidate 0") && err.contains("n_positions"),
            "{err}"
        );
    }
    let ids = |n: u32| right_padded_batch(&[&(0..n).collect::<Vec<_>>()[..]], &Device::Cpu);
    let hidden = candle.forward_hidden(&ids(12).unwrap()).unwrap();
    assert_eq!(hidden.dims(), &[1, 12, 48]);
    let err = candle.forward_hidden(&ids(13).unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .contains("sequence of 13 tokens is longer than n_positions (12)"),
        "{err}"
    );
}

/// Pads are token 0 (as documented), after each sequence's own tokens.
#[test]
fn right_padded_batch_pads_with_token_0_after_each_sequence() {
    let batch = right_padded_batch(&[&[5, 6, 7], &[8], &[]], &Device::Cpu).unwrap();
    assert_eq!(
        batch.to_vec2::<u32>().unwrap(),
        vec![vec![5, 6, 7], vec![8, 0, 0], vec![0, 0, 0]]
    );
}

/// A cache kept while continuing another holds both (its length past + T, and their keys), so a
/// third forward continuing it gives the fixture's values.
#[test]
fn a_cache_kept_over_a_cache_is_continued_where_it_ends() {
    let cases = cases();
    let model = Model::load(tiny("f32")).unwrap();
    let candle = candle_model(&model);
    let case = cases.forward.iter().find(|c| c.ids.len() >= 5).unwrap();
    let n = case.ids.len();
    let ids = |s: &[u32]| right_padded_batch(&[s], &Device::Cpu).unwrap();
    let (_, first) = candle
        .forward_cached(&ids(&case.ids[..2]), None, true)
        .unwrap();
    let first = first.unwrap();
    let (_, both) = candle
        .forward_cached(&ids(&case.ids[2..n - 1]), Some(&first), true)
        .unwrap();
    let both = both.unwrap();
    assert_eq!(both.len(), n - 1);
    let (hidden, _) = candle
        .forward_cached(&ids(&case.ids[n - 1..]), Some(&both), false)
        .unwrap();
    let got: Vec<Vec<Vec<f32>>> =
        candle_nn::ops::log_softmax(&candle.logits(&hidden).unwrap(), D::Minus1)
            .unwrap()
            .to_vec3()
            .unwrap();
    for (v, &want) in case.log_softmax[n - 1].iter().enumerate() {
        assert_close(
            &format!("{:?} position {} id {v}", case.name, n - 1),
            f64::from(got[0][0][v]),
            want,
            FORWARD_TOL,
        );
    }
}

/// The candle model takes the config's layer-norm epsilon (the fixtures all use 1e-5): with
/// eps = 1 its losses are still the reference's.
#[test]
fn the_candle_model_uses_the_configs_layer_norm_epsilon() {
    let (model, candle) = small_model(2048, 1.0);
    let candidates = two_calls_on_one_text();
    let options = ScoreOptions::default();
    let want = ReferenceScorer::new(&model)
        .variant_losses(&candidates, &options)
        .unwrap();
    let got = tuned_losses(&candle, &candidates, &options, 4).unwrap();
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        for v in 0..3 {
            assert_close(&format!("candidate {k} variant {v}"), g[v], w[v], LOSS_TOL);
        }
    }
}

/// In prefix placement no call variant shares the text's start, so tuned-kv runs them as the
/// tuned baseline does: deduplicated and batched across texts, longest first. Two texts (8 of
/// each in the window), a call of 2 and a call with result of 3 at position 3 of each: the text
/// passes 7 + 7; the calls [10, 10] [9, 9] in batches of 2 (per text, or unsorted: 2 x (10 + 10)).
#[test]
fn tuned_kv_in_prefix_placement_batches_call_variants_across_texts_longest_first() {
    let a = call_at(40..50, 3);
    let b = TokenCandidate {
        text_ids: (60..70u32).collect::<Vec<_>>().into(),
        ..a.clone()
    };
    let prefix = options(Placement::Prefix);
    assert_eq!(
        tuned_kv_tokens(&[a.clone(), b.clone()], &prefix, 2),
        7 + 7 + 20 + 18
    );
    assert_eq!(tuned_tokens(&[a, b], &prefix, 2), 20 + 18 + 14);
}

// From the second hand mutation review of src/baselines/.

/// A forward continuing a cache counts the cache's positions against n_positions: 10 cached and
/// 2 more fit 12, 3 more are refused with the message (not a failure inside candle's rotary
/// tables). A cache is empty only when it holds no position, and its every prefix, up to the
/// whole of it, can be taken.
#[test]
fn a_cached_forward_counts_the_cache_against_n_positions() {
    let (_, candle) = small_model(12, 1e-5);
    let ids = |r: std::ops::Range<u32>| {
        right_padded_batch(&[&r.collect::<Vec<_>>()[..]], &Device::Cpu).unwrap()
    };
    let (_, cache) = candle.forward_cached(&ids(7..17), None, true).unwrap();
    let cache = cache.unwrap();
    assert!(!cache.is_empty());
    assert!(cache.prefix(0).unwrap().is_empty());
    assert_eq!(cache.prefix(10).unwrap().len(), 10);
    let (hidden, _) = candle
        .forward_cached(&ids(17..19), Some(&cache), false)
        .unwrap();
    assert_eq!(hidden.dims(), &[1, 2, 48]);
    let err = candle
        .forward_cached(&ids(17..20), Some(&cache), false)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("sequence of 13 tokens is longer than n_positions (12)"),
        "{err}"
    );
}

/// Rotary over none of a head (rotary_dim 0, which a config may say) and over the whole head
/// (12 of 12) each take their own path through the candle model's rotary: both still give the
/// reference's losses, in either placement.
#[test]
fn the_candle_model_matches_the_reference_with_rotary_over_none_or_all_of_a_head() {
    for rotary in [0, 12] {
        let config = GptjConfig::small(2, 48, 4, rotary, 300);
        let model = common::random_model(&config, 7, DType::F32);
        let candle = candle_model(&model);
        let candidates = two_calls_on_one_text();
        for placement in [Placement::Prefix, Placement::Inline] {
            let options = options(placement);
            let want = ReferenceScorer::new(&model)
                .variant_losses(&candidates, &options)
                .unwrap();
            let got = tuned_kv_losses(&candle, &candidates, &options, 2).unwrap();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                for v in 0..3 {
                    let what = format!("rotary {rotary} {placement:?} candidate {k} variant {v}");
                    assert_close(&what, g[v], w[v], LOSS_TOL);
                }
            }
        }
    }
}
