"""The web app's event functions called directly, on the real engine and a tiny checkpoint."""
from __future__ import annotations

import threading
import re

import gradio as gr
import pytest

from tests._ties import tie_free
from tests._webapp_helpers import LONG_PROMPT, Req, make_host
from webapp.ui.chat import ChatHandlers, is_stats, text_of
from webapp.ui.page import build_app
from webapp.ui.race import RaceHandlers
from webapp.serving.stops import StopRegistry

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=0, depth="1")


@pytest.fixture(scope="module")
def host(tiny_model_dir):
    return make_host(tiny_model_dir)


@pytest.fixture()
def chat(host):
    return ChatHandlers(host, StopRegistry(), update_interval=0.02)


def user(text):
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def reply_text(history):
    return "".join(text_of(m["content"]) for m in history if m["role"] == "assistant" and not is_stats(m))


def test_chat_streams_then_appends_stats(chat):
    outs = list(chat.respond(user("Tell me a story"), "mtp", "", max_tokens=300, **GREEDY))
    assert len(outs) >= 3, "the reply should stream in several updates"
    lengths = [len(reply_text(h)) for h in outs]
    assert lengths == sorted(lengths) and lengths[-1] > 0
    final = outs[-1]
    assert [m["role"] for m in final] == ["user", "assistant", "assistant"]
    stats = final[-1]
    assert is_stats(stats) and "tok/s" in stats["metadata"]["title"] and "TTFT" in stats["metadata"]["title"]
    assert "acceptance" in text_of(stats["content"])
    # every message is text blocks only (Gradio 6 messages format)
    assert all(isinstance(m["content"], list) and m["content"][0]["type"] == "text" for m in final)


def test_chat_multi_turn_and_ar_mode_match_greedy_mtp(host, chat):
    """Greedy AR and MTP replies are token-identical (the engine is exact), through the chat path,
    wherever the AR reply meets no near-tie (tests/_ties.py: a verify and decode steps agree to
    rounding; on every machine seen so far this reply meets none)."""
    h = user("Hi")
    ar = list(chat.respond(h, "ar", "Be brief.", max_tokens=40, **GREEDY))[-1]
    mtp = list(chat.respond(h, "mtp", "Be brief.", max_tokens=40, **GREEDY))[-1]
    prompt = host.prompt_ids([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    if host.worker.call(tie_free, host.adapter, prompt, 40):
        assert reply_text(ar) == reply_text(mtp)
    # second turn: the history (including the stats message, which is skipped) goes back in
    h2 = ar + user("And then?")
    out = list(chat.respond(h2, "mtp", "Be brief.", max_tokens=20, **GREEDY))[-1]
    assert [m["role"] for m in out] == ["user", "assistant", "assistant", "user", "assistant", "assistant"]


def test_chat_stop_mid_stream(chat):
    gen = chat.respond(user(LONG_PROMPT), "mtp", "", max_tokens=1000, **GREEDY)
    first = next(gen)
    assert reply_text(first) != ""
    chat.stop(None)                       # the Stop button (session "local" in direct calls)
    rest = list(gen)
    final = rest[-1]
    assert "stopped" in final[-1]["metadata"]["title"]
    # within a cycle, counted: at most one more update of at most depth + 1 tokens arrived
    tokens = int(re.search(r"(\d+) tokens", final[-1]["metadata"]["title"]).group(1))
    assert tokens < 1000 and len(rest) <= 2, (tokens, len(rest))
    assert not chat.stops.busy("local:chat")


def test_chat_stop_while_queued_and_closing_the_generator(chat):
    req = Req("queued-session")
    msg, hist = chat.submit("hello", [], req)          # armed: waits in the model queue
    assert msg == "" and hist[-1]["role"] == "user"
    chat.stop(req)                                     # Stop before the queued step starts
    out = list(chat.respond(hist, "mtp", "", max_tokens=500, request=req, **GREEDY))
    assert len(out) == 1 and "stopped" in out[-1][-1]["metadata"]["title"]
    # Closing the generator (Gradio's cancel / a closed tab) ends the decode and frees the session
    gen = chat.respond(user(LONG_PROMPT), "ar", "", max_tokens=1000, request=req, **GREEDY)
    next(gen)
    assert chat.stops.busy("queued-session:chat")
    gen.close()
    assert not chat.stops.busy("queued-session:chat")


def test_a_reply_taken_back_saves_nothing_after_it(chat):
    """The page saves the chat after every reply; after one that Clear or Undo took back, that
    save is skipped (theirs, after `settle`, is the one that counts: this one could carry the
    withdrawn exchange and land last). The next reply saves again."""
    import gradio as gr

    req = Req("save-session")
    msg, hist = chat.submit(LONG_PROMPT, [], req)
    gen = chat.respond(hist, "ar", "", max_tokens=1000, request=req, **GREEDY)
    shown = next(gen)
    chat.clear_and_stop(req)                           # Clear mid-reply: the reply is withdrawn
    rest = list(gen)
    assert rest == [] and chat.settle(req) == []       # it shows nothing more; settle puts Clear's result
    assert isinstance(chat.save_reply(shown, req), type(gr.skip()))
    msg, hist = chat.submit("hello", [], req)          # a new reply is saved as usual
    done = list(chat.respond(hist, "ar", "", max_tokens=5, request=req, **GREEDY))[-1]
    assert chat.save_reply(done, req) == done


def test_closing_the_tab_forgets_a_reply_withdrawn_before_it_settled(host):
    """Clear keeps the withdrawn reply for `settle`; a tab closed first must not keep it for ever."""
    demo = build_app(host, runtime="test runtime")
    fns = list(demo.fns.values())
    chat = next(fn.fn.__self__ for fn in fns if getattr(fn.fn, "__name__", None) == "clear_and_stop")
    unload = next(fn.fn for fn in fns if any(t[1] == "unload" for t in fn.targets))   # as Gradio finds it
    req = Req("closed-tab")
    chat.submit("hello", [], req)                      # armed: the reply waits in the model queue
    chat.clear_and_stop(req)                           # Clear withdraws it; settle would answer
    assert "closed-tab:chat" in chat.settled
    unload(req)                                        # the tab closes instead
    assert "closed-tab:chat" not in chat.settled


def test_submit_guards_and_regenerate_undo_clear(chat):
    req = Req("s-guard")
    with pytest.raises(gr.Error, match="Type a message"):   # refused: the chain queues no reply
        chat.submit("   ", [], req)
    msg, hist = chat.submit("first", [], req)
    with pytest.raises(gr.Error, match="still being generated"):   # a reply is pending
        chat.submit("second", hist, req)
    done = list(chat.respond(hist, "mtp", "", max_tokens=12, request=req, **GREEDY))[-1]
    # regenerate: drop the reply (and its stats), reply again
    trimmed = chat.prepare_regenerate(done, req)
    assert trimmed == hist
    again = list(chat.respond(trimmed, "mtp", "", max_tokens=12, request=req, **GREEDY))[-1]
    assert reply_text(again) == reply_text(done)      # greedy: same reply
    # undo: the last exchange goes, its question returns to the input box
    h, text = chat.undo(again)
    assert h == [] and text == "first"
    assert chat.clear() == ([], "")


def test_validation_errors_are_clear(chat):
    with pytest.raises(gr.Error, match="top_p"):
        list(chat.respond(user("x"), "mtp", "", temperature=0.6, top_p=0.0, top_k=20, min_p=0.0,
                          max_tokens=10, seed=0, depth="1"))
    with pytest.raises(gr.Error, match="Draft depth"):
        list(chat.respond(user("x"), "mtp", "", max_tokens=10, **{**GREEDY, "depth": "17"}))
    with pytest.raises(gr.Error, match="Mode"):
        list(chat.respond(user("x"), "turbo", "", max_tokens=10, **GREEDY))
    assert not chat.stops.busy("local:chat")         # a refused request does not block the next
    # extremes work: one token, top_k 0, top_p 1, depth auto
    out = list(chat.respond(user("x"), "mtp", "", max_tokens=1, **{**GREEDY, "depth": "auto"}))[-1]
    assert "1 tokens" in out[-1]["metadata"]["title"]


def test_engine_error_is_shown_and_the_app_keeps_serving(host, monkeypatch, chat):
    def broken(*a, **k):
        raise RuntimeError("simulated device failure")

    with monkeypatch.context() as m:
        m.setattr(host, "fit", broken)
        out = list(chat.respond(user("x"), "mtp", "", max_tokens=10, **GREEDY))[-1]
    assert "simulated device failure" in text_of(out[-1]["content"]) and "error" in out[-1]["metadata"]["title"]
    ok = list(chat.respond(user("x"), "mtp", "", max_tokens=5, **GREEDY))[-1]
    assert "tok/s" in ok[-1]["metadata"]["title"]


def test_race_fills_both_lanes_with_stats_and_colours(host):
    race = RaceHandlers(host, StopRegistry(), update_interval=0.02)
    outs = list(race.race("Tell me about nouns", 2, 0.6, 0.95, 20, 0.0, 48, 0, "1"))
    assert len(outs) >= 3
    ar_html, mtp_html, stats_html, chart, summary = outs[-1]
    assert 'data-state="done"' in ar_html and 'data-state="done"' in mtp_html
    assert "tok-" in mtp_html and "race-legend" in mtp_html          # coloured by origin + legend
    assert summary["finished"] and len(summary["runs"]) == 2
    for run in summary["runs"]:
        assert run["ar"]["tokens"] > 1 and run["mtp"]["tokens"] > 1
        assert run["speedup"] == pytest.approx(run["mtp"]["tokens_per_second"] / run["ar"]["tokens_per_second"])
        assert 0 <= run["mtp"]["acceptance_rate"] <= 1 and run["mtp"]["tokens_per_cycle"] > 0
        assert run["mtp"]["depth"] == 1 and run["ar"]["time_to_first_token"] > 0
    assert [r["seed"] for r in summary["runs"]] == [0, 1]
    assert summary["median_speedup"] > 0 and "Median speedup over 2/2 runs" in stats_html
    assert chart.count("<path") == 2


def test_race_shows_equal_compute_time_on_both_lanes(host):
    """At every update both running lanes are shown at the same own-clock time."""
    race = RaceHandlers(host, StopRegistry(), update_interval=0.0)
    for ar_html, mtp_html, stats_html, chart, summary in race.race(LONG_PROMPT, 1, 0.0, 1.0, 0, 0.0, 120, 0, "2"):
        if summary.get("finished") or not summary["ar"]["tokens"]:
            continue
        a, m = summary["ar"], summary["mtp"]
        if a["finish_reason"] is None and m["finish_reason"] is None:
            assert a["own_seconds"] == pytest.approx(m["own_seconds"], abs=1e-12)


def test_race_stop_and_validation(host):
    race = RaceHandlers(host, StopRegistry(), update_interval=0.0)
    gen = race.race(LONG_PROMPT, 3, 0.0, 1.0, 0, 0.0, 1000, 0, "1")
    next(gen)
    race.stop(None)
    last = list(gen)[-1]
    assert last[4]["runs"] == [] and "stopped" in (last[4]["ar"]["finish_reason"] or "") + (last[4]["mtp"]["finish_reason"] or "")
    with pytest.raises(gr.Error, match="Repeats"):
        list(race.race("x", 0, 0.6, 0.95, 20, 0.0, 10, 0, "1"))
    with pytest.raises(gr.Error, match="prompt"):
        list(race.race("  ", 1, 0.6, 0.95, 20, 0.0, 10, 0, "1"))
    assert not race.stops.busy("local:race")


def test_streams_survive_hopping_between_threads(chat):
    """Gradio runs each next() of a streaming event on whichever worker thread is free (and
    those threads come and go). MLX streams are per thread, so the raw engine generator
    fails there ("There is no Stream(cpu, N) in current thread"); the app's model thread
    must make this work."""
    gen = chat.respond(user(LONG_PROMPT), "mtp", "", max_tokens=120, **GREEDY)
    outs, errors = [], []

    def step():
        try:
            outs.append(next(gen))
        except StopIteration:
            outs.append(None)
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    while not errors and (not outs or outs[-1] is not None):
        t = threading.Thread(target=step)   # a fresh thread for every step
        t.start()
        t.join()
    assert not errors, errors
    assert "tok/s" in outs[-2][-1]["metadata"]["title"]


def test_race_lanes_start_from_the_same_cached_prompt_state(host):
    race = RaceHandlers(host, StopRegistry(), update_interval=0.0)
    prompt = "Compare the two lanes on this prompt, please. " * 8
    *_, (ar_html, mtp_html, stats_html, chart, summary) = race.race(prompt, 2, 0.0, 1.0, 0, 0.0, 20, 0, "2")
    assert summary["cached_tokens"] == summary["prompt_tokens"] - 1 > 0
    assert "same cached prompt state" in summary["start_state"] and "same cached prompt state" in stats_html
    for run in summary["runs"]:   # each lane prefilled only the prompt's last token
        assert run["ar"]["prefilled_tokens"] == run["mtp"]["prefilled_tokens"] == 1


def test_race_prompt_too_long_for_the_context_is_refused(host):
    race = RaceHandlers(host, StopRegistry(), update_interval=0.0)
    with pytest.raises(gr.Error, match="context"):
        list(race.race("word " * 3000, 1, 0.0, 1.0, 0, 0.0, 2000, 0, "1"))
    assert not race.stops.busy("local:race")


def test_the_next_turn_reuses_the_reply_through_the_prefix_cache(host, chat):
    from core import history_prompt

    first = list(chat.respond(user("Tell me about the sea"), "mtp", "", max_tokens=30, **GREEDY))[-1]
    assert host.histories.wait(30)    # the reply's snapshot, taken in idle time after its grace
    history = first + [{"role": "user", "content": [{"type": "text", "text": "And the moon?"}]}]
    second = list(chat.respond(history, "mtp", "", max_tokens=5, **GREEDY))[-1]
    details = text_of(second[-1]["content"])
    said = [m for m in first if not is_stats(m)]
    reused = len(history_prompt(host.adapter, [{"role": m["role"], "content": text_of(m["content"])} for m in said]).ids)
    assert f"{reused} from the prefix cache" in details, details
