"""Batched decoding throughput (issue 22): 1, 2, 4, 8 concurrent requests, AR and MTP.

For each lane and batch size B: B different chat prompts join one core.batch.Batch at once and
decode greedily to the end; aggregate tokens/s = all tokens / wall time from the first join to the
last finish; each request's tokens/s = its tokens / (its finish - its join), and its ratio to the
same request decoded alone (B = 1). Also: a newcomer's first token while 4 others decode (its
prefill runs alone between two steps), and 20 requests at once against one after another.

Timings: run under `flock -x /work/locks/cpu.lock` on the shared CPU.
    python scripts/bench_batch.py --out docs/bench/cpu-batch-demo.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.runtime import preload_blas  # noqa: E402

preload_blas()

from adapters import load_adapter  # noqa: E402
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder  # noqa: E402
from core.batch import Batch, Sequence  # noqa: E402
from core.settings import DEMO_MODEL_DIR  # noqa: E402

QUESTIONS = ["Tell me about Python lists.", "Why is the sky blue?", "Define harbor.", "What is a noun?",
             "Explain recursion.", "Describe a cat.", "What is rain?", "How do birds fly?"]


def prompts(adapter, n):
    tok = adapter.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                    add_generation_prompt=True) for i in range(n)]


def decoder(adapter, mode, depth):
    g = SamplerConfig(temperature=0)
    return AutoregressiveDecoder(adapter, sampler=g) if mode == "ar" else SpeculativeDecoder(adapter, sampler=g, depth=depth)


def run(adapter, mode, depth, ps, max_tokens, max_batch=None):
    """Decode prompts `ps` together (at most max_batch at once, the rest join as others leave)."""
    batch, waiting, done = Batch(adapter), list(range(len(ps))), {}
    joined, tokens, seqs = {}, {}, {}
    t0 = time.perf_counter()
    while waiting or batch.running:
        while waiting and len(batch.running) < (max_batch or len(ps)):
            i = waiting.pop(0)
            joined[i] = time.perf_counter()
            seqs[i] = s = Sequence(decoder(adapter, mode, depth), ps[i], max_tokens)
            s.i = i
            ev = batch.join(s)
            tokens[i] = len(ev.tokens)
            if ev.finished:
                done[i] = time.perf_counter()
        for s, ev in batch.step().items():
            tokens[s.i] += len(ev.tokens)
            if ev.finished:
                done[s.i] = time.perf_counter()
    wall = time.perf_counter() - t0
    per = [tokens[i] / (done[i] - joined[i]) for i in range(len(ps))]
    return {"requests": len(ps), "tokens": sum(tokens.values()), "wall_s": round(wall, 3),
            "aggregate_tok_s": round(sum(tokens.values()) / wall, 2), "per_request_tok_s": [round(x, 2) for x in per],
            "per_request_tokens": [tokens[i] for i in range(len(ps))]}


def newcomer(adapter, mode, depth, ps, max_tokens):
    """4 decode; a 5th joins after a few steps: its first token's delay, and the steps around it."""
    batch = Batch(adapter)
    for p in ps[:4]:
        batch.join(Sequence(decoder(adapter, mode, depth), p, max_tokens))
    steps = []
    for _ in range(4):
        t = time.perf_counter()
        batch.step()
        steps.append(time.perf_counter() - t)
    t = time.perf_counter()
    batch.join(Sequence(decoder(adapter, mode, depth), ps[4], max_tokens))
    first = time.perf_counter() - t
    t = time.perf_counter()
    Batch(adapter).join(Sequence(decoder(adapter, mode, depth), ps[4], max_tokens))
    alone = time.perf_counter() - t
    step = sum(steps) / len(steps)
    return {"prompt_tokens": len(ps[4]), "first_token_s": round(first, 4), "prefill_alone_s": round(alone, 4),
            "step_s_before": round(step, 4),
            "first_token_within_one_prefill_plus_one_step": first <= alone + step,
            "note": "the newcomer joins between two steps: it waits for at most the step in progress, "
                    "then its prefill (one chunk here) gives its first token"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(DEMO_MODEL_DIR))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--out", default="docs/bench/cpu-batch-demo.json")
    a = ap.parse_args()
    adapter = load_adapter(a.model)
    ps = prompts(adapter, 8)
    run(adapter, "mtp", a.depth, ps[:2], 8)   # warm-up: compile every width once
    run(adapter, "ar", a.depth, ps[:2], 8)
    out = {"model": a.model, "describe": adapter.describe(), "machine": platform.processor() or platform.machine(),
           "max_tokens": a.max_tokens, "depth": a.depth, "sampler": "greedy", "lanes": {}}
    for mode in ("ar", "mtp"):
        alone = [run(adapter, mode, a.depth, [p], a.max_tokens)["per_request_tok_s"][0] for p in ps]
        rows = {}
        for B in (1, 2, 4, 8):
            r = run(adapter, mode, a.depth, ps[:B], a.max_tokens)
            r["per_request_vs_alone"] = [round(x / y, 3) for x, y in zip(r["per_request_tok_s"], alone)]
            rows[B] = r
            print(mode, B, r["aggregate_tok_s"], min(r["per_request_vs_alone"]), flush=True)
        for B in (2, 4, 8):
            rows[B]["aggregate_vs_1"] = round(rows[B]["aggregate_tok_s"] / rows[1]["aggregate_tok_s"], 3)
        out["lanes"][mode] = {"alone_tok_s": alone, "by_batch": rows,
                              "newcomer_while_4_decode": newcomer(adapter, mode, a.depth, ps, a.max_tokens)}
    # 20 requests at once: batched (max_batch 8) against one after another (max_batch 1).
    ps20 = prompts(adapter, 20)
    one = run(adapter, "mtp", a.depth, ps20, 27, max_batch=1)
    eight = run(adapter, "mtp", a.depth, ps20, 27, max_batch=8)
    out["twenty_streams_mtp"] = {"one_at_a_time_s": one["wall_s"], "batched_8_s": eight["wall_s"],
                                 "tokens": [one["tokens"], eight["tokens"]],
                                 "ratio": round(eight["wall_s"] / one["wall_s"], 3)}
    print(json.dumps(out["twenty_streams_mtp"]))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
