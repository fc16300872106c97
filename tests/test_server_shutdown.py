"""Ctrl+C and SIGTERM on the real `mtp-chat` process, at any moment: idle, mid-prefill,
mid-decode. Each stops the decode within a chunk or cycle, logs one line, exits 0 (never
an abort), and a streaming reply ends with a message that says why."""
from __future__ import annotations

import json
import signal
import threading
import time

import gradio_client
import httpx
import pytest

from core.settings import DEMO_MODEL_DIR
from tests._webapp_helpers import LONG_PROMPT, App


# A hang guard, not a speed limit: whether a decode stopped within the grace shows in the log.
HANG = 30



def stream_events(url, body, started: threading.Event, out: list, headers=None):
    """Reads an API stream into `out`; sets `started` after the first content delta."""
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out.append(line[6:])
                    if '"content"' in line:
                        started.set()
    except httpx.HTTPError as exc:   # the server went away
        out.append(f"closed: {exc!r}")
    finally:
        started.set()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return tiny_model_dir


def test_ctrl_c_when_idle_exits_0_with_one_line(tiny):
    app = App(tiny, "--lan")
    assert "OpenAI-compatible API: off" in "".join(app.lines)         # on the network without a key
    assert httpx.get(app.url + "/v1/models").status_code == 403
    deadline = time.perf_counter() + 10   # the refusal's log line is read before the signal's mark
    while not any("API 403 GET /v1/models" in line for line in app.lines) and time.perf_counter() < deadline:
        time.sleep(0.05)
    t0 = app.signal(signal.SIGINT)
    assert app.wait() == 0 and time.perf_counter() - t0 < HANG
    assert app.after_signal() == ["mtp-chat: SIGINT: stopping 0 running decodes and shutting down"]


# Each signal once while busy (SIGINT mid-decode, SIGTERM mid-prefill; SIGINT idle above, SIGTERM idle
# in tests/test_disk_restart.py): both go through one handler, and each start of the real process
# costs ~10 CPU-seconds.
@pytest.mark.parametrize("sig", [signal.SIGINT])
def test_a_signal_mid_decode_stops_it_and_exits_0(tiny, sig):
    app = App(tiny, "--lan", MTP_CHAT_API_KEY="k3y")          # the key from the environment keeps the API on
    out = "".join(app.lines)
    assert "OpenAI-compatible API: http://127.0.0.1:" in out and "key required" in out
    assert httpx.get(app.url + "/v1/models").status_code == 401
    ui = gradio_client.Client(app.url, verbose=False, download_files=False)
    history = [{"role": "user", "content": [{"type": "text", "text": LONG_PROMPT}]}]
    job = ui.submit(history, "ar", "", 0.0, 1.0, 0, 0.0, 3000, 0, "1", True, api_name="/respond")
    events, started = [], threading.Event()
    body = {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 3000, "temperature": 0,
            "stream": True}
    threading.Thread(target=stream_events, args=(app.url, body, started, events, {"Authorization": "Bearer k3y"}),
                     daemon=True).start()
    assert started.wait(60) and any('"content"' in e for e in events), events
    while not job.outputs():
        time.sleep(0.02)
    t0 = app.signal(sig)
    assert app.wait() == 0
    # the decodes stopped within the grace: one log line (a decode still running when Shutdown's
    # 5 s grace ran out would add "... still running ...; exiting anyway")
    assert time.perf_counter() - t0 < HANG
    log = app.after_signal()
    assert log == [f"mtp-chat: {sig.name}: stopping 2 running decodes and shutting down"], log
    time.sleep(0.2)
    error = json.loads(events[-2])["error"]                          # the API stream says why it ended ...
    assert events[-1] == "[DONE]" and "shutting down" in error["message"] and error["code"] == "server_shutdown"
    last = job.outputs()[-1][-1]                                     # ... and so does the chat in the UI
    assert "shutting down" in last["metadata"]["title"], last


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_a_signal_mid_prefill_stops_it_within_a_chunk_and_exits_0(sig):
    app = App(DEMO_MODEL_DIR)
    text = "The harbor was quiet in the early morning. " * 300         # ~3,000 tokens: seconds of prefill
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 64, "temperature": 0, "stream": True}
    events = []
    threading.Thread(target=stream_events, args=(app.url, body, threading.Event(), events), daemon=True).start()
    t_wait = time.perf_counter()
    while not events and time.perf_counter() - t_wait < 30:          # the role chunk: the request is in
        time.sleep(0.01)
    time.sleep(0.8)                                                  # well inside the prefill
    t0 = app.signal(sig)
    assert app.wait() == 0
    assert time.perf_counter() - t0 < HANG         # the prefill stopped at a chunk: see the one log line below
    assert app.after_signal() == [f"mtp-chat: {sig.name}: stopping 1 running decode and shutting down"]
    time.sleep(0.2)
    assert not any('"content"' in e for e in events), "the signal came mid-prefill"
    assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"], events
