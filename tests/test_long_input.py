"""Long input through the launched app: Stop during a long prefill frees the model within one
chunk; a 1 MB message is refused with a reason while another browser keeps chatting."""
from __future__ import annotations

import os
import threading
import time

import gradio_client
import pytest
from playwright import sync_api

from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS, make_host, served

GREEDY = (0.0, 1.0, 0, 0.0)


def user(text):
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def served_app(tiny_model_dir):
    host = make_host(tiny_model_dir, temperature=0.0, top_p=1.0, top_k=0, max_tokens=40)
    with served(host) as (url, demo):
        yield url, host, demo


@pytest.mark.parametrize("how", ["stop button", "client cancel"])
def test_stop_during_a_3000_token_prefill_frees_the_model_within_one_chunk(served_app, monkeypatch, how):
    import core.stream

    url, host, demo = served_app
    monkeypatch.setattr(core.stream, "PREFILL_CHUNK", 128)
    chunks, third = [], threading.Event()
    real = host.adapter.forward

    def counting(tokens, cache, **kw):
        if tokens.shape[1] > 8:          # prefill chunks (decode steps are 1-3 tokens)
            chunks.append(time.perf_counter())
            if len(chunks) == 3:
                third.set()
                time.sleep(0.5)         # Stop arrives while this chunk runs
        return real(tokens, cache, **kw)

    monkeypatch.setattr(host.adapter, "forward", counting)
    text = "the quick brown fox jumps over the lazy dog " * 130       # ~3,000 tokens
    assert 2800 < len(host.prompt_ids([{"role": "user", "content": text}]).ids) < 4000
    c = gradio_client.Client(url, verbose=False, download_files=False)
    job = c.submit(user(text), "mtp", "", *GREEDY, 40, 0, "1", api_name="/respond")
    assert third.wait(60)
    if how == "stop button":
        assert demo.stops.stop(f"{c.session_hash}:chat")   # what the Stop button's handler does
        final = job.result(timeout=60)
        assert "stopped" in final[-1]["metadata"]["title"]
    else:
        job.cancel()
    monkeypatch.setattr(host.adapter, "forward", real)
    out = gradio_client.Client(url, verbose=False, download_files=False).predict(
        user("hi"), "ar", "", *GREEDY, 5, 0, "1", api_name="/respond")   # the model is free again
    assert "tok/s" in out[-1]["metadata"]["title"]
    assert len(chunks) == 3                      # no chunk ran after the one being interrupted


def test_a_huge_message_is_refused_at_once_and_loses_nothing(served_app):
    url, host, _ = served_app
    from webapp.ui.page import build_app  # noqa: F401  (the same app the fixture serves)

    c = gradio_client.Client(url, verbose=False, download_files=False)
    renders = []
    hf = host.adapter.tokenizer._tokenizer
    real = hf.apply_chat_template
    hf.apply_chat_template = lambda *a, **k: renders.append(1) or real(*a, **k)
    try:
        final = c.predict(user("x" * 2**20), "mtp", "", *GREEDY, 40, 0, "1", api_name="/respond")
    finally:
        del hf.apply_chat_template
    assert renders == []                      # refused before anything was tokenised, so nothing prefilled
    assert "1,048,576 characters" in final[-1]["content"][0]["text"]
    assert final[0]["content"][0]["text"] == "x" * 2**20


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent")
def test_browser_a_huge_message_is_refused_while_another_browser_keeps_chatting(served_app):
    url, _, _ = served_app
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pages = []
            for _ in range(2):
                pg = b.new_context(viewport={"width": 1280, "height": 900}).new_page()
                pg.set_default_timeout(30_000)
                pg.goto(url)
                pg.wait_for_selector("#chat-input textarea")
                pages.append(pg)
            big, other = pages
            huge = "y" * 2**20
            big.evaluate("t => { const a = document.querySelector('#chat-input textarea'); a.value = t;"
                         " a.dispatchEvent(new Event('input', {bubbles: true})); }", huge)
            other.fill("#chat-input textarea", "Hello there")
            big.click("#chat-send")
            t0 = time.time()
            other.click("#chat-send")
            # the refusal says why, as a toast, and the text stays in the box
            big.wait_for_function("() => document.body.innerText.includes('1,048,576 characters')")
            assert big.locator("#chat-input textarea").input_value() == huge
            assert big.locator("#chatbot [data-testid='user']").count() == 0
            # the other browser got its reply meanwhile, without waiting behind the huge message
            other.wait_for_function(
                "() => [...document.querySelectorAll('#chatbot .thought')].some(e => e.innerText.includes('tok/s'))")
            assert time.time() - t0 < 30
        finally:
            b.close()
