"""The server's guards in front of every route (webapp/server.py), over real HTTP: failed
sign-ins are throttled per client address, and file uploads are refused (the app takes none)."""
from __future__ import annotations

import time

import httpx
import pytest

from tests._webapp_helpers import make_host, served



@pytest.fixture(scope="module")
def host(tiny_model_dir):
    return make_host(tiny_model_dir)


def login(url, password, source="127.0.0.1"):
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10) as c:
        return c.post(url + "/login", data={"username": "ann", "password": password})


def test_failed_sign_ins_are_throttled_per_address(host):
    with served(host, auth=("ann", "correct-horse")) as (url, _):
        assert [login(url, f"guess{i}").status_code for i in range(3)] == [400, 400, 400]
        locked = login(url, "correct-horse")                 # within the first 1 s lock
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
        assert "try again" in locked.json()["detail"]
        t0 = time.perf_counter()
        burst = [login(url, f"guess{i}").status_code for i in range(16)]      # was 20 x 400 in 0.17 s
        elapsed = time.perf_counter() - t0
        # Locks of 1, 2, 4 ... s: a guess gets through only when one has run out, so n answered
        # guesses need >= 2^n - 1 s (on a loaded machine the burst may outlast the first lock).
        assert set(burst) <= {400, 429} and 2 ** burst.count(400) - 1 <= elapsed + 1, (burst, elapsed)
        assert login(url, "correct-horse", source="127.0.0.2").status_code == 200   # another address: unaffected
        still = login(url, "correct-horse")
        if still.status_code == 429:
            time.sleep(float(still.headers["retry-after"]) + 0.1)
        assert login(url, "correct-horse").status_code == 200                       # the lock is short
        assert [login(url, "again").status_code for _ in range(3)][-1] == 400          # and a success clears it


@pytest.mark.parametrize("auth", [None, ("ann", "pw")])
def test_uploads_are_refused(host, auth):
    with served(host, auth=auth) as (url, _):
        t0 = time.perf_counter()
        r = httpx.post(url + "/gradio_api/upload", files={"files": ("big.bin", b"\0" * (20 * 2**20))}, timeout=30)
        assert r.status_code == 403 and "no file uploads" in r.json()["detail"]      # was 200 without login
        assert time.perf_counter() - t0 < 5


def test_replies_on_a_kept_alive_connection_go_out_at_once(host):
    """Every accepted connection has TCP_NODELAY. asyncio sets it only on sockets that say they
    are TCP, and the listening socket was made without saying so: then each reply on a kept-alive
    connection (the openai and anthropic clients keep theirs, browsers too) and each streamed
    chunk waited for the client's delayed ACK, ~40 ms a request here
    (docs/bench/2026-12-01/http-keepalive-latency.json)."""
    import socket

    with served(host) as (url, demo):
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/v1/models").status_code == 200
            # the server's side of this connection, read at once (uvicorn closes an idle one after 5 s)
            open_now = [p.transport.get_extra_info("socket") for p in demo.running.server.server_state.connections]
            assert len(open_now) == 1
            assert open_now[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
