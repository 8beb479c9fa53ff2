#!/usr/bin/env python3
"""Hugging Face transformers baselines for the GPU benchmark (scripts/gpu-check.sh, docs/gpu.md).

Builds a GPT-J of the requested size with random bf16 weights directly on the GPU (scaled like
toolsift's GptjWeights::random so that next-token distributions are peaked, not uniform; the
rotary table rebuilt in float32), saves it as a safetensors folder that toolsift loads
(OUT/gptj-<size>), writes the standard scoring workload as token-level JSONL (one file per
placement, OUT/workload-<size>-<placement>.jsonl), and times two transformers scorers on it:

- naive: every candidate, three full forward passes over the whole text with z (z ++ x in prefix
  placement, x_<i ++ z ++ x_>=i inline), full logits, loss computed afterwards, padded batches;
- tuned: each sequence cut at its last weighted token, the no-call pass once per text, identical
  inputs deduplicated, the LM head only at weighted rows, length-sorted padded batches.

Writes one JSON object to OUT/hf_<size>.json: timings, tokens, and the tuned scorer's losses per
candidate for the agreement check against toolsift; prints it without the losses.
"""

import argparse
import json
import math
import os
import time

import torch
from transformers import GPTJConfig, GPTJForCausalLM

SIZES = {
    # toolsift bench's default model (src/main.rs BenchCli defaults).
    "default": dict(n_layer=8, n_embd=512, n_head=8, rotary_dim=32, vocab_size=50400),
    "6b": dict(n_layer=28, n_embd=4096, n_head=16, rotary_dim=64, vocab_size=50400),
}
WEIGHTS = [w / 3.0 for w in (1.0, 0.8, 0.6, 0.4, 0.2)]


def build_model(size, seed):
    cfg = GPTJConfig(n_positions=2048, n_inner=None, activation_function="gelu_new",
                     layer_norm_epsilon=1e-5, tie_word_embeddings=False, **SIZES[size])
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = GPTJForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    d, f = cfg.n_embd, 4 * cfg.n_embd
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_f.weight")):
                p.normal_(1.0, 0.1)
            elif name == "transformer.wte.weight":
                p.normal_(0.0, 1.0)
            elif name == "lm_head.weight":
                p.normal_(0.0, 4.0 / math.sqrt(d))
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.1)
            elif "fc_out" in name:
                p.normal_(0.0, 1.0 / math.sqrt(f))
            else:
                p.normal_(0.0, 1.0 / math.sqrt(d))
        # Rotary table in float32 (built under the bf16 default dtype above otherwise).
        from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
        table = create_sinusoidal_positions(cfg.n_positions, cfg.rotary_dim).to("cuda", torch.float32)
        for block in model.transformer.h:
            block.attn.embed_positions = table
    model.eval()
    return model, cfg


def workload(n_texts, vocab, seed, placement, text_len=256):
    """The standard workload's shape (src/workload.rs): 25 candidates per text at positions in
    [10, 250], e(c, eps) = "[" Tool(2) "(" input(4) ")" " ->" "]" " " (12 tokens) in prefix
    placement, " [" Tool(2) "(" input(4) ")" " ->" "]" (11 tokens) inline; 4 result tokens. The
    random draws do not depend on the placement: both have the same texts, positions and calls."""
    g = torch.Generator().manual_seed(seed)
    v = min(vocab, 50257)
    r = lambda n: torch.randint(0, v, (n,), generator=g).tolist()
    paren, close_paren, arrow, close = 7, 8, 4613, 60
    lead, trail = ([58], [220]) if placement == "prefix" else ([685], [])
    tools = [r(2) for _ in range(5)]
    cands = []
    for _ in range(n_texts):
        text = r(text_len)
        for _ in range(5):
            pos = int(torch.randint(10, 251, (1,), generator=g))
            tool = tools[int(torch.randint(0, 5, (1,), generator=g))]
            for _ in range(5):
                inp, res = r(4), r(4)
                head = lead + tool + [paren] + inp + [close_paren, arrow]
                cands.append(dict(text_ids=text, position=pos,
                                  call_ids=head + [close] + trail,
                                  call_result_ids=head + res + [close] + trail))
    return cands


def targets(c, z_len):
    """(row, token, weight) of a variant with |z| = z_len (x_j is at index z_len + j)."""
    n = len(c["text_ids"])
    out = []
    for t, w in enumerate(WEIGHTS):
        j = c["position"] + t
        if j >= n:
            break
        out.append((z_len + j - 1, c["text_ids"][j], w))
    return out


def batches(seqs, batch_size):
    for i in range(0, len(seqs), batch_size):
        yield seqs[i:i + batch_size]


def pad(batch):
    L = max(len(s) for s in batch)
    ids = torch.zeros((len(batch), L), dtype=torch.long)
    mask = torch.zeros((len(batch), L), dtype=torch.long)
    for i, s in enumerate(batch):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return ids.cuda(), mask.cuda()


@torch.no_grad()
def variant_seq(c, z, placement, end=None):
    """The variant's input: z ++ x (prefix) or x_{<i} ++ z ++ x_{>=i} (inline), cut at `end`.
    Either way x_j sits at index |z| + j, so `targets` serves both placements."""
    x = c["text_ids"][:end] if end is not None else c["text_ids"]
    if placement == "prefix" or not z:
        return z + x
    return x[:c["position"]] + z + x[c["position"]:]


def naive(model, cands, batch_size, placement):
    """Three full passes per candidate over the whole text with z, full logits."""
    seqs, tgts = [], []
    for c in cands:
        for z in ([], c["call_ids"], c["call_result_ids"]):
            seqs.append(variant_seq(c, z, placement))
            tgts.append(targets(c, len(z)))
    losses = []
    for b, bt in zip(batches(seqs, batch_size), batches(tgts, batch_size)):
        ids, mask = pad(b)
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
        for i, ts in enumerate(bt):
            losses.append(-sum(w * logp[i, row, tok].item() for row, tok, w in ts))
    return [losses[3 * k:3 * k + 3] for k in range(len(cands))], sum(len(s) for s in seqs)


@torch.no_grad()
def tuned(model, cands, batch_size, placement):
    """Cut at the last weighted token, no-call pass once per text, dedup, head at weighted rows,
    length-sorted batches."""
    seqs = {}  # tuple(ids) -> list of (cand, variant, targets)
    by_text = {}
    for k, c in enumerate(cands):
        end = min(c["position"] + len(WEIGHTS), len(c["text_ids"]))
        key = tuple(c["text_ids"])
        by_text.setdefault(key, []).append((k, c))
        for v, z in ((1, c["call_ids"]), (2, c["call_result_ids"])):
            s = tuple(variant_seq(c, z, placement, end))
            seqs.setdefault(s, []).append((k, v, targets(c, len(z))))
    for key, cs in by_text.items():  # one no-call pass per text, up to its last weighted token
        end = max(min(c["position"] + len(WEIGHTS), len(key)) for _, c in cs)
        s = key[:end]
        for k, c in cs:
            seqs.setdefault(s, []).append((k, 0, targets(c, 0)))
    order = sorted(seqs, key=len)
    losses = [[0.0, 0.0, 0.0] for _ in cands]
    lm_head = model.lm_head
    for b in batches(order, batch_size):
        ids, mask = pad([list(s) for s in b])
        hidden = model.transformer(input_ids=ids, attention_mask=mask).last_hidden_state
        rows, where = [], []
        for i, s in enumerate(b):
            for k, v, ts in seqs[s]:
                for row, tok, w in ts:
                    where.append((k, v, tok, w, len(rows)))
                    rows.append((i, row))
        if not rows:
            continue
        idx_b = torch.tensor([r[0] for r in rows], device="cuda")
        idx_r = torch.tensor([r[1] for r in rows], device="cuda")
        logp = torch.log_softmax(lm_head(hidden[idx_b, idx_r]).float(), -1)
        toks = torch.tensor([w[2] for w in where], device="cuda")
        picked = logp[torch.arange(len(where), device="cuda"), toks].tolist()
        for (k, v, _, w, _), lp in zip(where, picked):
            losses[k][v] -= w * lp
    return losses, sum(len(s) for s in seqs)


def timed(fn, reps):
    fn()  # warm-up
    torch.cuda.synchronize()
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return out, times[len(times) // 2], times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="default")
    ap.add_argument("--texts", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--placements", default="prefix,inline")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(args.out, f"gptj-{args.size}")
    t = time.perf_counter()
    model, cfg = build_model(args.size, args.seed)
    torch.cuda.synchronize()
    build_secs = time.perf_counter() - t
    t = time.perf_counter()
    model.save_pretrained(model_dir, safe_serialization=True, max_shard_size="20GB")
    save_secs = time.perf_counter() - t
    placements = args.placements.split(",")
    workloads, files = {}, {}
    for placement in placements:
        cands = workloads[placement] = workload(args.texts, cfg.vocab_size, args.seed, placement)
        files[placement] = os.path.join(args.out, f"workload-{args.size}-{placement}.jsonl")
        with open(files[placement], "w") as fh:
            for i, c in enumerate(cands):
                fh.write(json.dumps(dict(id=i, **c)) + "\n")
    report = dict(size=args.size, config=SIZES[args.size], model_dir=model_dir, workload=files,
                  candidates=len(cands), device=torch.cuda.get_device_name(),
                  torch=torch.__version__, build_secs=build_secs, save_secs=save_secs)
    with torch.no_grad():  # peakedness: entropy of next-token distributions on the first text
        ids = torch.tensor([cands[0]["text_ids"]], device="cuda")
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        ent = -(logp.exp() * logp).sum(-1).flatten()
        report["entropy_nats_median"] = ent.median().item()
        report["entropy_nats_uniform"] = math.log(cfg.vocab_size)
    for placement in placements:
        cands = workloads[placement]
        entry = report[placement] = {}
        (tl, tok), secs, all_ = timed(lambda: tuned(model, cands, args.batch_size, placement),
                                      args.reps)
        entry["tuned"] = dict(secs_median=secs, secs_all=all_, tokens=tok,
                              cands_per_s=len(cands) / secs)
        entry["tuned_losses"] = tl
        if not args.skip_naive:
            (nl, tok), secs, all_ = timed(
                lambda: naive(model, cands, args.batch_size, placement), max(1, args.reps // 2))
            entry["naive"] = dict(secs_median=secs, secs_all=all_, tokens=tok,
                                  cands_per_s=len(cands) / secs)
            entry["naive_vs_tuned_max_abs_diff"] = max(
                abs(a - b) for x, y in zip(nl, tl) for a, b in zip(x, y))
        entry["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    with open(os.path.join(args.out, f"hf_{args.size}.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "tuned_losses"}
                          if isinstance(v, dict) and "tuned" in v else v)
                      for k, v in report.items()}))


if __name__ == "__main__":
    main()
