"""What the engine needs from a model family, written once: the adapter contract.

core drives decoding through `Adapter` alone. It never imports a family and never reads the
inside of a cache: the trunk's cache, a verify's capture and the drafter's state are opaque
objects that only their adapter makes, changes and reads. A family (adapters/<family>/) is a
package that returns an object with these methods; `load_adapter` finds it by model_type.

One cycle, as core/decoders.py runs it (see KNOWLEDGE section 3):

    draft = make_draft(cache)                        # once per reply, may hold nothing
    absorb(draft, cache, hidden, tokens)             # prefill: the drafter learns the prompt
    h, logits = draft_step(draft, cache, h, t)       # x depth: one drafted token per step
    logits, hidden, captured = forward([pending, d1..dD], cache, capture=True)
    rollback(cache, captured, keep=n + 1)            # keep the verified prefix, no replay
    end_cycle(draft, depth)                          # the drafter forgets its own drafts

Shapes are written [B, T, ...] with B = 1 today, so that batched decoding (several sequences
with their own caches, issue 22) can come without a new contract. A drafter that keeps no
state of its own (Gemma 4's assistant reads the trunk's KV, issue 19) returns an empty draft
state and ignores `absorb`; that is why every drafter method also receives the trunk cache.

Batched decoding (core/batch.py) uses three more, optional, methods: `forward_batch(tokens [B, T],
caches, capture)` -> (logits [B, T, V], hidden [B, T, H], a captured per sequence) and
`draft_batch(drafts, caches, hiddens, tokens)` -> (g [B, 1, H], logits [B, V]), each sequence
with its own caches; and `rollback_batch(caches, captured, keeps)`: a forward_batch's sequences
each keep their own prefix, as `rollback` one at a time would. Without them core loops over the
sequences.

Snapshots for the prefix cache are `State`s: named arrays plus small metadata, written and read
by the adapter. Anything that stores them (the in-memory prefix cache today, a disk cache with
mx.save_safetensors later) needs to know nothing of a family's cache layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Tuple, Union, runtime_checkable

import mlx.core as mx

Meta = Dict[str, Union[int, float, str]]


@dataclass(frozen=True)
class State:
    """A decoding state: arrays by name ("trunk.3.keys", "draft.values", ...) and small
    JSON-able facts. References to the caches' buffers, never copies: MLX arrays are values,
    so a later update of the cache leaves a State as it was taken.

    A buffer may be longer than what it holds (a KV cache grows in steps): then
    meta[name + ".length"] is how many positions along axis -2 hold data, and `valid(name)`
    is that part (what a disk cache writes; what tests compare)."""

    arrays: Dict[str, mx.array]
    meta: Meta = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def valid(self, name: str) -> mx.array:
        a = self.arrays[name]
        n = self.meta.get(name + ".length")
        return a if n is None else a[..., : int(n), :]


@runtime_checkable
class Adapter(Protocol):
    """Everything core calls on a loaded model. Cache, captured and draft objects are opaque."""

    tokenizer: Any          # mlx-lm TokenizerWrapper: encode/decode, eos_token_ids, detokenizer, chat template
    context_length: int     # the model's own context in tokens (max_position_embeddings)
    vocab_size: int         # the width of a logits row (a grammar's mask and a token id's bound)

    def describe(self) -> str:
        """One line for people: family, layers, quantization, the head, the backend in use."""

    # -- caches ------------------------------------------------------------------------
    def make_cache(self) -> Any:
        """A fresh trunk cache for one sequence."""

    def make_draft(self, cache: Any) -> Any:
        """A fresh drafter state that goes with `cache` (it may be empty: a drafter without a
        history of its own keeps nothing here)."""

    def state_arrays(self, cache: Any, draft: Optional[Any]) -> List[mx.array]:
        """The arrays to evaluate to end a lazily built graph (after each prefill chunk)."""

    # -- trunk -------------------------------------------------------------------------
    def forward(self, tokens: mx.array, cache: Any, *, all_logits: bool = True, capture: bool = False,
                fast: bool = True, images: Tuple = ()) -> Tuple[mx.array, mx.array, Optional[Any]]:
        """tokens [B, T] -> (logits [B, T or 1, V], hidden [B, T, H], captured or None).

        hidden is what the drafter reads (the family's variant: pre- or post-norm). With
        capture, the returned object lets `rollback` keep any prefix of the T positions.
        fast=False asks for the path whose result does not depend on how a prompt is split
        into chunks (prefill, and the prefix cache relies on it). `images`: the pictures
        (core.images.ImageSpan) wholly inside these tokens, in prefill only, and only to an
        adapter whose `vision` is set (a family with a vision tower); their embeddings replace
        the image tokens'."""

    def rollback(self, cache: Any, captured: Any, keep: int) -> None:
        """Commit only the first `keep` positions of a captured forward (keep >= 1)."""

    # -- drafter -----------------------------------------------------------------------
    def absorb(self, draft: Any, cache: Any, hidden: mx.array, tokens: mx.array) -> None:
        """Prefill: let the drafter see positions (hidden n [B, T, H], token n+1 [B, T])."""

    def draft_step(self, draft: Any, cache: Any, hidden: mx.array, tokens: mx.array) -> Tuple[mx.array, mx.array]:
        """One draft step from (hidden [B, T, H], next tokens [B, T]); T > 1 when the drafter
        catches up on positions the last cycle committed. Returns (the hidden the next step
        takes [B, 1, H], logits of the drafted position [B, V])."""

    def end_cycle(self, draft: Any, steps: int) -> None:
        """After a cycle of `steps` draft steps: drop what the drafter holds about its own
        drafts (it relearns the committed positions from the trunk's hidden states)."""

    # -- prefix cache --------------------------------------------------------------------
    def snapshot(self, cache: Any, draft: Any) -> State:
        """The state of `cache` and `draft` (references only)."""

    def restore(self, state: State, cache: Any, draft: Any) -> None:
        """Put `state` into a fresh cache and drafter state (from make_cache / make_draft)."""
