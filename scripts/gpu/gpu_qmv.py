#!/usr/bin/env python3
"""The multi-row quantized matvec (adapters/kernels/cuda_qmm.py) against MLX's own, per 9B shape.

    python scripts/gpu/gpu_qmv.py --json out/qmv.json [--sweep] [--rows 1 2 3 4 5 8]

For each shape (K, N) of the Qwythos-9B linears, the fused ones included:
- correctness: against mx.quantized_matmul (bf16 rounding) and an fp32 dequantized reference;
- row invariance: rows 0..M-1 of an M-row call equal the same rows of the 8-row call bit for
  bit, for every M, and row 3 alone equals row 3 of the 8-row call; 16 and 12 rows in one launch
  (two tiles) equal the same rows 8 a launch;
- time per call inside one evaluated graph of many calls (each on its own copy of the weights,
  together > 4x the L2, so nothing is served from cache), for MLX's quantized matmul and the
  kernel, at each row count (past 8 rows also 8 a launch, the decode's way while two tiles
  are off); and the bandwidth that is (bytes of weights, scales and biases
  over the time, as gpt-fast counts it);
- with --sweep, the kernel's (tiles, warps) choices at 1 and 4 rows, to check qmm_config.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402

from adapters.kernels import cuda_qmm  # noqa: E402
from scripts.gpu.gpu_check import SHAPES_9B, log  # noqa: E402

# (K, N) of the 9B's linears, and the joined ones (rows of linears that share an input, concatenated).
SHAPES = {"gdn in (qkv|z|b|a)": (4096, 12352), "attn q|k|v": (4096, 10240), "mlp gate|up": (4096, 24576),
          **SHAPES_9B, "mtp fc": (8192, 4096)}
L2 = 60 << 20


def weights(K: int, N: int, bits: int, gs: int, copies: int, seed: int):
    sets = []
    for i in range(copies):
        w = (mx.random.normal((N, K), key=mx.random.key(seed + i)) * K**-0.5).astype(mx.bfloat16)
        sets.append(mx.quantize(w, group_size=gs, bits=bits))
        mx.eval(sets[-1])
    return sets


def nbytes(s) -> int:
    return sum(a.nbytes for a in s)


def per_call(fn, sets, x, calls: int, reps: int = 7) -> float:
    """Seconds per call inside one graph of `calls` independent calls (median over reps)."""
    times = []
    for _ in range(reps + 2):
        t = time.perf_counter()
        mx.eval([fn(x, sets[i % len(sets)]) for i in range(calls)])
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:]) / calls


def mlx_qmm(bits, gs):
    return lambda x, s: mx.quantized_matmul(x, *s, transpose=True, group_size=gs, bits=bits)


def ours(bits, gs, config=None):
    return lambda x, s: cuda_qmm.quantized_matmul_rows(x, *s, bits, gs, config=config)


def ours_split(bits, gs):
    """8 rows a launch, as the decode runs more rows while two tiles a launch are off."""
    step = cuda_qmm.TILE_ROWS
    return lambda x, s: mx.concatenate([cuda_qmm.quantized_matmul_rows(x[i:i + step], *s, bits, gs)
                                        for i in range(0, x.shape[0], step)])


def check(K, N, bits, gs, dtype) -> dict:
    (s,) = weights(K, N, bits, gs, 1, 7)
    s = tuple(a.astype(dtype) if a.dtype == mx.bfloat16 else a for a in s)
    x = mx.random.normal((8, K), key=mx.random.key(3)).astype(dtype)
    full = cuda_qmm.quantized_matmul_rows(x, *s, bits, gs)
    ref = mx.quantized_matmul(x, *s, transpose=True, group_size=gs, bits=bits)
    deq = mx.dequantize(*s, group_size=gs, bits=bits).astype(mx.float32)
    exact = x.astype(mx.float32) @ deq.T
    scale = float(mx.abs(exact).max())
    err_mlx = float(mx.abs(full.astype(mx.float32) - ref.astype(mx.float32)).max()) / scale
    err_f32 = float(mx.abs(full.astype(mx.float32) - exact).max()) / scale
    err_mlx_f32 = float(mx.abs(ref.astype(mx.float32) - exact).max()) / scale
    invariant = all(bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(x[:m], *s, bits, gs), full[:m]))
                    for m in range(1, 8))
    invariant &= bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(x[3:4], *s, bits, gs), full[3:4]))
    # Two tiles a launch (9-16 rows): each tile's rows as in an 8-row launch, at 16 and at 12 rows.
    x16 = mx.concatenate([x, x[::-1] * 0.5])
    both = cuda_qmm.quantized_matmul_rows(x16, *s, bits, gs)
    two_tiles = bool(mx.array_equal(both, ours_split(bits, gs)(x16, s)))
    two_tiles &= bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(x16[:12], *s, bits, gs), both[:12]))
    res = mx.random.normal((8, N), key=mx.random.key(5)).astype(dtype)
    fused = cuda_qmm.quantized_matmul_rows(x, *s, bits, gs, residual=res)
    residual_ok = bool(mx.array_equal(fused, res + full))
    ok = invariant and two_tiles and residual_ok and err_f32 < 0.02 and err_mlx < 0.03
    return {"K": K, "N": N, "bits": bits, "group": gs, "dtype": str(dtype), "rel_err_vs_mlx": err_mlx,
            "rel_err_vs_fp32": err_f32, "mlx_rel_err_vs_fp32": err_mlx_f32, "rows_bit_identical": invariant,
            "two_tiles_equal_8_row_launches": two_tiles,
            "fused_residual_equals_add": residual_ok, "ok": ok}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 2, 3, 4, 5, 8])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--shapes", nargs="*", help="names from SHAPES (default: all)")
    ap.add_argument("--no-checks", action="store_true")
    a = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()), "checks": [], "shapes": {}}
    fails = 0
    if not a.no_checks:
        t = time.perf_counter()
        for bits in (4, 8):
            for gs in (32, 64, 128):
                for dtype in (mx.bfloat16, mx.float16):
                    for K, N in ((4096, 8192 + 32), (12288, 1024 + 16)):
                        c = check(K, N, bits, gs, dtype)
                        report["checks"].append(c)
                        fails += not c["ok"]
                        if not c["ok"]:
                            log(f"CHECK FAILED {c}")
        log(f"checks: {len(report['checks']) - fails}/{len(report['checks'])} ok ({time.perf_counter() - t:.1f} s, "
            f"includes compiling)")
    bits, gs = 4, 64
    for name, (K, N) in SHAPES.items():
        if a.shapes and name not in a.shapes:
            continue
        probe = weights(K, N, bits, gs, 1, 11)
        size = nbytes(probe[0])
        copies = max(2, min(64, -(-4 * L2 // size)))
        sets = probe + weights(K, N, bits, gs, copies - 1, 100)
        calls = max(copies, 32)
        row = {"K": K, "N": N, "bytes": size, "copies": copies, "config": cuda_qmm.qmm_config(N, K, bits),
               "mlx_us": {}, "ours_us": {}, "mlx_GBps": {}, "ours_GBps": {}, "ours_8_a_launch_us": {}}
        for m in a.rows:
            x = mx.random.normal((m, K), key=mx.random.key(m)).astype(mx.bfloat16)
            for key, fn in (("mlx", mlx_qmm(bits, gs)), ("ours", ours(bits, gs))):
                sec = per_call(fn, sets, x, calls)
                row[f"{key}_us"][m] = round(sec * 1e6, 2)
                row[f"{key}_GBps"][m] = round(size / sec / 1e9, 1)
            if m > cuda_qmm.TILE_ROWS:  # more rows than a tile: one launch (above) against 8 a launch
                row["ours_8_a_launch_us"][m] = round(per_call(ours_split(bits, gs), sets, x, calls) * 1e6, 2)
        if a.sweep:
            row["sweep_us"] = {}
            for tiles in (1, 2):
                for warps in (1, 2, 4, 8):
                    if tiles == 2 and N % 32:
                        continue
                    for m in (1, 4):
                        x = mx.random.normal((m, K), key=mx.random.key(m)).astype(mx.bfloat16)
                        sec = per_call(ours(bits, gs, (tiles, warps)), sets, x, calls, reps=5)
                        row["sweep_us"][f"t{tiles}w{warps}m{m}"] = round(sec * 1e6, 2)
        report["shapes"][name] = row
        log(f"{name:22s} K={K:6d} N={N:6d} {size / 2**20:7.1f} MiB config={row['config']} "
            f"mlx us {row['mlx_us']} | ours us {row['ours_us']} | ours GB/s {row['ours_GBps']}"
            + (f" | 8 a launch us {row['ours_8_a_launch_us']}" if row["ours_8_a_launch_us"] else ""))
        if a.sweep:
            log(f"    sweep {row['sweep_us']}")
        del sets, probe
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=1))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
