"""The adapter contract (core/model.py) for a Gemma 4 backbone with its assistant drafter.

The trunk's cache: one per layer that computes K/V (the first `num_hidden_layers -
num_kv_shared_layers`; the others reuse them), a plain mlx-lm KVCache for full attention and a
SlidingKVCache (sliding.py) for sliding-window layers: it holds the window and at most one block
more, and can drop any rejected suffix, which mlx-lm's RotatingKVCache cannot once it has wrapped.

The drafter keeps nothing (make_draft gives an empty dict): each step reads the backbone's
K/V as the cache holds them, so a rollback of the backbone is the whole rollback, and a
prefix-cache snapshot is the backbone's alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from core.model import State

from .drafter import Assistant
from .sliding import SlidingKVCache


@dataclass
class Captured:
    width: int


def kv_layers(layer_types, num_kv_shared_layers: int) -> Dict[str, int]:
    """Layer type -> index of the last layer of that type that computes its own K/V: the layers
    a drafter reads (E2B/E4B: the last `num_kv_shared_layers` layers reuse earlier K/V)."""
    n_kv = len(layer_types) - int(num_kv_shared_layers or 0)
    types = layer_types[: n_kv if n_kv > 0 else len(layer_types)]
    return {kind: max(i for i, t in enumerate(types) if t == kind) for kind in set(types)}


def _own(a):
    """A new array object over the same data: two caches restored from one snapshot must not
    share the object KVCache writes into (see adapters/qwen3_5/adapter.py)."""
    return None if a is None else a[...]


class Gemma4Adapter:
    family = "gemma4"

    def __init__(self, path: Path, model, tokenizer, config: dict, text_config: dict, drafter: Assistant,
                 drafter_path: Path, compute_dtype: str, context_length: int, notes: Tuple[str, ...] = ()):
        self.path = path
        self.model = model                       # the mlx-lm model (benchmarks compare against mlx_lm)
        self.tokenizer = tokenizer
        self.config = config
        self.drafter = drafter
        self.drafter_path = drafter_path
        self.compute_dtype = compute_dtype
        self.context_length = context_length
        self.notes = notes
        self.vocab_size = int(model.language_model.args.vocab_size if hasattr(model, "language_model")
                              else model.args.vocab_size)
        lm = model.language_model if hasattr(model, "language_model") else model
        self.lm = lm
        self.inner = lm.model
        self.args = lm.args
        self.softcap = lm.final_logit_softcapping
        n_kv = self.args.num_hidden_layers - self.args.num_kv_shared_layers
        self.n_cache = n_kv if n_kv > 0 else self.args.num_hidden_layers
        self.kv_source = kv_layers(self.args.layer_types, self.args.num_kv_shared_layers)
        self.window = self.args.sliding_window
        cpu_fp32 = compute_dtype == "float32" and mx.default_device() == mx.cpu
        # Row-major copies of the tied tables for the output projections on the CPU (adapters/cpu_layout.py).
        self._head_t = mx.contiguous(self.inner.embed_tokens.weight.T) if cpu_fp32 and lm.tie_word_embeddings else None
        self._draft_head_t = (mx.contiguous(drafter.model.embed_tokens.weight.T)
                              if cpu_fp32 and not drafter.centroid and "lm_head" not in drafter else None)

    # -- caches -------------------------------------------------------------------------
    def make_cache(self) -> list:
        kinds = self.args.layer_types[: self.n_cache]
        return [SlidingKVCache(self.window, every=max(64, self.window)) if kind == "sliding_attention" else KVCache()
                for kind in kinds]

    def make_draft(self, cache: list) -> dict:
        return {}

    def state_arrays(self, cache: list, draft) -> list:
        return [c.state for c in cache]

    # -- trunk ----------------------------------------------------------------------------
    def lm_head(self, h: mx.array) -> mx.array:
        if self._head_t is not None:
            out = h @ self._head_t
        elif self.lm.tie_word_embeddings:
            out = self.inner.embed_tokens.as_linear(h)
        else:
            out = self.lm.lm_head(h)
        if self.softcap:
            out = mx.tanh(out / self.softcap) * self.softcap
        return out

    vision = None   # no vision tower: core never passes pictures (core.chat refuses them first)

    def forward(self, tokens: mx.array, cache: list, *, all_logits: bool = True, capture: bool = False,
                fast: bool = True, images=()) -> Tuple[mx.array, mx.array, Optional[Captured]]:
        """tokens [B, T] -> logits [B, T or 1, V], the post-norm hidden [B, T, H] (what the drafter
        reads). One path for every width: `fast` changes nothing here."""
        if images:
            raise ValueError("this model has no vision tower")
        h = self.inner(tokens, cache=cache)
        logits = self.lm_head(h if all_logits else h[:, -1:])
        return logits, h, (Captured(tokens.shape[1]) if capture else None)

    def rollback(self, cache: list, captured: Captured, keep: int) -> None:
        drop = captured.width - keep
        if drop:
            for c in cache:
                c.trim(drop)

    # -- the drafter ------------------------------------------------------------------------
    def shared_kv(self, cache: list) -> dict:
        """The backbone's K/V the drafter attends to: everything the full-attention source layer
        holds, and the sliding layer's window as the backbone's own next token would see it
        (keys at positions > q - window, q = the bonus token's position = the cached length)."""
        out = {}
        for kind, i in self.kv_source.items():
            c = cache[i]
            if kind == "sliding_attention":
                out[kind] = c.window_kv(c.offset)
            else:
                out[kind] = (c.keys[..., :c.offset, :], c.values[..., :c.offset, :])
        return out

    def absorb(self, draft: dict, cache: list, hidden: mx.array, tokens: mx.array) -> None:
        """Nothing to learn: the drafter has no history of its own."""

    def draft_step(self, draft: dict, cache: list, hidden: mx.array, tokens: mx.array):
        """(h_prev, token) of the last position only (T > 1 happens when a cycle committed several
        positions; the drafter reads those through the backbone's K/V). The query position is
        the bonus token's for every step of a cycle: the cache does not move while drafting."""
        position = cache[0].offset
        emb = self.inner.embed_tokens(tokens[:, -1:]) * self.inner.embed_scale
        h_next, h = self.drafter.step(emb, hidden[:, -1:], self.shared_kv(cache), position)
        return h_next, self.drafter.logits(h, self._draft_head_t)

    def end_cycle(self, draft: dict, steps: int) -> None:
        """Nothing to forget."""

    # -- prefix-cache snapshots ------------------------------------------------------------
    def snapshot(self, cache: list, draft: dict) -> State:
        arrays, meta = {}, {}
        for i, c in enumerate(cache):
            start = getattr(c, "start", 0)          # a sliding layer's buffer begins there
            meta[f"trunk.{i}.keys.length"] = meta[f"trunk.{i}.values.length"] = c.offset - start
            if start:
                meta[f"trunk.{i}.start"] = start
            if c.keys is not None:
                arrays[f"trunk.{i}.keys"], arrays[f"trunk.{i}.values"] = c.keys, c.values
        return State(arrays, meta)

    def restore(self, state: State, cache: list, draft: dict) -> None:
        a, meta = state.arrays, state.meta
        for i, c in enumerate(cache):
            c.keys, c.values = _own(a.get(f"trunk.{i}.keys")), _own(a.get(f"trunk.{i}.values"))
            start = int(meta.get(f"trunk.{i}.start", 0))
            if isinstance(c, SlidingKVCache):
                c.start = start
            c.offset = start + int(meta[f"trunk.{i}.keys.length"])

    # -- for people --------------------------------------------------------------------------
    def head_description(self) -> str:
        d = self.drafter
        a = d.args
        if d.centroid:
            C = d.num_centroids
            head = f"centroid head (top {d.top_k} of {C} clusters, {d.top_k * a.vocab_size // C} tokens)"
        else:
            head = "full tied head" if "lm_head" not in d else "full head"
        return f"{a.num_hidden_layers}-layer assistant drafter, hidden {a.hidden_size}, {head}"

    def report(self) -> list:
        """What scripts/checkpoints/inspect_model.py prints for this family: the pair and what ties it together."""
        a, d = self.args, self.drafter.args
        q = self.config.get("quantization")
        kv = ", ".join(f"{kind} <- backbone layer {i}" for kind, i in sorted(self.kv_source.items()))
        return [
            f"family: gemma4 ({type(self).__name__})" + (f", {a.num_experts} routed experts" if a.enable_moe_block else ""),
            f"backbone: {self.path}",
            f"drafter: {self.drafter_path} ({self.head_description()})",
            f"hidden size: {a.hidden_size} (drafter {d.hidden_size}, backbone_hidden_size {self.drafter.backbone_hidden})",
            f"vocab size: {a.vocab_size}",
            f"backbone layers: {a.num_hidden_layers} = {a.layer_types.count('sliding_attention')} sliding-window "
            f"({a.sliding_window}) + {a.layer_types.count('full_attention')} full attention; "
            f"{self.n_cache} compute K/V, {a.num_hidden_layers - self.n_cache} reuse them",
            f"drafter layers: {d.num_hidden_layers} ({', '.join(d.layer_types)}), queries only; K/V read: {kv}",
            f"drafter input: concat(embed * {float(self.inner.embed_scale):.4f}, backbone post-norm hidden)",
            f"final logit softcap: {self.softcap}",
            f"backbone quantization: {(str(q['bits']) + '-bit') if q else 'none (float)'}; compute {self.compute_dtype}",
        ]

    def describe(self) -> str:
        a = self.args
        kinds = a.layer_types
        q = self.config.get("quantization")
        trunk = f"{q['bits']}-bit trunk" if q else "float trunk"
        shared = f", {a.num_kv_shared_layers} KV-shared" if a.num_kv_shared_layers else ""
        moe = f", {a.num_experts} experts" if a.enable_moe_block and a.num_experts else ""
        return (f"{self.path.name} (gemma4{moe}): {a.num_hidden_layers} layers "
                f"({kinds.count('sliding_attention')} sliding-window {a.sliding_window} + "
                f"{kinds.count('full_attention')} full attention{shared}), hidden {a.hidden_size}, "
                f"vocab {a.vocab_size}, {trunk}; drafter {self.drafter_path.name}: {self.head_description()}; "
                f"compute {self.compute_dtype}, backend mlx")
