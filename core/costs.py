"""The cost model: what a cycle at depth D costs, relative to one token of the AR lane.

Speculation at depth D yields 1 + a1 + a1*a2 + ... tokens per cycle (a_i: acceptance at
depth i given the earlier ones passed) for one verify of width D+1 plus D MTP steps.

Two measurements, both relative to one AR step: the parts (a verify of width k, one MTP
step), and whole cycles timed as the lanes run them (the AR lane pipelined, full
draft-verify-accept-commit cycles). The whole cycle is what predictions use: on a CPU
the acceptance test, finiteness checks, the head catching up on two positions and the
host's bookkeeping add ~0.2-0.4 AR steps that the parts miss.
"""
from __future__ import annotations

import math
import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import mlx.core as mx

_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Costs:
    ar_step_seconds: float
    verify: Dict[int, float]  # width -> cost relative to one AR step (verify[1] == 1.0)
    mtp_step: float  # one MTP step (head layer + lm_head + sampling) relative to one AR step
    cycles: Dict[int, float] = field(default_factory=dict)  # depth -> whole cycle, as the lanes run

    def parts(self, depth: int) -> float:
        return self.verify[depth + 1] + depth * self.mtp_step

    def cycle(self, depth: int) -> float:
        return self.cycles[depth] if depth in self.cycles else self.parts(depth)

    def as_dict(self) -> dict:
        return {
            "ar_step_ms": self.ar_step_seconds * 1e3,
            "verify_width": {str(k): v for k, v in self.verify.items()},
            "mtp_step": self.mtp_step,
            "cycle": {str(d): v for d, v in self.cycles.items()},
            "cycle_from_parts": {str(d): self.parts(d) for d in range(1, max(self.verify))},
        }


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


def measure_costs(adapter, max_width: int = 5, context: int = 64, repeats: int = 7) -> Costs:
    """Time the decode-time operations on a warm cache at this context's bucket (once per
    adapter and bucket, then cached)."""
    bucket = context_bucket(context)
    cached = (_CACHE.get(adapter) or {}).get(bucket)
    if cached is not None and max(cached.verify) >= max_width:
        return cached
    from .chat import padded_chat_prompt
    from .limits import context_window
    from .prefix_cache import PrefixCache
    from .sampling import SamplerConfig
    from .stream import Prompt, prefill

    sampler = SamplerConfig()
    # One chat prompt at the bucket's length (within the model's context, with room to decode),
    # prefilled once: the verify timings and every lane of measure_cycles restore it.
    length = max(64, min(bucket, context_window(adapter) - 512))
    ids = padded_chat_prompt(adapter, "Define the word harbor.", length)
    shared = PrefixCache(2**40)
    cache, mtp_cache = adapter.make_cache(), adapter.make_mtp_cache()
    hidden = prefill(adapter, Prompt(tuple(ids), (len(ids) - 1,)), cache, mtp_cache, shared).hidden
    tokens = mx.array([ids[-8:]], dtype=mx.int32)

    def timed(fn) -> float:
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs[1:])  # the first run warms up

    def verify(width: int):
        def run():
            # As the decoders do it: forward, the sampler's support, and (width > 1) commit one
            # position from the captured state, so the context grows by one token per run.
            logits, _, cap = adapter.forward(tokens[:, :width], cache, capture=width > 1)
            support = sampler.support(logits[0])
            if cap is not None:
                adapter.rollback(cache, cap, keep=1)
            mx.eval(support, [c.state for c in cache])
        return run

    def mtp_step():
        g = adapter.mtp_forward(hidden[:, -1:], tokens[:, -1:], mtp_cache)
        mx.eval(sampler.draw(adapter.lm_head(g)[0], mx.random.key(1)))
        mtp_cache.trim(1)

    base = timed(verify(1))
    costs = Costs(
        ar_step_seconds=base,
        verify={w: (timed(verify(w)) / base if w > 1 else 1.0) for w in range(1, max_width + 1)},
        mtp_step=timed(mtp_step) / base,
        cycles=measure_cycles(adapter, sampler, max_depth=max_width - 1, prompt_ids=ids, shared=shared),
    )
    _CACHE.setdefault(adapter, {})[bucket] = costs
    return costs


def measure_cycles(adapter, sampler, max_depth: int, steps: int = 24, rounds: int = 3,
                   prompt_ids: Optional[List[int]] = None, shared=None) -> Dict[int, float]:
    """Seconds per cycle at depths 1..max_depth over seconds per token of the AR lane, each
    the median of `rounds` runs of `steps` cycles (tokens) through the lanes' own loops.

    On a chat prompt (by default a short one; measure_costs passes one padded to the context
    bucket, and the prefix cache that holds it), so that drafts are accepted about as often as
    in use: a rejected cycle and an accepted one do not cost the same."""
    from .chat import chat_prompt_ids
    from .decoders import AutoregressiveDecoder, SpeculativeDecoder
    from .prefix_cache import PrefixCache
    from .stats import GenerationStats
    from .stream import Prompt

    ids = prompt_ids or chat_prompt_ids(adapter, [{"role": "user", "content": "Define the word harbor."}])
    # Every lane restores the prompt from one snapshot: a long prefill runs once.
    prompt, shared = Prompt(tuple(ids), (len(ids) - 1,)), shared or PrefixCache(2**40)

    def per_yield(lane, depth: int) -> float:
        it = lane._steps(prompt, steps * (depth + 1) + 2, GenerationStats(), None)
        next(it)  # prefill and the first token are not decode time
        t0 = time.perf_counter()
        for n, _ in enumerate(it, 1):
            if n == steps:
                break
        it.close()
        return (time.perf_counter() - t0) / steps

    ar = AutoregressiveDecoder(adapter, sampler=sampler, prefix_cache=shared)
    lanes = {d: SpeculativeDecoder(adapter, sampler=sampler, depth=d, prefix_cache=shared) for d in range(1, max_depth + 1)}
    per_round = []
    for _ in range(rounds):  # AR and MTP interleaved, so that both see the same machine
        ar_s = per_yield(ar, 0)
        per_round.append({d: per_yield(lane, d) / ar_s for d, lane in lanes.items()})
    return {d: statistics.median(r[d] for r in per_round) for d in lanes}


class DepthPolicy:
    """Fixed depth, or 'auto': the depth with the best predicted tokens per unit cost.

    Acceptance per depth is estimated online with a Beta(4, 1) prior; when no depth beats
    plain decoding, it decodes autoregressively and re-probes depth 1 every PROBE_EVERY steps.
    """

    PROBE_EVERY = 16

    def __init__(self, depth, max_depth: int, costs: Optional[Costs]):
        self.auto = depth == "auto"
        self.depth = max_depth if self.auto else int(depth)
        self.costs = costs
        self._ar_steps = 0

    def acceptance(self, stats) -> List[float]:
        est = []
        for i in range(self.depth):
            acc = stats.accepted_per_depth[i] if i < len(stats.accepted_per_depth) else 0
            prop = stats.proposed_per_depth[i] if i < len(stats.proposed_per_depth) else 0
            est.append((acc + 4.0) / (prop + 5.0))
        return est

    def best(self, stats):
        """(depth, predicted speedup) with the highest predicted speedup; depth 0 is plain AR."""
        if self.costs is None:
            return self.depth, None
        acc = self.acceptance(stats)
        options = [(predicted_speedup(self.costs, acc, d), d) for d in range(1, self.depth + 1)]
        speed, d = max(options)
        return (d, speed) if (speed > 1.0 or not self.auto) else (0, 1.0)

    def choose(self, stats) -> int:
        d, speed = self.best(stats)
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
