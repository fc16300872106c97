"""The launched app over HTTP: gradio_client against 127.0.0.1, auth, and the CLI itself."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import gradio_client
import pytest

from tests._webapp_helpers import free_port, make_host, served

REPO = Path(__file__).resolve().parent.parent
GREEDY = (0.0, 1.0, 0, 0.0)            # temperature, top_p, top_k, min_p


@pytest.fixture(scope="module")
def host(tiny_model_dir):
    return make_host(tiny_model_dir)


@pytest.fixture(scope="module")
def app_url(host):
    with served(host) as (url, demo):
        yield url


def client(url, **kw):
    return gradio_client.Client(url, verbose=False, download_files=False, **kw)


def user(text):
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def reply_of(history):
    msgs = [m for m in history if m["role"] == "assistant" and not (m.get("metadata") or {}).get("title")]
    return "".join(b.get("text", "") if isinstance(b, dict) else str(b)
                   for m in msgs for b in (m["content"] if isinstance(m["content"], list) else [m["content"]]))


def test_chat_streams_over_the_api(app_url):
    c = client(app_url)
    job = c.submit(user("Tell me a story"), "mtp", "", *GREEDY, 400, 0, "1", api_name="/respond")
    final = job.result()
    updates = job.outputs()
    assert len(updates) >= 3, "several streamed updates"
    assert len(reply_of(updates[0])) <= len(reply_of(final)) and reply_of(final)
    stats = final[-1]
    assert "tok/s" in stats["metadata"]["title"] and "acceptance" in stats["metadata"]["title"]


def test_race_returns_stats_over_the_api(app_url):
    c = client(app_url)
    ar_html, mtp_html, stats_html, chart, summary = c.predict(
        "What is a verb?", 1, 0.6, 0.95, 20, 0.0, 40, 0, "1", api_name="/race")
    assert summary["finished"] and summary["ar"]["tokens"] > 0 and summary["mtp"]["tokens"] > 0
    assert summary["speedup"] > 0 and summary["mtp"]["acceptance_rate"] is not None
    assert 'data-lane="ar"' in ar_html and "tok-" in mtp_html and "Speedup" in stats_html


def test_bad_request_shows_an_error_and_the_app_keeps_serving(app_url):
    c = client(app_url)
    with pytest.raises(Exception, match="top_p"):
        c.predict(user("x"), "mtp", "", 0.6, 0.0, 20, 0.0, 10, 0, "1", api_name="/respond")
    out = c.predict(user("x"), "ar", "", *GREEDY, 5, 0, "1", api_name="/respond")
    assert "tok/s" in out[-1]["metadata"]["title"]


def test_two_users_are_served_one_after_the_other_with_their_own_histories(app_url):
    a, b = client(app_url), client(app_url)
    ja = a.submit(user("I am Ann"), "mtp", "", *GREEDY, 200, 0, "1", api_name="/respond")
    jb = b.submit(user("I am Bob"), "ar", "", *GREEDY, 200, 0, "1", api_name="/respond")
    ra, rb = ja.result(), jb.result()
    assert ra[0]["content"][0]["text"] == "I am Ann" and rb[0]["content"][0]["text"] == "I am Bob"
    assert "MTP" in ra[-1]["metadata"]["title"], ra[-1]
    assert "AR" in rb[-1]["metadata"]["title"], rb[-1]


def test_cancel_frees_the_model(app_url):
    c = client(app_url)
    job = c.submit(user("Hello there"), "ar", "", *GREEDY, 3000, 0, "1", api_name="/respond")
    while not job.outputs():
        time.sleep(0.05)
    job.cancel()
    t0 = time.perf_counter()
    out = c.predict(user("x"), "ar", "", *GREEDY, 5, 0, "1", api_name="/respond")   # not stuck behind it
    # a hang guard, not a speed limit: the cancelled 3000-token decode would hold the model ~30 s
    assert time.perf_counter() - t0 < 15 and "tok/s" in out[-1]["metadata"]["title"]


def test_auth_is_enforced(host):
    with served(host, auth=("ann", "s3cret")) as (url, demo):
        with pytest.raises(Exception):
            client(url)
        with pytest.raises(Exception):
            client(url, auth=("ann", "wrong"))
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url + "/config", timeout=10)
        ok = client(url, auth=("ann", "s3cret"))
        out = ok.predict(user("x"), "mtp", "", *GREEDY, 5, 0, "1", api_name="/respond")
        assert "tok/s" in out[-1]["metadata"]["title"]


def _read_until(proc, needle, timeout):
    lines, found = [], threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if needle in line:
                found.set()

    threading.Thread(target=pump, daemon=True).start()
    found.wait(timeout)
    return found.is_set(), lines


def test_cli_launches_and_prints_what_it_serves(tiny_model_dir):
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MTP_CHAT_AUTH", None)
    proc = subprocess.Popen([sys.executable, "-m", "webapp", "--model", str(tiny_model_dir), "--port", str(port),
                             "--lan", "--share", "--depth", "auto"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ok, lines = _read_until(proc, "press Ctrl+C", 90)
        out = "".join(lines)
        assert ok, out
        assert f"open http://127.0.0.1:{port}" in out
        assert "model: " in out and "qwen3_5" in out and "BLAS" in out and "Warm-up done" in out
        assert "exactness: greedy MTP = AR " in out and "batched replies = alone " in out   # core/exactness.py
        assert "on your network: http://" in out or "no LAN address" in out
        assert "WARNING" in out and "--auth" in out            # --lan without a password
        assert "not available offline" in out                  # --share
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200 and "mtp-chat" in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_cli_refuses_bad_input_clearly(tmp_path):
    r = subprocess.run([sys.executable, "-m", "webapp", "--model", str(tmp_path / "nope")], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "model directory not found" in r.stderr
    r = subprocess.run([sys.executable, "-m", "webapp", "--auth", "nopassword"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "USER:PASS" in r.stderr


def test_the_server_does_not_serve_files(app_url, tiny_model_dir):
    for path in ("/etc/passwd", str(Path(tiny_model_dir) / "config.json"), "README.md", "webapp/ui/page.py"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{app_url}/gradio_api/file={path}", timeout=10)
        assert err.value.code in (403, 404), path
