#!/usr/bin/env python3
"""Where a warm agent turn's prefill time goes: one chunk of new tokens after a restored snapshot.

    python scripts/gpu/gpu_chunk_probe.py --model /tmp/q9b --depth 20000 --json out.json
        [--tokens 5 64 200 512] [--repeats 3]

Why: on the H200 (docs/bench/2026-12-03/GPU.md, section 11) a warm turn of the agent session
prefilled its new tokens at about 0.30 s + 0.175 ms a token at ~21k tokens of depth, where a
512-token chunk of the first turn took 0.10 s on average: a fixed ~0.3 s a turn, in its first
chunk. This takes one such chunk apart, on the engine's own prefill path (core/stream.py):
a prompt of `--depth` tokens is prefilled once with a mark at its end (a snapshot in an
in-memory prefix cache, as the app keeps them), then for each size N of new tokens, repeatedly
and in turn: fresh caches, the snapshot restored (`restore`, then its arrays evaluated: `restore_s`),
the N tokens through the trunk (`trunk_s`: forward and evaluation of the caches), the drafter
absorbing them (`absorb_s`), each timed to a synchronisation. The same again with the restored
KV arrays copied first (`copied`: the chunk's writes then update buffers no snapshot holds,
which they can do in place), and the whole chunk as the engine runs it (`prefill_chunks`, its
`prefill_parts`). The first repeat of a size shows what a first use costs (compiles, plans),
the others the steady state. Last, `first_use`: fresh lengths' first and second chunk, alternately
with the long runner's own conv and with MLX's conv1d (which builds a cuDNN plan per shape).
Then `overlap`: whole prefills as the engine runs them (`--overlap` new tokens after the
snapshot, a warm agent turn's sizes, and `--fresh-prefill` tokens from nothing), with chunks
overlapping or not (core.stream.PIPELINE) and the long runner handing the device its layers
every 4 or only at the end (`submit_every`), the four variants in turn, medians of `--repeats`.
Last, `cleared`: the same continuation with MLX's buffer cache kept or emptied just before
(mx.clear_cache, what the disk cache did after each write until 2026-12-03), then emptied with
the CUDA memory pool told to keep what it frees (its release threshold at the maximum).
With `--depths`, `by_depth`: each size as the engine runs it after a snapshot at each depth (0:
a fresh prompt of that size), medians of the repeats after the first: what of a chunk's time
grows with the context behind it and what does not.
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
import adapters  # noqa: E402,F401  (first: BLAS preload, the kernel cache's folder)
import mlx.core as mx  # noqa: E402

from adapters import load_adapter  # noqa: E402
from core import PrefixCache  # noqa: E402
from core.stream import Prompt, prefill_chunks, run_through  # noqa: E402

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


def sync() -> float:
    mx.synchronize()
    return time.perf_counter()


def one_chunk(ad, pc, prompt: Prompt, depth: int, copied: bool) -> dict:
    """Restore the snapshot at `depth`, then run prompt[depth:] as one chunk, each part timed."""
    cache = ad.make_cache()
    draft = ad.make_draft(cache)
    snap = pc.lookup(prompt.key)
    assert snap is not None and snap.length == depth, "the snapshot at the mark was not found"
    t = sync()
    ad.restore(snap.state, cache, draft)
    if copied:   # buffers of their own: nothing else holds them, the chunk's writes can go in place
        for c in list(cache) + [draft]:
            if hasattr(c, "keys") and c.keys is not None:
                c.keys, c.values = mx.array(c.keys) + 0, mx.array(c.values) + 0
    mx.eval(ad.state_arrays(cache, draft))
    t1 = sync()
    tokens = mx.array(prompt.ids[depth:], dtype=mx.int32)[None]
    logits, hidden, _ = ad.forward(tokens, cache, all_logits=False, fast=False)
    mx.eval(logits, hidden, ad.state_arrays(cache, None))
    t2 = sync()
    hs = mx.concatenate([snap.hidden, hidden[:, :-1]], axis=1)
    ad.absorb(draft, cache, hs, tokens[:, -hs.shape[1]:])
    mx.eval(draft.state)
    t3 = sync()
    return {"restore_s": t1 - t, "trunk_s": t2 - t1, "absorb_s": t3 - t2, "total_s": t3 - t}


def engine_chunk(ad, pc, prompt: Prompt) -> dict:
    """The same chunk as the engine runs it (lookup, restore, forward, absorb, one evaluation)."""
    cache = ad.make_cache()
    draft = ad.make_draft(cache)
    t = sync()
    done = run_through(prefill_chunks(ad, prompt, cache, draft, pc))
    return {"total_s": sync() - t, "parts": done.parts}


def first_use(ad, pc, ids, depth: int, fresh: list) -> dict:
    """A chunk length's first use against its second, with the long runner's conv as it is and
    with MLX's conv1d (cuDNN, a plan per input shape) in its place: each length in `fresh` is
    new to the process when it runs (the first with ours, the second with MLX's, and so on)."""
    from adapters.qwen3_5.mlx_ops import MlxOps

    run = getattr(getattr(ad, "backend", None), "long", None)
    own = getattr(type(run), "conv", None) if run is not None else None
    out = {}
    for i, n in enumerate(fresh):
        which = "ours" if i % 2 == 0 else "mlx_conv1d"
        if which == "mlx_conv1d" and own is not None:
            type(run).conv = MlxOps.conv
        try:
            prompt = Prompt(tuple(ids[:depth + n]), ())
            times = [one_chunk(ad, pc, prompt, depth, copied=False)["total_s"] for _ in range(2)]
        finally:
            if own is not None:
                type(run).conv = own
        out[str(n)] = {"conv": which, "first_s": times[0], "second_s": times[1]}
        log(f"first use of {n} new tokens, conv {which}: {times[0]:.3f} s, then {times[1]:.3f} s")
    return out


def overlap(ad, pc, ids, depth: int, sizes: list, fresh_n: int, repeats: int) -> dict:
    """Whole prefills (`engine_chunk`) under pipeline on/off x submit_every 4/0, in turn."""
    from core import stream

    run = getattr(getattr(ad, "backend", None), "long", None)
    every = getattr(run, "submit_every", 0)
    variants = {"pipeline+submit": (True, every), "pipeline": (True, 0), "submit": (False, every), "neither": (False, 0)}
    prompts = {f"{n} after {depth}": Prompt(tuple(ids[:depth + n]), ()) for n in sizes}
    if fresh_n:
        prompts[f"{fresh_n} fresh"] = Prompt(tuple(ids[:fresh_n]), ())
    times = {k: {v: [] for v in variants} for k in prompts}
    builds = {k: {v: [] for v in variants} for k in prompts}
    try:
        for r in range(repeats):
            for name, prompt in prompts.items():
                for v, (pipe, sub) in (variants.items() if r % 2 == 0 else reversed(variants.items())):
                    stream.PIPELINE = pipe
                    if run is not None:
                        run.submit_every = sub
                    got = engine_chunk(ad, pc if "after" in name else None, prompt)
                    times[name][v].append(got["total_s"])
                    builds[name][v].append(got["parts"].get("build_s", 0.0))
                log(f"overlap repeat {r}, {name}: " + ", ".join(f"{v} {times[name][v][-1]:.3f} s" for v in variants))
    finally:
        stream.PIPELINE = None
        if run is not None:
            run.submit_every = every
    out = {}
    for name in prompts:
        out[name] = {v: {"median_s": statistics.median(times[name][v][1:] or times[name][v]),
                         "build_s": statistics.median(builds[name][v][1:] or builds[name][v]),
                         "runs_s": times[name][v]} for v in variants}
        log(f"overlap {name}: " + ", ".join(f"{v} {x['median_s']:.3f} s (build {x['build_s']:.3f})"
                                            for v, x in out[name].items()))
    return out


def keep_pool() -> str:
    """The device's default CUDA memory pool keeps freed memory reserved (release threshold at the
    maximum) instead of handing it back at each synchronisation: the driver API, as MLX's
    allocator uses that pool. Returns what happened."""
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, pool = ctypes.c_int(), ctypes.c_void_p()
        rc = [cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(dev), 0),
              cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev)]
        rc.append(cu.cuMemPoolSetAttribute(pool, 4, ctypes.byref(ctypes.c_uint64(2**64 - 1))))
        return "kept" if not any(rc) else f"failed {rc}"
    except OSError as exc:
        return f"failed: {exc}"


def cleared(ad, pc, ids, depth: int, n: int, repeats: int) -> dict:
    """A continuation of n tokens with MLX's buffer cache kept or emptied before it, in turn;
    then emptied with the pool keeping its memory (`keep_pool`)."""
    prompt = Prompt(tuple(ids[:depth + n]), ())
    got = {"kept": [], "cleared": []}
    for r in range(repeats + 1):
        for v in (("kept", "cleared") if r % 2 == 0 else ("cleared", "kept")):
            if v == "cleared":
                mx.clear_cache()
            got[v].append(engine_chunk(ad, pc, prompt)["total_s"])
    got["pool"] = keep_pool()
    got["cleared, pool kept"] = []
    for _ in range(repeats + 1):
        mx.clear_cache()
        mx.synchronize()
        got["cleared, pool kept"].append(engine_chunk(ad, pc, prompt)["total_s"])
    med = {k: statistics.median(v[1:]) for k, v in got.items() if isinstance(v, list)}
    log(f"cleared, {n} new tokens after {depth}: " + ", ".join(f"{k} {v:.3f} s" for k, v in med.items())
        + f" (pool: {got['pool']})")
    return {"tokens": n, "median_s": med, **got}


def by_depth(ad, pc, ids, depths: list, sizes: list, repeats: int) -> dict:
    """Each size after each depth's snapshot (0: fresh), as the engine runs it, in turn."""
    got = {f"{d}+{n}": [] for d in depths for n in sizes}
    for _ in range(repeats + 1):
        for d in depths:
            for n in sizes:
                got[f"{d}+{n}"].append(engine_chunk(ad, pc if d else None, Prompt(tuple(ids[:d + n]), ()))["total_s"])
    out = {k: {"median_s": statistics.median(v[1:]), "first_s": v[0]} for k, v in got.items()}
    for k, v in out.items():
        log(f"by depth, {k}: {v['median_s']:.4f} s (first {v['first_s']:.4f})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--depth", type=int, default=20000)
    ap.add_argument("--tokens", type=int, nargs="+", default=[5, 64, 200, 512])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fresh", type=int, nargs="*", default=[37, 41, 91, 97],
                    help="lengths new to the process, alternately with our conv and MLX's conv1d (first_use)")
    ap.add_argument("--overlap", type=int, nargs="*", default=[961, 2737],
                    help="new tokens after the snapshot for the overlap table (none: skip it)")
    ap.add_argument("--fresh-prefill", type=int, default=8192, help="tokens from nothing for the overlap table")
    ap.add_argument("--depths", type=int, nargs="*", default=[],
                    help="also each size after a snapshot at each of these depths (0: fresh; by_depth)")
    a = ap.parse_args(argv)

    ad = load_adapter(a.model)
    log(f"loaded: {ad.describe()}")
    vocab = min(ad.vocab_size, 150_000)
    ids = [(7919 * i + 13) % (vocab - 1000) + 500 for i in range(max(a.depth + max(a.tokens + a.fresh + a.overlap), a.fresh_prefill))]
    pc = PrefixCache(64 << 30)
    cache = ad.make_cache()
    draft = ad.make_draft(cache)
    t = sync()
    marks = tuple(sorted({a.depth} | {d for d in a.depths if 0 < d <= a.depth}))
    run_through(prefill_chunks(ad, Prompt(tuple(ids[:a.depth + 1]), marks), cache, draft, pc))
    log(f"prefilled {a.depth + 1} tokens in {sync() - t:.2f} s; snapshots: {len(pc)}")
    del cache, draft

    out = {"model": a.model, "describe": ad.describe(), "mlx": mx.__version__, "depth": a.depth,
           "commit": _commit(), "sizes": {}}
    for n in a.tokens:
        out["sizes"][str(n)] = {"restored": [], "copied": [], "engine": []}
    for r in range(a.repeats):
        for n in a.tokens:
            prompt = Prompt(tuple(ids[:a.depth + n]), ())
            row = out["sizes"][str(n)]
            row["restored"].append(one_chunk(ad, pc, prompt, a.depth, copied=False))
            row["copied"].append(one_chunk(ad, pc, prompt, a.depth, copied=True))
            row["engine"].append(engine_chunk(ad, pc, prompt))
            got = row["restored"][-1]
            log(f"repeat {r}, {n} new tokens: restored {got['total_s']:.3f} s (restore {got['restore_s']:.3f}, "
                f"trunk {got['trunk_s']:.3f}, absorb {got['absorb_s']:.3f}); copied first "
                f"{row['copied'][-1]['total_s']:.3f} s; engine {row['engine'][-1]['total_s']:.3f} s")
    for n, row in out["sizes"].items():
        later = lambda k, part="total_s": statistics.median(x[part] for x in row[k][1:]) if len(row[k]) > 1 else None
        row["median_after_first"] = {k: later(k) for k in ("restored", "copied", "engine")}
        row["median_after_first_parts"] = {p: later("restored", p) for p in ("restore_s", "trunk_s", "absorb_s")}
    if a.depths:
        out["by_depth"] = by_depth(ad, pc, ids, a.depths, a.tokens, a.repeats)
    out["first_use"] = first_use(ad, pc, ids, a.depth, a.fresh)
    if a.overlap:
        out["overlap"] = overlap(ad, pc, ids, a.depth, a.overlap, a.fresh_prefill, a.repeats)
        if mx.default_device() == mx.gpu:
            out["cleared"] = cleared(ad, pc, ids, a.depth, a.overlap[0], a.repeats)
    Path(a.json).write_text(json.dumps(out, indent=1))
    for n, row in out["sizes"].items():
        log(f"{n:>4} new tokens, medians after the first: {row['median_after_first']} "
            f"parts {row['median_after_first_parts']}")
    log(f"wrote {a.json}")
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[2], timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


if __name__ == "__main__":
    sys.exit(main())
