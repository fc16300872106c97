"""Start N ranks of a pipeline on localhost (ring backend, MLX_RANK + MLX_HOSTFILE), never hanging:
every wait has a timeout and every rank is killed in a finally."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterable, List, Optional

REPO = Path(__file__).resolve().parent.parent


def free_ports(n: int, avoid: Iterable[int] = ()) -> List[int]:
    """n distinct free ports of 127.0.0.1, none in `avoid` (a port found earlier and released
    since, such as the web app's: the kernel may hand it out again)."""
    while True:
        socks = [socket.socket() for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in socks]
        for s in socks:
            s.close()
        if not set(ports) & set(avoid):
            return ports


def hostfile(folder: Path, n: int, avoid: Iterable[int] = ()) -> Path:
    f = folder / "hosts.json"
    f.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(n, avoid)]))
    return f


def start_ranks(folder: Path, argv_of, n: int = 2, env: Optional[dict] = None,
                avoid: Iterable[int] = ()) -> List[subprocess.Popen]:
    """argv_of(rank) -> the command of that rank; stdout+stderr to folder/rank<r>.log. The ring's
    ports are none of `avoid`."""
    hosts = hostfile(folder, n, avoid)
    procs = []
    for r in range(n):
        log = open(folder / f"rank{r}.log", "w")
        procs.append(subprocess.Popen(argv_of(r), stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                      env={**os.environ, **(env or {}), "MLX_RANK": str(r), "MLX_HOSTFILE": str(hosts)}))
    return procs


def bind_failed(folder: Path, n: int) -> bool:
    """Whether a rank could not bind its ring port: free_ports releases the ports it found, and
    another test's server (pytest-xdist runs several) may take one before the rank binds it."""
    return any("Couldn't bind socket" in (folder / f"rank{r}.log").read_text() for r in range(n))


def logs(folder: Path, n: int) -> str:
    return "\n".join(f"--- rank {r}\n" + (folder / f"rank{r}.log").read_text()[-3000:] for r in range(n))


def stop(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def run_job(folder: Path, job: dict, n: int = 2, timeout: float = 120) -> List[int]:
    """Run tests/_pipeline_rank.py on n ranks; returns their exit codes (killed past `timeout`)."""
    f = folder / "job.json"
    f.write_text(json.dumps(job))
    for attempt in range(3):  # new ports when one was taken between finding and binding it
        procs = start_ranks(folder, lambda r: [sys.executable, str(REPO / "tests" / "_pipeline_rank.py"), str(f)], n)
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        finally:
            stop(procs)
        if not (any(codes) and bind_failed(folder, n)):
            return codes
    return codes
