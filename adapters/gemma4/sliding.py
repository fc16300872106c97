"""The K/V of a sliding-window layer: what the window and a rollback can still need, not the
whole context.

mlx-lm's RotatingKVCache overwrites the oldest entries in place, so once it has wrapped it
cannot drop a rejected suffix (the entries the suffix overwrote are gone). A plain KVCache can,
but keeps every position: on E2B 1 KiB a token per sliding layer, and each step's attention
still reads the whole context behind a mask. This cache keeps a plain buffer whose first entry
is at absolute position `start`, and before each write moves `start` forward, in whole
`every`-position blocks, to at most the first position the write's earliest query sees. A
rollback never goes back before that query (a verify keeps at least its first position), so
any rejected suffix can be dropped, and the window of every later query is still held. `start`
depends only on the position of the write, so a prefill in the same chunks, restored or not,
holds the same entries.

`offset` stays absolute (RoPE positions, the adapter's bookkeeping); the attention gets only the
keys of the window of its earliest query, with the mask over exactly those (`make_mask`).
"""
from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache


class SlidingKVCache(KVCache):
    def __init__(self, window: int, every: int = 256):
        super().__init__()
        self.window, self.every = window, every
        self.start = 0

    @property
    def held(self) -> int:
        """Positions in the buffer: start .. offset - 1."""
        return self.offset - self.start

    def _first(self, offset: int) -> int:
        """The first absolute position a query at `offset` attends to."""
        return max(self.start, offset - self.window + 1)

    def _slide(self) -> None:
        """Drop the whole blocks that no query at or after `offset` can see."""
        start = max(0, (self.offset - self.window + 1) // self.every * self.every)
        if start > self.start and self.keys is not None:
            cut = start - self.start
            self.keys = mx.contiguous(self.keys[..., cut:self.held, :])
            self.values = mx.contiguous(self.values[..., cut:self.held, :])
            self.start += cut

    def update_and_fetch(self, keys, values):
        self._slide()
        offset, n = self.offset, keys.shape[2]
        self.offset = offset - self.start           # KVCache's bookkeeping in buffer positions
        k, v = KVCache.update_and_fetch(self, keys, values)
        self.offset = offset + n
        first = self._first(offset) - self.start
        return k[..., first:, :], v[..., first:, :]

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        """The mask over the keys update_and_fetch returns: positions first(offset) .. offset+N-1."""
        if N == 1 and not return_array:
            return None                              # every returned key is within the window
        q = mx.arange(self.offset, self.offset + N)[:, None]
        k = mx.arange(self._first(self.offset), self.offset + N)[None]
        return (k <= q) & (q - k < self.window)

    def window_kv(self, query_position: int):
        """(keys, values) a query at `query_position` (<= offset) attends to: the drafter's view."""
        first = max(0, query_position - self.window + 1)
        assert first >= self.start, "the cache no longer holds that window"
        return (self.keys[..., first - self.start:self.held, :], self.values[..., first - self.start:self.held, :])

    def trim(self, n):
        n = min(self.held, n)
        self.offset -= n
        return n

    def size(self):
        return self.offset

    @property
    def state(self):
        if self.keys is None:
            return self.keys, self.values
        return self.keys[..., :self.held, :], self.values[..., :self.held, :]

    @state.setter
    def state(self, v):
        self.keys, self.values = v
        self.offset = self.start + (0 if self.keys is None else self.keys.shape[2])

    @property
    def nbytes(self):
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes
