"""The waterfall in a real browser: a chat reply's collapsible stats open onto a stacked bar of
where its time went, and the race panel shows both lanes' bars side by side; each bar's parts
add up to the reply's own compute time (within the titles' rounding). The API returns the same
figures.

Skips only when /usr/bin/chromium is absent (under CI a skip fails the run).
"""
from __future__ import annotations

import openai
import pytest
from playwright import sync_api

from tests._engine_helpers import MIXED, make_mixed_head
from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS, make_host, needs_chromium, screenshot_dir, served

needs_chromium()

TIMEOUT = 60_000
MTP_PARTS = {"prefill", "draft", "forward", "acceptance", "commit", "sampling", "host"}
# What a bar says, read as a person would: each part's title ("label: X ms") and the wall line
# (the chat's sanitizer drops data-* attributes; classes, styles and titles stay).
BAR = r"""sel => [...document.querySelectorAll(sel)].map(w => ({
    lane: [...w.classList].find(c => c.startsWith('wf-lane-')).slice(8),
    wall: +w.querySelector('.wf-wall').innerText.match(/own compute time ([\d.]+) ms/)[1] / 1000,
    visible: w.offsetWidth > 0, box: w.getBoundingClientRect().toJSON(),
    parts: Object.fromEntries([...w.querySelectorAll('.wf-part')].map(p => [
        [...p.classList].find(c => c.startsWith('wf-') && c != 'wf-part').slice(3),
        +p.title.match(/: ([\d.]+) ms/)[1] / 1000])),
    widths: [...w.querySelectorAll('.wf-part')].map(p => p.getBoundingClientRect().width)}))"""


@pytest.fixture(scope="module")
def app(tiny_checkpoint):
    # greedy, on a head that accepts some drafts: every part of a cycle shows up
    host = make_host(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)), temperature=0.0, top_p=1.0, top_k=0,
                     max_tokens=120, depth="2")
    with served(host) as (url, demo):
        yield url


@pytest.fixture(scope="module")
def page(app):
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = b.new_context(viewport={"width": 1280, "height": 900}).new_page()
        pg.set_default_timeout(TIMEOUT)
        pg.goto(app)
        pg.wait_for_selector("#chat-input textarea")
        yield pg
        b.close()


def check_sums(bar):
    total = sum(bar["parts"].values())
    assert bar["wall"] > 0 and abs(total - bar["wall"]) <= 0.02 * bar["wall"], bar   # the titles' rounding
    assert min(bar["parts"].values()) >= 0, bar
    assert sum(bar["widths"]) > 0


def test_a_chat_reply_opens_its_waterfall(page):
    page.fill("#chat-input textarea", "Tell me about the harbor.")
    page.click("#chat-send")
    page.wait_for_function("() => [...document.querySelectorAll('#chatbot .thought')].some(e => e.innerText.includes('tok/s'))")
    assert not page.evaluate(BAR, "#chatbot .waterfall") or not page.evaluate(BAR, "#chatbot .waterfall")[0]["visible"]
    shown = "() => { const w = document.querySelector('#chatbot .waterfall'); return !!w && w.offsetWidth > 0; }"
    for _ in range(5):   # the history's last re-render (after the reply is saved) may close it again
        page.locator("#chatbot .thought").last.click()       # open the collapsible stats
        try:
            page.wait_for_function(shown, timeout=3000)
            page.wait_for_timeout(500)
            if page.evaluate(shown):
                break
        except sync_api.TimeoutError:
            pass
    page.screenshot(path=str(screenshot_dir() / "waterfall-chat.png"), full_page=True)
    [bar] = page.evaluate(BAR, "#chatbot .waterfall")
    assert bar["lane"] == "mtp" and set(bar["parts"]) == MTP_PARTS
    assert all(bar["parts"][k] > 0 for k in ("prefill", "draft", "forward", "acceptance")), bar
    check_sums(bar)
    assert "verify forward" in page.locator("#chatbot .waterfall").inner_text()


def test_the_race_shows_both_waterfalls_side_by_side(page):
    page.click("#tab-race-button")
    page.locator("#race-repeats input").fill("1")
    page.locator("#race-repeats input").press("Tab")
    page.fill("#race-prompt textarea", "What is a harbor?")
    page.click("#race-start")
    page.wait_for_function("() => document.querySelectorAll('#race-stats .race-waterfalls .waterfall').length == 2")
    ar, mtp = page.evaluate(BAR, "#race-stats .race-waterfalls .waterfall")
    assert (ar["lane"], mtp["lane"]) == ("ar", "mtp") and ar["visible"] and mtp["visible"]
    assert abs(ar["box"]["y"] - mtp["box"]["y"]) < 5 and ar["box"]["x"] + ar["box"]["width"] <= mtp["box"]["x"]
    assert "draft" not in ar["parts"] and "acceptance" not in ar["parts"] and ar["parts"]["forward"] > 0
    assert mtp["parts"]["draft"] > 0 and mtp["parts"]["acceptance"] > 0
    check_sums(ar)
    check_sums(mtp)
    page.screenshot(path=str(screenshot_dir() / "waterfall-race.png"), full_page=True)


def test_the_api_returns_the_same_figures(app):
    client = openai.OpenAI(base_url=app + "/v1", api_key="unused", max_retries=0)
    for mode in ("mtp", "ar"):
        r = client.chat.completions.create(model="model", messages=[{"role": "user", "content": "Hi"}], max_tokens=40,
                                           temperature=0, extra_body={"mode": mode})
        mtp = r.model_extra["mtp"]
        parts, wall = mtp["waterfall"], mtp["compute_seconds"]
        assert set(parts) == MTP_PARTS and abs(sum(parts.values()) - wall) <= 1e-5 and min(parts.values()) >= 0
        assert (parts["draft"] > 0) == (mode == "mtp") and parts["forward"] > 0
