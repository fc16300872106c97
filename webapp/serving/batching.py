"""Continuous batching on the model thread: requests join a running batch and leave it alone.

The model thread (worker.py) runs this scheduler's `step` whenever no call is waiting: newcomers
are admitted while there is room, every running sequence advances by one cycle in shared forwards
(core/batch.py), and then the first newcomer's prefill runs one chunk (`batch_prefill_chunk`
tokens), so a long prompt stalls the others for a chunk per step, not for its whole prefill. A request's
thread only waits on its own queue of events, so a slow reader holds nobody back. A cancel or a
disconnect sets that request's stop: its next event is its last ('stopped'), and its caches are
dropped in that step; the others do not notice.

Limits (settings): `max_batch` sequences at once (1: one at a time, as before batching), and
`max_batched_tokens` positions per verify forward (an MTP sequence at depth D puts D + 1 there,
an AR one 1): a newcomer waits while admitting it would go past either.

The race does not come here: its lanes run alone between the batch's steps, each timed on its
own clock, so its equal-compute rule holds whatever else is being served.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import queue
import sys
import threading
import time
from typing import Callable, Optional


class BatchedStream:
    """One request's events, iterated from its own thread (the interface of worker.WorkerStream)."""

    def __init__(self, scheduler: "BatchScheduler", seq, stop: threading.Event):
        self.scheduler, self.seq, self.stop_event = scheduler, seq, stop
        self.finished = False
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        # What the UI says of it (webapp/ui/chat.py): how many others shared its latest step, and
        # the most that shared one; its place among the requests waiting for room (0: inside).
        self.batched_with = self.most_batched_with = 0

    @property
    def waiting_position(self) -> int:
        try:
            return self.scheduler.waiting.index(self.seq) + 1
        except ValueError:
            return 0

    # -- the model thread's side ----------------------------------------------------------
    def put(self, ev, seconds: float, others: int = 0) -> None:
        # The lane reuses one stats object; this reader may look after later steps changed it.
        self.batched_with, self.most_batched_with = others, max(self.most_batched_with, others)
        self._q.put((dataclasses.replace(ev, stats=copy.copy(ev.stats)), seconds))

    def fail(self, exc: BaseException) -> None:
        self._q.put((exc, 0.0))

    # -- the reader's side ----------------------------------------------------------------
    def timed_next(self):
        """(event, compute seconds of the step that made it); None once finished."""
        if self.finished:
            return None, 0.0
        ev, seconds = self._q.get()
        if isinstance(ev, BaseException):
            self.finished = True
            raise ev
        if ev.finished:
            self.finished = True
        return ev, seconds

    def settle(self) -> float:
        return 0.0   # every step ends with its tokens read: nothing is left queued on the device

    def __iter__(self):
        return self

    def __next__(self):
        ev, _ = self.timed_next()
        if ev is None:
            raise StopIteration
        return ev

    def close(self) -> None:
        """Leave the batch: within one step this sequence gets its 'stopped' event and its
        caches go; nothing else changes."""
        if not self.finished:
            self.stop_event.set()
            self.finished = True


class BatchScheduler:
    def __init__(self, worker, adapter, max_batch: int, max_batched_tokens: int,
                 on_finish: Callable = lambda seq, ev: None, prefill_chunk: int = 64,
                 on_step: Callable = lambda running, waiting: None):
        from core.batch import Batch

        self.worker, self.batch = worker, Batch(adapter, prefill_chunk)
        self.max_batch, self.max_batched_tokens = max_batch, max_batched_tokens
        self.on_finish, self.on_step = on_finish, on_step
        self.waiting: "collections.deque" = collections.deque()
        self.streams = {}        # Sequence -> BatchedStream
        self.steps = 0
        self.batch_sizes = collections.Counter()   # steps run at each batch size (diagnostics)
        worker.pump = self

    def submit(self, decoder, prompt, max_tokens: int, stop: Optional[threading.Event] = None,
               **stream_kwargs) -> BatchedStream:
        """Queue a request (from any thread); it joins the batch at the model thread's next step."""
        from core.batch import Sequence

        stop = stop or threading.Event()

        def make():
            seq = Sequence(decoder, prompt, max_tokens, stop=stop, **stream_kwargs)
            seq.width = 1 + (decoder.max_depth if decoder.mode == "mtp" else 0)
            return seq

        seq = self.worker.call(make)   # a Sequence's arrays belong to the model thread
        stream = BatchedStream(self, seq, stop)
        self.worker.later(self._queue, seq, stream)
        return stream

    def _queue(self, seq, stream) -> None:
        self.waiting.append(seq)
        self.streams[seq] = stream

    # -- on the model thread ----------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self.waiting or self.batch.running or self.batch.joining)

    def _room(self, seq) -> bool:
        inside = self.batch.running + self.batch.joining
        if not inside:
            return True
        return (len(inside) < self.max_batch
                and sum(s.width for s in inside) + seq.width <= self.max_batched_tokens)

    def step(self) -> None:
        while self.waiting and self._room(self.waiting[0]):
            self.batch.admit(self.waiting.popleft())
        if not (self.batch.running or self.batch.joining):
            return
        t0 = time.perf_counter()
        self.batch_sizes[len(self.batch.running)] += 1
        inside = len(self.batch.running) + len(self.batch.joining)
        self.on_step(inside, len(self.waiting))
        try:
            events = self.batch.step()
        except Exception as exc:  # noqa: BLE001 - a failed step fails the sequences in it, not the thread
            print(f"mtp-chat: batched step failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            for seq in list(self.batch.running) + list(self.batch.joining):
                self.batch.leave(seq)
                self._drop(seq, exc)
            return
        self.steps += 1
        dt = time.perf_counter() - t0
        for seq, ev in events.items():
            if isinstance(ev, BaseException):
                self._drop(seq, ev)
            else:
                self._deliver(seq, ev, dt, inside - 1)
        if not (self.batch.running or self.batch.joining or self.waiting):
            self.on_step(0, 0)

    def _deliver(self, seq, ev, seconds: float, others: int = 0) -> None:
        stream = self.streams.get(seq)
        if stream is not None:
            stream.put(ev, seconds, others)
        if ev.finished:
            self.streams.pop(seq, None)
            self.on_finish(seq, ev)

    def _drop(self, seq, exc: BaseException) -> None:
        stream = self.streams.pop(seq, None)
        if stream is not None:
            stream.fail(exc)
