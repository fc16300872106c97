"""`mtp-chat --distributed`: one server over a pipeline of ranks (adapters/pipeline/).

One command starts every rank (`mlx.launch --hosts h1,h2 --backend ring -- mtp-chat --distributed
--model DIR`, or MLX_RANK + MLX_HOSTFILE per process). Rank 0 loads its layers on the model thread
and serves the web app and the API; every other rank loads its layers and follows rank 0, with no
HTTP port, until rank 0 stops or is lost. The prefix cache on disk is off (the other ranks' parts
of a snapshot live in their memory only), and so is batching (the pipeline runs one sequence per
forward; core loops over a batch's sequences).
"""
from __future__ import annotations

import sys
from typing import Callable, List, Optional


def prepare(settings):
    """The settings a pipeline runs with: no disk cache, no batching."""
    return settings.model_copy(update={"cache_dir": "", "max_batch": 1})


def rank_of(backend: str):
    """(this process's rank, the group): mx.distributed set up once, before anything loads."""
    from adapters.pipeline.launch import init

    group = init(backend)
    return group.rank(), group


def port_clash(port: int, rank: int) -> Optional[str]:
    """Why the web app cannot take `port` on this rank, if it cannot: the ring's own port is free
    to bind again once the ranks are connected, but then the server's connections would look like
    the ring's (a silent rank's watchdog cuts the ring's connections)."""
    from adapters.pipeline.wire import own_ports

    if port and port in own_ports(rank):
        return (f"--port {port} is this rank's ring port in MLX_HOSTFILE; the web app needs a port of its own: "
                f"pass another --port (or another port in the hostfile)")
    return None


def serve_worker(model_dir, settings, group, backend: str, log: Callable[[str], None]) -> int:
    """A rank other than 0: load its layers, follow rank 0, exit when told (0) or when lost (1)."""
    from adapters.pipeline.launch import PipelineError, start

    try:
        start(model_dir, group, backend=backend, log=log, settings=settings, log_load=log)
    except PipelineError as exc:
        print(f"mtp-chat: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def loader(group, backend: str, timeout: float):
    """What ModelHost.load calls on the model thread instead of load_adapter (rank 0)."""
    from adapters.pipeline.launch import start

    def load(path, settings, log):
        return start(path, group, backend=backend, log=log, timeout=timeout, settings=settings, log_load=log)

    return load


def banner(adapter) -> List[str]:
    """The start-up lines: the backend, then one line per rank (layers, memory)."""
    return [f"pipeline over {adapter.link.size} ranks, backend {adapter.backend_name}, "
            f"rank 0 serves (a lost rank fails requests after at most {adapter.timeout:g} s)"] + adapter.ranks()



