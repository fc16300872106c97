"""Per-request latency of the app's HTTP server on a kept-alive connection, with the listening
socket as webapp/server.py makes it (IPPROTO_TCP: asyncio sets TCP_NODELAY on every accepted
socket) and as it was made before (proto 0: no TCP_NODELAY, so each reply waited for the
client's delayed ACK). Paired on one served tiny checkpoint, interleaved per round.

    .venv/bin/python scripts/bench/bench_http_latency.py --json docs/bench/2026-12-01/http-keepalive-latency.json
"""
from __future__ import annotations

import argparse
import http.client
import json
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import adapters  # noqa: E402,F401  - loads the fast BLAS before mlx
import webapp.server as server  # noqa: E402

ROUTES = ("/v1/models", "/config")


def proto0_bind(host: str, port: int) -> socket.socket:
    """The listening socket as it was made before the fix."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def per_request_ms(port: int, route: str, n: int) -> dict:
    import httpx

    out = {}
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("GET", route)
    c.getresponse().read()
    t0 = time.perf_counter()
    for _ in range(n):
        c.request("GET", route)
        c.getresponse().read()
    out["http.client keep-alive"] = (time.perf_counter() - t0) / n * 1000
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as h:
        h.get(route)
        t0 = time.perf_counter()
        for _ in range(n):
            h.get(route)
        out["httpx keep-alive (openai/anthropic clients)"] = (time.perf_counter() - t0) / n * 1000
    t0 = time.perf_counter()
    for _ in range(n):
        c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("GET", route)
        c.getresponse().read()
        c.close()
    out["a new connection per request"] = (time.perf_counter() - t0) / n * 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from scripts.checkpoints.make_tiny_checkpoint import make_tiny_checkpoint
    from tests._webapp_helpers import make_host, served

    host = make_host(make_tiny_checkpoint(Path(tempfile.mkdtemp()) / "model"))
    fixed_bind, samples = server._bind, {}
    for _ in range(args.rounds):
        for name, bind in (("IPPROTO_TCP (now)", fixed_bind), ("proto 0 (before)", proto0_bind)):
            server._bind = bind
            try:
                with served(host) as (url, _):
                    port = int(url.rsplit(":", 1)[1])
                    for route in ROUTES:
                        for way, ms in per_request_ms(port, route, args.requests).items():
                            samples.setdefault(name, {}).setdefault(route, {}).setdefault(way, []).append(ms)
            finally:
                server._bind = fixed_bind
    report = {"what": __doc__.split("\n\n")[0], "host": f"{platform.machine()}, {platform.python_version()}",
              "requests_per_measurement": args.requests, "rounds": args.rounds,
              "median_ms_per_request": {k: {r: {w: round(statistics.median(v), 2) for w, v in ways.items()}
                                            for r, ways in routes.items()} for k, routes in samples.items()}}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
