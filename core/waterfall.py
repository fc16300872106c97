"""Where a reply's time goes: prefill, draft steps, the target's (verify) forward, acceptance,
rollback/commit, sampling, and the host's own work, summed per reply.

MLX is lazy: a phase's arrays are computed when something waits for them, and a cycle waits
once (the accept step's `mx.eval`), so timing every phase would need a sync after each, which
costs the overlap the loop is built for (drafts computing while the verify graph is built).
So only a sampled subset of cycles — every SAMPLE_EVERY-th, starting with the first — syncs at
each phase boundary and times it; every cycle's total is timed (two clock reads). A reply's
cycle time is split in the sampled cycles' proportions. Prefill and the first token's sampling
are timed directly; the host's part is the rest of the lane's clock (detokenising, stop strings,
the generator's bookkeeping between cycles and its resumes), so the parts add up to the reply's
own compute time exactly. When the host part was timed directly instead, the untimed windows
between events held 0.5-1.4 % of a reply on a tiny model, and a thread switch landing in one
under load left 11 % of a reply in no part. What the timed cycles' syncs cost
(docs/bench/cpu-waterfall-overhead-demo.json, demo model, 2-core CPU): 0.8 % of AR's decode speed
and 0.3 % of MTP's, paired on/off; a timed cycle takes 15.5 % (AR, whose next step no longer
overlaps) and 4 % (MTP) longer than the others, so at most 2.0 % and 0.5 %.
"""
from __future__ import annotations

import time
from typing import Dict, Optional

import mlx.core as mx

PARTS = ("prefill", "draft", "forward", "acceptance", "commit", "sampling", "host")
CYCLE_PARTS = ("draft", "forward", "acceptance", "commit", "sampling", "host")
SAMPLE_EVERY = 8


class Waterfall:
    """One reply's timing. In a cycle: `cycle()` starts it, `mark(part, *arrays)` ends a phase
    (in a sampled cycle: waits for `arrays`, then charges the time since the last mark to
    `part`; otherwise nothing), `end()` closes it. Outside cycles: `add(part, seconds)`."""

    def __init__(self, every: int = SAMPLE_EVERY):
        self.every = every
        self.direct: Dict[str, float] = dict.fromkeys(PARTS, 0.0)
        self._phases: Dict[str, float] = dict.fromkeys(CYCLE_PARTS, 0.0)
        self._sampled_seconds = 0.0      # total of the sampled cycles
        self._cycle_seconds = 0.0        # total of all cycles
        self.cycles = self.sampled = 0
        self._on = False
        self._t0 = self._t = 0.0

    def cycle(self) -> None:
        self._on = self.every > 0 and self.cycles % self.every == 0
        self.cycles += 1
        self._t0 = self._t = time.perf_counter()

    def mark(self, part: str, *arrays) -> None:
        if not self._on:
            return
        if arrays:
            mx.eval(*arrays)
        now = time.perf_counter()
        self._phases[part] += now - self._t
        self._t = now

    def end(self) -> Optional[float]:
        """Close the cycle: its seconds, or None for a cycle timed phase by phase (its syncs
        made it slower than the others)."""
        now = time.perf_counter()
        self._cycle_seconds += now - self._t0
        timed, self._on = self._on, False
        if timed:
            self._phases["host"] += now - self._t   # after the last mark: bookkeeping
            self._sampled_seconds += now - self._t0
            self.sampled += 1
            return None
        return now - self._t0

    def cycle_seconds(self):
        """(seconds, count) of the timed cycles and of the others: what a timed cycle costs
        more, measured inside the same replies (scripts/bench/bench_waterfall.py)."""
        return ((self._sampled_seconds, self.sampled),
                (self._cycle_seconds - self._sampled_seconds, self.cycles - self.sampled))

    def add(self, part: str, seconds: float) -> None:
        self.direct[part] += seconds

    def accounted(self) -> float:
        """Seconds charged so far: the parts timed directly and every cycle's total."""
        return sum(self.direct.values()) + self._cycle_seconds

    def parts(self) -> Dict[str, float]:
        """Seconds per part for the reply so far ({} when timing is off: every=0)."""
        if self.every <= 0:
            return {}
        out = dict(self.direct)
        if self._sampled_seconds > 0:
            scale = self._cycle_seconds / self._sampled_seconds
            for k, v in self._phases.items():
                out[k] += v * scale
        return out
