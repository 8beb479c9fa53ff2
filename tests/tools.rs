//! The tools through their public API: behaviour a hand mutation review (session 43) found no
//! test pinning down. Each test here failed on its mutant (a one-line slip) and passes as written:
//! a division by zero named, nesting counted rather than parentheses, 30-day months, a URL date
//! only from an 8-digit run, WikiSearch's title-only hits, its 32-word query cap and a failed
//! build that leaves nothing, a command tool's input ending with a newline, the 1 MiB output
//! limit, HTTP 408/429 retried and an HTTP result trimmed, 10 retries allowed, and which
//! services a tools table provides. And `toolsift index`, the command that builds WikiSearch's
//! index, which no other test runs; then, from a review of the settings and the registry (session
//! 47), what `ToolRegistry::from_config` registers, in what order, and what it refuses.
//! Last, from a review of the external tools: their defaults made in code, a refused
//! connection retried, and how an HTTP reply's result and error are read.
//! Then, from a second review of the four built-in tools: thousands groups of exactly 3 digits,
//! the shapes of a URL or field date, a snippet widened over a multibyte space, repeated query
//! words, a search for 0 hits and a fractional document id.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use toolsift::annotate::tools::*;
use toolsift::annotate::{ToolKind, ToolName};

fn doc(id: &str) -> DocContext<'_> {
    DocContext {
        id,
        url: None,
        date: None,
    }
}

#[test]
fn a_division_by_zero_is_named_as_such() {
    // Zero over zero too: it is no overflow, though no fraction can hold it.
    for input in ["1/0", "1/(2-2)", "5 / -0", "0 / 0", "(1 - 1) / (2 - 2)"] {
        let got = Calculator::new().call(input, &doc("d"));
        assert!(
            matches!(&got, Err(ToolError::Failed(m)) if m == "division by zero"),
            "{input}: {got:?}"
        );
    }
}

#[test]
fn the_depth_limit_counts_nesting_not_parentheses_or_signs() {
    let input = vec!["(1)"; 40].join("+");
    assert!(input.len() <= MAX_INPUT_LEN);
    assert_eq!(Calculator::new().call(&input, &doc("d")), Ok("40".into()));
    let input = vec!["-1"; 40].join(" - ");
    assert_eq!(Calculator::new().call(&input, &doc("d")), Ok("38".into()));
}

#[test]
fn thirty_day_months_have_no_31st() {
    for m in [4, 6, 9, 11] {
        assert!(Date::new(2023, m, 31).is_none(), "{m}");
        assert!(Date::new(2023, m, 30).is_some(), "{m}");
    }
    assert_eq!(Date::parse_iso("2023-09-31"), None);
}

#[test]
fn a_url_date_is_a_run_of_exactly_eight_digits() {
    for url in [
        "https://example.com/story/202301301",
        "https://example.com/p/20230130123045",
    ] {
        assert_eq!(Date::from_url(url), None, "{url}");
    }
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_failed_index_build_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = write(
        tmp.path(),
        "docs.jsonl",
        "{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"b\"}\n",
    );
    assert!(build_index(&docs, &tmp.path().join("idx"), "text").is_err());
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["docs.jsonl"]);
}

fn wiki(lines: &str) -> (tempfile::TempDir, WikiSearch) {
    let tmp = tempfile::tempdir().unwrap();
    let docs = write(tmp.path(), "docs.jsonl", lines);
    let out = tmp.path().join("idx");
    build_index(&docs, &out, "text").unwrap();
    let w = WikiSearch::open(&out).unwrap();
    (tmp, w)
}

#[test]
fn a_hit_on_the_title_alone_quotes_the_start_of_the_text() {
    let (_t, w) = wiki(
        "{\"id\":\"e\",\"title\":\"Eiffel Tower\",\"text\":\"A wrought-iron lattice tower in Paris.\"}\n",
    );
    assert_eq!(
        w.call("Eiffel", &doc("x")),
        Ok("A wrought-iron lattice tower in Paris.".into())
    );
}

#[test]
fn only_the_first_32_distinct_words_are_searched() {
    let (_t, w) = wiki("{\"id\":\"z\",\"text\":\"A zebra is an African equine.\"}\n");
    let fill: Vec<String> = (0..32).map(|i| format!("filler{i}")).collect();
    let query = format!("{} zebra", fill.join(" "));
    let got = w.call(&query, &doc("x"));
    assert!(
        matches!(&got, Err(ToolError::Failed(m)) if m.contains("no document matches")),
        "{got:?}"
    );
    let query = format!("zebra {}", fill.join(" "));
    assert!(w.call(&query, &doc("x")).is_ok());
}

fn sh(script: &str) -> ExternalTool {
    ExternalTool::command("QA", vec!["sh".into(), "-c".into(), script.into()])
        .with_timeout(Duration::from_secs(5))
        .with_retries(0)
}

#[test]
fn a_command_tool_reads_its_input_as_a_whole_line() {
    let tool = sh("while read -r l; do echo \"got:$l\"; done");
    assert_eq!(tool.call("x", &doc("d")), Ok("got:x".into()));
}

#[test]
fn output_of_exactly_the_limit_is_accepted() {
    let tool = sh(&format!(
        "head -c {MAX_OUTPUT_BYTES} /dev/zero | tr '\\0' a"
    ));
    let got = tool.call("x", &doc("d")).unwrap();
    assert_eq!(got.len(), MAX_OUTPUT_BYTES);
}

/// Answers every connection with (status, body); counts them.
fn server(status: u16, body: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/tool", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(10) {
            let Ok(mut stream) = stream else { return };
            seen.fetch_add(1, Ordering::SeqCst);
            let mut reader = BufReader::new(&stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    break;
                }
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut buf = vec![0; length];
            let _ = reader.read_exact(&mut buf);
            let reply = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    (url, count)
}

#[test]
fn http_429_and_408_are_retried() {
    for status in [429, 408] {
        let (url, count) = server(status, "{\"error\":\"slow down\"}");
        let tool = ExternalTool::http("MT", url)
            .with_timeout(Duration::from_secs(2))
            .with_retries(2);
        assert!(tool.call("x", &doc("d")).is_err());
        assert_eq!(count.load(Ordering::SeqCst), 3, "{status}");
    }
}

#[test]
fn an_http_result_is_trimmed() {
    let (url, _) = server(200, "{\"result\":\"  Paris \\n\"}");
    let tool = ExternalTool::http("QA", url)
        .with_timeout(Duration::from_secs(2))
        .with_retries(0);
    assert_eq!(tool.call("x", &doc("d")), Ok("Paris".into()));
}

#[test]
fn ten_retries_are_allowed() {
    let cfg = ExternalToolConfig {
        command: Some(vec!["cat".into()]),
        retries: 10,
        ..Default::default()
    };
    assert_eq!(ExternalTool::from_config("QA", &cfg).unwrap().retries, 10);
}

#[test]
fn a_tools_table_provides_the_services_it_configures() {
    let svc = ExternalToolConfig {
        command: Some(vec!["cat".into()]),
        ..Default::default()
    };
    let mt_only = ToolsConfig {
        mt: Some(svc.clone()),
        ..Default::default()
    };
    let qa_only = ToolsConfig {
        qa: Some(svc),
        ..Default::default()
    };
    let mt = ToolName::Builtin(ToolKind::Mt);
    let qa = ToolName::Builtin(ToolKind::Qa);
    assert!(mt_only.provides(&mt) && !mt_only.provides(&qa));
    assert!(qa_only.provides(&qa) && !qa_only.provides(&mt));
}

#[test]
fn a_timeout_without_retries_does_not_count_tries() {
    let e = ToolError::Timeout {
        after: Duration::from_millis(100),
        tries: 1,
    };
    assert_eq!(e.to_string(), "timed out after 100ms");
}

/// `toolsift index` builds what WikiSearch opens, from the field --text-field names, and says
/// what it read: documents, blank lines skipped, ids an earlier document has. An existing
/// folder at --out is refused by name, and left as it was.
#[test]
fn the_index_command_builds_what_wikisearch_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = write(
        tmp.path(),
        "docs.jsonl",
        "{\"id\":\"z\",\"body\":\"A zebra is an African equine.\"}\n\n\
         {\"id\":\"q\",\"body\":\"A quagga was a plains zebra.\"}\n\
         {\"id\":\"z\",\"body\":\"An okapi is a giraffid.\"}\n",
    );
    let out = tmp.path().join("idx");
    let index = |out: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"))
            .args(["index", "--text-field", "body", "--docs"])
            .arg(&docs)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    let o = index(&out);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "indexed 3 documents (1 blank lines skipped) into {}",
            out.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: 1 documents have an id an earlier document has"),
        "{stderr}"
    );
    let w = WikiSearch::open(&out).unwrap();
    // (The snippet is tantivy's fragment: it ends with the last word, before the period.)
    let got = w.call("okapi", &doc("x"));
    assert!(
        matches!(&got, Ok(s) if s.starts_with("An okapi is a giraffid")),
        "{got:?}"
    );

    let taken = tmp.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("keep"), "keep").unwrap();
    let o = index(&taken);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&taken.display().to_string()), "{stderr}");
    assert_eq!(std::fs::read_to_string(taken.join("keep")).unwrap(), "keep");
}

// Review of the settings and the registry: behaviour of `ToolRegistry::from_config`, `register`,
// `call` and the tools table's `provides` / `check_provided` that a hand mutation review found
// unpinned.

fn cat_service() -> ExternalToolConfig {
    ExternalToolConfig {
        command: Some(vec!["cat".into()]),
        ..Default::default()
    }
}

/// Registration order is the settings' order (the names reports list): the built-ins, QA, MT,
/// then the custom services by name.
#[test]
fn from_config_registers_custom_services_after_the_built_ins() {
    let cfg = ToolsConfig {
        qa: Some(cat_service()),
        mt: Some(cat_service()),
        custom: [("Echo".to_string(), cat_service())].into(),
        ..Default::default()
    };
    let reg = ToolRegistry::from_config(&cfg).unwrap();
    assert_eq!(reg.names(), ["Calculator", "Calendar", "QA", "MT", "Echo"]);
}

/// A custom service under a name calls cannot have, or a built-in's, is refused when the
/// registry is built (generate builds it without annotate's `validate`).
#[test]
fn from_config_refuses_a_custom_service_under_a_name_that_cannot_be() {
    for (name, says) in [("QA", "built-in"), ("Two words", "letters, digits")] {
        let cfg = ToolsConfig {
            custom: [(name.to_string(), cat_service())].into(),
            ..Default::default()
        };
        let e = ToolRegistry::from_config(&cfg).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("tool {name}: ")) && e.contains(says),
            "{e}"
        );
        assert_eq!(cfg.check().unwrap_err().to_string(), e);
    }
}

/// A tool registered under a name already taken replaces the earlier one: calls reach the new.
#[test]
fn a_tool_registered_again_replaces_the_earlier() {
    struct Fixed(&'static str);
    impl Tool for Fixed {
        fn name(&self) -> &str {
            "Fixed"
        }
        fn call(&self, _input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
            Ok(self.0.to_string())
        }
    }
    let mut reg = ToolRegistry::new();
    reg.register(Fixed("old"));
    let old = reg.register(Fixed("new")).unwrap();
    assert_eq!(old.call("", &doc("d")), Ok("old".into()));
    assert_eq!(reg.call("Fixed", "", &doc("d")), Ok("new".into()));
    assert_eq!(reg.len(), 1);
}

/// A call's error names the tool: one not registered, and one that panicked.
#[test]
fn a_calls_error_names_the_tool() {
    struct Boom;
    impl Tool for Boom {
        fn name(&self) -> &str {
            "Boom"
        }
        fn call(&self, _input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
            panic!("bang")
        }
    }
    let mut reg = ToolRegistry::new();
    reg.register(Boom);
    let e = reg.call("Nope", "", &doc("d")).unwrap_err().to_string();
    assert_eq!(e, "no tool named \"Nope\" is registered");
    let e = reg.call("Boom", "", &doc("d")).unwrap_err().to_string();
    assert!(
        e.starts_with("tool \"Boom\" panicked: ") && e.contains("bang"),
        "{e}"
    );
}

/// `provides` answers for the tool it is asked about: the Calendar by its own switch, a
/// custom tool by its own name.
#[test]
fn provides_tells_each_tool_by_its_own_setting() {
    let cfg = ToolsConfig {
        calendar: CalendarConfig {
            enabled: false,
            ..Default::default()
        },
        custom: [("Weather".to_string(), cat_service())].into(),
        ..Default::default()
    };
    assert!(cfg.provides(&ToolKind::Calculator.into()));
    assert!(!cfg.provides(&ToolKind::Calendar.into()));
    assert!(cfg.provides(&ToolName::custom("Weather").unwrap()));
    assert!(!cfg.provides(&ToolName::custom("Other").unwrap()));
    let e = cfg
        .check_provided(&[ToolKind::Calculator.into(), ToolKind::Calendar.into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("tool calendar is not available"), "{e}");
}

/// `check_provided` names the first of the tools that is not provided, and where to configure
/// it.
#[test]
fn check_provided_names_the_first_tool_missing() {
    let cfg = ToolsConfig::default();
    let tools = [
        ToolKind::Calculator.into(),
        ToolKind::Qa.into(),
        ToolKind::Mt.into(),
    ];
    let e = cfg.check_provided(&tools).unwrap_err().to_string();
    assert_eq!(e, "tool qa is not available: configure it under [tools.qa]");
    assert!(cfg.check_provided(&tools[..1]).is_ok());
}

// ---- from the review of annotate/tools/external ----

/// A tool made in code gets the documented defaults: 10 s per try and 2 retries.
#[test]
fn a_tool_made_in_code_has_the_default_timeout_and_retries() {
    for tool in [
        ExternalTool::command("QA", vec!["cat".into()]),
        ExternalTool::http("QA", "http://127.0.0.1:1/qa"),
    ] {
        assert_eq!((tool.timeout, tool.retries), (Duration::from_secs(10), 2));
    }
}

/// A refused connection is retried, and the error says how many tries were made.
#[test]
fn a_refused_connection_is_retried() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tool = ExternalTool::http("QA", format!("http://127.0.0.1:{port}/qa"))
        .with_timeout(Duration::from_secs(2))
        .with_retries(1);
    let got = tool.call("x", &doc("d"));
    assert!(
        matches!(&got, Err(ToolError::Failed(m)) if m.contains("after 2 tries")),
        "{got:?}"
    );
}

/// A reply's string result wins over an `error` beside it; a null error is no error; a
/// service's error is quoted as it wrote it (a string without JSON quotes).
#[test]
fn an_http_reply_is_read_result_first_and_its_error_as_written() {
    let call = |body: &'static str| {
        let (url, _) = server(200, body);
        ExternalTool::http("QA", url)
            .with_timeout(Duration::from_secs(2))
            .with_retries(0)
            .call("x", &doc("d"))
    };
    assert_eq!(
        call("{\"result\": \"Paris\", \"error\": \"slow\"}"),
        Ok("Paris".into())
    );
    let got = call("{\"result\": 3, \"error\": null}");
    assert!(
        matches!(&got, Err(ToolError::Failed(m)) if m.ends_with("reply has no string \"result\"")),
        "{got:?}"
    );
    let got = call("{\"error\": \"no model\"}");
    assert!(
        matches!(&got, Err(ToolError::Failed(m)) if m.ends_with("service error: no model")),
        "{got:?}"
    );
}

// From a second hand mutation review of the four built-in tools: each test below failed on a mutant
// (a one-line slip) that every other test let through.

#[test]
fn a_thousands_group_is_exactly_three_digits_not_three_or_more() {
    // "1,4000" is no number as written; read as 14000 it would be a silent wrong result.
    for bad in ["1,4000", "12,345,6789", "1,000.5 + 2,0000"] {
        let got = Calculator::new().call(bad, &doc("d"));
        assert!(
            matches!(got, Err(ToolError::InvalidInput(_))),
            "{bad}: {got:?}"
        );
    }
}

#[test]
fn a_url_date_in_segments_has_a_four_digit_year_and_a_short_month() {
    for url in [
        "https://example.com/02023/01/30/",
        "https://example.com/2023/001/30/",
    ] {
        assert_eq!(Date::from_url(url), None, "{url}");
    }
}

#[test]
fn a_date_field_takes_a_lowercase_t_before_the_time() {
    assert_eq!(
        Date::parse_iso("2023-01-30t12:00:00z"),
        Date::new(2023, 1, 30)
    );
}

#[test]
fn a_url_host_is_never_read_as_a_path() {
    // No slash after the host: the path is empty, and a date in the host name is not taken.
    for url in [
        "https://news-2023-01-30.example.com",
        "https://20230130.example.com?x",
    ] {
        assert_eq!(Date::from_url(url), None, "{url}");
    }
}

#[test]
fn a_dashed_url_date_has_a_dash_before_the_day() {
    assert_eq!(Date::from_url("https://example.com/a/2023-01x30"), None);
    assert_eq!(
        Date::from_url("https://example.com/a/2023-01_30.html"),
        None
    );
}

#[test]
fn a_day_segment_may_end_only_in_a_file_extension() {
    // "30.best-of" and "30.5-things" are slugs; "30.html" is a file.
    for url in [
        "https://example.com/2023/01/30.best-of",
        "https://example.com/2023/01/30.5-things",
    ] {
        assert_eq!(Date::from_url(url), None, "{url}");
    }
    assert_eq!(
        Date::from_url("https://example.com/2023/01/30.html"),
        Date::new(2023, 1, 30)
    );
}

#[test]
fn a_snippet_after_a_multibyte_space_is_cut_at_a_char_boundary() {
    // Words joined by no-break spaces (2 bytes): widening a fragment to the word before it
    // must step over the whole space, or slicing the text panics. The byte budget, 2 a char
    // here, picks a fragment wider than 20 chars: it is cut so as to keep "zebra".
    let words: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    let text = format!("{}\u{a0}zebra\u{a0}runs", words.join("\u{a0}"));
    let (_t, w) = wiki(&format!("{{\"id\":\"z\",\"text\":\"{text}\"}}\n"));
    let w = w.with_max_snippet_chars(20);
    let got = w.call("zebra", &doc("x")).unwrap();
    assert!(
        got.contains("zebra") && got.chars().count() <= 20,
        "{got:?}"
    );
}

#[test]
fn a_snippet_of_mostly_ascii_text_keeps_the_matched_word() {
    // One wider character doubles the byte budget of a text of ASCII words, so tantivy's
    // fragment holds about twice the characters asked for; the cut keeps the match wherever
    // it falls in the fragment (tantivy's fragments are consecutive windows from the start).
    for n in 20..40 {
        let words: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
        let text = format!("Caf\u{e9} {} zebra runs", words.join(" "));
        let (_t, w) = wiki(&format!("{{\"id\":\"z\",\"text\":\"{text}\"}}\n"));
        let w = w.with_max_snippet_chars(30);
        let got = w.call("zebra", &doc("x")).unwrap();
        assert!(
            got.contains("zebra") && got.chars().count() <= 30,
            "{n}: {got:?}"
        );
    }
}

#[test]
fn a_repeated_query_word_counts_once_toward_the_32() {
    let (_t, w) = wiki("{\"id\":\"z\",\"text\":\"A zebra is an African equine.\"}\n");
    let query = format!("{}zebra", "filler ".repeat(40));
    assert!(w.call(&query, &doc("x")).is_ok());
}

#[test]
fn a_search_for_no_hits_returns_none() {
    let (_t, w) = wiki("{\"id\":\"z\",\"text\":\"A zebra is an African equine.\"}\n");
    assert_eq!(w.search("zebra", None, 0), Ok(vec![]));
    assert_eq!(w.search("zebra", None, 1).unwrap().len(), 1);
}

#[test]
fn a_fractional_document_id_is_refused() {
    // Only integer ids are read as text; 1.5 (or 1e3) is not an id anyone wrote.
    let tmp = tempfile::tempdir().unwrap();
    for (i, id) in ["1.5", "1e3"].iter().enumerate() {
        let docs = write(
            tmp.path(),
            "docs.jsonl",
            &format!("{{\"id\":{id},\"text\":\"x\"}}\n"),
        );
        let got = build_index(&docs, &tmp.path().join(format!("idx{i}")), "text");
        assert!(
            matches!(&got, Err(IndexError::Malformed { line: 1, .. })),
            "{id}: {got:?}"
        );
    }
}

/// `toolsift index` names a folder an older build left, `.{name}.partial-<pid>`, and no other:
/// not one without a pid or with other characters after it.
#[test]
fn the_index_command_warns_of_an_older_builds_partial_folder_only() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = write(
        tmp.path(),
        "docs.jsonl",
        "{\"id\":\"z\",\"text\":\"zebra\"}\n",
    );
    for name in [
        ".idx.partial-123",
        ".idx.partial-",
        ".idx.partial-12a",
        ".idx.partial123",
    ] {
        std::fs::create_dir(tmp.path().join(name)).unwrap();
    }
    let out = tmp.path().join("idx");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["index", "--docs"])
        .arg(&docs)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let named: Vec<_> = stderr
        .lines()
        .filter(|l| l.contains("left by an interrupted"))
        .collect();
    assert_eq!(named.len(), 1, "{stderr}");
    assert!(
        named[0].contains(&tmp.path().join(".idx.partial-123").display().to_string()),
        "{stderr}"
    );
}

#[test]
fn sums_of_one_scale_add_over_the_common_denominator() {
    // Over the product of the denominators (10^40) these would pass 128 bits.
    let got = evaluate("1.00000000000000000001 + 2.00000000000000000002").unwrap();
    assert_eq!(
        (got.numerator(), got.denominator()),
        (300_000_000_000_000_000_003, 100_000_000_000_000_000_000)
    );
    assert_eq!(format_result(got), "3");
}

#[test]
fn a_product_is_cross_reduced_before_it_multiplies() {
    // 10^25 / 3^40 times 7 * 3^40 / 10^25: the uncancelled products are past 10^44.
    let input = "10000000000000000000000000 / 12157665459056928801 \
                 * (85103658213398501607 / 10000000000000000000000000)";
    assert!(input.len() <= MAX_INPUT_LEN);
    assert_eq!(Calculator::new().call(input, &doc("d")), Ok("7".into()));
}

#[test]
fn negating_the_least_128_bit_integer_is_too_large_not_wrapped() {
    let min = "-170141183460469231731687303715884105727 - 1";
    let got = Calculator::new().call(min, &doc("d"));
    assert_eq!(got, Ok("-170141183460469231731687303715884105728".into()));
    let got = Calculator::new().call(&format!("-({min})"), &doc("d"));
    assert!(
        matches!(&got, Err(ToolError::Failed(m)) if m.contains("too many digits")),
        "{got:?}"
    );
}

#[test]
fn calculator_errors_give_the_byte_positions_exactly() {
    let message = |input: &str| {
        Calculator::new()
            .call(input, &doc("d"))
            .unwrap_err()
            .to_string()
    };
    // The ')' expected where the number stands, for the '(' at the start.
    assert_eq!(
        message("(1 2,400.50)"),
        "invalid input: expected ')' at byte 3 for '(' at byte 0, found number 2,400.50"
    );
    // End of input is the input's length, trailing spaces included.
    assert_eq!(
        message("3 +  "),
        "invalid input: expression ends early at byte 5: expected a number or '('"
    );
    // A token left over is placed at its start ("at byte 25" would also contain "at byte 2").
    assert_eq!(
        message("1 12345678901234567890123"),
        "invalid input: unexpected number 12345678901234567890123 at byte 2"
    );
    // Blank input is told as empty, not as ending early.
    for blank in ["", " \t\n"] {
        assert_eq!(
            message(blank),
            "invalid input: empty expression",
            "{blank:?}"
        );
    }
    // The length limit is in bytes, and the message counts bytes: 1 + 100 no-break spaces.
    let long = format!("1{}", "\u{a0}".repeat(100));
    assert_eq!(
        message(&long),
        "invalid input: expression is 201 bytes long, more than the 200 allowed"
    );
}

#[test]
fn the_last_day_of_year_9999_is_a_date() {
    let last = Date::new(9999, 12, 31).unwrap();
    assert_eq!(last.render(), "Today is Friday, December 31, 9999.");
    assert_eq!(Date::parse_iso("9999-12-31"), Some(last));
}

#[test]
fn a_date_field_with_dots_is_no_date() {
    // Only '-' and '/' separate a field's year, month and day.
    assert_eq!(Date::parse_iso("2023.01.30"), None);
}

#[test]
fn a_url_date_is_not_read_out_of_longer_digit_runs() {
    for url in [
        // A 3-digit day segment, a 5-digit run before a dashed date, an underscore for a dash.
        "https://example.com/2023/01/030/",
        "https://example.com/a/02023-01-30",
        "https://example.com/a/2023_01-30",
    ] {
        assert_eq!(Date::from_url(url), None, "{url}");
    }
}

#[test]
fn a_url_date_is_looked_for_past_a_run_that_is_no_date() {
    // An 8-digit id, then a dashed non-date, before the date in the same segment.
    for url in [
        "https://example.com/a/99999999-20230130",
        "https://example.com/a/2023-13-01-to-2023-01-30",
    ] {
        assert_eq!(Date::from_url(url), Date::new(2023, 1, 30), "{url}");
    }
}

#[test]
fn a_path_without_a_leading_slash_is_read_from_its_first_segment() {
    assert_eq!(Date::from_url("2023/01/30/story"), Date::new(2023, 1, 30));
}

#[test]
fn calendars_failure_names_the_document_and_its_url() {
    let doc = DocContext {
        id: "doc-7",
        url: Some("https://example.com/about"),
        date: None,
    };
    let err = Calendar::new(None).call("", &doc).unwrap_err();
    assert_eq!(
        err,
        ToolError::Failed(
            "document \"doc-7\": it has no date field, its URL holds no date, and no date is \
             configured"
                .into()
        )
    );
    // An argument after a newline is still an argument.
    let err = Calendar::new(Date::new(2023, 1, 30))
        .call("\ntomorrow", &doc)
        .unwrap_err();
    assert!(matches!(err, ToolError::InvalidInput(_)), "{err}");
}

#[test]
fn a_blank_configured_date_is_refused_not_taken_as_unset() {
    for blank in ["", "  "] {
        let cfg = CalendarConfig {
            enabled: true,
            date: Some(blank.into()),
        };
        assert!(Calendar::from_config(&cfg).is_err(), "{blank:?}");
    }
}

#[test]
fn from_config_leaves_out_a_disabled_calculator_or_calendar() {
    let mut cfg = ToolsConfig::default();
    cfg.calculator.enabled = false;
    let reg = ToolRegistry::from_config(&cfg).unwrap();
    assert_eq!(reg.names(), ["Calendar"]);
    assert!(!reg.is_empty(), "one tool is not none");
    let mut cfg = ToolsConfig::default();
    cfg.calendar.enabled = false;
    let reg = ToolRegistry::from_config(&cfg).unwrap();
    assert_eq!(reg.names(), ["Calculator"]);
    assert!(reg.get("Calendar").is_none());
}
