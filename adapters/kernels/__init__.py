"""Kernels any family can use, and the check that they work on this machine.

- `cuda_qmm`: a quantized matmul for 1-8 rows on CUDA (the few-row verify and decode steps);
- `gdn`: the Gated-DeltaNet recurrence keeping every state (the reference as MLX ops, and one
  kernel launch for T <= 8 positions on CUDA and Metal);
- `cpu_attention`: causal attention of a prefill chunk over a long cache on MLX's CPU backend.

A kernel that fails to compile or disagrees with its reference must not silently decode:
`self_check` runs them once against plain ops at load, and the family falls back to MLX's
own path, saying so.
"""
from __future__ import annotations

from typing import Optional

import mlx.core as mx

from . import cpu_attention, cuda_qmm, gdn
from .cuda_qmm import cuda_available


def self_check(backend: str, seed: int = 0, row_kernel: bool = True) -> Optional[str]:
    """Run the kernels once against plain ops; None if they agree, else why not.

    A kernel that fails to compile or disagrees must not silently decode: the adapter falls
    back to MLX's own path, saying so. (We have no Apple GPU: the Metal path proves itself
    here at load.)"""
    try:
        key = mx.random.key(seed)
        if backend == "cuda" and row_kernel:
            kw, kx, key = mx.random.split(key, 3)
            w = mx.random.normal((64, 256), key=kw).astype(mx.bfloat16)
            wq, s, b = mx.quantize(w, group_size=64, bits=4)
            x = mx.random.normal((cuda_qmm.MAX_ROWS, 256), key=kx).astype(mx.bfloat16)
            y = cuda_qmm.quantized_matmul_rows(x, wq, s, b, 4, 64)
            ref = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
            err = float(mx.abs(y.astype(mx.float32) - ref.astype(mx.float32)).max())
            scale = float(mx.abs(ref.astype(mx.float32)).max())
            if not err <= 0.02 * scale:
                return f"the quantized matmul differs from mx.quantized_matmul by {err:.2e}"
            # What exactness rests on: a row's bits do not depend on the rows beside it.
            for m in range(1, cuda_qmm.MAX_ROWS):
                if not bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(x[:m], wq, s, b, 4, 64), y[:m])):
                    return f"the quantized matmul's rows change with the row count ({m} vs {cuda_qmm.MAX_ROWS})"
        kq, kk, kv, kg, kb, ks = mx.random.split(key, 6)
        T, Hk, Hv, Dk, Dv = 3, 2, 4, 64, 32
        q = mx.random.normal((1, T, Hk, Dk), key=kq) * Dk**-0.5
        k = mx.random.normal((1, T, Hk, Dk), key=kk) * Dk**-0.5
        v = mx.random.normal((1, T, Hv, Dv), key=kv)
        g = mx.random.uniform(0.5, 1.0, (1, T, Hv), key=kg)
        beta = mx.random.uniform(0.0, 1.0, (1, T, Hv), key=kb)
        state = mx.random.normal((1, Hv, Dv, Dk), key=ks) * 0.1
        y, states = gdn.gated_delta_steps(q, k, v, g, beta, state, backend=backend)
        y_ref, states_ref = gdn.gated_delta_reference(q, k, v, g, beta, state)
        err = max(float(mx.abs(y - y_ref).max()),
                  *(float(mx.abs(a - b).max()) for a, b in zip(states, states_ref)))
        return None if err < 1e-4 else f"the Gated-DeltaNet kernel differs from the ops path by {err:.2e}"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


__all__ = ["cpu_attention", "cuda_qmm", "gdn", "cuda_available", "self_check"]
