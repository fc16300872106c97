"""What one conversation's caches hold in memory: bytes per token of context, bytes per sequence.

An agent's context grows to 64k-128k tokens, and what that costs is the attention layers' keys
and values (and the MTP head's own history) for every token, plus the recurrent layers' state,
which is the same at any length. Measured on the loaded model's own caches after one token, so
it holds for every family, dtype and cache kind without a formula per family: a cache that keeps
keys grows with the context (a sliding window only up to its size), any other is fixed.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class Footprint:
    per_token: int      # bytes each token of context adds (keys and values, the head's history too)
    per_sequence: int   # bytes a sequence holds whatever its length (recurrent states, windows)

    def at(self, tokens: int) -> int:
        return self.per_sequence + tokens * self.per_token

    def describe(self, context: int) -> str:
        return (f"{_size(self.per_token)} per token of context (attention keys and values, the MTP head's "
                f"history), {_size(self.per_sequence)} per conversation whatever its length (recurrent "
                f"state); the full {context:,}-token context: {_size(self.at(context))} per conversation")


def footprint(adapter) -> Footprint:
    """The caches' footprint, from one token through the trunk and the head (a few ms)."""
    cache = adapter.make_cache()
    draft = adapter.make_draft(cache)
    token = mx.array([[0]], dtype=mx.int32)
    _, hidden, _ = adapter.forward(token, cache)
    adapter.draft_step(draft, cache, hidden[:, -1:], token)
    per_token = per_sequence = 0
    for c in [*cache, draft]:
        mx.eval(_arrays(c))
        if not _keeps_keys(c):
            per_sequence += sum(a.nbytes for a in _arrays(c))
            continue
        # Keys and values are allocated ahead in blocks: bytes per allocated position.
        row = sum(a.nbytes // a.shape[-2] for a in (c.keys, c.values))
        window = getattr(c, "max_size", None) or getattr(c, "window", None)   # mlx-lm's rotating, Gemma 4's sliding
        if window:
            per_sequence += row * window
        else:
            per_token += row
    return Footprint(per_token, per_sequence)


def _keeps_keys(c) -> bool:
    return isinstance(getattr(c, "keys", None), mx.array)


def _arrays(c) -> list:
    if _keeps_keys(c):
        return [c.keys, c.values]
    inner = getattr(c, "cache", None)
    items = inner if isinstance(inner, list) else getattr(c, "state", [])
    return [a for a in items if isinstance(a, mx.array)]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
