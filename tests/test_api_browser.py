"""Two OpenAI API clients and a real browser user on one server at once: all three are
served (the UI keeps working while the API is busy). Debian chromium through Playwright;
skips only when /usr/bin/chromium is absent (a failure under CI)."""
from __future__ import annotations

import threading
import time

import openai
from playwright import sync_api
import pytest

from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS, needs_chromium, LONG_PROMPT, make_host, screenshot_dir, served

needs_chromium()


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    host = make_host(tiny_model_dir, temperature=0.0, top_p=1.0, top_k=0, max_tokens=60)
    with served(host) as (url, demo):
        yield url, demo


def test_two_api_clients_and_a_browser_user_at_once(server):
    url, demo = server
    results, errors = {}, []

    def api_user(name, stream):
        try:
            c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, _strict_response_validation=True)
            kw = dict(model="model", messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=400,
                      temperature=0)
            if stream:
                chunks = list(c.chat.completions.create(stream=True, **kw))
                results[name] = chunks[-1].choices[0].finish_reason
            else:
                results[name] = c.chat.completions.create(**kw).choices[0].finish_reason
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(repr(exc))

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(url)
            page.wait_for_selector("#chat-input textarea")
            threads = [threading.Thread(target=api_user, args=(n, s), daemon=True)
                       for n, s in (("streaming", True), ("whole", False))]
            for t in threads:
                t.start()
            t0 = time.time()
            while not demo.stops.active() and time.time() - t0 < 10:    # the API is decoding
                time.sleep(0.01)
            page.fill("#chat-input textarea", "Tell me a story")
            page.click("#chat-send")
            page.wait_for_function("() => [...document.querySelectorAll('#chatbot .thought')]"
                                   ".some(e => e.innerText.includes('tok/s'))")
            page.screenshot(path=str(screenshot_dir() / "api-and-browser.png"), full_page=True)
            for t in threads:
                t.join(60)
        finally:
            browser.close()
    assert not errors, errors
    assert results == {"streaming": "length", "whole": "length"}
