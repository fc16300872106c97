"""What a draw from a logit row costs on the GPU (issue 32: the MTP head's step, 0.15-0.17 AR steps
against a target of 0.15, ends in one): each op alone, synchronised, on random bf16 logits at the
9B's vocabulary, for 1 and 4 rows.

    python scripts/gpu/gpu_draw.py --json out.json

Times (median of --repeats after 5 warm-ups, ms): an elementwise op on the row (a launch's floor),
mx.argmax, the finiteness sum, the greedy flag of the decoders (core.sampling.greedy_rows_or_flag),
the default sampler's support and draw (T 0.6, top_k 20, top_p 0.95) and their parts
(argpartition, topk, max). On the H200 (docs/bench/2026-12-04/gpu-s18b-draw.json) a split-row
argmax kernel took 0.055 ms against mx.argmax's 0.079 but left the MTP step unchanged, so it went.
On a GPU it also times the support and the draw through the top-k support kernel
(adapters/kernels/cuda_topk.py, the "topk-kernel" trial) after its check: the draw as the support
by the kernel then categorical ("top-k kernel"), and with the kernel also drawing the token
(row_topk_draw, what SamplerConfig.draw uses with the kernel set: "top-k kernel drawing").
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from adapters.runtime import preload_blas  # noqa: E402

preload_blas()

import mlx.core as mx  # noqa: E402

from adapters.kernels import cuda_topk  # noqa: E402
from core import sampling  # noqa: E402
from core.sampling import SamplerConfig, all_finite, greedy_rows_or_flag  # noqa: E402


def synced_ms(fn, repeats: int) -> float:
    for _ in range(5):
        mx.eval(fn())
    runs = []
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(fn())
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=248_320)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    why = cuda_topk.check() if mx.default_device() == mx.gpu else "no GPU"
    print(f"top-k support kernel check: {why or 'passed'}", flush=True)
    sampler = SamplerConfig(temperature=0.6, top_k=20, top_p=0.95)
    key = mx.random.key(3)
    out = {"mlx": mx.__version__, "device": str(mx.default_device()), "machine": platform.node(),
           "vocab": a.vocab, "topk_kernel_check": why or "passed", "rows": {}}
    for R in a.rows:
        x = (mx.random.normal((R, a.vocab), key=mx.random.key(R)) * 4).astype(mx.bfloat16)
        xf = x.astype(mx.float32)
        mx.eval(x, xf)
        ops = {
            "elementwise (x * 2)": lambda: x * 2,
            "mx.argmax": lambda: mx.argmax(x, axis=-1),
            "all_finite (sum)": lambda: all_finite(x),
            "greedy_rows_or_flag": lambda: greedy_rows_or_flag(x),
            "sampler.support (T 0.6, top_k 20, top_p 0.95)": lambda: sampler.support(x)[1],
            "sampler.draw": lambda: sampler.draw(x, key)[0],
            "argpartition k=20 (fp32)": lambda: mx.argpartition(-xf, 19, axis=-1)[..., :20],
            "mx.topk k=20 (fp32)": lambda: mx.topk(xf, 20, axis=-1),
            "max (fp32)": lambda: mx.max(xf, axis=-1),
        }
        if why is None:   # the "topk-kernel" trial's path: the same calls with the kernel set
            def with_kernel(fn, hook=cuda_topk.row_topk_support):   # (row_topk_drawing: the default since GPU.md section 20)
                def run():
                    sampling.use_row_topk(hook)
                    try:
                        return fn()
                    finally:
                        sampling.use_row_topk(None)
                return run

            ops["sampler.support, top-k kernel"] = with_kernel(lambda: sampler.support(x)[1])
            ops["sampler.draw, top-k kernel"] = with_kernel(lambda: sampler.draw(x, key)[0])
            ops["sampler.draw, top-k kernel drawing"] = with_kernel(lambda: sampler.draw(x, key)[0], cuda_topk.row_topk_drawing)
        row = {name: round(synced_ms(fn, a.repeats), 4) for name, fn in ops.items()}
        out["rows"][str(R)] = row
        for name, ms in row.items():
            print(f"rows {R}: {name:50s} {ms:8.4f} ms", flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
