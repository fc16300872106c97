"""`mtp-chat --distributed` on 2 ranks on localhost (ring backend): rank 0 serves, rank 1 holds half
the layers with no HTTP port. One chat turn through the official `openai` client, the same again
after a client disconnected mid-reply; then rank 1 stops answering (SIGSTOP) with a request in
flight, and is killed: the request fails with a 503 error
object naming rank 1 within 10 s of the kill, rank 0 logs one line, and the next request is
refused at once. A second server, with --pipeline-timeout 3, shows a silent rank (SIGSTOP only)
failing the request in flight after the timeout instead of hanging. A web port that is rank 0's
own ring port is refused at start (its connections would look like the ring's). One race in a real browser
(Debian chromium driven by Playwright) runs both lanes through the pipeline. Every wait has a
timeout; both ranks are killed in a finally.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import openai
import pytest

from tests._engine_helpers import MIXED
from tests._pipeline import bind_failed, logs, start_ranks, stop
from tests._webapp_helpers import free_port


def _serve(tmp_path, model, *extra, port=None):
    port = port or free_port()
    argv = [sys.executable, "-m", "webapp", "--distributed", "--model", str(model), "--port", str(port),
            "--no-warmup", *extra]
    for attempt in range(3):  # new ring ports when one was taken between finding and binding it
        procs = start_ranks(tmp_path, lambda r: argv, env={"MTP_CHAT_CACHE_DIR": ""}, avoid=[port])
        deadline = time.time() + 90
        while "press Ctrl+C" not in (tmp_path / "rank0.log").read_text():
            if not all(p.poll() is None for p in procs) and bind_failed(tmp_path, 2) and attempt < 2:
                stop(procs)
                break
            assert time.time() < deadline and all(p.poll() is None for p in procs), logs(tmp_path, 2)
            time.sleep(0.2)
        else:
            break
    return procs, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)


def _ask(client, model, content="Hello", max_tokens=16):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, temperature=0)


def _failure(client, model, out):
    try:
        _ask(client, model)
    except openai.APIStatusError as exc:
        out.append(exc)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return tiny_checkpoint(**MIXED)


def test_a_chat_turn_then_a_killed_worker_gives_a_503_within_10_s(model, tmp_path):
    procs, client = _serve(tmp_path, model)
    try:
        text = (tmp_path / "rank0.log").read_text()
        assert "pipeline over 2 ranks, backend ring" in text
        assert "rank 0: layers 2-3" in text and "rank 1: layers 0-1" in text, text
        name = client.models.list().data[0].id
        reply = _ask(client, name)
        assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens > 0
        assert reply.choices[0].message.content
        # a client that disconnects mid-reply: its caches are dropped on every rank, nothing changes
        stream = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Tell me a story"}],
                                                max_tokens=2000, stream=True)
        next(iter(stream))
        stream.close()
        assert _ask(client, name).choices[0].message.content == reply.choices[0].message.content

        os.kill(procs[1].pid, signal.SIGSTOP)          # rank 1 stops answering ...
        failed: list = []
        t = threading.Thread(target=_failure, args=(client, name, failed), daemon=True)
        t.start()
        time.sleep(1.0)
        assert t.is_alive()                             # ... with a request in flight
        killed = time.time()
        os.kill(procs[1].pid, signal.SIGKILL)
        t.join(timeout=10)
        assert not t.is_alive() and time.time() - killed < 10, logs(tmp_path, 2)
        assert failed and failed[0].status_code == 503
        assert "the pipeline lost rank 1" in failed[0].message
        t0 = time.time()
        later: list = []
        _failure(client, name, later)                   # refused at once while the ring is down
        assert later and later[0].status_code == 503 and time.time() - t0 < 2
        assert (tmp_path / "rank0.log").read_text().count("mtp-chat: the pipeline lost rank 1") == 1
    finally:
        stop(procs)


def test_a_silent_worker_fails_the_request_after_the_timeout(model, tmp_path):
    procs, client = _serve(tmp_path, model, "--pipeline-timeout", "3")
    try:
        name = client.models.list().data[0].id
        os.kill(procs[1].pid, signal.SIGSTOP)
        t0 = time.time()
        failed: list = []
        _failure(client, name, failed)
        assert failed and failed[0].status_code == 503 and "no answer within 3 s" in failed[0].message
        assert time.time() - t0 < 10
    finally:
        stop(procs)


def test_a_web_port_that_is_rank_0s_ring_port_is_refused_with_what_to_do(model, tmp_path):
    def argv(rank):
        ring_port = json.loads((tmp_path / "hosts.json").read_text())[0][0].rsplit(":", 1)[1]
        return [sys.executable, "-m", "webapp", "--distributed", "--model", str(model), "--port", ring_port,
                "--no-warmup"]

    for attempt in range(3):   # new ring ports when one was taken between finding and binding it
        procs = start_ranks(tmp_path, argv, env={"MTP_CHAT_CACHE_DIR": ""})
        try:
            code = procs[0].wait(timeout=60)
        finally:
            stop(procs)
        if not bind_failed(tmp_path, 2):
            break
    text = (tmp_path / "rank0.log").read_text()
    assert code == 2 and "is this rank's ring port in MLX_HOSTFILE" in text and "pass another --port" in text, text
    assert "press Ctrl+C" not in text
    worker = (tmp_path / "rank1.log").read_text()
    assert "a rank left before the ranks compared checkpoints" in worker and "Traceback" not in worker, worker


def test_one_race_in_a_real_browser_runs_both_lanes_through_the_pipeline(model, tmp_path):
    from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS, LONG_PROMPT

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (no browser download needed)")
    port = free_port()
    procs, _ = _serve(tmp_path, model, port=port)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(f"http://127.0.0.1:{port}/")
            page.click("#tab-race-button")
            for elem, value in (("max-tokens", 48), ("race-repeats", 1)):
                box = page.locator(f"#{elem} input")
                box.fill(str(value))
                box.press("Tab")
            page.fill("#race-prompt textarea", LONG_PROMPT)
            page.click("#race-start")
            page.wait_for_selector("#race-stats .race-uncertainty")
            stats = page.locator("#race-stats").inner_text()
            assert "One race is one sample" in stats and "error" not in stats.lower(), stats
            browser.close()
        assert "the pipeline lost" not in (tmp_path / "rank0.log").read_text()
    finally:
        stop(procs)
