#!/usr/bin/env python3
"""Multi-turn benchmark of the prefix cache: one long conversation with and without it, and
the cache's memory over many conversations.

    python scripts/bench/bench_turns.py --model models/demo --turns 10 --json turns.json

The with-cache run does what the app does: after each reply, the conversation is snapshotted as
the next turn will begin (in idle time, timed apart as history_snapshot_seconds). Per turn: prompt tokens, tokens restored from the cache, tokens prefilled, and the medians over
--repeats runs of prefill seconds, time to first token and decode tok/s. The conversation is greedy, so both runs see
the same prompts and replies (the cache changes no token; tests/test_prefix_cache.py).
Then --conversations different conversations of --conversation-turns turns run through one
cache with a --budget-mb budget; the cache's size is read after every reply.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402  (first: the BLAS preload must precede mlx)
from adapters import load_adapter  # noqa: E402
from adapters.runtime import runtime_info  # noqa: E402
from core import (AutoregressiveDecoder, PrefixCache, SamplerConfig, SpeculativeDecoder, ThinkSplitter,  # noqa: E402
                  chat_prompt, history_prompt, opens_thinking)
from core.chat import FILLER  # noqa: E402
from core.stream import cache_history  # noqa: E402

QUESTIONS = [line.strip() for line in
             (Path(__file__).resolve().parents[1] / "demo_model" / "heldout_prompts.txt").read_text().splitlines() if line.strip()]


def greedy_lane(adapter, mode: str, depth: int, cache):
    """A greedy decoder of the lane `mode` ("ar" or "mtp") on `cache` (None: no prefix cache), as
    the turns here and bench_disk_cache.py's turns run it."""
    greedy = SamplerConfig(temperature=0)
    if mode == "ar":
        return AutoregressiveDecoder(adapter, sampler=greedy, prefix_cache=cache)
    return SpeculativeDecoder(adapter, sampler=greedy, depth=depth, prefix_cache=cache)


def user_message(adapter, i: int, tokens: int) -> str:
    """A question after a passage of about `tokens` tokens (users paste text and ask about it)."""
    words = (FILLER * (2 + tokens // 20)).split()
    text, n = [], 0
    for w in words:
        text.append(w)
        n = len(adapter.tokenizer.encode(" ".join(text)))
        if n >= tokens:
            break
    return f"Note {i}: " + " ".join(text) + "\n\n" + QUESTIONS[i % len(QUESTIONS)]


def conversation(adapter, lane_of, turns: int, user_tokens: int, max_tokens: int, cache, offset=0):
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    rows = []
    for t in range(turns):
        msgs.append({"role": "user", "content": user_message(adapter, offset + t, user_tokens)})
        prompt = chat_prompt(adapter, msgs)
        ids, s = lane_of(cache).generate(prompt, max_tokens=max_tokens)
        rows.append({"history_snapshot_seconds": 0.0, "turn": t + 1, "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens,
                     "prefilled_tokens": s.prefilled_tokens, "prefill_seconds": s.prefill_seconds,
                     "time_to_first_token": s.time_to_first_token, "tokens": s.generated_tokens,
                     "tokens_per_second": s.tokens_per_second, "acceptance_rate": s.acceptance_rate,
                     "cache_bytes": cache.nbytes if cache is not None else 0})
        # The answer as the web app keeps it in the history (core.ThinkSplitter's content).
        splitter = ThinkSplitter(inside=opens_thinking(adapter.tokenizer.decode(list(prompt.ids[-16:]))))
        parts = splitter.feed(adapter.tokenizer.decode(ids)) + splitter.flush()
        msgs.append({"role": "assistant", "content": "".join(t for kind, t in parts if kind == "content")})
        if cache is not None:
            # As the app does once a reply is out: snapshot the conversation as the next turn
            # will begin (idle time, timed apart; the next turn's TTFT does not include it).
            t0 = time.perf_counter()
            cache_history(adapter, history_prompt(adapter, msgs), cache)
            rows[-1]["history_snapshot_seconds"] = time.perf_counter() - t0
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--user-tokens", type=int, default=230, help="tokens of pasted text per user message")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--mode", choices=["mtp", "ar"], default="mtp")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--budget-mb", type=float, default=2048)
    ap.add_argument("--conversations", type=int, default=50)
    ap.add_argument("--conversation-turns", type=int, default=3)
    ap.add_argument("--memory-budget-mb", type=float, default=8, help="cache budget for the many-conversations run")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each variant; per turn the median TTFT")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    adapter = load_adapter(a.model)

    def lane_of(cache):
        return greedy_lane(adapter, a.mode, a.depth, cache)

    conversation(adapter, lane_of, 2, 32, 8, PrefixCache(2**30))  # warm-up (compiles), untimed
    runs = {}
    for name in ("without_cache", "with_cache"):
        tries = []
        for _ in range(a.repeats):  # a fresh cache each time; greedy, so the same prompts every time
            cache = PrefixCache(int(a.budget_mb * 2**20)) if name == "with_cache" else None
            tries.append(conversation(adapter, lane_of, a.turns, a.user_tokens, a.max_tokens, cache))
        runs[name] = [dict(rows[0], **{k: statistics.median(r[k] for r in rows) for k in
                                        ("prefill_seconds", "time_to_first_token", "tokens_per_second",
                                         "history_snapshot_seconds")})
                      for rows in zip(*tries)]
        for r in runs[name]:
            print(f"{name} turn {r['turn']:2d}: prompt {r['prompt_tokens']:5d}, cached {r['cached_tokens']:5d}, "
                  f"prefilled {r['prefilled_tokens']:5d}, TTFT {r['time_to_first_token']:.3f} s, "
                  f"{r['tokens_per_second']:.1f} tok/s", file=sys.stderr)
    last, first = runs["with_cache"][-1], runs["with_cache"][0]
    summary = {
        "last_turn_prompt_tokens": last["prompt_tokens"],
        "last_turn_prefilled_share": last["prefilled_tokens"] / last["prompt_tokens"],
        "ttft_last_over_first_with_cache": last["time_to_first_token"] / first["time_to_first_token"],
        "ttft_last_over_first_without_cache":
            runs["without_cache"][-1]["time_to_first_token"] / runs["without_cache"][0]["time_to_first_token"],
        "ttft_last_without_over_with": runs["without_cache"][-1]["time_to_first_token"] / last["time_to_first_token"],
    }

    # Memory: many conversations through one cache with a small budget.
    budget = int(a.memory_budget_mb * 2**20)
    cache, sizes = PrefixCache(budget), []
    for c in range(a.conversations):
        rows = conversation(adapter, lane_of, a.conversation_turns, 60, 16, cache, offset=100 + 7 * c)
        sizes += [r["cache_bytes"] for r in rows]
    memory = {"budget_bytes": budget, "conversations": a.conversations, "max_cache_bytes": max(sizes),
              "final_cache_bytes": sizes[-1], "snapshots": len(cache), "within_budget": max(sizes) <= budget,
              "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **cache.describe()}
    del memory["lengths"]
    report = {"platform": runtime_info(), "model": adapter.describe(), "mode": a.mode, "depth": a.depth,
              "turns": runs, "summary": summary, "memory": memory}
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))
    print(json.dumps({"summary": summary, "memory": memory}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
