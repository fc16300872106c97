"""Kernels any family can use, and the check that they work on this machine.

- `cuda_qmm`: a quantized matmul for 1-8 rows on CUDA (the few-row verify and decode steps);
- `gdn_fused`: a Gated-DeltaNet layer's middle (conv to gated norm) as one CUDA launch;
- `cuda_topk`: the sampler's top-k support of vocabulary-wide logit rows on CUDA (a trial);
- `cuda_attention`: a few query rows' attention over the KV cache with the output gate, on CUDA;
- `gdn`: the Gated-DeltaNet recurrence keeping every state (the reference as MLX ops, and one
  kernel launch for T <= 8 positions on CUDA and Metal), and a prefill chunk's recurrence as
  one CUDA launch whatever its length (only the final state kept);
- `cpu_attention`: causal attention of a prefill chunk over a long cache on MLX's CPU backend;
- `jit_cache`: each CUDA kernel variant compiled once per machine (MLX keeps ours in memory only).

A kernel that fails to compile or disagrees with its reference must not silently decode:
`self_check` runs them once against plain ops at load, and the family falls back to MLX's
own path, saying so.
"""
from __future__ import annotations

import time
from functools import lru_cache
from typing import Dict, Optional, Tuple

import mlx.core as mx

from . import cpu_attention, cuda_attention, cuda_qmm, cuda_topk, gdn, gdn_fused, jit_cache  # noqa: F401  (jit_cache: backends reads its stats)
from .cuda_qmm import cuda_available


def rel_err(a: mx.array, b: mx.array) -> float:
    """max |a - b| over max |b|, in fp32."""
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return float(mx.abs(a - b).max()) / max(float(mx.abs(b).max()), 1e-30)


def check_fused_gdn(seed: int = 0) -> Optional[str]:
    """gdn_fused against its reference, 3 positions together == one at a time, and two sequences
    in one launch == each alone (bit for bit)."""
    Hk, Hv, Dk, Dv, K, T = 2, 4, 32, 32, 4, 3
    C, dt = 2 * Hk * Dk + Hv * Dv, mx.bfloat16
    ks = mx.random.split(mx.random.key(seed), 7)
    proj = mx.random.normal((1, T, C + Hv * Dv + 2 * Hv), key=ks[0]).astype(dt)
    window = (mx.random.normal((1, K - 1, C), key=ks[1]) * 0.5).astype(dt)
    conv_w = (mx.random.normal((C, K), key=ks[2]) * 0.5).astype(dt)
    neg_a = -mx.random.uniform(0.5, 2.0, (Hv,), key=ks[3])
    dt_bias = mx.random.normal((Hv,), key=ks[4]).astype(dt)
    norm_w = (1 + 0.1 * mx.random.normal((Dv,), key=ks[5])).astype(dt)
    state = mx.random.normal((1, Hv, Dv, Dk), key=ks[6]) * 0.1
    args = ((C, C + Hv * Dv, C + Hv * Dv + Hv), conv_w, neg_a, dt_bias, norm_w, gdn_fused.consts(Dk, 1e-6))
    dims = (Hk, Hv, Dk, Dv, K)
    y, conv_input, states = gdn_fused.gdn_fused(proj, args[0], window, *args[1:], state, dims)
    y_ref, input_ref, states_ref = gdn_fused.reference(proj, args[0], window, *args[1:], state, dims)
    err = max(rel_err(y, y_ref), *(rel_err(a, b) for a, b in zip(states, states_ref)))
    if not (err < 0.02 and bool(mx.array_equal(conv_input, input_ref))):
        return f"the fused Gated-DeltaNet kernel differs from its reference by {err:.2e}"
    st, win = state, window
    for t in range(T):
        y1, input1, (st,) = gdn_fused.gdn_fused(proj[:, t:t + 1], args[0], win, *args[1:], st, dims)
        if not (bool(mx.array_equal(y1[:, 0], y[:, t])) and bool(mx.array_equal(st, states[t]))):
            return f"the fused Gated-DeltaNet kernel's position {t} changes with the positions beside it"
        win = input1[:, 1:]
    # A batch in one launch: each sequence (here the first one and a second of its own inputs)
    # as alone, bit for bit.
    other = [(a * 0.5 + 0.25).astype(a.dtype) for a in (proj, window)] + [state * -1.5]
    alone = gdn_fused.gdn_fused(other[0], args[0], other[1], *args[1:], other[2], dims)
    both = gdn_fused.gdn_fused(mx.concatenate([proj, other[0]]), args[0], mx.concatenate([window, other[1]]), *args[1:],
                               mx.concatenate([state, other[2]]), dims)
    for b, (y_b, input_b, states_b) in enumerate(((y, conv_input, states), alone)):
        same = (bool(mx.array_equal(both[0][b:b + 1], y_b)) and bool(mx.array_equal(both[1][b:b + 1], input_b))
                and all(bool(mx.array_equal(s[b:b + 1], t)) for s, t in zip(both[2], states_b)))
        if not same:
            return f"the fused Gated-DeltaNet kernel's sequence {b} changes with the sequences beside it"
    return None


GDN_CHECK_SHAPE = (2, 4, 64, 32)  # Hk, Hv, Dk, Dv: Hv a multiple of Hk, as the 9B's 16 / 32


def check_gdn_prefill(seed: int = 0) -> Optional[str]:
    """gdn's prefill kernel (T read at run time) against its reference over T = 37 bf16 positions,
    and the same positions as two launches (20, then 17 from the state the first left) bit for
    bit: one compiled kernel serves every length, and a prompt's state does not depend on where
    its chunks end."""
    T, cut = 37, 20
    args = gdn.random_inputs(mx.random.key(seed + 1), T, *GDN_CHECK_SHAPE, dtype=mx.bfloat16)
    y, final = gdn.gated_delta_prefill(*args)
    y_ref, states_ref = gdn.gated_delta_reference(*args)
    err_y, err_state = rel_err(y, y_ref), rel_err(final, states_ref[-1])
    if not (err_y < 0.02 and err_state < 1e-3):
        return f"the Gated-DeltaNet prefill kernel differs from its reference by {err_y:.2e} (y), {err_state:.2e} (state)"
    q, k, v, g, beta, state = args
    y1, mid = gdn.gated_delta_prefill(q[:, :cut], k[:, :cut], v[:, :cut], g[:, :cut], beta[:, :cut], state)
    y2, end = gdn.gated_delta_prefill(q[:, cut:], k[:, cut:], v[:, cut:], g[:, cut:], beta[:, cut:], mid)
    if not (bool(mx.array_equal(mx.concatenate([y1, y2], axis=1), y)) and bool(mx.array_equal(end, final))):
        return "the Gated-DeltaNet prefill kernel's result depends on where the positions are cut"
    return None


def check_attention(seed: int = 0) -> Optional[str]:
    """cuda_attention against its reference, 3 rows together == each alone, and two sequences of
    other lengths in one launch == each alone (bit for bit)."""
    nh, nkv, hd, S, L = 4, 2, 128, 200, 3  # two key chunks
    ks = mx.random.split(mx.random.key(seed), 4)
    buf = [mx.random.normal((1, nkv, 256, hd), key=ks[i]).astype(mx.bfloat16) for i in (0, 1)]
    k, v = buf[0][:, :, :S], buf[1][:, :, :S]  # views, as the cache hands them out
    q = mx.random.normal((1, nh, L, hd), key=ks[2]).astype(mx.bfloat16)
    gate = mx.random.normal((1, L, nh * hd), key=ks[3]).astype(mx.bfloat16)
    y = cuda_attention.gated_attention(q, k, v, gate, hd**-0.5)
    err = rel_err(y, cuda_attention.reference(q, k, v, gate, hd**-0.5))
    if not err < 0.02:
        return f"the attention kernel differs from its reference by {err:.2e}"
    for i in range(L):
        n = S - L + i + 1
        alone = cuda_attention.gated_attention(q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n], gate[:, i:i + 1], hd**-0.5)
        if not bool(mx.array_equal(alone, y[:, i:i + 1])):
            return f"the attention kernel's row {i} changes with the rows beside it"
    # Long contexts take all rows in one block (cuda_attention.ROWS_BLOCK_FROM): the same bits.
    together = cuda_attention.gated_attention_batch(q, [k], [v], gate, hd**-0.5, rows_block=L)
    if not bool(mx.array_equal(together, y)):
        return "the attention kernel's rows change when one block takes them all"
    # A batch in one launch pair: a shorter sequence (one key chunk, its own keys) beside this
    # one, each as alone.
    short_k, short_v = buf[0][:, :, 100:190], buf[1][:, :, 100:190]
    q2 = (q * -0.75).astype(q.dtype)
    both = cuda_attention.gated_attention_batch(mx.concatenate([q, q2]), [k, short_k], [v, short_v],
                                                mx.concatenate([gate, gate[:, ::-1]]), hd**-0.5)
    second = cuda_attention.gated_attention(q2, short_k, short_v, gate[:, ::-1], hd**-0.5)
    for b, alone in enumerate((y, second)):
        if not bool(mx.array_equal(both[b:b + 1], alone)):
            return f"the attention kernel's sequence {b} changes with the sequences beside it"
    return None


def check_two_tiles(x: mx.array, wq: mx.array, s: mx.array, b: mx.array) -> None:
    """9-16 rows in one launch (two tiles of token columns) against the same rows in one-tile
    launches, bit for bit; where they differ, cuda_qmm.TWO_TILES turns them off (batches then go
    8 rows at a time, as before) and says why, without turning the other kernels off."""
    try:
        x16 = mx.concatenate([x, x[::-1] * 0.75])
        y16 = cuda_qmm.quantized_matmul_rows(x16, wq, s, b, 4, 64)
        parts = [(slice(0, 8), x16[:8]), (slice(8, 16), x16[8:]), (slice(12, 13), x16[12:13])]
        same = all(bool(mx.array_equal(y16[k], cuda_qmm.quantized_matmul_rows(xs, wq, s, b, 4, 64))) for k, xs in parts)
        same = same and bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(x16[:11], wq, s, b, 4, 64), y16[:11]))
        why = None if same else "9-16 rows in one launch differ from the same rows in 8-row launches"
    except Exception as exc:  # noqa: BLE001  (the one-tile kernel passed: keep it)
        why = f"{type(exc).__name__}: {exc}"
    cuda_qmm.TWO_TILES.update(on=why is None, why=why)


@lru_cache(maxsize=None)
def _two_tiles_verdict(seed: int = 0) -> Tuple[bool, Optional[str]]:
    """check_two_tiles once a process, on small random weights: (on, why)."""
    kw, kx = mx.random.split(mx.random.key(seed))
    wq, s, b = mx.quantize(mx.random.normal((64, 256), key=kw).astype(mx.bfloat16), group_size=64, bits=4)
    check_two_tiles(mx.random.normal((cuda_qmm.TILE_ROWS, 256), key=kx).astype(mx.bfloat16), wq, s, b)
    return cuda_qmm.TWO_TILES["on"], cuda_qmm.TWO_TILES["why"]


def two_tiles(wanted: bool) -> None:
    """9-16 rows a launch when `wanted` and their check passes, else 8 at a time. On by default
    since paired on the H200 (MTP at 4 requests 1.29x, AR unchanged: docs/bench/2026-12-03/GPU.md,
    section 10); the first layout (two tiles in one block's registers) had lost (2026-12-02,
    section 8), today's gives each tile its own blocks."""
    on, why = _two_tiles_verdict() if wanted else (False, cuda_qmm.TWO_TILES_OFF)
    cuda_qmm.TWO_TILES.update(on=on, why=why)


# Seconds each part of the last self_check took (the start-up note names the slowest: on the H200
# the whole check took 15-21 s a start, with every kernel already compiled).
last_check_seconds: Dict[str, float] = {}


@lru_cache(maxsize=None)
def topk_verdict(draw: bool = False) -> Optional[str]:
    """cuda_topk.check once a process: None where the kernel's supports (and with `draw` its drawn
    tokens) equal the reference's, else why not."""
    try:
        return cuda_topk.check(draw=draw)
    except Exception as e:  # a compile or launch failure: MLX's ops serve
        return f"the top-k support kernel failed: {type(e).__name__}: {e}"


def self_check(backend: str, seed: int = 0, row_kernel: bool = True, fused_gdn: bool = False,
               fused_attention: bool = False) -> Optional[str]:
    """Run the kernels once against plain ops; None if they agree, else why not.

    A kernel that fails to compile or disagrees must not silently decode: the adapter falls
    back to MLX's own path, saying so. (We have no Apple GPU: the Metal path proves itself
    here at load.)"""
    last_check_seconds.clear()
    clock = [time.perf_counter()]

    def part(name: str) -> None:   # the seconds since the last part, under `name`
        now = time.perf_counter()
        last_check_seconds[name] = now - clock[0]
        clock[0] = now

    try:
        key = mx.random.key(seed)
        if backend == "cuda" and row_kernel:
            kw, kx, key = mx.random.split(key, 3)
            w = mx.random.normal((64, 256), key=kw).astype(mx.bfloat16)
            wq, s, b = mx.quantize(w, group_size=64, bits=4)
            x = mx.random.normal((cuda_qmm.TILE_ROWS, 256), key=kx).astype(mx.bfloat16)
            y = cuda_qmm.quantized_matmul_rows(x, wq, s, b, 4, 64)
            ref = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
            err = float(mx.abs(y.astype(mx.float32) - ref.astype(mx.float32)).max())
            scale = float(mx.abs(ref.astype(mx.float32)).max())
            if not err <= 0.02 * scale:
                return f"the quantized matmul differs from mx.quantized_matmul by {err:.2e}"
            # What exactness rests on: a row's bits do not depend on the rows beside it.
            for m in range(1, cuda_qmm.TILE_ROWS):
                if not bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(x[:m], wq, s, b, 4, 64), y[:m])):
                    return f"the quantized matmul's rows change with the row count ({m} vs {cuda_qmm.TILE_ROWS})"
            # The MLP's down projection reading silu(gate) * up from gate|up as it loads it.
            gate_up = mx.concatenate([x, x[::-1] * 0.5], axis=-1)
            y = cuda_qmm.quantized_matmul_rows(gate_up, wq, s, b, 4, 64, swiglu=True)
            ref = mx.quantized_matmul(cuda_qmm.swiglu_rows(gate_up), wq, s, b, transpose=True, group_size=64, bits=4)
            if not rel_err(y, ref) <= 0.02:
                return f"the quantized matmul with its SwiGLU input differs from the ops by {rel_err(y, ref):.2e}"
            for m in (1, 3):
                if not bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(gate_up[:m], wq, s, b, 4, 64, swiglu=True), y[:m])):
                    return f"the quantized matmul's SwiGLU rows change with the row count ({m} vs {cuda_qmm.TILE_ROWS})"
            part("row kernel")
        q, k, v, g, beta, state = gdn.random_inputs(key, 3, *GDN_CHECK_SHAPE)
        y, states = gdn.gated_delta_steps(q, k, v, g, beta, state, backend=backend)
        y_ref, states_ref = gdn.gated_delta_reference(q, k, v, g, beta, state)
        err = max(float(mx.abs(y - y_ref).max()),
                  *(float(mx.abs(a - b).max()) for a, b in zip(states, states_ref)))
        if not err < 1e-4:
            return f"the Gated-DeltaNet kernel differs from the ops path by {err:.2e}"
        part("recurrence")
        why = check_gdn_prefill(seed) if backend == "cuda" else None
        part("prefill recurrence")
        if why:
            return why
        if backend == "cuda" and fused_gdn:
            why = check_fused_gdn(seed)
            part("fused GDN layer")
            if why:
                return why
        if backend == "cuda" and fused_attention:
            why = check_attention(seed)
            part("attention")
            return why
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


__all__ = ["cpu_attention", "cuda_attention", "cuda_qmm", "gdn", "gdn_fused", "cuda_available", "self_check"]
