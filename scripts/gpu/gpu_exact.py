#!/usr/bin/env python3
"""Is greedy MTP the AR text on this GPU, and what does exactness cost? (issue 20)

    python scripts/gpu/gpu_exact.py --model /tmp/q9b --json out/exact_9b.json [--tokens 512]

1. Greedy parity: AR and MTP at depths 1-3, `--tokens` tokens, on four prompts; the first
   differing token if any.
2. Through the prefix cache: a three-turn conversation whose turns 2-3 restore from the cache,
   MTP (depth 2) compared with AR restored from the same snapshot.
3. A sampled check: tokens 2-3 of many seeded runs, MTP (depth 2) vs AR (T=1, top-k 4), chi-square.
4. The cost of exactness: a verify of width 2-4 in AR steps with the row-invariant attention
   (mlx_ops.row_invariant_sdpa) on and off, at each `--context`.

Exits 1 if a greedy or sampled check fails.
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
from core import (AutoregressiveDecoder, PrefixCache, Prompt, SamplerConfig, SpeculativeDecoder,  # noqa: E402
                  chat_prompt, history_prompt)
from core.chat import padded_chat_prompt  # noqa: E402
from core.stream import cache_history, prefill  # noqa: E402

PROMPTS = ["Define the word harbor.", "Write a Python function that reverses a linked list.",
           "Tell me a long story about a lighthouse keeper and a storm.",
           "List the planets of the solar system with one fact about each."]
GREEDY = SamplerConfig(0.0, 1.0, 0, 0.0)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def greedy_parity(ad, tokens: int, depths, fails: list, context: int = 0) -> list:
    """Greedy AR and MTP at each depth on every prompt; with `context`, each prompt comes after
    filler text to about that many tokens (a long chat's decode, where attention reads far back)."""
    rows = []
    for text in PROMPTS:
        prompt = padded_chat_prompt(ad, text, context) if context else chat_prompt(ad, [{"role": "user", "content": text}])
        ar, st = AutoregressiveDecoder(ad, sampler=GREEDY).generate(prompt, max_tokens=tokens)
        row = {"prompt": text, "context": len(prompt) if context else None, "ar_tokens": len(ar),
               "ar_tok_s": st.tokens_per_second, "mtp": {}}
        for d in depths:
            mtp, sm = SpeculativeDecoder(ad, sampler=GREEDY, depth=d).generate(prompt, max_tokens=tokens)
            diff = first_difference(ar, mtp)
            row["mtp"][str(d)] = {"identical": diff is None, "first_difference": diff, "tokens": len(mtp),
                                  "tok_s": sm.tokens_per_second, "acceptance": sm.acceptance_rate}
            if diff is not None:
                fails.append(f"greedy MTP depth {d} != AR on {text!r} at context {context} (first difference at token {diff})")
        log(f"{text[:30]!r} (context {context}): AR {len(ar)} tok; " + ", ".join(
            f"d{d} {'=' if r['identical'] else '!= at ' + str(r['first_difference'])}" for d, r in row["mtp"].items()))
        rows.append(row)
    return rows


def through_prefix_cache(ad, tokens: int, fails: list) -> list:
    """Turns 2-3 restore from the cache: AR and MTP each keep their own cache, filled the same
    way, so both restore the same snapshot and prefill the same chunks. (A prefill split at the
    restore point is not bit-identical to one prefill of the whole prompt on the GPU, so the
    restored lanes are compared with each other; a fresh AR decode is reported beside them.)"""
    caches = {"ar": PrefixCache(2**34), "mtp_d2": PrefixCache(2**34)}
    msgs, rows = [{"role": "system", "content": "You are a helpful assistant."}], []
    for turn in ["What is a harbor?", "And a lighthouse?", "Write a poem about both."]:
        msgs.append({"role": "user", "content": turn})
        prompt = chat_prompt(ad, msgs)
        fresh, _ = AutoregressiveDecoder(ad, sampler=GREEDY).generate(prompt, max_tokens=tokens)
        ar, st_ar = AutoregressiveDecoder(ad, sampler=GREEDY, prefix_cache=caches["ar"]).generate(prompt, max_tokens=tokens)
        mtp, st = SpeculativeDecoder(ad, sampler=GREEDY, depth=2, prefix_cache=caches["mtp_d2"]).generate(
            prompt, max_tokens=tokens)
        diff = first_difference(ar, mtp)
        row = {"turn": turn, "identical": diff is None, "first_difference": diff,
               "cached_tokens": {"ar": st_ar.cached_tokens, "mtp_d2": st.cached_tokens},
               "restored_vs_fresh_prefill_first_difference": first_difference(fresh, ar)}
        if diff is not None:
            fails.append(f"prefix cache, turn {turn!r}: MTP (depth 2) differs from AR at token {diff}")
        log(f"turn {turn!r}: MTP == AR {diff is None} (cached {row['cached_tokens']}); "
            f"restored vs fresh prefill: first difference {row['restored_vs_fresh_prefill_first_difference']}")
        rows.append(row)
        msgs.append({"role": "assistant", "content": ad.tokenizer.decode(ar)})
        for pc in caches.values():
            cache_history(ad, history_prompt(ad, msgs), pc)
    return rows


def sampled(ad, fails: list, samples: int, budget: float) -> dict:
    from scipy.stats import chi2_contingency

    sampler = SamplerConfig(1.0, 1.0, 4, 0.0)
    prompt = chat_prompt(ad, [{"role": "user", "content": PROMPTS[0]}])
    counts = {"ar": {}, "mtp": {}}
    start, n = time.perf_counter(), 0
    for seed in range(samples):
        if time.perf_counter() - start > budget:
            break
        n += 1
        for lane, dec in (("ar", AutoregressiveDecoder(ad, sampler=sampler, seed=seed)),
                          ("mtp", SpeculativeDecoder(ad, sampler=sampler, seed=10_000 + seed, depth=2))):
            toks, _ = dec.generate(prompt, max_tokens=4)
            counts[lane][tuple(toks[1:3])] = counts[lane].get(tuple(toks[1:3]), 0) + 1
    keys = sorted(set(counts["ar"]) | set(counts["mtp"]))
    table = [[counts["ar"].get(k, 0) for k in keys], [counts["mtp"].get(k, 0) for k in keys]]
    p = float(chi2_contingency(table)[1]) if len(keys) > 1 else 1.0
    if p <= 0.001:
        fails.append(f"sampled tokens: MTP vs AR chi-square p = {p:.2e}")
    log(f"sampled: {n} runs per lane, {len(keys)} outcomes, chi-square p = {p:.3f}")
    return {"runs_per_lane": n, "outcomes": len(keys), "chi2_p": p, "ok": p > 0.001}


def forward_and_commit(ad, cache, tokens, width: int):
    """A forward of `width` positions and the commit of one (as calibrate.py times a verify),
    not yet evaluated: (logits, the cache's state arrays)."""
    logits, _, cap = ad.forward(tokens[:, :width], cache, capture=width > 1)
    if cap is not None:
        ad.rollback(cache, cap, keep=1)
    return logits, ad.state_arrays(cache, None)


def synced_seconds(fn, n: int = 20) -> float:
    """Median seconds of fn() evaluated and synchronised, over n runs after 3 warm-ups."""
    runs = []
    for _ in range(n + 3):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval(fn())
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs[3:])


def rounds(fns: dict, repeats: int = 9) -> dict:
    """Seconds of each synchronised fn() (evaluated), the fns taking turns round by round (a drift of
    the machine's speed then touches each alike: measured one width after another, a verify of 3 once
    came out dearer than one of 4): {name: [seconds a round]}, the first two rounds left out."""
    runs = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(*fn())
            runs[k].append(time.perf_counter() - t0)
    return {k: r[2:] for k, r in runs.items()}


def forward_seconds(ad, cache, tokens, widths=(1, 2, 3, 4), repeats: int = 9) -> dict:
    """Median seconds of a synchronised forward_and_commit of each width over `tokens`, the widths
    taking turns (`rounds`)."""
    runs = rounds({w: lambda w=w: forward_and_commit(ad, cache, tokens, w) for w in widths}, repeats)
    return {w: statistics.median(r) for w, r in runs.items()}


def verify_costs(ad, context: int, widths=(1, 2, 3, 4), repeats: int = 9) -> dict:
    """Seconds of a verify of each width (forward + commit of one position, as calibrate.py
    times it) with the row-invariant attention on and off, relative to width 1."""
    ids = padded_chat_prompt(ad, PROMPTS[0], context)
    cache = ad.make_cache()
    draft = ad.make_draft(cache)
    prefill(ad, Prompt(tuple(ids), (len(ids) - 1,)), cache, draft, None)
    tokens = mx.array([ids[-8:]], dtype=mx.int32)
    few = ad.backend.few
    out = {"context": len(ids)}
    for on in (True, False):
        few.row_invariant = on
        secs = forward_seconds(ad, cache, tokens, widths, repeats)
        out["row_invariant" if on else "batched"] = {
            "ar_step_ms": secs[1] * 1e3, "verify_in_ar_steps": {str(w): secs[w] / secs[1] for w in widths}}
    few.row_invariant = True
    log(f"context {len(ids)}: " + "; ".join(f"{k}: step {v['ar_step_ms']:.2f} ms, verify "
                                            + "/".join(f"{x:.2f}" for x in v["verify_in_ar_steps"].values())
                                            for k, v in out.items() if k != "context"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--sample-budget", type=float, default=60.0)
    ap.add_argument("--context", type=int, action="append", help="verify costs at this context (repeatable)")
    ap.add_argument("--parity-context", type=int, action="append",
                    help="greedy parity again with each prompt padded to this many tokens (repeatable)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["parity", "prefix", "sampled", "costs"])
    a = ap.parse_args(argv)
    ad = load_adapter(a.model)
    log(f"loaded: {ad.describe()}")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "model": a.model, "describe": ad.describe(), "backend": ad.backend.name,
              "mlx": mx.__version__, "device": str(mx.default_device()), "tokens": a.tokens}
    fails: list = []
    steps = [("parity", lambda: greedy_parity(ad, a.tokens, a.depths, fails)),
             *((f"parity_{c}", lambda c=c: greedy_parity(ad, a.tokens, a.depths, fails, c)) for c in a.parity_context or []),
             ("prefix", lambda: through_prefix_cache(ad, min(a.tokens, 128), fails)),
             ("sampled", lambda: sampled(ad, fails, a.samples, a.sample_budget)),
             ("costs", lambda: [verify_costs(ad, c) for c in (a.context or [64])])]
    for name, step in steps:
        if name in a.skip:
            continue
        try:
            report[name] = step()
        except Exception as exc:  # noqa: BLE001  one failing step must not hide the others
            # What MLX held when it failed (a 32k parity once ran out of a 139 GiB GPU's memory).
            held = {k: getattr(mx, f"get_{k}_memory")() / 2**30 for k in ("active", "cache", "peak")}
            fails.append(f"{name}: {type(exc).__name__}: {exc}")
            log(f"{name} failed: {type(exc).__name__}: {exc}; MLX memory GiB " + json.dumps(held))
        report["failures"] = fails
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2))
    print("FAILURES:" if fails else "all checks passed", *fails, sep="\n  ")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
