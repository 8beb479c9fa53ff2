//! `toolsift annotate --demo` and `toolsift eval-demo` as a user runs them: the built binary,
//! started from another working directory, with the assets materialized from the binary itself.
//! Kept short with `--demo-docs N` and small `--docs`.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// The built binary with `args`, run in `cwd` with its temporary files in `tmpdir`, as no shard
/// of a job array.
fn command(cwd: &Path, tmpdir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolsift"));
    command
        .args(args)
        .current_dir(cwd)
        .env("TMPDIR", tmpdir)
        .env_remove("JOB_COMPLETION_INDEX")
        .env_remove("SLURM_ARRAY_TASK_ID");
    command
}

fn toolsift(cwd: &Path, tmpdir: &Path, args: &[&str]) -> Output {
    command(cwd, tmpdir, args).output().expect("run toolsift")
}

/// `toolsift` with `--device cuda` meaning the emulated device (docs/kernels.md).
#[cfg(feature = "emu")]
fn on_the_emulated_device(cwd: &Path, tmpdir: &Path, args: &[&str]) -> Output {
    let mut command = command(cwd, tmpdir, args);
    command.env("TOOLSIFT_EMU_DEVICE", "1");
    command.output().expect("run toolsift")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

const DOCS: usize = 24;

#[test]
fn annotate_demo_runs_anywhere_and_replaces_its_output() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("c.jsonl");
    let out_s = out.to_str().unwrap();
    let n = DOCS.to_string();
    let args = [
        "annotate",
        "--demo",
        "--out",
        out_s,
        "--no-progress",
        "--demo-docs",
        &n,
    ];
    let first = toolsift(cwd.path(), tmp.path(), &args);
    let err = stderr(&first);
    assert!(first.status.success(), "{err}");
    assert!(err.contains(out_s), "the output names the C* file: {err}");
    assert!(err.contains("wall time"), "{err}");
    assert!(
        err.contains("Calculator") && err.contains("Calendar"),
        "{err}"
    );

    // One C* line per corpus line, in order.
    let corpus: Vec<Value> = toolsift::demo::assets::embedded_corpus()
        .lines()
        .take(DOCS)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cstar = lines(&out);
    assert_eq!(cstar.len(), DOCS);
    for (c, d) in cstar.iter().zip(&corpus) {
        assert_eq!(c["id"], d["id"]);
        assert_eq!(c["text"], d["text"]);
        assert!(c["calls"].is_array());
    }
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.path().join("c.summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["documents"], DOCS as u64);
    let tools: Vec<&str> = summary["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["Calculator", "Calendar"]);
    assert!(summary["tools"][0]["calls_sampled"].as_u64().unwrap() > 0);
    assert!(out_dir.path().join("c.rejects.jsonl").exists());

    // The assets were written under TMPDIR, nothing into the working directory.
    let materialized: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(materialized.len(), 1, "{materialized:?}");
    assert!(materialized[0].starts_with("toolsift-demo-"));
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);

    // Again: the finished output is replaced, byte for byte the same.
    let second = toolsift(cwd.path(), tmp.path(), &args);
    let err = stderr(&second);
    assert!(second.status.success(), "{err}");
    assert!(err.contains("replacing the previous output"), "{err}");
    assert_eq!(lines(&out), cstar);

    // A run that cannot start (a tool the demo has not configured) replaces nothing.
    let mut bad = args.to_vec();
    bad.extend(["--tools", "wikisearch"]);
    let third = toolsift(cwd.path(), tmp.path(), &bad);
    let err = stderr(&third);
    assert!(!third.status.success(), "{err}");
    assert!(err.contains("tool wikisearch is not available"), "{err}");
    assert!(!err.contains("replacing"), "{err}");
    assert_eq!(lines(&out), cstar);
    assert!(out_dir.path().join("c.summary.json").exists());

    // An output another model wrote (its summary says so) is a real run's: never replaced.
    let summary_path = out_dir.path().join("c.summary.json");
    let mut summary: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    summary["run"]["info"]["model"] = "/data/gpt-j-6b".into();
    std::fs::write(&summary_path, summary.to_string()).unwrap();
    let fourth = toolsift(cwd.path(), tmp.path(), &args);
    let err = stderr(&fourth);
    assert!(!fourth.status.success(), "{err}");
    assert!(err.contains("is not an earlier demo output"), "{err}");
    assert!(err.contains("names the model /data/gpt-j-6b"), "{err}");
    assert_eq!(lines(&out), cstar);
}

/// eval-demo's output, rerun from another folder (the corpus it recorded is relative to the
/// first run's folder), is still its own: replaced, not refused.
#[test]
fn eval_demo_reruns_from_another_folder() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(cwd.path().join("a")).unwrap();
    let run = |dir: &Path, out: &str| {
        let args = [
            "eval-demo",
            "--out",
            out,
            "--docs",
            "1",
            "--skip-generate",
            "--no-progress",
        ];
        let o = toolsift(dir, tmp.path(), &args);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    run(cwd.path(), "a/ev");
    run(&cwd.path().join("a"), "ev");
    run(cwd.path(), "a/ev");
}

/// eval-demo checks every file it would replace before it writes or removes any: someone's
/// corpus.jsonl or cstar.jsonl in --out is refused and left as it was.
#[test]
fn eval_demo_replaces_only_its_own_files() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ev = cwd.path().join("ev");
    std::fs::create_dir(&ev).unwrap();
    let args = [
        "eval-demo",
        "--out",
        "ev",
        "--docs",
        "1",
        "--skip-generate",
        "--no-progress",
    ];
    std::fs::write(ev.join("corpus.jsonl"), "my precious corpus\n").unwrap();
    let o = toolsift(cwd.path(), tmp.path(), &args);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("is not an eval-demo set"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(ev.join("corpus.jsonl")).unwrap(),
        "my precious corpus\n"
    );
    std::fs::remove_file(ev.join("corpus.jsonl")).unwrap();
    std::fs::write(ev.join("cstar.jsonl"), "\nnot a cstar\n").unwrap();
    let o = toolsift(cwd.path(), tmp.path(), &args);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("is not a toolsift C* file"),
        "{}",
        stderr(&o)
    );
    assert!(!ev.join("corpus.jsonl").exists(), "nothing written");
    assert_eq!(
        std::fs::read_to_string(ev.join("cstar.jsonl")).unwrap(),
        "\nnot a cstar\n"
    );
    std::fs::remove_file(ev.join("cstar.jsonl")).unwrap();
    std::fs::write(ev.join("eval.json"), "precious\n").unwrap();
    let o = toolsift(cwd.path(), tmp.path(), &args);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("is not an eval-demo report"),
        "{}",
        stderr(&o)
    );
    assert!(!ev.join("corpus.jsonl").exists(), "nothing written");
    assert_eq!(
        std::fs::read_to_string(ev.join("eval.json")).unwrap(),
        "precious\n"
    );
    std::fs::remove_file(ev.join("eval.json")).unwrap();
    // A named pipe in its place is refused, not opened (which would wait for a writer).
    #[cfg(unix)]
    for name in ["corpus.jsonl", "eval.json"] {
        let fifo = ev.join(name);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("mkfifo unavailable: the named-pipe case is not run");
            break;
        }
        let o = toolsift(cwd.path(), tmp.path(), &args);
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("exists and is not a file"),
            "{}",
            stderr(&o)
        );
        std::fs::remove_file(&fifo).unwrap();
    }
    // --out must be a folder.
    std::fs::write(cwd.path().join("file"), "x").unwrap();
    let mut file_out = args;
    file_out[2] = "file";
    let o = toolsift(cwd.path(), tmp.path(), &file_out);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("file (--out) is not a folder"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn annotate_demo_default_output_is_in_the_working_directory() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let o = toolsift(
        cwd.path(),
        tmp.path(),
        &["annotate", "--demo", "--no-progress", "--demo-docs", "3"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = cwd.path().join("toolsift-demo").join("cstar.jsonl");
    assert_eq!(lines(&out).len(), 3);
    assert!(stderr(&o).contains("cstar.jsonl"));
}

#[test]
fn demo_flags_conflict_with_model_corpus_and_config() {
    let cwd = tempfile::tempdir().unwrap();
    for extra in [["--model", "m"], ["--corpus", "c"], ["--config", "t"]] {
        let mut args = vec!["annotate", "--demo"];
        args.extend(extra);
        let o = toolsift(cwd.path(), cwd.path(), &args);
        assert!(!o.status.success());
        assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    }
    // --print-config shows the demo's settings.
    let o = toolsift(
        cwd.path(),
        cwd.path(),
        &["annotate", "--demo", "--print-config"],
    );
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("placement = \"inline\""), "{text}");
    assert!(text.contains("Add Calculator calls."), "{text}");
}

/// The report's shape, and the targets on the documented evaluation set itself (seed 2,
/// all 240 documents: precision 0.977, recall 0.947, control 0.000 in docs/demo.md), and
/// generation with tools beats generation without. The whole set, not a sample: its 49 control
/// documents leave room for two calls under the 5% target, where 80 documents' 18 left none (one
/// seed-2 control call scores a delta of 0.46 against tau_f 0.5).
#[test]
fn eval_demo_json_parses_and_meets_the_targets() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let o = toolsift(
        cwd.path(),
        tmp.path(),
        &["eval-demo", "--json", "--no-progress"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).expect("one JSON object on stdout");
    assert_eq!(report["seed"], 2);
    assert_eq!(report["metrics"]["docs"], 240);
    assert_eq!(report["metrics"]["records"], 240);
    for t in report["targets"].as_array().unwrap() {
        assert_eq!(t["pass"], true, "{t}");
    }
    let tool_use = &report["tool_use"];
    let (with, without) = (
        tool_use["correct_with_tools"].as_u64().unwrap(),
        tool_use["correct_without_tools"].as_u64().unwrap(),
    );
    assert!(
        with >= without + tool_use["prompts"].as_u64().unwrap() / 2,
        "{tool_use}"
    );
    let calc = &report["metrics"]["calculator"];
    for key in ["precision", "recall", "control_rate", "kept", "sites"] {
        assert!(calc.get(key).is_some(), "{key}: {report}");
    }
    assert!(report["metrics"]["calendar"]["kept"].is_u64());
    // The stricter companions: every correct kept call stands at a site, and every hit site
    // has a kept call with its answer (docs/demo.md: 125 of 128, 125 of 132).
    let count = |key: &str| calc[key].as_u64().unwrap();
    assert_eq!(count("correct_at_sites"), count("correct"), "{calc}");
    assert_eq!(count("sites_hit_right"), count("sites_hit"), "{calc}");
    assert_eq!(calc["precision_at_sites"], calc["precision"]);
    // Without the filter, more calls and a worse precision: the filter is what selects.
    let all = &report["unfiltered"]["calculator"];
    assert!(all["kept"].as_u64() > calc["kept"].as_u64(), "{all}");
    assert!(
        all["precision"].as_f64() < calc["precision"].as_f64(),
        "{all}"
    );
    assert_eq!(report["targets"].as_array().unwrap().len(), 3);
    assert_eq!(report["tools"].as_array().unwrap().len(), 2);
    assert!(report["wall_secs"].as_f64().unwrap() > 0.0);
    let dir = cwd.path().join("toolsift-demo-eval");
    assert_eq!(lines(&dir.join("corpus.jsonl")).len(), 240);
    assert_eq!(lines(&dir.join("cstar.jsonl")).len(), 240);
    assert!(dir.join("eval.json").exists());
}

/// Both demo commands as library calls, as an embedding program runs them: prepared (the set
/// written, an earlier output named for replacement), then run; the returned report is the one
/// written to eval.json, and the demo run's C* has one line per document.
#[test]
fn demo_runs_as_library_calls() {
    use toolsift::annotate::RunOutcome;
    use toolsift::demo::run::{DemoOptions, DemoRun, EvalOptions, EvalRun};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo").join("c.jsonl");
    let options = DemoOptions {
        device: toolsift::Device::Cpu,
        seed: None,
        docs: Some(3),
        tools: None,
        out: out.clone(),
        progress: false,
    };
    for round in 0..2 {
        let demo = DemoRun::prepare(options.clone()).unwrap();
        assert_eq!(demo.documents, 3);
        assert_eq!(demo.replaced.len(), 3 * round, "{:?}", demo.replaced);
        let RunOutcome::Done(summary, paths) = demo.run().unwrap() else {
            panic!("stopped")
        };
        assert_eq!(summary.documents, 3);
        assert_eq!(paths.out, out);
        assert_eq!(lines(&out).len(), 3);
    }

    let eval_dir = dir.path().join("eval");
    let eval_options = EvalOptions {
        seed: 7,
        docs: 6,
        device: toolsift::Device::Cpu,
        out_dir: eval_dir.clone(),
        tool_use: false,
        progress: false,
    };
    let eval = EvalRun::prepare(eval_options.clone()).unwrap();
    // The folder is this run's until it ends: a second one would replace the set and C* it
    // measures.
    let err = EvalRun::prepare(EvalOptions {
        seed: 8,
        ..eval_options.clone()
    })
    .err()
    .expect("a second eval-demo into a folder in use")
    .to_string();
    assert!(
        err.contains("another eval-demo run is writing into this folder"),
        "{err}"
    );
    // The demo's own folder is no output: it is rewritten when found altered.
    let assets = eval.assets_dir.clone();
    let err = EvalRun::prepare(EvalOptions {
        out_dir: assets.join("eval"),
        ..eval_options.clone()
    })
    .err()
    .expect("eval-demo into the demo's folder")
    .to_string();
    assert!(err.contains("inside the demo's own folder"), "{err}");
    let err = DemoRun::prepare(DemoOptions {
        out: assets.join("c.jsonl"),
        ..options.clone()
    })
    .err()
    .expect("annotate --demo into the demo's folder")
    .to_string();
    assert!(err.contains("inside the demo's own folder"), "{err}");
    assert!(!assets.join("eval").exists() && !assets.join("c.jsonl").exists());
    assert_eq!((eval.documents(), eval.seed()), (6, 7));
    assert_eq!(lines(&eval.corpus).len(), 6);
    let outcome = eval.run().unwrap();
    assert_eq!(outcome.summary.documents, 6);
    assert!(outcome.report.tool_use.is_none());
    let written: toolsift::demo::eval::EvalReport =
        serde_json::from_str(&std::fs::read_to_string(&outcome.report_path).unwrap()).unwrap();
    assert_eq!(written, outcome.report);
    assert_eq!(lines(&eval_dir.join("cstar.jsonl")).len(), 6);
}

/// `DemoOptions::tools` chooses the tools the demo run samples (the CLI's `--tools`): the
/// summary has those alone, in that order.
#[test]
fn a_demo_run_samples_the_tools_it_is_given() {
    use toolsift::annotate::{RunOutcome, ToolKind};
    use toolsift::demo::run::{DemoOptions, DemoRun};
    let dir = tempfile::tempdir().unwrap();
    let demo = DemoRun::prepare(DemoOptions {
        device: toolsift::Device::Cpu,
        seed: None,
        docs: Some(1),
        tools: Some(vec![ToolKind::Calendar]),
        out: dir.path().join("c.jsonl"),
        progress: false,
    })
    .unwrap();
    let RunOutcome::Done(summary, _) = demo.run().unwrap() else {
        panic!("stopped")
    };
    let tools: Vec<&str> = summary.tools.iter().map(|t| t.tool.as_str()).collect();
    assert_eq!(tools, ["Calendar"]);
}

#[test]
fn generate_demo_calls_the_calculator_and_uses_its_result() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let o = toolsift(
        cwd.path(),
        tmp.path(),
        &[
            "generate",
            "--demo",
            "--prompt",
            "Out of 540 voters, 108 (or",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let line: Value = serde_json::from_slice(&o.stdout).expect("one JSON line");
    let calls = line["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{line}");
    assert_eq!(calls[0]["tool"], "Calculator");
    assert_eq!(calls[0]["result"], "20");
    let completion = line["completion"].as_str().unwrap();
    assert!(completion.contains("-> 20] 20%"), "{completion}");
}

/// `annotate --demo --device cuda` without a GPU: the emulated device (feature `emu`,
/// `TOOLSIFT_EMU_DEVICE=1`; docs/kernels.md) runs the CUDA backend's whole annotate path, host
/// code, cuBLASLt calls and kernels, on a few documents. Its C* covers the same lines as the
/// CPU engine's, and every call both backends scored has the same losses up to bf16 rounding.
#[cfg(feature = "emu")]
#[test]
fn annotate_demo_runs_on_the_emulated_cuda_device() {
    let run = |device: &str| {
        let cwd = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let args = [
            "annotate",
            "--demo",
            "--device",
            device,
            "--no-progress",
            "--demo-docs",
            "3",
        ];
        let o = on_the_emulated_device(cwd.path(), tmp.path(), &args);
        assert!(o.status.success(), "--device {device}: {}", stderr(&o));
        let dir = cwd.path().join("toolsift-demo");
        let summary: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("cstar.summary.json")).unwrap())
                .unwrap();
        (lines(&dir.join("cstar.jsonl")), summary)
    };
    let (cpu, cpu_summary) = run("cpu");
    let (cuda, cuda_summary) = run("cuda");
    assert_eq!(cuda.len(), 3);
    for (a, b) in cuda.iter().zip(&cpu) {
        assert_eq!(a["id"], b["id"]);
        assert_eq!(a["text"], b["text"]);
    }
    assert!(cuda_summary["candidates_scored"].as_u64().unwrap() > 0);
    let examples = |s: &Value| -> Vec<Value> {
        s["tools"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["best"].as_array().into_iter().flatten().cloned())
            .chain(
                s["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|t| t["worst"].as_array().into_iter().flatten().cloned()),
            )
            .collect()
    };
    let cpu_examples = examples(&cpu_summary);
    let (mut compared, mut worst) = (0, 0f64);
    for e in examples(&cuda_summary) {
        for key in ["l_none", "l_call", "l_call_result"] {
            assert!(
                e[key].is_null() || e[key].as_f64().unwrap().is_finite(),
                "{e}"
            );
        }
        let Some(c) = cpu_examples
            .iter()
            .find(|c| c["line"] == e["line"] && c["context"] == e["context"])
        else {
            continue;
        };
        for key in ["l_none", "l_call", "l_call_result"] {
            let (Some(g), Some(w)) = (e[key].as_f64(), c[key].as_f64()) else {
                assert_eq!(e[key], c[key], "{key}: cuda {e} vs cpu {c}");
                continue;
            };
            // bf16 weights and activations: u = 2^-8 per rounding, a few roundings per layer.
            assert!(
                (g - w).abs() <= 0.05 + 0.02 * w.abs(),
                "{key}: cuda {e} vs cpu {c}"
            );
            worst = worst.max((g - w).abs());
        }
        compared += 1;
    }
    assert!(compared > 0, "no call scored by both backends");
    eprintln!("{compared} calls scored by both backends, largest loss difference {worst:.4}");
}

/// `eval-demo --device cuda` without a GPU, on the emulated device: the CUDA backend samples,
/// scores and then generates (the tool-use half, KV-cached decoding on the device) for a set of
/// four documents, seed 3's first: two calendar sites, a control text and an arithmetic site.
/// The calculator's figures are the CPU engine's: its calls' deltas are at least 1.18 from
/// tau_f 0.5 on both backends, far past bf16's rounding. The calendar's are not compared: one
/// of its calls scores 0.991 on the CPU and 0.986 here against tau_f 1.0.
#[cfg(feature = "emu")]
#[test]
fn eval_demo_runs_on_the_emulated_cuda_device() {
    // The report, the run's summary and its C*.
    let run = |device: &str| -> (Value, Value, Vec<Value>) {
        let cwd = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let args = [
            "eval-demo",
            "--device",
            device,
            "--no-progress",
            "--json",
            "--seed",
            "3",
            "--docs",
            "4",
        ];
        let o = on_the_emulated_device(cwd.path(), tmp.path(), &args);
        assert!(o.status.success(), "--device {device}: {}", stderr(&o));
        let report: Value = serde_json::from_slice(&o.stdout).expect("one JSON object on stdout");
        let cstar = cwd.path().join(report["cstar"].as_str().unwrap());
        let summary = std::fs::read_to_string(cstar.with_extension("summary.json")).unwrap();
        (
            report,
            serde_json::from_str(&summary).unwrap(),
            lines(&cstar),
        )
    };
    let ((cpu, _, cpu_cstar), (cuda, cuda_summary, cuda_cstar)) = (run("cpu"), run("cuda"));
    // The CUDA backend scored the calls: their losses are the CPU engine's up to bf16 rounding
    // (as in the annotate test above), not the same bits.
    assert_eq!(cuda_summary["run"]["info"]["device"], "Cuda");
    // Calls sampled by both (bf16 sampling may draw a call the CPU did not, and miss one).
    let losses = |cstar: &[Value]| -> std::collections::HashMap<String, f64> {
        let calls = cstar.iter().flat_map(|d| {
            let calls = d["calls"].as_array().unwrap();
            calls.iter().map(move |c| (d["line"].clone(), c))
        });
        calls
            .filter_map(|(line, c)| {
                let key = format!("{line} {} {} {}", c["position"], c["input"], c["result"]);
                Some((key, c["l_none"].as_f64()?))
            })
            .collect()
    };
    let (cpu_losses, cuda_losses) = (losses(&cpu_cstar), losses(&cuda_cstar));
    let common: Vec<(f64, f64)> = cuda_losses
        .iter()
        .filter_map(|(key, &g)| Some((cpu_losses.get(key).copied()?, g)))
        .collect();
    assert!(
        common.len() * 2 >= cpu_losses.len(),
        "{cpu_losses:?} vs {cuda_losses:?}"
    );
    for &(w, g) in &common {
        assert!((g - w).abs() <= 0.05 + 0.02 * w, "cpu {w} vs cuda {g}");
    }
    assert!(
        common.iter().any(|(w, g)| w != g),
        "the same bits: the CPU engine ran"
    );
    assert_eq!(cuda["metrics"]["records"], 4, "{cuda}");
    assert_eq!(cuda["metrics"]["unmatched_records"], 0, "{cuda}");
    let calc = &cuda["metrics"]["calculator"];
    assert_eq!(calc, &cpu["metrics"]["calculator"], "cuda vs cpu");
    // The set holds what the comparison needs: a site found, a control text left alone.
    assert_eq!(calc["sites_hit"], 1, "{calc}");
    assert_eq!(calc["control_docs"], 1, "{calc}");
    assert_eq!(calc["control_with_calls"], 0, "{calc}");
    assert_eq!(cuda["metrics"]["calendar"]["sites"], 2, "{cuda}");
    for tool in cuda["tools"].as_array().unwrap() {
        assert!(tool["executed"].as_u64().unwrap() > 0, "{tool}");
    }
    let (tool_use, cpu_tool_use) = (&cuda["tool_use"], &cpu["tool_use"]);
    assert_eq!(tool_use["prompts"], 1, "{tool_use}");
    for key in [
        "calls_with_result",
        "correct_with_tools",
        "correct_without_tools",
    ] {
        assert_eq!(
            tool_use[key], cpu_tool_use[key],
            "{key}: cuda {tool_use} vs cpu {cpu_tool_use}"
        );
    }
}

/// `--device cuda` on a machine without a GPU (and without `TOOLSIFT_EMU_DEVICE`) stops with an
/// error that says what is missing, not a panic. Where a device is present there is nothing to
/// check.
#[cfg(feature = "cuda")]
#[test]
fn annotate_demo_on_cuda_without_a_gpu_is_a_clear_error() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "annotate",
        "--demo",
        "--device",
        "cuda",
        "--no-progress",
        "--demo-docs",
        "1",
    ];
    let o = command(cwd.path(), tmp.path(), &args)
        .env_remove("TOOLSIFT_EMU_DEVICE")
        .output()
        .expect("run toolsift");
    let err = stderr(&o);
    if o.status.success() {
        eprintln!("a CUDA device is present; nothing to check");
        return;
    }
    assert!(err.contains("error: cuda: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Nothing was written: the device is opened before the output is prepared.
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);
}

/// Sizes that cannot be met are clap errors, not a panic or an out-of-memory.
#[test]
fn absurd_sizes_are_flag_errors() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for (args, want) in [
        (
            &["eval-demo", "--docs", "18446744073709551615"][..],
            "at most 100000",
        ),
        (
            &["generate", "--demo", "--prompt", "x", "--batch-size", "0"][..],
            "at least 1",
        ),
    ] {
        let o = toolsift(cwd.path(), tmp.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

/// A temp dir where the demo model cannot be written is an error that says TMPDIR is why, and
/// how to fix it.
#[cfg(target_os = "linux")]
#[test]
fn an_unwritable_temp_dir_is_named_with_the_way_out() {
    let cwd = tempfile::tempdir().unwrap();
    let o = toolsift(cwd.path(), Path::new("/proc"), &["annotate", "--demo"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("under the temp dir /proc (TMPDIR: set it to a writable folder)"),
        "{err}"
    );
}

// From the hand mutation review of demo/tool_use, demo/run and cli/demo (session 49).

/// An eval-demo run removes an interrupted earlier run's journal (it belongs to another set),
/// annotates with the demo's settings (their seed, not the set's), and writes its report to
/// eval.json as one line with the unfiltered metrics.
#[test]
fn an_eval_run_clears_the_journal_and_writes_one_line_of_eval_json() {
    use toolsift::demo::run::{settings, EvalOptions, EvalRun};
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("cstar.jsonl.partial");
    std::fs::write(&journal, "").unwrap();
    let eval = EvalRun::prepare(EvalOptions {
        seed: 7,
        docs: 2,
        device: toolsift::Device::Cpu,
        out_dir: dir.path().to_path_buf(),
        tool_use: false,
        progress: false,
    })
    .unwrap();
    assert_eq!(eval.replaced, std::slice::from_ref(&journal));
    assert!(!journal.exists());
    let outcome = eval.run().unwrap();
    assert_eq!(outcome.report_path, dir.path().join("eval.json"));
    let text = std::fs::read_to_string(&outcome.report_path).unwrap();
    assert!(text.ends_with("}\n") && text.lines().count() == 1, "{text}");
    assert!(outcome.report.unfiltered.is_some());
    let run = outcome.summary.run.expect("the run recorded");
    let config = run["config"].as_str().unwrap();
    let seed = settings(None).unwrap().seed;
    assert_ne!(seed, 7);
    assert!(config.contains(&format!("seed = {seed}\n")), "{config}");
}

/// `annotate --demo` resumes an interrupted demo run, so its journal is neither removed nor
/// listed as replaced; and tools the demo's settings lack are refused when preparing.
#[test]
fn a_demo_run_keeps_the_journal_and_refuses_tools_it_lacks() {
    use toolsift::annotate::ToolKind;
    use toolsift::demo::run::{DemoOptions, DemoRun};
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("c.jsonl.partial");
    std::fs::write(&journal, "").unwrap();
    let options = DemoOptions {
        device: toolsift::Device::Cpu,
        seed: None,
        docs: Some(1),
        tools: None,
        out: dir.path().join("c.jsonl"),
        progress: false,
    };
    let demo = DemoRun::prepare(options.clone()).unwrap();
    assert!(demo.replaced.is_empty(), "{:?}", demo.replaced);
    assert!(journal.exists());
    drop(demo);
    let refused = DemoRun::prepare(DemoOptions {
        tools: Some(vec![ToolKind::WikiSearch]),
        ..options
    });
    assert!(refused.is_err(), "a demo run with WikiSearch");
}

/// eval-demo's flags reach the run: --seed and --docs make the set, --skip-generate leaves the
/// comparison out, --json prints the report.
#[test]
fn eval_demo_flags_reach_the_run() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "eval-demo",
        "--seed",
        "7",
        "--docs",
        "2",
        "--skip-generate",
        "--json",
        "--no-progress",
        "--out",
        "ev",
    ];
    let o = toolsift(cwd.path(), tmp.path(), &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).expect("one JSON object on stdout");
    assert_eq!(report["seed"], 7);
    assert_eq!(report["metrics"]["docs"], 2);
    assert!(report["tool_use"].is_null(), "{report}");
    assert_eq!(lines(&cwd.path().join("ev").join("corpus.jsonl")).len(), 2);
}

/// `annotate --demo`'s --seed and --tools reach the run: its recorded settings have the seed,
/// its summary those tools alone.
#[test]
fn annotate_demo_seed_and_tools_reach_the_run() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "annotate",
        "--demo",
        "--seed",
        "9",
        "--tools",
        "calendar",
        "--demo-docs",
        "1",
        "--out",
        "c.jsonl",
        "--no-progress",
    ];
    let o = toolsift(cwd.path(), tmp.path(), &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(cwd.path().join("c.summary.json")).unwrap())
            .unwrap();
    let config = summary["run"]["config"].as_str().unwrap();
    assert!(config.contains("seed = 9\n"), "{config}");
    assert_eq!(summary["tools"].as_array().unwrap().len(), 1, "{summary}");
    assert_eq!(summary["tools"][0]["tool"], "Calendar");
}

/// A relative --out from inside the demo's own folder is refused too: the working directory
/// is where it would go.
#[test]
fn a_relative_out_inside_the_demo_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let assets = toolsift::demo::assets::materialize_in(tmp.path()).unwrap();
    let args = [
        "annotate",
        "--demo",
        "--out",
        "c.jsonl",
        "--demo-docs",
        "1",
        "--no-progress",
    ];
    let o = toolsift(&assets, tmp.path(), &args);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("inside the demo's own folder"),
        "{}",
        stderr(&o)
    );
    assert!(!assets.join("c.jsonl").exists());
}

/// `annotate --demo`'s output must name a file, as `annotate`'s: a folder, or a name spelled as
/// one, is refused when preparing, with the way out, and nothing is made there.
#[test]
fn a_demo_output_that_names_a_folder_is_refused() {
    use toolsift::demo::run::{DemoOptions, DemoRun};
    let dir = tempfile::tempdir().unwrap();
    let spelled = dir.path().join("new").join("");
    assert!(spelled.to_str().unwrap().ends_with('/'));
    for out in [dir.path().to_path_buf(), spelled] {
        let err = DemoRun::prepare(DemoOptions {
            device: toolsift::Device::Cpu,
            seed: None,
            docs: Some(1),
            tools: None,
            out: out.clone(),
            progress: false,
        })
        .err()
        .unwrap_or_else(|| panic!("{} taken for a C* file", out.display()))
        .to_string();
        assert!(err.contains("give a file name for C*"), "{err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
