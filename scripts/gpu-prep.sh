#!/usr/bin/env bash
# Prepares the GPU run on the development machine (docs/gpu.md): builds the release binary and the
# CUDA test executables with --features cuda, checks the PTX with ptxas, strips everything and
# copies it into gpu-bundle/ (git-ignored; carried to the GPU machine next to scripts/).
#
# Usage: scripts/gpu-prep.sh        then, on the GPU machine: scripts/gpu-check.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== release build (--features cuda)"
# Its build script's out folder holds the PTX this build embeds: named by cargo's own report,
# not guessed by date (an emulator build's folder can be newer).
build_json=$(cargo build --release --features cuda --bin toolsift --message-format=json)
ptx_dir=$(python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "build-script-executed" and "/build/toolsift-" in m.get("out_dir", ""):
        print(m["out_dir"])
' <<<"$build_json" | tail -1)
echo "== test executables"
json=$(cargo test --release --features cuda --no-run --message-format=json --test cuda_kernels --test cuda_scoring --test cuda_sampling)
mapfile -t exes < <(python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"] + " " + m["executable"])
' <<<"$json")
[[ ${#exes[@]} -eq 3 ]] || { echo "expected 3 test executables, got: ${exes[*]}" >&2; exit 1; }

echo "== ptxas"
if [[ -z "$ptx_dir" ]] || ! ls "$ptx_dir"/*.ptx >/dev/null 2>&1; then
  echo "the release build has no PTX: is nvcc installed? (DEVELOPERS.md)" >&2
  exit 1
fi
scripts/ptxas-check.sh "$ptx_dir" | tee /tmp/toolsift-ptxas.md

rm -rf gpu-bundle
mkdir -p gpu-bundle/bin
cp target/release/toolsift gpu-bundle/bin/
for e in "${exes[@]}"; do
  name=${e%% *}; path=${e#* }
  cp "$path" "gpu-bundle/bin/$name"
done
strip gpu-bundle/bin/*
cp /tmp/toolsift-ptxas.md gpu-bundle/ptxas.md
git rev-parse HEAD > gpu-bundle/COMMIT
git status --porcelain | grep -q . && echo "dirty" >> gpu-bundle/COMMIT || true
du -sh gpu-bundle gpu-bundle/bin/*
# A run carries the working tree and gpu-bundle/, 64 MiB in all.
bundle_kib=$(du -sk gpu-bundle | cut -f1)
tree_kib=$(git ls-files -z | du -ck --files0-from=- | tail -1 | cut -f1)
if (( bundle_kib + tree_kib > 60 * 1024 )); then
  echo "gpu-bundle ($bundle_kib KiB) and the tree ($tree_kib KiB) pass 60 MiB of the 64 a run carries" >&2
  exit 1
fi
echo "ready: carry gpu-bundle/ and run scripts/gpu-check.sh \$OUT on the GPU machine"
