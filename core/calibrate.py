"""Measuring the cost model (core/costs.py): calibration, run at warm-up or in idle time.

A measurement prefills one chat prompt at the context bucket, times verifies of each width and
one MTP step on it (the parts), then times whole cycles through the lanes' own loops. That is
~7.6 s on the demo model at a 64-token bucket on this CPU: done inside a request it stalled
everyone behind it. So the measurement is a generator of short slices (`calibration`): a caller
that owns the model thread runs one slice at a time when nothing else is waiting (webapp/serving/model.py
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
from dataclasses import replace
from typing import Dict, Iterator, List, Optional, Sequence

import mlx.core as mx

from .chat import chat_prompt_ids, padded_chat_prompt
from .costs import Costs, context_bucket, measured, remember
from .decoders import AutoregressiveDecoder, SpeculativeDecoder
from .limits import context_window
from .prefix_cache import PrefixCache
from .sampling import SamplerConfig
from .stats import GenerationStats
from .stream import Prompt, prefill


def measure_costs(adapter, max_width: int = 5, context: int = 64, repeats: int = 7,
                  batch_sizes: Sequence[int] = ()) -> Costs:
    """The costs at this context's bucket: measured now, in one go, unless already known."""
    for _ in calibration(adapter, max_width, context, repeats, batch_sizes):
        pass
    return measured(adapter)[context_bucket(context)]


def batch_sizes_up_to(max_batch: int) -> List[int]:
    """The batch sizes worth measuring for batches of up to `max_batch` (core.costs.Costs.at_batch
    takes the nearest in log scale): 2, 4, 8 and 16 where below it, and it (16 at most: a step
    of 64 sequences at every depth would hold a warm-up for minutes)."""
    if max_batch <= 1:
        return []
    return sorted({b for b in (2, 4, 8, 16) if b < max_batch} | {min(max_batch, 16)})


def needs_calibration(adapter, max_width: int, context: int, batch_sizes: Sequence[int] = ()) -> bool:
    known = measured(adapter).get(context_bucket(context))
    return (known is None or max(known.verify) < max_width
            or any(b not in known.batches or max(known.batches[b]) < max_width - 1 for b in batch_sizes))


def calibration(adapter, max_width: int = 5, context: int = 64, repeats: int = 7,
                batch_sizes: Sequence[int] = ()) -> Iterator[str]:
    """Measure the decode-time operations on a warm cache at this context's bucket, one short
    slice per step of the iteration (each yields what it just did); at the end the costs are
    remembered for the adapter (core.costs.cached_costs finds them). Nothing when known.
    `batch_sizes`: also time batched steps of that many sequences (batch_rounds)."""
    if not needs_calibration(adapter, max_width, context, batch_sizes):
        return
    known = measured(adapter).get(context_bucket(context))
    if known is not None and max(known.verify) >= max_width:
        # Only batch sizes are missing: measure those, keep the rest.
        ids = padded_chat_prompt(adapter, "Define the word harbor.",
                                 max(64, min(context_bucket(context), context_window(adapter) - 512)))
        batches = dict(known.batches)
        yield from batch_rounds(adapter, SamplerConfig(), max_width - 1, batch_sizes, prompt_ids=ids, out=batches)
        remember(adapter, context_bucket(context), replace(known, batches=batches))
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
    ar_lane = cycles.pop(0, None)
    batches: Dict[int, Dict[int, float]] = {}
    if batch_sizes:
        yield from batch_rounds(adapter, sampler, max_width - 1, batch_sizes, prompt_ids=ids, shared=shared,
                                out=batches, ar_lane=ar_lane)
    base = verify_s[1]
    remember(adapter, bucket, Costs(
        ar_step_seconds=base,
        verify={w: (s / base if w > 1 else 1.0) for w, s in verify_s.items()},
        mtp_step=step_s / base,
        cycles=cycles,
        batches=batches,
    ))


def measure_cycles(adapter, sampler, max_depth: int, steps: int = 24, rounds: int = 3,
                   prompt_ids: Optional[List[int]] = None, shared=None) -> Dict[int, float]:
    """Seconds per cycle at depths 1..max_depth over seconds per token of the AR lane (see
    cycle_rounds), measured in one go."""
    out: Dict[int, float] = {}
    for _ in cycle_rounds(adapter, sampler, max_depth, steps, rounds, prompt_ids, shared, out):
        pass
    out.pop(0)
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
    per_round, ar_runs = [], []
    for r in range(rounds):  # AR and MTP interleaved, so that both see the same machine
        ar_s = per_yield(ar, 0)
        ar_runs.append(ar_s)
        yield f"cycles round {r + 1}: AR"
        row = {}
        for d, lane in lanes.items():
            row[d] = per_yield(lane, d) / ar_s
            yield f"cycles round {r + 1}: depth {d}"
        per_round.append(row)
    if out is not None:
        out.update({d: statistics.median(r[d] for r in per_round) for d in lanes})
        out[0] = statistics.median(ar_runs)   # seconds per token of the AR lane (calibration's batch base)


def batch_rounds(adapter, sampler, max_depth: int, sizes: Sequence[int], steps: int = 10, warm: int = 2,
                 prompt_ids: Optional[List[int]] = None, shared=None, out: Optional[dict] = None,
                 ar_lane: Optional[float] = None) -> Iterator[str]:
    """Fill `out` with, per batch size B: {0: seconds of a batched AR step of B sequences over
    seconds per token of the AR lane alone, D: seconds of a batched step of B sequences all at
    depth D over the batched AR step}: core/batch.py's own steps, timed on B sequences of one
    chat prompt with their own seeds (so they accept differently, as requests do). One batch
    size and lane per slice (~0.1-1.5 s on the demo model at B = 8)."""
    from .batch import Batch, Sequence as BatchSequence

    ids = prompt_ids or chat_prompt_ids(adapter, [{"role": "user", "content": "Define the word harbor."}])
    prompt, shared = Prompt(tuple(ids), (len(ids) - 1,)), shared or PrefixCache(2**40)
    if ar_lane is None:
        lane: Dict[int, float] = {}
        for _ in cycle_rounds(adapter, sampler, 0, steps=steps, rounds=1, prompt_ids=ids, shared=shared, out=lane):
            pass
        ar_lane = lane[0]

    def per_step(size: int, depth: int) -> float:
        batch = Batch(adapter)
        for k in range(size):
            d = (AutoregressiveDecoder(adapter, sampler=sampler, seed=k, prefix_cache=shared) if depth == 0 else
                 SpeculativeDecoder(adapter, sampler=sampler, seed=k, depth=depth, prefix_cache=shared))
            batch.join(BatchSequence(d, prompt, (steps + warm + 2) * (depth + 1)))
        times = []
        for n in range(steps + warm):
            if len(batch.running) < size:   # one ended (EOS): what is timed is a batch of `size`
                break
            t0 = time.perf_counter()
            batch.step()
            if n >= warm:
                times.append(time.perf_counter() - t0)
        for s in list(batch.running):
            batch.leave(s)
        return statistics.median(times) if times else float("nan")

    for size in sizes:
        ar_s = per_step(size, 0)
        row = {0: ar_s / ar_lane}
        yield f"batch {size}: AR"
        for depth in range(1, max_depth + 1):
            row[depth] = per_step(size, depth) / ar_s
            yield f"batch {size}: depth {depth}"
        # A size whose sequences kept ending early is not known (NaN): not kept, measured again later.
        known = {d: v for d, v in row.items() if v == v}
        if out is not None and 0 in known and len(known) > 1:
            out[size] = known


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
