"""Qwen3.5 / Qwythos: trunk through mlx-lm, MTP head from the `optiq/mtp.safetensors` sidecar.

The engine sees a small surface: forward (logits + trunk hidden, optionally capturing the
per-position Gated-DeltaNet state), rollback (keep the first k verified positions), and the
MTP head forward with its own KV cache.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.models.gated_delta import compute_g, gated_delta_kernel, gated_delta_ops, normalize_qk
from mlx_lm.models.qwen3_5 import TextModelArgs

from . import cpu_decode, cpu_prefill, gpu_decode, sidecar
from .checkpoint import text_config
from .contract import MTPContract
from .cpu_layout import to_row_major
from core.model import State
from .errors import CheckpointError
from .mtp_head import build_mtp_head

MODEL_TYPES = ("qwen3_5",)
# Qwythos default: the MLX-MTP reference validated pre-norm hidden states against MTPLX.
DEFAULT_HIDDEN_VARIANT = "pre_norm"
DEFAULT_CONCAT_ORDER = "embedding_hidden"


@dataclass
class Captured:
    """What a verify pass keeps so that any prefix of it can be committed without a replay."""

    width: int
    # per Gated-DeltaNet layer index: (conv_input [B, K-1+T, C], state after each position)
    gdn: dict = field(default_factory=dict)


class Qwen35Adapter:
    family = "qwen3_5"

    def __init__(self, path: Path, model, tokenizer, config: dict, contract: MTPContract, head, compute_dtype):
        self.path = path
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.contract = contract
        self.head = head
        self.compute_dtype = compute_dtype
        self.inner = model.language_model.model
        self._tied = model.language_model.args.tie_word_embeddings
        # A row-major copy of the tied table for the output projection (see cpu_layout).
        self._head_t = (
            mx.contiguous(self.inner.embed_tokens.weight.T)
            if self._tied and compute_dtype == "float32" and mx.default_device() == mx.cpu
            else None
        )
        self._pre_norm = contract.hidden_variant == "pre_norm"
        # Few-token forwards on the CPU: one compiled function per layer (see cpu_decode).
        self._fast = (
            cpu_decode.CpuDecode(model, head)
            if compute_dtype == "float32" and mx.default_device() == mx.cpu
            and os.environ.get("MTP_CHAT_COMPILED", "1") != "0"
            else None
        )
        # Few-token forwards on a GPU: the custom kernels where they apply (see gpu_decode).
        self._gpu = gpu_decode.attach(model, head) if compute_dtype != "float32" else None

    def _few_tokens(self, shape) -> bool:
        """One sequence of at most cpu_decode.MAX_TOKENS positions, and the compiled path is on."""
        return self._fast is not None and shape[0] == 1 and shape[1] <= cpu_decode.MAX_TOKENS

    # -- caches -------------------------------------------------------------------------
    def make_cache(self) -> list:
        return self.model.make_cache()

    def make_mtp_cache(self) -> KVCache:
        return KVCache()

    def make_draft(self, cache: list) -> KVCache:
        """The MTP head's own KV history (positions it has seen, from the trunk's hidden states)."""
        return KVCache()

    def state_arrays(self, cache: list, draft: Optional[KVCache]) -> list:
        return [c.state for c in cache] + ([draft.state] if draft is not None else [])

    @property
    def context_length(self) -> int:
        return int(text_config(self.config).get("max_position_embeddings") or 4096)

    # -- trunk ----------------------------------------------------------------------------
    @gpu_decode.kernels_on
    def lm_head(self, x: mx.array) -> mx.array:
        if self._head_t is not None:
            return x @ self._head_t
        if self._tied:
            return self.inner.embed_tokens.as_linear(x)
        return self.model.language_model.lm_head(x)

    @gpu_decode.kernels_on
    def forward(
        self, tokens: mx.array, cache: list, *, all_logits: bool = True, capture: bool = False,
        fast: bool = True,
    ) -> Tuple[mx.array, mx.array, Optional[Captured]]:
        """tokens [1, T] -> logits [1, T or 1, V], hidden [1, T, H] (the contract's variant).

        fast=False keeps mlx-lm's modules even for a few tokens: prefill does, so that a prompt
        gives the same state however it is split into chunks (prefix cache or not)."""
        inner = self.inner
        h = inner.embed_tokens(tokens)
        if fast and self._few_tokens(tokens.shape):
            h, post, gdn = self._fast.trunk(h.reshape(h.shape[1:]), cache, capture)
            logits = self.lm_head(post if all_logits else post[-1:])[None]
            captured = Captured(width=tokens.shape[1], gdn=gdn) if capture else None
            return logits, (h if self._pre_norm else post)[None], captured
        fa_mask = create_attention_mask(h, cache[inner.fa_idx])
        ssm_mask = create_ssm_mask(h, cache[inner.ssm_idx])
        captured = Captured(width=tokens.shape[1]) if capture else None
        # On a GPU with the kernels on, decode steps take the capturing path too: one kernel for
        # the recurrence, the same numerics as a verify.
        steps = capture or (fast and self._gpu is not None and tokens.shape[1] <= gpu_decode.gpu_kernels.GDN_MAX_T)
        for i, (layer, c) in enumerate(zip(inner.layers, cache)):
            if steps and layer.is_linear:
                r, kept = _gdn_capturing(layer.linear_attn, layer.input_layernorm(h), ssm_mask, c, self._gpu)
                if capture:
                    captured.gdn[i] = kept
                h = h + r
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            elif self._fast is not None and not layer.is_linear and fa_mask in (None, "causal"):
                h = cpu_prefill.attention_layer(layer, h, c)  # long forwards on the CPU (see cpu_prefill)
            else:
                h = layer(h, mask=ssm_mask if layer.is_linear else fa_mask, cache=c)
        post = inner.norm(h)
        logits = self.lm_head(post if all_logits else post[:, -1:])
        return logits, (h if self._pre_norm else post), captured

    def rollback(self, cache: list, captured: Captured, keep: int) -> None:
        """Commit only the first `keep` positions of a captured verify pass."""
        drop = captured.width - keep
        if drop == 0:
            captured.gdn.clear()
            return
        for i, c in enumerate(cache):
            if i in captured.gdn:
                conv_input, states = captured.gdn[i]
                n_keep = conv_input.shape[1] - captured.width
                c[0] = mx.contiguous(conv_input[:, keep : keep + n_keep])
                c[1] = states[keep - 1]
            else:
                c.trim(drop)
        # The states not kept go now: a caller's reference to `captured` lives into the next
        # verify, and would hold every position's state through it (peak memory, issue 14).
        captured.gdn.clear()

    # -- MTP head -------------------------------------------------------------------------
    @gpu_decode.kernels_on
    def mtp_forward(self, hidden: mx.array, next_tokens: mx.array, mtp_cache: KVCache, *, fast: bool = True) -> mx.array:
        """hidden [1, T, H] at positions n, next_tokens [1, T] = t[n+1] -> g [1, T, H].

        lm_head(g) predicts t[n+2]; g is also what depth > 1 feeds back as its hidden.
        """
        embedding = self.inner.embed_tokens(next_tokens)
        if fast and self._few_tokens(hidden.shape):
            return self._fast.head(hidden.reshape(hidden.shape[1:]), embedding.reshape(embedding.shape[1:]), mtp_cache)[None]
        return self.head(hidden, embedding, mtp_cache,
                         attend=cpu_prefill.attention_layer if self._fast is not None else None)

    def absorb(self, draft: KVCache, cache: list, hidden: mx.array, tokens: mx.array) -> None:
        self.mtp_forward(hidden, tokens, draft, fast=False)

    def draft_step(self, draft: KVCache, cache: list, hidden: mx.array, tokens: mx.array):
        g = self.mtp_forward(hidden, tokens, draft)[:, -1:]
        return g, self.lm_head(g)[:, -1]

    def end_cycle(self, draft: KVCache, steps: int) -> None:
        # The first step's entries are for committed positions; the other steps' are drafts.
        draft.trim(steps - 1)

    # -- prefix-cache snapshots ------------------------------------------------------------
    def snapshot(self, cache: list, draft: KVCache) -> State:
        """Attention KV buffers with their lengths, GDN conv windows and recurrent states, the
        head's KV history: references to the caches' own arrays."""
        arrays, meta = {}, {}

        def kv(name, c):
            meta[name + ".keys.length"] = meta[name + ".values.length"] = c.offset
            if c.keys is not None:
                arrays[name + ".keys"], arrays[name + ".values"] = c.keys, c.values

        for i, c in enumerate(cache):
            if isinstance(c, KVCache):
                kv(f"trunk.{i}", c)
            else:
                for j, part in enumerate(("conv", "state")):
                    if c[j] is not None:
                        arrays[f"trunk.{i}.{part}"] = c[j]
        kv("draft", draft)
        return State(arrays, meta)

    def restore(self, state: State, cache: list, draft: KVCache) -> None:
        a, meta = state.arrays, state.meta
        for i, c in enumerate(cache):
            if isinstance(c, KVCache):
                c.keys, c.values, c.offset = a.get(f"trunk.{i}.keys"), a.get(f"trunk.{i}.values"), meta[f"trunk.{i}.keys.length"]
            else:
                c[0], c[1] = a.get(f"trunk.{i}.conv"), a.get(f"trunk.{i}.state")
        draft.keys, draft.values, draft.offset = a.get("draft.keys"), a.get("draft.values"), meta["draft.keys.length"]

    def describe(self) -> str:
        c = self.contract
        q = c.trunk_quantization
        trunk = f"{q['bits']}-bit trunk" if q else "float trunk"
        mq = c.mtp_quantization
        head = f"{mq['bits']}-bit MTP head" if mq else "float MTP head"
        return (
            f"{self.path.name} (qwen3_5): {c.num_layers} layers "
            f"({c.layer_kinds.count('linear')} Gated-DeltaNet + {c.layer_kinds.count('full')} attention), "
            f"hidden {c.hidden_size}, vocab {c.vocab_size}, {trunk}, {head} ({c.mtp_tensor_count} tensors), "
            f"hidden variant {c.hidden_variant}, compute {self.compute_dtype}"
        )


def _gdn_capturing(attn, x: mx.array, mask, cache, gpu=None):
    """mlx-lm's GatedDeltaNet.__call__, run one position at a time to keep every state.

    gated_delta_update only returns the final state; stepping it per position gives the
    state after each verified token (bit-identical: the CPU path loops over positions
    anyway), which is what lets a partial acceptance commit without replaying tokens.
    """
    B, S, _ = x.shape
    qkv = attn.in_proj_qkv(x)
    z = attn.in_proj_z(x).reshape(B, S, attn.num_v_heads, attn.head_v_dim)
    b = attn.in_proj_b(x)
    a = attn.in_proj_a(x)
    conv_state = cache[0]
    if conv_state is None:
        conv_state = mx.zeros((B, attn.conv_kernel_size - 1, attn.conv_dim), dtype=x.dtype)
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    cache[0] = mx.contiguous(conv_input[:, -(attn.conv_kernel_size - 1) :, :])
    conv_out = nn.silu(attn.conv1d(conv_input))
    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [attn.key_dim, 2 * attn.key_dim], -1),
            [attn.num_k_heads, attn.num_k_heads, attn.num_v_heads],
            [attn.head_k_dim, attn.head_k_dim, attn.head_v_dim],
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=attn.head_k_dim**-0.5, eps=1e-6)
    beta, g = mx.sigmoid(b), compute_g(attn.A_log, a, attn.dt_bias)
    state = cache[1]
    if state is None:
        state = mx.zeros((B, attn.num_v_heads, attn.head_v_dim, attn.head_k_dim), dtype=mx.float32)
    if gpu is not None and gpu.gdn_ok(q, v, state, mask):
        # One launch for all S positions, a separate fp32 buffer per state (see gpu_kernels).
        y, states = gpu.gdn(q, k, v, g, beta, state)
        outs, state = [y], states[-1]
    elif mask is None and not _use_kernel(attn, k):
        # One compiled graph for all verified positions instead of S separate steps.
        rep = attn.num_v_heads // attn.num_k_heads
        if rep > 1:
            q, k = mx.repeat(q, rep, -2), mx.repeat(k, rep, -2)
        y, all_states = _recurrence(q, k, v, g, beta, state)
        states = [all_states[t] for t in range(S)]
        outs, state = [y], states[-1]
    else:
        # gated_delta_update's own dispatch: the Metal kernel on Apple GPUs, ops elsewhere.
        step = gated_delta_kernel if _use_kernel(attn, k) else gated_delta_ops
        outs, states = [], []
        for t in range(S):
            sl = slice(t, t + 1)
            o, state = step(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], state,
                            None if mask is None else mask[:, sl])
            outs.append(o)
            states.append(state)
    cache[1] = state
    cache.advance(S)
    out = attn.norm(mx.concatenate(outs, axis=1), z)
    return attn.out_proj(out.reshape(B, S, -1)), (conv_input, states)


@mx.compile
def _recurrence(q, k, v, g, beta, state):
    """The gated delta rule over T positions (q, k already at v's head count), every state kept.

    The same arithmetic as mlx-lm's per-step ops, traced once per width.
    """
    ys, states = [], []
    for t in range(q.shape[1]):
        state = state * g[:, t, :, None, None]
        kv_mem = (state * k[:, t, :, None, :]).sum(axis=-1)
        delta = (v[:, t] - kv_mem) * beta[:, t, :, None]
        state = state + k[:, t, :, None, :] * delta[..., None]
        ys.append((state * q[:, t, :, None, :]).sum(axis=-1).astype(q.dtype))
        states.append(state)
    return mx.stack(ys, axis=1), mx.stack(states)


def _use_kernel(attn, k: mx.array) -> bool:
    return (
        not attn.training
        and mx.default_device() == mx.gpu
        and mx.metal.is_available()
        and k.shape[-1] >= 32
        and k.shape[-1] % 32 == 0
    )


def _unreadable_trunk_file(path: Path) -> Optional[Path]:
    """The first model*.safetensors whose header mlx cannot read (mx.load reads headers, data lazily)."""
    for f in sorted(path.glob("model*.safetensors")):
        try:
            mx.load(str(f))
        except Exception:  # noqa: BLE001
            return f
    return None


def load(path: Path, config: dict, *, hidden_variant: Optional[str] = None, compute_dtype: str = "auto") -> Qwen35Adapter:
    tc = text_config(config)
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                "num_key_value_heads", "intermediate_size"):
        if key not in tc:
            raise CheckpointError(f"{path / 'config.json'}: text_config has no '{key}'.")
    n_mtp = tc.get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers", 1))
    if not isinstance(n_mtp, int) or isinstance(n_mtp, bool) or n_mtp < 0:
        raise CheckpointError(
            f"{path / 'config.json'}: mtp_num_hidden_layers is {n_mtp!r}, expected a whole number (1 for Qwythos)."
        )
    if n_mtp == 0:
        raise CheckpointError(
            f"{path} has no MTP head: config.json says mtp_num_hidden_layers is 0. Speculative decoding "
            "needs the head; use a checkpoint converted with its MTP tensors (for example the MTPLX/OptiQ "
            "conversion). Plain autoregressive generation does not need this app."
        )
    if n_mtp > 1:
        raise CheckpointError(
            f"{path}: mtp_num_hidden_layers is {n_mtp}; only one-layer MTP heads (Qwen3.5/Qwythos, "
            "mtp.layers.0 only) are supported; a deeper stacked head is not. Use a checkpoint with a "
            "one-layer head (draft depth > 1 reuses that one layer, no second layer is needed)."
        )

    # The sidecar is found and checked before the trunk is touched: nothing is half-loaded.
    side = sidecar.locate(path, config)
    if side is None:
        registered = sidecar.registered(config)
        where = (
            f"config.json registers {', '.join(repr(r) for r in registered)} but no such file exists"
            if registered else "config.json registers none (mtp_file / mlx_lm_extra_tensors.mtp_file)"
        )
        raise CheckpointError(
            f"{path} has no MTP head: no sidecar at {' or '.join(sidecar.candidates(config))}; {where}. "
            "Speculative decoding needs the head; "
            "use a checkpoint converted with its MTP tensors (for example the MTPLX/OptiQ conversion). "
            "Plain autoregressive generation does not need this app."
        )
    tensors = sidecar.read(side)
    quantized, qparams = sidecar.check(side, tensors, tc, config.get("mtplx_mtp_quantization"))
    convention, convention_source = sidecar.detect_norm_convention(tensors, config)

    variant = hidden_variant or config.get("mtp_hidden_variant")
    variant_source = "override" if hidden_variant else ("config" if variant else "Qwythos default")
    variant = variant or DEFAULT_HIDDEN_VARIANT
    if variant not in ("pre_norm", "post_norm"):
        where = "hidden_variant argument" if hidden_variant else f"{path / 'config.json'}: mtp_hidden_variant"
        raise CheckpointError(f"{where} '{variant}' is not 'pre_norm' or 'post_norm'.")
    concat_order = config.get("mtp_concat_order", DEFAULT_CONCAT_ORDER)
    if concat_order not in ("embedding_hidden", "hidden_embedding"):
        raise CheckpointError(f"config.json: mtp_concat_order '{concat_order}' is not 'embedding_hidden' or 'hidden_embedding'.")

    if not any(path.glob("model*.safetensors")):
        raise CheckpointError(f"{path} has no model*.safetensors: the trunk weights are missing.")
    from mlx_lm.utils import dequantize_model, load as mlx_lm_load

    try:
        model, tokenizer = mlx_lm_load(str(path))
    except Exception as exc:
        bad = _unreadable_trunk_file(path)
        raise CheckpointError(
            f"{path}: mlx-lm could not load the trunk ({type(exc).__name__}: {exc}). "
            + (f"{bad.name} is corrupt or truncated: copy it again from the original checkpoint."
               if bad else
               "A truncated or corrupt model*.safetensors, or missing tokenizer files, are the usual causes.")
        ) from None

    args = TextModelArgs.from_dict(tc)
    head = build_mtp_head(args, tensors, quantized, qparams, concat_order, convention == "zero_centered")

    if compute_dtype == "auto":
        # Quantized and half-precision matmuls are slower than fp32 on the CPU backend.
        compute_dtype = "float32" if mx.default_device() == mx.cpu else "native"
    if compute_dtype == "float32":
        for module in (model, head):
            dequantize_model(module)
            module.set_dtype(mx.float32)
            if mx.default_device() == mx.cpu:
                to_row_major(module)
        mx.eval(model.parameters(), head.parameters())

    layers = model.language_model.model.layers
    contract = MTPContract(
        hidden_size=tc["hidden_size"],
        vocab_size=tc["vocab_size"],
        num_layers=len(layers),
        layer_kinds=tuple("linear" if l.is_linear else "full" for l in layers),
        mtp_num_layers=1,
        hidden_variant=variant,
        concat_order=concat_order,
        norm_convention=convention,
        norm_convention_source=convention_source,
        hidden_variant_source=variant_source,
        trunk_quantization=config.get("quantization"),
        mtp_quantization=qparams,
        mtp_tensor_count=len(tensors),
        sidecar=os.path.relpath(side, os.path.abspath(path)),  # locate() keeps it inside the checkpoint
    )
    return Qwen35Adapter(path, model, tokenizer, config, contract, head, compute_dtype)
