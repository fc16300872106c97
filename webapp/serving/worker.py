"""One thread owns the model: every call into the engine runs on it.

MLX keeps its streams per thread, and the engine's generators hold lazily built arrays
between steps. Gradio, however, runs each ``next()`` of a streaming event on whichever
worker thread is free, so a decode would hop threads mid-generation and fail with
"There is no Stream(cpu, N) in current thread". Here the model is loaded, warmed up and
stepped on a single dedicated thread; Gradio's threads only wait for the results. It also
serialises model work across every app in the process, whatever the queue does.
"""
from __future__ import annotations

import atexit
import collections
import queue
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Iterator, Optional, Tuple

IDLE_POLL = 0.02  # how often an idle thread with background work checks that nobody is waiting
_WORKERS: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _quiesce() -> None:
    """At exit, no background slice may be running MLX work: a thread that is in MLX while the
    interpreter ends aborts the process ("terminate called without an active exception")."""
    for worker in list(_WORKERS):
        worker.closed = True      # work queued from now on never starts (a call already queued may add some)
        worker._idle.clear()
        with worker._slice_lock:  # waits for the slice in progress, if any
            pass


class ModelWorker:
    """A daemon thread that runs submitted calls one at a time.

    Not a ThreadPoolExecutor: its thread is joined at interpreter exit, and a thread that
    has used MLX ending that late aborts the process ("terminate called without an active
    exception", exit status 134). A daemon thread that never ends avoids that.

    Background work (`in_idle_time`: measuring the cost model) runs one short slice at a time,
    and only while no call waits and no stream is open: a request that arrives waits for at
    most the slice in progress, never for the whole measurement.
    """

    def __init__(self, name: str = "mtp-model"):
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._idle: "collections.deque" = collections.deque()   # iterators, one slice per next()
        self._open_streams = 0
        self._lock, self._slice_lock = threading.Lock(), threading.Lock()
        self.idle_slices = 0      # background slices run so far
        self.closed = False       # the interpreter is ending: no background slice starts (_quiesce)
        # A batch scheduler (webapp/serving/batching.py): while busy() it steps whenever no call waits.
        self.pump = None
        # What happened in order, for diagnostics and tests: ("slice", n), ("open"|"end", stream id).
        self.events: "collections.deque" = collections.deque(maxlen=4096)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        _WORKERS.add(self)
        self._thread.start()

    def _run(self) -> None:
        while True:
            pump = self.pump
            busy = pump is not None and pump.busy()
            try:
                if busy:   # calls first (a joining request, a cancel), then one batched step
                    fn, args, kwargs, future = self._jobs.get_nowait()
                else:
                    fn, args, kwargs, future = self._jobs.get(timeout=IDLE_POLL if self._idle else None)
            except queue.Empty:
                if busy:
                    try:
                        pump.step()
                    except Exception as exc:  # noqa: BLE001 - the model thread must go on
                        print(f"mtp-chat: batch scheduler: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                elif self._open_streams == 0:
                    self._idle_slice()
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

    def _idle_slice(self) -> None:
        with self._slice_lock:
            if self.closed:
                self._idle.clear()
            if not self._idle:
                return
            work = self._idle[0]
            try:
                next(work)
            except StopIteration:
                self._idle.popleft()
            except Exception as exc:  # noqa: BLE001 - background work must not stop the model thread
                self._idle.popleft()
                print(f"mtp-chat: background work stopped: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            self.idle_slices += 1
            self.events.append(("slice", self.idle_slices))

    def in_idle_time(self, work: Iterator[Any], first: bool = False) -> None:
        """Run `work` (an iterator: each next() is one short slice) when the model is idle, after
        the background work waiting now, or (`first`) before it."""
        self.later(self._idle.appendleft if first else self._idle.append, work)  # on the model thread

    def _stream_opened(self, stream) -> None:
        with self._lock:
            self._open_streams += 1
            self.events.append(("open", id(stream)))

    def _stream_ended(self, stream) -> None:
        with self._lock:
            self._open_streams -= 1
            self.events.append(("end", id(stream)))

    def later(self, fn: Callable, *args, **kwargs) -> Future:
        """Queue ``fn`` on the model thread behind what is queued now; do not wait for it."""
        future: Future = Future()
        self._jobs.put((fn, args, kwargs, future))
        return future

    def call(self, fn: Callable, *args, **kwargs) -> Any:
        """Run ``fn`` on the model thread and return its result (or raise its exception)."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        future: Future = Future()
        self._jobs.put((fn, args, kwargs, future))
        return future.result()

    def stream(self, factory: Callable[[], Iterator[Any]]) -> "WorkerStream":
        return WorkerStream(self, factory)


def synchronize() -> None:
    """Wait until the device work queued on this thread is done.

    Uses ``core.synchronize`` when the engine offers it; until then this is the one place
    the web app reaches past core to MLX (``mx.synchronize``).
    """
    import core

    sync = getattr(core, "synchronize", None)
    if sync is None:
        import mlx.core as mx

        sync = mx.synchronize
    sync()


class WorkerStream:
    """An engine stream that lives on the model thread, iterated from any thread.

    ``timed_next()`` also returns how long the step computed, measured on the model thread
    itself, so a race lane's own clock does not include the hand-off between threads.
    """

    def __init__(self, worker: ModelWorker, factory: Callable[[], Iterator[Any]]):
        self.worker = worker
        self.finished = False
        self.stop_event = None   # set by the owner (ModelHost.stream): a close before the end sets it
        worker._stream_opened(self)  # background work waits until the stream ends or is closed
        self._counted = True
        try:
            self._it: Optional[Iterator[Any]] = worker.call(factory)
        except BaseException:
            self._end()
            raise

    def _end(self) -> None:
        if self._counted:
            self._counted = False
            self.worker._stream_ended(self)

    def __del__(self):  # a stream dropped without close() must not hold background work back forever
        if getattr(self, "_counted", False):
            self._end()

    def _step(self) -> Tuple[Any, float]:
        t0 = time.perf_counter()
        try:
            ev = next(self._it)
        except StopIteration:
            ev = None
        if ev is None or getattr(ev, "finished", False):
            self.finished = True
            self._end()
        return ev, time.perf_counter() - t0

    def timed_next(self) -> Tuple[Any, float]:
        """(event, compute seconds); the event is None once the stream is exhausted."""
        if self._it is None:
            return None, 0.0
        return self.worker.call(self._step)

    def settle(self) -> float:
        """Finish the device work this stream left queued (the AR lane evaluates its next
        step asynchronously before yielding); returns the seconds it took, on the model thread.
        The race calls it when it switches lanes, so that work is charged to this lane and not
        to the next lane's first step."""
        def run() -> float:
            t0 = time.perf_counter()
            synchronize()
            return time.perf_counter() - t0

        return self.worker.call(run)

    def __iter__(self) -> "WorkerStream":
        return self

    def __next__(self) -> Any:
        ev, _ = self.timed_next()
        if ev is None:
            raise StopIteration
        return ev

    def close(self) -> None:
        """Close the engine's generator on the model thread. Closed before it finished (a
        client's cancel, a closed tab), it sets the stream's stop event first, so that a long
        prefill running now ends at its next chunk instead of being waited out."""
        it, self._it = self._it, None
        if it is not None:
            if not self.finished and self.stop_event is not None:
                self.stop_event.set()
            try:
                self.worker.call(it.close)
            finally:
                self._end()
