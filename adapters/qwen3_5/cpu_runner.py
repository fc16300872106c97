"""The compiled CPU runner: one sequence, a few positions, fp32, each layer one mx.compile'd function.

Why (measured on the demo model): on MLX's CPU backend every primitive costs ~7 us to dispatch,
and mx.fast.rope / mx.fast.rms_norm run as multi-op fallbacks (~110 / ~40 us per call); a 9.7 ms
decode step held only 2.8 ms of matmuls. So each layer's few-token forward is compiled, with
RMSNorm written out so it fuses, RoPE from one cos/sin table per forward, the conv as a sum of
taps and positions taken as slices. Results agree with mlx-lm to fp32 rounding, not bit for bit.
"""
from __future__ import annotations

from typing import Callable, Dict

import mlx.core as mx
import mlx.nn as nn

from ..kernels import gdn
from . import layers
from .layers import AttnParams, GdnParams, _const
from .mlx_ops import FEW_TOKENS, MlxOps, _rms, rope_table

class CpuCompiled(MlxOps):
    """One sequence, a few positions, fp32 on MLX's CPU backend: each layer one compiled function."""

    def __init__(self, rope: nn.RoPE):
        super().__init__()
        half = rope.dims // 2
        inv_freq = _const(mx.exp(-mx.arange(half, dtype=mx.float32) * (2.0 * mx.log(mx.array(rope.base, mx.float32)) / rope.dims)))

        @mx.compile
        def table(offset, steps):
            theta = ((offset + steps).astype(mx.float32) * rope.scale)[:, None] * inv_freq
            return mx.cos(theta), mx.sin(theta)

        self._table = table
        self._aranges = [mx.arange(s, dtype=mx.int32) for s in range(FEW_TOKENS + 1)]
        mx.eval(self._aranges)
        self._compiled: Dict[tuple, Callable] = {}

    # -- primitives (traced inside the compiled functions) --------------------------------
    def norm(self, m, x):
        return _rms(x, m.weight, m.eps)

    def swiglu(self, gate, x):
        return nn.silu(gate) * x

    def conv(self, p: GdnParams, conv_input, S):
        out = conv_input[..., 0:S, :] * p.taps[0]
        for k in range(1, p.K):
            out = out + conv_input[..., k : k + S, :] * p.taps[k]
        return out

    def qk_norm(self, q, k, Dk):
        eps = 1e-6 * Dk**-1  # normalize_qk's eps, moved onto the mean as mx.fast.rms_norm does
        return _rms(q, Dk**-1, eps), _rms(k, Dk**-0.5, eps)

    def decay(self, p: GdnParams, a):
        return mx.exp(p.neg_A * nn.softplus(a + p.attn.dt_bias))

    def gated_norm(self, m, y, z):
        return _rms(y, m.weight, m.eps) * nn.silu(z)

    def recurrence(self, q, k, v, g, beta, state, mask, capture):
        return gdn.recurrence(q, k, v, g, beta, state)

    def rope(self, p: AttnParams, x, pos):
        return rope_table(p, x, *pos)

    def positions(self, offset: int, S: int):
        return self._table(mx.array(offset, dtype=mx.int32), self._aranges[S])

    def masks(self, h, fa_cache, ssm_cache):
        return None, None

    def sdpa(self, q, k, v, scale, mask, cache):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal" if q.shape[2] > 1 else None)

    # -- each layer compiled once per role ------------------------------------------------
    def enter(self, x):
        return x.reshape(x.shape[1:])  # one sequence: no batch axis (see layers.py)

    def leave(self, x):
        return x[None]

    def _fn(self, key, make):
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compiled[key] = mx.compile(make())
        return fn

    def gdn(self, p: GdnParams, h, conv_state, state, capture: bool, mask):
        def make():
            def step(x, conv_state, state):
                x, conv_input, states = layers.gdn_layer(self, p, x, conv_state.reshape(conv_state.shape[1:]),
                                                         state, capture=capture)
                if capture:
                    return (x, conv_input[None], *states)
                return x, conv_input[None, x.shape[0]:], states[-1]
            return step

        out = self._fn((id(p), "gdn", capture), make)(h, conv_state, state)
        if capture:
            return out[0], out[1][:, h.shape[0]:], list(out[2:]), out[1]
        return out[0], out[1], [out[2]], None

    def attention_in(self, p: AttnParams, x, pos):
        fn = self._fn((id(p), "in"), lambda: lambda x, cos, sin: layers.attention_in(self, p, x, (cos, sin)))
        return fn(x, *pos)

    def attention_out(self, p: AttnParams, x, o, gate, final_norm=None):
        fn = self._fn((id(p), "out", id(final_norm)),
                      lambda: lambda x, o, gate: layers.attention_out(self, p, x, o, gate, final_norm))
        return fn(x, o, gate)

    def final_norm(self, norm, h):
        return self._fn((id(norm), "norm"), lambda: lambda h: _rms(h, norm.weight, norm.eps))(h)

    def head_input(self, head, hidden, embedding):
        fn = self._fn((id(head), "head"), lambda: lambda h, e: layers.head_input(self, head, h, e))
        return fn(hidden, embedding)


class CpuCompiledBatch(CpuCompiled):
    """The compiled CPU runner over a batch axis [B, S, H]: several sequences, each at its own
    position (layers.run_trunk_batch). The same compiled math per row as `CpuCompiled`; only the
    matmuls see B times the rows, and the BLAS may sum those in another order (float32 rounding:
    bit for bit on some processors, not on others; core/exactness.py measures which at load)."""

    def __init__(self, rope: nn.RoPE):
        super().__init__(rope)
        half = rope.dims // 2
        inv_freq = _const(mx.exp(-mx.arange(half, dtype=mx.float32) * (2.0 * mx.log(mx.array(rope.base, mx.float32)) / rope.dims)))

        @mx.compile
        def table(offsets, steps):
            # offsets [B] -> cos, sin [B, 1, S, dims/2]: broadcast over the heads of q, k [B, heads, S, hd]
            theta = ((offsets[:, None] + steps).astype(mx.float32) * rope.scale)[..., None] * inv_freq
            return mx.cos(theta)[:, None], mx.sin(theta)[:, None]

        self._batch_table = table

    def positions(self, offsets, S: int):
        return self._batch_table(offsets, self._aranges[S])

    def enter(self, x):
        return x

    def leave(self, x):
        return x

    def gdn(self, p: GdnParams, h, conv_state, state, capture: bool, mask):
        def make():
            def step(x, conv_state, state):
                x, conv_input, states = layers.gdn_layer(self, p, x, conv_state, state, capture=capture)
                if capture:
                    return (x, conv_input, *states)
                return x, conv_input[:, x.shape[1]:], states[-1]
            return step

        out = self._fn((id(p), "gdn-batch", capture), make)(h, conv_state, state)
        if capture:
            return out[0], out[1][:, h.shape[1]:], list(out[2:]), out[1]
        return out[0], out[1], [out[2]], None
