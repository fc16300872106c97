"""One rank's part of the trunk: its layers, the caches of its layers, what a verify captured.

The layers run through the family's own reference math (adapters/qwen3_5/layers.run_trunk) and
the backend chosen at load, exactly as on one machine: the same runner is picked from the same
(T, fast), so every rank computes what the single process computes on its layers, bit for bit.
"""
from __future__ import annotations

from typing import Dict, Optional

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from core.model import State

from ..qwen3_5 import layers
from ..qwen3_5.adapter import Captured, HybridAdapter, restore_trunk, snapshot_trunk
from ..qwen3_5.layers import AttnParams, GdnParams, Stack


class Stage:
    def __init__(self, adapter: HybridAdapter, held: range):
        self.adapter, self.held = adapter, held
        params = adapter.stack.layers[held.start:held.stop]
        self.stack = Stack(
            layers=params,
            fa_idx=next((i for i, p in enumerate(params) if isinstance(p, AttnParams)), None),
            ssm_idx=next((i for i, p in enumerate(params) if isinstance(p, GdnParams)), None),
        )

    def make_cache(self) -> list:
        return [ArraysCache(size=2) if isinstance(p, GdnParams) else KVCache() for p in self.stack.layers]

    def run(self, h: mx.array, cache: list, T: int, capture: bool, fast: bool):
        """h [1, T, H] (the embedding, or the previous rank's output) through the held layers:
        -> (runner, last hidden as the runner keeps it, Captured or None)."""
        run = self.adapter.backend.runner((1, T), fast)
        h, gdn = layers.run_trunk(run, self.stack, run.enter(h), cache, capture)
        return run, h, (Captured(T, gdn) if capture else None)

    def rollback(self, cache: list, captured: Optional[Captured], keep: int) -> None:
        if captured is not None:
            self.adapter.rollback(cache, captured, keep)

    def snapshot(self, cache: list, arrays: Optional[Dict] = None, meta: Optional[Dict] = None) -> State:
        arrays, meta = ({} if arrays is None else arrays), ({} if meta is None else meta)
        snapshot_trunk(cache, arrays, meta, first=self.held.start)
        return State(arrays, meta)

    def restore(self, state: State, cache: list) -> None:
        restore_trunk(state, cache, first=self.held.start)

    def state_arrays(self, cache: list) -> list:
        return [c.state for c in cache]
