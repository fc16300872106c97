"""The race tells the truth: its lanes decode exactly what each lane decodes alone, and its
figures are what the lanes cost (timings themselves live in scripts/bench/bench_race.py)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, PrefixCache, SamplerConfig, SpeculativeDecoder, chat_prompt
from core.stream import cache_prompt
from tests._engine_helpers import MIXED, make_mixed_head
from tests._webapp_helpers import LONG_PROMPT, make_host
from webapp.ui.chat import ChatHandlers
from webapp.ui.race import DEFAULT_REPEATS, RaceHandlers
from webapp.serving.scheduler import TimedLane, run_fair
from webapp.serving.stops import StopRegistry
from webapp.serving.ar_reference import ArReferences, Reference
from webapp.serving.params import parse_params
from webapp.ui.render import LaneView, race_stats_html, reply_stats

SAMPLED = SamplerConfig(temperature=0.8, top_p=0.95, top_k=20)


@pytest.fixture(scope="module")
def adapter(tiny_checkpoint):
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


def lanes(adapter, cache, seed):
    return [AutoregressiveDecoder(adapter, sampler=SAMPLED, seed=seed, prefix_cache=cache),
            SpeculativeDecoder(adapter, sampler=SAMPLED, seed=seed, depth=2, prefix_cache=cache)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_lanes_restored_from_one_snapshot_do_not_write_into_each_other(adapter, seed):
    """The race starts both lanes from one prefix-cache snapshot and steps them in turn. KVCache
    writes rebind its arrays in place, so lanes sharing the snapshot's array objects saw each
    other's keys: the interleaved lanes then decoded other tokens than each alone."""
    cache = PrefixCache(2**30)
    prompt = chat_prompt(adapter, [{"role": "user", "content": "Tell me about the sea and the moon."}])
    assert cache_prompt(adapter, prompt, cache) == len(prompt.ids) - 1
    alone = [[t for ev in lane.stream(prompt, max_tokens=40) for t in ev.tokens] for lane in lanes(adapter, cache, seed)]
    assert alone[0] != alone[1], "the lanes should differ (sampled), or sharing could not show"
    streams = [lane.stream(prompt, max_tokens=40) for lane in lanes(adapter, cache, seed)]
    raced, done = [[], []], [False, False]
    while not all(done):
        for i, s in enumerate(streams):
            if not done[i]:
                ev = next(s)
                raced[i] += ev.tokens
                done[i] = ev.finished
    assert raced == alone


# --- what the figures say: short replies, repeats, the chat's AR reference (no model) -----------
def user(text):
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def lane(key, tokens, tps):
    return LaneView(key=key, title=key, tokens=tokens, tokens_per_second=tps, finished=True, finish_reason="eos")


def test_a_race_of_short_replies_says_it_is_not_a_result():
    html = race_stats_html(lane("ar", 14, 68.0), lane("mtp", 15, 52.5), 52.5 / 68.0)
    assert 'data-short="1"' in html and "short-note" in html and "Not a result" in html
    assert "AR 14, MTP 15 tokens" in html
    long = race_stats_html(lane("ar", 120, 100.0), lane("mtp", 130, 140.0), 1.4)
    assert 'data-short="0"' in long and "short-note" not in long
    assert "One race is one sample" in long        # one race: its uncertainty is said
    running = replace(lane("mtp", 3, 50.0), finished=False)
    assert "short-note" not in race_stats_html(lane("ar", 2, 60.0), running, 0.8)   # not while it runs


def test_repeats_report_the_median_with_its_spread():
    html = race_stats_html(lane("ar", 120, 100.0), lane("mtp", 130, 120.0), 1.2, runs=[1.1, 1.4, 1.2], repeats=3)
    assert 'data-median="1.2000"' in html and 'data-min="1.1000"' in html and 'data-max="1.4000"' in html
    assert "spread 1.10–1.40×" in html and "One race is one sample" not in html
    some_short = race_stats_html(lane("ar", 120, 100.0), lane("mtp", 130, 120.0), 1.2, runs=[1.1, 1.4, 1.2],
                                 repeats=3, short_runs=2)
    assert "2 of 3 runs had a reply under 32 tokens" in some_short


def params(temperature=0.6, top_p=0.95, top_k=20):
    return parse_params(temperature, top_p, top_k, 0.0, 256, 0, "2", max_depth=4)


def test_the_ar_reference_is_kept_per_sampler_context_and_reply_length():
    refs = ArReferences()
    refs.note(params(), 30, 100.0, tokens=40)
    refs.note(params(), 30, 999.0, tokens=20)          # too short to be a reference
    refs.note(params(), 90, 110.0, tokens=63)          # same buckets (prompts up to ~128, replies 32-63 tokens)
    refs.note(params(), 60, 90.0, tokens=32)
    refs.note(params(), 60, 50.0, tokens=200)          # a longer reply: another bucket
    ref = refs.get(params(), 50, 48)
    assert ref.tokens_per_second == 100.0 and ref.decodes == 3 and "128" in ref.context and ref.reply == "32-63 tokens"
    long = refs.get(params(), 50, 255)
    assert long.tokens_per_second == 50.0 and long.decodes == 1 and long.reply == "128-255 tokens"
    assert refs.get(params(), 50, 64) is None                      # no AR reply of 64-127 tokens yet
    assert refs.get(params(temperature=0.0), 50, 48) is None       # greedy is another sampler
    assert refs.get(params(top_k=0), 50, 48) is None
    assert refs.get(params(), 600, 48) is None                      # a longer context is another bucket
    for tps in (1.0, 2.0, 3.0, 4.0, 5.0):                           # the median of the last few only
        refs.note(params(), 30, tps, tokens=40)
    assert refs.get(params(), 30, 40).tokens_per_second == 3.0


def test_the_chat_compares_like_with_like_and_says_so():
    ref = Reference(100.0, 2, "up to ~128 tokens", "64-127 tokens")
    long = {"generated_tokens": 64, "tokens_per_second": 130.0, "finish_reason": "eos", "proposed": 40}
    title, details = reply_stats(long, "mtp", ref)
    assert "≈1.30× vs AR (same sampler, context & length)" in title
    assert "median of the last 2 AR decodes" in details and "up to ~128 tokens" in details and "64-127 tokens" in details
    title, details = reply_stats({**long, "generated_tokens": 20}, "mtp", ref)
    assert "vs AR" not in title and "short reply" in title and "too short" in details
    title, details = reply_stats(long, "mtp", None)
    assert "vs AR" not in title and "no speed-up estimate" in details
    title, _ = reply_stats({**long, "finish_reason": "stopped"}, "mtp", ref)
    assert "vs AR" not in title


# --- the race and the chat on a real (tiny) model ------------------------------------------------
@pytest.fixture(scope="module")
def host(tiny_model_dir):
    return make_host(tiny_model_dir)


def test_the_race_repeats_by_default_and_reports_median_spread_and_short_runs(host):
    race = RaceHandlers(host, StopRegistry(), update_interval=0.0)
    *_, (_, _, stats_html, _, summary) = race.race("Tell me about nouns", None, 0.6, 0.95, 20, 0.0, 12, 0, "1")
    runs = summary["runs"]
    assert len(runs) == DEFAULT_REPEATS >= 3 and [r["seed"] for r in runs] == [0, 1, 2]
    speedups = sorted(r["speedup"] for r in runs)
    assert summary["median_speedup"] == speedups[1] and summary["speedup_spread"] == [speedups[0], speedups[-1]]
    assert all(r["short"] for r in runs) and summary["short_runs"] == 3          # 12 tokens: short
    assert 'data-short="1"' in stats_html and "3 of 3 runs had a reply under 32 tokens" in stats_html
    for r in runs:   # the clock's parts are in the raw figures
        for name in ("ar", "mtp"):
            assert r[name]["switches"] >= 0 and 0 <= r[name]["settle_seconds"] < r[name]["own_seconds"]
    assert sum(r["mtp"]["switches"] + r["ar"]["switches"] for r in runs) >= 3
    *_, (_, _, stats_html, _, summary) = race.race(LONG_PROMPT, 1, 0.0, 1.0, 0, 0.0, 40, 0, "1")
    assert not summary["runs"][0]["short"] and 'data-short="0"' in stats_html and "One race is one sample" in stats_html


def test_the_chat_estimate_waits_for_an_ar_reference_at_its_own_sampler_and_reply_length(host):
    chat = ChatHandlers(host, StopRegistry(), update_interval=0.02)
    greedy = dict(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=0, depth="1", max_tokens=40)
    title = lambda mode, **kw: list(chat.respond(user(LONG_PROMPT), mode, "", **{**greedy, **kw}))[-1][-1]["metadata"]["title"]  # noqa: E731
    host.ar_references = ArReferences()
    assert "vs AR" not in title("mtp")                  # no AR decode at this sampler yet
    assert "40 tokens" in title("ar")
    assert "vs AR (same sampler, context & length)" in title("mtp")
    assert "vs AR" not in title("mtp", temperature=0.6, top_p=0.95, top_k=20)   # another sampler
    assert "vs AR" not in title("mtp", max_tokens=70)    # 70 tokens: no AR reply of 64-127 tokens yet
    assert "70 tokens" in title("ar", max_tokens=70) and "vs AR (same sampler" in title("mtp", max_tokens=70)
    assert "short reply" in title("mtp", max_tokens=8) and "vs AR" not in title("mtp", max_tokens=8)


# --- the scheduler's switch quantum (fake clocks) -------------------------------------------------
def test_a_switch_quantum_switches_less_and_shows_the_same_time_on_both_lanes():
    class Clock:
        t = 0.0

    def lane(name, cost, n):
        clock = Clock

        def events():
            for i in range(n):
                clock.t += cost
                yield SimpleNamespace(finished=i == n - 1)

        return TimedLane(name, events(), timer=lambda: clock.t)

    switches = {}
    for quantum in (0.0, 0.010):
        Clock.t = 0.0
        lanes = [lane("ar", 0.002, 200), lane("mtp", 0.003, 100)]
        ticks = iter(range(10**6))
        for snap in run_fair(lanes, update_interval=5, wall=lambda: next(ticks), quantum=quantum):
            running = [l.clock for l in lanes if not l.done]
            if running and not snap.final:
                assert snap.t == min(running)
                for i, l in enumerate(lanes):   # shown: only what each lane had committed by the shared time
                    assert all(c <= snap.t for c, _ in l.events[: len(snap.view(i))])
                    assert snap.clock(i) <= snap.t
                assert max(l.clock for l in lanes) - snap.t < quantum + 0.003 + 1e-9
        assert [l.clock for l in lanes] == pytest.approx([0.4, 0.3]) and all(l.done for l in lanes)
        switches[quantum] = sum(l.switches for l in lanes)
    assert switches[0.0] > 100 and switches[0.010] < switches[0.0] / 4


# --- scripts/bench/bench_race.py's method (no timings asserted: they live in its JSON) -------------------
def test_bench_race_interleaves_the_three_ways_as_a_palindrome_and_pools_to_its_token_budget(host, monkeypatch):
    from scripts.bench import bench_race

    order = []
    for name in ("run_race", "run_alone", "run_bench"):
        real = getattr(bench_race, name)
        monkeypatch.setattr(bench_race, name, lambda *a, _real=real, _name=name, **k: (
            order.append(_name[4:] + ("" if _name == "run_race" else ":" + a[1])), _real(*a, **k))[1])
    race = RaceHandlers(host, StopRegistry())
    params = parse_params(0.6, 0.95, 20, 0.0, 6, 0, "2", max_depth=host.max_depth)
    ids = host.prompt_ids([{"role": "user", "content": "Tell me about nouns"}], max_tokens=6)
    rep = bench_race.measure_repeat(host, race, "Tell me about nouns", ids, list(ids.ids), params,
                                    min_tokens=15, max_rounds=5)
    one = ["race", "alone:ar", "alone:mtp", "bench:ar", "bench:mtp"]
    # 6 tokens a reply (5 after the first): 15 per lane take two palindromes of two races each
    assert rep["palindromes"] == 2 and order == (one + one[::-1]) * 2
    assert rep["tokens"] == {"ar": 6, "mtp": 6}
    for way in ("alone", "bench"):
        for m in ("ar", "mtp"):
            runs = rep["runs"][way][m]
            assert len(runs) == 4
            assert rep["tok_s"][way][m] == pytest.approx(sum(r["tokens"] - 1 for r in runs) / sum(
                (r["tokens"] - 1) / r["tokens_per_second"] for r in runs))
    assert rep["race_vs_bench"] == pytest.approx(rep["speedup"]["race"] / rep["speedup"]["bench"])
    # the race's lanes decode what each decodes alone (same seed, same prompt state)
    assert [r["ar"]["tokens"] for r in rep["runs"]["race"]] == [r["tokens"] for r in rep["runs"]["alone"]["ar"]]
