"""Issue 13 in a real browser (Debian chromium driven by Playwright): the user's own text
shows exactly as typed, the model's reply stays markdown with no active HTML, and a
refused message says why without covering the conversation.

The model's reply is canned (``host.stream`` replaced): its text must contain HTML and
markdown, which a tiny random checkpoint does not write.
"""
from __future__ import annotations

from types import SimpleNamespace

from playwright import sync_api
import pytest

from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS, needs_chromium, make_host, served

needs_chromium()

TIMEOUT = 30_000
USER_TEXTS = ["<div> & <b>x</b>",
              "<img src=x onerror=\"window.pwned='user'\"> **not bold** [link](javascript:alert(1))\n# not a heading"]
REPLY = ("Here is **bold** and code:\n\n```python\nprint('<b>hi</b>')\n```\n\n"
         "<img src=x onerror=\"window.pwned='model'\"> <script>window.pwned='script'</script> done")
USER = "#chatbot [data-testid='user']"
BOT = "#chatbot [data-testid='bot']"


def canned_stream(mode, params, prompt, stop=None, **kw):
    yield SimpleNamespace(text=REPLY, finished=True, stats=None)


@pytest.fixture(scope="module")
def page(tiny_model_dir):
    host = make_host(tiny_model_dir)
    host.stream = canned_stream
    with served(host) as (url, demo), sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        pg.set_default_timeout(TIMEOUT)
        pg.goto(url)
        pg.wait_for_selector("#chat-input textarea")
        yield pg
        browser.close()


def send(pg, text):
    n = pg.locator(BOT).count()
    pg.fill("#chat-input textarea", text)
    pg.click("#chat-send")
    pg.wait_for_function(f"n => document.querySelectorAll(\"{BOT}\").length > n", arg=n)


def test_the_users_text_shows_exactly_as_typed(page):
    for text in USER_TEXTS:
        send(page, text)
        bubble = page.locator(USER).last
        assert bubble.inner_text() == text
        assert bubble.locator("b, strong, img, h1, a").count() == 0
    assert page.evaluate("() => window.pwned") is None


def test_the_models_reply_is_markdown_without_active_html(page):
    bot = page.locator(BOT).last
    assert bot.locator("strong").inner_text() == "bold"
    assert bot.locator("pre code").inner_text().strip() == "print('<b>hi</b>')"
    assert bot.locator("script, [onerror]").count() == 0
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.pwned") is None


def test_the_text_comes_back_as_typed_after_a_reload_and_an_undo(page):
    page.reload()
    page.wait_for_selector(USER)
    assert [page.locator(USER).nth(i).inner_text() for i in range(2)] == USER_TEXTS
    page.click("#chat-undo")
    page.wait_for_function(f"() => document.querySelectorAll(\"{USER}\").length == 1")
    assert page.locator("#chat-input textarea").input_value() == USER_TEXTS[1]


def test_an_empty_message_is_refused_with_a_warning_and_nothing_else(page):
    page.fill("#chat-input textarea", "  ")
    page.click("#chat-send")
    page.wait_for_selector("[data-testid='toast-body']:has-text('Type a message first')")
    page.wait_for_timeout(500)
    assert page.locator("[data-testid='toast-body']").count() == 1     # no error about the history
    assert page.locator("#chatbot").get_by_text("Error", exact=True).count() == 0
    assert page.locator(USER).count() == 1
