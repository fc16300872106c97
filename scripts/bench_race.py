#!/usr/bin/env python3
"""The race against the paired benchmark, prompt by prompt (issue 25: "the race tells the truth").

For every prompt and repeat r (seed r, the seeds scripts/bench.py gives its repeats), on one
loaded model, warm, in this order rotated per repeat:
  race    the Race tab's own code path, headless: webapp.race.RaceHandlers.race (one race,
          the app's update interval), both lanes from the prefix cache's prompt state;
  alone   each lane's stream run by itself through the same worker, scheduler and clock;
  bench   scripts/bench.py's paired runs (its run_ours: core decoders on this thread, no prefix
          cache), AR then MTP.
It prints, per prompt, the race's speed-up (median of the repeats) against the paired
benchmark's, each lane's tok/s in the race against alone, and where each lane's own clock
went: inside the decoder's loop (core.decoders' _steps), waiting for queued device work at a
switch (settle), and the rest of the stream around it (EOS, detokenising, stop strings,
stats); off the clocks: the scheduler, event records, rendering and thread hand-offs.

    flock -x /work/locks/cpu.lock .venv/bin/python scripts/bench_race.py --json docs/bench/race-demo.json
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import adapters  # noqa: E402,F401  (first: the BLAS preload must precede mlx)
from adapters.runtime import describe_runtime, runtime_info  # noqa: E402
from core import AutoregressiveDecoder, SpeculativeDecoder  # noqa: E402
from core.settings import get_settings  # noqa: E402
from scripts import bench  # noqa: E402
from webapp.model import ModelHost  # noqa: E402
from webapp.params import parse_params  # noqa: E402
from webapp.race import RaceHandlers, lane_view, record  # noqa: E402
from webapp.scheduler import TimedLane, run_fair  # noqa: E402
from webapp.stops import StopRegistry  # noqa: E402

# Everyday questions of the kinds the demo model answers (English words, simple Python, daily
# life); none of them appears in tests/. Replies run from ~15 tokens to the 256-token cap.
PROMPTS = [
    "What does the word garden mean?",
    "Give me a synonym for happy.",
    "What is the opposite of generous?",
    "What is a good way to start the morning?",
    "How do I read a file in Python?",
    "What is the difference between a list and a tuple in Python?",
    "How do I sort a dictionary by value in Python?",
    "Tell me a quote about friendship.",
]
TOLERANCE = 0.10


@contextmanager
def decoder_loop_timer(into: dict):
    """Measurement only: the seconds each lane spends inside its decoder's own loop
    (core.decoders' `_steps`: prefill, draft, verify, accept, sample), keyed by mode."""
    originals = {cls: cls._steps for cls in (AutoregressiveDecoder, SpeculativeDecoder)}

    def timed(original):
        def _steps(self, *args, **kwargs):
            steps = original(self, *args, **kwargs)
            try:
                while True:
                    t0 = time.perf_counter()
                    try:
                        item = next(steps)
                    finally:
                        into[self.mode] += time.perf_counter() - t0
                    yield item
            except StopIteration:
                return
            finally:
                steps.close()
        return _steps

    for cls, original in originals.items():
        cls._steps = timed(original)
    try:
        yield into
    finally:
        for cls, original in originals.items():
            cls._steps = original


def event_costs(lane: TimedLane) -> dict:
    """Own-clock cost of the lane's first event (prefill + first token), of its first decode
    event (the first cycle) and the median of the others, in ms."""
    clocks = [c for c, _ in lane.events]
    deltas = [b - a for a, b in zip([0.0] + clocks, clocks)]
    return {"first_token_ms": 1e3 * deltas[0] if deltas else None,
            "first_decode_event_ms": 1e3 * deltas[1] if len(deltas) > 1 else None,
            "median_later_event_ms": 1e3 * statistics.median(deltas[2:]) if len(deltas) > 2 else None,
            "events": len(deltas)}


def lane_figures(lane: TimedLane, decode_s: float) -> dict:
    v = lane_view(lane.name, lane.name, lane, _final(lane), [])
    return {"tokens": v.tokens, "tokens_per_second": v.tokens_per_second, "own_seconds": lane.clock,
            "decoder_loop_seconds": decode_s, "settle_seconds": lane.settled, "switches": lane.switches,
            "stream_rest_seconds": lane.clock - decode_s - lane.settled, **event_costs(lane)}


def _final(lane):
    from webapp.scheduler import Snapshot

    return Snapshot(lane.clock, [lane], final=True)


def run_race(host, race: RaceHandlers, prompt: str, params, seed: int) -> dict:
    """One race through RaceHandlers.race, the Race tab's own generator; its lanes are kept to
    read their clocks."""
    kept = []
    original = race._races

    def keep(ids, p, n_runs, stop, lanes, cached=0):
        yield from original(ids, p, n_runs, stop, lanes, cached)
        kept.extend(lanes)

    loop = defaultdict(float)
    race._races = keep
    try:
        with decoder_loop_timer(loop):
            t0 = time.perf_counter()
            *_, last = race.race(prompt, 1, params.temperature, params.top_p, params.top_k, params.min_p,
                                 params.max_tokens, seed, str(params.depth))
            wall = time.perf_counter() - t0
    finally:
        race._races = original
    summary = last[4]
    lanes = {lane.name: lane for lane in kept}
    out = {"speedup": summary["runs"][0]["speedup"] if summary.get("runs") else None,
           "wall_seconds": wall, "summary": summary["runs"][0] if summary.get("runs") else summary}
    for name, lane in lanes.items():
        out[name] = lane_figures(lane, loop[name])
    out["off_clock_seconds"] = wall - sum(lane.clock for lane in lanes.values())
    return out


def run_alone(host, mode: str, ids, params) -> dict:
    """The lane's stream run by itself through the race's worker, scheduler and clock."""
    loop = defaultdict(float)
    lane = TimedLane(mode, host.stream(mode, params, ids), record=record)
    with decoder_loop_timer(loop):
        for _ in run_fair([lane]):
            pass
    lane.close()
    return lane_figures(lane, loop[mode])


def run_bench(host, mode: str, ids, params) -> dict:
    """scripts/bench.py's own lane run (no prefix cache, on this thread)."""
    sampler = params.sampler()
    if mode == "ar":
        dec = AutoregressiveDecoder(host.adapter, sampler=sampler, seed=params.seed)
    else:
        dec = SpeculativeDecoder(host.adapter, sampler=sampler, seed=params.seed, depth=params.depth)
    return bench.run_ours(dec, ids, params.max_tokens)


def ratio(a, b):
    return a / b if a and b else None


def within(x) -> bool:
    return x is not None and abs(x - 1) <= TOLERANCE


def git_commit() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except Exception:  # noqa: BLE001 - not a checkout
            return None
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def model_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(path).rglob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def per_prompt(prompt: str, runs: list) -> dict:
    med = lambda xs: statistics.median(x for x in xs if x is not None) if any(x is not None for x in xs) else None  # noqa: E731
    row = {"prompt": prompt,
           "tokens_ar": [r["race"]["ar"]["tokens"] for r in runs],
           "tokens_mtp": [r["race"]["mtp"]["tokens"] for r in runs],
           "race_speedup": med([r["race"]["speedup"] for r in runs]),
           "bench_speedup": med([ratio(r["bench"]["mtp"]["tokens_per_second"], r["bench"]["ar"]["tokens_per_second"])
                                 for r in runs])}
    row["race_vs_bench"] = ratio(row["race_speedup"], row["bench_speedup"])
    for lane in ("ar", "mtp"):
        race_tps = med([r["race"][lane]["tokens_per_second"] for r in runs])
        alone_tps = med([r["alone"][lane]["tokens_per_second"] for r in runs])
        bench_tps = med([r["bench"][lane]["tokens_per_second"] for r in runs])
        row[lane] = {"race_tok_s": race_tps, "alone_tok_s": alone_tps, "bench_tok_s": bench_tps,
                     "race_vs_alone": ratio(race_tps, alone_tps)}
        for part in ("decoder_loop_seconds", "settle_seconds", "stream_rest_seconds", "own_seconds"):
            row[lane][part] = {"race": sum(r["race"][lane][part] for r in runs),
                               "alone": sum(r["alone"][lane][part] for r in runs)}
        row[lane]["switches"] = sum(r["race"][lane]["switches"] for r in runs)
    row["short"] = min(row["tokens_ar"] + row["tokens_mtp"]) < 32
    row["ok"] = within(row["race_vs_bench"]) and within(row["ar"]["race_vs_alone"]) and within(row["mtp"]["race_vs_alone"])
    return row


def main(argv=None) -> int:
    d = get_settings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(d.model))
    ap.add_argument("--prompt", action="append", help="user message (repeatable; default: 8 everyday questions)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--depth", default="2")
    ap.add_argument("--quantum", type=float, help="the race's switch quantum in seconds (default: the app's)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)

    prompts = args.prompt or PROMPTS
    print(describe_runtime(), file=sys.stderr)
    host = ModelHost.load(args.model, get_settings(model=args.model), log=lambda m: print(m, file=sys.stderr))
    params = parse_params(args.temperature, args.top_p, args.top_k, args.min_p, args.max_tokens, 0, args.depth,
                          max_depth=host.max_depth)
    host.warmup(params, log=lambda m: print(m, file=sys.stderr))     # as the app does before serving
    bench.adapter_tokenizer = host.tokenizer                         # run_ours decodes its text with it
    race = RaceHandlers(host, StopRegistry())
    if args.quantum is not None:
        race.quantum = args.quantum
    rows, detail = [], []
    t_start = time.perf_counter()
    for p in prompts:
        ids = host.prompt_ids([{"role": "user", "content": p}], max_tokens=params.max_tokens)
        plain = list(ids.ids)
        host.worker.call(lambda: run_bench(host, "ar", plain, replace(params, seed=10_000)))   # untimed, as bench.py
        runs = []
        for r in range(args.repeats):
            seeded = replace(params, seed=r)
            units = [
                ("race", lambda: run_race(host, race, p, params, r)),
                ("alone", lambda: {m: run_alone(host, m, ids, seeded) for m in ("ar", "mtp")}),
                ("bench", lambda: {m: host.worker.call(run_bench, host, m, plain, seeded) for m in ("ar", "mtp")}),
            ]
            units = units[r % 3:] + units[: r % 3]
            run = {"seed": r}
            for name, fn in units:
                gc.collect()
                run[name] = fn()
            runs.append(run)
            print(f"{p[:40]!r:44} seed {r}: race {run['race']['speedup']:.2f}x "
                  f"(AR {run['race']['ar']['tokens_per_second']:.1f}, MTP {run['race']['mtp']['tokens_per_second']:.1f} tok/s)  "
                  f"alone AR {run['alone']['ar']['tokens_per_second']:.1f}, MTP {run['alone']['mtp']['tokens_per_second']:.1f}  "
                  f"bench {ratio(run['bench']['mtp']['tokens_per_second'], run['bench']['ar']['tokens_per_second']):.2f}x",
                  file=sys.stderr)
        rows.append(per_prompt(p, runs))
        detail.append({"prompt": p, "runs": runs})

    race_all = [r["race"]["speedup"] for d_ in detail for r in d_["runs"]]
    bench_all = [ratio(r["bench"]["mtp"]["tokens_per_second"], r["bench"]["ar"]["tokens_per_second"])
                 for d_ in detail for r in d_["runs"]]
    overall = {"race_median_speedup": statistics.median(race_all), "bench_median_speedup": statistics.median(bench_all)}
    overall["race_vs_bench"] = ratio(overall["race_median_speedup"], overall["bench_median_speedup"])
    overall["prompts_within_tolerance"] = sum(r["ok"] for r in rows)
    overall["all_within_tolerance"] = all(r["ok"] for r in rows) and within(overall["race_vs_bench"])
    report = {"what": "race vs alone vs paired benchmark, per prompt (scripts/bench_race.py)",
              "git": git_commit(), "platform": runtime_info(),
              "model": {"path": str(args.model), "describe": host.description, "weights_sha256_16": model_digest(args.model)},
              "params": params.as_dict(), "repeats": args.repeats, "tolerance": TOLERANCE,
              "race_settings": {"update_interval": race.update_interval, "quantum": race.quantum},
              "seconds": time.perf_counter() - t_start, "overall": overall, "prompts": rows, "runs": detail}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print_table(rows, overall)
    return 0 if overall["all_within_tolerance"] else 1


def print_table(rows, overall) -> None:
    f = lambda x, spec=".2f": "–" if x is None else format(x, spec)  # noqa: E731
    print(f"{'prompt':42} {'tokens AR/MTP':>22} {'race×':>6} {'bench×':>6} {'r/b':>5} "
          f"{'AR race/alone tok/s':>20} {'MTP race/alone tok/s':>21}  ok")
    for r in rows:
        toks = f"{'/'.join(map(str, r['tokens_ar']))} | {'/'.join(map(str, r['tokens_mtp']))}"
        print(f"{r['prompt'][:42]:42} {toks:>22} {f(r['race_speedup']):>6} {f(r['bench_speedup']):>6} "
              f"{f(r['race_vs_bench']):>5} "
              f"{f(r['ar']['race_tok_s'], '.1f'):>8}/{f(r['ar']['alone_tok_s'], '.1f'):<6} {f(r['ar']['race_vs_alone']):>5} "
              f"{f(r['mtp']['race_tok_s'], '.1f'):>8}/{f(r['mtp']['alone_tok_s'], '.1f'):<6} {f(r['mtp']['race_vs_alone']):>5}  "
              f"{'yes' if r['ok'] else 'NO'}{' (short)' if r['short'] else ''}")
    print("\nwhere the own clocks went (all repeats, ms): decoder loop / settle / rest of the stream, race vs alone")
    for r in rows:
        parts = []
        for lane in ("ar", "mtp"):
            x = r[lane]
            parts.append(f"{lane.upper()} " + " / ".join(
                f"{1e3 * x[k]['race']:.0f}:{1e3 * x[k]['alone']:.0f}"
                for k in ("decoder_loop_seconds", "settle_seconds", "stream_rest_seconds")) + f" ({x['switches']} switches)")
        print(f"  {r['prompt'][:40]:40} " + "   ".join(parts))
    print(f"\nmedian speed-up over all runs: race {overall['race_median_speedup']:.2f}x, "
          f"paired benchmark {overall['bench_median_speedup']:.2f}x (race/bench {overall['race_vs_bench']:.3f}); "
          f"{overall['prompts_within_tolerance']}/{len(rows)} prompts within {TOLERANCE:.0%}")


if __name__ == "__main__":
    sys.exit(main())
