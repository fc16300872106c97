"""A reasoning template in the real browser: the thinking streams into a collapsible Thinking
section, the answer shows clean, the switch is there, and a long conversation keeps answering
from the prefix cache."""
from __future__ import annotations

import os

from playwright import sync_api
import pytest

from core import split_reply
from tests._engine_helpers import seed_that_closes_thinking
from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS, needs_chromium, make_host, served

needs_chromium()

SAMPLER = dict(temperature=1.0, top_p=1.0, top_k=0, max_tokens=40, depth=2)


@pytest.fixture(scope="module")
def app(tiny_checkpoint):
    path = tiny_checkpoint(template="qwen3_5")
    from adapters import load_adapter

    seed, text = seed_that_closes_thinking(load_adapter(path))
    reasoning, answer = split_reply(text, inside=True)
    host = make_host(path, seed=seed, **SAMPLER)
    assert host.has_thinking
    with served(host) as (url, demo):
        yield url, reasoning, answer


def test_thinking_section_and_clean_answer_then_a_long_conversation(app):
    url, reasoning, answer = app
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pg = b.new_context(viewport={"width": 1280, "height": 900}).new_page()
            pg.set_default_timeout(30_000)
            pg.goto(url)
            pg.wait_for_selector("#chat-input textarea")
            assert pg.locator("#thinking input[type=checkbox]").is_checked()   # the switch, on
            pg.fill("#chat-input textarea", "Hello")
            pg.click("#chat-send")
            pg.wait_for_function("() => [...document.querySelectorAll('#chatbot .thought')]"
                                 ".some(e => e.innerText.includes('tok/s'))")
            groups = pg.locator("#chatbot .thought-group")     # Gradio's collapsible sections
            thinking = [g for g in groups.all() if "Thinking" in g.locator(".title").first.inner_text()]
            assert len(thinking) == 1
            bots = pg.locator("#chatbot [data-testid='bot']").all_inner_texts()
            shown = "\n".join(bots)
            assert "<think>" not in shown and "</think>" not in shown
            assert answer.split()[0] in shown
            # collapsible: its body hides and shows with a click on its title
            first_words = reasoning.split()[0]
            title = thinking[0].locator(".title").first
            def toggles() -> bool:
                shown_before = first_words in thinking[0].inner_text()
                title.click()
                for _ in range(30):    # the section opens (or closes) with a short animation
                    pg.wait_for_timeout(100)
                    if (first_words in thinking[0].inner_text()) != shown_before:
                        return True
                return False

            # (a click that lands while the last streamed update re-renders the section is lost)
            assert toggles() or toggles()
            pg.screenshot(path="artifacts/screenshots/chat-thinking.png" if os.path.isdir("artifacts/screenshots")
                          else "/tmp/chat-thinking.png", full_page=True)
            # a long conversation keeps answering, later turns from the prefix cache
            for i in range(4):
                pg.fill("#chat-input textarea", f"Question number {i}: " + "tell me more about the sea " * 20)
                pg.click("#chat-send")
                # a wait, not a timing: on a loaded 2-core machine one such turn took over 30 s
                pg.wait_for_function("n => [...document.querySelectorAll('#chatbot .thought')]"
                                     ".filter(e => e.innerText.includes('tok/s')).length > n", arg=i + 1,
                                     timeout=120_000)
            last = [t for t in pg.locator("#chatbot .thought").all_inner_texts() if "tok/s" in t][-1]
            assert "cached" in last
        finally:
            b.close()
