//! Property tests of the text inputs: arbitrary bytes, arbitrary strings and structured-random
//! JSON lines never panic the parsers, every error names its line or field, and every input line
//! comes out exactly once, as a record or as an error. Resuming from an output or journal cut at
//! a random byte gives the uninterrupted run's output, or a clear error.
//!
//! Case counts are modest; `TOOLSIFT_FUZZ_CASES=2000 cargo test --release --test input_fuzz`
//! hunts longer (each run draws new cases).
//!
//! Found so far: `score_resumes_from_any_cut` (an id echoed from a line whose other key, held
//! twice, holds a lone surrogate made `--resume` refuse the run's own output; regression test
//! `util::jsonl::tests::ids_are_read_back_as_the_run_read_them`), and
//! `merge_of_damaged_shards_is_whole_or_refused` (a shard missing the corpus's last lines was
//! refused without naming its files).

mod common;

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use serde_json::{json, Value};
use toolsift::annotate::calls::{clean_result, input_only_ahead, input_problem, parse_call};
use toolsift::annotate::corpus::{count_lines, parse_line, Corpus};
use toolsift::annotate::tools::{evaluate, format_result, Calendar, DocContext, Tool};
use toolsift::annotate::{AnnotateConfig, JournalEntry, Line};
use toolsift::score::text::check_call;
use toolsift::score::{call_text, splice};
use toolsift::util::json::parse_line as json_line;
use toolsift::util::jsonl::JsonlLines;
use toolsift::CallForm;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: common::fuzz_cases(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Pieces that parsers treat specially, so that random text hits them often.
const PIECES: &[&str] = &[
    "\n",
    "\r\n",
    "\r",
    "\0",
    "\u{feff}",
    "\u{2028}",
    "é",
    "𝄞",
    "\u{85}",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "\"",
    "\\",
    "\\u",
    "\\ud800",
    "\\udc00",
    "\\ud800\\udc00",
    ",",
    ":",
    "->",
    "→",
    " ",
    "\t",
    "0",
    "1,400",
    "99999999999999999999999999999999999999999",
    "-",
    "+",
    "*",
    "/",
    ".",
    "e",
    "1e400",
    "-0",
    "18446744073709551616",
    "\"id\"",
    "\"text\"",
    "\"url\"",
    "\"date\"",
    "\"position\"",
    "\"text_ids\"",
    "null",
    "true",
    "Calculator",
    "Calendar",
    "<|endoftext|>",
    "2023-01-30",
    "20230130",
    "/2023/01/30/",
];

/// Text made of random pieces and random characters.
fn texty() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(PIECES).prop_map(str::to_string),
            1 => any::<char>().prop_map(|c| c.to_string()),
            1 => "[a-z0-9 ]{0,6}",
        ],
        0..24,
    )
    .prop_map(|v| v.concat())
}

/// A line (or table header and line) of a settings file, with random values.
fn config_text() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-0.0".to_string()),
        Just("1e-320".to_string()),
        Just("0.1".to_string()),
        Just("9223372036854775807".to_string()),
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("2".to_string()),
        Just("true".to_string()),
        Just("[0.5, 0.25]".to_string()),
        Just("[]".to_string()),
        Just("\"2023-02-29\"".to_string()),
        Just("\"2023-01-30\"".to_string()),
        Just("\"inline\"".to_string()),
        Just("\"bare\"".to_string()),
        texty().prop_map(|t| Value::from(format!("{t}{{x}}{t}")).to_string()),
        texty().prop_map(|t| Value::from(t).to_string()),
    ];
    let key = prop::sample::select(
        &[
            "text_field",
            "seed",
            "placement",
            "call_form",
            "weights",
            "max_call_tokens",
            "temperature",
            "top_k_tokens",
            "tau_s",
            "k",
            "m",
            "tau_f",
            "min_numbers",
            "require_arithmetic",
            "require_date",
            "min_foreign_words",
            "drop_lookahead_inputs",
            "prompt",
            "date",
            "enabled",
        ][..],
    );
    let table = prop::sample::select(
        &[
            "",
            "[per_tool.calculator]\n",
            "[per_tool.calendar]\n",
            "[tools.calendar]\n",
            "[tools.calculator]\n",
            "[per_tool.custom.Echo]\n",
        ][..],
    );
    prop::collection::btree_map(table, prop::collection::btree_map(key, value, 0..4), 0..4)
        .prop_map(|tables| {
            let mut text = String::new();
            // The top-level keys first: a key after a header belongs to that table.
            for (t, keys) in &tables {
                text.push_str(t);
                for (k, v) in keys {
                    text.push_str(&format!("{k} = {v}\n"));
                }
            }
            text
        })
}

/// Bytes: random, or text with invalid UTF-8 sprinkled in.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        prop::collection::vec(
            prop_oneof![
                4 => texty().prop_map(String::into_bytes),
                1 => prop::collection::vec(any::<u8>(), 0..4),
                1 => Just(b"\xEF\xBB\xBF".to_vec()),
                1 => Just(b"\xff\xfe".to_vec()),
            ],
            0..8,
        )
        .prop_map(|v| v.concat()),
    ]
}

/// A random JSON value, up to `depth` levels deep.
fn json_value(depth: u32) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        texty().prop_map(Value::from),
    ];
    leaf.prop_recursive(depth, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec(("[a-z]{1,4}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A field value as it is written in a line: valid JSON, or one of the texts that JSON readers
/// trip over (huge numbers, lone surrogates, deep nesting, a key held twice inside).
fn field_text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => json_value(3).prop_map(|v| v.to_string()),
        1 => Just("1e400".to_string()),
        1 => Just("-1e400".to_string()),
        1 => Just("123456789012345678901234567890".to_string()),
        1 => Just("\"\\ud800\"".to_string()),
        1 => Just("\"a\\udc00b\"".to_string()),
        1 => Just("\"\\ud83d\\ude00\"".to_string()),
        1 => Just("\"\\u0000\"".to_string()),
        1 => (1usize..300).prop_map(|n| format!("{}1{}", "[".repeat(n), "]".repeat(n))),
        1 => (1usize..300).prop_map(|n| format!("{}{}", "{\"a\":".repeat(n), "}".repeat(n))),
        1 => Just(r#"{"k": 1, "k": [2]}"#.to_string()),
        1 => Just(r#"[0, {"a": {"b": 1, "c": 0, "b": 2}}]"#.to_string()),
        1 => Just("0.1".to_string()),
        1 => Just("-0".to_string()),
        1 => Just("7".to_string()),
        1 => Just("\"2023-01-30\"".to_string()),
        1 => Just("\"Out of 1400 people, 400 said yes.\"".to_string()),
    ]
}

/// A line that is valid-ish JSON: an object of known and unknown keys with random values, keys
/// sometimes twice, sometimes cut short, with stray bytes around.
fn json_line_text(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    (
        prop::collection::vec(
            (
                prop_oneof![4 => prop::sample::select(keys), 1 => Just("zz")],
                field_text(),
            ),
            0..7,
        ),
        prop_oneof![
            6 => Just(""),
            1 => Just(" "),
            1 => Just("\u{feff}"),
            1 => Just("\t\u{a0}")
        ],
        any::<u8>(),
    )
        .prop_map(|(fields, pad, cut)| {
            let body: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{}: {v}", Value::from(*k)))
                .collect();
            let line = format!("{pad}{{{}}}{pad}", body.join(", "));
            if cut < 16 {
                // Cut short somewhere, on a character boundary.
                let at = line
                    .char_indices()
                    .map(|(i, _)| i)
                    .nth(usize::from(cut) * line.len() / 16 % line.len().max(1))
                    .unwrap_or(0);
                line[..at].to_string()
            } else {
                line
            }
        })
}

/// The first key held twice in the fields of `line`'s object that `reads` names, found apart
/// from the parser's own choice: the line is written again with only those fields' text, each
/// other field once with null for its value, and read whole. None when serde_json cannot split
/// the line into fields (not an object, or not JSON it reads).
fn duplicate_in_fields_read(
    line: &str,
    reads: impl Fn(&str) -> bool,
) -> Option<Option<toolsift::util::json::Duplicate>> {
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
    use serde_json::value::RawValue;

    /// An object's fields in order, keys held twice included, each value as its text.
    struct Fields(Vec<(String, Box<RawValue>)>);
    impl<'de> Deserialize<'de> for Fields {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Each;
            impl<'de> Visitor<'de> for Each {
                type Value = Fields;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                    let mut fields = Vec::new();
                    while let Some(field) = map.next_entry()? {
                        fields.push(field);
                    }
                    Ok(Fields(fields))
                }
            }
            d.deserialize_map(Each)
        }
    }

    let Fields(fields) = serde_json::from_str(line).ok()?;
    let mut others = std::collections::HashSet::new();
    let body: Vec<String> = fields
        .iter()
        .filter_map(|(key, value)| {
            let text = if reads(key) {
                value.get()
            } else if others.insert(key) {
                "null"
            } else {
                return None;
            };
            Some(format!("{}: {text}", Value::from(key.as_str())))
        })
        .collect();
    Some(json_line(&format!("{{{}}}", body.join(", "))).ok()?.1)
}

/// The lines of `bytes` as a line reader must see them: split after each "\n", a last line
/// without one counting.
fn expected_lines(bytes: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
    for l in &mut lines {
        *l = l.strip_suffix(b"\n").unwrap_or(l);
    }
    lines
}

fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{what} panicked: {msg}")
        }
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// Every line of the input is one item, numbered in order; its text is the line's (less
    /// "\r\n", less a BOM before line 1) or a reason.
    #[test]
    fn jsonl_lines_give_every_line_once(input in bytes(), max in 0usize..64) {
        let want = expected_lines(&input);
        for limit in [usize::MAX, max] {
            let got: Vec<_> = no_panic("JsonlLines", || {
                JsonlLines::new(Cursor::new(&input))
                    .with_max_line_bytes(limit)
                    .map(Result::unwrap)
                    .collect()
            });
            prop_assert_eq!(got.len(), want.len());
            for (k, ((n, text), raw)) in got.iter().zip(&want).enumerate() {
                prop_assert_eq!(*n, k + 1);
                // The limit is on the line less its "\r\n" (or a last line's "\r").
                let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
                match text {
                    Ok(t) => {
                        prop_assert!(raw.len() <= limit);
                        let raw = match k {
                            0 => raw.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(raw),
                            _ => raw,
                        };
                        prop_assert_eq!(t.as_bytes(), raw);
                    }
                    Err(why) => prop_assert!(
                        raw.len() > limit || std::str::from_utf8(raw).is_err(),
                        "{why}"
                    ),
                }
            }
        }
    }

    /// The corpus reader: every line is a document or a reject, once, in order, and the line
    /// count `annotate` and `merge` check agrees.
    #[test]
    fn corpus_lines_are_each_a_document_or_a_reject(
        lines in prop::collection::vec(
            prop_oneof![
                3 => json_line_text(&["text", "id", "url", "date", "body"]),
                1 => texty(),
            ],
            0..8,
        ),
        crlf in any::<bool>(),
        trailing in any::<bool>(),
        field in prop::sample::select(&["text", "id", "url", "date", "body", ""][..]),
        max in 0usize..80,
        shard in 0u64..3,
    ) {
        let sep = if crlf { "\r\n" } else { "\n" };
        let mut text = lines.join(sep);
        if trailing && !lines.is_empty() {
            text.push_str(sep);
        }
        let want = expected_lines(text.as_bytes()).len();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, &text).unwrap();
        prop_assert_eq!(count_lines(&path).unwrap(), want as u64);
        // With a small line limit, and wanting only some lines (another shard's are skipped).
        let mut skipped =
            Corpus::new(Cursor::new(text.as_bytes()), &path, field).with_max_line_bytes(max);
        let mut k = 0u64;
        while let Some(line) = no_panic("Corpus", || skipped.next_line(|n| n % 3 != shard)).unwrap()
        {
            k += 1;
            prop_assert_eq!(line.is_some(), k % 3 != shard);
            if let Some(Line::Doc(d)) = line {
                prop_assert!(d.text.len() <= max);
            }
        }
        prop_assert_eq!(k, want as u64);
        prop_assert_eq!(skipped.fingerprint().lines, want as u64);
        let mut corpus = Corpus::new(Cursor::new(text.as_bytes()), &path, field);
        let mut got = Vec::new();
        while let Some(line) = no_panic("Corpus", || corpus.next_line(|_| true)).unwrap() {
            got.push(line.expect("wanted"));
        }
        let whole = toolsift::annotate::corpus::fingerprint(&path).unwrap();
        prop_assert_eq!(corpus.fingerprint(), whole);
        prop_assert_eq!(got.len(), want);
        prop_assert_eq!(corpus.lines_read(), want as u64);
        for (k, line) in got.iter().enumerate() {
            prop_assert_eq!(line.number(), k as u64 + 1);
            if let Line::Reject { reason, .. } = line {
                prop_assert!(!reason.is_empty());
            }
        }
    }

    /// One corpus line, any bytes and any text field: a document or a reject, never a panic.
    #[test]
    fn corpus_parse_line_never_panics(line in bytes(), n in 1u64..4, field in texty()) {
        let parsed = no_panic("corpus::parse_line", || parse_line(n, &line, &field));
        prop_assert_eq!(parsed.number(), n);
        if let Line::Doc(d) = parsed {
            // A document's id is one that is written back exactly.
            prop_assert!(d.id.is_null() || d.id.is_string() || d.id.is_i64() || d.id.is_u64());
        }
    }

    /// The strict JSON line reader, on any text.
    #[test]
    fn json_line_reader_never_panics(
        line in prop_oneof![texty(), json_line_text(&["id", "text", "a"])]
    ) {
        let _ = no_panic("json::parse_line", || json_line(&line));
    }

    /// Reading some fields only is reading them all, less the values of the others: the same
    /// outcome (value, syntax error or the same first duplicate key), every key in its place,
    /// each field read equal, each field not read null.
    #[test]
    fn reading_some_fields_is_reading_all_of_them(
        line in prop_oneof![texty(), json_line_text(&["id", "text", "a"])],
        read in prop::sample::subsequence(vec!["id", "text", "a", "zz"], 0..=4),
    ) {
        let reads = |key: &str| read.contains(&key);
        let some = no_panic("json::parse_line_reading", || {
            toolsift::util::json::parse_line_reading(&line, reads)
        });
        match (json_line(&line), some) {
            (Ok((all, all_dup)), Ok((some, some_dup))) => {
                // The first duplicate in a field read, if any; else the first.
                let want = match duplicate_in_fields_read(&line, reads) {
                    Some(read) if all.is_object() => read.or(all_dup),
                    _ => all_dup,
                };
                prop_assert_eq!(&want, &some_dup);
                // And whether one field holds one, whichever was named.
                for field in ["id", "text", "a"] {
                    if let Some(held) = duplicate_in_fields_read(&line, |k| k == field) {
                        prop_assert_eq!(
                            toolsift::util::json::field_holds_duplicate(
                                &line,
                                field,
                                some_dup.as_ref()
                            ),
                            held.is_some(),
                            "{}",
                            field
                        );
                    }
                }
                match (&all, &some) {
                    (Value::Object(all), Value::Object(some)) => {
                        prop_assert!(all.keys().eq(some.keys()));
                        for (key, value) in all {
                            let want = if reads(key) { value } else { &Value::Null };
                            prop_assert_eq!(&some[key], want, "{}", key);
                        }
                    }
                    _ => prop_assert_eq!(all, some),
                }
            }
            (Err(all), Err(some)) => prop_assert_eq!(all.to_string(), some.to_string()),
            (all, some) => prop_assert!(false, "{:?} but {:?}", all.map(|v| v.0), some.map(|v| v.0)),
        }
    }

    /// A call the parser accepts is one `check_call` accepts, and written back with a result it
    /// reads as itself.
    #[test]
    fn parsed_calls_read_back_as_themselves(
        sample in texty(),
        name in prop_oneof![Just("Calculator".to_string()), "[A-Za-z_]{1,8}"],
        result in texty(),
    ) {
        for continuation in [sample.clone(), format!("{name}({sample})]"), format!("{sample}]")] {
            let parsed = no_panic("parse_call", || parse_call(&continuation));
            let Ok((tool, input)) = parsed else { continue };
            let cleaned = clean_result(&result, &["<|endoftext|>".to_string()]);
            // A result that cleans to nothing is no result (annotate drops it as a failure).
            let checked = if cleaned.is_empty() { "3" } else { cleaned.as_str() };
            prop_assert!(
                check_call(&tool, &input, checked).is_ok(),
                "{continuation:?} parsed as {tool:?}, {input:?}, which check_call refuses: {}",
                check_call(&tool, &input, checked).unwrap_err()
            );
            prop_assert_eq!(check_call(&tool, &input, &cleaned).is_ok(), !cleaned.is_empty());
            // `generate` reads the head of a call up to its arrow the same way.
            let head = format!("{tool}({input}) ");
            prop_assert_eq!(
                toolsift::generate::call::parse_call(&head),
                Some((tool.as_str(), input.as_str()))
            );
            let r = if cleaned.is_empty() { None } else { Some(cleaned.as_str()) };
            for form in [CallForm::Arrow, CallForm::Bare] {
                let written = call_text(&tool, &input, r, form);
                let back = parse_call(&written[1..]);
                prop_assert_eq!(
                    back,
                    Ok((tool.clone(), input.clone())),
                    "{:?} from {:?}",
                    written,
                    continuation
                );
            }
        }
    }

    /// The other call helpers, on any text and offset.
    #[test]
    fn call_helpers_never_panic(text in texty(), input in texty(), at in 0usize..200) {
        let special = ["<|endoftext|>".to_string(), String::new(), "[".to_string()];
        no_panic("call helpers", || {
            let _ = input_problem(&input, &special);
            let _ = toolsift::generate::call::parse_partial_call(&text);
            let _ = input_only_ahead(&text, at, &input);
            let cleaned = clean_result(&text, &special);
            assert!(!cleaned.contains(['[', ']']), "{cleaned:?}");
            assert!(!cleaned.contains("<|endoftext|>"), "{cleaned:?}");
            assert!(!cleaned.chars().any(char::is_control), "{cleaned:?}");
            assert_eq!(cleaned.trim(), cleaned, "{cleaned:?}");
        });
    }

    /// Splicing at character boundaries (or past the end) keeps the text and every call, once.
    #[test]
    fn splice_keeps_the_text_and_every_call(
        text in texty(),
        at in prop::collection::vec((0usize..300, "[a-z]{1,3}"), 0..5),
    ) {
        let calls: Vec<(usize, String)> = at
            .into_iter()
            .map(|(b, name)| {
                // The character boundary at or before b, or past the end.
                let b = if b > text.len() {
                    b
                } else {
                    (0..=b).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0)
                };
                (b, format!("[{name}() -> 1]"))
            })
            .collect();
        let out = no_panic("splice", || splice(&text, &calls));
        let mut stripped = out.clone();
        for (_, call) in &calls {
            let at = stripped.find(call.as_str());
            prop_assert!(at.is_some(), "{call} missing from {out:?}");
            stripped.replace_range(at.unwrap()..at.unwrap() + call.len(), "");
        }
        // What is left is the text, with at most one added space per call.
        prop_assert!(stripped.len() <= text.len() + calls.len());
        prop_assert_eq!(stripped.replace(' ', ""), text.replace(' ', ""));
    }

    /// The calculator, on any text: a value or an error, and its value formats.
    #[test]
    fn calculator_never_panics(input in prop_oneof![texty(), "[0-9,. ()+*/-]{0,40}"]) {
        if let Ok(v) = no_panic("evaluate", || evaluate(&input)) {
            let _ = no_panic("format_result", || format_result(v));
        }
    }

    /// Exact fractions at the edges of i128 format without overflow.
    #[test]
    fn calculator_edges_never_panic(
        num in any::<i128>(),
        den in any::<i128>(),
        edge in 0u8..6,
        op in prop::sample::select(&["/", "*", "+", "-"][..]),
    ) {
        let num = match edge {
            0 => i128::MIN + 1,
            1 => i128::MAX,
            _ => num,
        };
        let den = match edge {
            2 => i128::MAX,
            3 => i128::MIN + 1,
            _ => den,
        };
        for input in [
            format!("{num} {op} {den}"),
            format!("-({num}) {op} -{den}"),
            format!("{num}.{} {op} 0.{}", den.unsigned_abs(), num.unsigned_abs()),
        ] {
            if let Ok(v) = no_panic(&input, || evaluate(&input)) {
                let _ = no_panic("format_result", || format_result(v));
            }
        }
    }

    /// Calendar and its date readers, on any input, date field and URL.
    #[test]
    fn calendar_never_panics(
        input in texty(),
        date in proptest::option::of(texty()),
        url in proptest::option::of(texty()),
    ) {
        no_panic("Calendar", || {
            let _ = toolsift::annotate::tools::Date::parse_iso(&input);
            let _ = toolsift::annotate::tools::Date::from_url(&input);
            let doc = DocContext { id: "d", url: url.as_deref(), date: date.as_deref() };
            let _ = Calendar::new(None).call(&input, &doc);
            let _ = Calendar::new(None).call("", &doc);
        });
    }

    /// The settings file, on any text: a config or an error, and a config that `--print-config`
    /// writes reads back as itself.
    #[test]
    fn config_never_panics_and_prints_as_itself(text in prop_oneof![
        1 => texty(),
        4 => config_text(),
    ]) {
        if let Ok(c) = no_panic("from_toml", || AnnotateConfig::from_toml(&text)) {
            let printed = no_panic("to_toml", || c.to_toml());
            let back = AnnotateConfig::from_toml(&printed);
            prop_assert!(back.is_ok(), "{text:?} printed as {printed:?}: {back:?}");
            prop_assert_eq!(back.unwrap(), c, "{:?} printed as {:?}", text, printed);
        }
    }

    /// A journal line, any bytes: an entry or a reason, never a panic.
    #[test]
    fn journal_lines_never_panic(line in bytes()) {
        let _ = no_panic("JournalEntry::from_line", || JournalEntry::from_line(&line));
    }
}

// ---------------------------------------------------------------------------------------------
// Whole readers over the tiny model: `score`'s JSONL, its resume, and annotate's journal.

use std::path::Path;
use toolsift::annotate::tools::ToolRegistry;
use toolsift::annotate::{Annotator, RunOptions, RunOutcome, Shard, ToolKind};
use toolsift::cpu::CpuScorer;
use toolsift::model::Tokenizer;
use toolsift::sample::{Sample, SampleOptions, SampleRequest, Sampler};
use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
use toolsift::util::jsonl::resume_point;
use toolsift::util::rng::Rng;
use toolsift::{scorer_for, Device, Model};

fn tiny() -> &'static Model {
    static MODEL: std::sync::OnceLock<Model> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| Model::load(common::tiny("f32")).unwrap())
}

const TEXT: &str = "Out of 1400 people, 400 (or 29%) said yes.";

/// Valid score lines of both kinds, so that random lines sit among scored ones.
fn valid_score_line() -> impl Strategy<Value = String> {
    let at = TEXT.find(" 29%").unwrap();
    prop_oneof![
        Just(
            json!({"id": "t", "text": TEXT, "position": at, "tool": "Calculator",
                   "input": "400 / 1400", "result": "0.29"})
            .to_string()
        ),
        Just(
            json!({"id": 7, "text_ids": [329, 266, 451, 455, 338, 11, 285], "position": 3,
                   "call_ids": [58, 344, 7, 19, 8, 60, 220],
                   "call_result_ids": [58, 344, 7, 19, 8, 342, 60, 220]})
            .to_string()
        ),
    ]
}

const SCORE_KEYS: &[&str] = &[
    "id",
    "text",
    "position",
    "tool",
    "input",
    "result",
    "text_ids",
    "call_ids",
    "call_result_ids",
    "weights",
    "tau_f",
];

/// Well-typed score lines with random values: texts, positions (often inside a character or
/// past the end), call parts, token ids past the vocabulary, odd weights and thresholds.
fn typed_score_line() -> impl Strategy<Value = String> {
    let weight = prop_oneof![
        Just(0.0),
        Just(-1.0),
        Just(1e300),
        Just(f64::MIN_POSITIVE),
        -2.0..2.0f64
    ];
    let ids = prop::collection::vec(prop_oneof![0u32..600, Just(u32::MAX), Just(50_400)], 0..8);
    prop_oneof![
        (
            prop_oneof![texty(), Just(TEXT.to_string())],
            prop_oneof![4 => 0usize..60, 1 => Just(usize::MAX), 1 => Just(1 << 53)],
            prop_oneof![Just("Calculator".to_string()), texty()],
            prop_oneof![Just("400 / 1400".to_string()), texty()],
            prop_oneof![Just("0.29".to_string()), texty()],
            proptest::option::of(prop::collection::vec(weight.clone(), 0..6)),
            proptest::option::of(-10.0..10.0f64),
        )
            .prop_map(|(text, position, tool, input, result, weights, tau_f)| {
                let mut v = json!({"text": text, "position": position, "tool": tool,
                                   "input": input, "result": result});
                if let Some(w) = weights {
                    v["weights"] = json!(w);
                }
                if let Some(t) = tau_f {
                    v["tau_f"] = json!(t);
                }
                v.to_string()
            }),
        (
            ids.clone(),
            prop_oneof![4 => 0usize..10, 1 => Just(usize::MAX)],
            ids.clone(),
            ids,
            proptest::option::of(prop::collection::vec(weight, 0..6)),
        )
            .prop_map(|(text_ids, position, call_ids, call_result_ids, weights)| {
                let mut v = json!({"id": [1, {"a": "b"}], "text_ids": text_ids,
                                   "position": position, "call_ids": call_ids,
                                   "call_result_ids": call_result_ids});
                if let Some(w) = weights {
                    v["weights"] = json!(w);
                }
                v.to_string()
            }),
    ]
}

fn score_lines() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            2 => typed_score_line(),
            2 => valid_score_line(),
            3 => json_line_text(SCORE_KEYS),
            1 => texty(),
        ],
        0..10,
    )
}

/// Output rows of `out`, checked to answer the lines of `input` one for one, in order.
fn check_rows(input: &[u8], out: &[u8]) -> Result<(), TestCaseError> {
    let want = expected_lines(input).len();
    let rows: Vec<&[u8]> = expected_lines(out);
    prop_assert_eq!(rows.len(), want, "{}", String::from_utf8_lossy(out));
    for (k, row) in rows.iter().enumerate() {
        let v: Value = serde_json::from_slice(row).unwrap();
        prop_assert_eq!(&v["line"], &json!(k + 1));
        match v.get("error") {
            Some(e) => {
                let e = e.as_str().unwrap();
                prop_assert!(e.starts_with(&format!("line {}: ", k + 1)), "{e}");
                prop_assert!(v.get("l_none").is_none());
            }
            None => prop_assert!(v["l_none"].is_f64(), "{v}"),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(48))]

    /// `score`: one output row per input line, whatever the lines hold, each naming its line.
    #[test]
    fn score_answers_every_line_once(
        lines in score_lines(),
        crlf in any::<bool>(),
        inline in any::<bool>(),
        bare in any::<bool>(),
    ) {
        let model = tiny();
        let scorer = scorer_for(model, Device::Cpu).unwrap();
        let input = lines.join(if crlf { "\r\n" } else { "\n" });
        let mut out = Vec::new();
        let mut options = JsonlOptions { chunk_lines: 3, ..JsonlOptions::default() };
        if inline {
            options.score.placement = toolsift::Placement::Inline;
        }
        if bare {
            options.call_form = CallForm::Bare;
        }
        let summary = no_panic("score_jsonl", || {
            score_jsonl(
                Cursor::new(input.as_bytes()),
                &mut out,
                scorer.as_ref(),
                model.tokenizer_if_any(),
                &options,
            )
        })
        .unwrap();
        prop_assert_eq!(summary.lines, expected_lines(input.as_bytes()).len());
        check_rows(input.as_bytes(), &out)?;
    }

    /// `score --resume` from an output cut at any byte gives the uninterrupted output.
    #[test]
    fn score_resumes_from_any_cut(lines in score_lines(), cut in any::<prop::sample::Index>()) {
        let model = tiny();
        let scorer = scorer_for(model, Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
        let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        std::fs::write(&input, &text).unwrap();
        let run = |skip: usize, out: &mut dyn std::io::Write| {
            let options = JsonlOptions {
                chunk_lines: 1,
                skip_lines: skip,
                ..JsonlOptions::default()
            };
            score_jsonl(
                Cursor::new(text.as_bytes()),
                out,
                scorer.as_ref(),
                model.tokenizer_if_any(),
                &options,
            )
            .unwrap()
        };
        let mut full = Vec::new();
        run(0, &mut full);
        check_rows(text.as_bytes(), &full)?;
        let cut = cut.index(full.len() + 1);
        std::fs::write(&output, &full[..cut]).unwrap();
        let point = no_panic("resume_point", || resume_point(&input, &output, "l_none"))
            .map_err(|e| TestCaseError::fail(format!("cut at {cut}: {e}")))?;
        let mut resumed = full[..cut].to_vec();
        if let Some(p) = point {
            resumed.truncate(p.output_bytes as usize);
            prop_assert!(full.starts_with(&resumed));
            run(p.lines, &mut resumed);
        } else {
            prop_assert!(false, "an output file that exists is a resume point");
        }
        prop_assert_eq!(
            String::from_utf8_lossy(&resumed),
            String::from_utf8_lossy(&full)
        );
        // A row dropped or doubled (a bad copy): resumed to the whole output, or refused.
        let rows = expected_lines(&full);
        if rows.is_empty() {
            return Ok(());
        }
        let k = cut % rows.len();
        for times in [0, 2] {
            let mut damaged = Vec::new();
            for (i, row) in rows.iter().enumerate() {
                for _ in 0..if i == k { times } else { 1 } {
                    damaged.extend_from_slice(row);
                    damaged.push(b'\n');
                }
            }
            std::fs::write(&output, &damaged).unwrap();
            match resume_point(&input, &output, "l_none") {
                Ok(Some(p)) => {
                    let mut resumed = damaged[..p.output_bytes as usize].to_vec();
                    run(p.lines, &mut resumed);
                    prop_assert_eq!(
                        String::from_utf8_lossy(&resumed),
                        String::from_utf8_lossy(&full),
                        "row {} times {}",
                        k,
                        times
                    );
                }
                Ok(None) => prop_assert!(false, "the output exists"),
                Err(e) => {
                    let e = e.to_string();
                    prop_assert!(e.contains(&output.display().to_string()), "{e}");
                }
            }
        }
    }

    /// `resume_point` on an output of any bytes: a point or an error naming the output's line,
    /// and a point never claims more lines than the input has.
    #[test]
    fn resume_point_reads_any_output(lines in score_lines(), out in bytes()) {
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
        let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        std::fs::write(&input, &text).unwrap();
        std::fs::write(&output, &out).unwrap();
        match no_panic("resume_point", || resume_point(&input, &output, "l_none")) {
            Ok(Some(p)) => {
                prop_assert!(p.lines <= lines.len());
                prop_assert!(p.output_bytes as usize <= out.len());
                prop_assert_eq!(expected_lines(&out[..p.output_bytes as usize]).len(), p.lines);
            }
            Ok(None) => prop_assert!(false, "the output exists"),
            Err(e) => prop_assert!(e.to_string().contains(" line "), "{e}"),
        }
    }
}

/// Every position gets p("[") = e^-1; sample s of request r is a fixed continuation.
struct MockSampler {
    continuations: Vec<Vec<u32>>,
}

impl MockSampler {
    fn new(tok: &Tokenizer) -> Self {
        let texts = [
            "Calculator(400 / 1400)]",
            "Calculator(1 +",
            "Calculator(12 * 3)]",
            "Calendar()]",
            "Calculator(1 / 0)]",
        ];
        MockSampler {
            continuations: texts.iter().map(|c| tok.encode_ids(c).unwrap()).collect(),
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
                        Sample {
                            stopped: k != 1,
                            tokens: self.continuations[k].clone(),
                        }
                    })
                    .collect()
            })
            .collect())
    }
}

/// `n` lines of a small corpus with documents and rejects mixed.
fn corpus_text(seed: u64, n: usize) -> String {
    let mut rng = Rng::new(seed);
    let words = [
        "the", "cat", "sold", "apples", "in", "June", "é", "(or", "29%)",
    ];
    let mut text = String::new();
    for i in 1..=n {
        let line = match rng.range(0, 9) {
            0 => "{not json".to_string(),
            1 => json!({"id": i, "body": "no text field"}).to_string(),
            2 => String::new(),
            _ => {
                let mut t = String::new();
                for _ in 0..rng.range(3, 9) {
                    if rng.range(0, 2) == 0 {
                        t.push_str(&format!("{} ", rng.range(1, 1999)));
                    } else {
                        t.push_str(words[rng.range(0, words.len() - 1)]);
                        t.push(' ');
                    }
                }
                json!({"id": format!("d{i}"), "text": t.trim_end(), "date": "2023-01-30"})
                    .to_string()
            }
        };
        text.push_str(&line);
        text.push('\n');
    }
    text
}

/// What an `Annotator` over the tiny model borrows: the mock sampler, the CPU scorer and the
/// tools' registry.
struct AnnotateParts {
    sampler: MockSampler,
    scorer: CpuScorer,
    registry: ToolRegistry,
}

impl AnnotateParts {
    fn new(config: &AnnotateConfig) -> Self {
        AnnotateParts {
            sampler: MockSampler::new(tiny().tokenizer().unwrap()),
            scorer: CpuScorer::new(tiny()),
            registry: ToolRegistry::from_config(&config.tools).unwrap(),
        }
    }

    /// An annotator with the calculator and the calendar.
    fn annotator(&self, config: &AnnotateConfig) -> Annotator<'_> {
        let tools = [ToolKind::Calculator, ToolKind::Calendar];
        let tok = tiny().tokenizer().unwrap();
        Annotator::new(
            tok,
            &self.sampler,
            &self.scorer,
            &self.registry,
            config,
            &tools,
        )
        .unwrap()
    }
}

/// An annotate journal cut at random bytes (a crash mid-write), then resumed: the output of one
/// uninterrupted run, or an error that names the journal. Never a line lost or written twice.
#[test]
fn annotate_resumes_from_a_journal_cut_anywhere() {
    let config = journal_config();
    let parts = AnnotateParts::new(&config);
    let a = parts.annotator(&config);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    std::fs::write(&corpus, corpus_text(3, 9)).unwrap();
    let opts = |out: &Path, stop_after| RunOptions {
        corpus: corpus.clone(),
        out: out.to_path_buf(),
        shard: Shard::default(),
        run_info: json!(null),
        progress: false,
        stop_after,
    };
    let full = dir.path().join("full.jsonl");
    let RunOutcome::Done(..) = toolsift::annotate::annotate(&a, &opts(&full, None)).unwrap() else {
        panic!("not done")
    };
    let read = |p: &Path| std::fs::read(p).unwrap();
    let want = (
        read(&full),
        read(&toolsift::annotate::OutputPaths::new(&full).rejects),
    );
    let mut rng = Rng::new(11);
    for case in 0..common::fuzz_cases(12) {
        let out = dir.path().join(format!("cut{case}.jsonl"));
        let paths = toolsift::annotate::OutputPaths::new(&out);
        let stop = rng.range(1, 8) as u64;
        let RunOutcome::Stopped(_) =
            toolsift::annotate::annotate(&a, &opts(&out, Some(stop))).unwrap()
        else {
            panic!("not stopped")
        };
        let journal = read(&paths.journal);
        // Cut short (a crash), or a byte changed, or a line dropped or doubled (damage).
        let cut = rng.range(0, journal.len());
        let damaged = match rng.range(0, 3) {
            0 => journal[..cut].to_vec(),
            1 => {
                let mut j = journal.clone();
                j[cut.min(journal.len() - 1)] ^= 1 << rng.range(0, 7);
                j
            }
            kind => {
                let lines = expected_lines(&journal);
                let k = rng.range(0, lines.len() - 1);
                let mut j = Vec::new();
                for (i, l) in lines.iter().enumerate() {
                    for _ in 0..if i == k {
                        kind - 2 + usize::from(kind == 3)
                    } else {
                        1
                    } {
                        j.extend_from_slice(l);
                        j.push(b'\n');
                    }
                }
                j
            }
        };
        std::fs::write(&paths.journal, &damaged).unwrap();
        match no_panic("annotate", || {
            toolsift::annotate::annotate(&a, &opts(&out, None))
        }) {
            Ok(RunOutcome::Done(..)) => {
                assert_eq!(
                    (read(&out), read(&paths.rejects)),
                    want,
                    "journal cut at {cut} of {}",
                    journal.len()
                );
            }
            Ok(RunOutcome::Stopped(_)) => panic!("stopped"),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains(&paths.journal.display().to_string()),
                    "cut at {cut}: {e}"
                );
                assert!(
                    !out.exists(),
                    "cut at {cut}: an output beside the error {e}"
                );
            }
        }
    }
}

/// Output rows of `generate`, checked like `check_rows`.
fn check_generated(input: &[u8], out: &[u8]) -> Result<(), TestCaseError> {
    let rows: Vec<&[u8]> = expected_lines(out);
    prop_assert_eq!(rows.len(), expected_lines(input).len());
    for (k, row) in rows.iter().enumerate() {
        let v: Value = serde_json::from_slice(row).unwrap();
        prop_assert_eq!(&v["line"], &json!(k + 1));
        match v.get("error") {
            Some(e) => {
                let e = e.as_str().unwrap();
                prop_assert!(e.starts_with(&format!("line {}: ", k + 1)), "{e}");
            }
            None => prop_assert!(v["completion"].is_string(), "{v}"),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(24))]

    /// `generate`: one output row per input line, whatever the lines hold.
    #[test]
    fn generate_answers_every_line_once(
        lines in prop::collection::vec(
            prop_oneof![
                2 => texty().prop_map(|p| json!({"id": "g", "prompt": p}).to_string()),
                3 => json_line_text(&["id", "prompt", "url", "date"]),
                1 => texty(),
            ],
            0..6,
        ),
        crlf in any::<bool>(),
    ) {
        let model = tiny();
        let decoder = toolsift::backend::decoder_for(model, Device::Cpu).unwrap();
        let input = lines.join(if crlf { "\r\n" } else { "\n" });
        let options = toolsift::generate::GenerateOptions {
            max_new_tokens: 6,
            batch_size: 2,
            ..toolsift::generate::GenerateOptions::for_model(model.config())
        };
        let tools = ToolRegistry::from_config(&Default::default()).unwrap();
        let mut out = Vec::new();
        no_panic("generate_jsonl", || {
            toolsift::generate::jsonl::generate_jsonl(
                Cursor::new(input.as_bytes()),
                &mut out,
                decoder.as_ref(),
                model.tokenizer().unwrap(),
                &tools,
                &options,
            )
        })
        .unwrap();
        check_generated(input.as_bytes(), &out)?;
    }

    /// `generate --resume` from an output cut at any byte gives the uninterrupted output.
    #[test]
    fn generate_resumes_from_any_cut(
        lines in prop::collection::vec(
            prop_oneof![
                2 => texty().prop_map(|p| json!({"id": "g", "prompt": p}).to_string()),
                1 => json_line_text(&["id", "prompt", "url", "date"]),
            ],
            0..5,
        ),
        cut in any::<prop::sample::Index>(),
    ) {
        let model = tiny();
        let decoder = toolsift::backend::decoder_for(model, Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
        let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        std::fs::write(&input, &text).unwrap();
        let options = toolsift::generate::GenerateOptions {
            max_new_tokens: 4,
            batch_size: 2,
            ..toolsift::generate::GenerateOptions::for_model(model.config())
        };
        let tools = ToolRegistry::from_config(&Default::default()).unwrap();
        let run = |skip: usize, out: &mut Vec<u8>| {
            toolsift::generate::jsonl::generate_jsonl_after(
                skip,
                Cursor::new(text.as_bytes()),
                out,
                decoder.as_ref(),
                model.tokenizer().unwrap(),
                &tools,
                &options,
            )
            .unwrap();
        };
        let mut full = Vec::new();
        run(0, &mut full);
        check_generated(text.as_bytes(), &full)?;
        let cut = cut.index(full.len() + 1);
        std::fs::write(&output, &full[..cut]).unwrap();
        let point = resume_point(&input, &output, "completion")
            .map_err(|e| TestCaseError::fail(format!("cut at {cut}: {e}")))?
            .expect("the output exists");
        let mut resumed = full[..point.output_bytes as usize].to_vec();
        run(point.lines, &mut resumed);
        prop_assert_eq!(
            String::from_utf8_lossy(&resumed),
            String::from_utf8_lossy(&full)
        );
    }

    /// `annotate` over a corpus of random lines: each line is once in C* or once in the
    /// rejects, in order, and no document's text is changed but by its kept calls.
    #[test]
    fn annotate_writes_every_line_once(
        lines in prop::collection::vec(
            prop_oneof![
                3 => texty().prop_map(|t| json!({"id": "x", "text": t}).to_string()),
                3 => json_line_text(&["text", "id", "url", "date"]),
                1 => texty(),
            ],
            1..6,
        ),
    ) {
        let config = annotate_config();
        let parts = AnnotateParts::new(&config);
        let a = parts.annotator(&config);
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.jsonl");
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&corpus, &text).unwrap();
        let out = dir.path().join("out.jsonl");
        let options = RunOptions {
            corpus: corpus.clone(),
            out: out.clone(),
            shard: Shard::default(),
            run_info: json!(null),
            progress: false,
            stop_after: None,
        };
        let done = no_panic("annotate", || toolsift::annotate::annotate(&a, &options));
        let Ok(RunOutcome::Done(summary, paths)) = done else {
            return Err(TestCaseError::fail(format!("{done:?}")));
        };
        let corpus_lines = expected_lines(text.as_bytes());
        prop_assert_eq!(summary.lines, corpus_lines.len() as u64);
        let mut seen = Vec::new();
        for (path, kind) in [(&paths.out, "doc"), (&paths.rejects, "reject")] {
            let body = std::fs::read(path).unwrap();
            for row in expected_lines(&body) {
                let v: Value = serde_json::from_slice(row).unwrap();
                let n = v["line"].as_u64().unwrap();
                if kind == "doc" {
                    let doc = corpus_lines[n as usize - 1];
                    let doc = doc.strip_suffix(b"\r").unwrap_or(doc);
                    let doc = doc.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(doc);
                    let parsed: Value = serde_json::from_slice(doc).unwrap();
                    prop_assert_eq!(&v["text"], &parsed["text"]);
                } else {
                    prop_assert!(!v["reason"].as_str().unwrap().is_empty());
                }
                seen.push(n);
            }
        }
        seen.sort_unstable();
        prop_assert_eq!(seen, (1..=corpus_lines.len() as u64).collect::<Vec<_>>());
    }
}

/// Two short-prompted calls per tool; every scored calculator call kept.
fn journal_config() -> AnnotateConfig {
    let mut config = AnnotateConfig {
        max_call_tokens: 8,
        ..Default::default()
    };
    for t in ToolKind::ALL {
        let p = config.per_tool.get_mut(t);
        p.k = 2;
        p.m = 2;
        p.prompt = format!("[{}(1)] 1\nInput: {{x}}\nOutput: ", t.call_name());
    }
    config.per_tool.calculator.tau_f = -1e9;
    config
}

fn annotate_config() -> AnnotateConfig {
    let mut config = journal_config();
    config.per_tool.calculator.min_numbers = 0;
    config.per_tool.calendar.tau_f = -1e9;
    config.tools.calendar.date = Some("2023-01-30".into());
    config
}

/// Shards' outputs cut at a random byte, or with a line dropped or doubled, then merged: the
/// unsharded output, or an error naming the file, with nothing written.
#[test]
fn merge_of_damaged_shards_is_whole_or_refused() {
    let config = annotate_config();
    let parts = AnnotateParts::new(&config);
    let a = parts.annotator(&config);
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    std::fs::write(&corpus, corpus_text(5, 11)).unwrap();
    let run = |out: &Path, shard: Shard| {
        let options = RunOptions {
            corpus: corpus.clone(),
            out: out.to_path_buf(),
            shard,
            run_info: json!(null),
            progress: false,
            stop_after: None,
        };
        let RunOutcome::Done(_, paths) = toolsift::annotate::annotate(&a, &options).unwrap() else {
            panic!("not done")
        };
        paths
    };
    let full = run(&dir.path().join("full.jsonl"), Shard::default());
    let read = |p: &Path| std::fs::read(p).unwrap();
    let want = (read(&full.out), read(&full.rejects));
    let shards: Vec<_> = (0..2)
        .map(|i| run(&dir.path().join("sh.jsonl"), Shard::new(i, 2).unwrap()))
        .collect();
    // Regression: the corpus's last line cut from its shard's files was refused without naming
    // them ("input line 11 is missing from its shard's output (shard 0/2)").
    let owner = &shards[10 % 2];
    for file in [&owner.out, &owner.rejects] {
        let body = read(file);
        let kept: Vec<&[u8]> = expected_lines(&body)
            .into_iter()
            .filter(|l| !l.starts_with(b"{\"line\":11,"))
            .collect();
        let cut: Vec<u8> = kept.iter().flat_map(|l| [*l, b"\n"].concat()).collect();
        if cut == body {
            continue;
        }
        std::fs::write(file, &cut).unwrap();
        let out = dir.path().join("last.jsonl");
        let inputs: Vec<_> = shards.iter().map(|p| p.out.clone()).collect();
        let e = toolsift::annotate::merge(&out, &inputs)
            .unwrap_err()
            .to_string();
        let named = e.contains(&owner.out.display().to_string());
        assert!(e.contains("input line 11 is missing") && named, "{e}");
        std::fs::write(file, &body).unwrap();
    }
    // A summary past the size limit (a sparse file: no disk) is refused unread, named.
    let summary = read(&shards[0].summary);
    let big = std::fs::File::create(&shards[0].summary).unwrap();
    big.set_len((256 << 20) + 1).unwrap();
    let inputs: Vec<_> = shards.iter().map(|p| p.out.clone()).collect();
    let e = toolsift::annotate::merge(&dir.path().join("big.jsonl"), &inputs)
        .unwrap_err()
        .to_string();
    let named = e.starts_with(&format!("{}: ", shards[0].summary.display()));
    assert!(named && e.contains("is larger than 256 MiB"), "{e}");
    std::fs::write(&shards[0].summary, summary).unwrap();
    // A record of more calls than the JSON value cap of input lines allows (19 values and keys
    // a call; k * m samples a tool, several tools) is merged: it is a run's own.
    let out = read(&shards[0].out);
    let first = expected_lines(&out)[0];
    let mut record: Value = serde_json::from_slice(first).unwrap();
    let call = json!({"position": 0, "tool": "Calculator", "input": "1+1", "result": "2",
        "l_none": 1.0, "l_call": 1.0, "l_call_result": 0.5, "delta": 0.5, "kept": false});
    let calls = toolsift::util::json::MAX_LINE_VALUES / 10;
    record["calls"] = Value::Array(vec![call; calls]);
    let mut big = record.to_string().into_bytes();
    big.extend_from_slice(&out[first.len()..]);
    std::fs::write(&shards[0].out, &big).unwrap();
    let inputs: Vec<_> = shards.iter().map(|p| p.out.clone()).collect();
    toolsift::annotate::merge(&dir.path().join("many-calls.jsonl"), &inputs).unwrap();
    std::fs::write(&shards[0].out, &out).unwrap();
    // A file mix-up the one-file damage below never makes: a line both in a shard's C* and in
    // its rejects (a rejects file from an older run of the shard, say), each file in order on
    // its own. Refused, not written twice.
    let line: u64 = serde_json::from_slice::<Value>(first).unwrap()["line"]
        .as_u64()
        .unwrap();
    let line_of = |l: &[u8]| serde_json::from_slice::<Value>(l).unwrap()["line"].as_u64();
    let joined =
        |ls: &[&[u8]]| -> Vec<u8> { ls.iter().flat_map(|l| [*l, b"\n"].concat()).collect() };
    let rejects = read(&shards[0].rejects);
    let mut mixed = expected_lines(&rejects);
    let reject = format!(r#"{{"line":{line},"reason":"x"}}"#);
    mixed.insert(
        mixed.partition_point(|l| line_of(l) < Some(line)),
        reject.as_bytes(),
    );
    std::fs::write(&shards[0].rejects, joined(&mixed)).unwrap();
    let merged = dir.path().join("twice.jsonl");
    let e = toolsift::annotate::merge(&merged, &inputs)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("input line {line} is in two outputs")),
        "{e}"
    );
    assert!(!merged.exists(), "written despite {e}");
    std::fs::write(&shards[0].rejects, &rejects).unwrap();
    // A record of shard 1 in shard 0's C*, in line order there: named as not of that shard.
    let other = read(&shards[1].out);
    let theirs = expected_lines(&other)[0];
    let line: u64 = serde_json::from_slice::<Value>(theirs).unwrap()["line"]
        .as_u64()
        .unwrap();
    let mut moved = expected_lines(&out);
    moved.insert(moved.partition_point(|l| line_of(l) < Some(line)), theirs);
    std::fs::write(&shards[0].out, joined(&moved)).unwrap();
    let e = toolsift::annotate::merge(&dir.path().join("moved.jsonl"), &inputs)
        .unwrap_err()
        .to_string();
    let says = format!("input line {line} is not of this shard (shard 0/2)");
    assert!(
        e.contains(&says) && e.contains(&shards[0].out.display().to_string()),
        "{e}"
    );
    std::fs::write(&shards[0].out, &out).unwrap();
    let mut rng = Rng::new(5);
    for case in 0..common::fuzz_cases(40) {
        let which = rng.range(0, 1);
        let file = if rng.range(0, 1) == 0 {
            &shards[which].out
        } else {
            &shards[which].rejects
        };
        let body = read(file);
        let mut damaged = body.clone();
        match rng.range(0, 2) {
            0 => damaged.truncate(rng.range(0, body.len())),
            kind => {
                let lines = expected_lines(&body);
                if lines.is_empty() {
                    continue;
                }
                let k = rng.range(0, lines.len() - 1);
                damaged.clear();
                for (i, l) in lines.iter().enumerate() {
                    let times = if i != k {
                        1
                    } else {
                        kind - 1 + usize::from(kind == 2)
                    };
                    for _ in 0..times {
                        damaged.extend_from_slice(l);
                        damaged.push(b'\n');
                    }
                }
            }
        }
        std::fs::write(file, &damaged).unwrap();
        let out = dir.path().join(format!("m{case}.jsonl"));
        let inputs: Vec<_> = shards.iter().map(|p| p.out.clone()).collect();
        match no_panic("merge", || toolsift::annotate::merge(&out, &inputs)) {
            Ok(_) => {
                let got = (
                    read(&out),
                    read(&toolsift::annotate::OutputPaths::new(&out).rejects),
                );
                assert_eq!(
                    got,
                    want,
                    "case {case}: merged despite damage to {}",
                    file.display()
                );
            }
            Err(e) => {
                let e = e.to_string();
                assert!(
                    shards
                        .iter()
                        .any(|p| e.contains(&p.out.display().to_string())
                            || e.contains(&p.rejects.display().to_string())),
                    "case {case}: {e}"
                );
                assert!(!out.exists(), "case {case}: written despite {e}");
            }
        }
        std::fs::write(file, &body).unwrap();
    }
}

/// Rows equal but for f32 rounding of the losses (other batches, docs/conventions.md).
fn same_rows(a: &[u8], b: &[u8]) -> Result<(), TestCaseError> {
    let (a, b) = (expected_lines(a), expected_lines(b));
    prop_assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        let x: serde_json::Map<String, Value> = serde_json::from_slice(x).unwrap();
        let y: serde_json::Map<String, Value> = serde_json::from_slice(y).unwrap();
        prop_assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>());
        for (k, v) in &x {
            match (v.as_f64(), y[k].as_f64()) {
                (Some(p), Some(q)) if k != "line" => {
                    prop_assert!((p - q).abs() <= 1e-3 * (1.0 + p.abs()), "{k}: {p} vs {q}")
                }
                _ => prop_assert_eq!(v, &y[k]),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(48))]

    /// A text-level line is answered the same whatever lines share its chunk: texts are
    /// tokenized once per chunk and shared, so a line must not see another's head.
    #[test]
    fn score_rows_do_not_depend_on_their_chunk(
        texts in prop::collection::vec(
            prop_oneof![
                Just(TEXT.to_string()),
                prop::collection::vec(
                    prop_oneof![
                        prop::sample::select(&["the", " cat", "é", "29", "%", " ", "\n", "𝄞"][..])
                            .prop_map(str::to_string),
                        "[a-z]{1,5}",
                    ],
                    1..30,
                ).prop_map(|w| w.join(" ")),
            ],
            1..3,
        ),
        picks in prop::collection::vec((any::<prop::sample::Index>(), 0usize..200), 1..8),
        chunk in 2usize..9,
        inline in any::<bool>(),
    ) {
        let model = tiny();
        let scorer = scorer_for(model, Device::Cpu).unwrap();
        let input: String = picks
            .iter()
            .map(|(t, position)| {
                let text = t.get(&texts);
                // Mostly before a space, where GPT-2's tokens start, so that most lines score.
                let spaces: Vec<usize> = text.match_indices(' ').map(|(i, _)| i).collect();
                let position = match spaces.len() {
                    n if n > 0 && position % 4 != 0 => spaces[position % n],
                    _ => *position,
                };
                format!(
                    "{}\n",
                    json!({"text": text, "position": position, "tool": "Calculator",
                           "input": "1 + 2", "result": "3"})
                )
            })
            .collect();
        let run = |chunk_lines: usize| {
            let mut options = JsonlOptions { chunk_lines, ..JsonlOptions::default() };
            if inline {
                options.score.placement = toolsift::Placement::Inline;
            }
            let mut out = Vec::new();
            score_jsonl(
                Cursor::new(input.as_bytes()),
                &mut out,
                scorer.as_ref(),
                model.tokenizer_if_any(),
                &options,
            )
            .unwrap();
            out
        };
        same_rows(&run(1), &run(chunk))?;
    }
}
