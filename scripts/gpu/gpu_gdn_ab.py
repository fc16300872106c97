#!/usr/bin/env python3
"""The fused Gated-DeltaNet middle (adapters/kernels/gdn_fused.py) against an earlier version of it,
on the GPU, paired: the same inputs, the same process.

    python scripts/gpu/gpu_gdn_ab.py --json out/gdn_ab.json [--before 6ddf101]

At the 9B's Gated-DeltaNet shape (16 key heads, 32 value heads, 128 x 128 state, a 4-tap conv),
for T = 1..8 positions and 1 or 2 sequences:
- bits: the two versions' outputs (y, the conv window, every position's state) compared bit for bit
  (a rewrite that keeps each position's arithmetic must give the same bits);
- time: 24 launches (one a layer, as a step has them) evaluated together, synchronised, the versions
  taking turns round by round (gpu_exact.rounds, 30 rounds kept); the median of the rounds' microseconds
  a launch, and the median of the rounds' ratios.
The earlier version is read from git (`git show <rev>:adapters/kernels/gdn_fused.py`).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402

from adapters.kernels import gdn_fused  # noqa: E402
from scripts.gpu.gpu_exact import rounds  # noqa: E402

DIMS = (16, 32, 128, 128, 4)   # Hk, Hv, Dk, Dv, K: Qwythos-9B's Gated-DeltaNet layers
LAYERS = 24


def earlier(rev: str):
    """gdn_fused.py as it was at `rev`, as a module of the same package (its relative imports)."""
    root = Path(__file__).resolve().parents[2]
    src = subprocess.run(["git", "show", f"{rev}:adapters/kernels/gdn_fused.py"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader("adapters.kernels.gdn_fused_before", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "adapters.kernels"
    exec(compile(src, f"{rev}:gdn_fused.py", "exec"), mod.__dict__)  # noqa: S102  (our own file at rev)
    return mod


def inputs(T: int, B: int, seed: int = 0):
    Hk, Hv, Dk, Dv, K = DIMS
    C = 2 * Hk * Dk + Hv * Dv
    ntot = C + Hv * Dv + 2 * Hv
    k = mx.random.split(mx.random.key(seed), 6)
    proj = mx.random.normal((B, T, ntot), key=k[0]).astype(mx.bfloat16)
    window = (mx.random.normal((B, K - 1, C), key=k[1]) * 0.5).astype(mx.bfloat16)
    conv_w = (mx.random.normal((C, K), key=k[2]) * 0.3).astype(mx.bfloat16)
    neg_a = -mx.exp(mx.random.normal((Hv,), key=k[3]) * 0.5)
    dt_bias = (mx.random.normal((Hv,), key=k[4]) * 0.5).astype(mx.bfloat16)
    norm_w = mx.ones((Dv,), dtype=mx.bfloat16)
    state = mx.random.normal((B, Hv, Dv, Dk), key=k[5]) * 0.1
    offsets = (C, C + Hv * Dv, C + Hv * Dv + Hv)
    args = (proj, offsets, window, conv_w, neg_a, dt_bias, norm_w, gdn_fused.consts(Dk, 1e-6), state, DIMS)
    mx.eval([a for a in args if isinstance(a, mx.array)])
    return args


def flat(out):
    y, conv_input, states = out
    return [y, conv_input, *states]


def same_bits(a, b) -> bool:
    return all(bool(mx.array_equal(x, y)) for x, y in zip(flat(a), flat(b)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--before", default="6ddf101", help="the git revision of the version to compare with")
    a = ap.parse_args(argv)
    if not mx.cuda.is_available():
        print("gpu_gdn_ab: needs MLX's CUDA backend")
        return 2
    before = earlier(a.before)
    kernels = {"before": before.gdn_fused, "now": gdn_fused.gdn_fused}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "before": a.before, "mlx": mx.__version__, "dims": DIMS, "layers": LAYERS, "rows": []}
    for B in (1, 2):
        for T in range(1, gdn_fused.MAX_T + 1):
            args = inputs(T, B, seed=T)
            outs = {k: fn(*args) for k, fn in kernels.items()}
            mx.eval([flat(o) for o in outs.values()])
            bits = same_bits(outs["before"], outs["now"])
            row = {"T": T, "sequences": B, "same_bits": bits}
            if B == 1 and T <= 5:
                fns = {k: (lambda fn=fn: [flat(fn(*args)) for _ in range(LAYERS)]) for k, fn in kernels.items()}
                runs = rounds(fns, 32)   # the first two left out
                us = {k: statistics.median(v) / LAYERS * 1e6 for k, v in runs.items()}
                row.update(us_a_launch=us, now_over_before=statistics.median(
                    n / b for n, b in zip(runs["now"], runs["before"])))
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    report["all_same_bits"] = all(r["same_bits"] for r in report["rows"])
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=1))
    print(f"all same bits: {report['all_same_bits']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
