#!/usr/bin/env python3
"""Compare two C* files of the same corpus, e.g. `annotate --demo` on the CPU engine and on CUDA.

    scripts/compare-cstar.py A/cstar.jsonl B/cstar.jsonl

Prints: whether both cover the same corpus lines; how many annotated texts are identical; the kept
calls of each and how many they share; the sampled calls they share (the backends sample in f32 and
bf16, so near-ties pick differently); for calls both scored, the largest loss difference and how
many were kept by one backend only. Kept calls found on one side only are listed with their
deltas, so a flip at a near-tie (delta ~ tau_f) is told apart from a real disagreement.

Exit status 1 when the line sets or the kept calls differ, else 0.
"""
import json
import sys


def load(path):
    out = {}
    try:
        with open(path) as f:
            for n, text in enumerate(f, 1):
                try:
                    d = json.loads(text)
                    out[d["line"]] = d
                except (ValueError, KeyError, TypeError) as e:
                    sys.exit(f"{path}:{n}: not a C* line: {e}")
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")
    return out


def key(line, call):
    return (line, call["position"], call["tool"], call["input"], call["result"])


def calls(cstar):
    return {key(n, c): c for n, d in cstar.items() for c in d["calls"]}


def main(a_path, b_path):
    a, b = load(a_path), load(b_path)
    same_lines = a.keys() == b.keys()
    print(f"lines: {len(a)} and {len(b)}, same set: {same_lines}")
    identical = sum(a[n]["annotated_text"] == b[n]["annotated_text"] for n in a.keys() & b.keys())
    print(f"identical annotated texts: {identical} of {len(a.keys() & b.keys())}")

    ca, cb = calls(a), calls(b)
    kept_a = {k for k, c in ca.items() if c["kept"]}
    kept_b = {k for k, c in cb.items() if c["kept"]}
    print(f"kept calls: {len(kept_a)} and {len(kept_b)}, in common {len(kept_a & kept_b)}")
    print(f"sampled calls: {len(ca)} and {len(cb)}, in common {len(ca.keys() & cb.keys())}")

    worst, flips, scored = 0.0, 0, 0
    for k in ca.keys() & cb.keys():
        x, y = ca[k], cb[k]
        if x["delta"] is None or y["delta"] is None:
            continue
        scored += 1
        worst = max(worst, *(abs(x[f] - y[f]) for f in ("l_none", "l_call", "l_call_result")))
        flips += x["kept"] != y["kept"]
    print(f"scored by both: {scored}, max |loss difference| {worst:.4g}, kept by one only {flips}")

    for side, only, other in (("A", kept_a - kept_b, cb), ("B", kept_b - kept_a, ca)):
        for k in sorted(only)[:10]:
            mine = (ca if side == "A" else cb)[k]["delta"]
            theirs = other[k]["delta"] if k in other else None
            print(f"  kept in {side} only: line {k[0]} {k[2]}({k[3]}) -> {k[4]} at {k[1]}: "
                  f"delta {mine:.4f} here, {theirs if theirs is None else f'{theirs:.4f}'} there")
    return 0 if same_lines and kept_a == kept_b else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
