#!/usr/bin/env python3
"""The few-row attention kernel (adapters/kernels/cuda_attention.py) on a GPU, before it is turned on.

    python scripts/gpu/gpu_attention.py --json out/attention.json [--context 64 --context 8192 ...]
    python scripts/gpu/gpu_attention.py --json /tmp/a.json --stand-in --context 300   # any machine

At the Qwythos-9B attention shape (16 query heads, 4 KV heads, head_dim 256, bf16), with the
keys and values as the cache hands them out (a view of a longer buffer), at each context:
- the kernel against its reference (each row one SDPA over its own keys, then the gate);
- each of L = 2..5 rows equal to that row computed alone (L = 1, over its own keys) bit for bit;
- time (synchronised, median of 20) of the kernel for L = 1..5 and of the reference for L = 1 and 4;
- launch variants at L = 4 (a row a block, 256 threads): the same bits as the default, and their time.
--stand-in runs the reference in the kernel's place (checks this script's plumbing on a CPU).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402

from adapters.kernels import cuda_attention, rel_err  # noqa: E402
from scripts.gpu.gpu_exact import synced_seconds  # noqa: E402

NH, NKV, HD = 16, 4, 256


def inputs(S: int, L: int, seed: int):
    keys = mx.random.split(mx.random.key(seed), 4)
    cap = (S // 256 + 1) * 256  # the cache's buffer grows in steps of 256 (mlx-lm's KVCache)
    kbuf = mx.random.normal((1, NKV, cap, HD), key=keys[0]).astype(mx.bfloat16)
    vbuf = mx.random.normal((1, NKV, cap, HD), key=keys[1]).astype(mx.bfloat16)
    q = mx.random.normal((1, L, NH, HD), key=keys[2]).astype(mx.bfloat16).transpose(0, 2, 1, 3)
    gate = mx.random.normal((1, L, NH * HD), key=keys[3]).astype(mx.bfloat16)
    mx.eval(kbuf, vbuf, q, gate)
    return q, kbuf[:, :, :S], vbuf[:, :, :S], gate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--context", type=int, action="append")
    ap.add_argument("--stand-in", action="store_true", help="the reference in the kernel's place")
    a = ap.parse_args(argv)
    kernel = cuda_attention.reference if a.stand_in else cuda_attention.gated_attention
    scale = HD**-0.5
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()), "stand_in": a.stand_in,
              "contexts": {}}
    fails = 0
    for S in a.context or [64, 2048, 8192, 32768]:
        row = {"against_reference": {}, "rows_as_alone": {}, "ms": {}}
        for L in (1, 3, 5):
            q, k, v, gate = inputs(S, L, S + L)
            row["against_reference"][L] = err = rel_err(kernel(q, k, v, gate, scale),
                                                    cuda_attention.reference(q, k, v, gate, scale))
            fails += not err < 0.02
        for L in (2, 3, 4, 5):
            q, k, v, gate = inputs(S, L, 7 * S + L)
            together = kernel(q, k, v, gate, scale)
            alone = [kernel(q[:, :, i:i + 1], k[:, :, :S - L + i + 1], v[:, :, :S - L + i + 1],
                            gate[:, i:i + 1], scale) for i in range(L)]
            row["rows_as_alone"][L] = same = all(bool(mx.array_equal(together[:, i:i + 1], y)) for i, y in enumerate(alone))
            fails += not same
        for L in (1, 2, 3, 4, 5):
            q, k, v, gate = inputs(S, L, 3)
            row["ms"][L] = {"kernel": synced_seconds(lambda: kernel(q, k, v, gate, scale)) * 1e3}
            if L in (1, 4):
                row["ms"][L]["reference"] = synced_seconds(lambda: cuda_attention.reference(q, k, v, gate, scale)) * 1e3
        if not a.stand_in:
            # Launch variants: a row per block (the layout before rows shared a block), 256 threads.
            # Each must give the default's bits (a row's arithmetic does not depend on the launch).
            q, k, v, gate = inputs(S, 4, 5)
            base = kernel(q, k, v, gate, scale)
            for name, kw in (("a row a block", {"rows_block": 1}), ("256 threads", {"threads": 256}),
                             ("256 threads, a row a block", {"rows_block": 1, "threads": 256})):
                fn = lambda kw=kw: cuda_attention.gated_attention_batch(q, [k], [v], gate, scale, **kw)  # noqa: E731
                same = bool(mx.array_equal(fn(), base))
                row.setdefault("launch_variants_L4", {})[name] = {"equal": same, "ms": synced_seconds(fn) * 1e3}
                fails += not same
        report["contexts"][S] = row
        print(f"context {S}: {json.dumps(row)}", flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=1))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
