"""When a rank stops answering: a blocked mx.distributed.recv never returns, and MLX cannot cancel
one. So rank 0 arms a deadline around each exchange; a watchdog thread that finds it passed
shuts down this process's ring connections (the TCP sockets to the hostfile's addresses), which
makes the blocked receive fail at once with the ring backend's own error.

The exchange itself runs on the calling thread (no hand-off to another thread per forward, whose
wake-up costs most on a loaded host) and the watchdog only reads a deadline every 0.2 s.
Over jaccl or nccl there are no sockets to shut: the watchdog still says which rank went silent,
and the request waits until that rank dies.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Optional

from .wire import ring_sockets


def sever_ring(rank: int) -> int:
    """Shut down this rank's ring connections (wire.ring_sockets); returns how many."""
    socks = ring_sockets(rank)
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()   # closes the duplicate only
    return len(socks)


class Watchdog:
    """arm() before an exchange, disarm() after; past `timeout` s in between, `fire()` runs once."""

    def __init__(self, timeout: float, fire: Callable[[], None], tick: float = 0.2):
        self.timeout, self._fire, self._tick = timeout, fire, tick
        self._deadline: Optional[float] = None
        self.fired = False
        threading.Thread(target=self._watch, name="pipeline-watchdog", daemon=True).start()

    def arm(self) -> None:
        self._deadline = time.monotonic() + self.timeout

    def disarm(self) -> None:
        self._deadline = None

    def _watch(self) -> None:
        while not self.fired:
            time.sleep(self._tick)
            d = self._deadline
            if d is not None and time.monotonic() > d:
                self.fired = True
                self._fire()
