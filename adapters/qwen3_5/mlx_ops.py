"""MLX's own ops as a runner of the reference layers (layers.py), and what the other runners share.

`MlxOps` supplies the primitives the reference math calls (linear, norm, conv, RoPE, recurrence,
attention) with MLX's ops in mlx-lm's order, so its results are mlx-lm's bit for bit. The
compiled CPU runner (cpu_runner.py) and the GPU kernel runners (gpu_runner.py) subclass it and
replace what they run faster. backends.py picks one at load.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.base import create_attention_mask, create_ssm_mask, scaled_dot_product_attention
from mlx_lm.models.gated_delta import compute_g, gated_delta_kernel, gated_delta_ops, normalize_qk

from ..kernels import cpu_attention, gdn
from . import layers
from .layers import AttnParams, GdnParams

FEW_TOKENS = 8  # widest few-token forward (a verify is depth + 1 <= 8)


def _rms(x, w, eps):
    return w * (x * mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True) + eps))


def _metal_kernel_fits(k: mx.array) -> bool:
    """Where mlx-lm's gated_delta_update takes its own Metal kernel."""
    return (mx.default_device() == mx.gpu and mx.metal.is_available()
            and k.shape[-1] >= 32 and k.shape[-1] % 32 == 0)


_recurrence = mx.compile(gdn.recurrence)  # a verify's positions as one graph, every state kept


def rope_table(p: AttnParams, x, cos, sin):
    """RoPE from a table: cos, sin [S, dims/2], mlx's non-traditional layout (halves)."""
    half = p.rope_dims // 2
    x1, x2, rest = x[..., :half], x[..., half : p.rope_dims], x[..., p.rope_dims :]
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


class MlxOps:
    """MLX's own ops, run eagerly: the same ops in the same order as mlx-lm's modules."""

    submit_every = 0  # layers.run_trunk: hand the device every this many layers (0: at the end)
    submit_verify_every = 0   # the same for a verify's forward (a capturing one) alone
    submit_batch_verify_every = 0   # the same for a verify of several sequences at once
    submit_batch_step_every = 0   # the same for a plain (not capturing) step of several sequences

    def __init__(self, cpu_attention: bool = False, row_invariant: bool = False):
        self.cpu_attention = cpu_attention  # long forwards on the CPU: kernels/cpu_attention.py
        self.row_invariant = row_invariant  # a GPU's few-token runner: see row_invariant_sdpa

    # -- primitives ---------------------------------------------------------------------
    def linear(self, m, x):
        return m(x)

    def linears(self, modules, x):
        """Linears that share an input, each as its own product (a GPU runner fuses them)."""
        return [self.linear(m, x) for m in modules]

    def linear_add(self, m, x, residual):
        """residual + linear(x) (a GPU runner adds inside the product's kernel)."""
        y = self.linear(m, x)
        return y if residual is None else residual + y

    def norm(self, m, x):
        return m(x)

    def swiglu(self, gate, x):
        return swiglu(gate, x)

    def dense_mlp(self, m, x, residual):
        return None  # the MLP as layers.mlp writes it out

    def conv(self, p: GdnParams, conv_input, S):
        return p.attn.conv1d(conv_input)

    def qk_norm(self, q, k, Dk):
        return normalize_qk(q, k, inv_scale=Dk**-0.5, eps=1e-6)

    def decay(self, p: GdnParams, a):
        return compute_g(p.attn.A_log, a, p.attn.dt_bias)

    def gated_norm(self, m, y, z):
        return m(y, z)

    def gdn_middle(self, p: GdnParams, xn, conv_state, state, mask):
        """A Gated-DeltaNet layer from its normed input to out_proj's input in one launch:
        (output, conv_input, states), or None where the backend has no such kernel."""
        return None

    def attention_gated(self, p: AttnParams, q, k, v, gate, cache):
        """Attention of q over the cache's keys times sigmoid(gate), laid out for o_proj, from
        one kernel; None where the backend has none (then sdpa and attention_out's gate)."""
        return None

    def attention_gated_batch(self, p: AttnParams, q, fetched, gate, caches):
        """A batch's attention_gated: sequence b's rows q[b] over its own cache's keys and values
        fetched[b], each as alone; None where a sequence has no kernel."""
        gated = [self.attention_gated(p, q[b:b + 1], k, v, gate[b:b + 1], c)
                 for b, ((k, v), c) in enumerate(zip(fetched, caches))]
        return mx.concatenate(gated) if all(g is not None for g in gated) else None

    def recurrence(self, q, k, v, g, beta, state, mask, capture):
        kernel = _metal_kernel_fits(k)
        if not capture:
            y, state = (gated_delta_kernel if kernel else gated_delta_ops)(q, k, v, g, beta, state, mask)
            return y, [state]
        if mask is None and not kernel:
            return _recurrence(q, k, v, g, beta, state)
        step = gated_delta_kernel if kernel else gated_delta_ops
        ys, states = [], []
        for t in range(q.shape[1]):
            sl = slice(t, t + 1)
            y, state = step(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], state,
                            None if mask is None else mask[:, sl])
            ys.append(y)
            states.append(state)
        return mx.concatenate(ys, axis=1), states

    def rope(self, p: AttnParams, x, offset):
        if isinstance(offset, tuple):   # a RoPE table: a chunk with a picture's multimodal positions
            return rope_table(p, x, *offset)
        if isinstance(offset, mx.array) and offset.ndim == 1 and type(p.attn.rope) is not nn.RoPE:
            # A batch at per-row positions; only mx.fast.rope (nn.RoPE) takes a vector of offsets.
            return mx.concatenate([p.attn.rope(x[b:b + 1], offset=o) for b, o in enumerate(offset.tolist())])
        return p.attn.rope(x, offset=offset)

    def positions(self, offset: int, S: int):
        return offset

    def masks(self, h, fa_cache, ssm_cache):
        return create_attention_mask(h, fa_cache), create_ssm_mask(h, ssm_cache)

    def sdpa(self, q, k, v, scale, mask, cache):
        if self.cpu_attention and isinstance(mask, (str, type(None))):
            return cpu_attention.attention(q, k, v, scale)
        if self.row_invariant:
            return row_invariant_sdpa(self._sdpa, q, k, v, scale, mask, cache)
        return self._sdpa(q, k, v, scale, mask, cache)

    @staticmethod
    def _sdpa(q, k, v, scale, mask, cache):
        return scaled_dot_product_attention(q, k, v, cache=cache, scale=scale, mask=mask)

    def lm_head(self, module, tied: bool, x):
        return module.as_linear(x) if tied else module(x)

    # -- running the reference ------------------------------------------------------------
    def enter(self, x):
        """Activations as this runner keeps them ([B, S, H] here)."""
        return x

    def leave(self, x):
        """Back to [B, S, ...]."""
        return x

    def gdn(self, p: GdnParams, h, conv_state, state, capture: bool, mask):
        """-> (h', the conv window to keep, states, conv_input when capturing)."""
        h, conv_input, states = layers.gdn_layer(self, p, h, conv_state, state, capture=capture, mask=mask)
        return h, layers.kept_window(conv_input, p.K - 1), states, (conv_input if capture else None)

    def attention_in(self, p: AttnParams, x, pos):
        return layers.attention_in(self, p, x, pos)

    def attention_out(self, p: AttnParams, x, o, gate, final_norm=None):
        return layers.attention_out(self, p, x, o, gate, final_norm)

    def final_norm(self, norm, h):
        return norm(h)

    def head_input(self, head, hidden, embedding):
        return layers.head_input(self, head, hidden, embedding)



def row_invariant_sdpa(sdpa, q, k, v, scale, mask, cache):
    """Attention of L queries computed as L one-query attentions, each over exactly the keys the
    one-token decode step at that position sees.

    Why: MLX's GPU attention over L > 1 queries reduces in another order than over one (on the
    H200 the first differing layer of a 3-token verify vs 3 decode steps was always a full-attention
    layer, max |d| 1e-3 to 3e-2 in bf16), so greedy MTP left AR's text after 38-55 tokens. The
    other ops of a verify (the row kernels, the recurrence, norms, RoPE) already compute each row
    as the decode step does. This costs L-1 more launches per attention layer."""
    L = q.shape[2]
    if L == 1 or cache is None:
        return sdpa(q, k, v, scale, mask, cache)
    S = k.shape[2]
    return mx.concatenate([sdpa(q[:, :, i:i + 1], k[:, :, :S - L + i + 1], v[:, :, :S - L + i + 1], scale, None, cache)
                           for i in range(L)], axis=2)
