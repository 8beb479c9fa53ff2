//! The GPU session's scripts, checked where there is no GPU. A GPU is lent to few sessions, for
//! 15 minutes, and `scripts/gpu-check.sh` is the one command such a session runs: a syntax error
//! in it, in `hf_baseline.py`, or in the Python that writes its summary would cost that session.
//! So every script parses here, the summary is written from a made-up run's files and read
//! back, and gpu-check.sh runs whole over stand-in binaries.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts");

/// Whether `python3` runs here; CI's machine has it. Without it the Python checks say so.
fn python3() -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: no python3 on this machine");
    }
    ok
}

#[test]
fn every_script_parses() {
    for entry in std::fs::read_dir(SCRIPTS).unwrap() {
        let path = entry.unwrap().path();
        let check = match path.extension().and_then(|e| e.to_str()) {
            Some("sh") => Command::new("bash").arg("-n").arg(&path).output(),
            Some("py") if python3() => Command::new("python3")
                .args([
                    "-c",
                    "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])",
                ])
                .arg(&path)
                .output(),
            _ => continue,
        }
        .unwrap();
        assert!(
            check.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&check.stderr)
        );
    }
}

/// The Python of gpu-check.sh's `write_summary` (its `<<'PY'` here-document).
fn summary_program() -> String {
    let script = std::fs::read_to_string(Path::new(SCRIPTS).join("gpu-check.sh")).unwrap();
    let start = script
        .find("write_summary() {")
        .expect("write_summary in gpu-check.sh");
    let body = &script[start..];
    let open = body.find("<<'PY'\n").expect("the summary's here-document") + "<<'PY'\n".len();
    let len = body[open..]
        .find("\nPY\n")
        .expect("the here-document's end");
    body[open..open + len].to_string()
}

/// Per candidate [L_none, L_call, L_call_result], spread so that the deltas split at quartiles.
fn losses(n: usize, shift: f64) -> Value {
    (0..n)
        .map(|k| {
            let k = k as f64;
            json!([3.0 + k * 0.1 + shift, 3.5 + shift, 3.0 - k * 0.05 + shift])
        })
        .collect()
}

/// A run's files as hf_baseline.py and cuda_bench write them, at the default size: the three
/// transformers scorers, toolsift and one opt-in variant; the summary holds each speedup, the
/// SDPA backend, the peak device memory against each scorer's and the agreement with
/// transformers' tuned losses.
#[test]
fn the_summary_reads_a_runs_files() {
    if !python3() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let dir = out.path();
    std::fs::create_dir(dir.join("bench")).unwrap();
    let n = 8;
    let scorer = |cands_per_s: f64| {
        json!({"secs_median": 1.0, "cands_per_s": cands_per_s,
                                           "tokens": 100, "peak_mem_gib": 2.0})
    };
    let placement = json!({
        "tuned": scorer(10.0), "tuned_sdpa": scorer(20.0), "naive": scorer(4.0),
        "tuned_losses": losses(n, 0.0), "tuned_sdpa_losses": losses(n, 0.01),
        "naive_vs_tuned_max_abs_diff": 0.0, "sdpa_vs_tuned_max_abs_diff": 0.01,
        "peak_mem_gib": 2.0,
    });
    let hf = json!({"candidates": n, "device": "NVIDIA H200", "torch": "2.11.0",
                    "entropy_nats_median": 2.6, "entropy_nats_uniform": 10.8,
                    "sdpa_backend": "flash", "prefix": placement, "inline": placement});
    std::fs::write(dir.join("bench/hf_default.json"), hf.to_string()).unwrap();
    let toolsift = |cands_per_s: f64| json!({"cands_per_s": cands_per_s, "trunk_tflops": 395.0, "gemm_peak_tflops": 632.0, "peak_mem_gib": 1.5, "losses": losses(n, 0.02)});
    for p in ["prefix", "inline"] {
        let file = dir.join(format!("toolsift_default_{p}.json"));
        std::fs::write(file, toolsift(40.0).to_string()).unwrap();
    }
    // A report from before the measured peak: divided by the H200's 790 TFLOP/s, and says so.
    let mut old_report = toolsift(50.0);
    old_report
        .as_object_mut()
        .unwrap()
        .remove("gemm_peak_tflops");
    let packed = dir.join("toolsift_default_inline_packed.json");
    std::fs::write(packed, old_report.to_string()).unwrap();

    let mut child = Command::new("python3")
        .arg("-")
        .arg(dir)
        .arg("123")
        .arg(r#"declare -A status=([hf_default]="0" [toolsift_default_prefix]="0" )"#)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    let program = summary_program();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(program.as_bytes())
        .unwrap();
    let done = child.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["wall_secs"], 123);
    assert_eq!(summary["steps"]["hf_default"], "0");
    let size = &summary["default"];
    assert_eq!(size["sdpa_backend"], "flash");
    let prefix = &size["prefix"];
    for (base, want) in [("tuned", 4.0), ("tuned_sdpa", 2.0), ("naive", 10.0)] {
        assert_eq!(
            prefix[format!("speedup_vs_hf_{base}")],
            want,
            "{base}: {prefix}"
        );
        assert_eq!(prefix["hf"][base]["peak_mem_gib"], 2.0, "{prefix}");
        assert_eq!(prefix[format!("peak_mem_vs_hf_{base}")], 0.75, "{prefix}");
    }
    assert_eq!(prefix["toolsift"]["peak_mem_gib"], 1.5, "{prefix}");
    assert_eq!(prefix["hf"]["sdpa_vs_tuned_max_abs_diff"], 0.01);
    // Over the run's own measured GEMM peak.
    assert_eq!(prefix["gemm_peak_tflops"], 632.0);
    assert_eq!(prefix["fraction_of_peak"], 0.625);
    assert_eq!(prefix["peak_source"], "measured");
    let agreement = &prefix["agreement_vs_hf_tuned"];
    assert!(
        (agreement["max_abs"].as_f64().unwrap() - 0.02).abs() < 1e-12,
        "{agreement}"
    );
    assert_eq!(
        agreement["decisions"]["tau_median"]["agree"], 1.0,
        "{agreement}"
    );
    let inline = &size["inline"];
    assert_eq!(inline["packed_speedup_vs_default"], 1.25);
    assert_eq!(inline["packed_fraction_of_peak"], 0.5);
    assert_eq!(inline["packed_peak_source"], "h200-790-constant");
    assert_eq!(inline["packed_speedup_vs_hf_tuned_sdpa"], 2.5);
}

/// gpu-check.sh run whole in a copy of the repository whose bundle holds stand-ins that print a
/// passing test result, and a transformers step that writes its JSON: every step runs and is
/// recorded, the summary in OUT_DIR holds the benchmark's figures before the run ends (as a run
/// killed at its limit would leave it: `toolsift bench`, the last step, copies it), OUT_DIR
/// ends with exactly summary.json and gpu-results.tgz, and a bundle whose first suite finds no
/// device, or a missing bundle, stops the run at once with the reason in the summary.
#[test]
#[cfg(unix)]
fn gpu_check_runs_whole_over_stand_ins() {
    if !python3() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let scripts = repo.join("scripts");
    let bin = repo.join("gpu-bundle/bin");
    std::fs::create_dir_all(&scripts).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    for f in ["gpu-check.sh", "compare-cstar.py"] {
        std::fs::copy(Path::new(SCRIPTS).join(f), scripts.join(f)).unwrap();
    }
    // --out DIR --size SIZE ...: hf_SIZE.json in DIR.
    let hf = r#"import json, os, sys
a = sys.argv
out, size = a[a.index("--out") + 1], a[a.index("--size") + 1]
os.makedirs(out, exist_ok=True)
json.dump({"candidates": 3, "sdpa_backend": "flash"}, open(os.path.join(out, f"hf_{size}.json"), "w"))
"#;
    std::fs::write(scripts.join("hf_baseline.py"), hf).unwrap();
    // A stand-in binary: a shell script with `body`.
    let stand_in = |name: &str, body: &str| {
        use std::os::unix::fs::PermissionsExt as _;
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let passing = "echo 'test result: ok. 1 passed'";
    for name in ["cuda_kernels", "cuda_scoring", "cuda_sampling"] {
        stand_in(name, passing);
    }
    // `toolsift bench`, the last step, keeps the summary as it stands then.
    let snapshot = tmp.path().join("summary-before-the-end.json");
    stand_in(
        "toolsift",
        &format!(
            "{passing}\nif [ \"$1\" = bench ]; then cp \"$SUMMARY\" '{}'; fi",
            snapshot.display()
        ),
    );
    let run = |out: &Path| {
        let o = Command::new("bash")
            .arg(scripts.join("gpu-check.sh"))
            .arg(out)
            .env("GPU_CHECK_DEADLINE", "60")
            .env("GPU_CHECK_WORK", tmp.path().join("work"))
            // Not the machine-wide default: another run's (or another user's) is left alone.
            .env("GPU_CHECK_BENCH", tmp.path().join("bench"))
            .env("SUMMARY", out.join("summary.json"))
            .output()
            .unwrap();
        let summary: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        let mut files: Vec<String> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, ["gpu-results.tgz", "summary.json"], "{o:?}");
        (o.status.code(), summary)
    };
    let (code, summary) = run(&tmp.path().join("out"));
    assert_eq!(code, Some(0));
    let steps = &summary["steps"];
    for step in [
        "cuda_kernels",
        "cuda_sampling",
        "demo_annotate_cuda",
        "demo_eval_cuda",
    ] {
        assert_eq!(steps[step], "0", "{step}: {summary}");
    }
    assert_eq!(steps["hf_default"], "0", "{summary}");
    assert_eq!(
        steps["hf_6b"], "skipped",
        "60 s leave no time for 6B: {summary}"
    );
    assert_eq!(summary["cuda_kernels"]["skipped"], false);
    let before: Value = serde_json::from_str(&std::fs::read_to_string(&snapshot).unwrap()).unwrap();
    assert_eq!(before["default"]["sdpa_backend"], "flash", "{before}");
    assert_eq!(before["steps"]["toolsift_default_prefix"], "0", "{before}");

    stand_in("cuda_kernels", "echo 'SKIPPED: no CUDA device'");
    let (code, summary) = run(&tmp.path().join("out-no-device"));
    assert_eq!(code, Some(1));
    assert_eq!(summary["steps"]["device"], "missing", "{summary}");
    assert!(
        summary["steps"].get("demo_annotate_cuda").is_none(),
        "{summary}"
    );

    std::fs::remove_file(bin.join("toolsift")).unwrap();
    let (code, summary) = run(&tmp.path().join("out-no-bundle"));
    assert_eq!(code, Some(1));
    assert_eq!(summary["steps"]["bundle"], "missing", "{summary}");
}
