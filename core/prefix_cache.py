"""Reuse of computed prompt state across requests (multi-turn chat, regenerate, the race).

A snapshot is the whole decoding state at a prompt position P: what the adapter's `snapshot`
returns for the trunk's cache and the drafter's state (for Qwen3.5: attention KV up to P, the
Gated-DeltaNet conv windows and recurrent states at P, the MTP head's own KV history of
positions 0..P-2) and the trunk's hidden state at P-1, which the drafter pairs with token P
when the prompt goes on. Restoring it and prefilling the rest of a new prompt leaves the lanes
exactly where a fresh prefill would. What a snapshot holds is the adapter's business
(core.model.State: named arrays and small facts); this module only matches, keeps the most
recently used and stays within its budget.

Snapshots are taken only during prefill, at positions the prompt marks (the end of the system
prompt, the end of the history just before the generation prompt: the point the next turn
shares once thinking is dropped). A recurrent state cannot be trimmed back, so only marked
positions are reusable.

MLX arrays are immutable values (an in-place update only happens when nothing else holds the
buffer), so a snapshot holds references, never copies, and a lane decoding after a restore
cannot change it: a Stop mid-reply leaves every snapshot as it was. The exception is the Python
array object itself: a KV cache writes `keys[..., i:j, :] = new`, which rebinds that object, so
an adapter's `restore` gives every cache its own objects over the snapshot's data. Reuse is
matched on token ids (longest stored prefix of the new prompt), never on message text.

With a `DiskCache` (core/disk_cache.py) every snapshot is also written to disk (the part of each
buffer that holds data, and the hidden), in the model's idle time when the app passes `defer`,
and a lookup that finds a longer prefix on disk than in memory loads it: a restarted server's
next turn prefills only its new message. Loading is far cheaper than the prefill it replaces
(docs/bench/cpu-disk-cache-demo.json, demo model on a 2-core CPU: a 2,385-token state, 17.5 MB,
loads with its checksum in 51 ms where its prefill takes 7.1 s; turn 11 after a restart starts
in 1.25x the warm server's time to first token).
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import mlx.core as mx

from .model import State


@dataclass
class Snapshot:
    """The decoding state after a prompt's first P tokens: the adapter's `State` of the trunk
    cache and the drafter (see core.model), and the trunk's hidden at P-1, which the drafter
    pairs with token P when the prompt goes on."""

    ids: Tuple[int, ...]        # the prompt tokens [0, P)
    state: State
    hidden: mx.array            # [1, 1, H]

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return self.state.nbytes + self.hidden.nbytes


HIDDEN = "snapshot.hidden"  # the hidden's name among a snapshot's arrays on disk


class PrefixCache:
    """Snapshots of recent prompts within a memory budget (least recently used go first), and
    optionally on disk (`disk`, a core.disk_cache.DiskCache). `defer(fn)` schedules a disk
    write (the app: in the model thread's idle time, the file on the disk cache's writer thread);
    None writes at once. `spill`, `flush` and loads run MLX, so they belong on the thread that
    owns the model."""

    def __init__(self, budget_bytes: int, disk=None, defer: Optional[Callable[[Callable[[], int]], None]] = None):
        self.budget_bytes = int(budget_bytes)
        self.disk, self.defer = disk, defer
        self._snaps: "OrderedDict[Tuple[int, ...], Snapshot]" = OrderedDict()
        self._pending: "deque[Snapshot]" = deque()   # stored in memory, not yet on disk
        self._lock = threading.Lock()
        self.hits = self.misses = self.disk_hits = 0

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
        while self.disk is not None:   # a damaged entry is removed as it fails: try the next longest
            entry = self.disk.longest(prompt)
            if entry is None or (best is not None and len(entry.ids) <= best.length):
                break
            loaded = self._load(entry)
            if loaded is not None:
                best = loaded
                self._keep(loaded)
                break
        with self._lock:
            if best is not None:
                if best.ids in self._snaps:
                    self._snaps.move_to_end(best.ids)
                self.hits += 1
            else:
                self.misses += 1
        return best

    def store(self, snap: Snapshot) -> None:
        self._keep(snap)
        if self.disk is None or not self.disk.writable:
            return
        with self._lock:
            self._pending.append(snap)
        if self.defer is None:
            self.spill()
        else:
            self.defer(self.spill)

    # --- disk ---------------------------------------------------------------------------------
    def spill(self) -> int:
        """Write the snapshots not yet on disk; returns how many were written or handed over.
        With `defer` (the app), only copying a snapshot to host memory runs here (the model's
        thread, in its idle time) and the writer thread does the rest, one snapshot at a time:
        when it is done it defers the next spill. Without, everything is written now."""
        return self._spill(now=self.defer is None)

    def flush(self, timeout: Optional[float] = None) -> int:
        """At shutdown: the write under way ends, then every snapshot still waiting is written
        on this thread (the model's); returns how many."""
        if self.disk is None:
            return 0
        self.disk.wait(timeout)
        return self._spill(now=True)

    def _spill(self, now: bool) -> int:
        self.disk.release()   # the last write's host copy, dropped here on the model's thread
        handed = 0
        while True:
            with self._lock:
                if not self._pending or (not now and self.disk.writing):
                    return handed
                snap = self._pending.popleft()
            arrays = {name: snap.state.valid(name) for name in snap.state.arrays}
            arrays[HIDDEN] = snap.hidden
            meta = dict(snap.state.meta)
            if now:
                handed += bool(self.disk.store(snap.ids, arrays, meta))
            else:
                handed += self.disk.store_soon(snap.ids, arrays, meta, done=lambda: self.defer(self.spill))

    def preload(self) -> Tuple[int, int]:
        """At start-up, on the model's thread: the most recently used disk entries that fit the
        memory budget, loaded now, so that the first turn after a restart starts from memory (an
        agent's next turn extends the snapshot its last turn left, the newest). Returns (snapshots,
        bytes) loaded."""
        if self.disk is None:
            return 0, 0
        picked, total = [], 0
        for entry in self.disk.newest():
            if total + entry.nbytes > self.budget_bytes:
                break
            picked.append(entry)
            total += entry.nbytes
        loaded = []
        for entry in reversed(picked):   # the newest kept last: the least likely to be evicted
            snap = self._load(entry, count=False)
            if snap is not None:
                self._keep(snap)
                loaded.append(snap)
        return len(loaded), sum(s.nbytes for s in loaded)

    def _load(self, entry, count: bool = True) -> Optional[Snapshot]:
        got = self.disk.load(entry, count)   # None: it failed its checks, was logged and removed
        if got is None:
            return None
        ids, arrays, meta = got
        hidden = arrays.pop(HIDDEN, None)
        if hidden is None:
            return None
        with self._lock:
            self.disk_hits += count
        return Snapshot(ids, State(arrays, meta), hidden)

    def _keep(self, snap: Snapshot) -> None:
        if snap.nbytes > self.budget_bytes:
            return
        with self._lock:
            self._snaps[snap.ids] = snap
            self._snaps.move_to_end(snap.ids)
            total = sum(s.nbytes for s in self._snaps.values())
            while total > self.budget_bytes and self._snaps:
                _, old = self._snaps.popitem(last=False)
                total -= old.nbytes

    def newest(self) -> Optional[Snapshot]:
        """The snapshot kept or used last (after `preload`: the newest entry on disk)."""
        with self._lock:
            return next(reversed(self._snaps.values()), None)

    def clear(self) -> None:
        with self._lock:
            self._snaps.clear()

    def describe(self) -> dict:
        with self._lock:
            d = {"snapshots": len(self._snaps), "bytes": sum(s.nbytes for s in self._snaps.values()),
                 "budget_bytes": self.budget_bytes, "hits": self.hits, "misses": self.misses,
                 "lengths": [s.length for s in self._snaps.values()], "disk_hits": self.disk_hits}
        if self.disk is not None:
            d["disk"] = self.disk.describe()
        return d


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def marks_within(marks: List[int], start: int, end: int) -> List[int]:
    return sorted({m for m in marks if start < m < end})
