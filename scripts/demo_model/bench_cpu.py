"""Per-step CPU costs of candidate shapes with MLX (random weights, fp32, OpenBLAS).

AR step (1 token), verify of width 2/3/4 (one trunk forward), MTP step (head + lm_head),
all at a given context length, with caches.  Usage:
    python scripts/demo_model/bench_cpu.py --shapes 256x12 256x16 384x8 --ctx 64
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blas import preload_openblas  # noqa: E402

preload_openblas()

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models import qwen3_5  # noqa: E402

from mlx_mtp import MTPHead  # noqa: E402
from shapes import n_params, text_config  # noqa: E402


def snapshot(cache):
    return [(list(c.cache) if hasattr(c, "cache") and not hasattr(c, "keys") else c.offset) for c in cache]


def restore(cache, snap):
    for c, s in zip(cache, snap):
        if isinstance(s, list):
            c.cache = list(s)
        else:
            c.trim(c.offset - s)


def timeit(fn, n, rounds=7):
    """Best-of-rounds mean (the CPU may be shared: the minimum is the least disturbed)."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(max(1, n // rounds)):
            fn()
        best = min(best, (time.perf_counter() - t) / max(1, n // rounds))
    return best * 1000


def bench(hidden, layers, inter=None, ctx=64, n=40, interval=4):
    tc = text_config(hidden, layers, inter, interval=interval)
    model = qwen3_5.Model(qwen3_5.ModelArgs(model_type="qwen3_5", text_config=tc))
    args = model.language_model.args
    head = MTPHead(args)
    mx.eval(model.parameters(), head.parameters())
    lm = model.language_model
    embed = lm.model.embed_tokens
    lm_head = embed.as_linear
    cache = model.make_cache()
    prompt = mx.random.randint(0, tc["vocab_size"], (1, ctx))
    out = model.language_model.model(prompt, cache)
    mx.eval(out)
    snap = snapshot(cache)
    mcache = head.make_cache()
    hcache_in = mx.random.normal((1, ctx, hidden))
    mx.eval(head(hcache_in, prompt, embed, lm_head, mcache))
    msnap = mcache.offset

    res = {"shape": f"h{hidden} L{layers} I{tc['intermediate_size']}", "params_M": round(n_params(tc) / 1e6, 2)}
    for w in (1, 2, 3, 4):
        toks = mx.random.randint(0, tc["vocab_size"], (1, w))

        def step():
            h = lm.model(toks, cache)
            logits = lm_head(h)
            mx.eval(logits, h)
            restore(cache, snap)
        res[f"t{w}_ms"] = round(timeit(step, n), 2)
    tok = mx.random.randint(0, tc["vocab_size"], (1, 1))
    hid = mx.random.normal((1, 1, hidden))

    def mstep():
        logits, g = head(hid, tok, embed, lm_head, mcache)
        mx.eval(logits, g)
        mcache.trim(mcache.offset - msnap)
    res["mtp_ms"] = round(timeit(mstep, n), 2)
    ar = res["t1_ms"]
    for k in ("t2_ms", "t3_ms", "t4_ms", "mtp_ms"):
        res[k.replace("_ms", "_rel")] = round(res[k] / ar, 3)
    return res


def ceiling(r, accs=(0.9, 0.8, 0.7)):
    """Expected speedup at depth D given per-depth acceptance."""
    from core.costs import expected_tokens  # blas.py put the repository on sys.path

    return {f"D{D}": round(expected_tokens(list(accs), D) / (r[f"t{D + 1}_rel"] + D * r["mtp_rel"]), 2)
            for D in (1, 2, 3)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["256x8", "256x12", "256x16", "384x8", "384x12"])
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    for s in a.shapes:
        s, _, iv = s.partition("i")
        parts = s.split("x")
        h, l = int(parts[0]), int(parts[1])
        inter = int(parts[2]) if len(parts) > 2 else None
        r = bench(h, l, inter, ctx=a.ctx, n=a.n, interval=int(iv or 4))
        r["interval"] = int(iv or 4)
        r["ceiling_a.9/.8/.7"] = ceiling(r)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
