"""Rank 0's adapter: the whole pipeline as one core.model.Adapter.

core runs its draft-verify-accept cycle unchanged. A forward sends [header, tokens] to rank N-1,
receives the hidden state of the layers before its own from rank 1, and finishes: its layers, the
final norm, the output projection. The MTP head and the sampler live here, so drafting sends
nothing. Rollback commits rank 0's layers at once and queues (cache, keep) for the others, which
apply it before the next command for any cache: every rank keeps exactly the verified prefix of
every verify, in the same order as rank 0. Caches and snapshots have ids on the wire; the other
ranks keep their layers' part under the same id, dropped when rank 0's object is collected.

Faults: the ring backend raises within about a second when a peer's socket closes (a rank that
died); a rank that stops answering is found by a watchdog (watchdog.py) that cuts the ring's
connections after `timeout` seconds of one exchange, so the blocked receive fails too. Either way
the pipeline is marked down: one line to the log naming the rank, a `PipelineDown` (HTTP 503 for
the API) for the request in flight and for every later one, until the ranks are restarted
(mx.distributed cannot be set up twice in one process).
"""
from __future__ import annotations

import itertools
import time
import weakref
from collections import deque
from typing import Callable, List, Optional

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from core.model import State

from ..qwen3_5.adapter import HybridAdapter, _own
from . import wire
from .stage import Stage
from .watchdog import Watchdog, sever_ring
from .wire import FORWARD, FREE_CACHE, FREE_SNAPSHOT, NOOP, RESTORE, ROLLBACK, SNAPSHOT, STOP, Header, Link


class PipelineDown(RuntimeError):
    """The pipeline lost a rank: requests fail with this until its ranks are restarted."""

    http_status = 503


class PipelineCache(list):
    """Rank 0's layers' caches; `id` names this sequence's caches on the other ranks."""

    id: int = 0


class PipelineAdapter:
    def __init__(self, local: HybridAdapter, stage: Stage, link: Link, split: List[range], memory: List[int],
                 backend_name: str = "ring", timeout: float = 60.0, log: Callable[[str], None] = print):
        self.local, self.stage, self.link = local, stage, link
        self.split, self.memory, self.backend_name = split, memory, backend_name
        self.tokenizer, self.context_length, self.vocab_size = local.tokenizer, local.context_length, local.vocab_size
        self.contract, self.family, self.path, self.config = local.contract, local.family, local.path, local.config
        self.backend = local.backend
        self._ids = itertools.count(1)
        self._queued: deque = deque()     # items for the next header (a GC callback may append: deque is atomic)
        self._hidden = local.contract.hidden_size
        self.timeout, self.log = timeout, log
        self.down: Optional[str] = None   # why the pipeline is down, once it is
        self._watchdog = Watchdog(timeout, lambda: sever_ring(link.rank)) if link.size > 1 else None
        # Where a forward's time goes: waiting on the wire in all, of it the other ranks' compute.
        self.wire_seconds = self.remote_seconds = 0.0
        self.forwards = 0

    # -- the wire ------------------------------------------------------------------------------
    def _exchange(self, fn, *args):
        """fn(*args) under the watchdog; a lost rank marks the pipeline down (see the docstring)."""
        if self.down:
            raise PipelineDown(self.down)
        self._watchdog.arm()
        try:
            return fn(*args)
        except RuntimeError as exc:   # the ring backend: "[ring] connection to a peer was lost"
            why = f"no answer within {self.timeout:g} s" if self._watchdog.fired else str(exc)
        finally:
            self._watchdog.disarm()
        n = self.link.size
        who = "rank 1" if n == 2 else f"rank {n - 1} or rank 1 (rank 0's neighbours) or a rank between them"
        self.down = (f"the pipeline lost {who}: {why}. Requests fail until every rank is started again "
                     f"(mlx.launch ... mtp-chat --distributed)")
        self.log(self.down)
        raise PipelineDown(self.down)

    def _command(self, header: Header, payload: Optional[mx.array] = None, answer: bool = False):
        """Send a header (with what is queued) and a payload to rank N-1; with `answer`, wait for
        rank 1's hidden state."""
        if payload is not None:
            mx.eval(payload)  # its compute is not the wire's time
        return self._exchange(self._send, header, payload, answer)

    def _send(self, header: Header, payload: Optional[mx.array], answer: bool):
        """What is queued goes first (NOOP headers while more than one holds)."""
        while len(self._queued) > wire.MAX_ITEMS:
            self.link.send_header(Header(NOOP, items=tuple(self._queued.popleft() for _ in range(wire.MAX_ITEMS))))
        items = []
        while self._queued and len(items) < wire.MAX_ITEMS:
            items.append(self._queued.popleft())
        header.items = tuple(items)
        self.link.send_header(header)
        if payload is not None:
            self.link.send(payload)
        if answer:
            back = self.link.recv_header()  # rank 1's: the hidden state's dtype, the ranks' compute
            self.remote_seconds += back.work / 1e6
            return self.link.recv((1, header.T, self._hidden), wire.DTYPES[back.dtype])
        return None

    def close(self) -> None:
        """Tell the other ranks to exit."""
        if self.link.size > 1 and not self.down:
            self._command(Header(STOP))

    # -- caches ------------------------------------------------------------------------------
    def make_cache(self) -> PipelineCache:
        cache = PipelineCache(self.stage.make_cache())
        cache.id = next(self._ids)
        weakref.finalize(cache, self._queued.append, (FREE_CACHE, cache.id, 0))
        return cache

    def make_draft(self, cache) -> KVCache:
        return KVCache()

    def state_arrays(self, cache, draft) -> list:
        return self.stage.state_arrays(cache) + ([draft.state] if draft is not None else [])

    # -- trunk -------------------------------------------------------------------------------
    def forward(self, tokens: mx.array, cache, *, all_logits: bool = True, capture: bool = False, fast: bool = True,
                images=()):
        if images:  # the adapter has no `vision`: the app and the API refuse pictures before this
            raise ValueError("pictures are not read over a pipeline of ranks: start the model on one machine")
        if tokens.shape[0] != 1:
            raise ValueError("the pipeline decodes one sequence at a time (B = 1)")
        T = tokens.shape[1]
        if self.link.size > 1:
            t0 = time.perf_counter()
            h = self._command(Header(FORWARD, cache.id, T, capture, fast), tokens.astype(mx.int32), answer=True)
            self.wire_seconds += time.perf_counter() - t0
            self.forwards += 1
        else:
            h = self.local.inner.embed_tokens(tokens)
        run, h, captured = self.stage.run(h, cache, T, capture, fast)
        return self.local.outputs(run, h, all_logits, captured)

    def rollback(self, cache, captured, keep: int) -> None:
        self.local.rollback(cache, captured, keep)
        self._queued.append((ROLLBACK, cache.id, keep))

    # -- the MTP head: rank 0's alone ------------------------------------------------------------
    def absorb(self, draft, cache, hidden, tokens) -> None:
        self.local.absorb(draft, cache, hidden, tokens)

    def draft_step(self, draft, cache, hidden, tokens):
        return self.local.draft_step(draft, cache, hidden, tokens)

    def end_cycle(self, draft, steps: int) -> None:
        self.local.end_cycle(draft, steps)

    def lm_head(self, x, run=None):
        return self.local.lm_head(x, run)

    # -- prefix cache: each rank keeps its own layers' states under one key --------------------------
    def snapshot(self, cache, draft) -> State:
        key = next(self._ids)
        arrays, meta = {}, {"pipeline.snapshot": key}
        self.stage.snapshot(cache, arrays, meta)
        meta["draft.keys.length"] = meta["draft.values.length"] = draft.offset
        if draft.keys is not None:
            arrays["draft.keys"], arrays["draft.values"] = draft.keys, draft.values
        if self.link.size > 1:
            self._command(Header(SNAPSHOT, cache.id, key=key))
        state = State(arrays, meta)
        weakref.finalize(state, self._queued.append, (FREE_SNAPSHOT, key, 0))
        return state

    def restore(self, state: State, cache, draft) -> None:
        key = state.meta.get("pipeline.snapshot")
        if key is None:
            raise ValueError("this snapshot was not taken by the pipeline (a disk cache's?): the other ranks "
                             "do not hold its layers")
        self.stage.restore(state, cache)
        a = state.arrays
        draft.keys, draft.values, draft.offset = _own(a.get("draft.keys")), _own(a.get("draft.values")), state.meta["draft.keys.length"]
        if self.link.size > 1:
            self._command(Header(RESTORE, cache.id, key=int(key)))

    # -- for people ------------------------------------------------------------------------------
    def ranks(self) -> List[str]:
        """One line per rank: its layers and its memory."""
        return [f"rank {r}: layers {s.start}-{s.stop - 1} ({len(s)}), {self.memory[r] / 1024:.1f} GB memory"
                + (" + final norm, output projection, MTP head, sampler, server" if r == 0 else "")
                for r, s in enumerate(self.split)]

    def describe(self) -> str:
        return (f"{self.local.describe()}; pipeline over {self.link.size} ranks ({self.backend_name}): "
                + ", ".join(f"rank {r} layers {s.start}-{s.stop - 1}" for r, s in enumerate(self.split)))
