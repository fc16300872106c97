#!/usr/bin/env python3
"""The race against the paired benchmark, prompt by prompt (issue 25: "the race tells the truth").

On one loaded model, warm, for every prompt and repeat r (seed r, the seeds scripts/bench/bench.py
gives its repeats), three ways of decoding the same two streams (the same seed gives the same
tokens in all three):
  race    the Race tab's own code path, headless: webapp.ui.race.RaceHandlers.race (one race,
          the app's update interval), both lanes from the prefix cache's prompt state;
  alone   each lane's stream run by itself through the same worker, scheduler and clock;
  bench   scripts/bench/bench.py's paired runs (its run_ours: core decoders on the model thread, no
          prefix cache).
The host drifts (on the 2-core CPU shared with other work, +-25 % over minutes), so the three
are interleaved in time, as a palindrome: race, alone AR, alone MTP, bench AR, bench MTP, then
the same backwards. Every measurement then has the same mean time, a linear drift cancels, and
AR and MTP of the paired benchmark are as close in time as the race's lanes are on average. A
repeat runs palindromes until each lane has decoded --min-tokens tokens in each way (short
replies: more palindromes; one reply of 24 tokens says little about a speed), and pools them
(tokens after the first over the seconds after the first). Per repeat it takes the ratios
race speed-up / paired-benchmark speed-up and, per lane, race tok/s / alone tok/s; per prompt
it prints their median over the repeats with their spread, and where each lane's own clock
went: inside the decoder's loop (core.decoders' _steps), waiting for queued device work at a
switch (settle), and the rest of the stream around it (EOS, detokenising, stop strings,
stats); off the clocks: the scheduler, event records, rendering and thread hand-offs.

    flock -x /work/locks/cpu.lock .venv/bin/python scripts/bench/bench_race.py --json docs/bench/race-demo.json
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import adapters  # noqa: E402,F401  (first: the BLAS preload must precede mlx)
from adapters.runtime import describe_runtime, runtime_info  # noqa: E402
from core import AutoregressiveDecoder, SpeculativeDecoder  # noqa: E402
from core.settings import get_settings  # noqa: E402
from scripts.bench import bench  # noqa: E402
from webapp.serving.model import ModelHost  # noqa: E402
from webapp.serving.params import parse_params  # noqa: E402
from webapp.ui.race import RaceHandlers, lane_view, record  # noqa: E402
from webapp.serving.scheduler import TimedLane, run_fair  # noqa: E402
from webapp.serving.stops import StopRegistry  # noqa: E402

# The held-out everyday prompts of scripts/bench/race_in_browser.py (the Race tab in a browser), so that
# the headless race and the one a user clicks are measured on the same prompts.
PROMPTS_FILE = ROOT / "scripts" / "demo_model" / "race_prompts.txt"
TOLERANCE = 0.10
LANES = ("ar", "mtp")


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
    from webapp.serving.scheduler import Snapshot

    return Snapshot(lane.clock, [lane], final=True)


def run_race(race: RaceHandlers, prompt: str, params, seed: int) -> dict:
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
    out = {"speedup": summary["runs"][0]["speedup"] if summary.get("runs") else None, "wall_seconds": wall}
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
    """scripts/bench/bench.py's own lane run (no prefix cache), on the model thread."""
    sampler = params.sampler()
    if mode == "ar":
        dec = AutoregressiveDecoder(host.adapter, sampler=sampler, seed=params.seed)
    else:
        dec = SpeculativeDecoder(host.adapter, sampler=sampler, seed=params.seed, depth=params.depth)
    out = bench.run_ours(dec, ids, params.max_tokens)
    out.pop("text", None)
    return out


def ratio(a, b):
    return a / b if a and b else None


def within(x) -> bool:
    return x is not None and abs(x - 1) <= TOLERANCE


def pooled(measurements) -> float | None:
    """tok/s over several measurements of one stream: tokens after the first over the seconds
    after the first, summed (each run decodes the same tokens)."""
    after = [m["tokens"] - 1 for m in measurements if m["tokens_per_second"]]
    seconds = [(m["tokens"] - 1) / m["tokens_per_second"] for m in measurements if m["tokens_per_second"]]
    return sum(after) / sum(seconds) if seconds and sum(seconds) > 0 else None


class HostLoad:
    """CPU time the rest of the machine used while we measured, in cores (from /proc: all CPUs'
    busy time minus this process's), so a JSON says how quiet the host was."""

    def __init__(self):
        self.t0, self.busy0, self.own0 = time.monotonic(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system

    def others_cores(self) -> float | None:
        try:
            dt = time.monotonic() - self.t0
            return ((self._busy() - self.busy0) - (self._own() - self.own0)) / dt if dt > 0 else None
        except OSError:   # no /proc: not Linux
            return None


def measure_repeat(host, race: RaceHandlers, prompt: str, ids, plain, params, min_tokens: int,
                   max_rounds: int) -> dict:
    """One repeat (one seed): palindromes of race / alone / bench until every lane has decoded
    `min_tokens` tokens in each way (or `max_rounds` palindromes), pooled."""
    forward = [("race", None), ("alone", "ar"), ("alone", "mtp"), ("bench", "ar"), ("bench", "mtp")]
    runs = {"race": [], "alone": {m: [] for m in LANES}, "bench": {m: [] for m in LANES}}
    rounds = 0
    while rounds < max_rounds:
        for way, mode in forward + forward[::-1]:
            gc.collect()
            if way == "race":
                runs["race"].append(run_race(race, prompt, params, params.seed))
            elif way == "alone":
                runs["alone"][mode].append(run_alone(host, mode, ids, params))
            else:
                runs["bench"][mode].append(host.worker.call(run_bench, host, mode, plain, params))
        rounds += 1
        if min(sum(r[m]["tokens"] - 1 for r in runs["race"]) for m in LANES) >= min_tokens:
            break
    way = {"race": {m: [r[m] for r in runs["race"]] for m in LANES}, "alone": runs["alone"], "bench": runs["bench"]}
    tps = {w: {m: pooled(way[w][m]) for m in LANES} for w in way}
    out = {"seed": params.seed, "palindromes": rounds,
           "tokens": {m: runs["race"][0][m]["tokens"] for m in LANES},
           "same_tokens": all(len({x["tokens"] for w in way for x in way[w][m]}) == 1 for m in LANES),
           "tok_s": tps,
           "speedup": {w: ratio(tps[w]["mtp"], tps[w]["ar"]) for w in way}}
    out["race_vs_bench"] = ratio(out["speedup"]["race"], out["speedup"]["bench"])
    out["race_vs_alone"] = {m: ratio(tps["race"][m], tps["alone"][m]) for m in LANES}
    out["alone_vs_bench"] = {m: ratio(tps["alone"][m], tps["bench"][m]) for m in LANES}
    # The noise floor: the same way measured in the palindrome's first and second halves.
    halves = lambda xs: ratio(pooled(xs[0::2]), pooled(xs[1::2]))  # noqa: E731  (forward, backward, ...)
    out["bench_first_vs_second_half"] = {m: halves(way["bench"][m]) for m in LANES}
    for m in LANES:
        for part in ("decoder_loop_seconds", "settle_seconds", "stream_rest_seconds", "own_seconds"):
            out.setdefault("clock", {}).setdefault(m, {})[part] = {
                w: sum(x[part] for x in way[w][m]) for w in ("race", "alone")}
        out["clock"][m]["switches"] = sum(x["switches"] for x in way["race"][m])
        out["clock"][m]["tokens"] = {w: sum(x["tokens"] for x in way[w][m]) for w in ("race", "alone")}
    out["runs"] = runs
    return out


def spread(xs):
    xs = [x for x in xs if x is not None]
    return [min(xs), max(xs)] if xs else None


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def per_prompt(prompt: str, reps: list, load: float | None) -> dict:
    row = {"prompt": prompt, "tokens_ar": [r["tokens"]["ar"] for r in reps],
           "tokens_mtp": [r["tokens"]["mtp"] for r in reps], "palindromes": [r["palindromes"] for r in reps],
           "race_speedup": med([r["speedup"]["race"] for r in reps]),
           "bench_speedup": med([r["speedup"]["bench"] for r in reps]),
           "race_vs_bench": med([r["race_vs_bench"] for r in reps]),
           "race_vs_bench_spread": spread([r["race_vs_bench"] for r in reps]),
           "others_cpu_cores": load, "same_tokens": all(r["same_tokens"] for r in reps)}
    for m in LANES:
        row[m] = {"race_tok_s": med([r["tok_s"]["race"][m] for r in reps]),
                  "alone_tok_s": med([r["tok_s"]["alone"][m] for r in reps]),
                  "bench_tok_s": med([r["tok_s"]["bench"][m] for r in reps]),
                  "race_vs_alone": med([r["race_vs_alone"][m] for r in reps]),
                  "race_vs_alone_spread": spread([r["race_vs_alone"][m] for r in reps]),
                  "alone_vs_bench": med([r["alone_vs_bench"][m] for r in reps]),
                  "bench_first_vs_second_half": spread([r["bench_first_vs_second_half"][m] for r in reps]),
                  "switches": sum(r["clock"][m]["switches"] for r in reps)}
        for part in ("decoder_loop_seconds", "settle_seconds", "stream_rest_seconds", "own_seconds"):
            row[m][part] = {w: sum(r["clock"][m][part][w] for r in reps) for w in ("race", "alone")}
        row[m]["tokens_measured"] = {w: sum(r["clock"][m]["tokens"][w] for r in reps) for w in ("race", "alone")}
    row["short"] = min(row["tokens_ar"] + row["tokens_mtp"]) < 32
    row["ok"] = within(row["race_vs_bench"]) and all(within(row[m]["race_vs_alone"]) for m in LANES)
    return row


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


def main(argv=None) -> int:
    d = get_settings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(d.model))
    ap.add_argument("--prompt", action="append", help=f"user message (repeatable; default: the lines of {PROMPTS_FILE.name})")
    ap.add_argument("--repeats", type=int, default=3, help="seeds 0..N-1 per prompt")
    ap.add_argument("--min-tokens", type=int, default=None,
                    help="tokens after the first each lane decodes per repeat in each way (default: --max-tokens)")
    ap.add_argument("--max-rounds", type=int, default=8, help="at most this many palindromes per repeat")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens, help="per reply (default: the app's)")
    bench.add_sampler_arguments(ap, d)
    ap.add_argument("--quantum", type=float, help="the race's switch quantum in seconds (default: the app's)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)

    prompts = args.prompt or [line.strip() for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    min_tokens = args.max_tokens if args.min_tokens is None else args.min_tokens
    print(describe_runtime(), file=sys.stderr)
    host = ModelHost.load(args.model, get_settings(model=args.model), log=lambda m: print(m, file=sys.stderr))
    params = parse_params(args.temperature, args.top_p, args.top_k, args.min_p, args.max_tokens, 0, args.depth,
                          max_depth=host.max_depth)
    host.warmup(params, log=lambda m: print(m, file=sys.stderr))     # as the app does before serving
    race = RaceHandlers(host, StopRegistry())
    if args.quantum is not None:
        race.quantum = args.quantum
    rows, detail = [], []
    git = git_commit()    # the code that runs: read before, not after, the minutes of measuring
    t_start, load_all = time.perf_counter(), HostLoad()
    loadavg0 = os.getloadavg()
    for p in prompts:
        load = HostLoad()
        ids = host.prompt_ids([{"role": "user", "content": p}], max_tokens=params.max_tokens)
        plain = list(ids.ids)
        host.worker.call(lambda: run_bench(host, "ar", plain, replace(params, seed=10_000)))   # untimed, as bench.py
        reps = []
        for r in range(args.repeats):
            rep = measure_repeat(host, race, p, ids, plain, replace(params, seed=r), min_tokens, args.max_rounds)
            reps.append(rep)
            s, t = rep["speedup"], rep["tok_s"]
            print(f"{p[:40]!r:44} seed {r} ({rep['palindromes']} palindromes): race {s['race']:.2f}x "
                  f"bench {s['bench']:.2f}x (r/b {rep['race_vs_bench']:.3f}); "
                  f"AR race/alone {t['race']['ar']:.1f}/{t['alone']['ar']:.1f}, "
                  f"MTP {t['race']['mtp']:.1f}/{t['alone']['mtp']:.1f} tok/s", file=sys.stderr)
        rows.append(per_prompt(p, reps, load.others_cores()))
        detail.append({"prompt": p, "repeats": reps})

    every = [r for d_ in detail for r in d_["repeats"]]
    overall = {"race_median_speedup": med([r["speedup"]["race"] for r in every]),
               "bench_median_speedup": med([r["speedup"]["bench"] for r in every]),
               "median_race_vs_bench": med([r["race_vs_bench"] for r in every])}
    overall["race_vs_bench"] = ratio(overall["race_median_speedup"], overall["bench_median_speedup"])
    for m in LANES:
        overall[f"median_{m}_race_vs_alone"] = med([r["race_vs_alone"][m] for r in every])
    overall["prompts_within_tolerance"] = sum(r["ok"] for r in rows)
    overall["all_within_tolerance"] = all(r["ok"] for r in rows) and within(overall["race_vs_bench"])
    report = {"what": "race vs alone vs paired benchmark, per prompt, interleaved (scripts/bench/bench_race.py)",
              "git": git, "platform": runtime_info(),
              "model": {"path": str(args.model), "describe": host.description, "weights_sha256_16": model_digest(args.model)},
              "params": params.as_dict(), "repeats": args.repeats, "min_tokens": min_tokens,
              "max_rounds": args.max_rounds, "tolerance": TOLERANCE,
              "race_settings": {"update_interval": race.update_interval, "quantum": race.quantum},
              "host_load": {"others_cpu_cores": load_all.others_cores(), "cpus": os.cpu_count(),
                            "loadavg_start": loadavg0, "loadavg_end": os.getloadavg()},
              "seconds": time.perf_counter() - t_start, "overall": overall, "prompts": rows, "runs": detail}
    if args.json:
        write_report(Path(args.json), report)
    print_table(rows, overall, report["host_load"])
    return 0 if overall["all_within_tolerance"] else 1


def write_report(path: Path, report: dict) -> None:
    """The summary indented, each prompt's raw measurements on one line (a few hundred KB, not MBs)."""
    head = json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2)
    runs = ",\n".join("    " + json.dumps(r, separators=(",", ":")) for r in report["runs"])
    path.write_text(head[:-2] + ',\n  "runs": [\n' + runs + "\n  ]\n}\n")


def print_table(rows, overall, load) -> None:
    f = lambda x, spec=".2f": "–" if x is None else format(x, spec)  # noqa: E731
    sp = lambda s: "–" if not s else f"{s[0]:.2f}-{s[1]:.2f}"  # noqa: E731
    print(f"{'prompt':34} {'tokens AR | MTP':>20} {'race×':>6} {'bench×':>6} {'r/b (spread)':>17} "
          f"{'AR race/alone tok/s':>27} {'MTP race/alone tok/s':>27}  ok")
    for r in rows:
        toks = f"{'/'.join(map(str, r['tokens_ar']))} | {'/'.join(map(str, r['tokens_mtp']))}"
        lanes = [f"{f(r[m]['race_tok_s'], '.1f'):>6}/{f(r[m]['alone_tok_s'], '.1f'):<6} {f(r[m]['race_vs_alone'])} "
                 f"({sp(r[m]['race_vs_alone_spread'])})" for m in LANES]
        print(f"{r['prompt'][:34]:34} {toks:>20} {f(r['race_speedup']):>6} {f(r['bench_speedup']):>6} "
              f"{f(r['race_vs_bench'])} ({sp(r['race_vs_bench_spread'])}) {lanes[0]:>27} {lanes[1]:>27}  "
              f"{'yes' if r['ok'] else 'NO'}{' (short)' if r['short'] else ''}")
    print("\nwhere the own clocks went (all repeats, ms per token): decoder loop / settle / rest of the stream, "
          "race:alone; the noise floor: alone/bench tok/s and the benchmark's first/second-half spread")
    for r in rows:
        parts = []
        for m in LANES:
            x, n = r[m], r[m]["tokens_measured"]
            parts.append(f"{m.upper()} " + " / ".join(
                f"{1e3 * x[k]['race'] / n['race']:.2f}:{1e3 * x[k]['alone'] / n['alone']:.2f}"
                for k in ("decoder_loop_seconds", "settle_seconds", "stream_rest_seconds"))
                + f" ({x['switches']} sw; alone/bench {f(x['alone_vs_bench'])}, halves {sp(x['bench_first_vs_second_half'])})")
        print(f"  {r['prompt'][:30]:30} " + "   ".join(parts))
    print(f"\nmedian speed-up over all repeats: race {overall['race_median_speedup']:.2f}x, "
          f"paired benchmark {overall['bench_median_speedup']:.2f}x (race/bench {overall['race_vs_bench']:.3f}; "
          f"median of the per-repeat ratios {overall['median_race_vs_bench']:.3f}); lanes race/alone: AR "
          f"{overall['median_ar_race_vs_alone']:.3f}, MTP {overall['median_mtp_race_vs_alone']:.3f}; "
          f"{overall['prompts_within_tolerance']}/{len(rows)} prompts within {TOLERANCE:.0%}; "
          f"the rest of the host used {f(load['others_cpu_cores'])} of {load['cpus']} CPUs meanwhile")


if __name__ == "__main__":
    sys.exit(main())
