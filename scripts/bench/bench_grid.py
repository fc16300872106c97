#!/usr/bin/env python3
"""bench.py's paired benchmark for every temperature x depth, in one process on one load: each pair
of a temperature and a depth writes its own report, named by --json's pattern. On a GPU a process
start (imports, load, kernel checks, layers compiled) costs more than a short run on a small model,
so the six runs of issue 32's demo figure take one start instead of six.

    python scripts/bench/bench_grid.py --model models/demo --temperatures 0 0.6 --depths 1 2 3 \\
        --json 'out/demo_t{t}_d{d}.json' -- --top-p 0.95 --top-k 20 --max-tokens 128 --repeats 3

Everything after `--` goes to bench.py as it is (not --temperature, --depth or --json).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.bench import bench  # noqa: E402

OWN = ("--temperature", "--depth", "--json")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--temperatures", nargs="+", required=True, help="as written, they fill {t} in --json")
    ap.add_argument("--depths", nargs="+", required=True)
    ap.add_argument("--json", required=True, help="a pattern with {t} and {d}: one report a pair")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if "{t}" not in args.json or "{d}" not in args.json:
        ap.error("--json needs {t} and {d}, or the pairs' reports overwrite each other: e.g. 'demo_t{t}_d{d}.json'")
    clash = [a for a in rest if a.split("=")[0] in OWN]
    if clash:
        ap.error(f"{clash[0]} is set by this script for each pair: leave it out after --")
    for t in args.temperatures:
        for d in args.depths:
            print(f"--- temperature {t}, depth {d}", file=sys.stderr, flush=True)
            code = bench.main(["--model", args.model, "--temperature", t, "--depth", d,
                               "--json", args.json.format(t=t, d=d), *rest])
            if code:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
