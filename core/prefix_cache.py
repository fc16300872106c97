"""Reuse of computed prompt state across requests (multi-turn chat, regenerate, the race).

A snapshot is the whole decoding state at a prompt position P: the trunk's caches (attention
KV up to P, the Gated-DeltaNet conv window and recurrent state at P), the MTP head's own KV
history (positions 0..P-2, built from the trunk's hidden states) and the trunk's hidden state
at P-1, which the head pairs with token P when the prompt goes on. Restoring it and
prefilling the rest of a new prompt leaves the lanes exactly where a fresh prefill would.

Snapshots are taken only during prefill, at positions the prompt marks (the end of the system
prompt, the end of the history just before the generation prompt: the point the next turn
shares once thinking is dropped). A GDN state cannot be trimmed back, so only marked
positions are reusable; attention KV could be trimmed anywhere but is kept per snapshot too.

MLX arrays are immutable values (an in-place update only happens when nothing else holds the
buffer), so a snapshot holds references, never copies, and a lane decoding after a restore
cannot change it: a Stop mid-reply leaves every snapshot as it was. The exception is the Python
array object itself: KVCache writes `keys[..., i:j, :] = new`, which rebinds that object, so
every restored cache gets its own objects over the snapshot's data (`_own`). Reuse is matched
on token ids (longest stored prefix of the new prompt), never on message text.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx


@dataclass
class Snapshot:
    ids: Tuple[int, ...]        # the prompt tokens [0, P)
    trunk: list                 # per layer: KVCache.state (keys, values, offset) or [conv, state]
    head: tuple                 # the MTP head's KVCache.state: entries for positions 0..P-2
    hidden: mx.array            # trunk hidden at P-1 [1, 1, H] (the head's next input)
    nbytes: int

    @property
    def length(self) -> int:
        return len(self.ids)


def _nbytes(arrays) -> int:
    return sum(a.nbytes for a in arrays if isinstance(a, mx.array))


def _own(a):
    """A new array object over the same data (a view, no copy). Two caches restored from one
    snapshot must not hold the same object, or each lane's writes show up in the other's
    attention: the race runs two lanes from one snapshot at once, and without this 3 of 3
    sampled interleaved runs (tests/test_race_truth.py) decoded other tokens than alone."""
    return None if a is None else a[...]


def take(ids: Sequence[int], cache: list, mtp_cache, hidden: mx.array) -> Snapshot:
    """The state after prefilling `ids` (references only)."""
    trunk, arrays = [], [hidden]
    for c in cache:
        if hasattr(c, "offset"):  # attention KVCache
            trunk.append(("kv", c.keys, c.values, c.offset))
            arrays += [c.keys, c.values]
        else:                      # Gated-DeltaNet ArraysCache: [conv window, recurrent state]
            trunk.append(("gdn", c[0], c[1]))
            arrays += [c[0], c[1]]
    head = (mtp_cache.keys, mtp_cache.values, mtp_cache.offset)
    arrays += [mtp_cache.keys, mtp_cache.values]
    return Snapshot(tuple(ids), trunk, head, hidden, _nbytes(arrays))


def restore(snap: Snapshot, cache: list, mtp_cache) -> mx.array:
    """Put `snap` into fresh caches (from adapter.make_cache / make_mtp_cache); returns its hidden."""
    for c, s in zip(cache, snap.trunk):
        if s[0] == "kv":
            c.keys, c.values, c.offset = _own(s[1]), _own(s[2]), s[3]
        else:
            c[0], c[1] = s[1], s[2]
    keys, values, offset = snap.head
    mtp_cache.keys, mtp_cache.values, mtp_cache.offset = _own(keys), _own(values), offset
    return snap.hidden


class PrefixCache:
    """Snapshots of recent prompts within a memory budget (least recently used go first)."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self._snaps: "OrderedDict[Tuple[int, ...], Snapshot]" = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._snaps.values())

    def __len__(self) -> int:
        return len(self._snaps)

    def lookup(self, prompt: Sequence[int]) -> Optional[Snapshot]:
        """The longest snapshot whose ids are a prefix of `prompt` and leave >= 1 token to run
        (the first token is sampled from the logits of the prompt's last position)."""
        prompt = tuple(prompt)
        best = None
        with self._lock:
            for ids, snap in self._snaps.items():
                n = len(ids)
                if n < len(prompt) and (best is None or n > best.length) and ids == prompt[:n]:
                    best = snap
            if best is not None:
                self._snaps.move_to_end(best.ids)
                self.hits += 1
            else:
                self.misses += 1
        return best

    def store(self, snap: Snapshot) -> None:
        if snap.nbytes > self.budget_bytes:
            return
        with self._lock:
            self._snaps[snap.ids] = snap
            self._snaps.move_to_end(snap.ids)
            total = sum(s.nbytes for s in self._snaps.values())
            while total > self.budget_bytes and self._snaps:
                _, old = self._snaps.popitem(last=False)
                total -= old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._snaps.clear()

    def describe(self) -> dict:
        with self._lock:
            return {"snapshots": len(self._snaps), "bytes": sum(s.nbytes for s in self._snaps.values()),
                    "budget_bytes": self.budget_bytes, "hits": self.hits, "misses": self.misses,
                    "lengths": [s.length for s in self._snaps.values()]}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def marks_within(marks: List[int], start: int, end: int) -> List[int]:
    return sorted({m for m in marks if start < m < end})
