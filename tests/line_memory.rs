//! What reading one JSONL line at the length limit (64 MiB) holds in memory. serde_json's own
//! `Value` of such a line could hold 2.4 GB (32 bytes a number); a reader builds only the fields
//! it reads, and at most `MAX_LINE_VALUES` values and keys of them, so every reader of user lines
//! (the corpus, `score`, `--resume`) stays within a small multiple of the line itself.
//! `FUZZ_PEAK=1 cargo test --release --test line_memory -- --nocapture` prints the figures.

mod common;

use std::io::{BufReader, Cursor};

use common::watched::{watch, Usage, Watched};
use toolsift::annotate::corpus::{parse_line, Line};
use toolsift::score::jsonl::{score_jsonl, JsonlOptions};
use toolsift::util::json::MAX_LINE_VALUES;
use toolsift::util::jsonl::{resume_point, MAX_LINE_BYTES};
use toolsift::{scorer_for, Device, Model};

#[global_allocator]
static GLOBAL: Watched = Watched;

/// The watch is process-wide, and these tests build lines of 64 MiB: one test at a time, so
/// that none is charged with another's lines.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// What parsing a line may hold at once besides the line's own bytes: `MAX_LINE_VALUES` values
/// and keys (an `IndexMap` entry of 64 bytes and a key's own bytes; a `Value` of 32 in a vector)
/// and the growth of their containers (78 MB measured for 524,288 keys).
const PARSE_LIMIT: usize = 96 << 20;

/// What reading a line from a file may hold: the line, read into a buffer that doubles as it
/// grows but never past the line's limit, and which then becomes the line's text uncopied; and
/// beside it the parse, which is more than the old buffer a move holds for a moment (glibc's
/// realloc of a large block remaps its pages instead; this allocator counts both).
const READ_LIMIT: usize = PARSE_LIMIT + MAX_LINE_BYTES;
const _: () = assert!(PARSE_LIMIT >= MAX_LINE_BYTES);

/// The same for a `--resume` row, whose limit is 8 input lines: its buffer doubles from 64 MiB
/// to 128 MiB, the 64 MiB before it held while it moves.
const ROW_READ_LIMIT: usize = PARSE_LIMIT + 3 * MAX_LINE_BYTES;

/// `{"text": "…", "<field>": <filler>}`: a line of `MAX_LINE_BYTES` exactly, its `field`
/// holding as many copies of `item` (joined by commas, inside `open`/`close`) as fit.
fn line_with(field: &str, open: &str, item: impl Fn(usize) -> String, close: &str) -> String {
    let head = format!(r#"{{"text": "Out of 1400 people, 400 said yes.", "{field}": {open}"#);
    let mut line = head;
    let tail = format!("{close}}}");
    let mut i = 0;
    loop {
        let next = item(i);
        if line.len() + 1 + next.len() + tail.len() > MAX_LINE_BYTES {
            break;
        }
        if i > 0 {
            line.push(',');
        }
        line.push_str(&next);
        i += 1;
    }
    line.push_str(&tail);
    // Padding to the limit exactly, inside the text.
    let pad = MAX_LINE_BYTES - line.len();
    line.insert_str(line.find(" said").unwrap(), &" ".repeat(pad));
    assert_eq!(line.len(), MAX_LINE_BYTES);
    line
}

/// Numbers, the costliest filler for serde_json's `Value` (1 byte of text, 32 of value).
fn zeros(field: &str) -> String {
    line_with(field, "[", |_| "0".into(), "]")
}

/// Distinct keys: what a reader must hold to find one held twice, even in a field it ignores.
fn keys(field: &str) -> String {
    line_with(field, "{", |i| format!(r#""{i:x}":0"#), "}")
}

fn check(what: &str, usage: Usage, limit: usize) {
    if std::env::var_os("FUZZ_PEAK").is_some() {
        eprintln!("{what}: PEAK {} LARGEST {}", usage.peak_held, usage.largest);
    }
    assert!(
        usage.peak_held <= limit,
        "{what}: held {} bytes at once",
        usage.peak_held
    );
}

#[test]
fn a_corpus_line_builds_only_the_fields_it_reads() {
    let _one = one_at_a_time();
    // (what, line, refused): an ignored field is checked, not built; its keys are held only
    // while its object is read, so many small objects pass and one of millions of keys does not.
    let small_objects = line_with("meta", "[", |_| r#"{"a":0}"#.into(), "]");
    for (what, line, refused) in [
        ("ignored numbers", zeros("tokens"), false),
        ("ignored small objects", small_objects, false),
        ("ignored keys", keys("meta"), true),
        ("id numbers", zeros("id"), true),
        ("id keys", keys("id"), true),
    ] {
        let (parsed, usage) = watch(|| parse_line(1, line.as_bytes(), "text"));
        check(what, usage, PARSE_LIMIT);
        match parsed {
            Line::Doc(d) => {
                assert!(!refused, "{what}: read");
                assert!(d.text.starts_with("Out of 1400 people,"), "{what}");
            }
            Line::Reject { reason, .. } => {
                assert!(refused, "{what}: {reason}");
                let want = format!("too many JSON values: more than {MAX_LINE_VALUES} values");
                assert!(reason.starts_with(&want), "{reason}");
            }
        }
    }
}

#[test]
fn score_refuses_large_lines_without_building_them() {
    let _one = one_at_a_time();
    let model = Model::load(common::tiny("f32")).unwrap();
    let scorer = scorer_for(&model, Device::Cpu).unwrap();
    for (what, line, error) in [
        // A key no line kind has: refused by name, its value never built.
        ("unknown field", zeros("x"), "unknown field `x`"),
        // A field read, past the limit.
        ("weights", zeros("weights"), "too many JSON values"),
        ("id", keys("id"), "too many JSON values"),
    ] {
        let input = format!("{line}\n");
        let mut out = Vec::new();
        let (summary, usage) = watch(|| {
            score_jsonl(
                // Read in small pieces, as from a file: the line's buffer grows as it is read.
                BufReader::with_capacity(1 << 16, Cursor::new(input.as_bytes())),
                &mut out,
                scorer.as_ref(),
                model.tokenizer_if_any(),
                &JsonlOptions::default(),
            )
        });
        check(what, usage, READ_LIMIT);
        assert_eq!(summary.unwrap().lines, 1, "{what}");
        let row = String::from_utf8(out).unwrap();
        assert!(row.contains(error), "{what}: {row}");
    }
}

#[test]
fn resume_reads_only_the_fields_it_checks() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
    std::fs::write(&input, "{\"id\": \"a\", \"text\": \"t\"}\n").unwrap();
    // A row whose unread field is large passes; one whose id is large is no row of a run.
    for (what, row, ok) in [
        (
            "unread",
            zeros("x").replacen("\"text\"", "\"id\": \"a\", \"scores\"", 1),
            true,
        ),
        (
            "id",
            zeros("id").replacen("\"text\"", "\"scores\"", 1),
            false,
        ),
    ] {
        std::fs::write(&output, format!("{row}\n")).unwrap();
        let (point, usage) = watch(|| resume_point(&input, &output, "scores"));
        check(what, usage, ROW_READ_LIMIT);
        match point {
            Ok(p) => assert!(ok && p.unwrap().lines == 1, "{what}"),
            Err(e) => {
                assert!(!ok, "{what}: {e}");
                assert!(e.to_string().contains("too many JSON values"), "{e}");
            }
        }
    }
}
