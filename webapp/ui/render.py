"""Pure rendering: race lanes (HTML with tokens coloured by origin), race stats, the
tokens-over-time chart (inline SVG), the per-reply stats line of the chat, and the waterfall
(a stacked bar of where a reply's time went, core/waterfall.py).

Inputs are plain data; nothing here runs a model or touches Gradio.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..serving.ar_reference import SHORT_REPLY_TOKENS

# origin -> (css class, background, legend label)
ORIGINS: Dict[str, Tuple[str, str, str]] = {
    "draft": ("tok-draft", "rgba(34,197,94,0.32)", "accepted draft (MTP guess, verified free)"),
    "bonus": ("tok-bonus", "rgba(59,130,246,0.30)", "bonus (every draft accepted)"),
    "correction": ("tok-correction", "rgba(249,115,22,0.38)", "correction (draft rejected, resampled)"),
    "target": ("tok-target", "transparent", "target-sampled"),
}
LANE_COLORS = {"ar": "#64748b", "mtp": "#16a34a"}

CSS = """
#chatbot [role=log] { padding-top: 30px; }   /* keep the first message clear of the corner buttons */
.race-lane { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 10px;
  min-height: 220px; background: var(--background-fill-secondary); }
.race-lane .lane-head { display: flex; flex-wrap: wrap; gap: 6px 12px; align-items: baseline;
  margin-bottom: 6px; font-size: 0.95em; }
.race-lane .lane-meta { opacity: 0.8; font-variant-numeric: tabular-nums; }
.race-lane .lane-text { white-space: pre-wrap; word-break: break-word; line-height: 1.55;
  font-family: var(--font-mono); font-size: 0.9em; max-height: 420px; overflow-y: auto; }
.race-lane .tok { border-radius: 3px; }
.race-legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 0.85em; margin-top: 8px; }
.race-legend .swatch { display: inline-block; width: 0.9em; height: 0.9em; border-radius: 3px;
  vertical-align: -0.1em; margin-right: 4px; border: 1px solid var(--border-color-primary); }
.race-stats table { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums; }
.race-stats th, .race-stats td { padding: 4px 8px; border-bottom: 1px solid var(--border-color-primary);
  text-align: right; }
.race-stats th:first-child, .race-stats td:first-child { text-align: left; }
.race-stats .speedup, .race-stats .repeats { font-size: 1.15em; margin: 6px 0; }
.race-stats .speedup { font-weight: 600; }
.race-stats .short-note, .race-stats .race-uncertainty { font-size: 0.9em; font-weight: normal; opacity: 0.9; }
.race-stats .short .figure { text-decoration: line-through dotted; opacity: 0.6; }
.race-chart svg { width: 100%; height: auto; max-height: 300px; }
.mtp-banner { font-size: 0.9em; opacity: 0.85; }
.waterfall { margin: 8px 0; font-size: 0.85em; font-variant-numeric: tabular-nums; }
.waterfall .wf-bar { display: flex; height: 18px; border-radius: 4px; overflow: hidden;
  border: 1px solid var(--border-color-primary); }
.waterfall .wf-part { display: block; height: 100%; }
.waterfall .wf-legend { display: flex; flex-wrap: wrap; gap: 2px 12px; margin-top: 4px; }
.waterfall .wf-wall { opacity: 0.7; margin-top: 2px; }
.waterfall .wf-legend i { display: inline-block; width: 0.8em; height: 0.8em; border-radius: 2px;
  margin-right: 4px; vertical-align: -0.05em; }
.race-waterfalls { display: flex; gap: 16px; } .race-waterfalls > div { flex: 1; min-width: 0; }
@media (max-width: 640px) { .race-waterfalls { flex-direction: column; } }
@media (max-width: 640px) {
  .race-lane { min-height: 120px; } .race-lane .lane-text { max-height: 260px; }
  #race-lanes { flex-direction: column; }   /* phones: AR above MTP, each full width */
}
"""


@dataclass
class LaneView:
    """One lane as shown at a moment (everything on the lane's own clock)."""

    key: str                      # "ar" | "mtp"
    title: str
    segments: List[Tuple[str, Optional[str]]] = field(default_factory=list)  # (text, origin)
    tokens: int = 0
    clock: float = 0.0            # own compute seconds shown
    ttft: Optional[float] = None
    tokens_per_second: float = 0.0
    finished: bool = False
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    acceptance: Optional[float] = None
    acceptance_per_depth: Optional[List[float]] = None
    tokens_per_cycle: Optional[float] = None
    depth: Optional[object] = None
    mtp_active: Optional[bool] = None
    prefilled_tokens: Optional[int] = None   # prompt tokens this lane ran itself (the rest: prefix cache)
    points: List[Tuple[float, int]] = field(default_factory=list)  # (own clock, tokens)
    waterfall: Dict[str, float] = field(default_factory=dict)   # seconds per part (core/waterfall.py)
    wall: float = 0.0             # the lane's own compute seconds when the waterfall was taken


# waterfall part -> (colour, label); "forward" is the verify forward in the MTP lane
WATERFALL = {
    "prefill": ("#94a3b8", "prefill"), "draft": ("#22c55e", "draft steps"), "forward": ("#3b82f6", "verify forward"),
    "acceptance": ("#a855f7", "acceptance"), "commit": ("#f97316", "rollback/commit"),
    "sampling": ("#eab308", "sampling"), "host": ("#e2e8f0", "host/other"),
}


def waterfall_html(parts: Dict[str, float], wall: float, lane: str) -> str:
    """A stacked bar of where one reply's time went (seconds per part) against its wall time
    (the lane's own clock). The chat's sanitizer keeps classes, styles and titles but drops
    data-* attributes, so the figures a script reads are in those: `wf-<part>` classes with
    "label: X ms" titles, and the `.wf-wall` line. AR has no draft or acceptance, and its
    forward is a plain one."""
    if not parts:
        return ""
    total = sum(parts.values()) or 1.0
    bars, legend = [], []
    for key, (colour, label) in WATERFALL.items():
        sec = parts.get(key, 0.0)
        if lane == "ar" and key in ("draft", "acceptance", "commit") and not sec:
            continue
        if key == "forward" and lane == "ar":
            label = "forward"
        share = 100.0 * sec / total
        bars.append(f'<span class="wf-part wf-{key}" style="width:{share:.3f}%;background:{colour}" '
                    f'title="{esc(label)}: {sec * 1000:.2f} ms ({share:.0f} %)"></span>')
        legend.append(f'<span><i style="background:{colour}"></i>{esc(label)} {sec * 1000:.0f} ms</span>')
    return (f'<div class="waterfall wf-lane-{esc(lane)}"><div class="wf-bar">{"".join(bars)}</div>'
            f'<div class="wf-legend">{"".join(legend)}</div>'
            f'<div class="wf-wall">own compute time {wall * 1000:.2f} ms; the parts add up to {total * 1000:.2f} ms</div>'
            f'</div>')


def esc(text: str) -> str:
    return html.escape(text, quote=True)


def fmt_s(x: Optional[float]) -> str:
    if x is None:
        return "–"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def fmt_pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def legend_html() -> str:
    items = "".join(
        f'<span class="legend-item"><span class="swatch {cls}" style="background:{bg}"></span>{esc(label)}</span>'
        for cls, bg, label in ORIGINS.values()
    )
    return f'<div class="race-legend" id="race-legend">{items}</div>'


def _segments_html(segments: Sequence[Tuple[str, Optional[str]]], coloured: bool) -> str:
    if not coloured:
        return esc("".join(t for t, _ in segments))
    runs: List[Tuple[str, Optional[str]]] = []   # neighbours of one origin share a span
    for text, origin in segments:
        if not text:
            continue
        origin = origin if origin in ORIGINS else "target"
        if runs and runs[-1][1] == origin:
            runs[-1] = (runs[-1][0] + text, origin)
        else:
            runs.append((text, origin))
    out = []
    for text, origin in runs:
        cls, bg, _ = ORIGINS[origin]
        if origin in (None, "target"):
            out.append(f'<span class="tok {cls}">{esc(text)}</span>')
        else:
            out.append(f'<span class="tok {cls}" style="background:{bg}">{esc(text)}</span>')
    return "".join(out)


def lane_html(v: LaneView, coloured: bool = False, legend: bool = False) -> str:
    state = "error" if v.error else ("done" if v.finished else ("running" if v.tokens or v.clock else "idle"))
    meta = [f"{v.tokens} tokens", f"{v.tokens_per_second:.1f} tok/s", f"TTFT {fmt_s(v.ttft)}",
            f"own clock {fmt_s(v.clock)}"]
    if v.acceptance is not None:
        meta.append(f"acceptance {fmt_pct(v.acceptance)}")
    if v.finish_reason:
        meta.append(v.finish_reason)
    body = _segments_html(v.segments, coloured)
    if v.error:
        body += f'<div class="lane-error">⚠️ {esc(v.error)}</div>'
    if not body:
        body = '<span class="lane-empty">waiting…</span>'
    return (
        f'<div class="race-lane" data-lane="{v.key}" data-state="{state}" data-tokens="{v.tokens}">'
        f'<div class="lane-head"><b>{esc(v.title)}</b><span class="lane-meta">{esc(" · ".join(meta))}</span></div>'
        f'<div class="lane-text">{body}</div>'
        f'{legend_html() if legend else ""}</div>'
    )


def empty_lane_html(key: str, title: str, legend: bool = False) -> str:
    return lane_html(LaneView(key=key, title=title), coloured=legend, legend=legend)


def short_note(ar_tokens: int, mtp_tokens: int) -> str:
    """The words next to a speed-up whose replies are too short for it to mean much ('' if not)."""
    if min(ar_tokens, mtp_tokens) >= SHORT_REPLY_TOKENS:
        return ""
    return (f"short replies (AR {ar_tokens}, MTP {mtp_tokens} tokens; under {SHORT_REPLY_TOKENS}): too short for a "
            "speed figure, the first cycle and which drafts happened to be accepted decide it. Not a result: ask "
            "for a longer answer, raise max tokens, or repeat.")


def spread(runs: Sequence[float]) -> str:
    return f"{min(runs):.2f}–{max(runs):.2f}×"


def race_stats_html(ar: LaneView, mtp: LaneView, speedup: Optional[float],
                    runs: Sequence[float] = (), repeats: int = 1, note: str = "", short_runs: int = 0) -> str:
    """The race's statistics table and speed-up. `runs`: the speed-ups of the finished runs so
    far; `short_runs`: how many of them had a reply under SHORT_REPLY_TOKENS."""
    def row(name, a, m):
        return f"<tr><td>{esc(name)}</td><td>{esc(a)}</td><td>{esc(m)}</td></tr>"

    depth = mtp.depth if mtp.depth is not None else "–"
    per_depth = " / ".join(fmt_pct(x) for x in (mtp.acceptance_per_depth or [])) or "–"
    rows = [
        row("tokens", str(ar.tokens), str(mtp.tokens)),
        row("own compute time", fmt_s(ar.clock), fmt_s(mtp.clock)),
        row("tok/s (decode, own clock)", f"{ar.tokens_per_second:.1f}", f"{mtp.tokens_per_second:.1f}"),
        row("time to first token", fmt_s(ar.ttft), fmt_s(mtp.ttft)),
        row("acceptance rate", "–", fmt_pct(mtp.acceptance)),
        row("acceptance per depth", "–", per_depth),
        row("tokens per cycle", "1", "–" if mtp.tokens_per_cycle is None else f"{mtp.tokens_per_cycle:.2f}"),
        row("draft depth", "–", str(depth) + ("" if mtp.mtp_active in (None, True) else " (MTP priced out: plain AR)")),
    ]
    head = "<tr><th></th><th>AR</th><th>MTP</th></tr>"
    sp = "–" if speedup is None else f"{speedup:.2f}×"
    title = "Speedup (MTP vs AR tok/s)" + (" of this run" if repeats > 1 else "")
    short = short_note(ar.tokens, mtp.tokens) if ar.finished and mtp.finished and speedup is not None else ""
    extra = f' <span class="short-note">— {esc(short)}</span>' if short else ""
    lines = [f'<div class="speedup{" short" if short else ""}" data-speedup="{"" if speedup is None else f"{speedup:.4f}"}"'
             f' data-short="{1 if short else 0}">{title}: <span class="figure">{sp}</span>{extra}</div>']
    if runs:
        med = median(runs)
        caveat = ""
        if short_runs:
            caveat = (f' <span class="short-note">— {short_runs} of {len(runs)} runs had a reply under '
                      f'{SHORT_REPLY_TOKENS} tokens: not a result either.</span>')
        all_short = short_runs == len(runs)
        lines.insert(0 if len(runs) == repeats and repeats > 1 else 1,
                     f'<div class="repeats{" short" if all_short else ""}" data-median="{med:.4f}" data-min="{min(runs):.4f}"'
                     f' data-max="{max(runs):.4f}" data-runs="{len(runs)}">Median speedup over {len(runs)}/{repeats} runs: '
                     f'<b class="figure">{med:.2f}×</b> (spread {spread(runs)}: {", ".join(f"{r:.2f}×" for r in runs)}){caveat}</div>')
    if repeats == 1 and speedup is not None and ar.finished and mtp.finished and not short:
        lines.append('<div class="race-uncertainty">One race is one sample: another seed accepts other drafts. '
                     'Repeat N times gives the median and its spread.</div>')
    if note:
        lines.append(f'<div class="race-note">{esc(note)}</div>')
    falls = ""
    if ar.waterfall or mtp.waterfall:   # both lanes side by side: where each one's time went
        falls = ('<div class="race-waterfalls">'
                 + "".join(f'<div><b>{name}</b>{waterfall_html(v.waterfall, v.wall, v.key)}</div>'
                           for name, v in (("AR", ar), ("MTP", mtp)))
                 + "</div>")
    return (f'<div class="race-stats" id="race-stats-body">{"".join(lines)}'
            f'<table>{head}{"".join(rows)}</table>{falls}</div>')


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _nice_step(span: float, n: int = 5) -> float:
    if span <= 0:
        return 1.0
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _ticks(step: float, end: float) -> List[float]:
    """0, step, 2*step, ... up to `end` (which the axis rounded up to a whole step)."""
    out, k = [], 0
    while k * step <= end + 1e-9:
        out.append(k * step)
        k += 1
    return out


def chart_svg(series: Sequence[Tuple[str, str, Sequence[Tuple[float, int]]]],
              width: int = 640, height: int = 260) -> str:
    """Tokens over own-clock seconds, one step line per lane: [(label, colour, points)]."""
    left, right, top, bottom = 48, 12, 12, 36
    pw, ph = width - left - right, height - top - bottom
    xmax = max([p[0] for _, _, pts in series for p in pts] + [0.0]) or 1.0
    ymax = max([p[1] for _, _, pts in series for p in pts] + [0]) or 1
    xs, ys = _nice_step(xmax), _nice_step(ymax)
    xmax, ymax = math.ceil(xmax / xs) * xs, math.ceil(ymax / ys) * ys

    def X(t):
        return left + pw * t / xmax

    def Y(n):
        return top + ph * (1 - n / ymax)

    parts = [f'<svg viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" role="img" '
             f'aria-label="tokens over own-clock time" font-size="11" fill="currentColor">']
    for v in _ticks(ys, ymax):
        y = Y(v)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="currentColor" stroke-opacity="0.12"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
    for v in _ticks(xs, xmax):
        x = X(v)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="currentColor" stroke-opacity="0.12"/>'
                     f'<text x="{x:.1f}" y="{top + ph + 14}" text-anchor="middle">{v:g}</text>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 4}" text-anchor="middle">own compute time (s)</text>'
                 f'<text x="12" y="{top + ph / 2:.1f}" text-anchor="middle" transform="rotate(-90 12 {top + ph / 2:.1f})">tokens</text>')
    for i, (label, colour, pts) in enumerate(series):
        if pts:
            d, prev = [f"M{X(0):.1f},{Y(0):.1f}"], 0
            for t, n in pts:
                d.append(f"L{X(t):.1f},{Y(prev):.1f}L{X(t):.1f},{Y(n):.1f}")
                prev = n
            parts.append(f'<path d="{"".join(d)}" fill="none" stroke="{colour}" stroke-width="2.2" data-series="{esc(label)}"/>')
        lx = left + 10 + i * 150
        parts.append(f'<rect x="{lx}" y="{top + 4}" width="12" height="4" fill="{colour}"/>'
                     f'<text x="{lx + 16}" y="{top + 10}">{esc(label)}</text>')
    parts.append("</svg>")
    return f'<div class="race-chart">{"".join(parts)}</div>'


THINKING_TITLE = "💭 Thinking"


def reply_stats(stats: dict, mode: str, reference=None, depth: object = 1, batched_with: int = 0) -> Tuple[str, str]:
    """(title, details markdown) for a chat reply's stats message. `reference`: the AR speed at
    this reply's sampler, prompt length and reply length (webapp.serving.ar_reference.Reference) or None;
    `batched_with`: the most other requests it decoded together with (webapp/serving/batching.py)."""
    tps = stats.get("tokens_per_second", 0.0) or 0.0
    n = stats.get("generated_tokens", 0) or 0
    short = 0 < n < SHORT_REPLY_TOKENS
    bits = [mode.upper(), f"{n} tokens", f"{tps:.1f} tok/s" + (" (short reply: not a speed figure)" if short else ""),
            f"TTFT {fmt_s(stats.get('time_to_first_token'))}"]
    speedup = None
    priced_out = False
    if mode == "mtp":
        if stats.get("proposed"):
            bits.append(f"acceptance {fmt_pct(stats.get('acceptance_rate'))}")
        priced_out = depth == "auto" and not stats.get("mtp_active", True)
        if priced_out:
            bits.append("MTP priced out")
        if reference is not None and tps and not short and stats.get("finish_reason") != "stopped":
            speedup = tps / reference.tokens_per_second
            bits.append(f"≈{speedup:.2f}× vs AR (same sampler, context & length)")
    if batched_with:
        bits.append(f"batched with up to {batched_with} other{'s' if batched_with > 1 else ''}")
    if stats.get("finish_reason") == "stopped":
        bits.append("stopped")
    cached = stats.get("cached_tokens") or 0
    if cached:
        bits.append(f"{cached} cached")
    details = [
        f"- generated tokens: {n} (prompt {stats.get('prompt_tokens', 0)}: "
        f"{cached} from the prefix cache, {stats.get('prefilled_tokens', 0)} prefilled in "
        f"{fmt_s(stats.get('prefill_seconds'))})",
        f"- decode speed: {tps:.1f} tok/s; time to first token {fmt_s(stats.get('time_to_first_token'))}",
        f"- target forwards: {stats.get('target_forwards', 0)}; cycles: {stats.get('cycles', 0)}",
    ]
    if short:
        details.append(f"- a reply under {SHORT_REPLY_TOKENS} tokens is too short for its speed to mean much: its "
                       "first cycle (and, with MTP, which few drafts were accepted) decides it")
    if mode == "mtp":
        per_depth = " / ".join(fmt_pct(x) for x in stats.get("acceptance_per_depth") or []) or "–"
        details += [
            f"- draft depth: {depth if depth != 'auto' else 'auto, last cycle ' + str(stats.get('depth'))}"
            f"{' (priced out: plain AR steps)' if priced_out else ''}; acceptance {fmt_pct(stats.get('acceptance_rate'))} "
            f"({stats.get('accepted', 0)}/{stats.get('proposed', 0)}), per depth {per_depth}",
            f"- tokens per cycle: {stats.get('tokens_per_cycle', 0.0):.2f}",
        ]
        if speedup is not None:
            details.append(f"- speed-up estimate: ≈{speedup:.2f}×, this reply's {tps:.1f} tok/s over "
                           f"{reference.tokens_per_second:.1f} tok/s, the median of the last {reference.decodes} AR "
                           f"decodes at this sampler with prompts of {reference.context} and replies of "
                           f"{reference.reply} (AR chat replies, race AR lanes, the warm-up); the Race tab "
                           "measures both lanes on the same prompt, side by side")
        elif reference is None and not short:
            details.append("- no speed-up estimate: no AR decode at this sampler, prompt length and reply length "
                           "yet (one AR reply of about this length here gives one); the Race tab compares side by side")
        if stats.get("predicted_speedup"):
            details.append(f"- cost model predicts: {stats['predicted_speedup']:.2f}×")
    details.append(f"- finish: {stats.get('finish_reason')}")
    wf = waterfall_html(stats.get("waterfall") or {}, stats.get("compute_seconds") or 0.0, mode)
    if wf:
        details += ["", "Where the time went:", "", wf]
    return " · ".join(bits), "\n".join(details)
