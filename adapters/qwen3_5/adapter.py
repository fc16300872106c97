"""The adapter contract (core/model.py) for the Qwen hybrid trunks with an MTP head.

The trunk's cache is mlx-lm's: a KVCache per attention layer, an ArraysCache [conv window,
recurrent state] per Gated-DeltaNet layer. The drafter's state is the MTP head's own KVCache:
its history of (trunk hidden n, token n+1) for every committed position, filled in prefill and
after each cycle, which raised acceptance from 82.4 % to 86.0 % on a 9B (KNOWLEDGE section 2).
Rollback keeps the captured per-position state; nothing is replayed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Tuple

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from core.model import State

from ..contract import MTPContract
from . import layers
from .backends import Backend
from .layers import AttnParams, GdnParams, MlpParams, Stack
from .mlx_ops import FEW_TOKENS


@dataclass
class Captured:
    """What a verify pass keeps so that any prefix of it can be committed without a replay."""

    width: int
    # per Gated-DeltaNet layer index: (conv_input [B, K-1+T, C], the state after each position)
    gdn: dict = field(default_factory=dict)
    # A batch's verify (forward_batch): per layer index the batch's stacked (conv_input [B, ...],
    # the states [B, ...] after each position), shared by its sequences' Captured, and this
    # sequence's row. `rollback_batch` reads them whole; `rollback` this row's views.
    batch: Optional[dict] = None
    row: int = 0

    def layers(self) -> dict:
        """Per Gated-DeltaNet layer index: this sequence's (conv_input, states)."""
        if self.batch is None:
            return self.gdn
        b = self.row
        return {i: (conv[b:b + 1], [s[b:b + 1] for s in states]) for i, (conv, states) in self.batch.items()}

    def clear(self) -> None:
        """The states not kept go now: a caller's reference to the capture lives into the next
        verify, and would hold every position's state through it (peak memory, issue 14)."""
        self.gdn.clear()
        self.batch = None


class TrunkCache(list):
    """mlx-lm's per-layer caches, plus the rope delta: after a picture, a token's position is its
    index plus this (Qwen's multimodal RoPE, adapters/qwen3_5/vision.py); 0 for text only."""

    rope_delta = 0


def _own(a):
    """A new array object over the same data (a view, no copy). Two caches restored from one
    snapshot must not hold the same object: KVCache writes `keys[..., i:j, :] = new`, which rebinds
    that object, so each lane's writes would show up in the other's attention (the race runs two
    lanes from one snapshot at once; tests/test_race_truth.py)."""
    return None if a is None else a[...]


class HybridAdapter:
    """A loaded Qwen3.5 / Qwen3.5-MoE / Qwen3-Next checkpoint: trunk, MTP head, backend."""

    def __init__(self, family: str, path: Path, model, tokenizer, config: dict, contract: MTPContract,
                 head, compute_dtype: str, backend: Backend, *, inner, output, tied: bool, project,
                 context_length: int, notes: Tuple[str, ...] = (), vision=None):
        self.family = family
        self.path = path
        self.model = model            # the mlx-lm model (for benchmarks against mlx_lm itself)
        self.tokenizer = tokenizer
        self.config = config
        self.contract = contract
        self.head = head
        self.compute_dtype = compute_dtype
        self.backend = backend
        self.inner = inner            # embed_tokens, layers, norm
        self.context_length = context_length
        self.vocab_size = contract.vocab_size
        self.notes = notes            # said at load (e.g. what a quantized MoE head costs)
        self.vision = vision          # the vision tower (vision.Vision) or None: the model reads text only
        self._output, self.tied = output, tied  # tied: the output projection is the embedding table
        self.stack = Stack(
            # None: a layer another rank of a pipeline holds (adapters/pipeline/)
            layers=[None if not hasattr(l, "mlp") else GdnParams(l, project, MlpParams.of(l.mlp)) if l.is_linear
                    else AttnParams(l, MlpParams.of(l.mlp)) for l in inner.layers],
            fa_idx=next(i for i, l in enumerate(inner.layers) if not l.is_linear),
            ssm_idx=next(i for i, l in enumerate(inner.layers) if l.is_linear),
        )
        self.head_layer = AttnParams(head.layers[0], MlpParams.of(head.layers[0].mlp))
        # A row-major copy of the tied table for the output projection on the CPU (see cpu_layout).
        self._head_t = (
            mx.contiguous(inner.embed_tokens.weight.T)
            if tied and compute_dtype == "float32" and mx.default_device() == mx.cpu
            else None
        )
        self._pre_norm = contract.hidden_variant == "pre_norm"

    # -- caches -------------------------------------------------------------------------
    def make_cache(self) -> TrunkCache:
        return TrunkCache(self.model.make_cache())

    def make_draft(self, cache: list) -> KVCache:
        """The MTP head's own KV history (positions it has seen, from the trunk's hidden states)."""
        return KVCache()

    make_mtp_cache = KVCache  # the same, for scripts that drive the head directly

    def state_arrays(self, cache: list, draft: Optional[KVCache]) -> list:
        return [c.state for c in cache] + ([draft.state] if draft is not None else [])

    # -- trunk ----------------------------------------------------------------------------
    def lm_head(self, x: mx.array, run=None) -> mx.array:
        if self._head_t is not None:
            return x @ self._head_t
        run = run or self.backend.runner(x.shape, True)
        return run.lm_head(self._output, self.tied, x)

    def forward(self, tokens: mx.array, cache: list, *, all_logits: bool = True, capture: bool = False,
                fast: bool = True, images=()) -> Tuple[mx.array, mx.array, Optional[Captured]]:
        """tokens [B, T] -> logits [B, T or 1, V], hidden [B, T, H] (the contract's variant).

        fast=False keeps the long-forward path even for a few tokens: prefill does for all but
        its shortest chunks (core.stream.SHORT_CHUNK), so that the path a chunk takes depends
        only on its length (prefix cache or not).
        `images`: the pictures (core.images.ImageSpan, positions in the prompt) wholly inside
        these tokens: their tower output replaces the image tokens' embeddings, at their grid's
        multimodal positions (vision.py)."""
        before = getattr(cache, "rope_delta", 0)
        x, pos = self.inner.embed_tokens(tokens), None
        if images:
            x, pos, after = self._with_pictures(x, cache, images)
            fast = False
        run = self.backend.runner(tokens.shape, fast)
        h, gdn = layers.run_trunk(run, self.stack, run.enter(x), cache, capture, delta=before, pos=pos)
        if images:
            cache.rope_delta = after
        return self.outputs(run, h, all_logits, Captured(tokens.shape[1], gdn) if capture else None)

    def outputs(self, run, h: mx.array, all_logits: bool, captured: Optional[Captured]):
        """The last layer's hidden -> what `forward` returns (a pipeline's last stage calls this
        on the hidden state it received: adapters/pipeline/)."""
        post = run.final_norm(self.inner.norm, h)
        logits = self.lm_head(post if all_logits else post[..., -1:, :], run)
        return run.leave(logits), run.leave(h if self._pre_norm else post), captured

    def _with_pictures(self, x: mx.array, cache: list, images):
        """Embeddings [1, T, H] with each picture's tower output in place, the chunk's positions
        as a RoPE table, and the rope delta after it."""
        if self.vision is None:
            raise ValueError("this model has no vision tower")
        start = next(c.offset for c in cache if isinstance(c, KVCache))
        T = x.shape[1]
        parts, i = [], start
        for s in images:
            parts += [x[:, i - start : s.start - start], self.vision.embed(s)[None].astype(x.dtype)]
            i = s.end
        parts.append(x[:, i - start :])
        pos, delta = self.vision.positions(start, T, getattr(cache, "rope_delta", 0), images)
        return mx.concatenate(parts, axis=1), self.vision.rope_table(pos), delta

    def forward_batch(self, tokens: mx.array, caches: list, *, capture: bool = False):
        """tokens [B, T] of B sequences, caches[b] the b-th one's -> (logits [B, T, V],
        hidden [B, T, H], per sequence a Captured or None). One sequence takes `forward`'s own
        path, so that a batch of one computes exactly what decoding alone does."""
        if len(caches) == 1:
            logits, hidden, cap = self.forward(tokens, caches[0], capture=capture)
            return logits, hidden, [cap]
        run = self.backend.batch
        h, gdn = layers.run_trunk_batch(run, self.stack, run.enter(self.inner.embed_tokens(tokens)), caches, capture,
                                        deltas=[getattr(c, "rope_delta", 0) for c in caches])
        post = run.final_norm(self.inner.norm, h)
        logits = self.lm_head(post, run)
        return (run.leave(logits), run.leave(h if self._pre_norm else post),
                [Captured(tokens.shape[1], batch=gdn, row=b) if capture else None for b in range(len(caches))])

    def rollback(self, cache: list, captured: Captured, keep: int) -> None:
        """Commit only the first `keep` positions of a captured verify pass."""
        drop = captured.width - keep
        if drop == 0:
            captured.clear()
            return
        gdn = captured.layers()
        for i, c in enumerate(cache):
            if i in gdn:
                conv_input, states = gdn[i]
                n_keep = conv_input.shape[1] - captured.width
                c[0] = layers.kept_window(conv_input, n_keep, keep)
                c[1] = states[keep - 1]
                c.stacked = None  # a batch's stacked rows are not this cache's any more (layers._stacked_states)
            else:
                c.trim(drop)
        captured.clear()

    def rollback_batch(self, caches: list, captured: list, keeps: list) -> None:
        """`rollback` for the sequences of one forward_batch, each keeping its own prefix. Per
        Gated-DeltaNet layer the batch's kept rows are taken in one gather (the conv windows) and
        one select a dropped position (the states), split once and left stacked for the next
        step (layers.keep_stacked), where a sequence at a time took a slice and a copy each: the
        host's primitives a cycle grew with B (scripts/bench/batch_graph.py). Where every row keeps
        as many positions (about half the cycles at Qwythos's acceptance at depth 2, and whenever
        all drafts are rejected), a slice and a reference, as `rollback` takes them. The values are
        the rows `rollback` takes, moved, never computed."""
        batch = captured[0].batch if captured and captured[0] is not None else None
        if batch is None or len(caches) < 2 or any(c is None or c.batch is not batch for c in captured):
            for cache, cap, keep in zip(caches, captured, keeps):
                self.rollback(cache, cap, keep)
            return
        W = captured[0].width
        if all(k == W for k in keeps):
            for cap in captured:
                cap.clear()
            return
        same = keeps[0] if len(set(keeps)) == 1 else None   # every row keeps as many: slices, as alone
        kept = None if same is not None else mx.array(keeps, dtype=mx.int32)
        # The rows' selections are built once a cycle, broadcast to each shape the layers share (the
        # 9B's layers all share one), so that a layer's gather and selects add no broadcasts of them.
        windows, at = {}, {}
        for i in range(len(caches[0])):
            cs = [cache[i] for cache in caches]
            if i not in batch:
                for c, keep in zip(cs, keeps):
                    if keep < W:
                        c.trim(W - keep)
                continue
            conv_input, states = batch[i]
            n_keep = conv_input.shape[1] - W
            if same is not None:
                conv, state = mx.contiguous(conv_input[:, same:same + n_keep]), states[same - 1]
            else:
                shape = (conv_input.shape[0], n_keep, conv_input.shape[2])
                if shape not in windows:
                    windows[shape] = mx.broadcast_to(
                        (kept[:, None] + mx.arange(n_keep, dtype=mx.int32)[None])[..., None], shape)
                rows_at = at.get(states[0].shape)
                if rows_at is None:   # per dropped position: the rows whose state is position t's
                    rows_at = at[states[0].shape] = [
                        mx.broadcast_to((kept == t + 1).reshape(-1, 1, 1, 1), states[0].shape) for t in range(W - 1)]
                conv = mx.take_along_axis(conv_input, windows[shape], axis=1)
                state = states[W - 1]
                for t in range(W - 2, -1, -1):
                    state = mx.where(rows_at[t], states[t], state)
            for c, row_conv, row_state in zip(cs, layers.rows(conv), layers.rows(state)):
                c[0], c[1] = row_conv, row_state
            layers.keep_stacked(cs, (conv, state))
        for cap in captured:
            cap.clear()

    # -- the MTP head ----------------------------------------------------------------------
    def mtp_forward(self, hidden: mx.array, next_tokens: mx.array, mtp_cache: KVCache, *, fast: bool = True) -> mx.array:
        """hidden [B, T, H] at positions n, next_tokens [B, T] = t[n+1] -> g [B, T, H].

        lm_head(g) predicts t[n+2]; g is also what depth > 1 feeds back as its hidden. The head's
        positions are token indices, also after a picture (no rope delta: its own history stays
        consistent, as mlx-vlm's qwen3_5 MTP drafter does); they touch acceptance, never exactness."""
        run = self.backend.runner(hidden.shape, fast)
        x = run.head_input(self.head, run.enter(hidden), run.enter(self.inner.embed_tokens(next_tokens)))
        mask, _ = run.masks(x, mtp_cache, None)
        pos = run.positions(mtp_cache.offset, x.shape[-2])
        return run.leave(layers.attend(run, self.head_layer, x, mtp_cache, pos, mask, final_norm=self.head.norm))

    def absorb(self, draft: KVCache, cache: list, hidden: mx.array, tokens: mx.array) -> None:
        self.mtp_forward(hidden, tokens, draft, fast=False)

    def draft_step(self, draft: KVCache, cache: list, hidden: mx.array, tokens: mx.array):
        g = self.mtp_forward(hidden, tokens, draft)[:, -1:]
        return g, self.lm_head(g)[:, -1]

    def draft_batch(self, drafts: list, caches: list, hiddens: list, tokens: list):
        """One draft step of several sequences: hiddens[b] [1, T_b, H] and tokens[b] [1, T_b]
        (T_b differs: each catches up on what its last cycle committed) -> (g [B, 1, H],
        logits [B, V]). Where every sequence feeds as many positions, no more than a few (a
        cycle's later steps: one each), the head runs once for all rows, its attention per
        sequence over its own history (`mtp_forward_batch`); else once per sequence. The output
        projection, the widest matrix, once for all rows."""
        if len(drafts) == 1:
            g, logits = self.draft_step(drafts[0], caches[0], hiddens[0], tokens[0])
            return g, logits
        widths = {t.shape[1] for t in tokens}
        if len(widths) == 1 and widths.pop() <= FEW_TOKENS:   # (a first cycle feeds a whole prompt)
            g = self.mtp_forward_batch(mx.concatenate(hiddens), mx.concatenate(tokens), drafts)[:, -1:]
        else:
            g = mx.concatenate([self.mtp_forward(h, t, d)[:, -1:] for d, h, t in zip(drafts, hiddens, tokens)])
        return g, self.lm_head(g, self.backend.batch)[:, -1]

    def mtp_forward_batch(self, hidden: mx.array, next_tokens: mx.array, drafts: list) -> mx.array:
        """`mtp_forward` of B sequences feeding T positions each: hidden [B, T, H], next_tokens
        [B, T], drafts[b] the b-th head's KV history -> g [B, T, H], through the batch runner as
        the trunk's attention layers run a batch (layers.attend_batch): each row as alone where
        the runner computes rows alike (the GPU's row kernels; on the CPU's BLAS to rounding,
        which moves only drafts, never what the verify keeps)."""
        run = self.backend.batch
        x = run.head_input(self.head, run.enter(hidden), run.enter(self.inner.embed_tokens(next_tokens)))
        pos = run.positions(mx.array([d.offset for d in drafts], dtype=mx.int32), x.shape[-2])
        return run.leave(layers.attend_batch(run, self.head_layer, x, drafts, pos, final_norm=self.head.norm))

    def end_cycle(self, draft: KVCache, steps: int) -> None:
        # The first step's entries are for committed positions; the other steps' are drafts.
        draft.trim(steps - 1)

    # -- prefix-cache snapshots ------------------------------------------------------------
    def snapshot(self, cache: list, draft: KVCache) -> State:
        """Attention KV buffers with their lengths, GDN conv windows and recurrent states, the
        head's KV history: references to the caches' own arrays."""
        arrays, meta = {}, {}
        snapshot_trunk(cache, arrays, meta)
        _snapshot_kv("draft", draft, arrays, meta)
        if getattr(cache, "rope_delta", 0):
            meta["rope_delta"] = cache.rope_delta
        return State(arrays, meta)

    def restore(self, state: State, cache: list, draft: KVCache) -> None:
        """Each KV cache gets its own array objects over the snapshot's data (`_own`)."""
        restore_trunk(state, cache)
        a, meta = state.arrays, state.meta
        draft.keys, draft.values, draft.offset = _own(a.get("draft.keys")), _own(a.get("draft.values")), meta["draft.keys.length"]
        cache.rope_delta = int(meta.get("rope_delta", 0))

    def prepare_kernels(self, widths: Sequence[int], sequences: int = 1) -> int:
        """The GPU kernels' launches that long contexts and batches take, built (never run) so
        that their compiled modules are on this machine before a request needs them; 0 where the
        backend has none (gpu_runner.GpuKernels.prepare)."""
        prepare = getattr(self.backend.few, "prepare", None)
        if prepare is None:
            return 0
        attention = [p for p in self.stack.layers if isinstance(p, AttnParams)] + [self.head_layer]
        return prepare(attention, widths, sequences)

    # -- for people --------------------------------------------------------------------------
    def describe(self) -> str:
        c = self.contract
        q = c.trunk_quantization
        trunk = f"{q['bits']}-bit trunk" if q else "float trunk"
        mq = c.mtp_quantization
        head = f"{mq['bits']}-bit MTP head" if mq else "float MTP head"
        moe = f", {c.num_experts} experts" if c.num_experts else ""
        return (
            f"{self.path.name} ({self.family}{moe}): {c.num_layers} layers "
            f"({c.layer_kinds.count('linear')} Gated-DeltaNet + {c.layer_kinds.count('full')} attention), "
            f"hidden {c.hidden_size}, vocab {c.vocab_size}, {trunk}, {head} ({c.mtp_tensor_count} tensors, "
            f"{c.layout}), hidden variant {c.hidden_variant}, compute {self.compute_dtype}, backend {self.backend.name}"
            + (f"; {self.vision.describe()}" if self.vision is not None else "; text only (no vision tower)")
        )


# -- snapshots of trunk layers (also a pipeline stage's own layers: adapters/pipeline/) ------------
def _snapshot_kv(name: str, c: KVCache, arrays: dict, meta: dict) -> None:
    meta[name + ".keys.length"] = meta[name + ".values.length"] = c.offset
    if c.keys is not None:
        arrays[name + ".keys"], arrays[name + ".values"] = c.keys, c.values


def snapshot_trunk(cache: list, arrays: dict, meta: dict, first: int = 0) -> None:
    """cache[i] is trunk layer first + i; its arrays go under trunk.<first + i>.*"""
    for i, c in enumerate(cache, first):
        if isinstance(c, KVCache):
            _snapshot_kv(f"trunk.{i}", c, arrays, meta)
        else:
            for j, part in enumerate(("conv", "state")):
                if c[j] is not None:
                    arrays[f"trunk.{i}.{part}"] = c[j]


def restore_trunk(state: State, cache: list, first: int = 0) -> None:
    a, meta = state.arrays, state.meta
    for i, c in enumerate(cache, first):
        if isinstance(c, KVCache):
            c.keys, c.values, c.offset = _own(a.get(f"trunk.{i}.keys")), _own(a.get(f"trunk.{i}.values")), meta[f"trunk.{i}.keys.length"]
        else:
            c[0], c[1] = a.get(f"trunk.{i}.conv"), a.get(f"trunk.{i}.state")
