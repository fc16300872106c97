"""The race's figures in a real browser (Debian chromium driven by Playwright): Repeat N times
reports the median with its spread, and short replies say they are not a result (issue 25).

Skips only when /usr/bin/chromium (or the playwright package) is absent. Screenshots go to
$MTP_CHAT_SCREENSHOTS (default artifacts/screenshots).
"""
from __future__ import annotations

import os
import re

import pytest

from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS, LONG_PROMPT, make_host, screenshot_dir, served

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent (Debian: apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (no browser download needed)")

TIMEOUT = 60_000


@pytest.fixture(scope="module")
def page(tiny_model_dir):
    host = make_host(tiny_model_dir, temperature=0.6, top_p=0.95, top_k=20)
    with served(host) as (url, demo), sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1280, "height": 1000})
        pg.set_default_timeout(TIMEOUT)
        pg.goto(url)
        pg.wait_for_selector("#chat-input textarea")
        yield pg
        browser.close()


def set_number(pg, elem_id, value):
    box = pg.locator(f"#{elem_id} input")
    box.fill(str(value))
    box.press("Tab")


def test_repeat_n_times_reports_the_median_with_its_spread_and_short_replies_say_so(page):
    page.click("#tab-race-button")
    assert page.locator("#race-repeats input").input_value() == "3"      # one click: three races
    set_number(page, "max-tokens", 12)                                     # replies too short to judge
    page.click("#race-start")
    page.wait_for_selector("#race-stats .repeats[data-runs='3']")
    repeats = page.locator("#race-stats .repeats")
    text = repeats.inner_text()
    median, lo, hi = (float(repeats.get_attribute(f"data-{k}")) for k in ("median", "min", "max"))
    assert lo <= median <= hi
    assert re.search(r"Median speedup over 3/3 runs: [\d.]+× \(spread [\d.]+–[\d.]+×: [\d.]+×, [\d.]+×, [\d.]+×\)", text), text
    assert f"{median:.2f}×" in text and "3 of 3 runs had a reply under 32 tokens" in text
    speed = page.locator("#race-stats .speedup")
    assert speed.get_attribute("data-short") == "1"
    note = page.locator("#race-stats .speedup .short-note")
    assert note.is_visible() and "Not a result" in note.inner_text() and "under 32" in note.inner_text()
    page.wait_for_function("() => document.querySelector('#race-start button, button#race-start')?.disabled === false")
    page.screenshot(path=str(screenshot_dir() / "race-repeats-short.png"), full_page=True)


def test_a_long_race_has_no_short_note_and_one_race_says_it_is_one_sample(page):
    set_number(page, "max-tokens", 64)
    set_number(page, "race-repeats", 1)
    page.fill("#race-prompt textarea", LONG_PROMPT)
    page.click("#race-start")
    page.wait_for_selector("#race-stats .race-uncertainty")
    assert page.locator("#race-stats .speedup").get_attribute("data-short") == "0"
    assert page.locator("#race-stats .short-note").count() == 0
    assert "One race is one sample" in page.locator("#race-stats").inner_text()


def test_a_short_chat_reply_says_so_next_to_its_speed(page):
    page.click("#tab-chat-button")
    set_number(page, "max-tokens", 8)
    page.fill("#chat-input textarea", "Hi")
    page.click("#chat-send")
    page.wait_for_function("() => [...document.querySelectorAll('#chatbot .thought')].some(e => e.innerText.includes('tok/s'))")
    title = page.locator("#chatbot .thought").last.inner_text()
    assert re.search(r"8 tokens · [\d.]+ tok/s \(short reply: not a speed figure\)", title), title
    assert "vs AR" not in title
