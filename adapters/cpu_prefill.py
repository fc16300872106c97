"""Full-attention layers of long forwards (prefill chunks) on the CPU.

Why: on MLX's CPU backend `mx.exp` costs ~12 ns an element (scalar), so the softmax of a prefill
chunk over a long context dominates it: 263 new tokens over 2,700 cached ones spent ~45 ms per
attention layer in exp alone, and a chat turn's time to first token grew with the conversation.
`mx.power(e, x)` is the same function at 3x the speed there (~4 ns; relative error ~6e-7 from e
rounded to float32, far below what the fp32 attention keeps anyway). The rest is mlx-lm's
Qwen3-Next attention, written out (same projections, norms, RoPE, cache and output gate), with
GQA done by grouping the queries instead of repeating the keys.
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


def attention_layer(layer, x: mx.array, cache) -> mx.array:
    """One qwen3_5 full-attention DecoderLayer (x [B, L, H]) with `attention` above."""
    at = layer.self_attn
    B, L, _ = x.shape
    xn = layer.input_layernorm(x)
    queries, gate = mx.split(at.q_proj(xn).reshape(B, L, at.num_attention_heads, -1), 2, axis=-1)
    gate = gate.reshape(B, L, -1)
    keys, values = at.k_proj(xn), at.v_proj(xn)
    queries = at.q_norm(queries).transpose(0, 2, 1, 3)
    keys = at.k_norm(keys.reshape(B, L, at.num_key_value_heads, -1)).transpose(0, 2, 1, 3)
    values = values.reshape(B, L, at.num_key_value_heads, -1).transpose(0, 2, 1, 3)
    queries, keys = at.rope(queries, offset=cache.offset), at.rope(keys, offset=cache.offset)
    keys, values = cache.update_and_fetch(keys, values)
    out = attention(queries, keys, values, at.scale).transpose(0, 2, 1, 3).reshape(B, L, -1)
    h = x + at.o_proj(out * mx.sigmoid(gate))
    return h + layer.mlp(layer.post_attention_layernorm(h))
