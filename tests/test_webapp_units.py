"""Web app parts that need no model: the fair race scheduler, sampler validation, stop
registry, history handling, rendering, LAN addresses, CLI parsing."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from webapp.serving.ar_reference import ArReferences, Reference
from webapp.ui.chat import assistant, block, clean_history, prompt_messages, text_of
from webapp.netinfo import lan_addresses, lan_urls
from webapp.serving.params import AUTO, ParamError, depth_choices, parse_params
from webapp.ui.render import LaneView, chart_svg, lane_html, legend_html, median, race_stats_html, reply_stats
from webapp.serving.scheduler import TimedLane, run_fair, shared_time
from webapp.serving.stops import StopRegistry


# --- the scheduler ----------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t


@dataclass
class Ev:
    n: int
    finished: bool = False


def synthetic(clock: FakeClock, step_cost: float, n_events: int, log: list):
    """A lane whose every step costs `step_cost` seconds of (fake) compute."""
    try:
        for i in range(n_events):
            clock.t += step_cost
            yield Ev(i, finished=(i == n_events - 1))
    finally:
        log.append("closed")


def test_scheduler_equal_compute_at_every_update_with_unequal_lanes():
    clock, log = FakeClock(), []
    fast = TimedLane("fast", synthetic(clock, 0.002, 400, log), timer=clock.now)
    slow = TimedLane("slow", synthetic(clock, 0.005, 100, log), timer=clock.now)
    snaps = []
    wall = iter(range(10**6))   # a fake wall clock: one tick per step -> a snapshot every 3 steps
    for snap in run_fair([fast, slow], update_interval=3, wall=lambda: next(wall)):
        lanes = snap.lanes
        running = [l for l in lanes if not l.done]
        if running:
            assert snap.t == min(l.clock for l in running)
        for l in lanes:
            assert all(c <= snap.t + 1e-12 for c, _ in l.events if _ in l.events_until(snap.t))
            shown = snap.clock(lanes.index(l))
            assert shown <= snap.t + 1e-12
        if not snap.final and all(not l.done for l in lanes):
            # both have had the same compute time on screen; the one ahead by less than a step
            assert snap.clock(0) == pytest.approx(snap.clock(1))
            assert abs(fast.clock - slow.clock) <= 0.005 + 1e-9
        snaps.append((snap.t, len(snap.view(0)), len(snap.view(1))))
    assert len(snaps) > 20
    # at equal compute time, the fast lane shows ~2.5x the events of the slow one
    t, n_fast, n_slow = snaps[len(snaps) // 2]
    assert n_fast == pytest.approx(2.5 * n_slow, rel=0.1)
    assert fast.clock == pytest.approx(0.8) and slow.clock == pytest.approx(0.5)
    assert fast.done and slow.done and snaps[-1][1:] == (400, 100)


def test_scheduler_charges_each_lane_only_its_own_time():
    """Time spent by the consumer (rendering) and by the other lane is not charged to a lane.
    One clock for everything, advanced by the lanes' work and by the consumer's rendering, so the
    charge is exact (a wall clock on a loaded 2-core machine made this a timing test)."""
    clock, worked = FakeClock(), {"a": 0.0, "b": 0.0}
    gaps = []

    def worker(name, step, n):
        for i in range(n):
            clock.t += step
            worked[name] += step
            if min(worked.values()) < 0.06 - 1e-9:   # both still running
                gaps.append(abs(worked["a"] - worked["b"]))
            yield Ev(i, finished=(i == n - 1))

    a = TimedLane("a", worker("a", 0.002, 30), timer=clock.now)
    b = TimedLane("b", worker("b", 0.006, 10), timer=clock.now)
    for _ in run_fair([a, b], update_interval=0.0, wall=clock.now):
        clock.t += 0.05   # slow rendering outside the lanes
    # each lane worked 0.06 s; the consumer rendered for over 1 s between updates
    assert a.clock == pytest.approx(0.06) and b.clock == pytest.approx(0.06)
    # interleaved: the lane behind always went next, so neither got more than one step ahead
    assert gaps and max(gaps) <= 0.006 + 1e-9


def test_scheduler_stop_and_close_end_the_lanes():
    clock, log = FakeClock(), []
    stop = threading.Event()
    lanes = [TimedLane("x", synthetic(clock, 0.001, 10**6, log), timer=clock.now),
             TimedLane("y", synthetic(clock, 0.001, 10**6, log), timer=clock.now)]
    ticks = iter(range(10**6))
    for i, snap in enumerate(run_fair(lanes, update_interval=1, wall=lambda: next(ticks), stop=stop)):
        if i == 5:
            stop.set()
    assert snap.final and log == ["closed", "closed"]
    # closing the scheduler generator early closes the lane streams too
    log2 = []
    lanes = [TimedLane("x", synthetic(clock, 0.001, 10**6, log2), timer=clock.now)]
    gen = run_fair(lanes, update_interval=1, wall=lambda: next(ticks))
    next(gen)
    gen.close()
    assert log2 == ["closed"]


def test_scheduler_failing_lane_is_reported_not_raised():
    def boom():
        yield Ev(0)
        raise RuntimeError("lane failed")

    clock, log = FakeClock(), []
    ok = TimedLane("ok", synthetic(clock, 0.001, 5, log), timer=clock.now)
    bad = TimedLane("bad", boom(), timer=clock.now)
    list(run_fair([ok, bad], update_interval=0))
    assert ok.done and bad.done and isinstance(bad.error, RuntimeError)
    assert shared_time([ok, bad]) == max(ok.clock, bad.clock)


# --- sampler panel validation --------------------------------------------------------------
def P(**kw):
    base = dict(temperature=0.6, top_p=0.95, top_k=20, min_p=0.0, max_tokens=64, seed=0, depth="1")
    base.update(kw)
    return parse_params(**base, max_depth=4)


def test_params_extremes_are_accepted():
    p = P(temperature=0, top_p=1, top_k=0, min_p=0, max_tokens=1, seed=0, depth=AUTO)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.depth) == (0.0, 1.0, 0, 1, "auto")
    assert P(depth="4").depth == 4 and P(depth=2.0).depth == 2 and P(seed=7.0).seed == 7
    assert P(top_k=200.0).top_k == 200
    assert depth_choices(3) == ["1", "2", "3", "auto"]


@pytest.mark.parametrize("kw, words", [
    (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "whole number"), (dict(temperature=float("nan")), "finite"),
    (dict(temperature=-0.1), "Temperature"), (dict(temperature=9), "Temperature"),
    (dict(min_p=1.0), "min_p"), (dict(max_tokens=0), "Max tokens"), (dict(max_tokens=None), "missing"),
    (dict(seed="abc"), "Seed"), (dict(seed=-1), "Seed"), (dict(depth="9"), "depth"),
    (dict(depth="deep"), "depth"), (dict(depth=0), "depth"),
])
def test_params_nonsense_is_refused_with_a_message(kw, words):
    with pytest.raises(ParamError, match=words):
        P(**kw)


# --- stop registry ----------------------------------------------------------------------
def test_stop_registry_arm_claim_stop_release():
    r = StopRegistry()
    ev = r.arm("s1:chat")
    assert r.busy("s1:chat") and not r.busy("s1:race")
    assert r.stop("s1:chat") and ev.is_set()           # stopped while queued
    assert r.claim("s1:chat") is ev                     # the queued request sees it at start
    r.release("s1:chat", ev)
    assert not r.busy("s1:chat") and not r.stop("s1:chat")   # stop after the end: no-op
    api = r.claim("s1:chat")                            # no armed step (API client): fresh event
    assert not api.is_set()
    again = r.claim("s1:chat")                          # a second request never reuses a claimed one
    assert again is not api
    race = r.arm("s1:race")
    assert r.stop_session("s1") == 2 and race.is_set() and again.is_set()
    assert not r.arm("s2:chat").is_set()


def test_stop_registry_tab_closed_while_queued_leaves_nothing():
    # the page's queue drops a closed tab's waiting replies, so their armed entries never get a release
    r = StopRegistry()
    chat, race = r.arm("s1:chat"), r.arm("s1:race")
    other = r.arm("s2:chat")
    assert r.stop_session("s1") == 2 and chat.is_set() and race.is_set()
    assert not r.busy("s1:chat") and not r.busy("s1:race")
    assert not any(k.startswith("s1:") for k in r._current)
    assert r.busy("s2:chat") and not other.is_set()     # another tab's queued reply is untouched
    # the page's queue drops the closed tab's events a little after the unload: one that started
    # in between starts stopped, not running for nobody
    assert r.claim("s1:chat").is_set() and not r.claim("s2:chat").is_set()


def test_stop_registry_tab_closed_while_running_still_releases():
    r = StopRegistry()
    r.arm("s1:chat")
    running = r.claim("s1:chat")
    assert r.stop_session("s1") == 1 and running.is_set()
    assert r.holds("s1:chat", running)                  # the running reply still owns its entry...
    r.release("s1:chat", running)                       # ...until its generator ends
    assert not r.busy("s1:chat")
    newer = r.arm("s1:chat")                            # a late release of an old reply
    r.release("s1:chat", running)                       # never removes a newer one
    assert r.holds("s1:chat", newer)


# --- history handling ----------------------------------------------------------------------
def test_history_is_cleaned_to_text_and_stats_never_reach_the_prompt():
    hist = [
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "hello"},
        assistant("MTP · 3 tokens", title="📊 stats"),
        {"role": "user", "content": [{"type": "file", "file": {"path": "/etc/passwd"}}]},
        {"role": "tool", "content": "x"},
        "garbage",
    ]
    clean = clean_history(hist)
    assert [m["role"] for m in clean] == ["user", "assistant", "assistant", "user"]
    assert all(set(b) == {"type", "text"} for m in clean for b in m["content"])
    assert "passwd" not in repr(clean)
    msgs = prompt_messages(clean, "  Be brief.  ")
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert [m["content"] for m in msgs[1:]] == ["hi there", "hello", ""]
    assert text_of(block("a\n    indented")) == "a\n    indented"


# --- rendering ---------------------------------------------------------------------------------
def test_lane_html_escapes_and_colours_by_origin():
    v = LaneView(key="mtp", title="MTP", segments=[("<script>", "target"), ("ok", "draft"), (" x", "correction"),
                                                     ("!", "bonus")], tokens=4, clock=0.5, ttft=0.01,
                 tokens_per_second=12.0, acceptance=0.5)
    h = lane_html(v, coloured=True, legend=True)
    assert "<script>" not in h and "&lt;script&gt;" in h
    for cls in ("tok-draft", "tok-correction", "tok-bonus", "race-legend"):
        assert cls in h
    assert 'data-lane="mtp"' in h and "acceptance 50%" in h
    assert "tok-draft" not in lane_html(LaneView(key="ar", title="AR", segments=[("ok", "draft")]))
    assert legend_html().count("swatch") == 4


def test_stats_chart_and_reply_stats():
    ar = LaneView(key="ar", title="AR", tokens=10, tokens_per_second=10.0, points=[(0.1, 1), (1.0, 10)])
    mtp = LaneView(key="mtp", title="MTP", tokens=15, tokens_per_second=15.0, acceptance=0.8,
                   acceptance_per_depth=[0.8], tokens_per_cycle=1.8, depth=1, points=[(0.1, 1), (1.0, 15)])
    h = race_stats_html(ar, mtp, 1.5, runs=[1.4, 1.5, 1.7], repeats=3)
    assert "<th>AR</th><th>MTP</th>" in h
    assert "1.50×" in h and 'data-median="1.5000"' in h and "80%" in h and "Median speedup over 3/3" in h
    svg = chart_svg([("AR", "#000", ar.points), ("MTP", "#0f0", mtp.points)])
    assert svg.count("<path") == 2 and "own compute time" in svg
    assert chart_svg([]).count("<path") == 0
    assert median([3, 1, 2]) == 2 and median([1, 2, 3, 4]) == 2.5
    title, details = reply_stats({"generated_tokens": 40, "tokens_per_second": 30.0, "time_to_first_token": 0.05,
                                  "proposed": 10, "accepted": 8, "acceptance_rate": 0.8, "tokens_per_cycle": 1.8,
                                  "finish_reason": "eos", "mtp_active": False, "depth": 1}, "mtp",
                                 Reference(20.0, 3, "up to ~128 tokens"), depth=1)
    assert "30.0 tok/s" in title and "TTFT 50 ms" in title and "80%" in title and "1.50×" in title
    assert "priced out" not in title      # mtp_active only matters for depth 'auto'
    title, _ = reply_stats({"generated_tokens": 5, "tokens_per_second": 9.0, "mtp_active": False,
                            "finish_reason": "stopped"}, "mtp", None, depth="auto")
    assert "priced out" in title and "stopped" in title


# --- LAN addresses and the CLI's parsing -------------------------------------------------------
def test_lan_addresses_are_not_loopback():
    addrs = lan_addresses()
    assert all(not a.startswith("127.") and a != "0.0.0.0" for a in addrs)
    assert all(u.startswith("http://") and u.endswith(":7860") for u in lan_urls(7860))


def test_cli_parsing():
    from core.settings import get_settings
    from webapp.cli import build_parser, parse_auth, urls

    assert parse_auth("ann:s3:cret") == ("ann", "s3:cret") and parse_auth(None) is None
    for bad in ("nopass", ":x", "x:"):
        with pytest.raises(ValueError):
            parse_auth(bad)
    args = build_parser(get_settings()).parse_args(["--lan", "--port", "9999", "--depth", "auto"])
    assert args.lan and args.port == 9999 and args.depth == "auto" and args.host == "127.0.0.1"
    assert args.model.endswith("models/demo")
    local, lan = urls("0.0.0.0", 9999, True)
    assert local == "http://127.0.0.1:9999" and all(":9999" in u for u in lan)
    assert urls("127.0.0.1", 7860, False) == ("http://127.0.0.1:7860", [])


def test_scheduler_charges_queued_work_to_the_lane_that_left_it():
    """A lane that leaves work queued (like the AR lane's look-ahead step) is charged for it
    when the device switches to the other lane."""
    clock = FakeClock()

    class Lookahead:
        def __init__(self, n):
            self.it, self.pending = synthetic(clock, 0.002, n, []), 0.0

        def __next__(self):
            ev = next(self.it)
            self.pending = 0.003          # queued, finished later by whoever runs next
            return ev

        def settle(self):
            t, self.pending = self.pending, 0.0
            clock.t += t
            return t

    la = Lookahead(50)
    a = TimedLane("a", la, timer=clock.now)
    b = TimedLane("b", synthetic(clock, 0.005, 20, []), timer=clock.now)
    list(run_fair([a, b], update_interval=1, wall=lambda: 0))
    switches = a.clock - 50 * 0.002
    assert switches > 0.003 * 5                                   # it was charged, several times
    assert b.clock == pytest.approx(20 * 0.005)                   # and b never was
