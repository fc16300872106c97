"""One thread owns the model: every call into the engine runs on it.

MLX keeps its streams per thread, and the engine's generators hold lazily built arrays
between steps. Gradio, however, runs each ``next()`` of a streaming event on whichever
worker thread is free, so a decode would hop threads mid-generation and fail with
"There is no Stream(cpu, N) in current thread". Here the model is loaded, warmed up and
stepped on a single dedicated thread; Gradio's threads only wait for the results. It also
serialises model work across every app in the process, whatever the queue does.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterator, Optional, Tuple


class ModelWorker:
    """A daemon thread that runs submitted calls one at a time.

    Not a ThreadPoolExecutor: its thread is joined at interpreter exit, and a thread that
    has used MLX ending that late aborts the process ("terminate called without an active
    exception", exit status 134). A daemon thread that never ends avoids that.
    """

    def __init__(self, name: str = "mtp-model"):
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, args, kwargs, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

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
        self._it: Optional[Iterator[Any]] = worker.call(factory)

    def _step(self) -> Tuple[Any, float]:
        t0 = time.perf_counter()
        try:
            ev = next(self._it)
        except StopIteration:
            ev = None
        if ev is None or getattr(ev, "finished", False):
            self.finished = True
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
            self.worker.call(it.close)
