"""The loop of every rank but 0: follow rank 0's headers until told to stop.

A rank keeps, per cache id, its layers' caches and the last verify's captured states; per
snapshot key, its layers' snapshot. It applies the header's queued items (rollbacks, frees)
before the command, in rank 0's order, then passes the header on, so that every rank is in the
same state as rank 0 after every command.
"""
from __future__ import annotations

import time

import mlx.core as mx

from . import wire
from .stage import Stage
from .wire import FORWARD, FREE_CACHE, FREE_SNAPSHOT, RESTORE, ROLLBACK, SNAPSHOT, STOP, Link


def serve(stage: Stage, link: Link) -> None:
    caches, captured, snapshots = {}, {}, {}
    embed = stage.adapter.inner.embed_tokens
    hidden = stage.adapter.contract.hidden_size
    first = link.prev == 0            # rank N-1: embeds the tokens rank 0 sends

    def cache_of(cid):
        if cid not in caches:
            caches[cid] = stage.make_cache()
        return caches[cid]

    while True:
        h = link.recv_header()
        for kind, a, b in h.items:
            if kind == ROLLBACK and a in caches:
                stage.rollback(caches[a], captured.pop(a, None), b)
            elif kind == FREE_CACHE:
                caches.pop(a, None)
                captured.pop(a, None)
            elif kind == FREE_SNAPSHOT:
                snapshots.pop(a, None)
        if h.op == FORWARD:
            x = link.recv((1, h.T), mx.int32) if first else link.recv((1, h.T, hidden), wire.DTYPES[h.dtype])
            cache = cache_of(h.cache)
            t0 = time.perf_counter()
            run, out, cap = stage.run(embed(x) if first else x, cache, h.T, h.capture, h.fast)
            out = run.leave(out)
            mx.eval(out, stage.state_arrays(cache))
            if cap is None:
                captured.pop(h.cache, None)
            else:
                captured[h.cache] = cap
            work = h.work + int((time.perf_counter() - t0) * 1e6)
            link.send_header(h.but(dtype=wire.DTYPES.index(out.dtype), work=work))
            link.send(out)
            continue
        if link.next != 0:
            link.send_header(h)       # the ranks after this one follow the same command
        if h.op == SNAPSHOT:
            snapshots[h.key] = stage.snapshot(cache_of(h.cache))
        elif h.op == RESTORE:
            cache = caches[h.cache] = stage.make_cache()
            captured.pop(h.cache, None)
            stage.restore(snapshots[h.key], cache)
        elif h.op == STOP:
            return
