"""One thread owns the model: every call into the engine runs on it.

MLX keeps its streams per thread, and the engine's generators hold lazily built arrays
between steps. Gradio, however, runs each ``next()`` of a streaming event on whichever
worker thread is free, so a decode would hop threads mid-generation and fail with
"There is no Stream(cpu, N) in current thread". Here the model is loaded, warmed up and
stepped on a single dedicated thread; Gradio's threads only wait for the results. It also
serialises model work across every app in the process, whatever the queue does.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional, Tuple


class ModelWorker:
    def __init__(self, name: str = "mtp-model"):
        self._ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._ident = self._ex.submit(threading.get_ident).result()

    def call(self, fn: Callable, *args, **kwargs) -> Any:
        """Run ``fn`` on the model thread and return its result (or raise its exception)."""
        if threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._ex.submit(fn, *args, **kwargs).result()

    def stream(self, factory: Callable[[], Iterator[Any]]) -> "WorkerStream":
        return WorkerStream(self, factory)


class WorkerStream:
    """An engine stream that lives on the model thread, iterated from any thread.

    ``timed_next()`` also returns how long the step computed, measured on the model thread
    itself, so a race lane's own clock does not include the hand-off between threads.
    """

    def __init__(self, worker: ModelWorker, factory: Callable[[], Iterator[Any]]):
        self.worker = worker
        self._it: Optional[Iterator[Any]] = worker.call(factory)

    def _step(self) -> Tuple[Any, float]:
        t0 = time.perf_counter()
        try:
            ev = next(self._it)
        except StopIteration:
            ev = None
        return ev, time.perf_counter() - t0

    def timed_next(self) -> Tuple[Any, float]:
        """(event, compute seconds); the event is None once the stream is exhausted."""
        if self._it is None:
            return None, 0.0
        return self.worker.call(self._step)

    def __iter__(self) -> "WorkerStream":
        return self

    def __next__(self) -> Any:
        ev, _ = self.timed_next()
        if ev is None:
            raise StopIteration
        return ev

    def close(self) -> None:
        it, self._it = self._it, None
        if it is not None:
            self.worker.call(it.close)
