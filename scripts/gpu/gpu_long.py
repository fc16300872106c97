#!/usr/bin/env python3
"""Long contexts at the real shape (issue 36): decode costs, MTP's projection and memory.

    python scripts/gpu/gpu_long.py --model /tmp/q9b --json out/long_9b.json [--context 8192 --context 32768 ...]

For each context, one prompt of that many tokens (filler, then a question) is prefilled once into
a prefix cache (its time: prefill tok/s). Then, on a copy of that state:
- synchronised forwards of 1-5 positions plus the commit of one (a verify of 2-5 in AR steps) and
  the MTP head's draft step with a greedy draw (in AR steps), all taking turns in each of 11 rounds;
  each in AR steps is the median of the rounds' own ratios (since 2026-12-04: the MTP step timed
  apart from the widths moved 0.127-0.184 between runs);
- three draft steps built one after another and evaluated once, as a cycle drafts: what each step
  after the first adds (in AR steps), the per-evaluation costs counted once;
- a greedy cycle at depths 1-3 as the MTP lane orders it (the drafts handed to the device, the
  verify built meanwhile, then evaluated): less the verify of depth + 1, what each draft costs a
  cycle; and the projection from whole cycles, which holds everything a cycle pays but sampling;
- the cost model's projection of MTP/AR at the Qwythos acceptance (0.93 / 0.90 / 0.85 per
  depth) at depths 1-3 from those parts, and its ratio to the shortest context's;
- 64 greedy tokens of AR and of MTP (depth 2) restored from the prefix cache: tok/s and peak
  memory of each (reset after the prefill, so the prefill's own peak is not counted: what
  decoding at that context holds), and whether MTP's tokens equal AR's.
Random weights accept almost no draft: the tok/s are lower bounds for MTP, the costs are real.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402

from adapters import load_adapter  # noqa: E402
from core import AutoregressiveDecoder, PrefixCache, Prompt, SamplerConfig, SpeculativeDecoder  # noqa: E402
from core.chat import padded_chat_prompt  # noqa: E402
from core.costs import expected_tokens  # noqa: E402
from core.stream import cache_prompt  # noqa: E402
from scripts.gpu.gpu_exact import forward_and_commit, rounds  # noqa: E402

GREEDY = SamplerConfig(0.0, 1.0, 0, 0.0)
QWYTHOS_ACCEPTANCE = [0.93, 0.90, 0.85]
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


def cached_prompt(ad, context: int):
    """A chat prompt of about `context` tokens prefilled into a prefix cache (all but its last
    token): (ids, the cache, the prefill's seconds, synchronised)."""
    ids = padded_chat_prompt(ad, "Summarise the text above in one sentence.", context)
    pc = PrefixCache(2**40)
    mx.synchronize()
    t0 = time.perf_counter()
    cache_prompt(ad, Prompt(tuple(ids), (len(ids) - 1,)), pc)
    mx.synchronize()
    return ids, pc, time.perf_counter() - t0


def prefilled(ad, context: int):
    """cached_prompt's prompt restored from its cache: (ids, (cache, draft, hidden))."""
    ids, pc, _ = cached_prompt(ad, context)
    return ids, restored(ad, pc, ids)


def restored(ad, pc: PrefixCache, ids):
    """A cache, the head's history and the last hidden as the prefix cache restores them (all
    but the prompt's last token)."""
    snap = pc.lookup(tuple(ids))
    cache = ad.make_cache()
    draft = ad.make_draft(cache)
    ad.restore(snap.state, cache, draft)
    return cache, draft, snap.hidden


def step_fns(ad, cache, draft, hidden, ids, widths) -> dict:
    """What a cycle is made of, each a call to evaluate: {width: a forward of that many positions
    plus the commit of one (a verify), "mtp": the head's draft step with its greedy draw}."""
    t = mx.array([ids[-1:]], dtype=mx.int32)
    toks = mx.array([ids[-8:]], dtype=mx.int32)
    fns = {w: lambda w=w: forward_and_commit(ad, cache, toks, w) for w in widths}
    fns["mtp"] = lambda: [mx.argmax(ad.draft_step(draft, cache, hidden, t)[1], axis=-1)]
    fns["mtp3"] = lambda: chained_drafts(ad, draft, cache, hidden, t, 3)
    for d in (1, 2, 3):
        if d + 1 in widths:
            fns[f"cycle{d}"] = lambda d=d: greedy_cycle(ad, draft, cache, hidden, t, d)
    return fns


def greedy_cycle(ad, draft, cache, hidden, t, depth: int):
    """A greedy cycle's device work as the MTP lane orders it (core/decoders.py): `depth` draft
    steps chained and handed to the device, the verify of [t, drafts] built meanwhile, then the
    commit of one position (as the verifies here). Less a verify of depth + 1: what the drafts
    cost a cycle, their host build and the evaluation they overlap included."""
    drafts = mx.concatenate(chained_drafts(ad, draft, cache, hidden, t, depth), axis=1)
    mx.async_eval(drafts)   # the head computes while the verify graph is built
    return forward_and_commit(ad, cache, mx.concatenate([t, drafts], axis=1), depth + 1)


def chained_drafts(ad, draft, cache, hidden, t, n: int) -> list:
    """n greedy draft steps built one after another and evaluated once, as a cycle drafts (each
    step's g and argmax feed the next; the lane waits for none of them before the verify)."""
    out = []
    for _ in range(n):
        hidden, logits = ad.draft_step(draft, cache, hidden, t)
        t = mx.argmax(logits, axis=-1)[None]
        out.append(t)
    return out


def step_costs(ad, cache, draft, hidden, ids, widths=(1, 2, 3, 4, 5), repeats: int = 11) -> dict:
    """Synchronised forwards of each width (plus the commit of one position: a verify) and the MTP
    head's draft step with its greedy draw, all taking turns within each round, so that each round's
    costs share the machine's speed of that moment (a GPU host drifts 10-30 % in minutes): per width
    the median seconds, and each cost in AR steps as the median of the rounds' own ratios. The first
    two rounds are left out."""
    kept = rounds(step_fns(ad, cache, draft, hidden, ids, widths), repeats)
    ratio = lambda k: statistics.median(a / b for a, b in zip(kept[k], kept[widths[0]]))  # noqa: E731
    return {"seconds": {k: statistics.median(r) for k, r in kept.items()},
            "in_ar_steps": {k: ratio(k) for k in kept}}


def decode(ad, pc, ids, lane: str, tokens: int):
    dec = (AutoregressiveDecoder(ad, sampler=GREEDY, prefix_cache=pc) if lane == "ar"
           else SpeculativeDecoder(ad, sampler=GREEDY, depth=2, prefix_cache=pc))
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    out, st = dec.generate(ids, max_tokens=tokens)
    return list(out), {"tok_s": st.tokens_per_second, "peak_gib": mx.get_peak_memory() / 2**30,
                       "cached_tokens": st.cached_tokens}


def one_context(ad, context: int, tokens: int) -> dict:
    ids, pc, prefill_s = cached_prompt(ad, context)
    cache, draft, hidden = restored(ad, pc, ids)
    measured = step_costs(ad, cache, draft, hidden, ids)
    step = measured["seconds"][1]
    costs = {w: measured["in_ar_steps"][w] for w in (1, 2, 3, 4, 5)}
    mtp = measured["in_ar_steps"]["mtp"]
    # What one more draft adds inside a cycle's one evaluation: the per-evaluation costs (the graph's
    # launch, the wait, the return to Python) counted once, as the lane pays them.
    chained = (measured["in_ar_steps"]["mtp3"] - mtp) / 2
    projection = {d: expected_tokens(QWYTHOS_ACCEPTANCE, d) / (costs[d + 1] + d * mtp) for d in (1, 2, 3)}
    # The drafts as a cycle pays for them, per draft: the whole cycle less its verify, over its depth.
    in_cycle = {d: (measured["in_ar_steps"][f"cycle{d}"] - costs[d + 1]) / d for d in (1, 2, 3)}
    cycle_projection = {d: expected_tokens(QWYTHOS_ACCEPTANCE, d) / measured["in_ar_steps"][f"cycle{d}"]
                        for d in (1, 2, 3)}
    ar_ids, ar = decode(ad, pc, ids, "ar", tokens)
    mtp_ids, md = decode(ad, pc, ids, "mtp", tokens)
    row = {"context": len(ids), "prefill_s": prefill_s, "prefill_tok_s": (len(ids) - 1) / prefill_s,
           "ar_step_ms": step * 1e3, "verify_in_ar_steps": {str(w): c for w, c in costs.items()},
           "mtp_step_in_ar_steps": mtp, "mtp_chained_step_in_ar_steps": chained, "projected_mtp_vs_ar": {str(d): p for d, p in projection.items()},
           "cycle_in_ar_steps": {str(d): measured["in_ar_steps"][f"cycle{d}"] for d in (1, 2, 3)},
           "mtp_step_in_cycle_in_ar_steps": {str(d): c for d, c in in_cycle.items()},
           "projected_from_cycles": {str(d): p for d, p in cycle_projection.items()},
           "ar": ar, "mtp_d2": md, "mtp_peak_over_ar": md["peak_gib"] / ar["peak_gib"],
           "greedy_mtp_equals_ar": ar_ids == mtp_ids}
    log(f"context {len(ids)}: prefill {row['prefill_tok_s']:.0f} tok/s; step {step * 1e3:.2f} ms, verify "
        + "/".join(f"{costs[w]:.2f}" for w in (2, 3, 4, 5)) + f", MTP step {mtp:.2f} ({chained:.2f} chained; in a cycle "
        + "/".join(f"{in_cycle[d]:.2f}" for d in (1, 2, 3)) + " a draft at depths 1/2/3); projected "
        + "/".join(f"{projection[d]:.2f}x" for d in (1, 2, 3)) + " (from whole cycles "
        + "/".join(f"{cycle_projection[d]:.2f}x" for d in (1, 2, 3)) + f"); peak AR {ar['peak_gib']:.2f} GiB, "
        f"MTP {md['peak_gib']:.2f} GiB; MTP == AR {row['greedy_mtp_equals_ar']}")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--context", type=int, action="append", help="tokens of context (repeatable)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens decoded per lane for speed and memory")
    a = ap.parse_args(argv)
    ad = load_adapter(a.model)
    log(f"loaded: {ad.describe()}")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()), "model": a.model,
              "describe": ad.describe(), "acceptance": QWYTHOS_ACCEPTANCE, "contexts": []}
    for context in a.context or [64, 8192, 32768, 131072]:
        try:
            report["contexts"].append(one_context(ad, context, a.tokens))
        except Exception as exc:  # noqa: BLE001  one context failing (memory, time) must not hide the others
            report["contexts"].append({"context": context, "error": f"{type(exc).__name__}: {exc}"})
            log(f"context {context}: {type(exc).__name__}: {exc}")
        rows = [r for r in report["contexts"] if "projected_mtp_vs_ar" in r]
        if rows:
            base = rows[0]["projected_mtp_vs_ar"]
            for r in rows:
                r["projection_vs_shortest"] = {d: r["projected_mtp_vs_ar"][d] / base[d] for d in base}
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
