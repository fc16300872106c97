"""The cost model: what a cycle at depth D costs, relative to one token of the AR lane.

Speculation at depth D yields 1 + a1 + a1*a2 + ... tokens per cycle (a_i: acceptance at
depth i given the earlier ones passed) for one verify of width D+1 plus D MTP steps.

Two measurements, both relative to one AR step: the parts (a verify of width k, one MTP
step), and whole cycles timed as the lanes run them (the AR lane pipelined, full
draft-verify-accept-commit cycles). The whole cycle is what predictions use: on a CPU
the acceptance test, finiteness checks, the head catching up on two positions and the
host's bookkeeping add ~0.2-0.4 AR steps that the parts miss.

Measuring belongs to calibration (core/calibrate.py), at warm-up or in idle time; this module
only holds what was measured and decides with it, so a request never waits for a measurement.
"""
from __future__ import annotations

import math
import statistics
import weakref
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Deque, Dict, List, Optional, Union

_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Costs:
    ar_step_seconds: float
    verify: Dict[int, float]  # width -> cost relative to one AR step (verify[1] == 1.0)
    mtp_step: float  # one MTP step (head layer + lm_head + sampling) relative to one AR step
    cycles: Dict[int, float] = field(default_factory=dict)  # depth -> whole cycle, as the lanes run
    # Batch size B -> {0: a batched AR step of B sequences over one lane's AR step, D: a batched
    # cycle of B sequences at depth D over that batched AR step} (core/batch.py's own steps).
    batches: Dict[int, Dict[int, float]] = field(default_factory=dict)

    def parts(self, depth: int) -> float:
        return self.verify[depth + 1] + depth * self.mtp_step

    def cycle(self, depth: int) -> float:
        return self.cycles[depth] if depth in self.cycles else self.parts(depth)

    def at_batch(self, size: int) -> "Costs":
        """The costs of one sequence among `size` decoding together, relative to their shared
        AR step: the nearest batch size measured (in log scale), or these when none was or the
        sequence is alone. Why: a batched step reads the weights once for all its rows, so its
        AR step costs little more than one sequence's, while a verify of B x (D + 1) positions
        and the drafts' per-sequence work grow with B: speculation pays less in a batch."""
        if size <= 1 or not self.batches:
            return self
        near = min(self.batches, key=lambda b: abs(math.log(b / size)))
        row = self.batches[near]
        deepest = max(row)   # only the depths measured at this size
        return replace(self, ar_step_seconds=self.ar_step_seconds * row[0],
                       verify={w: v for w, v in self.verify.items() if w <= deepest + 1},
                       cycles={d: c for d, c in row.items() if d > 0}, batches={})

    def as_dict(self) -> dict:
        out = {
            "ar_step_ms": self.ar_step_seconds * 1e3,
            "verify_width": {str(k): v for k, v in self.verify.items()},
            "mtp_step": self.mtp_step,
            "cycle": {str(d): v for d, v in self.cycles.items()},
            "cycle_from_parts": {str(d): self.parts(d) for d in range(1, max(self.verify))},
        }
        if self.batches:
            out["batch"] = {str(b): {str(d): v for d, v in row.items()} for b, row in self.batches.items()}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Costs":
        """The inverse of as_dict (a saved calibration)."""
        return cls(ar_step_seconds=d["ar_step_ms"] / 1e3,
                   verify={int(k): float(v) for k, v in d["verify_width"].items()},
                   mtp_step=float(d["mtp_step"]),
                   cycles={int(k): float(v) for k, v in d.get("cycle", {}).items()},
                   batches={int(b): {int(k): float(v) for k, v in row.items()} for b, row in d.get("batch", {}).items()})


def expected_tokens(acceptance: List[float], depth: int) -> float:
    total, run = 1.0, 1.0
    for a in acceptance[:depth]:
        run *= a
        total += run
    return total


def predicted_speedup(costs: Costs, acceptance: List[float], depth: int) -> float:
    return expected_tokens(acceptance, depth) / costs.cycle(depth)


def context_bucket(context: int) -> int:
    """Contexts are measured at 64 * 4^k tokens, the one nearest in log scale: what a cycle
    costs grows with the context (attention over it), slowly enough for buckets this wide."""
    k = max(0, round(math.log(max(context, 64) / 64, 4)))
    return 64 * 4**k


def cached_costs(adapter, context: int = 64) -> Optional[Costs]:
    """The measured costs of the bucket nearest to `context`, if any was measured."""
    by_bucket = _CACHE.get(adapter) or {}
    if not by_bucket:
        return None
    want = context_bucket(context)
    return by_bucket[min(by_bucket, key=lambda b: abs(math.log(b / want)))]


def measured(adapter) -> Dict[int, Costs]:
    """Every bucket measured for this adapter (bucket -> costs)."""
    return dict(_CACHE.get(adapter) or {})


def remember(adapter, bucket: int, costs: Costs) -> None:
    """Keep `costs` as this adapter's at `bucket` (a calibration's result, or a saved one)."""
    _CACHE.setdefault(adapter, {})[bucket] = costs


class DepthPolicy:
    """Fixed depth, or 'auto': the depth with the best predicted tokens per unit cost.

    Acceptance per depth is estimated online with a Beta(4, 1) prior; when no depth beats
    plain decoding, it decodes autoregressively and re-probes depth 1 every PROBE_EVERY steps.
    `costs` may be a function that looks them up: it is asked every cycle, so a reply that
    started before its calibration finished switches to the measured model when it lands.
    Until then 'auto' drafts at UNMEASURED_DEPTH, the cheapest speculation (a cycle at depth 1
    costs the least when the head turns out to be poor).

    Cycle costs come from the reply's own cycles once it has run enough of them (`observe`):
    a start-up calibration on a GPU came out wrong in both directions (ninth session, H200: the
    demo's depth-3 cycle priced 12 % too dear, the 35B-A3B shape's depth-1 cycle at half its
    real cost), while a reply's cycles are what speculation really costs now, at this context.
    A depth observed OBSERVED_AFTER times is priced by the median of its last OBSERVED_KEPT
    cycles over the calibration's AR step (a median: the first cycle at a depth can compile its
    shapes and take many times the others); the others by the calibration scaled as the
    observed depths are (its bias).
    """

    PROBE_EVERY = 16
    UNMEASURED_DEPTH = 1
    OBSERVED_AFTER = 8      # cycles at a depth before they replace the calibration's price
    OBSERVED_KEPT = 16      # the latest cycles a depth is priced by (they follow the context's growth)

    def __init__(self, depth, max_depth: int, costs: Union[None, Costs, Callable[[], Optional[Costs]]]):
        self.auto = depth == "auto"
        self.depth = max_depth if self.auto else int(depth)
        self._costs = costs
        self._ar_steps = 0
        self.seen: Dict[int, Deque[float]] = {}   # depth -> seconds of its latest cycles

    def observe(self, depth: int, seconds: Optional[float]) -> None:
        """One cycle the reply ran at `depth` (> 0), wall seconds from its start to its end
        (None: a cycle timed phase by phase, slower than the others, is left out)."""
        if not self.auto or depth <= 0 or seconds is None:
            return
        self.seen.setdefault(depth, deque(maxlen=self.OBSERVED_KEPT)).append(seconds)

    def observed(self, ar_step_seconds: float) -> Dict[int, float]:
        """Depth -> its cycles' price in AR steps, for the depths run OBSERVED_AFTER times."""
        return {d: statistics.median(ts) / ar_step_seconds for d, ts in sorted(self.seen.items())
                if len(ts) >= self.OBSERVED_AFTER}

    def priced(self, costs: Costs, known: Dict[int, float]) -> Costs:
        """`costs` with the cycles this reply observed (`known`: `observed`; see the class note)."""
        if not known:
            return costs
        bias = sorted(c / costs.cycle(d) for d, c in known.items())[len(known) // 2]
        deepest = max(costs.verify) - 1
        return replace(costs, cycles={d: known.get(d, costs.cycle(d) * bias) for d in range(1, deepest + 1)})

    @property
    def costs(self) -> Optional[Costs]:
        return self._costs() if callable(self._costs) else self._costs

    def acceptance(self, stats) -> List[float]:
        est = []
        for i in range(self.depth):
            acc = stats.accepted_per_depth[i] if i < len(stats.accepted_per_depth) else 0
            prop = stats.proposed_per_depth[i] if i < len(stats.proposed_per_depth) else 0
            est.append((acc + 4.0) / (prop + 5.0))
        return est

    def best(self, stats, batch: int = 1):
        """(depth, predicted speedup) with the highest predicted speedup; depth 0 is plain AR.
        `batch`: the sequences decoding together (core/batch.py), priced by Costs.at_batch."""
        costs = self.costs
        if costs is not None:
            # a reply's own cycles are observed alone; a batch's are priced by its measured sizes
            if batch > 1:
                costs = costs.at_batch(batch)
            elif self.seen and costs.ar_step_seconds > 0:
                known = self.observed(costs.ar_step_seconds)
                costs = self.priced(costs, known)
                stats.observed_cycle_costs = {d: round(c, 4) for d, c in known.items()}
        if costs is None:
            return (min(self.UNMEASURED_DEPTH, self.depth) if self.auto else self.depth), None
        acc = self.acceptance(stats)
        deepest = min(self.depth, max(costs.verify) - 1)  # the depths the measurement covers
        options = [(predicted_speedup(costs, acc, d), d) for d in range(1, deepest + 1)]
        speed, d = max(options)
        return (d, speed) if (speed > 1.0 or not self.auto) else (0, 1.0)

    def choose(self, stats, batch: int = 1) -> int:
        d, speed = self.best(stats, batch)
        stats.predicted_speedup = speed
        if not self.auto:
            stats.mtp_active = True
            return self.depth
        if d == 0:
            self._ar_steps += 1
            if self._ar_steps % self.PROBE_EVERY == 0:
                return 1
        stats.mtp_active = d > 0
        return d
