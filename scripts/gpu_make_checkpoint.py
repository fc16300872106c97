#!/usr/bin/env python3
"""Write the Qwythos-9B-shape random checkpoint (4-bit g64, bf16) with make_tiny_checkpoint.

    python scripts/gpu_make_checkpoint.py --out /tmp/q9b            # the 9B shape
    python scripts/gpu_make_checkpoint.py --out /tmp/h1024 --shape h1024-l16

make_tiny_checkpoint draws its weights with numpy, one core: 202 s for the 9B shape on the
H200 machine, most of it in standard_normal. Here the large draws come from mx.random on the
default device instead (the same distribution, other values); everything else is
make_tiny_checkpoint's own code.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from scripts import make_tiny_checkpoint as mtc  # noqa: E402

# KNOWLEDGE section 1 / 10: Qwen3.5-9B / Qwythos text config.
SHAPES = {
    "9b": dict(hidden_size=4096, num_layers=32, full_attention_interval=4, vocab_size=248320,
               num_heads=16, num_kv_heads=4, head_dim=256, intermediate_size=12288,
               linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128,
               linear_value_head_dim=128),
    # The checkpoint whose MTP lane raised NonFiniteLogitsError on the GPU (issue 14).
    "h1024-l16": dict(hidden_size=1024, num_layers=16, full_attention_interval=4, vocab_size=32768,
                      num_heads=8, num_kv_heads=2, head_dim=128, intermediate_size=3072,
                      linear_num_value_heads=16, linear_num_key_heads=8, linear_key_head_dim=64,
                      linear_value_head_dim=64),
}


class FastRng:
    """np.random.Generator for make_tiny_checkpoint, with large normal draws from mx.random."""

    BIG = 1 << 20

    def __init__(self, seed):
        self._np = np.random.Generator(np.random.PCG64(seed))
        self._key = mx.random.key(int(seed) if seed is not None else 0)

    def standard_normal(self, size=None, *args, **kwargs):
        if size is None or int(np.prod(size)) < self.BIG:
            return self._np.standard_normal(size, *args, **kwargs)
        self._key, sub = mx.random.split(self._key)
        return np.array(mx.random.normal(tuple(int(s) for s in np.atleast_1d(size)), key=sub))

    def __getattr__(self, name):
        return getattr(self._np, name)


def build(out: str, shape: str = "9b", bits: int = 4, group_size: int = 64, dtype: str = "bfloat16") -> Path:
    real = np.random.default_rng
    np.random.default_rng = FastRng  # make_tiny_checkpoint calls np.random.default_rng(seed)
    try:
        return mtc.make_tiny_checkpoint(out, bits=bits, group_size=group_size, mtp_bits=bits,
                                        dtype=dtype, **SHAPES[shape])
    finally:
        np.random.default_rng = real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="9b")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    path = build(a.out, a.shape, a.bits, a.group_size, a.dtype)
    print(f"wrote {path} ({a.shape}, {a.bits}-bit g{a.group_size}, {a.dtype}) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
