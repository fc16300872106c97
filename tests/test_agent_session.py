"""scripts/bench/agent_session.py's calls to the API (the GPU bench's `agent` stage) on a served
checkpoint: the random GPU-shape checkpoints (scripts/gpu/gpu_make_checkpoint.py) hold the
stage's 20k-token system prompt, and an API error ends the run with its status and body."""
from __future__ import annotations

import json

import pytest

from tests._webapp_helpers import make_host, served

anthropic = pytest.importorskip("anthropic")
pytest.importorskip("httpx")

from scripts.bench import agent_session as agent  # noqa: E402

SYSTEM_TOKENS = 20000   # gpu_bench.sh's agent stage: --system-tokens 20000


@pytest.fixture(scope="module")
def gpu_shape_url(tmp_path_factory):
    """The server on a checkpoint from gpu_make_checkpoint.py's own path, at a CPU-sized shape."""
    from scripts.gpu.gpu_make_checkpoint import build

    ckpt = build(str(tmp_path_factory.mktemp("gpu_small") / "model"), "small")
    with served(make_host(ckpt), keepalive=0.2) as (url, _):
        yield ckpt, url


@pytest.fixture(scope="module")
def window_4k_url(tiny_checkpoint):
    """A checkpoint of 4,096 tokens of context (make_tiny_checkpoint's default)."""
    with served(make_host(tiny_checkpoint(template="qwen3_5")), keepalive=0.2) as (url, _):
        yield url


def test_the_gpu_checkpoints_have_the_real_models_context(gpu_shape_url):
    """The 9B shape's context was make_tiny_checkpoint's 4,096 tokens: the server refused the
    agent stage's first call (count_tokens of an 8,000-character sample, 4,520 tokens) with a 400
    "prompt is too long", and would have refused the 20k-token system prompt after it."""
    from adapters import load_adapter
    from scripts.gpu.gpu_make_checkpoint import CONTEXT

    ckpt, _ = gpu_shape_url
    config = json.loads((ckpt / "config.json").read_text())
    assert CONTEXT == 262144 and config["text_config"]["max_position_embeddings"] == CONTEXT
    assert json.loads((ckpt / "tokenizer_config.json").read_text())["model_max_length"] == CONTEXT
    assert load_adapter(ckpt).context_length == CONTEXT


def test_a_20k_token_system_prompt_is_counted_on_a_gpu_shape_checkpoint(gpu_shape_url):
    """What the stage does first: size the system prompt from the tokenizer, then count it."""
    _, url = gpu_shape_url
    cpt = agent.chars_per_token(url, "model")
    assert 1.0 < cpt < 4.0
    n = agent.count_tokens(url, "model", agent.system_prompt(int(SYSTEM_TOKENS * cpt)))
    assert 0.8 * SYSTEM_TOKENS < n < 1.25 * SYSTEM_TOKENS


def test_an_api_error_ends_the_session_with_its_status_and_body(window_4k_url):
    """Over the context: count_tokens and a turn both answer 400 "prompt is too long"; the script
    stops with the call, the status and the body (it raised KeyError: 'input_tokens' before)."""
    cpt = agent.chars_per_token(window_4k_url, "model")     # the sample fits 4,096 tokens
    system = agent.system_prompt(int(SYSTEM_TOKENS * cpt))
    with pytest.raises(SystemExit) as exc:
        agent.count_tokens(window_4k_url, "model", system)
    message = str(exc.value)
    assert message.startswith("POST /v1/messages/count_tokens answered HTTP 400 without 'input_tokens': {")
    assert '"type":"error"' in message.replace(" ", "") and "prompt is too long" in message
    assert "context of 4,096 tokens" in message

    client = anthropic.Anthropic(base_url=window_4k_url, api_key="unused", max_retries=0)
    with pytest.raises(SystemExit) as exc:
        agent.one_turn(client, "model", system, [{"role": "user", "content": agent.TASK}], {"type": "any"}, 8)
    message = str(exc.value)
    assert message.startswith("POST /v1/messages answered HTTP 400: {") and "prompt is too long" in message

    with pytest.raises(SystemExit, match=r"GET /v1/models/nope answered HTTP 404 without 'data': \{"):
        import httpx

        agent.answered(httpx.get(window_4k_url + "/v1/models/nope"), "data")


def test_the_script_stops_its_server_when_a_call_fails(tiny_checkpoint, tmp_path, monkeypatch):
    """The script end to end (`python -m webapp` started by it) on a 4,096-token checkpoint with
    the stage's arguments: it ends with the 400 and its body, and no server is left running (one
    was, after the KeyError, holding the machine)."""
    started = []

    class Recorded(agent.Server):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(agent, "Server", Recorded)
    ckpt = tiny_checkpoint(template="qwen3_5")
    with pytest.raises(SystemExit) as exc:
        agent.main(["--model", str(ckpt), "--system-tokens", str(SYSTEM_TOKENS), "--result-tokens", "200", "2000",
                    "--turns", "2", "--max-tokens", "8", "--no-warmup", "--json", str(tmp_path / "out.json")])
    assert str(exc.value).startswith("POST /v1/messages answered HTTP 400: {") and "prompt is too long" in str(exc.value)
    assert len(started) == 1 and started[0].proc.poll() is not None
    assert not (tmp_path / "out.json").exists()


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (one left to a PID 1 that does not reap)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_script_ends_its_server_and_keeps_its_log(tmp_path, sig):
    """A timeout's SIGTERM to the script (the GPU run's agent stage: 480 s, then `timeout`) ends
    its server, and the server's process group, before the script exits: Python's default
    SIGTERM ran no `except`/`finally`, and a server left running holds the GPU's memory for the
    stages after it. The server's log stays beside the JSON, a header line per start, and the
    script says where it is and prints its last lines. A SIGKILL, which no handler sees, ends
    the server too (the kernel's parent-death signal)."""
    import os
    import queue
    import shutil
    import signal
    import subprocess
    import sys
    import threading
    import time

    script = agent.ROOT / "scripts" / "bench" / "agent_session.py"
    out = tmp_path / "agent.json"
    proc = subprocess.Popen([sys.executable, str(script), "--model", str(agent.ROOT / "models" / "demo"),
                             "--system-tokens", "100", "--result-tokens", "50", "--turns", "2", "--max-tokens", "8",
                             "--no-warmup", "--json", str(out)],
                            cwd=agent.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: "queue.Queue" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
    said, pid, left = [], None, False
    try:
        while pid is None:
            line = lines.get(timeout=120)   # the server's start on a loaded 2-core host: ~5-20 s
            assert line is not None, "the script ended before its server was up:\n" + "".join(said)
            said.append(line)
            if "server up (pid " in line:
                pid = int(line.split("server up (pid ", 1)[1].split(")", 1)[0])
        assert _alive(pid)
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(60) == (128 + signal.SIGTERM if sig == "SIGTERM" else -signal.SIGKILL)
        while (line := lines.get(timeout=10)) is not None:
            said.append(line)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _alive(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)   # whatever is left of its group (nothing, if it works)
            except ProcessLookupError:
                pass
        for line in said:                        # the prefix caches' folder, which a SIGKILL leaves behind
            if "prefix caches in " in line:
                shutil.rmtree(line.split("prefix caches in ", 1)[1].split(";", 1)[0].strip(), ignore_errors=True)
    text = "".join(said)
    assert not left, text
    log = tmp_path / "agent.server.log"
    content = log.read_text()
    assert content.startswith("===== agent_session.py run at ")
    assert "===== server start 1 (warm, turn 1) at " in content
    assert "| mtp-chat: " in content            # the server's lines, each after its time
    if sig == "SIGTERM":
        assert "SIGTERM: stopping the server and exiting" in text and "the run failed (SIGTERM)" in text
        assert f"the server's log: {log}" in text and "  | " in text   # its last lines


def test_each_turn_is_priced_against_its_new_tokens_at_turn_1s_whole_chunk_rate():
    """agent_session.price: a later turn's time to first token against its new tokens at turn 1's
    last whole chunk's rate (issue 36's <= 1.2x), against the tokens it did prefill (the previous
    reply re-rendered too), and the client's (with the time before the model)."""
    rows = [{"prefilled_tokens": 2048, "prefill_s": 0.5, "new_tokens": 2048, "ttft_s": 0.5, "start_s": 0.05,
             "prefill_parts": {"full_chunk_tokens": 512, "full_chunk_s": 0.1}},
            {"prefilled_tokens": 600, "prefill_s": 0.15, "new_tokens": 500, "ttft_s": 0.15, "start_s": 0.05,
             "prefill_parts": {}}]
    agent.price(rows)
    later = rows[1]
    assert later["ttft_over_new_prefill_at_depth"] == pytest.approx(0.15 / (500 * 0.1 / 512))
    assert later["ttft_over_prefilled_at_depth"] == pytest.approx(0.15 / (600 * 0.1 / 512))
    assert later["client_ttft_over_new_prefill_at_depth"] == pytest.approx(0.20 / (500 * 0.1 / 512))
    assert later["ttft_over_new_prefill"] == pytest.approx(0.15 / (500 * 0.5 / 2048))
    bare = [dict(r, prefill_parts={}) for r in rows[:1]] + [{k: v for k, v in rows[1].items() if "over" not in k}]
    agent.price(bare)   # no whole chunk in turn 1: no rate at depth to price against
    assert "ttft_over_new_prefill" in bare[1] and not any("at_depth" in k for k in bare[1])
