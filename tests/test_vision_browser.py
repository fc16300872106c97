"""Pictures in the chat, in a real browser (Debian chromium driven by Playwright): a pasted picture
is shown in the conversation, answered with a streamed MTP reply, kept across a reload, and a
follow-up about it starts from the prefix cache; a model without a tower shows no picture button."""
from __future__ import annotations

import base64
import re

from tests._pictures import VL, png
from tests._webapp_helpers import make_host, needs_chromium, screenshot_dir, served, wait_saved

needs_chromium()

TIMEOUT = 60_000
PASTE = """async (b64) => {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], "picture.png", {type: "image/png"}));
  const box = document.querySelector('#chat-input textarea');
  box.focus();
  box.dispatchEvent(new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true}));
}"""


def send_and_wait(pg, text, n_stats):
    pg.fill("#chat-input textarea", text)
    pg.click("#chat-send")
    pg.wait_for_function("n => [...document.querySelectorAll('#chatbot .thought')]"
                         ".filter(e => /tok\\/s/.test(e.innerText)).length >= n", arg=n_stats, timeout=TIMEOUT)


def test_a_pasted_picture_is_answered_kept_and_its_follow_up_cached(browser, tiny_checkpoint):
    host = make_host(tiny_checkpoint(**VL), temperature=0.0, top_p=1.0, top_k=0, max_tokens=24)
    with served(host) as (url, demo):
        pg = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        pg.set_default_timeout(TIMEOUT)
        pg.goto(url)
        pg.wait_for_selector("#chat-input textarea")
        assert "vision tower" in pg.inner_text("#banner")
        pg.evaluate(PASTE, base64.b64encode(png(1)).decode())
        pg.wait_for_selector("#chat-input img")                       # the thumbnail of the pasted picture
        send_and_wait(pg, "What is in the picture?", 1)
        pg.wait_for_selector("#chatbot [data-testid='user'] img")     # shown in the history
        assert pg.locator("#chatbot [data-testid='bot']").first.inner_text().strip()
        send_and_wait(pg, "And its colours?", 2)
        pg.locator("#chatbot .thought").last.click()                  # open the stats: "N from the prefix cache"
        details = pg.locator("#chatbot .thought").last.inner_text()
        cached = int(re.search(r"(\d+) from the prefix cache", details).group(1))
        image_tokens = host.adapter.vision.processor.num_image_tokens(96, 80)
        assert cached >= image_tokens, details
        # the history, picture included, survives a reload
        wait_saved(pg, demo, lambda h: "And its colours?" in str(h), "held the follow-up")
        pg.reload()
        pg.wait_for_selector("#chatbot [data-testid='user'] img")
        assert "And its colours?" in pg.inner_text("#chatbot")
        pg.screenshot(path=str(screenshot_dir() / "chat-picture.png"))


def test_the_demo_model_has_no_tower_and_no_picture_button(browser):
    from core.settings import DEMO_MODEL_DIR

    with served(make_host(DEMO_MODEL_DIR)) as (url, _):
        pg = browser.new_context().new_page()
        pg.goto(url)
        pg.wait_for_selector("#chat-input textarea")
        assert pg.locator("#chat-input input[type=file]").count() == 0
        assert pg.locator("#chat-input button").count() == 0
        assert not pg.locator("#race-image").is_visible()
        assert "text only (no vision tower)" in pg.inner_text("#banner")
