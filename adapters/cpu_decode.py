"""Few-token forwards (decode steps and verifies) of the Qwen3.5 trunk and MTP head on the CPU.

Why this exists: on MLX's CPU backend every primitive costs ~7 us to dispatch, and
mx.fast.rope / mx.fast.rms_norm run as multi-op fallbacks (~110 / ~40 us per call). On the
demo model a 9.7 ms decode step held only 2.8 ms of matmuls; the rest was dispatch. Here
each decoder layer is one mx.compile'd function over 2-D activations [S, H]: RMSNorm written
out so it fuses, RoPE from one cos/sin table per forward, positions taken as slices. (Fusing
the projections that share an input into one matmul was measured slower: OpenBLAS's 3-row
products cost twice the 2-row ones, and more so for wide matrices.)

The arithmetic is mlx-lm's (qwen3_5.py, qwen3_next.py, gated_delta.py); results agree with it
to float32 rounding (~1e-6), not bit for bit. Prompts longer than MAX_TOKENS go through
mlx-lm's own modules instead: compiling an S-step recurrence only pays for small S.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

MAX_TOKENS = 8  # widest few-token forward served here (a verify is depth + 1 <= 8)


def _rms(x, w, eps):
    return w * (x * mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True) + eps))


def _const(x: mx.array) -> mx.array:
    # Arrays a compiled function closes over must be evaluated first: an unevaluated one
    # is traced as part of the graph and recomputed on every call.
    x = mx.contiguous(x)
    mx.eval(x)
    return x


def _mlp(mlp, norm_w, eps):
    """post-attention norm + SwiGLU MLP."""
    w_gate, w_up, w_down = mlp.gate_proj.weight_t, mlp.up_proj.weight_t, mlp.down_proj.weight_t

    def run(h):
        hn = _rms(h, norm_w, eps)
        return h + (nn.silu(hn @ w_gate) * (hn @ w_up)) @ w_down

    return run


def _gdn_layer(layer, capture: bool) -> Callable:
    """One Gated-DeltaNet decoder layer: (x [S, H], conv_state, state) -> (x', conv window, state),
    or with capture (x', conv input, the state after every position, state)."""
    at = layer.linear_attn
    Hk, Hv, Dk, Dv = at.num_k_heads, at.num_v_heads, at.head_k_dim, at.head_v_dim
    kd, conv_dim, nk = at.key_dim, at.conv_dim, at.conv_kernel_size - 1
    w_qkv, w_z, w_b, w_a = at.in_proj_qkv.weight_t, at.in_proj_z.weight_t, at.in_proj_b.weight_t, at.in_proj_a.weight_t
    w_taps = [_const(at.conv1d.weight[:, k, 0]) for k in range(nk + 1)]  # tap k of every channel
    w_out, norm_w, gate_norm_w = at.out_proj.weight_t, layer.input_layernorm.weight, at.norm.weight
    eps, gate_eps = layer.input_layernorm.eps, at.norm.eps
    neg_A = _const(-mx.exp(at.A_log.astype(mx.float32)))
    dt_bias = at.dt_bias
    mlp = _mlp(layer.mlp, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)
    qk_eps = 1e-6 * Dk**-1  # normalize_qk's eps, moved onto the mean as mx.fast.rms_norm does

    # Positions are taken with t:t+1 slices (views), never x[t]: an integer index is a Gather
    # kernel on the CPU, and there were ~70 of them per decode step.
    def step(x, conv_state, state):
        S = x.shape[0]
        xn = _rms(x, norm_w, eps)
        qkv, z, b, a = xn @ w_qkv, xn @ w_z, xn @ w_b, xn @ w_a
        conv_input = mx.concatenate([conv_state.reshape(nk, conv_dim), qkv], axis=0)  # [nk + S, C]
        conv = conv_input[0:S] * w_taps[0]
        for k in range(1, nk + 1):
            conv = conv + conv_input[k : k + S] * w_taps[k]
        conv = nn.silu(conv)
        q = conv[:, :kd].reshape(S, Hk, Dk)
        k_ = conv[:, kd : 2 * kd].reshape(S, Hk, Dk)
        v = conv[:, 2 * kd :].reshape(S, Hv, 1, Dv)
        q, k_ = _rms(q, Dk**-1, qk_eps), _rms(k_, Dk**-0.5, qk_eps)  # normalize_qk: 1/Dk on q, 1/sqrt(Dk) on k
        if Hv > Hk:
            q, k_ = mx.repeat(q, Hv // Hk, axis=1), mx.repeat(k_, Hv // Hk, axis=1)
        q, k_ = q.reshape(S, Hv, 1, Dk), k_.reshape(S, Hv, 1, Dk)
        beta = mx.sigmoid(b).reshape(S, Hv, 1, 1)
        g = mx.exp(neg_A * nn.softplus(a + dt_bias)).reshape(S, Hv, 1, 1)
        st = state  # [1, Hv, Dv, Dk]
        ys, states = [], []
        for t in range(S):  # (batched matmuls would be fewer ops but cost 3x more here)
            st = st * g[t : t + 1]
            kv_mem = (st * k_[t : t + 1]).sum(axis=-1, keepdims=True)  # [1, Hv, Dv, 1]
            delta = (v[t : t + 1].swapaxes(-1, -2) - kv_mem) * beta[t : t + 1]
            st = st + k_[t : t + 1] * delta
            ys.append((st * q[t : t + 1]).sum(axis=-1))
            states.append(st)
        y = mx.concatenate(ys)  # [S, Hv, Dv]
        gated = _rms(y, gate_norm_w, gate_eps) * nn.silu(z.reshape(S, Hv, Dv))
        h = x + gated.reshape(S, Hv * Dv) @ w_out
        h = mlp(h)
        if capture:
            return h, conv_input[None], mx.stack(states), st
        return h, conv_input[None, S:], st

    return step


def _attention_parts(layer, attn, final_norm=None) -> Tuple[Callable, Callable]:
    """A full-attention layer around its KV cache: pre (norm, q|k|v, q/k norms, RoPE) and post
    (gated o_proj, MLP, then `final_norm` if given: the MTP head ends in one)."""
    nh, nkv, hd = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
    w_q, w_k, w_v = attn.q_proj.weight_t, attn.k_proj.weight_t, attn.v_proj.weight_t
    w_o, norm_w, eps = attn.o_proj.weight_t, layer.input_layernorm.weight, layer.input_layernorm.eps
    qn, kn, qk_eps = attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps
    rot = attn.rope.dims
    mlp = _mlp(layer.mlp, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)

    def rope(x, cos, sin):  # x [S, heads, hd]; mlx's non-traditional layout (halves)
        half = rot // 2
        x1, x2, rest = x[..., :half], x[..., half:rot], x[..., rot:]
        return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)

    def pre(x, cos, sin):
        S = x.shape[0]
        xn = _rms(x, norm_w, eps)
        qg = (xn @ w_q).reshape(S, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(S, nh * hd)
        k = (xn @ w_k).reshape(S, nkv, hd)
        v = (xn @ w_v).reshape(S, nkv, hd)
        q, k = rope(_rms(q, qn, qk_eps), cos, sin), rope(_rms(k, kn, qk_eps), cos, sin)
        heads = lambda t: t.transpose(1, 0, 2)[None]  # [1, heads, S, hd] as KVCache keeps them
        return heads(q), heads(k), heads(v), gate

    def post(x, o, gate):
        S = x.shape[0]
        o = o.reshape(nh, S, hd).transpose(1, 0, 2).reshape(S, nh * hd)
        x = mlp(x + (o * mx.sigmoid(gate)) @ w_o)
        return x if final_norm is None else _rms(x, final_norm.weight, final_norm.eps)

    return mx.compile(pre), mx.compile(post)


def _rope_table(attn) -> Callable:
    """cos, sin [S, 1, dims/2] for positions offset..offset+S-1, shared by every layer."""
    rope = attn.rope
    half = rope.dims // 2
    inv_freq = _const(mx.exp(-mx.arange(half, dtype=mx.float32) * (2.0 * mx.log(mx.array(rope.base, mx.float32)) / rope.dims)))

    @mx.compile
    def table(offset, steps):
        theta = ((offset + steps).astype(mx.float32) * rope.scale)[:, None] * inv_freq
        return mx.cos(theta)[:, None, :], mx.sin(theta)[:, None, :]

    return table


class CpuDecode:
    """The compiled per-layer functions of one loaded model; see the module docstring."""

    def __init__(self, model, head):
        inner = model.language_model.model
        self.layers = inner.layers
        self.steps: List[Tuple] = [
            (mx.compile(_gdn_layer(layer, False)), mx.compile(_gdn_layer(layer, True))) if layer.is_linear
            else _attention_parts(layer, layer.self_attn)
            for layer in self.layers
        ]
        self.head_parts = _attention_parts(head.layers[0], head.layers[0].self_attn, final_norm=head.norm)
        # The head's attention layer is built from the trunk's arguments: one RoPE for both.
        self.table = _rope_table(head.layers[0].self_attn)
        self._aranges = [mx.arange(s, dtype=mx.int32) for s in range(MAX_TOKENS + 1)]
        mx.eval(self._aranges)
        self._head = head
        self._head_in = mx.compile(self._head_input)
        norm = inner.norm
        self._final_norm = mx.compile(lambda h: _rms(h, norm.weight, norm.eps))

    def _head_input(self, hidden, embedding):
        hd = self._head
        e = _rms(embedding, hd.pre_fc_norm_embedding.weight, hd.pre_fc_norm_embedding.eps)
        h = _rms(hidden, hd.pre_fc_norm_hidden.weight, hd.pre_fc_norm_hidden.eps)
        return hd.fc(mx.concatenate([e, h] if hd.embedding_first else [h, e], axis=-1))

    def trunk(self, x: mx.array, cache: list, capture: bool) -> Tuple[mx.array, mx.array, Optional[dict]]:
        """x [S, H] embeddings -> (last hidden before the trunk norm, after it, captured GDN state)."""
        S = x.shape[0]
        cos_sin = None
        captured = {} if capture else None
        for i, (layer, c, fns) in enumerate(zip(self.layers, cache, self.steps)):
            if layer.is_linear:
                at = layer.linear_attn
                if c[0] is None:
                    c[0] = mx.zeros((1, at.conv_kernel_size - 1, at.conv_dim), dtype=x.dtype)
                    c[1] = mx.zeros((1, at.num_v_heads, at.head_v_dim, at.head_k_dim), dtype=mx.float32)
                if capture:
                    x, conv_input, states, c[1] = fns[1](x, c[0], c[1])
                    captured[i] = (conv_input, states)
                    c[0] = conv_input[:, S:]
                else:
                    x, c[0], c[1] = fns[0](x, c[0], c[1])
                c.advance(S)
            else:
                if cos_sin is None:
                    cos_sin = self.table(mx.array(c.offset, dtype=mx.int32), self._aranges[S])
                x = self._attend(fns, x, c, cos_sin, layer.self_attn.scale)
        return x, self._final_norm(x), captured

    def head(self, hidden: mx.array, embedding: mx.array, cache) -> mx.array:
        """MTP head, hidden/embedding [S, H] -> g = norm(layer(fc(...))) [S, H]."""
        x = self._head_in(hidden, embedding)
        cos_sin = self.table(mx.array(cache.offset, dtype=mx.int32), self._aranges[x.shape[0]])
        return self._attend(self.head_parts, x, cache, cos_sin, self._head.layers[0].self_attn.scale)

    @staticmethod
    def _attend(parts, x, cache, cos_sin, scale):
        pre, post = parts
        q, k, v, gate = pre(x, *cos_sin)
        k, v = cache.update_and_fetch(k, v)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal" if x.shape[0] > 1 else None)
        return post(x, o, gate)
