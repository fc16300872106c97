"""Shared by the webapp tests: a real app on a tiny checkpoint, launched on 127.0.0.1."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parent.parent
READY = "press Ctrl+C"


def needs_chromium() -> None:
    """Skip the calling test module when Debian's chromium is absent. scripts/test.sh installs it
    (or fails saying what is missing); under CI any skip fails the run (tests/conftest.py)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent (Debian: apt-get install chromium chromium-driver)", allow_module_level=True)

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
# On the default tiny checkpoint, greedy decoding of this prompt runs > 6000 tokens without
# EOS (~25 s on a 2-core CPU): long enough to press Stop or close the tab in the middle.
LONG_PROMPT = "Hi"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_host(model_dir: Path, **overrides):
    from core.settings import get_settings
    from webapp.serving.model import ModelHost

    # A reply's conversation snapshot as soon as the model is idle (the app's default too), so
    # that one test's snapshot does not land in the middle of the next test's reply (its timings).
    # tests/test_api_agents.py sets the grace itself where the grace is what it tests.
    overrides.setdefault("history_grace_s", 0.0)
    settings = get_settings(model=model_dir, **overrides)
    return ModelHost.load(model_dir, settings, log=lambda m: None)


@contextmanager
def served(host, auth=None, api_key=None, **kw):
    """Serve the real app (UI and API on one port, webapp/server.py) on a free port of
    127.0.0.1; yields (its URL, the Blocks). ``demo.running`` is the running server."""
    from webapp.server import launch
    from webapp.ui.page import build_app

    demo = build_app(host, runtime="test runtime")
    running = launch(demo, host, host="127.0.0.1", port=0, auth=auth, api_key=api_key, **kw)
    demo.running = running
    try:
        yield running.url, demo
    finally:
        running.stop()
        if getattr(host, "histories", None) is not None:   # no snapshot of its conversations runs into the next test
            host.histories.end()


def saved_history(page, demo) -> list:
    """The chat history the page keeps in localStorage, decrypted as the page does on reload
    (gr.BrowserState: CryptoJS AES with the passphrase sha256(secret), OpenSSL's salted format)."""
    import base64
    import hashlib
    import json

    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from webapp.ui.page import HISTORY_KEY

    stored = page.evaluate("k => localStorage.getItem(k)", HISTORY_KEY)
    if not stored:
        return []
    secret = next(b.secret for b in demo.blocks.values() if b.__class__.__name__ == "BrowserState")
    raw = base64.b64decode(stored.split(":", 1)[1])
    assert raw[:8] == b"Salted__", "not CryptoJS's salted format"
    passphrase, salt, derived, block = hashlib.sha256(secret.encode()).hexdigest().encode(), raw[8:16], b"", b""
    while len(derived) < 48:        # OpenSSL's EVP_BytesToKey with MD5, as CryptoJS derives key and iv
        block = hashlib.md5(block + passphrase + salt).digest()
        derived += block
    dec = Cipher(algorithms.AES(derived[:32]), modes.CBC(derived[32:48])).decryptor()
    unpad = padding.PKCS7(128).unpadder()
    plain = unpad.update(dec.update(raw[16:]) + dec.finalize()) + unpad.finalize()
    return json.loads(plain)


def wait_saved(page, demo, check, what: str, timeout: float = 180) -> list:
    """Wait until the history the page saved (what a reload restores) passes `check`: the page
    writes it after a reply ends, so a changed localStorage may still be the previous turn's."""
    import time

    t0, history = time.time(), []
    while time.time() - t0 < timeout:
        history = saved_history(page, demo)
        if check(history):
            return history
        time.sleep(0.1)
    raise AssertionError(f"the saved history never {what}: {history!r:.500}")


def screenshot_dir() -> Path:
    d = Path(os.environ.get("MTP_CHAT_SCREENSHOTS", "artifacts/screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


class Req:
    """Stands in for gr.Request in direct calls: only the session hash is used."""

    def __init__(self, session_hash: str):
        self.session_hash = session_hash


def in_thread(fn, *args):
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


class App:
    """`python -m webapp` on a free port, its output collected line by line."""

    def __init__(self, model_dir, *args, **env_vars):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for name in ("MTP_CHAT_AUTH", "MTP_CHAT_API_KEY", "MTP_CHAT_LAN"):
            env.pop(name, None)
        env.update(env_vars)
        self.proc = subprocess.Popen([sys.executable, "-m", "webapp", "--model", str(model_dir), "--port",
                                      str(self.port), "--no-warmup", *args], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list = []
        self.ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()
        if not self.ready.wait(120):
            self.proc.kill()
            raise AssertionError("the app did not start:\n" + "".join(self.lines))

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if READY in line:
                self.ready.set()

    def signal(self, sig) -> float:
        self.mark = len(self.lines)
        self.proc.send_signal(sig)
        return time.perf_counter()

    def wait(self, timeout=30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def after_signal(self) -> list:
        time.sleep(0.1)                      # the pump thread reads the last lines
        return [line.strip() for line in self.lines[self.mark:] if line.strip()]


def two_turn_api_conversation(host, depth: int) -> None:
    """One conversation through the official openai client on a served host: a greedy first turn,
    a sampled streamed second turn that starts from the first one's cached state."""
    import openai

    with served(host) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "What is the sea?"}]
        first = client.chat.completions.create(model=client.models.list().data[0].id, messages=msgs, max_tokens=12,
                                               temperature=0, extra_body={"mode": "mtp", "depth": depth})
        text = first.choices[0].message.content
        assert text and first.usage.completion_tokens > 0
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "And the moon?"}]
        stream = client.chat.completions.create(model=first.model, messages=msgs, max_tokens=12, temperature=0.6,
                                                stream=True, extra_body={"mode": "mtp", "depth": 2})
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(pieces)
    assert host.prefix_cache.hits > 0  # the second turn reused the first one's state
