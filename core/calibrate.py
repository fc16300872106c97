"""Measuring the cost model (core/costs.py): calibration, run at warm-up or in idle time.

A measurement prefills one chat prompt at the context bucket, times verifies of each width and
one MTP step on it (the parts), then times whole cycles through the lanes' own loops. That is
~7.6 s on the demo model at a 64-token bucket on this CPU: done inside a request it stalled
everyone behind it. So the measurement is a generator of short slices (`calibration`): a caller
that owns the model thread runs one slice at a time when nothing else is waiting (webapp/model.py
does), or all of them at once (`measure_costs`, for warm-up, benchmarks and tests). Each slice is
one prefill, one timing or one lane's run of cycles: ~0.1-0.7 s on the demo model.

A finished measurement can be saved and reused on the next start (`save` / `load`), keyed by
what it depends on: the machine (device, BLAS, mlx) and the model (its description and files).
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import mlx.core as mx

from .chat import chat_prompt_ids, padded_chat_prompt
from .costs import Costs, context_bucket, measured, remember
from .decoders import AutoregressiveDecoder, SpeculativeDecoder
from .limits import context_window
from .prefix_cache import PrefixCache
from .sampling import SamplerConfig
from .stats import GenerationStats
from .stream import Prompt, prefill


def measure_costs(adapter, max_width: int = 5, context: int = 64, repeats: int = 7) -> Costs:
    """The costs at this context's bucket: measured now, in one go, unless already known."""
    for _ in calibration(adapter, max_width, context, repeats):
        pass
    return measured(adapter)[context_bucket(context)]


def needs_calibration(adapter, max_width: int, context: int) -> bool:
    known = measured(adapter).get(context_bucket(context))
    return known is None or max(known.verify) < max_width


def calibration(adapter, max_width: int = 5, context: int = 64, repeats: int = 7) -> Iterator[str]:
    """Measure the decode-time operations on a warm cache at this context's bucket, one short
    slice per step of the iteration (each yields what it just did); at the end the costs are
    remembered for the adapter (core.costs.cached_costs finds them). Nothing when known."""
    if not needs_calibration(adapter, max_width, context):
        return
    bucket = context_bucket(context)
    sampler = SamplerConfig()
    # One chat prompt at the bucket's length (within the model's context, with room to decode),
    # prefilled once: the verify timings and every lane of the cycles restore it.
    length = max(64, min(bucket, context_window(adapter) - 512))
    ids = padded_chat_prompt(adapter, "Define the word harbor.", length)
    shared = PrefixCache(2**40)
    cache = adapter.make_cache()
    draft = adapter.make_draft(cache)
    hidden = prefill(adapter, Prompt(tuple(ids), (len(ids) - 1,)), cache, draft, shared).hidden
    yield "prefill"
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
            mx.eval(support, adapter.state_arrays(cache, None))
        return run

    def draft_step():
        # One step that catches up one position: the drafter's history grows by one a run.
        _, logits = adapter.draft_step(draft, cache, hidden[:, -1:], tokens[:, -1:])
        mx.eval(sampler.draw(logits, mx.random.key(1)))

    verify_s: Dict[int, float] = {}
    for width in range(1, max_width + 1):
        verify_s[width] = timed(verify(width))
        yield f"verify {width}"
    step_s = timed(draft_step)
    yield "draft step"
    cycles: Dict[int, float] = {}
    for done in cycle_rounds(adapter, sampler, max_width - 1, prompt_ids=ids, shared=shared, out=cycles):
        yield done
    base = verify_s[1]
    remember(adapter, bucket, Costs(
        ar_step_seconds=base,
        verify={w: (s / base if w > 1 else 1.0) for w, s in verify_s.items()},
        mtp_step=step_s / base,
        cycles=cycles,
    ))


def measure_cycles(adapter, sampler, max_depth: int, steps: int = 24, rounds: int = 3,
                   prompt_ids: Optional[List[int]] = None, shared=None) -> Dict[int, float]:
    """Seconds per cycle at depths 1..max_depth over seconds per token of the AR lane (see
    cycle_rounds), measured in one go."""
    out: Dict[int, float] = {}
    for _ in cycle_rounds(adapter, sampler, max_depth, steps, rounds, prompt_ids, shared, out):
        pass
    return out


def cycle_rounds(adapter, sampler, max_depth: int, steps: int = 24, rounds: int = 3,
                 prompt_ids: Optional[List[int]] = None, shared=None,
                 out: Optional[Dict[int, float]] = None) -> Iterator[str]:
    """Fill `out` with seconds per cycle at depths 1..max_depth over seconds per token of the AR
    lane, each the median of `rounds` runs of `steps` cycles (tokens) through the lanes' own
    loops; one lane's run per slice.

    On a chat prompt (by default a short one; calibration passes one padded to the context
    bucket, and the prefix cache that holds it), so that drafts are accepted about as often as
    in use: a rejected cycle and an accepted one do not cost the same."""
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
    for r in range(rounds):  # AR and MTP interleaved, so that both see the same machine
        ar_s = per_yield(ar, 0)
        yield f"cycles round {r + 1}: AR"
        row = {}
        for d, lane in lanes.items():
            row[d] = per_yield(lane, d) / ar_s
            yield f"cycles round {r + 1}: depth {d}"
        per_round.append(row)
    if out is not None:
        out.update({d: statistics.median(r[d] for r in per_round) for d in lanes})


# --------------------------------------------------------------------------- saved calibrations
def key(machine: dict, model: dict) -> str:
    """A file name for what a measurement depends on (any change measures anew)."""
    blob = json.dumps({"machine": machine, "model": model}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def save(adapter, path: Path, about: Optional[dict] = None) -> None:
    """Write every bucket measured for `adapter` to `path` (JSON; `about` says what it is for)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"about": about or {}, "buckets": {str(b): c.as_dict() for b, c in measured(adapter).items()}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def load(adapter, path: Path) -> int:
    """Remember the buckets saved at `path` for `adapter`; returns how many (0: none, unreadable)."""
    try:
        data = json.loads(path.read_text())
        buckets = {int(b): Costs.from_dict(c) for b, c in data["buckets"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    for bucket, costs in buckets.items():
        remember(adapter, bucket, costs)
    return len(buckets)
