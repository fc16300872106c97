"""A real browser (Debian chromium driven by Playwright) against the launched app.

Skips only when /usr/bin/chromium is absent, and under CI a skip fails the run. Screenshots go to
$MTP_CHAT_SCREENSHOTS (default artifacts/screenshots).
"""
from __future__ import annotations

import logging
import re
import time
import warnings

import pytest

from tests._webapp_helpers import needs_chromium, LONG_PROMPT, make_host, screenshot_dir, served, wait_saved

needs_chromium()

TIMEOUT = 30_000
# Hang guard of the loops that watch a reply stream until it ends (they stop when it ends). Not a
# time limit on the reply: with the suite in parallel (scripts/test.sh, one worker per core) a
# reply here can take over 20 s to start while the other worker computes.
HANG = 180
STOPS = []   # the served app's stop registry (to see when the model is free)
DEMO = []    # the served Blocks (to read the history the page saved)


@pytest.fixture(scope="module")
def app_url(tiny_model_dir):
    # greedy: on the tiny checkpoint LONG_PROMPT then runs > 1000 tokens, long enough to stop
    host = make_host(tiny_model_dir, temperature=0.0, top_p=1.0, top_k=0, max_tokens=200)
    with served(host) as (url, demo):
        STOPS[:], DEMO[:] = [demo.stops], [demo]
        yield url


@pytest.fixture(scope="module")
def page(browser, app_url):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT)
    outside = []
    pg.on("request", lambda r: outside.append(r.url) if not r.url.startswith((app_url, "data:", "blob:")) else None)
    pg.goto(app_url)
    pg.wait_for_selector("#chat-input textarea")
    pg.outside_requests = outside
    yield pg
    ctx.close()


def set_number(pg, elem_id, value):
    box = pg.locator(f"#{elem_id} input")
    box.fill(str(value))
    box.press("Tab")


class _Refusals(logging.Handler):
    """The app's refusals (webapp/ui/refusals.py logs each one): the server runs in this process."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        if "refused submit" in record.getMessage():
            self.seen.append(record.getMessage())


def start_long_reply(pg):
    """Send LONG_PROMPT with a 3000-token budget (the context is 4096) and wait until the reply is streaming."""
    set_number(pg, "max-tokens", 3000)
    # On a loaded CPU the click has reached the app before the typed text did ("Type a message
    # first."): the app refused the empty send, as it should; type and send again. The refusal is
    # read from the app's log, not from its toast, which did not show in time once under CI.
    refusals, app_log = _Refusals(), logging.getLogger("mtp_chat")
    sent = pg.locator("#chatbot [data-testid='user']")
    app_log.addHandler(refusals)
    try:
        for _ in range(3):
            before = len(refusals.seen)
            pg.fill("#chat-input textarea", LONG_PROMPT)
            pg.click("#chat-send")
            t0 = time.time()
            while not sent.count() and len(refusals.seen) == before and time.time() - t0 < HANG:
                pg.wait_for_timeout(100)
            if sent.count():
                break
        assert sent.count(), f"the send never showed: {refusals.seen}"
    finally:
        app_log.removeHandler(refusals)
    # Generous: with the other test worker holding the CPU, the first words took over 30 s once.
    pg.wait_for_function("() => { const b = document.querySelector('#chatbot [data-testid=\"bot\"]');"
                         " return b && b.innerText.length > 20; }", timeout=HANG * 1000)


def bot_text(pg):
    return pg.locator("#chatbot [data-testid='bot']").first.inner_text() if pg.locator(
        "#chatbot [data-testid='bot']").count() else ""


def wait_stats(pg, needle, timeout=TIMEOUT):
    pg.wait_for_function(
        "n => [...document.querySelectorAll('#chatbot .thought')].some(e => e.innerText.includes(n))",
        arg=needle, timeout=timeout)
    return pg.locator("#chatbot .thought").last.inner_text()


def test_chat_streams_and_shows_stats(page):
    set_number(page, "max-tokens", 200)
    page.fill("#chat-input textarea", "Tell me a story")
    # The reply's length at every change of the chat until the stats line appears, recorded in the
    # page: polling from here missed the updates when the other test worker held the CPU.
    page.evaluate("""() => {
        window.replyLengths = [];
        window.replyWatch = new MutationObserver(() => {
            const bot = document.querySelector('#chatbot [data-testid="bot"]');
            if (bot && !document.querySelector('#chatbot .thought')) window.replyLengths.push(bot.innerText.length);
        });
        window.replyWatch.observe(document.querySelector('#chatbot'), {subtree: true, childList: true, characterData: true});
    }""")
    page.click("#chat-send")
    page.wait_for_selector("#chatbot [data-testid='user']")
    stats = wait_stats(page, "tok/s", timeout=HANG * 1000)
    lengths = set(page.evaluate("() => { window.replyWatch.disconnect(); return window.replyLengths; }"))
    assert len(lengths - {0}) >= 2, f"streamed in several updates, saw lengths {sorted(lengths)}"
    assert re.search(r"MTP · \d+ tokens · [\d.]+ tok/s · TTFT", stats)
    assert page.locator("#chatbot [data-testid='user']").first.inner_text().strip() == "Tell me a story"
    page.screenshot(path=str(screenshot_dir() / "chat.png"), full_page=True)
    assert page.outside_requests == [], "the page must not call out"


def first_user(history):
    users = [m for m in history if m["role"] == "user"]
    return users[0]["content"][-1]["text"] if users else None


def test_regenerate_and_undo(page):
    before = bot_text(page)
    page.evaluate("() => document.querySelectorAll('#chatbot .thought').forEach(e => e.remove())")
    page.click("#chat-regenerate")
    wait_stats(page, "tok/s")
    assert page.locator("#chatbot [data-testid='user']").count() == 1
    assert bot_text(page) == before              # greedy: the same reply again
    # Undo at once, while the reply's event may still be closing: Undo takes the reply back, so
    # its closing update must not bring the exchange back (it did, with the CPU busy).
    page.click("#chat-undo")
    page.wait_for_function("() => !document.querySelector('#chatbot [data-testid=\"user\"]')")
    assert page.locator("#chat-input textarea").input_value() == "Tell me a story"
    wait_saved(page, DEMO[0], lambda h: first_user(h) is None, "lost the undone exchange")
    time.sleep(1.0)
    assert page.locator("#chatbot [data-testid='user']").count() == 0
    page.fill("#chat-input textarea", "")


def test_stop_mid_stream_then_history_survives_reload(page):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    page.click("#chat-clear")
    page.wait_for_function("() => !document.querySelector('#chatbot [data-testid=\"user\"]')")
    start_long_reply(page)
    at_stop = len(bot_text(page))
    t_stop = time.time()
    page.click("#chat-stop")
    # the token count below shows it stopped early; HANG: with the suite's other worker busy the
    # stopped reply's last update once took over 30 s to show
    try:
        stats = wait_stats(page, "stopped", timeout=HANG * 1000)
    except PlaywrightTimeout:   # once under CI (2026-12-05): say whether Stop or the last update was lost
        thoughts = page.locator("#chatbot .thought").all_inner_texts()
        raise AssertionError(f"no 'stopped' within {HANG} s: the reply had {at_stop} characters at Stop and "
                             f"{len(bot_text(page))} now; stats shown: {thoughts}") from None
    t_stopped = time.time()
    n = int(re.search(r"(\d+) tokens", stats).group(1))
    assert 0 < n < 5000
    page.screenshot(path=str(screenshot_dir() / "chat-stopped.png"), full_page=True)
    # History lives in the browser (localStorage): a reload brings it back. The page saves it in a
    # request of its own after the reply ends; a reload before that request lands would lose it,
    # as a user's reload would: wait until the stopped reply is what the page saved.
    wait_saved(page, DEMO[0], lambda h: first_user(h) == LONG_PROMPT and "stopped" in str(h), "held the stopped reply")
    t_saved = time.time()
    page.reload()
    page.wait_for_selector("#chatbot [data-testid='user']")
    assert page.locator("#chatbot [data-testid='user']").first.inner_text().strip() == LONG_PROMPT
    wait_stats(page, "stopped")
    if time.time() - t_stop > 30:   # it passes in ~2 s; once under CI it took 182 s: say where, in CI's warnings
        warnings.warn(f"slow Stop: 'stopped' shown {t_stopped - t_stop:.1f} s after Stop ({at_stop} characters then, "
                      f"{n} tokens in the stats), saved {t_saved - t_stopped:.1f} s later, restored "
                      f"{time.time() - t_saved:.1f} s after that")


@pytest.mark.parametrize("button", ["#chat-clear", "#chat-undo"])
def test_clear_or_undo_mid_stream_ends_the_reply_and_it_does_not_come_back(page, button):
    page.click("#chat-clear")
    page.wait_for_function("() => !document.querySelector('#chatbot [data-testid=\"user\"]')")
    start_long_reply(page)
    page.click(button)
    t0 = time.time()
    while STOPS[0].active() and time.time() - t0 < HANG:
        time.sleep(0.05)
    assert STOPS[0].active() == 0, f"{button} must end the reply"
    # The ended reply's last update reaches the page after the button's; it must not bring the
    # conversation back, on the page nor in the history a reload restores.
    time.sleep(1.5)
    assert page.locator("#chatbot [data-testid='user']").count() == 0
    if button == "#chat-undo":                  # the question goes back into the box
        assert page.locator("#chat-input textarea").input_value() == LONG_PROMPT
        page.fill("#chat-input textarea", "")
    wait_saved(page, DEMO[0], lambda h: first_user(h) is None, "lost the withdrawn exchange")
    page.reload()
    page.wait_for_selector("#chat-input textarea")
    time.sleep(1.0)
    assert page.locator("#chatbot [data-testid='user']").count() == 0


def test_race_fills_both_lanes_with_stats_and_colours(page):
    page.click("#tab-race-button")
    set_number(page, "max-tokens", 300)
    set_number(page, "race-repeats", 1)     # one race (the default is 3): later tests need the model free
    # Whether both lanes were ever running with tokens at once, checked in the page at every change
    # (polling from here missed it when the other test worker held the CPU).
    page.evaluate("""() => {
        window.bothRunning = false;
        const both = () => ['ar', 'mtp'].every(k => {
            const e = document.querySelector('#race-lane-' + k + ' .race-lane');
            return e && e.dataset.state === 'running' && +e.dataset.tokens > 0;
        });
        window.raceWatch = new MutationObserver(() => { if (both()) window.bothRunning = true; });
        window.raceWatch.observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
    }""")
    page.click("#race-start")
    page.wait_for_selector("#race-lane-ar .race-lane[data-state='done']", timeout=HANG * 1000)
    page.wait_for_selector("#race-lane-mtp .race-lane[data-state='done']", timeout=HANG * 1000)
    both_running = page.evaluate("() => { window.raceWatch.disconnect(); return window.bothRunning; }")
    assert both_running, "both lanes should fill live, side by side"
    page.wait_for_selector("#race-stats .speedup")
    speed = page.locator("#race-stats .speedup").inner_text()
    assert re.search(r"[\d.]+×", speed), speed
    assert page.locator("#race-lane-mtp .tok-draft, #race-lane-mtp .tok-correction, #race-lane-mtp .tok-bonus").count() > 0
    assert page.locator("#race-lane-mtp .race-legend").is_visible()
    assert page.locator("#race-chart svg path[data-series]").count() == 2
    stats = page.locator("#race-stats").inner_text()
    for word in ("tok/s", "time to first token", "acceptance rate", "tokens per cycle", "draft depth"):
        assert word in stats
    page.screenshot(path=str(screenshot_dir() / "race.png"), full_page=True)


def test_phone_viewport_and_separate_histories(browser, app_url):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                              device_scale_factor=2)
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT)
    pg.goto(app_url)
    pg.wait_for_selector("#chat-input textarea")
    # a new browser is a new user: its own (empty) history
    assert pg.locator("#chatbot [data-testid='user']").count() == 0
    for elem in ("#chat-input textarea", "#chat-send", "#chat-stop", "#chatbot"):
        # waited for, not read at once: on a loaded 2-core host the button is laid out a moment
        # after the textarea (is_visible() does not wait; CI failed on it once)
        pg.locator(elem).wait_for(state="visible")
        assert pg.locator(elem).is_visible(), elem
    overflow = pg.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"page scrolls sideways by {overflow}px on a phone"
    pg.fill("#chat-input textarea", "Hi")
    pg.click("#chat-send")
    wait_stats(pg, "tok/s")
    pg.screenshot(path=str(screenshot_dir() / "phone.png"), full_page=True)
    pg.click("#tab-race-button")
    assert pg.locator("#race-start").is_visible() and pg.locator("#race-lane-mtp").is_visible()
    assert pg.evaluate("() => document.documentElement.scrollWidth - window.innerWidth") <= 1
    pg.screenshot(path=str(screenshot_dir() / "phone-race.png"), full_page=True)
    ctx.close()


def test_closing_the_tab_stops_the_decode(browser, app_url):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT)
    pg.goto(app_url)
    pg.wait_for_selector("#chat-input textarea")
    start_long_reply(pg)
    stops = STOPS[0]
    assert stops.active() == 1
    t0 = time.time()
    ctx.close()                       # the tab goes away mid-reply (~25 s of decoding left)
    while stops.active() and time.time() - t0 < 10:
        time.sleep(0.05)
    assert stops.active() == 0, "closing the tab must free the model (a hang guard: ~25 s were left)"


def test_second_user_waits_in_the_queue_with_a_visible_position(browser, app_url):
    ctxs = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(2)]
    pages = [c.new_page() for c in ctxs]
    for pg in pages:
        pg.set_default_timeout(TIMEOUT)
        pg.goto(app_url)
        pg.wait_for_selector("#chat-input textarea")
    first, second = pages
    start_long_reply(first)
    second.fill("#chat-input textarea", "Who goes next?")
    second.click("#chat-send")
    second.wait_for_function("() => /queue: *1\\/1/.test(document.querySelector('#chatbot').innerText)")
    first.click("#chat-stop")                          # frees the model for the next user
    wait_stats(first, "stopped")
    wait_stats(second, "tok/s")
    assert second.locator("#chatbot [data-testid='user']").first.inner_text().strip() == "Who goes next?"
    assert first.locator("#chatbot [data-testid='user']").first.inner_text().strip() == LONG_PROMPT
    for c in ctxs:
        c.close()
