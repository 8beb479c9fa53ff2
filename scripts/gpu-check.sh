#!/usr/bin/env bash
# The one script of a GPU session (docs/gpu.md), run on the GPU machine from the repository root
# with gpu-bundle/ (made by scripts/gpu-prep.sh) next to it:
#
#   scripts/gpu-check.sh OUT_DIR          (or OUT=... scripts/gpu-check.sh)
#
# 1. prints the card and where libcuda / libcublasLt live, sets LD_LIBRARY_PATH for cudarc;
# 2. runs the kernel fuzz suite, the whole-plan scoring tests and the sampling-step tests with
#    turned-up case counts, without the tensor-core attention kernel (tree_attention_mma); the
#    embedded demo with --device cuda (its C* compared with the CPU engine's); then that kernel's
#    cases alone, in processes of their own (a device fault poisons every test of its process);
# 3. benchmarks at GPT-J-6B size, then at toolsift bench's default size: random bf16 weights made
#    by transformers' GPTJForCausalLM on the GPU (scripts/hf_baseline.py), the transformers naive,
#    tuned and tuned_sdpa scorers, and toolsift on the same weights and workload (also with the
#    opt-in packed tiles and mma attention kernel); at 6B also the sampling steps (position
#    log-probs over a 512-token sequence, 5 prefixes x 5 samples of 16 tokens, and both as one
#    propose call); last, `toolsift bench --device cuda --skip-baselines` at its default size;
# 4. keeps every log and JSON in a work folder (GPU_CHECK_WORK, default /tmp/gpu-check-work;
#    the benchmark weights in GPU_CHECK_BENCH, default /tmp/toolsift-gpu-bench) and rewrites
#    OUT_DIR/summary.json after every step, so a run killed at its limit still brings back the
#    figures so far; at the end (an EXIT trap) OUT_DIR holds summary.json and
#    gpu-results.tgz, the work folder archived (only 8 files come back from the machine).
#
# Time: every step has its own timeout, cut to what is left before GPU_CHECK_DEADLINE seconds
# (default 380); a step with no time left is skipped and recorded so. Give the device run a timeout
# of about 420 s (GPU_CHECK_DEADLINE 40 s under any other): the summary and the archive take a
# few seconds after the deadline. A failed step is recorded in the summary and the script goes
# on; a bundle that is not there, or a first suite that finds no CUDA device, stops it at once.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:?usage: scripts/gpu-check.sh OUT_DIR}}"
mkdir -p "$OUT"
WORK="${GPU_CHECK_WORK:-/tmp/gpu-check-work}"
rm -rf "$WORK" && mkdir -p "$WORK"
T0=$(date +%s)
DEADLINE="${GPU_CHECK_DEADLINE:-380}"
BIN=gpu-bundle/bin
# The benchmark weights (12 GB at 6B) live outside OUT: only 8 files come back.
BENCH="${GPU_CHECK_BENCH:-/tmp/toolsift-gpu-bench}"
FUZZ_CASES="${TOOLSIFT_FUZZ_CASES:-256}"
TEXTS_6B="${TOOLSIFT_TEXTS_6B:-8}"
TEXTS_DEFAULT="${TOOLSIFT_TEXTS_DEFAULT:-8}"
declare -A status
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(elapsed) )); }
step() { # name timeout_s command...
  local name=$1 t=$2; shift 2
  local l
  l=$(left)
  if (( l < 5 )); then
    echo "== [$(elapsed)s] $name: skipped, the deadline (${DEADLINE}s) is reached"
    status[$name]=skipped
    return
  fi
  (( t > l )) && t=$l
  echo "== [$(elapsed)s] $name (timeout ${t}s)"
  # In the background and waited for: `timeout` puts the step in a process group of its own, so
  # a TERM to the script would not reach it, and bash runs a trap only after its foreground
  # command; `wait` returns at once on a signal, and the trap stops the step (STEP_PID).
  timeout -k 5 "$t" "$@" >"$WORK/$name.log" 2>&1 &
  STEP_PID=$!
  wait "$STEP_PID"
  local rc=$?
  STEP_PID=
  status[$name]=$rc
  tail -5 "$WORK/$name.log"
  echo "-- [$(elapsed)s] $name: rc $rc"
  write_summary quiet
}

# 4. The summary (after every step, and at the end): every step's status and the figures of its
# JSON, read from WORK, written to OUT/summary.json (replaced whole, so a kill never leaves half
# of one); `quiet` does not print it.
write_summary() {
if ! python3 - "$WORK" "$(elapsed)" "$(declare -p status)" "$OUT/summary.json" "${1:-}" <<'PY'
import json, os, re, sys
out, secs, decl = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dest = sys.argv[4] if len(sys.argv) > 4 else os.path.join(out, "summary.json")
quiet = len(sys.argv) > 5 and sys.argv[5] == "quiet"
status = dict(re.findall(r'\[([^\]]+)\]="([^"]*)"', decl))
summary = {"wall_secs": secs, "steps": status}
def load(p):
    """A step's JSON, or None where it is missing or cut short (a step killed while writing)."""
    if not os.path.exists(p):
        return None
    try:
        return json.load(open(p))
    except Exception as e:
        summary.setdefault("unreadable", {})[os.path.relpath(p, out)] = str(e)
        return None
for f in ("commit.txt",):
    p = os.path.join(out, f)
    if os.path.exists(p):
        summary["commit"] = open(p).read().strip()
for log in ("cuda_kernels", "cuda_scoring", "cuda_sampling", "cuda_kernels_mma",
            "cuda_scoring_mma"):
    p = os.path.join(out, log + ".log")
    if os.path.exists(p):
        text = open(p).read()
        summary[log] = {"result": re.findall(r"test result: .*", text),
                        "skipped": "SKIPPED" in text,
                        "notes": re.findall(r".*(?:cases passed|budget|cached|compared).*", text)}
p = os.path.join(out, "demo_compare.log")
if os.path.exists(p):
    summary["demo_cpu_vs_cuda"] = open(p).read().splitlines()
p = load(os.path.join(out, "demo-eval", "eval.json"))
if p is not None:
    summary["demo_eval_cuda"] = p
p = load(os.path.join(out, "sampling_6b.json"))
if p is not None:
    summary["sampling_6b"] = p
    pr = summary["sampling_6b"].get("propose", {})
    if pr.get("secs"):
        pr["_speedup_vs_two_calls"] = pr["two_calls_secs"] / pr["secs"]
# transformers' scorers (scripts/hf_baseline.py): tuned_sdpa is tuned with fused SDPA attention.
HF_SCORERS = ("tuned", "tuned_sdpa", "naive")
TAU_F = 1.0  # the decision agreement is counted where |delta - tau_f| > 0.05 (issue 7)
def delta(l):
    return min(l[0], l[1]) - l[2]
def of_peak(t):
    # The trunk's fraction of the run's own measured GEMM peak, and where that peak came from: a
    # report without one (before 2026-12-06) is divided by the H200's 790 TFLOP/s of then.
    peak = t.get("gemm_peak_tflops")
    if peak is not None and peak > 0:
        return t["trunk_tflops"] / peak, "measured"
    return t["trunk_tflops"] / 790.0, "h200-790-constant"
for size in ("default", "6b"):
    hf = load(os.path.join(out, "bench", f"hf_{size}.json"))
    if hf is None:
        continue
    entry = {k: hf[k] for k in ("candidates", "device", "torch", "entropy_nats_median",
                                "entropy_nats_uniform", "sdpa_backend") if k in hf}
    for placement in ("prefix", "inline"):
        h = hf.get(placement, {})
        e = entry[placement] = {"hf": {k: h[k] for k in HF_SCORERS + ("peak_mem_gib",
                                                                     "sdpa_vs_tuned_max_abs_diff")
                                         if k in h}}
        ts = load(os.path.join(out, f"toolsift_{size}_{placement}.json"))
        if ts is None:
            continue
        e["toolsift"] = {k: v for k, v in ts.items() if k != "losses"}
        if "tuned_losses" in h:
            tl, gl = h["tuned_losses"], ts["losses"]
            diffs = sorted(abs(a - b) for x, y in zip(tl, gl) for a, b in zip(x, y))
            hd = sorted(delta(x) for x in tl)
            agree = {}
            # tau_f = 1.0 (the paper's) keeps nothing on random weights, so the decisions are
            # also compared at thresholds that split the candidates: hf's delta quartiles.
            for name, tau in (("tau_1.0", TAU_F), ("tau_q25", hd[len(hd) // 4]),
                              ("tau_median", hd[len(hd) // 2]), ("tau_q75", hd[3 * len(hd) // 4])):
                clear = [(delta(x) >= tau, delta(y) >= tau) for x, y in zip(tl, gl)
                         if abs(delta(x) - tau) > 0.05]
                agree[name] = {"tau": tau, "clear": len(clear),
                               "agree": sum(a == b for a, b in clear) / max(1, len(clear)),
                               "hf_kept": sum(delta(x) >= tau for x in tl) / max(1, len(tl))}
            e["agreement_vs_hf_tuned"] = {
                "max_abs": diffs[-1], "median_abs": diffs[len(diffs) // 2],
                "decisions": agree}
        # The opt-in variants: packed tiles, the mma attention kernel, both.
        for variant in ("packed", "mma", "packed_mma"):
            tv = load(os.path.join(out, f"toolsift_{size}_{placement}_{variant}.json"))
            if tv is None:
                continue
            e[f"toolsift_{variant}"] = {k: v for k, v in tv.items() if k != "losses"}
            e[f"{variant}_speedup_vs_default"] = tv["cands_per_s"] / ts["cands_per_s"]
            for base in HF_SCORERS:
                if base in h:
                    e[f"{variant}_speedup_vs_hf_{base}"] = tv["cands_per_s"] / h[base]["cands_per_s"]
            if "tuned_losses" in h:
                vd = [abs(a - b) for x, y in zip(h["tuned_losses"], tv["losses"]) for a, b in zip(x, y)]
                e[f"{variant}_max_abs_vs_hf_tuned"] = max(vd)
            if "trunk_tflops" in tv:
                e[f"{variant}_fraction_of_peak"], e[f"{variant}_peak_source"] = of_peak(tv)
        prof = load(os.path.join(out, f"profile_{size}_{placement}.json"))
        if prof is not None:
            e["stages_profiled"] = prof.get("stage_secs_profiled")
            e["profiled_total_secs"] = prof.get("secs_median")
        for base in HF_SCORERS:
            if base in h:
                e[f"speedup_vs_hf_{base}"] = ts["cands_per_s"] / h[base]["cands_per_s"]
                # Device memory at its peak, weights included, both counted by their allocator
                # (toolsift's: the CUDA memory pool's high-water mark; torch's caching allocator).
                if ts.get("peak_mem_gib") and h[base].get("peak_mem_gib"):
                    e[f"peak_mem_vs_hf_{base}"] = ts["peak_mem_gib"] / h[base]["peak_mem_gib"]
        # The FLOP floor: the trunk's rate over this card's bf16 GEMM rate, measured in the run.
        if "trunk_tflops" in ts:
            e["gemm_peak_tflops"] = ts.get("gemm_peak_tflops")
            e["fraction_of_peak"], e["peak_source"] = of_peak(ts)
    summary[size] = entry
with open(dest + ".tmp", "w") as f:
    json.dump(summary, f, indent=1)
os.replace(dest + ".tmp", dest)
if not quiet:
    print(json.dumps(summary, indent=1))
PY
then
  echo "== the summary could not be written (above)"
fi
}

finish() {
  trap - EXIT
  trap '' TERM INT # the archive is written and OUT emptied as one piece
  mkdir -p "$WORK/bench"
  cp "$BENCH"/hf_*.json "$BENCH"/workload-*.jsonl "$WORK/bench/" 2>/dev/null
  write_summary
  # Only 8 files come back from the machine: everything goes into one archive besides
  # summary.json (a copy of it inside too).
  cp "$OUT/summary.json" "$WORK/" 2>/dev/null
  tar czf "$OUT/gpu-results.tgz.tmp" -C "$WORK" . && mv "$OUT/gpu-results.tgz.tmp" "$OUT/gpu-results.tgz"
  echo "== done in $(elapsed)s; summary.json and gpu-results.tgz (all logs and JSON) in $OUT"
}
STEP_PID=
on_signal() {
  echo "== terminated at $(elapsed)s"
  [[ -n $STEP_PID ]] && kill -TERM "$STEP_PID" 2>/dev/null && wait "$STEP_PID"
  exit 143
}
trap finish EXIT
trap on_signal TERM INT

echo "== machine"
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv; } \
  >"$WORK/nvidia-smi.txt" 2>&1
head -15 "$WORK/nvidia-smi.txt"
cat gpu-bundle/COMMIT 2>/dev/null | tee "$WORK/commit.txt"
# A bundle that is not there (not carried, or not made) would spend the run's minutes on steps
# that cannot start.
for b in toolsift cuda_kernels cuda_scoring cuda_sampling; do
  if [[ ! -x "$BIN/$b" ]]; then
    echo "== $BIN/$b is missing: make the bundle (scripts/gpu-prep.sh) and carry gpu-bundle"
    status[bundle]=missing
    exit 1
  fi
done
# transformers and the hub client must not try the network (there is none).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# cudarc dlopens libcuda.so and libcublasLt.so.{13,12}: find them (each folder that holds either).
libdirs=()
has() { compgen -G "$1" >/dev/null; }
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu \
         "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64; do
  { has "$d/libcuda.so*" || has "$d/libcublasLt.so*"; } && libdirs+=("$d")
done
purelib=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" 2>/dev/null || true)
for d in "$purelib"/nvidia/cublas/lib "$purelib"/nvidia/cu13/lib "$purelib"/nvidia/cu12/lib; do
  has "$d/libcublasLt.so*" && libdirs+=("$d")
done
found="$(IFS=:; echo "${libdirs[*]}")"
LD_LIBRARY_PATH="$found${found:+${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH
{
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for d in "${libdirs[@]}"; do ls -l "$d"/libcuda.so* "$d"/libcublasLt.so* 2>/dev/null; done
} | tee "$WORK/libs.txt"

# 2. correctness first, without the mma attention kernel (TOOLSIFT_TEST_MMA, tests/cuda_common).
export TOOLSIFT_FUZZ_CASES="$FUZZ_CASES"
TOOLSIFT_TEST_MMA=0 step cuda_kernels 90 "$BIN/cuda_kernels" --nocapture --test-threads 4
if grep -q "SKIPPED: no CUDA device" "$WORK/cuda_kernels.log"; then
  echo "== no CUDA device was found (libs.txt above): stopping, nothing else can run"
  status[device]=missing
  exit 1
fi
TOOLSIFT_FUZZ_CASES=$(( FUZZ_CASES / 8 )) TOOLSIFT_TEST_MMA=0 \
  step cuda_scoring 60 "$BIN/cuda_scoring" --nocapture
TOOLSIFT_FUZZ_CASES=$(( FUZZ_CASES / 8 )) step cuda_sampling 45 "$BIN/cuda_sampling" --nocapture
# The embedded demo on the GPU (issue 6), before the benchmarks so that a run cut short still
# has it: annotate --demo and eval-demo with --device cuda. (On this machine's 2 CPU cores the
# CPU engine takes ~8 s and ~12 s; the limits leave the 6B benchmarks their time.)
step demo_annotate_cuda 60 "$BIN/toolsift" annotate --demo --device cuda --no-progress \
  --out "$WORK/demo/cstar.jsonl"
step demo_eval_cuda 60 "$BIN/toolsift" eval-demo --device cuda --no-progress --json \
  --out "$WORK/demo-eval"
# The same demo on the CPU engine, and the two C* compared: the CUDA backend samples and scores in
# bf16, so some sampled calls differ at near-ties; the kept calls should not (on the emulated
# device all 163 were the same, docs/demo.md).
step demo_annotate_cpu 30 "$BIN/toolsift" annotate --demo --device cpu --no-progress \
  --out "$WORK/demo-cpu/cstar.jsonl"
step demo_compare 20 python3 scripts/compare-cstar.py "$WORK/demo-cpu/cstar.jsonl" \
  "$WORK/demo/cstar.jsonl"
# The tensor-core attention kernel, never run on a card before: its kernel cases and its
# whole-plan cases, each suite in a process of its own.
TOOLSIFT_TEST_MMA=only step cuda_kernels_mma 45 "$BIN/cuda_kernels" --nocapture \
  --exact tree_attention_matches_reference
TOOLSIFT_FUZZ_CASES=$(( FUZZ_CASES / 8 )) TOOLSIFT_TEST_MMA=only \
  step cuda_scoring_mma 40 "$BIN/cuda_scoring" --nocapture --exact cuda_matches_reference

# 3. benchmarks: transformers first (it makes the weights and the workload), then toolsift.
# toolsift on the weights and workload hf_baseline.py made: name size placement reps [VAR=VALUE...]
ts_bench() {
  local name=$1 size=$2 placement=$3 reps=$4; shift 4
  step "$name" 75 env TOOLSIFT_BENCH_MODEL="$BENCH/gptj-$size" \
    TOOLSIFT_BENCH_INPUT="$BENCH/workload-$size-$placement.jsonl" \
    TOOLSIFT_BENCH_OUTPUT="$WORK/$name.json" \
    TOOLSIFT_BENCH_PLACEMENT="$placement" TOOLSIFT_BENCH_REPS="$reps" "$@" \
    "$BIN/cuda_scoring" --ignored --exact cuda_bench --nocapture
}
bench() { # size texts timeout: transformers' three scorers on both placements, then toolsift
  local size=$1 texts=$2 t=$3
  step "hf_$size" "$t" python3 scripts/hf_baseline.py --out "$BENCH" --size "$size" \
       --texts "$texts" --reps 3
  [[ ${status[hf_$size]} == 0 ]] || return
  # Into the work folder now, not only at the end: the summary after each step reads it.
  mkdir -p "$WORK/bench" && cp "$BENCH/hf_$size.json" "$WORK/bench/"
  # Most wanted first (each run uploads the weights anew: ~11 s at 6B): the default engine,
  # then the opt-in variants, then where the time goes.
  for placement in prefix inline; do
    ts_bench "toolsift_${size}_$placement" "$size" "$placement" 5
  done
  # Inline again with packed attention tiles (CudaOptions::pack_tiles; off by default until
  # the suites above have passed with it: they test both layouts).
  ts_bench "toolsift_${size}_inline_packed" "$size" inline 5 TOOLSIFT_PACK_TILES=1
  # Both placements with the register-resident attention kernel (CudaOptions::mma_attention;
  # off by default until timed here), inline also packed: only where its cases passed.
  if [[ ${status[cuda_kernels_mma]:-} == 0 && ${status[cuda_scoring_mma]:-} == 0 ]]; then
    ts_bench "toolsift_${size}_prefix_mma" "$size" prefix 5 TOOLSIFT_ATTENTION_MMA=1
    ts_bench "toolsift_${size}_inline_packed_mma" "$size" inline 5 TOOLSIFT_PACK_TILES=1 \
      TOOLSIFT_ATTENTION_MMA=1
  else
    status[toolsift_${size}_mma]=skipped
  fi
  # The sampling steps at 6B, on the same weights.
  if [[ $size == 6b ]]; then
    TOOLSIFT_BENCH_MODEL="$BENCH/gptj-6b" TOOLSIFT_BENCH_OUTPUT="$WORK/sampling_6b.json" \
    TOOLSIFT_BENCH_REPS=3 \
      step sampling_6b 50 "$BIN/cuda_sampling" --ignored --exact cuda_sampling_bench --nocapture
  fi
  # Where the time goes: the same call with the stream synchronised after every stage.
  for placement in prefix inline; do
    ts_bench "profile_${size}_$placement" "$size" "$placement" 1 TOOLSIFT_CUDA_PROFILE=1
  done
}
if [[ -n "${GPU_CHECK_QUICK:-}" ]]; then
  echo "GPU_CHECK_QUICK: correctness suites and extra checks only, no benchmarks"
  status[benchmarks]=skipped
else
  rm -rf "$BENCH"
  # 6B first: its figures are the ones that matter, and transformers' step (weights made and
  # saved, both scorers timed) took ~100 s of the 214 of the run in docs/results/h200.md; the
  # third scorer (tuned_sdpa, since 2026-12-05) adds an estimated ~25 s at 12 texts. Started
  # only with the time for it and for toolsift's runs on the weights it makes.
  if (( $(left) >= 200 )); then
    bench 6b "$TEXTS_6B" 170
  else
    echo "skipping the 6B benchmark: $(left)s left before the deadline"
    status[hf_6b]=skipped
  fi
  rm -rf "$BENCH"/gptj-6b # 12 GB of /tmp
  bench default "$TEXTS_DEFAULT" 60
  # toolsift bench's own harness, toolsift alone at its default size (its candle baselines run on
  # the CPU only: bench refuses them with --device cuda).
  step toolsift_bench_cli 40 "$BIN/toolsift" bench --device cuda --skip-baselines
fi # GPU_CHECK_QUICK
# Extra checks a caller appends: EXTRA_CHECK="cmd ..." runs last.
if [[ -n "${EXTRA_CHECK:-}" ]]; then
  step extra 120 bash -c "$EXTRA_CHECK"
fi
exit 0

