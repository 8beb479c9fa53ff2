#!/usr/bin/env python3
"""Hugging Face transformers baselines for the GPU benchmark (scripts/gpu-check.sh, docs/gpu.md).

Builds a GPT-J of the requested size with random bf16 weights directly on the GPU (scaled like
toolsift's GptjWeights::random so that next-token distributions are peaked, not uniform; the
rotary table rebuilt in float32), saves it as a safetensors folder that toolsift loads
(OUT/gptj-<size>), writes the standard scoring workload as token-level JSONL (one file per
placement, OUT/workload-<size>-<placement>.jsonl), and times three transformers scorers on it,
all under torch.inference_mode (no autograd graph, no saved activations):

- naive: every candidate, three full forward passes over the whole text with z (z ++ x in prefix
  placement, x_<i ++ z ++ x_>=i inline), full logits, loss computed afterwards, padded batches;
- tuned: each sequence ends at the token before its last weighted token (that one is only a
  target: no row predicts from it), the no-call pass once per text, identical inputs
  deduplicated, the LM head only at weighted rows, length-sorted padded batches, no KV cache;
- tuned_sdpa: tuned with GPT-J's attention through torch's fused scaled_dot_product_attention,
  held to its flash kernel where that runs the model's shapes (`sdpa_backend` in the JSON says
  which ran). transformers' GPT-J offers only its eager attention (q and k cast to fp32,
  [B, H, T, T] scores and mask) or flash_attention_2, a package the GPU machine does not have;
  this is what a careful engineer would patch in.

Writes one JSON object to OUT/hf_<size>.json: timings, tokens, each scorer's peak device memory,
and the tuned scorers' losses per candidate for the agreement check against toolsift; prints it
without the losses. `--device cpu` runs the same on the CPU (a smoke test of the script; its
timings mean nothing).
"""

import argparse
import contextlib
import functools
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from transformers import GPTJConfig, GPTJForCausalLM

SIZES = {
    # toolsift bench's default model (src/cli/bench.rs BenchCli defaults).
    "default": dict(n_layer=8, n_embd=512, n_head=8, rotary_dim=32, vocab_size=50400),
    "6b": dict(n_layer=28, n_embd=4096, n_head=16, rotary_dim=64, vocab_size=50400),
}
WEIGHTS = [w / 3.0 for w in (1.0, 0.8, 0.6, 0.4, 0.2)]
DEVICE = "cuda"  # --device


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build_model(size, seed):
    cfg = GPTJConfig(n_positions=2048, n_inner=None, activation_function="gelu_new",
                     layer_norm_epsilon=1e-5, tie_word_embeddings=False, **SIZES[size])
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEVICE):
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
        table = create_sinusoidal_positions(cfg.n_positions, cfg.rotary_dim)
        table = table.to(DEVICE, torch.float32)
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
    return ids.to(DEVICE), mask.to(DEVICE)


def variant_seq(c, z, placement, end=None):
    """The variant's input: z ++ x (prefix) or x_{<i} ++ z ++ x_{>=i} (inline), cut at `end`.
    Either way x_j sits at index |z| + j, so `targets` serves both placements."""
    x = c["text_ids"][:end] if end is not None else c["text_ids"]
    if placement == "prefix" or not z:
        return z + x
    return x[:c["position"]] + z + x[c["position"]:]


@torch.inference_mode()
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
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        logp = torch.log_softmax(logits.float(), -1)
        # Every target of the batch in one gather and one copy to the host.
        at = [(i, row, tok) for i, ts in enumerate(bt) for row, tok, _ in ts]
        idx = torch.tensor(at, device=DEVICE).T
        picked = iter(logp[idx[0], idx[1], idx[2]].tolist())
        for ts in bt:
            losses.append(-sum(w * next(picked) for _, _, w in ts))
    return [losses[3 * k:3 * k + 3] for k in range(len(cands))], sum(len(s) for s in seqs)


def last_fed(c):
    """The end of x a variant feeds: up to, not including, its last weighted token."""
    return min(c["position"] + len(WEIGHTS), len(c["text_ids"])) - 1


@torch.inference_mode()
def tuned(model, cands, batch_size, placement):
    """Cut before the last weighted token, no-call pass once per text, dedup, head at weighted
    rows, length-sorted batches."""
    seqs = {}  # tuple(ids) -> list of (cand, variant, targets)
    by_text = {}
    for k, c in enumerate(cands):
        end = last_fed(c)
        key = tuple(c["text_ids"])
        by_text.setdefault(key, []).append((k, c))
        for v, z in ((1, c["call_ids"]), (2, c["call_result_ids"])):
            s = tuple(variant_seq(c, z, placement, end))
            seqs.setdefault(s, []).append((k, v, targets(c, len(z))))
    for key, cs in by_text.items():  # one no-call pass per text, up to its last weighted token
        end = max(last_fed(c) for _, c in cs)
        s = key[:end]
        for k, c in cs:
            seqs.setdefault(s, []).append((k, 0, targets(c, 0)))
    order = sorted(seqs, key=len)
    losses = [[0.0, 0.0, 0.0] for _ in cands]
    lm_head = model.lm_head
    for b in batches(order, batch_size):
        ids, mask = pad([list(s) for s in b])
        hidden = model.transformer(input_ids=ids, attention_mask=mask,
                                   use_cache=False).last_hidden_state
        rows, where = [], []
        for i, s in enumerate(b):
            for k, v, ts in seqs[s]:
                for row, tok, w in ts:
                    where.append((k, v, tok, w, len(rows)))
                    rows.append((i, row))
        if not rows:
            continue
        idx_b = torch.tensor([r[0] for r in rows], device=DEVICE)
        idx_r = torch.tensor([r[1] for r in rows], device=DEVICE)
        logp = torch.log_softmax(lm_head(hidden[idx_b, idx_r]).float(), -1)
        toks = torch.tensor([w[2] for w in where], device=DEVICE)
        picked = logp[torch.arange(len(where), device=DEVICE), toks].tolist()
        for (k, v, _, w, _), lp in zip(where, picked):
            losses[k][v] -= w * lp
    return losses, sum(len(s) for s in seqs)


def flash_runs(cfg):
    """Whether SDPA's flash kernel takes this model's q, k and v (bf16, its head_dim, causal)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    hd = cfg.n_embd // cfg.n_head
    q = torch.randn(1, cfg.n_head, 16, hd, device=DEVICE, dtype=torch.bfloat16)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return True
    except RuntimeError:
        return False


@contextlib.contextmanager
def sdpa_attention(flash):
    """GPT-J's attention through F.scaled_dot_product_attention, causal, with no mask: exact for
    every real row of a right-padded batch (`pad`), whose real tokens see only earlier positions,
    all real; rows past a sequence's end are padding that nothing reads. q, k and v stay in the
    model's dtype (eager casts q and k to fp32); `flash`: held to the flash kernel, else torch's
    choice of fused kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.models.gptj.modeling_gptj import GPTJAttention
    eager = GPTJAttention._attn

    def attn(self, query, key, value, attention_mask=None):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True,
                                             scale=1.0 / float(self.scale_attn))
        return out, None

    GPTJAttention._attn = attn
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if flash else contextlib.nullcontext():
            yield
    finally:
        GPTJAttention._attn = eager


def tuned_sdpa(model, cands, batch_size, placement, flash):
    with sdpa_attention(flash):
        return tuned(model, cands, batch_size, placement)


def max_abs(a, b):
    return max(abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


def timed(fn, reps):
    """(the last run's result, the median seconds, all seconds, the peak device memory in GiB
    over the warm-up and the runs; None on the CPU)."""
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    fn()  # warm-up
    sync()
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t)
    times.sort()
    peak = torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None
    return out, times[len(times) // 2], times, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="default")
    ap.add_argument("--texts", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--skip-sdpa", action="store_true")
    ap.add_argument("--placements", default="prefix,inline")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(args.out, f"gptj-{args.size}")
    t = time.perf_counter()
    model, cfg = build_model(args.size, args.seed)
    sync()
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
                  candidates=len(cands),
                  device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
                  torch=torch.__version__, build_secs=build_secs, save_secs=save_secs)
    with torch.no_grad():  # peakedness: entropy of next-token distributions on the first text
        ids = torch.tensor([cands[0]["text_ids"]], device=DEVICE)
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        ent = -(logp.exp() * logp).sum(-1).flatten()
        report["entropy_nats_median"] = ent.median().item()
        report["entropy_nats_uniform"] = math.log(cfg.vocab_size)
    for placement in placements:
        cands = workloads[placement]
        entry = report[placement] = {}
        scorers = [("tuned", tuned, args.reps)]
        if not args.skip_sdpa:
            flash = flash_runs(model.config)
            report["sdpa_backend"] = "flash" if flash else "torch's choice"
            scorers.append(("tuned_sdpa", functools.partial(tuned_sdpa, flash=flash), args.reps))
        if not args.skip_naive:
            scorers.append(("naive", naive, max(1, args.reps // 2)))
        for name, scorer, reps in scorers:
            (losses, tok), secs, all_, peak = timed(
                lambda: scorer(model, cands, args.batch_size, placement), reps)
            entry[name] = dict(secs_median=secs, secs_all=all_, tokens=tok,
                               cands_per_s=len(cands) / secs, peak_mem_gib=peak)
            if name == "naive":
                entry["naive_vs_tuned_max_abs_diff"] = max_abs(losses, entry["tuned_losses"])
            else:
                entry[f"{name}_losses"] = losses
        if "tuned_sdpa_losses" in entry:
            entry["sdpa_vs_tuned_max_abs_diff"] = max_abs(entry["tuned_sdpa_losses"],
                                                          entry["tuned_losses"])
        peaks = [entry[name]["peak_mem_gib"] for name, _, _ in scorers]
        entry["peak_mem_gib"] = max(peaks) if None not in peaks else None  # of all the scorers
    with open(os.path.join(args.out, f"hf_{args.size}.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if not kk.endswith("_losses")}
                          if isinstance(v, dict) and "tuned" in v else v)
                      for k, v in report.items()}))


if __name__ == "__main__":
    main()
