//! `toolsift score` end to end: the fixture's filter cases as token-level and text-level JSONL, and
//! one test per kind of bad line (each must be answered by an error line naming the problem).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{assert_close, cases, tiny};
use serde_json::{json, Value};

fn run_score(model: &Path, lines: &[Value], extra: &[&str]) -> (bool, Vec<Value>, String) {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    run_score_raw(model, &input, &output, extra)
}

fn run_score_raw(
    model: &Path,
    input: &Path,
    output: &Path,
    extra: &[&str],
) -> (bool, Vec<Value>, String) {
    let (ok, stderr) = run_score_unread(model, input, output, extra);
    let results = std::fs::read_to_string(output)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (ok, results, stderr)
}

/// Runs `score` and returns its success and stderr, leaving the output unread (it may hold
/// anything: a test's file that is no output).
fn run_score_unread(model: &Path, input: &Path, output: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["score", "--model"])
        .arg(model)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stderr)
}

fn token_lines() -> Vec<Value> {
    cases()
        .filter
        .iter()
        .enumerate()
        .map(|(k, f)| {
            json!({
                "id": format!("case-{k}"), "text_ids": f.text_ids, "position": f.position,
                "call_ids": f.call_ids, "call_result_ids": f.call_result_ids, "weights": f.weights,
            })
        })
        .collect()
}

#[test]
fn token_level_filter_cases_reproduce_the_fixture() {
    let (ok, results, stderr) = run_score(&tiny("f32"), &token_lines(), &["--tau-f", "0.5"]);
    assert!(ok, "{stderr}");
    let cases = cases();
    assert_eq!(results.len(), cases.filter.len());
    for (k, (r, f)) in results.iter().zip(&cases.filter).enumerate() {
        assert_eq!(r["id"], format!("case-{k}"));
        for (field, want) in [
            ("l_none", f.l_none),
            ("l_call", f.l_call),
            ("l_call_result", f.l_call_result),
            ("l_minus", f.l_minus),
            ("l_plus", f.l_plus),
            ("delta", f.delta),
        ] {
            assert_close(
                &format!("case {k} {field}"),
                r[field].as_f64().unwrap(),
                want,
                1e-4,
            );
        }
        assert_eq!(r["kept"], json!(f.delta >= 0.5));
    }
}

#[test]
fn text_level_lines_with_bare_calls_reproduce_the_fixture() {
    let model = toolsift::Model::load(tiny("f32")).unwrap();
    let tok = model.tokenizer().unwrap();
    let cases = cases();
    let lines: Vec<Value> = cases
        .filter
        .iter()
        .map(|f| {
            let offset = tok.decode(&f.text_ids[..f.position]).unwrap().len();
            let inner = f.call.trim().trim_start_matches('[').trim_end_matches(']');
            let (tool, rest) = inner.split_once('(').unwrap();
            let input = rest.trim_end_matches(')');
            let result = f
                .call_result
                .trim()
                .trim_end_matches(']')
                .rsplit_once("-> ")
                .unwrap()
                .1;
            json!({"id": f.text, "text": f.text, "position": offset, "tool": tool,
                   "input": input, "result": result, "weights": f.weights})
        })
        .collect();
    let (ok, results, stderr) = run_score(&tiny("f32"), &lines, &["--call-form", "bare"]);
    assert!(ok, "{stderr}");
    for (r, f) in results.iter().zip(&cases.filter) {
        assert_close(&f.text, r["delta"].as_f64().unwrap(), f.delta, 1e-4);
    }
}

/// A line's own "tau_f" wins over --tau-f, and a delta equal to tau_f is kept (`>=`, as in the
/// paper): the fixture's deltas given back as thresholds keep every call, and a hair above
/// drops it.
#[test]
fn a_lines_tau_f_wins_and_a_delta_equal_to_it_is_kept() {
    let cases = cases();
    let (ok, first, stderr) = run_score(&tiny("f32"), &token_lines(), &["--reference"]);
    assert!(ok, "{stderr}");
    let lines: Vec<Value> = token_lines()
        .into_iter()
        .zip(&first)
        .flat_map(|(line, r)| {
            let delta = r["delta"].as_f64().unwrap();
            let above = delta + delta.abs().max(1.0) * 1e-12;
            [delta, above].map(|tau| {
                let mut l = line.clone();
                l["tau_f"] = json!(tau);
                l
            })
        })
        .collect();
    // --tau-f says keep everything; each line says otherwise.
    let (ok, results, stderr) =
        run_score(&tiny("f32"), &lines, &["--reference", "--tau-f", "-1e9"]);
    assert!(ok, "{stderr}");
    assert_eq!(results.len(), 2 * cases.filter.len());
    for (k, pair) in results.chunks(2).enumerate() {
        assert_eq!(pair[0]["delta"], first[k]["delta"], "case {k}: same scores");
        assert_eq!(
            pair[0]["kept"],
            json!(true),
            "case {k}: delta == tau_f is kept"
        );
        assert_eq!(pair[1]["kept"], json!(false), "case {k}: tau_f above delta");
    }
}

#[test]
fn a_line_both_token_and_text_level_is_an_error() {
    let mut both = token_lines()[1].clone();
    both["text"] = json!("Out of 1400 participants");
    assert_bad_line(both, "not both");
}

/// Runs one good line and one bad line; the bad one must get an error line naming `needle`, the
/// good one its scores, and the process must exit non-zero.
fn assert_bad_line(bad: Value, needle: &str) {
    let good = token_lines()[0].clone();
    let (ok, results, _) = run_score(&tiny("f32"), &[good, bad], &[]);
    assert!(!ok, "a failed line must make the exit status non-zero");
    assert_eq!(results.len(), 2, "every input line gets an output line");
    assert!(results[0]["delta"].is_f64());
    let err = results[1]["error"].as_str().expect("error line");
    assert!(
        err.contains(needle),
        "error {err:?} should mention {needle:?}"
    );
    assert!(err.contains("line 2"), "error {err:?} should name the line");
    assert_eq!(results[1]["line"], 2);
}

#[test]
fn malformed_json_line() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    std::fs::write(
        &input,
        format!("{}\n{{\"id\": 1, \"text_ids\": [1,\n", token_lines()[0]),
    )
    .unwrap();
    let (ok, results, _) = run_score_raw(&tiny("f32"), &input, &output, &[]);
    assert!(!ok);
    assert_eq!(results.len(), 2);
    assert!(results[1]["error"]
        .as_str()
        .unwrap()
        .contains("malformed JSON"));
}

#[test]
fn invalid_utf8_line_fails_alone() {
    // A byte order mark before line 1, CRLF endings, and a line that is not UTF-8 between two
    // good ones: every line gets its output line, in order.
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    let good = token_lines()[0].to_string();
    let mut bytes = b"\xef\xbb\xbf".to_vec();
    bytes.extend(format!("{good}\r\n").bytes());
    bytes.extend(b"{\"id\": \"\xff\"}\r\n");
    bytes.extend(format!("{good}\n").bytes());
    std::fs::write(&input, bytes).unwrap();
    let (ok, results, _) = run_score_raw(&tiny("f32"), &input, &output, &[]);
    assert!(!ok);
    assert_eq!(results.len(), 3);
    assert!(results[0]["delta"].is_f64() && results[2]["delta"].is_f64());
    let err = results[1]["error"].as_str().unwrap();
    assert!(err.contains("line 2") && err.contains("not UTF-8"), "{err}");
}

/// A byte order mark starting a line other than line 1 (files joined with `cat`) is that line's
/// error, called what it is, not "expected value at line 1 column 1".
#[test]
fn a_byte_order_mark_past_line_1_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    let good = token_lines()[0].to_string();
    let mut bytes = format!("{good}\n").into_bytes();
    bytes.extend(b"\xef\xbb\xbf");
    bytes.extend(format!("{good}\n{good}\n").bytes());
    std::fs::write(&input, bytes).unwrap();
    let (ok, results, _) = run_score_raw(&tiny("f32"), &input, &output, &[]);
    assert!(!ok);
    assert_eq!(results.len(), 3);
    assert!(results[0]["delta"].is_f64() && results[2]["delta"].is_f64());
    assert_eq!(results[1]["line"], 2);
    let err = results[1]["error"].as_str().unwrap();
    assert!(
        err.starts_with("line 2: the line starts with a UTF-8 byte order mark")
            && !err.contains("column"),
        "{err}"
    );
}

/// A copy of the tiny f32 model under `parent` ("model"), with `tokenizer` as its tokenizer.json.
fn tiny_with_tokenizer(parent: &Path, tokenizer: &str) -> PathBuf {
    let dir = parent.join("model");
    std::fs::create_dir(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(tiny("f32").join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
    dir
}

/// Token-level lines need no tokenizer: a tokenizer.json that does not load fails the text-level
/// lines alone, each naming the file and why, after a warning; token-level input alone passes.
#[test]
fn a_tokenizer_that_does_not_load_fails_only_text_level_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_with_tokenizer(tmp.path(), r#"{"not": "a tokenizer"}"#);
    let (ok, results, stderr) = run_score(&dir, &token_lines(), &[]);
    assert!(ok, "{stderr}");
    assert_eq!(results.len(), token_lines().len());
    assert!(results.iter().all(|r| r["delta"].is_f64()), "{results:?}");
    assert!(
        stderr.contains("warning: tokenizer") && stderr.contains("not a Hugging Face tokenizer"),
        "{stderr}"
    );
    let text = json!({"id": "t", "text": "Out of 1400 participants, 400 passed", "position": 13,
                      "tool": "Calculator", "input": "400 / 1400", "result": "0.29"});
    let (ok, results, _) = run_score(&dir, &[token_lines()[0].clone(), text], &[]);
    assert!(!ok);
    assert!(results[0]["delta"].is_f64());
    let err = results[1]["error"].as_str().unwrap();
    let path = dir.join("tokenizer.json").display().to_string();
    assert!(
        err.starts_with("line 2: text-level line, but the model's tokenizer did not load")
            && err.contains(&path)
            && err.contains("not a Hugging Face tokenizer"),
        "{err}"
    );
}

/// A tokenizer.json that panics the tokenizers crate is reported once, as toolsift's warning:
/// no "panicked at" from the crate before it, which would read as a crash.
#[test]
fn a_tokenizer_that_panics_the_tokenizers_crate_is_reported_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let mut tokenizer: Value =
        serde_json::from_slice(&std::fs::read(tiny("f32").join("tokenizer.json")).unwrap())
            .unwrap();
    tokenizer["normalizer"] = json!({"type": "Precompiled", "precompiled_charsmap": 5});
    let dir = tiny_with_tokenizer(tmp.path(), &tokenizer.to_string());
    let (ok, results, stderr) = run_score(&dir, &token_lines()[..1], &[]);
    assert!(ok, "{stderr}");
    assert_eq!(results.len(), 1);
    assert!(
        stderr.contains("warning: tokenizer") && stderr.contains("the tokenizers crate failed"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A key held twice (which of the two would count?), a blank line and a field of the wrong type:
/// each is its line's error, naming the key, between good lines that are scored.
#[test]
fn duplicate_keys_blank_lines_and_wrong_types_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    let good = token_lines()[0].to_string();
    let open = good.strip_suffix('}').unwrap();
    let text = r#""text": "Out of 1400 participants, 400 (or 29%) passed the test.""#;
    let lines = [
        good.clone(),
        format!(r#"{open}, "weights": [1]}}"#),
        format!(
            r#"{{"id": "t", {text}, "position": 33, "tool": "Calculator", "input": "400 / 1400", "result": "0.29", "text": ""}}"#
        ),
        "  ".into(),
        format!(
            r#"{{"id": "p", {text}, "position": "33", "tool": "Calculator", "input": "400 / 1400", "result": "0.29"}}"#
        ),
        good,
    ];
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let (ok, results, _) = run_score_raw(&tiny("f32"), &input, &output, &[]);
    assert!(!ok);
    assert_eq!(results.len(), 6);
    assert!(results[0]["delta"].is_f64() && results[5]["delta"].is_f64());
    let error = |k: usize| {
        (
            results[k]["id"].clone(),
            results[k]["error"].as_str().unwrap(),
        )
    };
    assert_eq!(
        error(1),
        (json!("case-0"), "line 2: duplicate key \"weights\"")
    );
    assert_eq!(error(2), (json!("t"), "line 3: duplicate key \"text\""));
    assert_eq!(error(3), (Value::Null, "line 4: blank line"));
    assert_eq!(
        error(4),
        (
            json!("p"),
            "line 5: bad text-level line: field \"position\": invalid type: string \"33\", expected usize"
        )
    );
}

#[test]
fn overflowing_weights_are_an_error_not_null_scores() {
    // Weights that overflow their own sum are refused as such; one that overflows only times
    // a loss (the tiny model's cross-entropy is above 1.8) makes the loss not finite.
    let mut bad = token_lines()[0].clone();
    bad["weights"] = json!([1e308, 1e308]);
    assert_bad_line(bad.clone(), "past the largest f64");
    bad["weights"] = json!([1e308]);
    assert_bad_line(bad, "not finite");
    let (ok, _, stderr) = run_score(&tiny("f32"), &token_lines(), &["--tau-f", "NaN"]);
    assert!(!ok && stderr.contains("finite"), "{stderr}");
}

#[test]
fn position_off_a_token_boundary() {
    let text = "Out of 1400 participants, 400 (or 29%) passed the test.";
    assert_bad_line(
        json!({"id": "x", "text": text, "position": 14, "tool": "Calculator",
               "input": "400 / 1400", "result": "0.29"}),
        "falls inside token",
    );
}

#[test]
fn position_out_of_range() {
    let mut bad = token_lines()[0].clone();
    bad["position"] = json!(16);
    assert_bad_line(bad, "position 16 is out of range");
    let text = "Out of 1400 participants.";
    assert_bad_line(
        json!({"id": "x", "text": text, "position": 400, "tool": "Calculator",
               "input": "1", "result": "1"}),
        "position 400",
    );
}

#[test]
fn position_zero_has_no_context() {
    let mut bad = token_lines()[0].clone();
    bad["position"] = json!(0);
    assert_bad_line(bad, "position 0 cannot be scored");
}

#[test]
fn ids_outside_the_vocabulary() {
    let mut bad = token_lines()[0].clone();
    bad["call_ids"][3] = json!(512);
    assert_bad_line(
        bad,
        "call_ids[3] = 512 is outside the vocabulary (vocab_size 512)",
    );
}

/// A text-level line whose tokenizer gives ids the model has no row for blames the tokenizer,
/// not a "text_ids" the line never wrote.
#[test]
fn a_tokenizer_with_more_ids_than_the_model_is_named() {
    let mut tokenizer: Value =
        serde_json::from_slice(&std::fs::read(tiny("f32").join("tokenizer.json")).unwrap())
            .unwrap();
    for id in tokenizer["model"]["vocab"]
        .as_object_mut()
        .unwrap()
        .values_mut()
    {
        *id = json!(id.as_u64().unwrap() + 10_000);
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_with_tokenizer(tmp.path(), &tokenizer.to_string());
    let text = json!({"id": "t", "text": "Out of 1400 participants, 400 passed", "position": 24,
                      "tool": "Calculator", "input": "400 / 1400", "result": "0.29"});
    let (ok, results, stderr) = run_score(&dir, &[text], &[]);
    assert!(!ok, "{stderr}");
    let err = results[0]["error"].as_str().unwrap();
    assert!(
        err.contains("is outside the vocabulary (vocab_size 512)")
            && err.contains("the tokenizer has more ids than the model")
            && !err.contains("text_ids"),
        "{err}"
    );
}

#[test]
fn sequence_longer_than_n_positions() {
    let mut bad = token_lines()[0].clone();
    let text: Vec<u32> = (0..300).map(|k| (k * 7 % 499) as u32).collect();
    bad["text_ids"] = json!(text);
    bad["position"] = json!(290);
    assert_bad_line(bad, "longer than n_positions (256)");
}

/// A text-level line that cannot fit the model is refused after at most n_positions + 1 tokens
/// of its call or text are tokenized: a 16 MiB input was tokenized whole (about 3 GB) before
/// the sequence was found too long.
#[test]
fn text_level_line_longer_than_n_positions_is_refused_unread() {
    let text = "Out of 1400 participants, 400 (or 29%) passed the test.";
    let line = |text: &str, position: usize, input: &str| {
        json!({"id": 7, "text": text, "position": position, "tool": "Calculator",
               "input": input, "result": "0.29"})
    };
    let huge_input = format!("{}1", "1 + ".repeat(4 << 20));
    let at = text.find(" 29%").unwrap();
    assert_bad_line(
        line(text, at, &huge_input),
        "is longer than the model's n_positions (256) tokens",
    );
    let long_text = format!("{}end.", "word ".repeat(1 << 20));
    assert_bad_line(
        line(&long_text, long_text.len() - 5, "400 / 1400"),
        "is past the first n_positions (256) tokens of the text",
    );
}

#[test]
fn line_of_neither_kind_and_bad_fields() {
    assert_bad_line(json!({"id": 3, "foo": 1}), "neither a token-level line");
    assert_bad_line(json!({"id": 3, "text_ids": "abc"}), "bad token-level line");
    assert_bad_line(json!([1, 2]), "expected a JSON object");
    let mut bad = token_lines()[0].clone();
    bad["weights"] = json!([0.5, -1.0]);
    assert_bad_line(bad, "weights[1] = -1");
    // Every weight zero would score every call 0 and keep it at tau_f <= 0.
    let mut bad = token_lines()[0].clone();
    bad["weights"] = json!([0.0, 0.0]);
    assert_bad_line(bad, "at least one positive weight");
    // So would weights whose only positive one falls past the end of the text.
    let mut bad = token_lines()[0].clone();
    let n = bad["text_ids"].as_array().unwrap().len();
    bad["position"] = json!(n - 1);
    bad["weights"] = json!([0.0, 1.0]);
    bad["tau_f"] = json!(0.0);
    assert_bad_line(bad, "no positive weight falls on a text token");
    // A misspelled optional key is not ignored (the line would get the default weights).
    let mut bad = token_lines()[0].clone();
    bad["wieghts"] = bad["weights"].take();
    assert_bad_line(bad, "unknown field `wieghts`");
    let text = json!({"id": "x", "text": "Out of 1400 participants.", "position": 6,
                      "tool": "Calculator", "input": "1", "result": "1", "tau-f": 0});
    assert_bad_line(text, "unknown field `tau-f`");
}

/// An integer id past 64 bits would come back as a float (and two such ids could collide).
#[test]
fn an_id_that_cannot_come_back_exactly_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in.jsonl"), tmp.path().join("out.jsonl"));
    let mut line = token_lines()[0].clone();
    line["id"] = json!(0);
    let text = line
        .to_string()
        .replace("\"id\":0", "\"id\":18446744073709551617");
    assert!(text.contains("18446744073709551617"), "{text}");
    std::fs::write(&input, format!("{line}\n{text}\n")).unwrap();
    let (ok, results, _) = run_score_raw(&tiny("f32"), &input, &output, &[]);
    assert!(!ok && results.len() == 2 && results[0]["delta"].is_f64());
    let err = results[1]["error"].as_str().unwrap();
    assert!(err.contains("64-bit range"), "{err}");
}

/// A text-level line whose position is far past its text is its own error, and leaves nothing
/// behind for the lines of the same text after it: their scores are those they get alone.
#[test]
fn a_bad_position_does_not_change_the_scores_of_lines_with_the_same_text() {
    let text = "Out of 1400 participants, 400 (or 29%) passed the test. ".repeat(4);
    let line = |id: &str, position: u64| {
        json!({"id": id, "text": text, "position": position, "tool": "Calculator",
               "input": "400 / 1400", "result": "0.29"})
    };
    let good = [line("a", 11), line("b", 25), line("c", 56)];
    let (_, alone, _) = run_score(&tiny("f32"), &good, &[]);
    let mut all = vec![line("bad", u64::MAX)];
    all.extend(good.iter().cloned());
    let (ok, after, _) = run_score(&tiny("f32"), &all, &[]);
    assert!(!ok);
    let err = after[0]["error"].as_str().unwrap();
    assert!(err.contains("past the end of the"), "{err}");
    // The same scores, each row answering its own line.
    for (k, (a, b)) in after[1..].iter().zip(&alone).enumerate() {
        assert_eq!(
            (a["line"].as_u64(), b["line"].as_u64()),
            (Some(k as u64 + 2), Some(k as u64 + 1))
        );
        let scores = |v: &serde_json::Value| {
            let mut v = v.clone();
            v.as_object_mut().unwrap().remove("line");
            v
        };
        assert_eq!(scores(a), scores(b));
    }
}

#[test]
fn missing_model_folder_is_a_clear_error() {
    let (ok, _, stderr) = run_score(Path::new("/nonexistent/model"), &token_lines(), &[]);
    assert!(!ok);
    assert!(
        stderr.contains("/nonexistent/model: No such file or directory"),
        "{stderr}"
    );
    // A file where the folder should be: said so, not "Not a directory" about config.json.
    let file = tiny("f32").join("config.json");
    let (ok, _, stderr) = run_score(&file, &token_lines(), &[]);
    assert!(!ok);
    assert!(stderr.contains("config.json: is not a folder"), "{stderr}");
}

#[test]
fn reference_and_fast_engine_agree_through_the_cli() {
    // The budget is taken by the fast engine (split batches against the oracle:
    // tests/cpu_vs_reference.rs).
    let (ok, fast, _) = run_score(
        &tiny("f32"),
        &token_lines(),
        &["--placement", "inline", "--memory-budget-mb", "1"],
    );
    assert!(ok);
    let (ok, oracle, _) = run_score(
        &tiny("f32"),
        &token_lines(),
        &["--placement", "inline", "--reference"],
    );
    assert!(ok);
    // The reference scores one sequence at a time: a budget given to it is a mistake, said.
    let (ok, _, stderr) = run_score(
        &tiny("f32"),
        &token_lines(),
        &["--reference", "--memory-budget-mb", "1"],
    );
    assert!(!ok);
    assert!(stderr.contains("--memory-budget-mb"), "{stderr}");
    for (f, o) in fast.iter().zip(&oracle) {
        for field in ["l_none", "l_call", "l_call_result"] {
            assert_close(
                field,
                f[field].as_f64().unwrap(),
                o[field].as_f64().unwrap(),
                1e-4,
            );
        }
    }
}

#[test]
fn asking_for_cuda_without_a_cuda_build_or_gpu_is_a_clear_error() {
    let (ok, _, stderr) = run_score(&tiny("f32"), &token_lines(), &["--device", "cuda"]);
    if cfg!(feature = "cuda") {
        // Built with CUDA: on a machine without a GPU this must fail with a reason, not a panic.
        if !ok {
            assert!(stderr.contains("cuda"), "{stderr}");
        }
    } else {
        assert!(!ok);
        assert!(
            stderr.contains("built without the `cuda` feature"),
            "{stderr}"
        );
    }
}

#[test]
fn bench_refuses_what_it_cannot_run_before_working() {
    let bench = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .arg("bench")
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "bench {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // The fixture's n_positions (256) is shorter than the workload's longest sequences.
    let model = tiny("f32");
    let err = bench(&[
        "--model",
        model.to_str().unwrap(),
        "--skip-baselines",
        "--texts",
        "3",
        "--seed",
        "2",
    ]);
    assert!(err.contains("does not fit this model"), "{err}");
    if cfg!(feature = "baselines") {
        // Seed 1's cut sequences fit, but the naive baseline runs whole texts: refused before
        // the engine's warm-up, with the way out.
        let err = bench(&[
            "--model",
            model.to_str().unwrap(),
            "--texts",
            "1",
            "--seed",
            "1",
        ]);
        assert!(
            err.contains("for the naive baseline") && err.contains("--skip-baselines"),
            "{err}"
        );
    }
    if cfg!(target_os = "linux") {
        // The memory check reads /proc/meminfo.
        let err = bench(&["--vocab", "100000000000", "--skip-baselines"]);
        assert!(err.contains("more than this machine"), "{err}");
    }
    let err = bench(&["--texts", "0", "--skip-baselines"]);
    assert!(err.contains("at least 1"), "{err}");
    // Sizes no GPT-J has (heads that do not divide the width) are refused naming the flags.
    let err = bench(&["--embd", "30", "--heads", "4", "--skip-baselines"]);
    assert!(
        err.contains("the random model's sizes (--layers, --embd"),
        "{err}"
    );
    if !cfg!(feature = "baselines") {
        let err = bench(&["--layers", "1"]);
        assert!(err.contains("baselines are not built in"), "{err}");
    }
}

/// A small bench run prints its JSON report on stdout and DESIGN's three figures (candidates
/// per second, unique tokens per second, the fraction of the GEMM peak) on stderr. Each figure
/// is the quotient its field's docs give (BenchReport), of the report's own counts and seconds;
/// without baselines the rounds are --reps alone (--baseline-reps does not add any) and every
/// baseline field is null, 0 or empty.
#[test]
fn bench_reports_its_rates_on_both_streams() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args([
            "bench", "--layers", "1", "--embd", "32", "--heads", "2", "--rotary", "8",
        ])
        .args([
            "--vocab",
            "100",
            "--texts",
            "1",
            "--reps",
            "1",
            "--baseline-reps",
            "3",
            "--skip-baselines",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["candidates"], 25);
    assert_eq!(report["model"], "gptj L1 d32 h2 r8 v100");
    assert_eq!(report["peak_source"], "measured");
    assert_eq!(report["rounds"], 1, "{report}");
    let f = |key: &str| {
        report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {report}"))
    };
    let close = |key: &str, got: f64, want: f64| {
        assert!(
            (got - want).abs() <= 1e-9 * want.abs(),
            "{key}: {got} vs {want}"
        );
    };
    let (secs, unique) = (f("toolsift_secs"), f("unique_tokens"));
    close(
        "toolsift_cands_per_s",
        f("toolsift_cands_per_s"),
        25.0 / secs,
    );
    close(
        "toolsift_tokens_per_s",
        f("toolsift_tokens_per_s"),
        unique / secs,
    );
    // An f32 K and V per unique token, layer and width.
    close("kv_bytes", f("kv_bytes"), unique * 2.0 * 32.0 * 4.0);
    // The CPU engine's memory is the process's: its figure is the peak RSS.
    assert!(report["device_peak_bytes"].is_null(), "{report}");
    if !report["peak_rss_bytes"].is_null() {
        let memory = f("weights_bytes") + f("kv_bytes");
        close(
            "memory_ratio",
            f("memory_ratio"),
            f("peak_rss_bytes") / memory,
        );
    }
    let head_flops = f("head_rows") * 2.0 * 32.0 * 100.0;
    close(
        "head_gflops",
        f("head_gflops"),
        head_flops / f("head_secs").max(1e-12) / 1e9,
    );
    let trunk = unique * toolsift::GptjConfig::small(1, 32, 2, 8, 100).trunk_flops_per_token();
    close(
        "whole_run_fraction_of_peak",
        f("whole_run_fraction_of_peak"),
        trunk / secs / 1e9 / f("gemm_gflops_peak"),
    );
    for key in ["speedup", "baseline_secs", "tuned_secs", "max_abs_diff"] {
        assert!(report[key].is_null(), "{key}: {report}");
    }
    assert_eq!(report["speedup_rounds"], json!([]));
    assert_eq!(report["tuned_tokens"], 0);
    for key in [
        "toolsift_cands_per_s",
        "toolsift_tokens_per_s",
        "whole_run_fraction_of_peak",
    ] {
        assert!(
            report[key].as_f64().is_some_and(|x| x > 0.0),
            "{key}: {report}"
        );
    }
    for figure in ["cand/s", "unique tokens/s", "of the", "GEMM peak"] {
        assert!(stderr.contains(figure), "{figure}: {stderr}");
    }
}

/// `bench --device cuda` on the emulated device (feature `emu`): the GEMM peak the fractions
/// divide by is measured on the engine's device, through cuBLASLt, not a constant.
#[cfg(feature = "emu")]
#[test]
fn bench_on_cuda_measures_the_devices_gemm_peak() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args([
            "bench", "--device", "cuda", "--layers", "1", "--embd", "32", "--heads", "2",
        ])
        .args([
            "--rotary", "8", "--vocab", "100", "--texts", "1", "--reps", "1",
        ])
        .args(["--skip-baselines", "--placement", "inline"])
        .env("TOOLSIFT_EMU_DEVICE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["device"], "cuda");
    assert_eq!(report["peak_source"], "measured");
    let peak = report["gemm_gflops_peak"].as_f64().unwrap();
    // The emulated device's host matmuls: nowhere near the H200's 790,000 of before.
    assert!(peak > 0.0 && peak < 10_000.0, "{peak}");
    // Memory is the device's: its pool's peak, weights included, over weights and a 16-bit
    // K and V per unique token, layer and width.
    let f = |key: &str| {
        report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {report}"))
    };
    let kv = f("unique_tokens") * 2.0 * 32.0 * 2.0;
    assert_eq!(f("kv_bytes"), kv, "{report}");
    let device_peak = f("device_peak_bytes");
    assert!(device_peak > f("weights_bytes"), "{report}");
    let ratio = device_peak / (f("weights_bytes") + kv);
    assert!(
        (f("memory_ratio") - ratio).abs() <= 1e-9 * ratio,
        "{report}"
    );
}

/// An input that fails to read partway through a chunk: the lines read before the failure are
/// still scored and written, then the run stops with an error naming the line.
#[test]
fn lines_read_before_an_input_error_are_still_scored() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    let model = toolsift::Model::load(tiny("f32")).unwrap();
    let scorer = toolsift::cpu::CpuScorer::new(&model);
    let lines = token_lines();
    assert!(lines.len() >= 2);
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let reader = std::io::BufReader::new(common::FailsAfter::new(input));
    let mut out = Vec::new();
    let err = score_jsonl(reader, &mut out, &scorer, None, &JsonlOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("<input line {}>", lines.len() + 1)) && err.contains("went away"),
        "{err}"
    );
    let scored: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(scored.len(), lines.len());
    for (s, l) in scored.iter().zip(&lines) {
        assert_eq!(s["id"], l["id"]);
        assert!(s["l_none"].is_f64(), "{s}");
    }
}

/// An input that fails to read at the start of a chunk (after a full chunk, or before its
/// first line) is an error too, not the end of the input: the lines before it are written and
/// the run says where it stopped, rather than passing for a complete run.
#[test]
fn an_input_error_at_a_chunk_border_is_not_the_end_of_the_input() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    let model = toolsift::Model::load(tiny("f32")).unwrap();
    let scorer = toolsift::cpu::CpuScorer::new(&model);
    let lines = token_lines();
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    for (input, chunk_lines, written) in [
        (input.as_str(), lines.len(), lines.len()),
        (input.as_str(), 1, lines.len()),
        ("", 4, 0),
    ] {
        let reader = std::io::BufReader::new(common::FailsAfter::new(input));
        let mut out = Vec::new();
        let options = JsonlOptions {
            chunk_lines,
            ..JsonlOptions::default()
        };
        let err = score_jsonl(reader, &mut out, &scorer, None, &options)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("<input line {}>", written + 1)) && err.contains("went away"),
            "{chunk_lines}: {err}"
        );
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), written);
    }
}

/// Each chunk's rows are flushed as the chunk ends (a pipeline's next stage sees them then,
/// behind the CLI's buffered output).
#[test]
fn each_chunk_is_flushed_as_it_ends() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    /// Lines written, and the count at each flush.
    #[derive(Default)]
    struct Flushes {
        text: Vec<u8>,
        at_flush: Vec<usize>,
    }
    impl std::io::Write for Flushes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.text.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.at_flush
                .push(self.text.iter().filter(|&&b| b == b'\n').count());
            Ok(())
        }
    }
    let model = toolsift::Model::load(tiny("f32")).unwrap();
    let scorer = toolsift::cpu::CpuScorer::new(&model);
    let lines = token_lines();
    let input: String = lines.iter().take(3).map(|l| format!("{l}\n")).collect();
    let options = JsonlOptions {
        chunk_lines: 2,
        ..JsonlOptions::default()
    };
    let mut out = Flushes::default();
    score_jsonl(input.as_bytes(), &mut out, &scorer, None, &options).unwrap();
    assert_eq!(out.at_flush, [2, 3]);
}

/// A backend error (a lost device, out of memory) stops the run, naming the chunk of input
/// lines it was scoring; the chunks before it are written, so `--resume` starts at its first.
#[test]
fn a_backend_error_names_the_lines_it_was_scoring() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    use toolsift::score::{ScoreOptions, Scorer, TokenCandidate};
    struct FailsSecond<'a>(&'a toolsift::cpu::CpuScorer, AtomicUsize);
    impl Scorer for FailsSecond<'_> {
        fn name(&self) -> &str {
            "fails-second"
        }
        fn config(&self) -> &toolsift::GptjConfig {
            self.0.config()
        }
        fn variant_losses_unchecked(
            &self,
            candidates: &[TokenCandidate],
            options: &ScoreOptions,
        ) -> toolsift::Result<Vec<[f64; 3]>> {
            if self.1.fetch_add(1, Ordering::SeqCst) == 1 {
                return Err(toolsift::Error::Backend("cuda: out of memory".into()));
            }
            self.0.variant_losses_unchecked(candidates, options)
        }
    }
    let model = toolsift::Model::load(tiny("f32")).unwrap();
    let cpu = toolsift::cpu::CpuScorer::new(&model);
    let scorer = FailsSecond(&cpu, AtomicUsize::new(0));
    let lines = token_lines();
    assert!(lines.len() >= 3);
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let options = JsonlOptions {
        chunk_lines: 2,
        ..JsonlOptions::default()
    };
    let mut out = Vec::new();
    let err = score_jsonl(input.as_bytes(), &mut out, &scorer, None, &options).unwrap_err();
    assert!(!err.is_input());
    let last = 4.min(lines.len());
    assert_eq!(
        err.to_string(),
        format!("scoring input lines 3-{last}: cuda: out of memory")
    );
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 2);
}

/// A scorer's own refusal of one candidate (beyond `validate`: a backend's limit) is the row of
/// that candidate's line, named by its own number, not by the first line of its chunk; the
/// lines around it are scored.
#[test]
fn a_scorers_own_refusal_names_its_own_line() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    use toolsift::score::{ScoreOptions, Scorer, TokenCandidate};
    /// Refuses the candidates at `position` with `call_ids`.
    struct Refuses<'a>(&'a toolsift::cpu::CpuScorer, usize, Vec<u32>);
    impl Scorer for Refuses<'_> {
        fn name(&self) -> &str {
            "refuses-one"
        }
        fn config(&self) -> &toolsift::GptjConfig {
            self.0.config()
        }
        fn variant_losses_unchecked(
            &self,
            candidates: &[TokenCandidate],
            options: &ScoreOptions,
        ) -> toolsift::Result<Vec<[f64; 3]>> {
            let refused = candidates
                .iter()
                .position(|c| c.position == self.1 && c.call_ids == self.2);
            if let Some(index) = refused {
                return Err(toolsift::Error::candidate(
                    index,
                    "over this backend's limit",
                ));
            }
            self.0.variant_losses_unchecked(candidates, options)
        }
    }
    let model = toolsift::Model::load(tiny("f32")).unwrap();
    let cpu = toolsift::cpu::CpuScorer::new(&model);
    let lines = token_lines();
    let (other, refused) = (&lines[0], &lines[1]);
    let key = |l: &Value| (l["position"].clone(), l["call_ids"].clone());
    assert_ne!(key(other), key(refused));
    let call_ids: Vec<u32> = serde_json::from_value(refused["call_ids"].clone()).unwrap();
    let position = refused["position"].as_u64().unwrap() as usize;
    let scorer = Refuses(&cpu, position, call_ids);
    let input: String = [other, other, refused, other]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    let mut out = Vec::new();
    let summary = score_jsonl(
        input.as_bytes(),
        &mut out,
        &scorer,
        None,
        &JsonlOptions::default(),
    )
    .unwrap();
    assert_eq!((summary.scored, summary.failed), (3, 1));
    let rows: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows[2]["line"], 3);
    let error = rows[2]["error"].as_str().unwrap();
    assert!(
        error.starts_with("line 3: ") && error.contains("over this backend's limit"),
        "{error}"
    );
}

/// Text-level lines tokenize only the head of the text their window reads: the scores of a
/// candidate in a long text are those of the same candidate tokenized whole (as a token-level
/// line), early in the text or deep into it.
#[test]
fn long_texts_score_as_if_tokenized_whole() {
    use toolsift::score::{CallForm, Placement, TextCandidate};
    let model = toolsift::Model::load(tiny("f32")).unwrap();
    let tok = model.tokenizer().unwrap();
    let base = "Out of 1400 participants, 400 (or 29%) passed the test.";
    let long = format!(
        "{base}{}",
        " Then 12 more people came in and sat down.".repeat(3000)
    );
    let boundary = |text: &str, at: usize| {
        let enc = tok.encode(text).unwrap();
        enc.spans.iter().map(|s| s.0).find(|&b| b >= at).unwrap()
    };
    let early = boundary(base, 26);
    // As deep as a prefix-placed call still fits n_positions.
    let deep = tok.encode(&long).unwrap().spans[model.config().n_positions - 40].0;
    let text_line = |text: &str, position: usize| {
        json!({"id": position, "text": text, "position": position, "tool": "Calculator",
               "input": "400 / 1400", "result": "0.29"})
    };
    let token_line = |text: &str, position: usize| {
        let c = TextCandidate {
            text: text.into(),
            position,
            tool: "Calculator".into(),
            input: "400 / 1400".into(),
            result: "0.29".into(),
            weights: None,
        }
        .to_tokens(tok, Placement::Prefix, CallForm::Arrow, None)
        .unwrap();
        json!({"id": position, "text_ids": c.text_ids.to_vec(), "position": c.position,
               "call_ids": c.call_ids, "call_result_ids": c.call_result_ids})
    };
    let lines = [
        text_line(&long, early),
        token_line(&long, early),
        text_line(&long, deep),
        token_line(&long, deep),
        text_line(base, early),
    ];
    let (ok, results, stderr) = run_score(&tiny("f32"), &lines, &[]);
    assert!(ok, "{stderr}");
    for (what, a, b) in [
        ("early, head vs whole", 0, 1),
        ("deep, head vs whole", 2, 3),
        ("early, long text vs short", 0, 4),
    ] {
        for key in ["l_none", "l_call", "l_call_result"] {
            let (x, y) = (
                results[a][key].as_f64().unwrap(),
                results[b][key].as_f64().unwrap(),
            );
            assert_close(&format!("{what}: {key}"), x, y, 1e-5);
        }
    }
}

/// What is wrong with --input or --output is found before the output is created (which would
/// empty it) and before the model is loaded: an input that is a folder, an output that is a
/// file of the model folder, an output folder that does not exist.
#[test]
fn bad_input_or_output_paths_touch_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny("f32").join(f), model.join(f)).unwrap();
    }
    let input = tmp.path().join("in.jsonl");
    let text: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let keep = tmp.path().join("keep.jsonl");
    std::fs::write(&keep, "keep\n").unwrap();
    let weights = std::fs::read(model.join("model.safetensors")).unwrap();
    for (input, output, needle) in [
        (tmp.path().to_owned(), keep.clone(), "is a folder"),
        (
            input.clone(),
            model.join("model.safetensors"),
            "a file of the model folder",
        ),
        (
            input.clone(),
            tmp.path().join("no/such/out.jsonl"),
            "does not exist",
        ),
        (input.clone(), tmp.path().to_owned(), "is a folder"),
        (
            input.clone(),
            tmp.path().join("sub/"),
            "names a folder (ends in",
        ),
        // --reference runs on the CPU only.
        (input.clone(), keep.clone(), "leave out --device"),
    ] {
        let reference = needle == "leave out --device";
        let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["score", "--model"])
            .arg(&model)
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&output)
            .args(if reference {
                &["--reference", "--device", "cuda"][..]
            } else {
                &[]
            })
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && stderr.contains(needle),
            "{needle}: {stderr}"
        );
    }
    assert_eq!(std::fs::read_to_string(&keep).unwrap(), "keep\n");
    assert_eq!(
        std::fs::read(model.join("model.safetensors")).unwrap(),
        weights
    );
    // A negative threshold in the documented `--tau-f X` form (keep every call).
    let out = tmp.path().join("out.jsonl");
    let (ok, results, stderr) = run_score_raw(&model, &input, &out, &["--tau-f", "-1e9"]);
    assert!(ok, "{stderr}");
    assert!(results.iter().all(|r| r["kept"] == true));
}

/// A stderr that cannot be written does not turn a finished run into a failure; an output
/// that cannot be written is an error naming it.
#[cfg(target_os = "linux")]
#[test]
fn unwritable_stderr_or_output() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let text: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let run = |output: &Path, stderr: std::process::Stdio| {
        Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["score", "--model"])
            .arg(tiny("f32"))
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(output)
            .stderr(stderr)
            .output()
            .unwrap()
    };
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let out = tmp.path().join("out.jsonl");
    let o = run(&out, full().into());
    assert!(o.status.success(), "{:?}", o.status);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().lines().count(),
        token_lines().len()
    );
    let o = run(Path::new("/dev/full"), std::process::Stdio::piped());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("into /dev/full"), "{stderr}");
}

/// `--resume` goes on from an interrupted run's output: the answered lines are kept, a last
/// line cut off mid-way is redone, and the result is the uninterrupted run's, byte for byte
/// (one line per batch on both sides, so that batching cannot move a rounding). An output
/// that answers another input is refused and left as it was.
#[test]
fn resume_goes_on_from_an_interrupted_output() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny("f32");
    let input = tmp.path().join("in.jsonl");
    let mut lines = token_lines();
    lines.insert(1, json!({"id": "bad", "text_ids": [1], "position": 9}));
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let whole = tmp.path().join("whole.jsonl");
    let one = ["--chunk-lines", "1"];
    let (ok, results, stderr) = run_score_raw(&model, &input, &whole, &one);
    assert!(!ok && results.len() == lines.len(), "{stderr}");
    let want = std::fs::read(&whole).unwrap();
    let out = tmp.path().join("out.jsonl");
    let cut_after = |n: usize, extra: usize| {
        let ends: Vec<usize> = want
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == b'\n')
            .map(|(k, _)| k + 1)
            .collect();
        let at = if n == 0 { 0 } else { ends[n - 1] };
        std::fs::write(&out, &want[..at + extra]).unwrap();
    };
    for (n, extra) in [(0, 0), (0, 7), (2, 0), (2, 9), (lines.len(), 0)] {
        cut_after(n, extra);
        let resume = ["--chunk-lines", "1", "--resume"];
        let (ok, _, stderr) = run_score_raw(&model, &input, &out, &resume);
        let said = match n {
            0 => "holds no answered line yet".to_string(),
            n => format!("resuming: {n} lines"),
        };
        assert!(stderr.contains(&said), "{stderr}");
        // Line 2 failed, in this run or the one it resumes: the run fails either way, and
        // says so when it was the earlier run.
        assert!(!ok, "cut after {n} lines + {extra}");
        assert_eq!(
            stderr.contains("the run this one resumed failed on 1 of the output's lines"),
            n >= 2,
            "{stderr}"
        );
        assert_eq!(
            std::fs::read(&out).unwrap(),
            want,
            "cut after {n} lines + {extra}"
        );
    }
    // No output yet: a fresh run, and said so (it said "0 lines ... already answered").
    std::fs::remove_file(&out).unwrap();
    let (_, results, stderr) = run_score_raw(&model, &input, &out, &["--resume"]);
    assert_eq!(results.len(), lines.len(), "{stderr}");
    assert!(
        stderr.contains("holds no answered line yet; starting from the first")
            && !stderr.contains("already answered"),
        "{stderr}"
    );
    // Another input's output.
    let foreign = "{\"id\":\"someone-else\",\"l_none\":1}\n";
    std::fs::write(&out, foreign).unwrap();
    let (ok, _, stderr) = run_score_raw(&model, &input, &out, &["--resume"]);
    assert!(
        !ok && stderr.contains("it answers id \"someone-else\""),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), foreign);
    // A copy of the input is no output: its lines have the input's ids, but no scores.
    std::fs::copy(&input, &out).unwrap();
    let (ok, _, stderr) = run_score_raw(&model, &input, &out, &["--resume"]);
    assert!(
        !ok && stderr.contains("line 1: it is neither an answer"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&input).unwrap());
    // A file without a newline that does not start as a row does is no output cut off by a
    // crash: refused and left as it was (it was emptied as a torn first line).
    for other in [
        &b"notes, no newline"[..],
        &[0u8, 1, 2, 0xff][..],
        b" {\"l_none\":1}",
    ] {
        std::fs::write(&out, other).unwrap();
        let (ok, stderr) = run_score_unread(&model, &input, &out, &["--resume"]);
        assert!(
            !ok && stderr.contains("line 1: its last line ends without a newline"),
            "{stderr}"
        );
        assert_eq!(std::fs::read(&out).unwrap(), other);
    }
    // An input that cannot be read twice (a pipe, a device) cannot be resumed from.
    #[cfg(unix)]
    {
        let (ok, _, stderr) = run_score_raw(&model, Path::new("/dev/null"), &out, &["--resume"]);
        assert!(!ok && stderr.contains("must be a regular file"), "{stderr}");
    }
}

/// A run that cannot start (its model does not load) leaves no empty output behind, and an
/// earlier output as it was.
#[test]
fn a_run_that_cannot_start_leaves_the_output_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in.jsonl"), tmp.path().join("out.jsonl"));
    let text: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let broken = tmp.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("config.json"), "{}").unwrap();
    for extra in [&[][..], &["--resume"][..]] {
        let (ok, err) = run_score_unread(&broken, &input, &output, extra);
        assert!(!ok && err.contains("config.json"), "{err}");
        assert!(
            !output.exists(),
            "{extra:?}: an empty output was left behind"
        );
    }
    std::fs::write(&output, "earlier\n").unwrap();
    let (ok, _) = run_score_unread(&broken, &input, &output, &[]);
    assert!(!ok);
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "earlier\n");
}

/// A second run on an output another run is writing (here: this test holds its lock) is
/// refused, fresh or resuming, and leaves the file as it was: unlocked, it cut the file and
/// wrote its lines over the first run's.
#[test]
fn an_output_another_run_is_writing_is_refused_and_left_alone() {
    let model = common::tiny("f32");
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in.jsonl"), tmp.path().join("out.jsonl"));
    let text: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let (ok, rows, err) = run_score_raw(&model, &input, &output, &[]);
    assert!(ok && rows.len() == token_lines().len(), "{err}");
    let before = std::fs::read(&output).unwrap();
    let held = std::fs::File::open(&output).unwrap();
    held.lock().unwrap();
    for extra in [&[][..], &["--resume"][..]] {
        let (ok, _, err) = run_score_raw(&model, &input, &output, extra);
        assert!(!ok, "{extra:?}");
        assert!(
            err.contains("another toolsift run is writing this output")
                && err.contains("out.jsonl"),
            "{extra:?}: {err}"
        );
        assert_eq!(std::fs::read(&output).unwrap(), before, "{extra:?}");
    }
    drop(held);
    let (ok, rows, err) = run_score_raw(&model, &input, &output, &["--resume"]);
    assert!(ok && rows.len() == token_lines().len(), "{err}");
    // A device is no file two runs write over each other: not locked (unrelated runs writing
    // to /dev/null refused each other), and no earlier output to resume from.
    #[cfg(unix)]
    {
        let null = Path::new("/dev/null");
        let held = std::fs::File::open(null).unwrap();
        held.lock().unwrap();
        let (ok, err) = run_score_unread(&model, &input, null, &[]);
        drop(held);
        assert!(ok, "{err}");
        let (ok, err) = run_score_unread(&model, &input, null, &["--resume"]);
        assert!(!ok && err.contains("must be a regular file"), "{err}");
    }
}

/// `-` is standard input for `--input` and standard output for `--output`: the same rows as
/// through files. `--resume` needs files on both sides (it reads the input twice and the
/// output an earlier run wrote) and is refused with `-`, before the model loads.
#[test]
fn a_dash_reads_stdin_and_writes_stdout() {
    let model = tiny("f32");
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let text: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, &text).unwrap();
    let through_files = tmp.path().join("out.jsonl");
    let (ok, _, err) = run_score_raw(&model, &input, &through_files, &[]);
    assert!(ok, "{err}");
    let want = std::fs::read(&through_files).unwrap();
    let run = |input_arg: &str, output_arg: &str, extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolsift"));
        cmd.args(["score", "--model"])
            .arg(&model)
            .args(["--input", input_arg, "--output", output_arg])
            .args(extra);
        common::output_with_stdin(&mut cmd, text.as_bytes())
    };
    let input_arg = input.to_str().unwrap();
    let to_file = tmp.path().join("from-stdin.jsonl");
    for (i, o) in [
        ("-", "-"),
        (input_arg, "-"),
        ("-", to_file.to_str().unwrap()),
    ] {
        let out = run(i, o, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{i} {o}: {stderr}");
        let got = if o == "-" {
            out.stdout
        } else {
            std::fs::read(&to_file).unwrap()
        };
        assert_eq!(got, want, "{i} {o}");
        if o == "-" {
            assert!(stderr.contains("-> <stdout>"), "{stderr}");
        }
    }
    for (i, o) in [
        ("-", "-"),
        (input_arg, "-"),
        ("-", to_file.to_str().unwrap()),
    ] {
        let out = run(i, o, &["--resume"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.stdout.is_empty(), "{i} {o}");
        assert!(
            stderr.contains("--resume") && stderr.contains("not `-`"),
            "{stderr}"
        );
    }
    // The refused runs left the file an earlier run wrote as it was.
    assert_eq!(std::fs::read(&to_file).unwrap(), want);
}

/// `score --demo` scores with the demo model built into the binary, as `generate --demo` does;
/// `--weights` takes a negative number as a value, refused by the weights' own check.
#[test]
fn score_runs_on_the_demo_model_and_reads_negative_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    let line = json!({
        "id": "demo", "text": "Out of 540 voters, 108 (or 20%) said yes.",
        "position": 26, "tool": "Calculator", "input": "108 / 540 * 100", "result": "20"
    });
    std::fs::write(&input, format!("{line}\n")).unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["score", "--demo", "--input"])
            .arg(&input)
            .arg("--output")
            .arg(&output)
            .args(extra)
            .env("TMPDIR", tmp.path())
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: Value =
        serde_json::from_str(std::fs::read_to_string(&output).unwrap().trim()).unwrap();
    assert_eq!(result["id"], "demo", "{result}");
    assert!(
        result["delta"].as_f64().is_some_and(f64::is_finite),
        "{result}"
    );

    let out = run(&["--weights", "-1,2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("weights[0] = -1 must be finite and non-negative"),
        "{stderr}"
    );
    // A flag right after --weights is not taken for a bad number.
    let out = run(&["--weights", "--reference"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("expected a number, got the flag --reference"),
        "{stderr}"
    );
    let both = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args([
            "score", "--demo", "--model", "m", "--input", "i", "--output", "o",
        ])
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2), "--demo and --model conflict");

    // Exit status: 3 for a run that wrote every line and some failed, 1 for one that stopped.
    let bad = json!({"id": "bad", "text": "x", "position": 99, "tool": "Calculator",
                     "input": "1", "result": "1"});
    std::fs::write(&input, format!("{line}\n{bad}\n")).unwrap();
    let some_failed = run(&[]);
    assert_eq!(some_failed.status.code(), Some(3));
    assert_eq!(std::fs::read_to_string(&output).unwrap().lines().count(), 2);
    let stopped = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["score", "--model", "/nonexistent/model", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    assert_eq!(stopped.status.code(), Some(1));
}

// Review of the CLI glue: tests from a hand mutation review of src/cli (streams, score, convert,
// demo, bench) and src/main.rs.

/// A `toolsift` command in `cwd`, its demo assets under `tmp` (TMPDIR).
fn toolsift_in(cwd: &Path, tmp: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolsift"));
    cmd.args(args).current_dir(cwd).env("TMPDIR", tmp);
    cmd
}

/// A command's output with stdout a pipe whose reader has already gone (`| head -0`).
#[cfg(unix)]
fn output_into_closed_pipe(cmd: &mut Command) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdout(writer).output().unwrap()
}

/// A reader of stdout that has gone ends the output quietly, exit 0, for `score --output -` and
/// for what `emit` writes (here `--print-config`); a stdout that is full is an error, exit 1.
#[cfg(unix)]
#[test]
fn a_closed_stdout_ends_quietly_and_a_full_one_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let text: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let model = tiny("f32");
    let score = ["score", "--model", model.to_str().unwrap(), "--output", "-"];
    let mut cmd = toolsift_in(tmp.path(), tmp.path(), &score);
    let o = output_into_closed_pipe(cmd.arg("--input").arg(&input));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    let config = ["annotate", "--demo", "--print-config"];
    let o = output_into_closed_pipe(&mut toolsift_in(tmp.path(), tmp.path(), &config));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    #[cfg(target_os = "linux")]
    {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = toolsift_in(tmp.path(), tmp.path(), &config)
            .stdout(full)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("error: writing to stdout"), "{stderr}");
    }
}

/// Only `-` itself is a standard stream: `./-` is a file named `-`, and an output named
/// without a folder is written in the working directory.
#[test]
fn relative_outputs_and_dot_slash_dash_are_files() {
    let tmp = tempfile::tempdir().unwrap();
    let text: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(tmp.path().join("in.jsonl"), &text).unwrap();
    let model = tiny("f32");
    for output in ["out.jsonl", "./-"] {
        let o = toolsift_in(tmp.path(), tmp.path(), &["score", "--model"])
            .arg(&model)
            .args(["--input", "in.jsonl", "--output", output])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{output}: {stderr}");
        assert!(o.stdout.is_empty(), "{output}");
        let written = std::fs::read_to_string(tmp.path().join(output)).unwrap();
        assert_eq!(written.lines().count(), token_lines().len(), "{output}");
        assert!(stderr.contains(&format!("-> {output}")), "{stderr}");
    }
}

/// An input read from stdin that fails to read is named `<stdin>` in the error.
#[cfg(target_os = "linux")]
#[test]
fn a_stdin_that_cannot_be_read_is_named_stdin() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.jsonl");
    // A folder opened as a file: reading it fails (EISDIR).
    let folder = std::fs::File::open(tmp.path()).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["score", "--model"])
        .arg(tiny("f32"))
        .args(["--input", "-", "--output"])
        .arg(&out)
        .stdin(folder)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("scoring <stdin> into "), "{stderr}");
}

/// An output that is the input file (under any path) is refused before anything is written,
/// and a missing input is named.
#[test]
fn an_output_that_is_the_input_and_a_missing_input_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let text: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, &text).unwrap();
    let linked = tmp.path().join("linked.jsonl");
    std::fs::hard_link(&input, &linked).unwrap();
    for output in [&input, &linked] {
        let (ok, stderr) = run_score_unread(&tiny("f32"), &input, output, &[]);
        assert!(!ok, "{stderr}");
        assert!(stderr.contains("the output is the input file"), "{stderr}");
        assert_eq!(std::fs::read_to_string(&input).unwrap(), text);
    }
    let missing = tmp.path().join("no-such.jsonl");
    let (ok, stderr) = run_score_unread(&tiny("f32"), &missing, &tmp.path().join("o"), &[]);
    assert!(!ok);
    assert!(
        stderr.contains("no-such.jsonl: No such file or directory"),
        "{stderr}"
    );
}

/// --input and --output are checked before the model loads: with a model that does not load
/// and an output folder that does not exist, the error is the output's.
#[test]
fn io_is_checked_before_the_model_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(&input, "{}\n").unwrap();
    let broken = tmp.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("config.json"), "{}").unwrap();
    let out = tmp.path().join("no/such/out.jsonl");
    let (ok, stderr) = run_score_unread(&broken, &input, &out, &[]);
    assert!(!ok);
    assert!(
        stderr.contains("does not exist") && !stderr.contains("config.json"),
        "{stderr}"
    );
}

/// `--reference`, `--placement` and `--weights` reach the scorer: the rows are the library
/// oracle's with the same options, byte for byte (the fast engine's f32 differs in the last
/// digits).
#[test]
fn reference_placement_and_weights_reach_the_scorer() {
    use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
    let lines = token_lines();
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let model = toolsift::Model::load(tiny("f32")).unwrap();
    let oracle = toolsift::ReferenceScorer::new(&model);
    let options = JsonlOptions {
        score: toolsift::ScoreOptions {
            placement: toolsift::Placement::Inline,
            weights: toolsift::score::LossWeights::new(vec![1.0, 0.5]).unwrap(),
        },
        ..JsonlOptions::default()
    };
    let mut want = Vec::new();
    score_jsonl(input.as_bytes(), &mut want, &oracle, None, &options).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (input_path, out) = (tmp.path().join("in.jsonl"), tmp.path().join("out.jsonl"));
    std::fs::write(&input_path, &input).unwrap();
    let extra = ["--reference", "--placement", "inline", "--weights", "1,0.5"];
    let (ok, stderr) = run_score_unread(&tiny("f32"), &input_path, &out, &extra);
    assert!(ok, "{stderr}");
    assert_eq!(
        String::from_utf8(std::fs::read(&out).unwrap()).unwrap(),
        String::from_utf8(want).unwrap()
    );
}

/// The summary line counts the rows as written: scored, of them kept, and failed.
#[test]
fn the_summary_counts_scored_kept_and_failed_rows() {
    let mut lines = token_lines();
    lines.push(json!({"id": "bad", "text_ids": [1], "position": 9}));
    let (ok, rows, stderr) = run_score(&tiny("f32"), &lines, &["--tau-f", "0"]);
    assert!(!ok);
    let failed = rows.iter().filter(|r| r.get("error").is_some()).count();
    let kept = rows.iter().filter(|r| r["kept"] == true).count();
    let scored = rows.len() - failed;
    assert!(failed == 1 && 0 < kept && kept < scored, "{rows:?}");
    let said = format!(
        "{} lines: {scored} scored ({kept} kept), {failed} failed -> ",
        rows.len()
    );
    assert!(stderr.contains(&said), "{said}: {stderr}");
}

/// Runs `toolsift <command> --model <tiny f32> <args>`, gives it `line` on stdin and waits up to
/// `wait_secs` for its first line of stdout while the input is still open; None if none came.
fn first_line_before_the_input_ends(
    command: &str,
    args: &[&str],
    line: &str,
    wait_secs: u64,
) -> Option<String> {
    use std::io::{BufRead as _, Write as _};
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args([command, "--model"])
        .arg(tiny("f32"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut first);
        let _ = tx.send(first);
    });
    writeln!(stdin, "{line}").unwrap();
    stdin.flush().unwrap();
    let first = rx.recv_timeout(std::time::Duration::from_secs(wait_secs));
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    first.ok()
}

/// With `--chunk-lines 1` each line's row reaches a pipe's reader before the next line is
/// written (the default, 4096, waits for more input).
#[test]
fn chunk_lines_sets_when_rows_reach_a_pipe() {
    let args = ["--input", "-", "--output", "-", "--chunk-lines", "1"];
    let first = first_line_before_the_input_ends("score", &args, &token_lines()[0].to_string(), 20);
    let first = first.expect("no row before the input ended");
    let row: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(row["id"], "case-0");
}

/// `convert --dtype` writes the type asked for (f16 and bf16 not swapped), without it each
/// tensor's own; the note names the written file.
#[test]
fn convert_writes_the_dtype_asked_for() {
    use toolsift::model::DType;
    let tmp = tempfile::tempdir().unwrap();
    for (flag, want) in [
        (Some("f16"), DType::F16),
        (Some("bf16"), DType::BF16),
        (None, DType::F32),
    ] {
        let out = tmp.path().join(flag.unwrap_or("own"));
        let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["convert", "--model"])
            .arg(tiny("f32"))
            .arg("--out")
            .arg(&out)
            .args(flag.map(|f| ["--dtype", f]).iter().flatten())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{stderr}");
        let file = out.join("model.safetensors");
        assert!(
            stderr.contains(&format!("tensors to {}", file.display())),
            "{stderr}"
        );
        let model = toolsift::Model::load(&out).unwrap();
        for (name, t) in model.weights().named_tensors(model.config()) {
            assert_eq!(t.dtype(), want, "{flag:?}: {name}");
        }
    }
}

/// `annotate --demo --print-config` checks `--tools` first: a tool the demo has not configured
/// is refused, not printed past.
#[test]
fn demo_print_config_checks_the_tools_first() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "annotate",
        "--demo",
        "--print-config",
        "--tools",
        "wikisearch",
    ];
    let o = toolsift_in(tmp.path(), tmp.path(), &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("wikisearch is not available"), "{stderr}");
    assert!(o.stdout.is_empty());
}

/// eval-demo: `--seed` picks the set, the table goes to stdout and the note names eval.json.
#[test]
fn eval_demo_takes_its_seed_and_names_its_report() {
    let tmp = tempfile::tempdir().unwrap();
    let common = [
        "eval-demo",
        "--docs",
        "2",
        "--skip-generate",
        "--no-progress",
    ];
    let mut args = common.to_vec();
    args.extend(["--seed", "7", "--json"]);
    let o = toolsift_in(tmp.path(), tmp.path(), &args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["seed"], 7);
    let o = toolsift_in(tmp.path(), tmp.path(), &common)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(!o.stdout.is_empty());
    let report = std::path::absolute(tmp.path().join("toolsift-demo-eval/eval.json")).unwrap();
    let relative = Path::new("toolsift-demo-eval").join("eval.json");
    assert!(
        stderr.contains(&format!("wrote {}", report.display()))
            || stderr.contains(&format!("wrote {}", relative.display())),
        "{stderr}"
    );
}

/// bench's `--placement`, `--seed` and `--device` reach the run: the report says the placement
/// (one small run: the GEMM peak it measures takes most of its 1.7 s), seed 2's workload does
/// not fit the fixture where seed 1's does, and CUDA without a CUDA build is refused.
#[test]
fn bench_passes_placement_seed_and_device() {
    let model = tiny("f32");
    let bench = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["bench", "--model", model.to_str().unwrap(), "--texts", "1"])
            .args(["--reps", "1", "--skip-baselines"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), out.stdout, stderr)
    };
    let (ok, stdout, err) = bench(&["--seed", "2"]);
    assert!(!ok && err.contains("does not fit this model"), "{err}");
    if !cfg!(feature = "cuda") {
        let (ok, _, err) = bench(&["--device", "cuda"]);
        assert!(
            !ok && err.contains("built without the `cuda` feature"),
            "{err}"
        );
        assert!(stdout.is_empty());
    }
    let (ok, stdout, err) = bench(&["--placement", "inline", "--seed", "1"]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(report["placement"], "inline", "{report}");
}

// ---- from the review of cli/annotate.rs, cli/generate.rs, generate/jsonl.rs, util/fs.rs ----

/// `toolsift generate ARGS` on the tiny fixture: (success, stdout, stderr).
fn generate_tiny(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .arg("generate")
        .arg("--model")
        .arg(tiny("f32"))
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.success(), text(&o.stdout), text(&o.stderr))
}

/// The completion `generate` wrote on stdout for its one prompt.
fn completion_of(stdout: &str) -> String {
    let line: Value = serde_json::from_str(stdout).unwrap();
    line["completion"].as_str().unwrap().to_string()
}

/// `generate`'s --seed, --top-k and --max-new-tokens reach the loop: two seeds sample two
/// completions, `--top-k 1` samples the greedy one, a cap of 3 tokens writes a strict prefix of
/// a cap of 6; and a --seed without a temperature is said to have no effect, as --top-k is.
#[test]
fn generate_sampling_and_length_flags_reach_the_loop() {
    let run = |extra: &[&str]| {
        let mut args = vec!["--prompt", "The sum"];
        if !extra.contains(&"--max-new-tokens") {
            args.extend(["--max-new-tokens", "6"]);
        }
        args.extend(extra);
        let (ok, stdout, stderr) = generate_tiny(&args);
        assert!(ok, "{extra:?}: {stderr}");
        (completion_of(&stdout), stderr)
    };
    let (greedy, _) = run(&[]);
    let sampled = |seed| run(&["--temperature", "0.9", "--seed", seed]).0;
    assert_ne!(sampled("3"), sampled("4"), "the seed picks the draws");
    let (top1, _) = run(&["--temperature", "0.9", "--seed", "4", "--top-k", "1"]);
    assert_eq!(top1, greedy, "--top-k 1 draws the most likely token");
    let (short, _) = run(&["--max-new-tokens", "3"]);
    assert!(
        short.len() < greedy.len() && greedy.starts_with(&short),
        "{short:?} {greedy:?}"
    );
    let (_, stderr) = run(&["--seed", "5"]);
    assert!(
        stderr.contains("--top-k and --seed have no effect"),
        "{stderr}"
    );
}

/// On the demo model's arithmetic prompt, `--max-call-tokens 2` closes the call before its
/// arrow (too_long), and a length cap that cuts the Calculator's result is said in the summary.
#[test]
fn generate_max_call_tokens_reaches_the_loop_and_a_cut_result_is_said() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("p.jsonl");
    std::fs::write(
        &input,
        "{\"id\": 0, \"prompt\": \"Out of 540 voters, 108 (or\"}\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--demo", "--input", input.to_str().unwrap()];
        args.extend(extra);
        let o = toolsift_in(tmp.path(), tmp.path(), &args).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{stderr}");
        let line: Value = serde_json::from_slice(&o.stdout).unwrap();
        (line["calls"][0].clone(), stderr)
    };
    let (call, _) = run(&["--max-new-tokens", "24"]);
    assert_eq!(
        (&call["status"], &call["result"]),
        (&json!("ok"), &json!("20"))
    );
    let (call, _) = run(&["--max-new-tokens", "24", "--max-call-tokens", "2"]);
    assert_eq!(call["status"], "too_long", "{call}");
    // 19 tokens end right after the arrow's space: "20" is spliced, then cut.
    let (call, stderr) = run(&["--max-new-tokens", "19"]);
    assert_eq!(
        (&call["status"], &call["result"]),
        (&json!("unfinished"), &json!("20"))
    );
    assert!(
        stderr.contains(
            "1 prompt: 1 generated (1 call, 1 with a result, 1 of them cut off by the length cap)"
        ),
        "{stderr}"
    );
}

/// `generate --output` naming a file of the model folder is refused before anything is written
/// (the model's own config.json here, in a copy of the fixture).
#[test]
fn generate_refuses_an_output_in_the_model_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny("f32").join(name), model.join(name)).unwrap();
    }
    let config = std::fs::read(model.join("config.json")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args([
            "generate",
            "--prompt",
            "The sum",
            "--max-new-tokens",
            "2",
            "--model",
        ])
        .arg(&model)
        .arg("--output")
        .arg(model.join("config.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("a file of the model folder"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(model.join("config.json")).unwrap(), config);
}

/// `generate --resume` keeps the lines an output answers and generates the rest only: said on
/// stderr, and the summary counts this run's lines (3 of 5), not the whole input's.
#[test]
fn generate_resume_generates_only_the_lines_left() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let prompts: String = (0..5)
        .map(|k| format!("{{\"id\": {k}, \"prompt\": \"The sum of {k}\"}}\n"))
        .collect();
    std::fs::write(&input, prompts).unwrap();
    let output = tmp.path().join("out.jsonl");
    let args = [
        "--max-new-tokens",
        "3",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ];
    let (ok, _, stderr) = generate_tiny(&args);
    assert!(ok, "{stderr}");
    let whole = std::fs::read_to_string(&output).unwrap();
    let kept: String = whole.lines().take(2).map(|l| format!("{l}\n")).collect();
    std::fs::write(&output, &kept).unwrap();
    let mut resumed = args.to_vec();
    resumed.push("--resume");
    let (ok, _, stderr) = generate_tiny(&resumed);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("resuming: 2 lines") && stderr.contains("3 prompts: 3 generated"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), whole);
}

/// The settings of `annotate` runs on the tiny fixture (as annotate_e2e's binary runs').
fn annotate_config(dir: &Path) -> PathBuf {
    let path = dir.join("toolsift.toml");
    let prompt = |call: &str| format!("prompt = \"[{call}] 1\\nInput: {{x}}\\nOutput: \"\n");
    let text = format!(
        "max_call_tokens = 4\n[per_tool.calculator]\nk = 2\nm = 2\n{}[per_tool.calendar]\nk = 1\n\
         m = 2\n{}[tools.calendar]\ndate = \"2023-01-30\"\n",
        prompt("Calculator(1)"),
        prompt("Calendar()")
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `toolsift annotate` on the tiny fixture in `dir`, from `corpus` (written there) into `out`.
fn annotate_tiny(dir: &Path, corpus: &str, out: &str, extra: &[&str]) -> std::process::Output {
    let config = annotate_config(dir);
    std::fs::write(dir.join("corpus.jsonl"), corpus).unwrap();
    Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .current_dir(dir)
        .env_remove("JOB_COMPLETION_INDEX")
        .env_remove("SLURM_ARRAY_TASK_ID")
        .args([
            "annotate",
            "--no-progress",
            "--corpus",
            "corpus.jsonl",
            "--out",
            out,
        ])
        .arg("--model")
        .arg(tiny("f32"))
        .arg("--config")
        .arg(config)
        .args(extra)
        .output()
        .unwrap()
}

/// The warning that every corpus line was rejected is for a corpus whose every line was: not
/// for one with a line annotated, nor for an empty one.
#[test]
fn annotate_warns_only_when_every_line_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    for (corpus, out) in [
        (
            "{\"text\": \"the cat sat on 3 mats\"}\n{\"body\": \"2 dogs\"}\n",
            "some.jsonl",
        ),
        ("", "empty.jsonl"),
    ] {
        let o = annotate_tiny(tmp.path(), corpus, out, &[]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{stderr}");
        assert!(stderr.contains(&format!("wrote {out}")), "{stderr}");
        assert!(!stderr.contains("warning"), "{corpus:?}: {stderr}");
    }
}

/// `annotate --shards N` with JOB_COMPLETION_INDEX set runs that shard, into the shard's
/// output; a --device the build has no backend for is refused, not run on the CPU.
#[test]
fn annotate_passes_shards_and_device_to_the_job() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = "{\"text\": \"the cat sat on 3 mats\"}\n{\"text\": \"2 dogs\"}\n";
    let mut cmd_out = annotate_tiny(tmp.path(), corpus, "o.jsonl", &["--shards", "2"]);
    assert!(!cmd_out.status.success(), "JOB_COMPLETION_INDEX is unset");
    let config = annotate_config(tmp.path());
    cmd_out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .current_dir(tmp.path())
        .env("JOB_COMPLETION_INDEX", "1")
        .env_remove("SLURM_ARRAY_TASK_ID")
        .args([
            "annotate",
            "--no-progress",
            "--corpus",
            "corpus.jsonl",
            "--out",
            "o.jsonl",
        ])
        .args(["--shards", "2", "--model"])
        .arg(tiny("f32"))
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&cmd_out.stderr);
    assert!(cmd_out.status.success(), "{stderr}");
    let shard = std::fs::read_to_string(tmp.path().join("o.shard-00001-of-00002.jsonl")).unwrap();
    assert_eq!(shard.lines().count(), 1, "{shard}");
    if !cfg!(feature = "cuda") {
        let o = annotate_tiny(tmp.path(), corpus, "gpu.jsonl", &["--device", "cuda"]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && stderr.contains("built without the `cuda` feature"),
            "{stderr}"
        );
        assert!(!tmp.path().join("gpu.jsonl").exists());
    }
}

/// `toolsift index` warns about ids held twice only where there are some.
#[test]
fn index_says_nothing_of_duplicate_ids_without_any() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = tmp.path().join("docs.jsonl");
    std::fs::write(
        &docs,
        "{\"id\": \"z\", \"text\": \"A zebra.\"}\n{\"id\": \"q\", \"text\": \"A quagga.\"}\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["index", "--docs"])
        .arg(&docs)
        .arg("--out")
        .arg(tmp.path().join("idx"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("indexed 2 documents (0 blank lines skipped)"),
        "{stderr}"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
}

/// `toolsift merge` says what it merged: documents and rejects apart, the corpus lines and the
/// shard count (two shards of a 3-line corpus whose second line is rejected).
#[test]
fn merge_counts_documents_rejects_lines_and_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus =
        "{\"text\": \"the cat sat on 3 mats\"}\n{\"body\": \"x\"}\n{\"text\": \"2 dogs\"}\n";
    for shard in ["0/2", "1/2"] {
        let o = annotate_tiny(tmp.path(), corpus, "o.jsonl", &["--shard", shard]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .current_dir(tmp.path())
        .args(["merge", "--out", "m.jsonl"])
        .args([
            "o.shard-00000-of-00002.jsonl",
            "o.shard-00001-of-00002.jsonl",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "merged 2 documents and 1 rejects (3 corpus lines) from 2 shards into m.jsonl"
        ),
        "{stderr}"
    );
}

// From the hand mutation review of the score/convert/bench CLI glue (session 50).

/// An input that exists but cannot be opened (a Unix socket: open fails with ENXIO after the
/// checks before the model load pass) is named by its path.
#[cfg(unix)]
#[test]
fn an_input_that_cannot_be_opened_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("in.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let out = tmp.path().join("out.jsonl");
    let (ok, stderr) = run_score_unread(&tiny("f32"), &socket, &out, &[]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("error: {}: ", socket.display())),
        "{stderr}"
    );
}

/// A full stdout is no reader gone away: `score --output -` into /dev/full fails, exit 1,
/// naming the streams, where a closed pipe ends quietly.
#[cfg(target_os = "linux")]
#[test]
fn a_full_stdout_fails_score_with_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(&input, format!("{}\n", token_lines()[0])).unwrap();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["score", "--model"])
        .arg(tiny("f32"))
        .arg("--input")
        .arg(&input)
        .args(["--output", "-"])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("into <stdout>") && stderr.contains("(os error 28)"),
        "{stderr}"
    );
}

/// Makes a named pipe at `path`; false (said on stderr) where mkfifo is not available.
#[cfg(unix)]
fn made_fifo(path: &Path) -> bool {
    let made = Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("SKIPPED: mkfifo is not available");
    }
    made
}

/// A named pipe as `--output` whose reader goes away is an error naming it, exit 1: only a
/// closed stdout ends quietly. Opened for reading and writing (as a regular output is, to lock
/// it), the pipe had this run as its own reader: no write ever failed, and once the pipe's
/// buffer was full the run waited forever.
#[cfg(unix)]
#[test]
fn a_named_pipe_output_whose_reader_leaves_fails_instead_of_hanging() {
    use std::io::Read;
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("out.fifo");
    if !made_fifo(&fifo) {
        return;
    }
    // Far more output than a pipe holds (64 KiB on Linux), so that some of it is written
    // after the reader has gone, however the two race.
    let lines: String = token_lines().iter().map(|l| format!("{l}\n")).collect();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(&input, lines.repeat(100)).unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut first = [0u8; 10];
            std::fs::File::open(&fifo)
                .unwrap()
                .read_exact(&mut first)
                .unwrap();
            first
        })
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["score", "--model"])
        .arg(tiny("f32"))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&fifo)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(&reader.join().unwrap(), b"{\"id\":\"cas");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("score still writing into a pipe nobody reads after 20 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("into {}", fifo.display())) && stderr.contains("Broken pipe"),
        "{stderr}"
    );
}

/// A model folder whose tokenizer has more ids (the fixture's 500) than config.json's
/// vocab_size is loaded with a warning that names the highest id and the vocab_size; one with
/// a row for each id (vocab_size 500) loads without it.
#[test]
fn a_tokenizer_with_more_ids_than_vocab_size_is_a_warning() {
    use toolsift::model::{DType, GptjConfig, GptjWeights, Tokenizer};
    let tmp = tempfile::tempdir().unwrap();
    let tokenizer = Tokenizer::from_file(&tiny("f32").join("tokenizer.json")).unwrap();
    for (vocab_size, warned) in [(256, true), (500, false)] {
        let config = GptjConfig::small(1, 16, 2, 4, vocab_size);
        let weights = GptjWeights::random(&config, 5, DType::F32);
        let model = toolsift::Model::from_parts(config, weights, Some(tokenizer.clone())).unwrap();
        let dir = tmp.path().join(format!("model-{vocab_size}"));
        model.save(&dir).unwrap();
        let (ok, _, stderr) = run_score(&dir, &[], &[]);
        assert!(ok, "{stderr}");
        let warning = format!(
            "the tokenizer has ids up to 499, but config.json's vocab_size is {vocab_size}"
        );
        assert_eq!(stderr.contains(&warning), warned, "{vocab_size}: {stderr}");
    }
}

// ---- from a second review of src/cli ----

/// annotate's last note counts the rejected lines and names the rejects file and the summary
/// file, each as itself: one of two corpus lines has no text, so one reject.
#[test]
fn annotate_names_its_rejects_count_rejects_file_and_summary_file() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = "{\"text\": \"the cat sat on 3 mats\"}\n{\"body\": \"2 dogs\"}\n";
    let o = annotate_tiny(tmp.path(), corpus, "some.jsonl", &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "wrote some.jsonl (1 rejects in some.rejects.jsonl, summary in some.summary.json)"
        ),
        "{stderr}"
    );
}

/// `convert --dtype f32` writes f32 from a checkpoint that is not (the tiny fixture's f16 copy;
/// the other dtypes are pinned from an f32 source above).
#[test]
fn convert_dtype_f32_widens_an_f16_checkpoint() {
    use toolsift::model::DType;
    let tmp = tempfile::tempdir().unwrap();
    let source = toolsift::Model::load(tiny("f16")).unwrap();
    let tensors = source.weights().named_tensors(source.config());
    assert!(
        tensors.iter().all(|(_, t)| t.dtype() == DType::F16),
        "the source must be f16"
    );
    let out = tmp.path().join("wide");
    let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["convert", "--dtype", "f32", "--model"])
        .arg(tiny("f16"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model = toolsift::Model::load(&out).unwrap();
    for (name, t) in model.weights().named_tensors(model.config()) {
        assert_eq!(t.dtype(), DType::F32, "{name}");
    }
}

/// The note a stop signal prints names the journal of the file this run writes: a shard's
/// (`o.shard-00001-of-00002.jsonl.partial`), not that of the --out given. The signal is sent
/// once that journal exists, so it lands in the run, after the note is set; a run that ends
/// before the test sees its journal is tried again on a longer corpus.
#[cfg(unix)]
#[test]
fn a_stop_signal_names_the_journal_of_the_shard_being_written() {
    let tmp = tempfile::tempdir().unwrap();
    let config = annotate_config(tmp.path());
    let journal = tmp.path().join("o.shard-00001-of-00002.jsonl.partial");
    for lines in [400, 4000, 40000] {
        for name in [
            "o.shard-00001-of-00002.jsonl",
            "o.shard-00001-of-00002.jsonl.partial",
        ] {
            let _ = std::fs::remove_file(tmp.path().join(name));
        }
        let corpus = "{\"text\": \"the cat sat on 3 mats\"}\n".repeat(lines);
        std::fs::write(tmp.path().join("corpus.jsonl"), corpus).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .current_dir(tmp.path())
            .env("JOB_COMPLETION_INDEX", "1")
            .env_remove("SLURM_ARRAY_TASK_ID")
            .args(["annotate", "--no-progress", "--corpus", "corpus.jsonl"])
            .args(["--out", "o.jsonl", "--shards", "2", "--model"])
            .arg(tiny("f32"))
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        while !journal.exists() && child.try_wait().unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            continue;
        }
        // SAFETY: kill(2) on the child this test started and has not waited for.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            continue; // it ended before the signal came
        }
        assert!(
            stderr.contains(
                "stopped by SIGTERM: run the same command again to resume from the journal \
                 o.shard-00001-of-00002.jsonl.partial"
            ),
            "{stderr}"
        );
        return;
    }
    panic!("every run ended before the test saw its journal");
}

/// With `--batch-size 1` each prompt's completion reaches a pipe's reader before the next
/// prompt is written (the default, 32, waits for more input): the flag reaches the loop.
#[test]
fn generate_batch_size_sets_when_completions_reach_a_pipe() {
    let args = ["--input", "-", "--batch-size", "1", "--max-new-tokens", "3"];
    let prompt = json!({"id": "p-0", "prompt": "the cat sat on"}).to_string();
    let first = first_line_before_the_input_ends("generate", &args, &prompt, 60);
    let first = first.expect("no completion before the input ended");
    let line: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(line["id"], "p-0", "{line}");
}

/// `annotate --demo` names a relative --out by its absolute path, where it says C* will go and
/// where it went: a path that reads the same from any folder the note is read in.
#[test]
fn annotate_demo_names_its_output_by_its_absolute_path() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "annotate",
        "--demo",
        "--no-progress",
        "--demo-docs",
        "1",
        "--out",
        "c.jsonl",
    ];
    let o = toolsift_in(cwd.path(), tmp.path(), &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let cwd = std::fs::canonicalize(cwd.path()).unwrap();
    let shown = cwd.join("c.jsonl");
    assert!(shown.is_file());
    assert!(
        stderr.contains(&format!(
            "demo: C* will be written to {}\n",
            shown.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("C*: {}\n", shown.display())),
        "{stderr}"
    );
}

/// bench's stderr line gives the unique tokens per candidate (the report's unique tokens over
/// its candidates), next to the totals.
#[test]
fn bench_says_the_unique_tokens_per_candidate() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["bench", "--layers", "1", "--embd", "32", "--heads", "2"])
        .args([
            "--rotary", "8", "--vocab", "100", "--texts", "1", "--reps", "1",
        ])
        .arg("--skip-baselines")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (unique, candidates) = (
        report["unique_tokens"].as_u64().unwrap(),
        report["candidates"].as_u64().unwrap(),
    );
    assert!(unique > candidates, "{report}");
    let want = format!(
        "{candidates} candidates, {unique} unique tokens ({:.0}/candidate)",
        unique as f64 / candidates as f64
    );
    assert!(stderr.contains(&want), "{want}: {stderr}");
}

/// The note that a resumed run had failed lines is for a run that had some: neither a fresh run
/// nor one resuming an output without a failed line says it (exit 0 both).
#[test]
fn only_a_resumed_run_with_failed_lines_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    let lines = token_lines();
    let text: String = lines[..2].iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, &text).unwrap();
    let (ok, rows, stderr) = run_score_raw(&tiny("f32"), &input, &output, &[]);
    assert!(ok && rows.len() == 2, "{stderr}");
    assert!(!stderr.contains("resumed"), "{stderr}");
    let more: String = lines[2..4].iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text + &more).unwrap();
    let (ok, rows, stderr) = run_score_raw(&tiny("f32"), &input, &output, &["--resume"]);
    assert!(ok && rows.len() == 4, "{stderr}");
    assert!(stderr.contains("resuming: 2 lines"), "{stderr}");
    assert!(!stderr.contains("resumed failed"), "{stderr}");
}

/// generate's summary counts in the plural for none as for many: an empty input is "0 prompts"
/// with "0 calls".
#[test]
fn generate_counts_an_empty_input_as_zero_prompts() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("none.jsonl");
    std::fs::write(&input, "").unwrap();
    let (ok, stdout, stderr) = generate_tiny(&["--input", input.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("0 prompts: 0 generated (0 calls, 0 with a result), 0 failed"),
        "{stderr}"
    );
}

/// generate into a named pipe whose reader leaves fails (exit 1, the pipe named), as score does:
/// only standard output's reader going ends a run quietly. The reader leaves after the first
/// completion and before the second prompt is given, so the second line meets no reader.
#[cfg(unix)]
#[test]
fn generate_into_a_named_pipe_whose_reader_leaves_fails() {
    use std::io::Write as _;
    use std::process::Stdio;
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("out.fifo");
    if !made_fifo(&fifo) {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["generate", "--model"])
        .arg(tiny("f32"))
        .args(["--input", "-", "--batch-size", "1", "--max-new-tokens", "3"])
        .arg("--output")
        .arg(&fifo)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is a process of its own, not a thread of this one: a descriptor of this
    // process is copied into each child that another test forks meanwhile, and one not yet
    // exec'd still holds the pipe open when the second line is written, which then succeeds.
    let Ok(reader) = Command::new("head")
        .args(["-n", "1"])
        .arg(&fifo)
        .stdout(Stdio::piped())
        .spawn()
    else {
        let _ = child.kill();
        let _ = child.wait();
        eprintln!("SKIPPED: head is not available");
        return;
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let _ = tx.send(reader.wait_with_output().map(|o| o.stdout));
    });
    let mut stdin = child.stdin.take().unwrap();
    let prompt = |id: &str| json!({"id": id, "prompt": "the cat sat on"});
    writeln!(stdin, "{}", prompt("p-0")).unwrap();
    stdin.flush().unwrap();
    let Ok(Ok(first)) = rx.recv_timeout(std::time::Duration::from_secs(60)) else {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("no first line: {}", String::from_utf8_lossy(&out.stderr));
    };
    let first = String::from_utf8_lossy(&first);
    reader.join().unwrap();
    // The reader has gone: the second completion has nowhere to go.
    let _ = writeln!(stdin, "{}", prompt("p-1"));
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(first.contains("p-0"), "{first}: {stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("into {}", fifo.display())) && stderr.contains("Broken pipe"),
        "{stderr}"
    );
}

/// Without --resume, generate starts its output afresh: a second run into the output of a
/// finished one generates every prompt again and says nothing of resuming.
#[test]
fn generate_without_resume_rewrites_a_finished_output() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    let prompts = [
        json!({"id": "a", "prompt": "the cat"}),
        json!({"id": "b", "prompt": "2 dogs"}),
    ];
    let text: String = prompts.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let args = [
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--max-new-tokens",
        "3",
    ];
    let (ok, _, stderr) = generate_tiny(&args);
    assert!(ok, "{stderr}");
    let first = std::fs::read_to_string(&output).unwrap();
    assert_eq!(first.lines().count(), 2, "{first}");
    let (ok, _, stderr) = generate_tiny(&args);
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("resuming"), "{stderr}");
    assert!(stderr.contains("2 prompts: 2 generated"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&output).unwrap(), first);
}

/// generate refuses an output that is its --config file through another path (here a hard link):
/// the same file, not the same spelling, is what writing would destroy.
#[test]
fn generate_refuses_its_config_as_output_through_another_path() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("tools.toml");
    let text = "[tools.calculator]\nenabled = true\n";
    std::fs::write(&config, text).unwrap();
    let link = tmp.path().join("link.toml");
    std::fs::hard_link(&config, &link).unwrap();
    let (ok, _, stderr) = generate_tiny(&[
        "--prompt",
        "the cat",
        "--config",
        config.to_str().unwrap(),
        "--output",
        link.to_str().unwrap(),
    ]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("the output is the --config file"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), text);
}

/// The every-line-rejected warning quotes the first reject's reason whole, however long (here a
/// record of over 100 bytes, naming a long --text-field), not only short ones.
#[test]
fn annotate_quotes_a_long_first_reject_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let field = "the_body_of_the_document_as_the_crawler_wrote_it_in_its_own_export";
    let o = annotate_tiny(
        tmp.path(),
        "{\"text\": \"2 dogs\"}\n",
        "long.jsonl",
        &["--text-field", field],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let record = std::fs::read_to_string(tmp.path().join("long.rejects.jsonl")).unwrap();
    assert!(record.len() > 100, "{record}");
    assert!(
        stderr.contains(&format!(
            "every one of the 1 corpus lines was rejected; the first: line 1: no field \"{field}\""
        )),
        "{stderr}"
    );
}

/// score refuses an output that is a file of the model folder through another path (a hard
/// link outside the folder), and leaves the model as it was.
#[test]
fn score_refuses_a_model_file_as_output_through_a_hard_link() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for entry in std::fs::read_dir(tiny("f32")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
        }
    }
    let config = std::fs::read(model.join("config.json")).unwrap();
    let link = tmp.path().join("out.jsonl");
    std::fs::hard_link(model.join("config.json"), &link).unwrap();
    let input = tmp.path().join("in.jsonl");
    std::fs::write(&input, format!("{}\n", token_lines()[0])).unwrap();
    let (ok, stderr) = run_score_unread(&model, &input, &link, &[]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("a file of the model folder"), "{stderr}");
    assert_eq!(std::fs::read(model.join("config.json")).unwrap(), config);
}

/// bench's random model takes its heads and rotary dims from their own flags, also where the
/// heads outnumber the rotary dims.
#[test]
fn bench_builds_its_random_model_from_the_heads_and_rotary_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["bench", "--layers", "1", "--embd", "32", "--heads", "4"])
        .args([
            "--rotary", "2", "--vocab", "100", "--texts", "1", "--reps", "1",
        ])
        .arg("--skip-baselines")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["model"], "gptj L1 d32 h4 r2 v100", "{report}");
}

/// A generate run that resumes an output with a failed line exits 3 and says so, though every
/// line it generated itself succeeded: the output as a whole has a failed line.
#[test]
fn generate_resuming_an_output_with_a_failed_line_exits_3() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    std::fs::write(&input, "{\"id\": \"bad\", \"prompt\": 5}\n").unwrap();
    let run = |resume: bool| {
        let mut args = vec!["--input", input.to_str().unwrap()];
        args.extend([
            "--output",
            output.to_str().unwrap(),
            "--max-new-tokens",
            "3",
        ]);
        args.extend(resume.then_some("--resume"));
        let o = Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .arg("generate")
            .arg("--model")
            .arg(tiny("f32"))
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(false);
    assert_eq!(code, Some(3), "{stderr}");
    let mut text = std::fs::read_to_string(&input).unwrap();
    text.push_str("{\"id\": \"ok\", \"prompt\": \"the cat\"}\n");
    std::fs::write(&input, text).unwrap();
    let (code, stderr) = run(true);
    assert!(stderr.contains("1 prompt: 1 generated"), "{stderr}");
    assert!(
        stderr.contains("the run this one resumed failed on 1 of the output's lines"),
        "{stderr}"
    );
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(std::fs::read_to_string(&output).unwrap().lines().count(), 2);
}
