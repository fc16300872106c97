"""Pipeline parallelism over MLX's real distributed layer: 2 ranks on localhost, ring backend.

Each rank is its own process (MLX_RANK + MLX_HOSTFILE, as `mlx.launch` sets them), holding half the
trunk of a tiny checkpoint (scripts/checkpoints/make_tiny_checkpoint.py, a head that accepts some drafts).
Through the pipeline, greedy MTP at depths 1-3 == AR == the single process over 128 tokens, for the
dense and the MoE family (Qwen3-Next at depth 2); sampled MTP gives the single process's tokens
seed for seed (the logits are bit-identical, so the sampled draws are too); sampled tokens 2-3 pass
a chi-square against the exact distribution (enumerated in this process); chat turns through the
prefix cache (each rank keeps its layers' states under one key) equal fresh ones. A rank started
with another checkpoint is refused by name. Every wait has a timeout; ranks are killed in a
finally (tests/_pipeline.py).
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections import Counter

import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder
from tests._engine_helpers import GREEDY, MIXED, chi_square_pvalue, exact_joint, make_mixed_head, marginal
from tests._pipeline import logs, run_job

PROMPTS = [list(range(5, 25)), [100, 7, 300, 42]]
SEEDS = [0, 1, 2]
CHI = {"prompt": [11, 12, 13], "runs": 300, "top_k": 4}


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
def test_two_ranks_decode_exactly_as_one_process(tiny_checkpoint, tmp_path, family):
    """Qwen3-Next (the same layers, fused projections) at depth 2 only: the suite's CPU time."""
    path = make_mixed_head(tiny_checkpoint(fresh=True, family=family, **MIXED))
    full = family != "qwen3_next"
    job = {"model": str(path), "load": {"hidden_variant": "post_norm"}, "prompts": PROMPTS,
           "depths": [1, 2, 3] if full else [2], "max_tokens": 128, "out": str(tmp_path / "out.json"),
           "sampled_seeds": SEEDS if full else [], "prefix_depth": 2 if family == "qwen3_5" else 0,
           "chi_square": CHI if family == "qwen3_5" else None}
    codes = run_job(tmp_path, job)
    assert codes == [0, 0], logs(tmp_path, 2)
    out = json.loads((tmp_path / "out.json").read_text())
    assert "rank 0 layers 2-3, rank 1 layers 0-1" in out["describe"]
    assert out["held"] == 2   # rank 0 loaded its own 2 layers of 4, no more

    ad = load_adapter(path, hidden_variant="post_norm")
    accepted = rejected = 0
    for prompt, ar in zip(PROMPTS, out["ar"]):
        single, _ = AutoregressiveDecoder(ad, sampler=GREEDY).generate(prompt, max_tokens=128)
        assert ar == single
    assert max(len(a) for a in out["ar"]) == 128
    for depth, runs in out["mtp"].items():
        for (tokens, acc, proposed), ar in zip(runs, out["ar"]):
            assert tokens == ar, depth
            accepted, rejected = accepted + acc, rejected + proposed - acc
    assert accepted > 0 and rejected > 0  # both kinds of rollback went through the pipeline
    for seed, tokens in zip(job["sampled_seeds"], out.get("sampled", [])):
        single, _ = SpeculativeDecoder(ad, sampler=SamplerConfig(temperature=1.0), seed=seed, depth=2).generate(
            PROMPTS[0], max_tokens=32)
        assert tokens == single, seed
    if job["prefix_depth"]:
        assert out["prefix_cached_tokens"] > 0
    if job["chi_square"]:   # sampled tokens 2 and 3 (the first cycle's drafts) against enumeration
        sampler = SamplerConfig(temperature=1.0, top_p=1.0, top_k=CHI["top_k"])
        exact = marginal(exact_joint(ad, sampler, CHI["prompt"], 3), (1, 2))
        counts = Counter(tuple(ids[1:3]) for ids, _, _ in out["chi_square"] if len(ids) >= 3)
        acc = sum(a for _, a, _ in out["chi_square"])
        assert 0 < acc < sum(p for _, _, p in out["chi_square"])
        assert chi_square_pvalue(counts, exact, sum(counts.values())) > 1e-3


def test_a_rank_with_another_checkpoint_is_refused_by_name(tiny_checkpoint, tmp_path):
    """Rank 1 is given another checkpoint: both ranks refuse before loading, naming rank 1."""
    a, b = tiny_checkpoint(bits=None, seed=0), tiny_checkpoint(bits=None, seed=3)
    for r, path in enumerate((a, b)):
        (tmp_path / f"job{r}.json").write_text(json.dumps({"model": str(path), "prompts": [], "depths": [],
                                                           "max_tokens": 1, "out": str(tmp_path / "out.json")}))
    import sys

    from tests._pipeline import REPO, start_ranks, stop

    procs = start_ranks(tmp_path, lambda r: [sys.executable, str(REPO / "tests" / "_pipeline_rank.py"),
                                             str(tmp_path / f"job{r}.json")])
    try:
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        stop(procs)
    text = logs(tmp_path, 2)
    assert codes[0] != 0 and codes[1] != 0, text
    assert "rank 1 was started with another checkpoint" in text
    assert not (tmp_path / "out.json").exists()


def test_the_split_balances_bytes_by_memory_and_gives_every_rank_a_layer():
    from adapters.pipeline.split import split_layers

    # rank 0 holds the last layers and the head's bytes; rank N-1 the first layers
    assert split_layers([10] * 4, 2) == [range(2, 4), range(0, 2)]
    assert split_layers([10] * 12, 2, extra=40) == [range(8, 12), range(0, 8)]
    # a rank with three times the memory takes about three times the layers
    assert split_layers([10] * 8, 2, capacity=[3, 1]) == [range(2, 8), range(0, 2)]
    assert split_layers([10] * 4, 4) == [range(3, 4), range(2, 3), range(1, 2), range(0, 1)]
    assert split_layers([1000, 1, 1, 1], 3) == [range(2, 4), range(1, 2), range(0, 1)]
    with pytest.raises(ValueError):
        split_layers([10] * 2, 3)


# the web server's client, in a process of its own as it would be (in this one, a connection to
# rank 1's address would be rank 0's ring connection by every measure)
CLIENT = ("import socket, sys; c = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); c.settimeout(20); "
          "print(c.recv(2).decode(), end='')")


def _ring_listener() -> "socket.socket":
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as MLX's ring listens
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _ends(s) -> tuple:
    return s.getsockname()[:2], s.getpeername()[:2]


def test_the_watchdog_cuts_the_ring_and_not_the_web_server_that_took_a_ring_port(monkeypatch):
    """Rank 0's two ring connections (out to rank 1's address, in on its own), both ranks' ends in
    this one process; then the web server listens on rank 1's port, free again once the ring
    closed its listener (on one host every port comes from one pool). Only rank 0's two ring
    connections are cut: the web server still accepts and its connection (to a client in another
    process) still carries bytes."""
    from adapters.pipeline.watchdog import sever_ring
    from adapters.pipeline.wire import is_ring_connection, ring_sockets

    l0, l1 = _ring_listener(), _ring_listener()
    p0, p1 = l0.getsockname()[1], l1.getsockname()[1]
    monkeypatch.setenv("MLX_HOSTFILE", json.dumps([[f"127.0.0.1:{p0}"], [f"localhost:{p1}"]]))
    out = socket.create_connection(("127.0.0.1", p1))       # rank 0 connects to rank 1 ...
    far_out, _ = l1.accept()                                 # ... (rank 1's end)
    far_in = socket.create_connection(("127.0.0.1", p0))    # rank 1 connects to rank 0 ...
    into, _ = l0.accept()                                    # ... (rank 0's end)
    l0.close(), l1.close()
    web = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    web.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    web.bind(("127.0.0.1", p1))
    web.listen()
    web.settimeout(20)
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(p1)], stdout=subprocess.PIPE, text=True)
    served = None
    try:
        served, _ = web.accept()
        found = ring_sockets(0)
        assert sorted(_ends(s) for s in found) == sorted([_ends(out), _ends(into)])
        for s in found:
            s.close()
        assert sever_ring(0) == 2
        far_out.settimeout(5), far_in.settimeout(5)
        assert far_out.recv(1) == b"" and far_in.recv(1) == b""   # the ring is cut ...
        served.sendall(b"ok")
        assert client.communicate(timeout=20)[0] == "ok"          # ... the web server's connection is not
        again = socket.create_connection(("127.0.0.1", p1))
        web.accept()[0].close()                                   # and its listener still accepts
        again.close()
    finally:
        client.kill()
        for s in (out, far_out, far_in, into, web, served):
            if s is not None:
                s.close()
    # a wildcard own address matches on the port; a name matches the addresses it resolves to
    hosts = [[("0.0.0.0", 5000)], [("localhost", 6000)]]
    assert is_ring_connection(("10.0.0.2", 5000), ("10.0.0.3", 40000), 0, hosts)
    assert is_ring_connection(("127.0.0.1", 40000), ("127.0.0.1", 6000), 0, hosts)
    assert not is_ring_connection(("127.0.0.1", 6000), ("127.0.0.1", 40000), 0, hosts)
    assert not is_ring_connection(("127.0.0.1", 40000), ("10.9.9.9", 6000), 0, hosts)
