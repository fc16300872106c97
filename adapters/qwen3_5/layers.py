"""The Qwen hybrid layers as reference math, written once: the Gated-DeltaNet layer with
per-position capture, gated attention with partial RoPE, the MLP (dense or routed experts)
and the MTP head's input. Qwen3.5, Qwen3.5/3.6-MoE and Qwen3-Next all run these.

Each function takes the layer's parameters (`GdnParams`, `AttnParams`: the loaded mlx-lm modules
plus what a backend prepares once) and `ops`, the backend's primitives (adapters/qwen3_5/
backends.py): how to run a linear, an RMSNorm, the depthwise conv, RoPE, the recurrence, the
scaled dot-product attention. The backends differ only in those: MLX's own ops (bit-identical
to mlx-lm's modules), the CPU-compiled backend (norms written out so that mx.compile fuses them,
RoPE from one table per forward, the conv as a sum of taps), the CUDA and Metal kernels. The
order of operations is mlx-lm's (qwen3_5.py, qwen3_next.py, gated_delta.py), so that the MLX
backend reproduces mlx-lm bit for bit.

Activations are [B, S, H]; B = 1 today, and nothing here assumes it (batched decoding later).
The batch axis may also be left out ([S, H]): the CPU-compiled backend runs one sequence so,
because MLX's matmul of a 3-D activation adds a Flatten and an Unflatten node around every
product (~100 more nodes per decode step of the demo model, ~10 % of its time).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn


def _const(x: mx.array) -> mx.array:
    # Arrays a compiled function closes over must be evaluated first: an unevaluated one
    # is traced as part of the graph and recomputed on every call.
    x = mx.contiguous(x)
    mx.eval(x)
    return x


# --------------------------------------------------------------------------- parameters
@dataclass
class MlpParams:
    """Dense SwiGLU (gate, up, down) or routed experts (router, experts, shared expert + its gate)."""

    module: nn.Module
    experts: Optional[nn.Module] = None     # mlx-lm SwitchGLU: every expert's gate/up/down stacked
    router: Optional[nn.Module] = None
    top_k: int = 0
    norm_topk: bool = True
    shared: Optional["MlpParams"] = None
    shared_gate: Optional[nn.Module] = None

    @classmethod
    def of(cls, mlp: nn.Module) -> "MlpParams":
        if hasattr(mlp, "switch_mlp"):
            return cls(mlp, experts=mlp.switch_mlp, router=mlp.gate, top_k=mlp.top_k,
                       norm_topk=bool(mlp.norm_topk_prob), shared=cls.of(mlp.shared_expert),
                       shared_gate=mlp.shared_expert_gate)
        return cls(mlp)


@dataclass
class GdnParams:
    """One Gated-DeltaNet decoder layer. `project(ops, x)` is the family's input projection:
    (qkv [B, S, C], z [B, S, Hv, Dv], b [B, S, Hv], a [B, S, Hv])."""

    layer: nn.Module
    project: Callable
    mlp: MlpParams
    taps: List[mx.array] = field(default_factory=list)  # conv tap k of every channel (CPU backend)
    neg_A: Optional[mx.array] = None                     # -exp(A_log) in fp32

    def __post_init__(self):
        at = self.attn
        self.Hk, self.Hv, self.Dk, self.Dv = at.num_k_heads, at.num_v_heads, at.head_k_dim, at.head_v_dim
        self.key_dim, self.conv_dim, self.K = at.key_dim, at.conv_dim, at.conv_kernel_size
        self.neg_A = _const(-mx.exp(at.A_log.astype(mx.float32)))
        self.taps = [_const(at.conv1d.weight[:, k, 0]) for k in range(self.K)]

    @property
    def attn(self):
        return self.layer.linear_attn


@dataclass
class AttnParams:
    """One gated full-attention decoder layer (the trunk's, or the MTP head's)."""

    layer: nn.Module
    mlp: MlpParams

    def __post_init__(self):
        at = self.attn
        self.nh, self.nkv, self.hd, self.scale = at.num_attention_heads, at.num_key_value_heads, at.head_dim, at.scale
        self.rope_dims = at.rope.dims

    @property
    def attn(self):
        return self.layer.self_attn


def separate_projections(ops, p: GdnParams, x: mx.array):
    """Qwen3.5: four projections, q|k|v already laid out as the conv expects them."""
    at = p.attn
    qkv, z, b, a = ops.linears((at.in_proj_qkv, at.in_proj_z, at.in_proj_b, at.in_proj_a), x)
    return qkv, z.reshape(*x.shape[:-1], p.Hv, p.Dv), b, a


def fused_projections(ops, p: GdnParams, x: mx.array):
    """Qwen3-Next: q|k|v|z and b|a fused, grouped per key head (mlx-lm's fix_query_key_value_ordering)."""
    at = p.attn
    lead = x.shape[:-1]
    nk, dn, nv, dv = p.Hk, p.Dk, p.Hv, p.Dv
    qkvz, ba = ops.linears((at.in_proj_qkvz, at.in_proj_ba), x)
    qkvz, ba = qkvz.reshape(*lead, nk, -1), ba.reshape(*lead, nk, -1)
    q, k, v, z = mx.split(qkvz, [dn, 2 * dn, 2 * dn + nv // nk * dv], axis=-1)
    b, a = mx.split(ba, [nv // nk], axis=-1)
    qkv = mx.concatenate([q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1)], axis=-1)
    return qkv, z.reshape(*lead, -1, dv), b.reshape(*lead, nv), a.reshape(*lead, nv)


# --------------------------------------------------------------------------- the MLP
def mlp(ops, p: MlpParams, x: mx.array, residual: Optional[mx.array] = None) -> mx.array:
    """SwiGLU MLP, or routed experts: softmax router, top-k, renormalised scores, the chosen
    experts' SwiGLU, plus a shared expert scaled by its sigmoid gate; `residual` + that."""
    if p.experts is None:
        m = p.module
        fused = ops.dense_mlp(m, x, residual)  # a backend's kernels for it (the activation inside down_proj), or None
        if fused is not None:
            return fused
        gate, up = ops.linears((m.gate_proj, m.up_proj), x)
        return ops.linear_add(m.down_proj, ops.swiglu(gate, up), residual)
    gates = mx.softmax(ops.linear(p.router, x), axis=-1, precise=True)
    inds = mx.argpartition(gates, kth=-p.top_k, axis=-1)[..., -p.top_k:]
    scores = mx.take_along_axis(gates, inds, axis=-1)
    if p.norm_topk:
        scores = scores / scores.sum(axis=-1, keepdims=True)
    y = (p.experts(x, inds) * scores[..., None]).sum(axis=-2)
    y = y + mx.sigmoid(ops.linear(p.shared_gate, x)) * mlp(ops, p.shared, x)
    return y if residual is None else residual + y


def residual_mlp(ops, layer: nn.Module, p: MlpParams, h: mx.array) -> mx.array:
    return mlp(ops, p, ops.norm(layer.post_attention_layernorm, h), residual=h)


# --------------------------------------------------------------------------- Gated-DeltaNet
def gdn_layer(ops, p: GdnParams, x: mx.array, conv_state: mx.array, state: mx.array, *,
              capture: bool, mask=None) -> Tuple[mx.array, mx.array, List[mx.array]]:
    """One Gated-DeltaNet decoder layer on x [B, S, H] from (conv window [B, K-1, C], recurrent
    state [B, Hv, Dv, Dk] fp32); without the batch axis, x [S, H] and conv window [K-1, C].

    Returns (x', conv_input [B, K-1+S, C], states): the recurrent state after each of the S
    positions when capturing (the conv window after keeping k positions is then
    conv_input[:, k:k+K-1]), else only the last. Keeping every position's state is what lets
    a partial acceptance commit without replaying tokens."""
    at = p.attn
    lead, S = x.shape[:-1], x.shape[-2]
    xn = ops.norm(p.layer.input_layernorm, x)
    fused = ops.gdn_middle(p, xn, conv_state, state, mask)  # a backend's one-launch middle, or None
    if fused is not None:
        o, conv_input, states = fused
    else:
        qkv, z, b, a = p.project(ops, p, xn)
        if mask is not None:
            qkv = mx.where(mask[..., None], qkv, 0)
        conv_input = mx.concatenate([conv_state, qkv], axis=-2)
        conv = nn.silu(ops.conv(p, conv_input, S))
        q, k, v = mx.split(conv, [p.key_dim, 2 * p.key_dim], axis=-1)
        q, k = ops.qk_norm(q.reshape(*lead, p.Hk, p.Dk), k.reshape(*lead, p.Hk, p.Dk), p.Dk)
        beta, g = mx.sigmoid(b), ops.decay(p, a)
        y, states = ops.recurrence(q, k, v.reshape(*lead, p.Hv, p.Dv), g, beta, state, mask, capture)
        o = ops.gated_norm(at.norm, y, z).reshape(*lead, -1)
    h = ops.linear_add(at.out_proj, o, x)
    return residual_mlp(ops, p.layer, p.mlp, h), conv_input, states


def kept_window(conv_input: mx.array, n: int, start: Optional[int] = None) -> mx.array:
    """The conv window a cache keeps: rows start .. start + n of conv_input [..., K-1+T, C] (the last n
    when start is None). A view, not mx.contiguous: MLX copies a slice more than 16 KB smaller than its
    buffer, which at the 9B shape (3 rows of 8,192 bf16 channels) is every verify of 2 positions or
    more, 24 copies a step. One sequence's window is whole rows, row-contiguous as it lies, so the
    kernels read it in place; the values are the same bits either way."""
    start = conv_input.shape[-2] - n if start is None else start
    return conv_input[..., start:start + n, :]


# --------------------------------------------------------------------------- attention
def attention_in(ops, p: AttnParams, x: mx.array, pos) -> Tuple[mx.array, mx.array, mx.array, mx.array]:
    """Input norm, projections, q/k norms and partial RoPE at positions `pos` (the backend's):
    x [B, L, H] -> q [B, nh, L, hd], k, v [B, nkv, L, hd] (as the KV cache keeps them, B = 1
    when x has no batch axis), the output gate [B, L, nh * hd]."""
    at = p.attn
    lead = x.shape[:-1]
    xn = ops.norm(p.layer.input_layernorm, x)
    q, k, v = ops.linears((at.q_proj, at.k_proj, at.v_proj), xn)
    q, gate = mx.split(q.reshape(*lead, p.nh, -1), 2, axis=-1)
    q = _heads(ops.norm(at.q_norm, q))
    k = _heads(ops.norm(at.k_norm, k.reshape(*lead, p.nkv, -1)))
    v = _heads(v.reshape(*lead, p.nkv, -1))
    return ops.rope(p, q, pos), ops.rope(p, k, pos), v, gate.reshape(*lead, -1)


def _heads(t: mx.array) -> mx.array:
    """[B, L, heads, hd] -> [B, heads, L, hd]; [L, heads, hd] -> [1, heads, L, hd]."""
    return t.transpose(0, 2, 1, 3) if t.ndim == 4 else t.transpose(1, 0, 2)[None]


def attention_out(ops, p: AttnParams, x: mx.array, o: mx.array, gate: Optional[mx.array],
                  final_norm: Optional[nn.Module] = None) -> mx.array:
    """Gated output projection, residual, MLP; then `final_norm` if given (the head ends in one).
    `gate` None: o is already gated and laid out as o_proj reads it (ops.attention_gated)."""
    if gate is not None:
        o = o.transpose(0, 2, 1, 3).reshape(*x.shape[:-1], -1) * mx.sigmoid(gate)
    h = residual_mlp(ops, p.layer, p.mlp, ops.linear_add(p.attn.o_proj, o, x))
    return h if final_norm is None else ops.norm(final_norm, h)


# --------------------------------------------------------------------------- the MTP head
def head_input(ops, head: nn.Module, hidden: mx.array, embedding: mx.array) -> mx.array:
    """fc(concat(norm(embedding of t[n+1]), norm(trunk hidden at n))), in the checkpoint's order."""
    e = ops.norm(head.pre_fc_norm_embedding, embedding)
    h = ops.norm(head.pre_fc_norm_hidden, hidden)
    return ops.linear(head.fc, mx.concatenate([e, h] if head.embedding_first else [h, e], axis=-1))


# --------------------------------------------------------------------------- whole forwards
@dataclass
class Stack:
    """The trunk as the backends run it: its layers' parameters and its cache kinds."""

    layers: List[Any]            # GdnParams or AttnParams, one per trunk layer
    fa_idx: Optional[int]        # first attention layer (its cache makes the attention mask)
    ssm_idx: Optional[int]       # first Gated-DeltaNet layer (None: a pipeline stage without one)


def run_trunk(run, stack: Stack, h: mx.array, cache: list, capture: bool, delta: int = 0,
              pos=None) -> Tuple[mx.array, Dict[int, tuple]]:
    """h [B, S, H] (or [S, H]) embeddings through every layer with `run` (a backend's runner),
    updating the cache; returns the last hidden (before the final norm) and, when capturing, per
    Gated-DeltaNet layer (conv_input [B, K-1+S, C], states). Positions are the cache's offset plus
    `delta` (the rope delta after a picture), or `pos` when given (a RoPE table (cos, sin): a
    chunk with a picture's multimodal positions)."""
    S = h.shape[-2]
    fa_mask, ssm_mask = run.masks(h, None if stack.fa_idx is None else cache[stack.fa_idx],
                                  None if stack.ssm_idx is None else cache[stack.ssm_idx])
    captured = {}
    for i, (p, c) in enumerate(zip(stack.layers, cache)):
        if isinstance(p, GdnParams):
            B = h.shape[0] if h.ndim == 3 else 1
            if c[0] is None:
                c[0] = mx.zeros((B, p.K - 1, p.conv_dim), dtype=h.dtype)
            if c[1] is None:
                c[1] = mx.zeros((B, p.Hv, p.Dv, p.Dk), dtype=mx.float32)
            h, c[0], states, conv_input = run.gdn(p, h, c[0], c[1], capture, ssm_mask)
            c[1] = states[-1]
            c.stacked = None   # a batch's note (keep_stacked) is stale now: let its arrays go
            c.advance(S)
            if capture:
                captured[i] = (conv_input, states)
        else:
            if pos is None:  # every attention layer of one forward is at the same positions
                pos = run.positions(c.offset + delta, S)
            h = attend(run, p, h, c, pos, fa_mask)
        _submit(run, h, i, len(stack.layers), capture)
    return h, captured


def _submit(run, h: mx.array, i: int, n: int, capture: bool = False, batch: bool = False) -> None:
    """Start the device on the layers built so far (a backend's `submit_every`, for a verify its
    `submit_verify_every`, for a verify of several sequences `submit_batch_verify_every`, for a
    plain step of several `submit_batch_step_every`): values are the same, the host's graph
    building overlaps the device's work instead of preceding it."""
    every = run.submit_every or (run.submit_verify_every if capture else 0) or (
        (run.submit_batch_verify_every if capture else run.submit_batch_step_every) if batch else 0)
    if every and (i + 1) % every == 0 and i + 1 < n:
        mx.async_eval(h)


def attend(run, p: AttnParams, x: mx.array, cache, pos, mask, final_norm=None) -> mx.array:
    """One attention layer around its KV cache (the cache update cannot sit inside a compiled
    function, so the layer runs as two halves with the update and the attention between)."""
    q, k, v, gate = run.attention_in(p, x, pos)
    k, v = cache.update_and_fetch(k, v)
    gated = run.attention_gated(p, q, k, v, gate, cache)  # a backend's one kernel for it, or None
    if gated is not None:
        return run.attention_out(p, x, gated, None, final_norm)
    return run.attention_out(p, x, run.sdpa(q, k, v, p.scale, mask, cache), gate, final_norm)


def run_trunk_batch(run, stack: Stack, h: mx.array, caches: List[list], capture: bool, deltas=None
                    ) -> Tuple[mx.array, Dict[int, tuple]]:
    """Several sequences, each with its own cache, through the trunk in one pass: h [B, S, H].

    Every linear sees all B rows (the weights are read once for the batch). A Gated-DeltaNet
    layer runs on the sequences' states stacked along B, which are written back row by row (and
    reused stacked by the next plain step of the same sequences: _stacked_states). An
    attention layer ropes each row at its own position, then attends each row over its own KV
    cache: no padding and no shared buffer, so a sequence joins, leaves or rolls back alone.
    Returns the last hidden and, when capturing, per Gated-DeltaNet layer the batch's stacked
    (conv_input [B, K-1+S, C], the states [B, ...] after each position): `run_trunk`'s capture
    for all rows at once (row b of each is sequence b's)."""
    S = h.shape[1]
    captured: Dict[int, tuple] = {}
    pos, several = None, len(caches) > 1
    for i, p in enumerate(stack.layers):
        cs = [c[i] for c in caches]
        if isinstance(p, GdnParams):
            conv, state = _stacked_states(p, cs, h.dtype)
            h, conv_keep, states, conv_input = run.gdn(p, h, conv, state, capture, None)
            # Rows as views, one Split a batch rather than a Slice a row: the host builds fewer
            # primitives each step (what grows with B: scripts/bench/batch_graph.py).
            written = rows(conv_keep), rows(states[-1])
            for b, c in enumerate(cs):
                c[0], c[1] = written[0][b], written[1][b]
                c.advance(S)
            if capture:   # stacked, for the batch: a rollback takes rows out of them (the adapter's)
                captured[i] = (conv_input, states)
            # A verify's too: where every sequence keeps all its positions (nothing rolled back), the
            # next step starts from them; a rollback_batch notes its own, a rollback drops it.
            keep_stacked(cs, (conv_keep, states[-1]))
        else:
            if pos is None:
                pos = run.positions(mx.array([c.offset + (deltas[b] if deltas else 0) for b, c in enumerate(cs)],
                                             dtype=mx.int32), S)
            h = attend_batch(run, p, h, cs, pos)
        _submit(run, h, i, len(stack.layers), capture, batch=several)
    return h, captured


def attend_batch(run, p: AttnParams, x: mx.array, caches: list, pos, final_norm=None) -> mx.array:
    """`attend` for several sequences: x [B, S, H], caches[b] the b-th one's KV cache, pos their
    positions (the backend's, from a vector of offsets). The projections see all B rows; each row
    is roped at its own position and attends over its own cache."""
    S = x.shape[1]
    q, k, v, gate = run.attention_in(p, x, pos)
    fetched = [c.update_and_fetch(kb, vb) for kb, vb, c in zip(rows(k), rows(v), caches)]
    # Each sequence as `attend` runs it alone: the backend's one kernel (its support depends
    # only on shapes every sequence shares), else attention over its own cache, then the gate.
    gated = run.attention_gated_batch(p, q, fetched, gate, caches)
    if gated is not None:
        return run.attention_out(p, x, gated, None, final_norm)
    outs = [run.sdpa(q[b:b + 1], kb, vb, p.scale, "causal" if S > 1 else None, caches[b])
            for b, (kb, vb) in enumerate(fetched)]
    return run.attention_out(p, x, mx.concatenate(outs), gate, final_norm)


def rows(x: mx.array) -> List[mx.array]:
    """x [B, ...] -> its B rows [1, ...], views of x."""
    return mx.split(x, x.shape[0]) if x.shape[0] > 1 else [x]


def _stacked_states(p: GdnParams, cs: list, dtype) -> Tuple[mx.array, mx.array]:
    """The batch's conv windows [B, K-1, C] and recurrent states [B, Hv, Dv, Dk] for one
    Gated-DeltaNet layer: the stacked arrays the step before wrote back from, when every cache
    still holds exactly the rows written into it (the same sequences in the same order, nothing
    rolled back or restored since), else the caches' own concatenated.

    Why: a batch's plain step concatenated and copied every layer's states to stack them again
    (two launches a layer) although they were the rows of last step's arrays. Row b of the
    stacked array is the very view cache b holds, so the step computes what it computed."""
    stacked = getattr(cs[0], "stacked", None)
    if stacked is not None and stacked[0].shape[0] == len(cs) and all(
            getattr(c, "stacked", None) is not None and c.stacked[0] is stacked[0] and c.stacked[2] == b
            and c[0] is c.stacked[3] and c[1] is c.stacked[4] for b, c in enumerate(cs)):
        return stacked[0], stacked[1]
    conv = mx.concatenate([mx.zeros((1, p.K - 1, p.conv_dim), dtype=dtype) if c[0] is None else c[0] for c in cs])
    state = mx.concatenate([mx.zeros((1, p.Hv, p.Dv, p.Dk), dtype=mx.float32) if c[1] is None else c[1] for c in cs])
    return conv, state


def keep_stacked(cs: list, arrays: Tuple[mx.array, mx.array]) -> None:
    """Note on each cache the stacked arrays its rows were just written from. While the cache
    holds those rows the note costs no memory (they are views of its arrays); a forward of the
    sequence alone (run_trunk) or a rollback that drops positions (the adapter's) drops it."""
    for b, c in enumerate(cs):
        c.stacked = (*arrays, b, c[0], c[1])
