#!/usr/bin/env python3
"""Two or more checkpoints' MTP/AR, paired in one process: does model B's MTP pay more than A's?

bench.py measures one model's MTP/AR; run twice, minutes apart, on a shared CPU, one model's
ratio moved 1.51 -> 1.63x, more than the difference between two demo models. Here every model is
loaded once and every repeat runs each model's AR and MTP lanes back to back (models and lanes in
rotating order, the same prompt and seed for all), so slow drifts of the host hit every model
alike. Per model: MTP/AR per repeat (median), pooled over all runs (decode tokens over decode
seconds per lane), AR tok/s and acceptance. Per model after the first: its MTP/AR over the
first's, per repeat (median) and pooled, each with a 95 % bootstrap interval over the repeats.

    python scripts/bench/bench_models.py --model models/demo --model DIR \\
        --prompts-file scripts/demo_model/race_prompts.txt --depth 2 --repeats 64 --json out.json
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (first: the BLAS preload must precede mlx)
from adapters import load_adapter  # noqa: E402
from adapters.runtime import describe_runtime, runtime_info  # noqa: E402
from core import AutoregressiveDecoder, SpeculativeDecoder, chat_prompt_ids  # noqa: E402
from core.settings import Settings  # noqa: E402
from scripts.bench.bench import add_sampler_arguments, run_ours, sampler_and_prompts  # noqa: E402

LANES = ("ar", "mtp")


def label(path: str) -> str:
    """A checkpoint's short name for the progress lines (a folder called model: its parent's)."""
    p = Path(path)
    return p.parent.name if p.name == "model" and p.parent.name else p.name


def pooled(runs) -> float:
    """Decode tokens over decode seconds, all runs together (long replies weigh what they take)."""
    secs = sum(r["decode_seconds"] for r in runs)
    return sum(r["tokens"] - 1 for r in runs) / secs if secs > 0 else 0.0


def pooled_ratio(runs, idx=None) -> float:
    """Pooled MTP tok/s over pooled AR tok/s, over the repeats `idx` (all by default)."""
    idx = range(len(runs["ar"])) if idx is None else idx
    ar = pooled([runs["ar"][i] for i in idx])
    return pooled([runs["mtp"][i] for i in idx]) / ar if ar else 0.0


def per_repeat(runs):
    return [m["tokens_per_second"] / a["tokens_per_second"] if a["tokens_per_second"] else 0.0
            for m, a in zip(runs["mtp"], runs["ar"])]


def compare(a, b, n: int = 2000, seed: int = 0) -> dict:
    """Model b's MTP/AR over model a's: the median of the per-repeat quotients (the same prompt and
    seed for both) and the pooled quotient, each with the 2.5th and 97.5th percentiles over the
    repeats resampled with replacement (the same repeats for both: the pairing is the point)."""
    quotients = [y / x if x else 0.0 for x, y in zip(per_repeat(a), per_repeat(b))]
    rng, k, medians, pools = random.Random(seed), len(quotients), [], []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        medians.append(statistics.median(quotients[i] for i in idx))
        base = pooled_ratio(a, idx)
        pools.append(pooled_ratio(b, idx) / base if base else 0.0)
    lo, hi = int(0.025 * n), int(0.975 * n) - 1
    medians.sort(), pools.sort()
    return {"median": statistics.median(quotients), "median_95": [medians[lo], medians[hi]],
            "pooled": pooled_ratio(b) / pooled_ratio(a), "pooled_95": [pools[lo], pools[hi]],
            "per_repeat": quotients}


def summary(runs) -> dict:
    proposed = sum(r["proposed"] for r in runs["mtp"])
    accepted = sum(r["accepted"] for r in runs["mtp"])
    return {
        "speedup_median": statistics.median(per_repeat(runs)),
        "speedup_pooled": pooled_ratio(runs),
        "ar_tokens_per_second_pooled": pooled(runs["ar"]),
        "mtp_tokens_per_second_pooled": pooled(runs["mtp"]),
        "acceptance": accepted / proposed if proposed else 0.0,
        "tokens_per_cycle_median": statistics.median(r["tokens_per_cycle"] for r in runs["mtp"]),
        "reply_tokens_median": {lane: statistics.median(r["tokens"] for r in runs[lane]) for lane in LANES},
    }


def main(argv=None) -> int:
    d = Settings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="a checkpoint (at least two; the first is the base)")
    ap.add_argument("--prompt", action="append", help="user message (repeatable: repeats cycle through them)")
    ap.add_argument("--prompts-file", help="one user message per line (added to --prompt)")
    ap.add_argument("--max-tokens", type=int, default=128)
    add_sampler_arguments(ap, d)
    ap.add_argument("--repeats", type=int, default=32)
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    if len(args.model) < 2:
        ap.error("pass --model at least twice: the base first, then the models to compare with it")
    if args.depth == "auto":
        ap.error("--depth auto prices depth per model, so the lanes would differ: pass a number")
    depth = int(args.depth)
    sampler, prompts = sampler_and_prompts(args)
    print(describe_runtime(), file=sys.stderr)

    models = []
    for path in args.model:
        adapter = load_adapter(path)
        encoded = [chat_prompt_ids(adapter, [{"role": "user", "content": p}]) for p in prompts]
        lanes = {
            "ar": lambda ids, seed, a=adapter: run_ours(AutoregressiveDecoder(a, sampler=sampler, seed=seed), ids,
                                                         args.max_tokens),
            "mtp": lambda ids, seed, a=adapter: run_ours(SpeculativeDecoder(a, sampler=sampler, seed=seed, depth=depth),
                                                          ids, args.max_tokens),
        }
        for ids in encoded:   # warm-up, untimed: every prompt's shapes compiled before any timing
            for lane in LANES:
                lanes[lane](ids, 10_000)
        models.append({"path": path, "describe": adapter.describe(), "encoded": encoded, "lanes": lanes,
                       "runs": {lane: [] for lane in LANES}})
        print(f"{path}: {adapter.describe()}", file=sys.stderr)

    for r in range(args.repeats):
        turn = models[r % len(models):] + models[:r % len(models)]
        for m in turn:
            lanes = LANES if (r // len(models)) % 2 == 0 else LANES[::-1]
            for lane in lanes:
                gc.collect()
                m["runs"][lane].append(m["lanes"][lane](m["encoded"][r % len(prompts)], r))
        line = "  ".join(f"{label(m['path'])} {m['runs']['mtp'][-1]['tokens_per_second'] / max(m['runs']['ar'][-1]['tokens_per_second'], 1e-9):.2f}x"
                         for m in models)
        print(f"repeat {r + 1}/{args.repeats}: {line}", file=sys.stderr)

    base = models[0]["runs"]
    report = {
        "platform": runtime_info(),
        "sampler": {**sampler.__dict__, "seed_per_repeat": "repeat index"},
        "depth": depth, "prompts": prompts, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "models": [],
    }
    for i, m in enumerate(models):
        row = {"path": m["path"], "describe": m["describe"], **summary(m["runs"]),
               "runs": {lane: [{k: v for k, v in run.items() if k != "text"} for run in m["runs"][lane]] for lane in LANES}}
        if i:
            row["over_base"] = compare(base, m["runs"])
        report["models"].append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    keys = ("speedup_median", "speedup_pooled", "ar_tokens_per_second_pooled", "acceptance")
    print(json.dumps([{"path": row["path"], **{k: row[k] for k in keys},
                       **({"over_base": {k: v for k, v in row["over_base"].items() if k != "per_repeat"}}
                          if "over_base" in row else {})} for row in report["models"]], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
