"""One API decode: ``host.stream`` stepped from a helper thread, its events read from asyncio.

The decode runs on the one model thread (``ModelHost.worker``) like every UI reply: the
helper thread only waits for its steps. Setting ``stop`` ends it within one cycle (a
disconnected client, a stop sequence, shutdown); :meth:`DecodeJob.events` yields ``None``
every ``keepalive`` seconds while nothing arrives, so a stream can keep its connection
alive through a long prefill.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional


@dataclass
class Piece:
    text: str
    finished: bool = False
    finish_reason: Optional[str] = None      # the engine's: eos | max_tokens | stop_string | stopped
    stats: Optional[dict] = None             # on the finished piece
    logprobs: Optional[list] = None          # core.TokenLogprob per token, when asked


class DecodeJob:
    def __init__(self, host, mode: str, params, prompt, stop: threading.Event, *, thinking: bool = False,
                 on_done: Callable[[], None] = lambda: None, constraint=None, logprobs: Optional[int] = None):
        self.host, self.mode, self.params, self.prompt, self.stop = host, mode, params, prompt, stop
        self.thinking, self.constraint, self.logprobs = thinking, constraint, logprobs
        self._on_done = on_done
        self.done = threading.Event()
        self._queue: "asyncio.Queue" = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._run, name="mtp-api-decode", daemon=True).start()

    def _put(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:      # the event loop has closed (server shutting down)
            pass

    def _run(self) -> None:
        stream = None
        try:
            stream = self.host.stream(self.mode, self.params, self.prompt, stop=self.stop, thinking=self.thinking,
                                      constraint=self.constraint, logprobs=self.logprobs,
                                      source="api")
            for ev in stream:
                stats = ev.stats.as_dict() if ev.finished and ev.stats is not None else None
                self._put(Piece(ev.text, ev.finished, ev.finish_reason, stats, ev.logprobs))
                if ev.finished:
                    break
        except BaseException as exc:  # noqa: BLE001 - reported to the request, the server goes on
            self._put(exc)
        finally:
            try:
                if stream is not None:
                    stream.close()
            finally:
                self.done.set()
                self._put(None)
                try:
                    self._loop.call_soon_threadsafe(self._on_done)
                except RuntimeError:
                    pass

    async def events(self, keepalive: float) -> AsyncIterator[Optional[Piece]]:
        """Pieces in order; ``None`` after ``keepalive`` quiet seconds. Raises what the decode raised."""
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), keepalive)
            except asyncio.TimeoutError:
                yield None
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def wait_closed(self) -> None:
        """Until the decode has ended and its stream is closed (the model is free of it)."""
        while not self.done.is_set():
            await asyncio.sleep(0.01)


class Turns:
    """API decodes take turns: `width` at a time (1, or max_batch when requests are batched:
    webapp/serving/batching.py), in arrival order (asyncio's semaphore wakes waiters first in, first out).

    A UI reply may run alongside (Gradio's queue serialises the UI's own), and the model
    thread then alternates their steps, so neither waits for the other to finish. Keeping
    API decodes to one at a time bounds the memory their caches take.
    """

    def __init__(self, width: int = 1) -> None:
        self.width = width
        self._lock: Optional[asyncio.Semaphore] = None
        self._held = 0

    async def take(self, tick: float) -> AsyncIterator[None]:
        """Wait for the turn, yielding ``None`` every ``tick`` seconds meanwhile. If the
        waiter is cancelled the turn is handed on (or never taken)."""
        if self._lock is None:
            self._lock = asyncio.Semaphore(self.width)
        acquire = asyncio.ensure_future(self._lock.acquire())
        try:
            while not acquire.done():
                done, _ = await asyncio.wait({acquire}, timeout=tick)
                if not done:
                    yield None
        except BaseException:
            if acquire.done() and not acquire.cancelled() and acquire.exception() is None:
                self._lock.release()
            else:
                acquire.cancel()
            raise
        self._held += 1

    def give_back(self) -> None:
        if self._lock is not None and self._held > 0:
            self._held -= 1
            self._lock.release()
