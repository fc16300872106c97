"""The messages between ranks: a fixed-size int32 header, then (for a forward) the payload.

Every hop goes to a ring neighbour: rank r receives from r+1 and sends to r-1 (mod N), so rank 0
starts a command at rank N-1 and it walks down to rank 1; a forward's hidden state comes back to
rank 0 from rank 1. No home-made transport: mx.distributed.send / recv, evaluated one at a time
in order (the ring backend's sends block until the peer reads large buffers, so the order of
evaluation is the protocol).

Header: [op, cache id, T, capture, fast, dtype, key, work, n items, items (kind, a, b) x MAX_ITEMS].
`work`: microseconds the ranks so far spent computing this forward (each adds its own), so that
rank 0 can tell the link's time from the other ranks' work (scripts/bench/bench_distributed.py).
Items are what rank 0 queued since the last header (rollback a cache to keep k, free a cache,
free a snapshot): they ride on the next command, so a verify's commit costs no message.
"""
from __future__ import annotations

import functools
import json
import os
import select
import socket
from typing import List, Set, Tuple

import mlx.core as mx

FORWARD, SNAPSHOT, RESTORE, NOOP, STOP, HELLO = 1, 2, 3, 4, 5, 6
ROLLBACK, FREE_CACHE, FREE_SNAPSHOT = 1, 2, 3
MAX_ITEMS = 18
SIZE = 9 + 3 * MAX_ITEMS
DTYPES = (mx.float32, mx.bfloat16, mx.float16)


def ring_addresses() -> List[List[Tuple[str, int]]]:
    """Each rank's (host, port) pairs, from MLX_HOSTFILE (a path or the JSON itself:
    [["ip:port", ...], ...], one list per rank)."""
    raw = os.environ.get("MLX_HOSTFILE", "")
    try:
        text = open(raw).read() if raw and os.path.exists(raw) else raw
        hosts = json.loads(text) if text else []
    except (OSError, ValueError):
        return []
    out = []
    for entry in hosts if isinstance(hosts, list) else []:
        pairs = []
        for addr in entry if isinstance(entry, list) else [entry]:
            if isinstance(addr, str) and ":" in addr:
                host, port = addr.rsplit(":", 1)
                if port.isdigit():
                    pairs.append((host.strip("[]"), int(port)))
        out.append(pairs)
    return out


_WILDCARD = ("", "0.0.0.0", "::")


@functools.lru_cache(maxsize=64)
def _ips(host: str) -> Set[str]:
    """The addresses a hostfile's host stands for (a name is resolved; an address is itself)."""
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)} | {host}
    except OSError:
        return {host}


def _plain(ip: str) -> str:
    return ip[7:] if ip.startswith("::ffff:") else ip


def is_ring_connection(local: Tuple[str, int], peer: Tuple[str, int], rank: int,
                       addresses: List[List[Tuple[str, int]]]) -> bool:
    """Whether a connected TCP socket (its local and peer address) is one of the ring's: this rank
    connected to a neighbour's listening address, or accepted a neighbour on its own. The ring
    closes its listening sockets once connected, so the web server may later hold one of those
    port numbers (on one host the ranks' ports and the HTTP port come from one pool): a port alone
    does not make a ring socket, the whole address does."""
    (lhost, lport), (phost, pport) = (_plain(local[0]), local[1]), (_plain(peer[0]), peer[1])
    for r, pairs in enumerate(addresses):
        for host, port in pairs:
            if r == rank:
                if lport == port and (host in _WILDCARD or lhost in _ips(host)):
                    return True
            elif pport == port and phost in _ips(host):
                return True
    return False


def own_ports(rank: int) -> Set[int]:
    """This rank's listening ports in MLX_HOSTFILE (the web app must not take one: its
    connections would look like the ring's)."""
    addresses = ring_addresses()
    return {p for _, p in addresses[rank]} if 0 <= rank < len(addresses) else set()


def ring_sockets(rank: int) -> List[socket.socket]:
    """Duplicates of this process's ring connections (empty over jaccl or nccl). A duplicate's
    shutdown acts on the connection; its close does not."""
    addresses = ring_addresses()
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    out, mine = [], set()
    for name in os.listdir(folder):
        try:
            if int(name) in mine:   # the listing's own descriptor, closed since, reused by a duplicate
                continue
            fd = os.dup(int(name))
        except (OSError, ValueError):
            continue
        mine.add(fd)
        try:
            s = socket.socket(fileno=fd)
        except OSError:    # not a socket
            os.close(fd)
            continue
        try:
            if (s.type == socket.SOCK_STREAM and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                    and is_ring_connection(s.getsockname()[:2], s.getpeername()[:2], rank, addresses)):
                out.append(s)
                continue
        except (OSError, IndexError, TypeError, ValueError):
            pass
        s.close()
    return out


class Header:
    def __init__(self, op: int, cache: int = 0, T: int = 0, capture: bool = False, fast: bool = True,
                 dtype: int = 0, key: int = 0, items: Tuple[Tuple[int, int, int], ...] = (), work: int = 0):
        assert len(items) <= MAX_ITEMS
        self.op, self.cache, self.T, self.capture, self.fast = op, cache, T, capture, fast
        self.dtype, self.key, self.items, self.work = dtype, key, tuple(items), work

    def array(self) -> mx.array:
        flat = [self.op, self.cache, self.T, int(self.capture), int(self.fast), self.dtype, self.key, self.work,
                len(self.items)]
        flat += [v for item in self.items for v in item]
        return mx.array(flat + [0] * (SIZE - len(flat)), dtype=mx.int32)

    @classmethod
    def of(cls, a: mx.array) -> "Header":
        v = a.tolist()
        n = v[8]
        items = tuple(tuple(v[9 + 3 * i: 12 + 3 * i]) for i in range(n))
        return cls(v[0], v[1], v[2], bool(v[3]), bool(v[4]), v[5], v[6], items, v[7])

    def but(self, **changes) -> "Header":
        h = Header(self.op, self.cache, self.T, self.capture, self.fast, self.dtype, self.key, self.items, self.work)
        for k, v in changes.items():
            setattr(h, k, v)
        return h


class Link:
    """This rank's two neighbours in the pipeline: `prev` sends to it, it sends to `next`."""

    def __init__(self, group):
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.prev, self.next = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self._socks = None

    def wait(self) -> None:
        """Block, without spinning, until a neighbour sends. The ring backend's recv polls its
        sockets: a worker waiting for the next request burned ~70 % of a core (3.6 CPU s over a
        5 s wait, measured here), and on one host the waiting ranks slow the working one. Only
        the previous rank ever sends to this one, so any ring socket readable means it has."""
        if self._socks is None:
            self._socks = ring_sockets(self.rank)
        while self._socks and not select.select(self._socks, [], [], 1.0)[0]:
            pass

    def send(self, x: mx.array) -> None:
        mx.eval(mx.distributed.send(x, self.next, group=self.group))

    def recv(self, shape, dtype) -> mx.array:
        y = mx.distributed.recv(shape, dtype, self.prev, group=self.group)
        mx.eval(y)
        return y

    def send_header(self, h: Header) -> None:
        self.send(h.array())

    def recv_header(self) -> Header:
        self.wait()
        return Header.of(self.recv((SIZE,), mx.int32))

    def gather(self, values: List[int]) -> List[List[int]]:
        """Every rank's `values` (ints), on every rank."""
        got = mx.distributed.all_gather(mx.array([values], dtype=mx.int32), group=self.group)
        return got.tolist()
