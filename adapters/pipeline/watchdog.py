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

import json
import os
import socket
import threading
import time
from typing import Callable, Optional, Set, Tuple


def ring_addresses() -> Set[Tuple[str, int]]:
    """The (host, port) pairs of MLX_HOSTFILE (a path or the JSON itself: [["ip:port", ...], ...])."""
    raw = os.environ.get("MLX_HOSTFILE", "")
    try:
        text = open(raw).read() if raw and os.path.exists(raw) else raw
        hosts = json.loads(text) if text else []
    except (OSError, ValueError):
        return set()
    out = set()
    for entry in hosts:
        for addr in entry if isinstance(entry, list) else [entry]:
            if isinstance(addr, str) and ":" in addr:
                host, port = addr.rsplit(":", 1)
                out.add((host, int(port)))
    return out


def sever_ring() -> int:
    """Shut down every TCP connection of this process to or from a hostfile address; returns how many."""
    addrs = ring_addresses()
    ports = {p for _, p in addrs}
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    done = 0
    for name in os.listdir(folder):
        try:
            s = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            if s.type != socket.SOCK_STREAM:
                continue
            local, peer = s.getsockname()[1], s.getpeername()[1]
            if local in ports or peer in ports:
                s.shutdown(socket.SHUT_RDWR)
                done += 1
        except (OSError, IndexError, TypeError):
            pass
        finally:
            s.close()   # closes the duplicate only
    return done


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
