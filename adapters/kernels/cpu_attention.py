"""Causal attention of long forwards (prefill chunks) on MLX's CPU backend.

Why: on MLX's CPU backend `mx.exp` costs ~12 ns an element (scalar), so the softmax of a prefill
chunk over a long context dominates it: 263 new tokens over 2,700 cached ones spent ~45 ms per
attention layer in exp alone, and a chat turn's time to first token grew with the conversation.
`mx.power(e, x)` is the same function at 3x the speed there (~4 ns; relative error ~6e-7 from e
rounded to float32, far below what the fp32 attention keeps anyway). GQA is done by grouping
the queries instead of repeating the keys. A family's attention layer takes this as its scaled
dot-product attention for long forwards on the CPU (adapters/qwen3_5/mlx_ops.py).
"""
from __future__ import annotations

import math

import mlx.core as mx

E = mx.array(math.e, dtype=mx.float32)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """Causal attention of the last L positions: q [B, H, L, D] over k, v [B, KV, S, D] (S >= L).

    The keys before the chunk need no mask: they are scored apart from the chunk's own L keys
    (the only ones a causal mask hides), and the softmax's division is done on the output, so
    the big [L, S] score array is only reduced, shifted and exponentiated."""
    B, H, L, D = q.shape
    KV, S = k.shape[1], k.shape[2]
    rep = H // KV
    q = (q * scale).reshape(B, KV, rep * L, D)
    s_new = q @ k[:, :, S - L:].swapaxes(-1, -2)          # [B, KV, rep*L, L]
    if L > 1:  # query i of the chunk sees the chunk's keys 0..i
        seen = mx.tile(mx.arange(L)[None, :] <= mx.arange(L)[:, None], (rep, 1))
        s_new = mx.where(seen, s_new, -mx.inf)
    m = s_new.max(axis=-1, keepdims=True)
    if S > L:
        s_old = q @ k[:, :, : S - L].swapaxes(-1, -2)     # [B, KV, rep*L, S-L]
        m = mx.maximum(m, s_old.max(axis=-1, keepdims=True))
        p_old = mx.power(E, s_old - m)
    p_new = mx.power(E, s_new - m)
    out = p_new @ v[:, :, S - L:]
    total = p_new.sum(axis=-1, keepdims=True)
    if S > L:
        out = out + p_old @ v[:, :, : S - L]
        total = total + p_old.sum(axis=-1, keepdims=True)
    return (out / total).reshape(B, H, L, D)
