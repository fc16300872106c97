"""Which trunk layers each rank holds: contiguous ranges in pipeline order, balanced by bytes.

Rank N-1 takes the first layers, rank 0 the last (it also holds the output projection and the
MTP head, `extra` bytes, so it takes fewer layers). `capacity[r]` weights rank r's share: the
memory each rank reports, so that a 64 GB Mac next to a 192 GB one gets a third of the layers.
"""
from __future__ import annotations

from typing import List, Optional, Sequence


def split_layers(sizes: Sequence[int], ranks: int, extra: int = 0,
                 capacity: Optional[Sequence[float]] = None) -> List[range]:
    """Per rank r, the range of layers it holds (every rank at least one layer)."""
    L = len(sizes)
    if ranks > L:
        raise ValueError(f"{ranks} ranks for a trunk of {L} layers: at most one rank per layer")
    capacity = list(capacity or [1.0] * ranks)
    order = list(range(ranks - 1, -1, -1))           # pipeline order: rank N-1 first
    total = sum(sizes) + extra
    shares = [total * capacity[r] / sum(capacity) for r in order]
    bounds, start, used = [], 0, 0.0
    for s, r in enumerate(order[:-1]):
        target = sum(shares[: s + 1])
        stop = start + 1                              # at least one layer
        while stop < L - (ranks - 1 - s) and used + sum(sizes[start:stop + 1]) <= target:
            stop += 1
        used += sum(sizes[start:stop])
        bounds.append(range(start, stop))
        start = stop
    bounds.append(range(start, L))
    by_rank = [range(0)] * ranks
    for r, b in zip(order, bounds):
        by_rank[r] = b
    return by_rank
