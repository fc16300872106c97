"""Race tab: AR (left) vs MTP (right) on one device, time-shared fairly (see scheduler.py).

Per lane, on its own clock: tokens, decode tok/s, time to first token; for MTP also
acceptance, tokens per cycle and depth; the MTP tokens are coloured by origin. The
speedup is MTP tok/s over AR tok/s, both on their own clocks; with repeats, the median.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Optional, Tuple

import gradio as gr

from .chat import session_of
from ..serving.inputs import clean_text
from ..serving.model import ModelHost
from ..serving.params import ParamError, parse_params
from .pictures import read as read_picture
from .refusals import refusal
from .render import LANE_COLORS, LaneView, chart_svg, empty_lane_html, lane_html, median, race_stats_html
from ..serving.ar_reference import SHORT_REPLY_TOKENS
from ..serving.scheduler import Snapshot, TimedLane, run_fair
from ..serving.stops import StopRegistry

UPDATE_INTERVAL = 0.1
MAX_REPEATS = 20
# One race is one sample: on the demo, single races of one prompt ranged 0.77-1.41x. Three
# (seeds s, s+1, s+2) give a median and a spread for one click.
DEFAULT_REPEATS = 3
# Own-clock seconds a lane may run ahead before the device switches lanes (see scheduler.run_fair;
# what is shown is the same: both lanes at the shared time). Measured in scripts/bench/bench_race.py.
SWITCH_QUANTUM = 0.0


@dataclass
class Rec:
    """What the race keeps of one stream event (copied off the lane's clock)."""

    tokens: List[int]
    origins: List[str]
    text: str
    finished: bool
    finish_reason: Optional[str]
    stats: Dict[str, Any]


def record(ev) -> Rec:
    return Rec(list(ev.tokens), list(ev.origins), ev.text, bool(ev.finished), ev.finish_reason,
               ev.stats.as_dict())


class Segmenter:
    """Per-token text of a lane, for colouring: a streaming detokenizer fed token by token
    (a token that ends inside a multi-byte character shows up with the next one)."""

    def __init__(self, tokenizer):
        self.detok = tokenizer.detokenizer
        self.detok.reset()
        self.segments: List[Tuple[str, Optional[str]]] = []
        self.done = 0

    def feed(self, recs: List[Rec]) -> List[Tuple[str, Optional[str]]]:
        for rec in recs[self.done:]:
            for tok, origin in zip(rec.tokens, rec.origins):
                self.detok.add_token(tok)
                self.segments.append((self.detok.last_segment, origin))
            if rec.finished:
                self.detok.finalize()
                tail = self.detok.last_segment
                if tail:
                    self.segments.append((tail, rec.origins[-1] if rec.origins else None))
        self.done = len(recs)
        return self.segments


def shown_depth(requested, last):
    """Fixed depth as asked; 'auto' with the depth its last cycle used (0 = plain AR step)."""
    return requested if requested != "auto" else f"auto (now {last if last is not None else '–'})"


def lane_view(key: str, title: str, lane: TimedLane, snap: Snapshot, segments, depth=1) -> LaneView:
    recs = [r for (c, r) in lane.events if c <= snap.t]
    times = [c for (c, r) in lane.events if c <= snap.t]
    v = LaneView(key=key, title=title, segments=list(segments), clock=min(lane.clock, snap.t))
    n, points = 0, []
    for c, r in zip(times, recs):
        n += len(r.tokens)
        points.append((c, n))
    v.tokens, v.points = n, points
    if recs:
        first = next((i for i, r in enumerate(recs) if r.tokens), None)
        if first is not None:
            v.ttft = times[first]
            after = n - sum(len(r.tokens) for r in recs[: first + 1])
            span = (times[-1] if recs[-1].finished else v.clock) - times[first]
            v.tokens_per_second = after / span if span > 0 and after > 0 else 0.0
        last = recs[-1]
        v.finished, v.finish_reason = last.finished, last.finish_reason
        v.prefilled_tokens = last.stats.get("prefilled_tokens")
        if last.finished:
            v.waterfall, v.wall = last.stats.get("waterfall") or {}, last.stats.get("compute_seconds") or 0.0
        if key == "mtp":
            s = last.stats
            v.acceptance = s.get("acceptance_rate")
            v.acceptance_per_depth = s.get("acceptance_per_depth")
            v.tokens_per_cycle = s.get("tokens_per_cycle")
            v.depth = shown_depth(depth, s.get("depth"))
            # mtp_active is meaningful only for 'auto' (the cost model may price MTP out)
            v.mtp_active = s.get("mtp_active") if depth == "auto" else True
    if snap.stopped and not v.finished:
        v.finished, v.finish_reason = True, "stopped"
    if lane.error is not None and (lane.done and lane.clock <= snap.t):
        v.error = f"{type(lane.error).__name__}: {lane.error}"
    return v


def lane_summary(v: LaneView, lane: Optional[TimedLane] = None) -> Dict[str, Any]:
    d = {"tokens": v.tokens, "tokens_per_second": v.tokens_per_second, "time_to_first_token": v.ttft,
         "own_seconds": v.clock, "finish_reason": v.finish_reason, "prefilled_tokens": v.prefilled_tokens}
    if lane is not None:   # of the own clock: device work left queued, waited for when the device switched lanes
        d.update(settle_seconds=lane.settled, switches=lane.switches)
    if v.key == "mtp":
        d.update(acceptance_rate=v.acceptance, acceptance_per_depth=v.acceptance_per_depth,
                 tokens_per_cycle=v.tokens_per_cycle, depth=v.depth, mtp_active=v.mtp_active)
    return d


class RaceHandlers:
    def __init__(self, host: ModelHost, stops: StopRegistry, update_interval: float = UPDATE_INTERVAL,
                 quantum: float = SWITCH_QUANTUM):
        self.host = host
        self.stops = stops
        self.update_interval = update_interval
        self.quantum = quantum

    def key(self, request) -> str:
        return f"{session_of(request)}:race"

    def arm(self, request: gr.Request = None):
        """Un-queued first step of Start: arm Stop, and disable Start until the race ends."""
        self.stops.arm(self.key(request))
        return gr.update(interactive=False)

    def stop(self, request: gr.Request = None) -> None:
        self.stops.stop(self.key(request))

    def titles(self, depth) -> Tuple[str, str]:
        return "AR (plain decoding)", f"MTP (speculative, depth {depth})"

    def race(self, prompt, repeats, temperature, top_p, top_k, min_p, max_tokens, seed, depth, image=None,
             request: gr.Request = None) -> Iterator[tuple]:
        """Yields (AR lane html, MTP lane html, stats html, chart html, summary dict). `image`: the
        path of a picture the page uploaded, the same one in both lanes' prompt."""
        prompt = clean_text(prompt)
        key = self.key(request)
        stop = self.stops.claim(key)
        lanes: List[TimedLane] = []
        try:
            params, n_runs = self._validate(prompt, repeats, temperature, top_p, top_k, min_p,
                                            max_tokens, seed, depth)
            from core import ContextError

            from core.images import ImageError

            try:
                content = str(prompt)
                if image:   # webapp/ui/pictures.py reads only what this page uploaded
                    content = [{"type": "image", "picture": read_picture(image, self.host.settings.image_max_bytes)},
                               {"type": "text", "text": content}]
                ids = self.host.prompt_ids([{"role": "user", "content": content}], max_tokens=params.max_tokens)
            except ContextError as exc:
                raise refusal(str(exc), "Prompt too long", where="/race") from None
            except ImageError as exc:
                raise refusal(exc.sentence(), "Picture refused", where="/race") from None
            # Both lanes start from one cached state of the prompt (all but its last token),
            # made here off both clocks: neither lane's first token pays for the other's prefill.
            from core.stream import PrefillStopped

            try:
                cached = self.host.cache_prompt(ids, stop)
            except PrefillStopped:   # Stop during the shared prefill: no race to show
                yield self.reset(params.depth)
                return
            yield from self._races(ids, params, n_runs, stop, lanes, cached)
        finally:
            for lane in lanes:
                lane.close()
            self.stops.release(key, stop)

    def _validate(self, prompt, repeats, temperature, top_p, top_k, min_p, max_tokens, seed, depth):
        try:
            params = parse_params(temperature, top_p, top_k, min_p, max_tokens, seed, depth,
                                  max_depth=self.host.max_depth)
        except ParamError as exc:
            raise refusal(str(exc), "Invalid setting", where="/race") from None
        try:
            n_runs = int(float(repeats if repeats not in (None, "") else DEFAULT_REPEATS))
        except (TypeError, ValueError):
            raise refusal(f"Repeats must be a whole number 1..{MAX_REPEATS}.", "Invalid setting", where="/race") from None
        if not 1 <= n_runs <= MAX_REPEATS:
            raise refusal(f"Repeats must be between 1 and {MAX_REPEATS}, got {n_runs}.", "Invalid setting", where="/race")
        if not prompt or not str(prompt).strip():
            raise refusal("Type a prompt for the race first.", "Nothing to race", where="/race")
        return params, n_runs

    def _races(self, ids, params, n_runs, stop, lanes: List[TimedLane], cached: int = 0) -> Iterator[tuple]:
        t_ar, t_mtp = self.titles(params.depth)
        runs: List[float] = []
        short_runs = 0
        start_state = (f"both lanes start from the same cached prompt state: {cached} of {len(ids)} prompt tokens "
                       "from the prefix cache, the last one prefilled by each lane" if cached else
                       f"both lanes prefill the whole prompt ({len(ids)} tokens) from an empty cache")
        summary: Dict[str, Any] = {"params": params.as_dict(), "prompt_tokens": len(ids), "runs": [],
                                   "cached_tokens": cached, "start_state": start_state,
                                   "short_reply_tokens": SHORT_REPLY_TOKENS}
        for run in range(n_runs):
            if stop.is_set():
                break
            for lane in lanes:
                lane.close()
            # Both lanes share a seed; repeat r uses seed + r, so at temperature > 0 the median
            # covers N different samples (the same seeds scripts/bench/bench.py uses per repeat).
            run_params = replace(params, seed=params.seed + run)
            lanes[:] = [
                TimedLane("ar", self.host.stream("ar", run_params, ids, stop=stop, source="race"), record=record),
                TimedLane("mtp", self.host.stream("mtp", run_params, ids, stop=stop, source="race"), record=record),
            ]
            segs = [Segmenter(self.host.tokenizer), Segmenter(self.host.tokenizer)]
            note = (f"run {run + 1}/{n_runs}, seed {run_params.seed}; " if n_runs > 1 else "") + start_state
            # The lane listed first goes first at a tie (the very first step, after an idle
            # pause with cold caches): alternate it between runs.
            order = lanes if run % 2 == 0 else lanes[::-1]
            for snap in run_fair(order, self.update_interval, stop=stop, quantum=self.quantum):
                ar = lane_view("ar", t_ar, lanes[0], snap, segs[0].feed(lanes[0].events_until(snap.t)))
                mtp = lane_view("mtp", t_mtp, lanes[1], snap, segs[1].feed(lanes[1].events_until(snap.t)),
                                depth=params.depth)
                speed = mtp.tokens_per_second / ar.tokens_per_second if ar.tokens_per_second > 0 else None
                if (snap.final and speed is not None and ar.finished and mtp.finished
                        and "stopped" not in (ar.finish_reason, mtp.finish_reason)):
                    short = min(ar.tokens, mtp.tokens) < SHORT_REPLY_TOKENS
                    runs.append(speed)
                    short_runs += short
                    summary["runs"].append({"seed": run_params.seed, "ar": lane_summary(ar, lanes[0]),
                                            "mtp": lane_summary(mtp, lanes[1]), "speedup": speed, "short": short})
                    self.host.note_ar_speed(run_params, len(ids), ar.tokens_per_second, ar.tokens)
                if runs:
                    summary.update(median_speedup=median(runs), speedup_spread=[min(runs), max(runs)],
                                   short_runs=short_runs)
                summary["speedup"] = speed
                summary["ar"], summary["mtp"] = lane_summary(ar, lanes[0]), lane_summary(mtp, lanes[1])
                summary["finished"] = bool(snap.final and run == n_runs - 1)
                # Ctrl+C / SIGTERM on the server (webapp/server.py): say so, not just "stopped"
                shown = f"{self.stops.closing} {note}" if self.stops.closing else note
                yield (
                    lane_html(ar),
                    lane_html(mtp, coloured=True, legend=True),
                    race_stats_html(ar, mtp, speed, runs, n_runs, shown, short_runs),
                    chart_svg([("AR", LANE_COLORS["ar"], ar.points), ("MTP", LANE_COLORS["mtp"], mtp.points)]),
                    dict(summary),
                )

    def reset(self, depth=1):
        t_ar, t_mtp = self.titles(depth)
        return (empty_lane_html("ar", t_ar), empty_lane_html("mtp", t_mtp, legend=True), "", chart_svg([]), {})
