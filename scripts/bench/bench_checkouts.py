#!/usr/bin/env python3
"""Before/after benchmark of two checkouts: did a change make a lane slower?

scripts/bench/bench.py measures lanes of one checkout against each other; a refactor has to be
measured against the code it replaced. Each checkout runs in its own worker process (its own
venv and code, the model loaded once, load excluded); the driver asks them in turn for one
reply at a time, before and after back to back, in alternating order, with the same prompt,
sampler and seed, after one untimed reply per lane and configuration (warm). So both sides of
a pair meet the same moment of a shared machine: on this 2-core host, whole bench.py runs of one side after the other drifted by up to
+-25 % between runs (even mlx_lm's lane, the same code in both: 0.85x to 1.27x), which hides a
3 % question; pairs one reply apart do not.

Reported per lane and (temperature, depth): the median of the per-pair ratios after/before of
decode tokens/s, their quartiles, and whether both sides emitted the same tokens.

    git worktree add --detach /tmp/before <commit>   # with a venv there (or a symlink to one)
    flock -x /work/locks/cpu.lock .venv/bin/python scripts/bench/bench_checkouts.py --before /tmp/before \
        --after . --prompts-file scripts/demo_model/race_prompts.txt --repeats 12 --json docs/bench/x.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

LANES = ("ar", "mtp")


# --- the worker: runs inside one checkout ------------------------------------------------
def worker(checkout: str, model: str, prompts_file: str, max_tokens: int) -> None:
    """Loads the model with this checkout's code, then answers one JSON request per stdin line."""
    out, sys.stdout = sys.stdout, sys.stderr  # the protocol's lines only on stdout
    sys.path.insert(0, checkout)
    import adapters  # noqa: F401  (first: the BLAS preload must precede mlx)
    from adapters import load_adapter
    from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt_ids

    ad = load_adapter(model)
    prompts = [chat_prompt_ids(ad, [{"role": "user", "content": p}]) for p in _prompts(prompts_file)]

    def reply(req):
        sampler = SamplerConfig(req["temperature"], 0.95, 20, 0.0)
        lane = (AutoregressiveDecoder(ad, sampler=sampler, seed=req["seed"]) if req["lane"] == "ar" else
                SpeculativeDecoder(ad, sampler=sampler, seed=req["seed"], depth=req["depth"]))
        ids, stats = lane.generate(prompts[req["prompt"] % len(prompts)], max_tokens=max_tokens)
        return {"tokens_per_second": stats.tokens_per_second, "ids": ids}

    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        print(json.dumps(reply(json.loads(line))), file=out, flush=True)


def _prompts(path):
    if not path:
        return ["Tell me about Python lists."]
    return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]


# --- the driver ----------------------------------------------------------------------------
class Side:
    def __init__(self, checkout: Path, args, model: Path):
        self.checkout = checkout
        self.proc = subprocess.Popen(
            [str(checkout / ".venv/bin/python"), __file__, "--worker", str(checkout), "--model", str(model),
             "--max-tokens", str(args.max_tokens)] + (["--prompts-file", args.prompts_file] if args.prompts_file else []),
            cwd=checkout, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.proc.stdout.readline())["ready"]

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def git_head(path: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True,
                          text=True).stdout.strip()


def quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return [round(q[0], 4), round(q[2], 4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path)
    ap.add_argument("--model", type=Path, help="default: the after checkout's models/demo")
    ap.add_argument("--temperature", type=float, action="append")
    ap.add_argument("--depth", type=int, action="append")
    ap.add_argument("--repeats", type=int, default=12, help="pairs per lane and configuration")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--lane", action="append", choices=LANES, help="default: both")
    ap.add_argument("--prompts-file")
    ap.add_argument("--json", help="write the report here (after every configuration)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, str(args.model), args.prompts_file, args.max_tokens)
        return 0
    if args.prompts_file:
        args.prompts_file = str(Path(args.prompts_file).resolve())
    before, after = args.before.resolve(), args.after.resolve()
    model = (args.model or after / "models/demo").resolve()
    sides = {"before": Side(before, args, model), "after": Side(after, args, model)}
    configs = [(t, d) for t in args.temperature or [0.6, 0.0] for d in args.depth or [1, 2, 3]]
    report = {"before": {"path": str(before), "commit": git_head(before)},
              "after": {"path": str(after), "commit": git_head(after)},
              "model": str(model), "repeats": args.repeats, "max_tokens": args.max_tokens,
              "sampler": "top_p 0.95, top_k 20; seed = repeat index, prompt = repeat index mod prompts",
              "prompts_file": args.prompts_file, "configs": []}
    lanes = tuple(args.lane or LANES)
    t0 = time.perf_counter()
    try:
        for t, d in configs:
            runs = {lane: {"before": [], "after": [], "same_tokens": 0} for lane in lanes}
            for lane in lanes:  # this sampler's and depth's shapes compile outside the pairs
                for s in sides.values():
                    s.ask(lane=lane, temperature=t, depth=d, seed=10_000, prompt=0)
            for r in range(args.repeats):
                for i, lane in enumerate(lanes):
                    order = ("before", "after") if (r + i) % 2 == 0 else ("after", "before")
                    got = {s: sides[s].ask(lane=lane, temperature=t, depth=d, seed=r, prompt=r) for s in order}
                    for s in order:
                        runs[lane][s].append(got[s]["tokens_per_second"])
                    runs[lane]["same_tokens"] += got["before"]["ids"] == got["after"]["ids"]
            row = {"temperature": t, "depth": d, "lanes": {}}
            for lane, x in runs.items():
                ratios = [a / b for a, b in zip(x["after"], x["before"])]
                row["lanes"][lane] = {
                    "median_paired_ratio": round(statistics.median(ratios), 4), "quartiles": quartiles(ratios),
                    "before_tok_s": round(statistics.median(x["before"]), 1),
                    "after_tok_s": round(statistics.median(x["after"]), 1),
                    "same_tokens": f"{x['same_tokens']}/{args.repeats}", "paired_ratios": [round(v, 4) for v in ratios]}
            report["configs"].append(row)
            print(f"T={t} depth {d}: " + "  ".join(
                f"{lane} {v['median_paired_ratio']:.3f} [{v['quartiles'][0]:.3f}, {v['quartiles'][1]:.3f}] "
                f"({v['before_tok_s']} -> {v['after_tok_s']} tok/s, same tokens {v['same_tokens']})"
                for lane, v in row["lanes"].items()), flush=True)
            report["seconds"] = round(time.perf_counter() - t0)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    finally:
        for s in sides.values():
            s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
