#!/usr/bin/env python3
"""Before/after benchmark of two checkouts: did a change make a lane slower?

scripts/bench.py measures lanes of one checkout against each other; a refactor has to be
measured against the code it replaced. This runs each checkout's own bench.py (its own venv)
on the same model, prompts, sampler and seeds, for every (temperature, depth), the two
checkouts back to back per configuration and in alternating order (ABBA across
configurations, so a slow drift of the machine does not favour one side), and reports per lane
the ratio after/before: of the medians, and the median of the per-repeat ratios (repeat r of
both sides decodes the same prompt with the same seed). mlx_lm's lane runs the same library in
both checkouts: its ratio shows the noise floor of the machine.

    git worktree add --detach /tmp/before <commit>   # and a venv there (or a symlink to one)
    flock -x /work/locks/cpu.lock .venv/bin/python scripts/bench_checkouts.py --before /tmp/before \
        --after . --temperature 0.6 --temperature 0 --depth 1 --depth 2 --depth 3 \
        --prompts-file scripts/demo_model/race_prompts.txt --repeats 8 --json docs/bench/x.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LANES = ("ar", "mtp", "mlx_lm")


def bench(checkout: Path, model: Path, temperature: float, depth: int, args, out: Path) -> dict:
    cmd = [str(checkout / ".venv/bin/python"), str(checkout / "scripts/bench.py"), "--model", str(model),
           "--temperature", str(temperature), "--depth", str(depth), "--repeats", str(args.repeats),
           "--max-tokens", str(args.max_tokens), "--json", str(out)]
    if args.prompts_file:
        cmd += ["--prompts-file", str(Path(args.prompts_file).resolve())]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=checkout, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    report = json.loads(out.read_text())
    report["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return report


def compare(before: dict, after: dict) -> dict:
    lanes = {}
    for lane in LANES:
        b, a = before[lane]["runs_tokens_per_second"], after[lane]["runs_tokens_per_second"]
        per_repeat = [y / x for x, y in zip(b, a)]
        lanes[lane] = {"before_tok_s": statistics.median(b), "after_tok_s": statistics.median(a),
                       "ratio_of_medians": statistics.median(a) / statistics.median(b),
                       "median_paired_ratio": statistics.median(per_repeat),
                       "paired_ratios": [round(r, 4) for r in per_repeat]}
    return {"lanes": lanes,
            "speedup_vs_ar": {"before": before["speedup_vs_ar"], "after": after["speedup_vs_ar"]},
            "acceptance_rate": {"before": before["mtp"]["acceptance_rate"], "after": after["mtp"]["acceptance_rate"]},
            "same_sample_text": all(before[l]["sample_text"] == after[l]["sample_text"] for l in ("ar", "mtp")),
            "tokens": {l: (before[l]["tokens"], after[l]["tokens"]) for l in ("ar", "mtp")}}


def git_head(path: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True,
                          text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, type=Path)
    ap.add_argument("--after", required=True, type=Path)
    ap.add_argument("--model", type=Path, help="default: the after checkout's models/demo")
    ap.add_argument("--temperature", type=float, action="append")
    ap.add_argument("--depth", type=int, action="append")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts-file")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args()
    before, after = args.before.resolve(), args.after.resolve()
    model = (args.model or after / "models/demo").resolve()
    configs = [(t, d) for t in args.temperature or [0.6, 0.0] for d in args.depth or [1, 2, 3]]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (t, d) in enumerate(configs):
            sides = [("before", before), ("after", after)]
            reports = {}
            for name, path in sides if i % 2 == 0 else sides[::-1]:
                reports[name] = bench(path, model, t, d, args, Path(tmp) / f"{name}.json")
            row = {"temperature": t, "depth": d, "order": [n for n, _ in (sides if i % 2 == 0 else sides[::-1])],
                   **compare(reports["before"], reports["after"]), "runs": reports}
            rows.append(row)
            lanes = "  ".join(f"{l} {row['lanes'][l]['median_paired_ratio']:.3f}" for l in LANES)
            print(f"T={t} depth {d}: after/before {lanes}  (same text: {row['same_sample_text']})", flush=True)
            write(args, before, after, model, rows)  # after every configuration: a cut-short run keeps its rows
    return 0


def write(args, before: Path, after: Path, model: Path, rows: list) -> None:
    slowest = min((r["lanes"][l]["median_paired_ratio"], l, r["temperature"], r["depth"])
                  for r in rows for l in ("ar", "mtp"))
    report = {"before": {"path": str(before), "commit": git_head(before)},
              "after": {"path": str(after), "commit": git_head(after)},
              "model": str(model), "repeats": args.repeats, "max_tokens": args.max_tokens,
              "prompts_file": args.prompts_file, "configs": rows,
              "slowest_lane": {"ratio": slowest[0], "lane": slowest[1], "temperature": slowest[2], "depth": slowest[3]}}
    print(f"slowest of our lanes so far: {slowest[1]} at T={slowest[2]} depth {slowest[3]}: "
          f"after/before {slowest[0]:.3f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
