//! Where two runs' records (`Summary::run`, a journal's header) differ in what decides the
//! output, named field by field; the paths whose content both runs hash are compared by the hash.

use serde_json::Value;

/// Where two runs' records (`Summary::run`, a journal's header) differ in what decides the
/// output: each field as the summary JSON names it, with its two values ("run.info.device:
/// \"Cpu\" vs \"Cuda\""); none for one run's. Where an input was read from (corpus, model, the
/// config's WikiSearch index) is not compared where both record its content's hash
/// (`without_hashed_paths`). Everything else (config, tools, line count, hashes, device) is.
pub(crate) fn run_differences(a: &Value, b: &Value) -> Vec<String> {
    let (a, b) = without_hashed_paths(a, b);
    let mut out = Vec::new();
    differences(Some(&a), Some(&b), "run".into(), &mut out);
    out
}

/// Two run records less the paths whose content both record: the corpus path where both have
/// "corpus_xxh3", the model folder where both have "info.model_xxh3", the config's WikiSearch
/// index (`[tools.wikisearch] index`) where both have "info.wikisearch_index_xxh3". So
/// `corpus.jsonl` and `$PWD/corpus.jsonl`, `model` and `model/`, or `idx` and `idx/`, are one
/// run's; a path without its hash on either side (an older journal, a run described through
/// the library) is still compared.
pub(crate) fn without_hashed_paths(a: &Value, b: &Value) -> (Value, Value) {
    fn drop_path(a: &mut Value, b: &mut Value, path: &str, hash: &str) {
        if let (Some(x), Some(y)) = (a.as_object_mut(), b.as_object_mut()) {
            if x.contains_key(hash) && y.contains_key(hash) {
                x.remove(path);
                y.remove(path);
            }
        }
    }
    let (mut a, mut b) = (a.clone(), b.clone());
    drop_path(&mut a, &mut b, "corpus", "corpus_xxh3");
    if let (Some(x), Some(y)) = (a.get_mut("info"), b.get_mut("info")) {
        // Two borrows of distinct values: `a` and `b` are separate trees.
        drop_path(x, y, "model", "model_xxh3");
    }
    let index_hashed = |v: &Value| v.pointer("/info/wikisearch_index_xxh3").is_some();
    if index_hashed(&a) && index_hashed(&b) {
        let masked = |v: &Value| {
            v.get("config")
                .and_then(Value::as_str)
                .and_then(config_without_index)
        };
        if let (Some((x, x_text)), Some((y, y_text))) = (masked(&a), masked(&b)) {
            if x == y {
                b["config"] = a["config"].clone();
            } else {
                // Still different: compared as texts whose index lines agree, so the message
                // names a line that does differ.
                a["config"] = Value::String(x_text);
                b["config"] = Value::String(y_text);
            }
        }
    }
    (a, b)
}

/// What a run config's `[tools.wikisearch] index` is replaced with where both runs record the
/// index's hash (`without_hashed_paths`).
const HASHED_INDEX: &str = "(compared by run.info.wikisearch_index_xxh3)";

/// A run config (the TOML text of `AnnotateConfig::to_toml`) with its WikiSearch index path
/// replaced by `HASHED_INDEX`: as a table, and as the text with only the index's line changed,
/// so that a difference elsewhere keeps its line number. None for a text that does not parse
/// (a journal's config is compared as written then) or that names no index.
fn config_without_index(config: &str) -> Option<(toml::Table, String)> {
    let mut table: toml::Table = toml::from_str(config).ok()?;
    let index = table
        .get_mut("tools")?
        .as_table_mut()?
        .get_mut("wikisearch")?
        .as_table_mut()?
        .get_mut("index")?;
    *index = toml::Value::String(HASHED_INDEX.into());
    let lines: Vec<&str> = config.split_inclusive('\n').collect();
    // The index's line is the one whose replacement parses to `table`: told by parsing, since
    // a prompt's text may hold a line that reads like it.
    let replaced = |at: usize| {
        let mut text = String::with_capacity(config.len() + HASHED_INDEX.len());
        for (i, line) in lines.iter().enumerate() {
            if i == at {
                let ending = &line[line.trim_end_matches(['\r', '\n']).len()..];
                text.push_str(&format!("index = {HASHED_INDEX:?}{ending}"));
            } else {
                text.push_str(line);
            }
        }
        text
    };
    let text = (0..lines.len())
        .filter(|&i| lines[i].trim_start().starts_with("index"))
        .map(replaced)
        .find(|text| toml::from_str::<toml::Table>(text).is_ok_and(|t| t == table))
        // Not found line by line (a value over several lines): the table rendered again, the
        // same way for both runs.
        .or_else(|| toml::to_string_pretty(&table).ok())?;
    Some((table, text))
}

/// Appends to `out` each field under `at` where `a` and `b` differ (None: absent), down to the
/// deepest object; a text of several lines (the config) by its first differing line.
fn differences(a: Option<&Value>, b: Option<&Value>, at: String, out: &mut Vec<String>) {
    if a == b {
        return;
    }
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                differences(x.get(k), y.get(k), format!("{at}.{k}"), out);
            }
        }
        (Some(Value::String(x)), Some(Value::String(y))) if x.contains('\n') => {
            let (mut xs, mut ys) = (x.lines(), y.lines());
            for n in 1.. {
                let (l, r) = (xs.next(), ys.next());
                if l != r {
                    let line = |s: Option<&str>| s.map(|s| Value::String(s.into()));
                    let (l, r) = (line(l), line(r));
                    out.push(format!(
                        "{at}, line {n}: {} vs {}",
                        shown(l.as_ref()),
                        shown(r.as_ref())
                    ));
                    return;
                }
                if l.is_none() {
                    break;
                }
            }
            // Lines alike, line ends not ("\r\n", a last newline).
            out.push(format!("{at}: {} vs {}", shown(a), shown(b)));
        }
        _ => out.push(format!("{at}: {} vs {}", shown(a), shown(b))),
    }
}

/// A value as JSON, cut at 80 characters: a long one is told apart by its start.
fn shown(v: Option<&Value>) -> String {
    let Some(v) = v else {
        return "(absent)".into();
    };
    let text = v.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::same_run;
    use super::*;

    #[test]
    fn runs_differ_in_what_decides_the_output_not_in_path_spellings() {
        let run = |corpus: &str, model: &str, device: &str| {
            json!({
                "config": "seed = 3\nmax_call_tokens = 4\n",
                "corpus": corpus,
                "corpus_xxh3": "00ff",
                "info": {"model": model, "model_xxh3": "01", "device": device},
            })
        };
        let a = run("corpus.jsonl", "d", "Cpu");
        assert!(run_differences(&a, &run("/w/corpus.jsonl", "d/", "Cpu")).is_empty());
        assert_eq!(
            run_differences(&a, &run("corpus.jsonl", "d", "Cuda")),
            ["run.info.device: \"Cpu\" vs \"Cuda\""]
        );
        let mut b = a.clone();
        b["config"] = json!("seed = 3\nmax_call_tokens = 5\n");
        b["info"]["model_xxh3"] = json!("02");
        b["info"]["wikisearch_index_xxh3"] = json!("03");
        assert_eq!(
            run_differences(&a, &b),
            [
                "run.config, line 2: \"max_call_tokens = 4\" vs \"max_call_tokens = 5\"",
                "run.info.model_xxh3: \"01\" vs \"02\"",
                "run.info.wikisearch_index_xxh3: (absent) vs \"03\"",
            ]
        );
        // A run whose record lacks the corpus hash (an older journal's) is compared by the
        // corpus's path, however the other run's is hashed.
        let mut older = run("/w/corpus.jsonl", "d", "Cpu");
        older.as_object_mut().unwrap().remove("corpus_xxh3");
        assert_eq!(
            run_differences(&older, &a),
            [
                "run.corpus: \"/w/corpus.jsonl\" vs \"corpus.jsonl\"",
                "run.corpus_xxh3: (absent) vs \"00ff\"",
            ]
        );
        // The same named either way round: the hashed run given first.
        assert_eq!(
            run_differences(&a, &older)[0],
            "run.corpus: \"corpus.jsonl\" vs \"/w/corpus.jsonl\""
        );
        // A path without its content hash beside it is all there is to compare.
        assert_eq!(
            run_differences(
                &json!({"info": {"model": "d"}}),
                &json!({"info": {"model": "e"}})
            ),
            ["run.info.model: \"d\" vs \"e\""]
        );
        let long = "x".repeat(200);
        let diff = run_differences(&json!({"tools": [long]}), &json!({"tools": []}));
        // Cut at 80 characters of its JSON: "[\"" and 78 of the x's.
        assert_eq!(diff, [format!("run.tools: [\"{}... vs []", "x".repeat(78))]);
    }

    /// The index's line is told by parsing, not by how it starts: a prompt's line that reads
    /// like it is left as it is, and a setting after the index is named at its own line.
    #[test]
    fn a_prompt_line_that_reads_like_the_index_is_not_taken_for_it() {
        use crate::annotate::config::AnnotateConfig;
        use crate::annotate::tools::WikiSearchConfig;
        let config = |index: &str, max_snippet_chars: usize| {
            let mut c = AnnotateConfig::default();
            c.per_tool.wikisearch.prompt = "index = 1\nInput: x\nOutput:".into();
            c.tools.wikisearch = Some(WikiSearchConfig {
                index: index.into(),
                max_snippet_chars,
            });
            c.to_toml()
        };
        let run = |config: String| {
            let info = json!({"model": "d", "wikisearch_index_xxh3": "0a"});
            json!({"config": config, "info": info})
        };
        let text = config("idx", 300);
        let line = |what: &str| 1 + text.lines().position(|l| l.starts_with(what)).unwrap();
        assert!(line("index = 1") < line("index = \"idx"), "{text}");
        let chars = line("max_snippet_chars");
        assert!(chars > line("index = \"idx"), "{text}");
        assert_eq!(
            run_differences(&run(config("idx", 300)), &run(config("/w/idx", 400))),
            [format!(
                "run.config, line {chars}: \"max_snippet_chars = 300\" vs \
                 \"max_snippet_chars = 400\""
            )]
        );
    }

    /// Texts whose lines agree but whose line ends do not ("\r\n", a last newline) are named as
    /// whole values: a difference found by no line is still one, not two runs taken as one.
    #[test]
    fn texts_that_differ_only_in_line_ends_differ() {
        let a = json!({"config": "seed = 3\nmax_call_tokens = 4\n"});
        let b = json!({"config": "seed = 3\r\nmax_call_tokens = 4"});
        assert_eq!(
            run_differences(&a, &b),
            [concat!(
                r#"run.config: "seed = 3\nmax_call_tokens = 4\n" vs "#,
                r#""seed = 3\r\nmax_call_tokens = 4""#
            )]
        );
    }

    /// Where both runs hold their WikiSearch index's hash, the index's path in the config is
    /// not compared: the configs' other settings are, each named at its own line.
    #[test]
    fn runs_differ_in_their_configs_not_in_the_spelling_of_a_hashed_index() {
        use crate::annotate::config::AnnotateConfig;
        use crate::annotate::tools::WikiSearchConfig;
        let config = |index: &str, seed: u64| {
            let mut c = AnnotateConfig {
                seed,
                ..AnnotateConfig::default()
            };
            c.tools.wikisearch = Some(WikiSearchConfig {
                index: index.into(),
                max_snippet_chars: 300,
            });
            c.to_toml()
        };
        let run = |config: String, hash: Option<&str>| {
            let mut r = json!({"config": config, "info": {"model": "d"}});
            if let Some(h) = hash {
                r["info"]["wikisearch_index_xxh3"] = json!(h);
            }
            r
        };
        let a = run(config("idx", 3), Some("0a"));
        let text = config("idx", 3);
        let line = |what: &str| 1 + text.lines().position(|l| l.starts_with(what)).unwrap();
        // The index after the seed and a prompt (whose text holds lines), so that the lines are
        // numbered as the config's own.
        assert!(line("index = ") > line("seed = "), "{text}");
        for spelling in ["/w/idx", "idx/", "./idx"] {
            let b = run(config(spelling, 3), Some("0a"));
            assert!(run_differences(&a, &b).is_empty(), "{spelling}");
            let (x, y) = without_hashed_paths(&a, &b);
            assert!(same_run(&x, &y), "{spelling}");
        }
        // The index's content is still compared, by its hash.
        assert_eq!(
            run_differences(&a, &run(config("/w/idx", 3), Some("0b"))),
            ["run.info.wikisearch_index_xxh3: \"0a\" vs \"0b\""]
        );
        // Another setting is named at its own line of the config, with both values.
        let seed = line("seed = ");
        assert_eq!(
            run_differences(&a, &run(config("/w/idx", 4), Some("0a"))),
            [format!(
                "run.config, line {seed}: \"seed = 3\" vs \"seed = 4\""
            )]
        );
        // Without the hash on both sides the path is all there is to compare.
        let index = line("index = ");
        for (x, y) in [(Some("0a"), None), (None, None)] {
            let diff = run_differences(&run(config("idx", 3), x), &run(config("/w/idx", 3), y));
            assert!(
                diff.contains(&format!(
                    "run.config, line {index}: \"index = \\\"idx\\\"\" vs \
                     \"index = \\\"/w/idx\\\"\""
                )),
                "{diff:?}"
            );
        }
    }

    /// A config of several lines against one of a single line (a hand-written record, a config
    /// cut short) is still named by its first differing line, whichever side holds the lines.
    #[test]
    fn a_text_of_several_lines_is_named_by_its_line_against_one_of_one_line() {
        let several = json!({"config": "seed = 3\nmax_call_tokens = 4\n"});
        let one = json!({"config": "seed = 4"});
        assert_eq!(
            run_differences(&several, &one),
            ["run.config, line 1: \"seed = 3\" vs \"seed = 4\""]
        );
    }

    /// An index path holding a newline is written over several lines of the config (a
    /// multi-line string), so no single line's replacement parses to the masked table: the
    /// table rendered again is compared, and two spellings of one hashed index are one run.
    #[test]
    fn a_hashed_index_written_over_several_lines_is_still_not_compared_by_its_path() {
        use crate::annotate::config::AnnotateConfig;
        use crate::annotate::tools::WikiSearchConfig;
        let run = |index: &str| {
            let mut c = AnnotateConfig::default();
            c.tools.wikisearch = Some(WikiSearchConfig {
                index: index.into(),
                max_snippet_chars: 300,
            });
            let info = json!({"model": "d", "wikisearch_index_xxh3": "0a"});
            json!({"config": c.to_toml(), "info": info})
        };
        let (a, b) = (run("my\nidx"), run("/w/my\nidx"));
        let config = a["config"].as_str().unwrap();
        assert!(
            !config
                .lines()
                .any(|l| l.starts_with("index = ") && l.contains("idx")),
            "the index on one line: {config}"
        );
        assert!(run_differences(&a, &b).is_empty());
        // Another setting beside it is still found.
        let mut c = run("my\nidx");
        c["config"] = json!(config.replace("max_snippet_chars = 300", "max_snippet_chars = 301"));
        assert_eq!(run_differences(&a, &c).len(), 1);
    }
}
