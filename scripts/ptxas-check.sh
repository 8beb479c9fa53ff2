#!/usr/bin/env bash
# Assembles every PTX that build.rs produced for sm_90 (or $TOOLSIFT_CUDA_ARCH) with `ptxas -v`,
# prints registers / stack / spills per kernel as a markdown table, and fails if a kernel does not
# assemble or if the attention (tree, decode) or cross-entropy / log-softmax kernels spill to local
# memory.
#
# Usage: scripts/ptxas-check.sh [PTX_DIR]   (default: the newest target/*/build/toolsift-*/out
#        that holds PTX; build first with `cargo build --features cuda`)
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${TOOLSIFT_CUDA_ARCH:-sm_90}"

find_ptxas() {
  if [[ -n "${PTXAS:-}" ]]; then echo "$PTXAS"; return; fi
  for home in "${CUDA_HOME:-}" "${CUDA_PATH:-}"; do
    [[ -n "$home" && -x "$home/bin/ptxas" ]] && { echo "$home/bin/ptxas"; return; }
  done
  command -v ptxas 2>/dev/null && return
  local purelib
  purelib=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  for rel in nvidia/cu13/bin/ptxas nvidia/cuda_nvcc/bin/ptxas; do
    [[ -x "$purelib/$rel" ]] && { echo "$purelib/$rel"; return; }
  done
  echo "ptxas not found (NVCC's PyPI wheel ships it: see DEVELOPERS.md)" >&2
  exit 1
}

ptxas=$(find_ptxas)
dir="${1:-}"
if [[ -z "$dir" ]]; then
  dir=$(ls -td target/*/build/toolsift-*/out 2>/dev/null | while read -r d; do
          ls "$d"/*.ptx >/dev/null 2>&1 && { echo "$d"; break; }; done || true)
fi
[[ -n "$dir" ]] || { echo "no PTX found: run cargo build --features cuda with nvcc available" >&2; exit 1; }
echo "ptxas: $ptxas ($("$ptxas" --version | tail -1)); PTX from $dir; arch $arch"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ptx in "$dir"/*.ptx; do
  if ! "$ptxas" -v -arch="$arch" "$ptx" -o /dev/null >>"$log" 2>&1; then
    cat "$log"; echo "ptxas failed on $ptx" >&2; exit 1
  fi
done

python3 - "$log" <<'PY'
import re, sys
rows, cur = {}, None
for line in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
        cur = m.group(1); rows[cur] = {"regs": "?", "stack": 0, "spill_st": 0, "spill_ld": 0, "smem": 0}
        continue
    if cur is None:
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        rows[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
    m = re.search(r"Used (\d+) registers", line)
    if m:
        rows[cur]["regs"] = int(m.group(1))
        s = re.search(r"(\d+) bytes smem", line)
        rows[cur]["smem"] = int(s.group(1)) if s else 0
print("| kernel | registers | stack (B) | spill stores (B) | spill loads (B) | static smem (B) |")
print("|---|---|---|---|---|---|")
bad = []
for k in sorted(rows):
    r = rows[k]
    print(f"| {k} | {r['regs']} | {r['stack']} | {r['spill_st']} | {r['spill_ld']} | {r['smem']} |")
    if k.startswith(("tree_attention", "decode_attention", "lm_head_xent", "log_softmax")) and (r["spill_st"] or r["spill_ld"]):
        bad.append(k)
if not rows:
    sys.exit("no kernels found in ptxas output")
if bad:
    sys.exit(f"local-memory spills in {', '.join(bad)}")
print(f"{len(rows)} kernels assemble; no spills in the attention and cross-entropy kernels")
PY
