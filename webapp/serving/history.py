"""Snapshots of conversations after their replies, taken when nobody is waiting.

After a reply the app snapshots the conversation, reply included, as the next turn's prompt will
begin (core.stream.history_steps): the next turn then prefills only its new message. That takes a
prefill of the reply, so it waits: `grace` seconds without a request, then the model's idle time
(no call waiting, no reply streaming). A request that begins with a conversation whose snapshot
has not started drops it and prefills the reply with its own new tokens. One that is under way
goes on: the request queues behind it on the model thread and starts from it, so the reply's
prefill runs while the client is busy (an agent's tool, a person typing) instead of in the next
turn's time to first token. Stopping it at its next chunk instead lost the chunks already run (an
agent's next call comes ~0.1 s after the reply: docs/bench/2026-12-03/GPU.md section 14). (In
section 11 waiting for it saved nothing: a chunk then cost ~0.2 s more at each new length.)
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import List, Optional

_ALL: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _end_all() -> None:
    """At exit: no snapshot starts, and the one under way ends at its next chunk before Python
    finalizes (MLX work on the model thread then aborts the process, webapp/serving/worker.py)."""
    for snapshots in list(_ALL):
        snapshots.end()


class _Stop(threading.Event):
    """A waiting snapshot's stop: set by a request that covers it, and set by itself once the
    interpreter is ending (the main thread has finished), for the same reason as _end_all."""

    def is_set(self) -> bool:
        return super().is_set() or not threading.main_thread().is_alive()


@dataclass
class Pending:
    """One conversation's snapshot: the history (a core Prompt), its stop, the timer that queues
    it when the grace ends."""

    history: object
    stop: threading.Event = field(default_factory=_Stop)
    timer: Optional[threading.Timer] = None
    queued: bool = False
    running: bool = False   # on the model thread now: a request that begins with it waits for it


class HistorySnapshots:
    """The conversations waiting for their snapshot, for one loaded model and its prefix cache."""

    def __init__(self, adapter, prefix_cache, worker, grace: float):
        self.adapter, self.prefix_cache, self.worker = adapter, prefix_cache, worker
        self.grace = grace
        self.pending: List[Pending] = []
        self.lock = threading.Lock()
        self._taking = threading.Lock()   # held while a snapshot runs on the model thread
        _ALL.add(self)

    def remember(self, history) -> None:
        """A reply ended: snapshot `history` when its grace has passed, unless dropped first."""
        pending = Pending(history)
        with self.lock:
            self.pending.append(pending)
        if self.grace > 0:
            pending.timer = threading.Timer(self.grace, self._queue, (pending,))
            pending.timer.daemon = True
            pending.timer.start()
        else:
            self._queue(pending)

    def drop_within(self, prompt_ids) -> None:
        """A request about to prefill: the snapshots of conversations it begins with that have not
        started are dropped (it prefills through them anyway, and snapshots at its own marks); one
        under way finishes first, and the request starts from it."""
        if not self.pending:   # every request passes here: nothing to copy when nothing waits
            return
        ids = tuple(getattr(prompt_ids, "ids", prompt_ids))
        with self.lock:
            for pending in self.pending:
                theirs = tuple(pending.history.ids)
                if not pending.running and len(theirs) <= len(ids) and ids[:len(theirs)] == theirs:
                    pending.stop.set()

    def now(self) -> None:
        """Queue every snapshot still in its grace now (at shutdown, and for tests)."""
        with self.lock:
            waiting = [p for p in self.pending if not p.queued]
        for pending in waiting:
            if pending.timer is not None:
                pending.timer.cancel()
            self._queue(pending)

    def wait(self, timeout: float = 60.0) -> bool:
        """Until no conversation's snapshot is waiting (a client pausing as a person would);
        True when none is."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if not self.pending:
                    return True
            time.sleep(0.01)
        return False

    def end(self) -> None:
        """No waiting snapshot starts, and the one under way ends at its next chunk; returns
        once it has (at exit; a test's server going away)."""
        with self.lock:
            for pending in self.pending:
                pending.stop.set()
                if pending.timer is not None:
                    pending.timer.cancel()
        with self._taking:
            pass

    def _queue(self, pending: Pending) -> None:
        with self.lock:
            if pending.queued:
                return
            pending.queued = True
        if pending.stop.is_set():
            self._done(pending)
        else:   # when the model is idle (no call waiting, no reply streaming): one slice, the whole
            # snapshot, before the background work waiting (the disk's writes, the cost model's
            # measures): behind them it had not started when an agent's next call came ~0.1 s
            # after the reply, which then prefilled the reply again (GPU.md section 16)
            self.worker.in_idle_time((self._take(pending) for _ in range(1)), first=True)

    def _take(self, pending: Pending) -> None:
        """On the model thread: the snapshot, a prefill chunk at a time (a request that begins
        with it ends it at the next chunk)."""
        from core.stream import PrefillStopped, history_steps, run_through

        try:
            with self._taking:
                with self.lock:   # from here a request that begins with it waits for it (drop_within)
                    pending.running = not pending.stop.is_set()
                if pending.running:
                    run_through(history_steps(self.adapter, pending.history, self.prefix_cache, pending.stop))
        except PrefillStopped:
            pass
        finally:
            self._done(pending)

    def _done(self, pending: Pending) -> None:
        with self.lock:
            self.pending.remove(pending)
