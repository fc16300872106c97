"""Hardening found by a black-box probe (issue 13): unicode, /respond's history, literal user
text, one log line per refusal, an idle server that does not poll. The browser check of
literal user text is tests/test_hardening_browser.py."""
from __future__ import annotations

import json
import logging
import urllib.request
import uuid

import gradio as gr
import gradio_client
import pytest

from tests._webapp_helpers import Req, make_host, served
from webapp.ui.chat import ChatHandlers, is_stats, text_of
from webapp.serving.inputs import clean_text
from webapp.ui.literal import shown, typed
from webapp.ui.race import RaceHandlers
from webapp.serving.stops import StopRegistry

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=0, depth="1")
GREEDY_ARGS = ("mtp", "", 0.0, 1.0, 0, 0.0, 8, 0, "1")   # /respond after the history


@pytest.fixture(scope="module")
def host(tiny_model_dir):
    return make_host(tiny_model_dir)


@pytest.fixture(scope="module")
def app(host):
    with served(host) as (url, demo):
        yield url, demo


@pytest.fixture()
def chat(host):
    return ChatHandlers(host, StopRegistry(), update_interval=0.02)


def user(text):
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def utf8(value) -> bytes:
    """What Gradio must be able to send: JSON in valid UTF-8 (raises on a lone surrogate)."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


# --- 1. a lone surrogate never breaks the stream -----------------------------------------
def join_raw(url, demo, api_name, args):
    """/gradio_api/queue/join with JSON escapes kept as sent (gradio_client cannot send a lone
    surrogate), then the event's SSE stream: returns its messages."""
    fn_index = next(i for i, fn in demo.fns.items() if fn.api_name == api_name)
    data = list(args) + [None] * (len(demo.fns[fn_index].inputs) - len(args))
    session = uuid.uuid4().hex
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session})   # ASCII: "\ud800" stays an escape
    assert "\\ud800" in body
    req = urllib.request.Request(f"{url}/gradio_api/queue/join", body.encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).read()
    messages = []
    with urllib.request.urlopen(f"{url}/gradio_api/queue/data?session_hash={session}", timeout=60) as stream:
        for line in stream:
            if line.startswith(b"data:"):
                msg = json.loads(line[5:])
                messages.append(msg)
                if msg.get("msg") in ("process_completed", "close_stream"):
                    break
    return messages


def test_a_lone_surrogate_in_a_message_gets_a_whole_reply_over_the_queue(app):
    url, demo = app
    messages = join_raw(url, demo, "respond", [user("Define \ud800 harbor.")] + list(GREEDY_ARGS))
    done = [m for m in messages if m.get("msg") == "process_completed"]
    assert done and done[0]["success"], messages[-3:]
    history = done[0]["output"]["data"][0]
    assert text_of(history[0]["content"]) == "Define \ufffd harbor."
    assert is_stats(history[-1]) and "tok/s" in history[-1]["metadata"]["title"]


def test_surrogates_anywhere_in_a_chat_request_are_cleaned(chat):
    history = user("first \udfff") + [
        {"role": "assistant", "content": [{"type": "text", "text": "reply \ud800"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "stats"}], "metadata": {"title": "MTP \ud800"}},
    ] + user("again \ud83d\ude00 \ud800")
    final = list(chat.respond(history, "ar", "be brief \ud800", max_tokens=8, **GREEDY))[-1]
    utf8(final)
    assert text_of(final[0]["content"]) == "first \ufffd"
    assert text_of(final[3]["content"]) == "again \U0001F600 \ufffd"     # a split pair is joined again
    assert final[2]["metadata"]["title"] == "MTP \ufffd"
    message, submitted = chat.submit("hi \ud800", [], request=Req("s1"))
    assert submitted == user("hi \ufffd")


def test_a_surrogate_in_the_race_prompt_is_cleaned(host):
    race = RaceHandlers(host, StopRegistry(), update_interval=0.05)
    outs = list(race.race("What is \ud800?", 1, 0.0, 1.0, 0, 0.0, 6, 0, "1"))
    utf8(outs[-1])
    assert outs[-1][4]["finished"]


def test_clean_text_keeps_valid_text():
    assert clean_text("plain, ünïcödé 😀") == "plain, ünïcödé 😀"
    assert clean_text(None) == ""


# --- 2. /respond validates its history as the page does ------------------------------------
@pytest.mark.parametrize("history, why", [
    ([], "empty"),
    (user("   \n "), "empty"),
    ([{"role": "banana", "content": [{"type": "text", "text": "hi"}]}], "banana"),
    ([{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}], "system"),
    (user("hi") + [{"role": "assistant", "content": [{"type": "text", "text": "hello"}]}], "last message"),
])
def test_respond_refuses_a_history_the_page_could_not_send(app, history, why):
    url, _ = app
    with pytest.raises(Exception, match=why):
        gradio_client.Client(url, verbose=False, download_files=False).predict(
            history, *GREEDY_ARGS, api_name="/respond")


def test_the_page_refuses_an_empty_message_before_the_queue(chat):
    """The page's checks stop the chain (an error) and say why in a warning, not an error
    that would cover the conversation; the instant steps refuse too (direct calls)."""
    with pytest.warns(UserWarning, match="Type a message"), pytest.raises(gr.Error) as err:
        chat.check_message("  ", request=Req("s2"))
    assert not err.value.visible
    with pytest.warns(UserWarning, match="Nothing to regenerate"), pytest.raises(gr.Error):
        chat.check_regenerate([{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}])
    with pytest.raises(gr.Error, match="Type a message"):
        chat.submit("  ", [], request=Req("s2"))
    with pytest.raises(gr.Error, match="Nothing to regenerate"):
        chat.prepare_regenerate([], request=Req("s2"))


# --- 3. the user's text round-trips through its literal form -------------------------------
@pytest.mark.parametrize("text", [
    "<div> & <b>x</b>", "<img src=x onerror=alert(1)> **bold** [a](javascript:alert(1))",
    "# not a heading\n> not a quote\n- not a list\n1. nor this\n===", "    indented\n\ttabbed",
    "snake_case _em_ a*b*c ~~x~~ | t | `code` $$x$$ &amp; C:\\dir\\* end\\", "", "plain words"])
def test_user_text_survives_its_literal_form(text):
    assert typed(shown(text)) == text
    assert typed(text) == text or "\\" in text   # what API clients send is taken as typed


def test_the_chatbot_shows_user_text_escaped_and_hands_it_back_as_typed(app):
    _, demo = app
    chatbot = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "chatbot")
    history = user("<b>x</b> & *y*") + [{"role": "assistant", "content": [{"type": "text", "text": "**bold**"}]}]
    payload = chatbot.postprocess(history)
    assert payload.root[0].content[0].text == shown("<b>x</b> & *y*") != "<b>x</b> & *y*"
    assert payload.root[1].content[0].text == "**bold**"          # the model's markdown is kept
    back = chatbot.preprocess(type(payload).model_validate(payload.model_dump()))
    assert text_of(back[0]["content"]) == "<b>x</b> & *y*"


# --- 6. a refused request logs one line ----------------------------------------------------
def test_refusals_log_one_line_and_no_traceback(app, capfd, caplog):
    url, _ = app
    client = gradio_client.Client(url, verbose=False, download_files=False)
    capfd.readouterr()
    bad = [
        ("/respond", (user("x"), "mtp", "", 0.6, 0.0, 20, 0.0, 10, 0, "1")),          # top_p 0
        ("/respond", ([],) + GREEDY_ARGS),                                            # empty history
        ("/race", ("What?", 99, 0.6, 0.95, 20, 0.0, 10, 0, "1")),                    # repeats 99 (Gradio's check)
        ("/respond", (user("x"), "mtp", "", 9.0, 1.0, 0, 0.0, 10, 0, "1")),          # beyond the slider
        ("/respond", (user("x"), "mtp", "", 0.6, 1.0, 0, 0.0, 10, "abc", "1")),      # not a number
        ("/respond", ([{"role": "user", "content": "hi"}],) + GREEDY_ARGS),          # content not as blocks
    ]
    with caplog.at_level(logging.WARNING, logger="mtp_chat"):
        for api_name, args in bad:
            with pytest.raises(Exception):
                client.predict(*args, api_name=api_name)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    refusals = [r for r in caplog.records if r.name == "mtp_chat"]
    assert len(refusals) == len(bad), [r.getMessage() for r in refusals]
    assert all("\n" not in r.getMessage() for r in refusals)
    assert "top_p" in refusals[0].getMessage() and "history is empty" in refusals[1].getMessage()
    assert "Repeat N times" in refusals[2].getMessage() and "20" in refusals[2].getMessage()
    assert "Temperature" in refusals[3].getMessage() and "'abc'" in refusals[4].getMessage()
    assert "0.content" in refusals[5].getMessage()


# --- 7. the idle server does not poll every millisecond --------------------------------------
def test_the_idle_queue_sleeps_between_checks(app):
    _, demo = app
    assert demo._queue.sleep_when_free >= 0.02
    assert demo._queue.progress_update_sleep_when_free >= 0.1
