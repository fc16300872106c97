#!/usr/bin/env python3
"""Prompt prefill on a GPU: the one-launch recurrence of a chunk (kernels/gdn.py gated_delta_prefill).

    python scripts/gpu/gpu_prefill.py --model /tmp/q9b --json out/prefill.json
    python scripts/gpu/gpu_prefill.py --model models/demo --json /tmp/p.json --stand-in \\
        --check-lengths 1 7 64 --layer-tokens 64 --lengths 300 600 --sweep-length 600 --chunks 128 256   # any machine

Why: mlx-lm's recurrence has no CUDA kernel (gated_delta_ops: a Python loop of ~10 ops a
position), so an 8k-token prompt took ~20 s (~400 tok/s) to prefill on the H200.
1. The kernel against gdn.gated_delta_reference at the 9B Gated-DeltaNet shape (16 key heads,
   32 value heads, Dk = Dv = 128, bf16) at each --check-lengths T: y and the final state
   relative to their largest value, and the positions cut in two launches == one launch bit for bit.
2. One layer's recurrence over a --layer-tokens chunk (synchronised, median): the kernel vs
   mlx-lm's gated_delta_ops.
3. Prefill of each --lengths prompt (random tokens) through core.stream.prefill with the loaded
   adapter against mlx-lm's own model on the same weights, run in chunks of the same size with
   its own cache (as generate_step does before its first token): tok/s, their ratio, the
   peak memory of each (mx.get_peak_memory, reset before each), and how far the last
   position's logits are apart.
   At the --fp32-reference length (the first --lengths; 0: none), mlx-lm's model on the same
   weights with its activations in float32 gives the reference both are held to: which of the
   two bf16 prefills is nearer (their logits differed by 7-10 % at 2k-32k on random weights).
4. Our prefill of a --sweep-length prompt at each --chunks size (core/stream.py PREFILL_CHUNK is
   512: change it only on such a measurement).
--stand-in runs the reference in the kernel's place and the prefill runner on whatever device
this is (checks this script's plumbing on a CPU). Exits 1 if a check fails or the loaded model's
prefill runner is not the kernel's.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.models.gated_delta import gated_delta_ops  # noqa: E402

from adapters import load_adapter  # noqa: E402
from adapters.kernels import gdn, rel_err  # noqa: E402
from adapters.qwen3_5 import backends  # noqa: E402
from core import Prompt  # noqa: E402
from core import stream  # noqa: E402
from scripts.gpu.gpu_exact import synced_seconds  # noqa: E402

SHAPE_9B = (16, 32, 128, 128)  # Hk, Hv, Dk, Dv
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


def stand_in(q, k, v, g, beta, state):
    """The kernel's contract from the fp32 reference: y in q's dtype, the last state."""
    y, final = reference(q, k, v, g, beta, state)
    return y.astype(q.dtype), final


def reference(q, k, v, g, beta, state):
    """gated_delta_reference's y and last state, the other states let go before evaluation."""
    y, states = gdn.gated_delta_reference(q, k, v, g, beta, state)
    final = states[-1]
    del states
    mx.eval(y, final)
    return y, final


def check_kernel(T: int) -> dict:
    """The kernel at T positions against the reference, and cut in two launches vs one."""
    args = gdn.random_inputs(mx.random.key(T), T, *SHAPE_9B, dtype=mx.bfloat16)
    y, final = gdn.gated_delta_prefill(*args)
    y_ref, final_ref = reference(*args)
    row = {"y": rel_err(y, y_ref), "state": rel_err(final, final_ref)}
    cut = T // 2
    if cut:
        q, k, v, g, beta, state = args
        y1, mid = gdn.gated_delta_prefill(*(a[:, :cut] for a in (q, k, v, g, beta)), state)
        y2, end = gdn.gated_delta_prefill(*(a[:, cut:] for a in (q, k, v, g, beta)), mid)
        row["cut_equal"] = bool(mx.array_equal(mx.concatenate([y1, y2], axis=1), y)) and bool(mx.array_equal(end, final))
    row["ok"] = row["y"] < 0.02 and row["state"] < 1e-3 and row.get("cut_equal", True)
    return row


def layer_ms(T: int) -> dict:
    """One 9B Gated-DeltaNet layer's recurrence over a T-token chunk: the kernel vs mlx-lm's ops."""
    args = gdn.random_inputs(mx.random.key(0), T, *SHAPE_9B, dtype=mx.bfloat16)
    mx.eval(*args)
    ms = {"kernel": synced_seconds(lambda: gdn.gated_delta_prefill(*args), n=10) * 1e3,
          "gated_delta_ops": synced_seconds(lambda: gated_delta_ops(*args), n=3) * 1e3}
    return {"tokens": T, **ms, "speedup": ms["gated_delta_ops"] / ms["kernel"]}


def measured(fn) -> dict:
    """fn() synchronised: seconds, the peak memory, and its part above what was held before (GB)."""
    mx.synchronize()
    mx.reset_peak_memory()
    held = mx.get_active_memory()
    t0 = time.perf_counter()
    out = fn()
    mx.synchronize()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_gb": mx.get_peak_memory() / 1e9, "above_held_gb": (mx.get_peak_memory() - held) / 1e9,
            "out": out}


def ours(ad, ids, chunk: int):
    """The adapter's prefill (the AR lane's: no drafter, no prefix cache) -> last logits."""
    cache = ad.make_cache()
    return stream.prefill(ad, Prompt(tuple(ids)), cache, None, chunk=chunk).logits


def mlx_lm_prefill(model, ids, chunk: int):
    """mlx-lm's model over the prompt as generate_step prefills it: all but the last token in
    chunks with its own cache, each chunk's cache evaluated (its logits never), then the last
    token's step -> its logits."""
    cache, tokens = make_prompt_cache(model), mx.array(ids, dtype=mx.int32)[None]
    for a in range(0, len(ids) - 1, chunk):
        model(tokens[:, a:min(a + chunk, len(ids) - 1)], cache=cache)
        mx.eval([c.state for c in cache])
    logits = model(tokens[:, -1:], cache=cache)[:, -1]
    mx.eval(logits)
    return logits


def best(fn, repeats: int) -> dict:
    """The fastest of `repeats` measured runs (its peak memory with it)."""
    runs = [measured(fn) for _ in range(repeats)]
    return min(runs, key=lambda r: r["seconds"])


def prompt_ids(ad, L: int) -> list:
    """L random tokens (the same for every run of this length): prefill's cost is the length's."""
    vocab = min(ad.tokenizer.vocab_size, ad.inner.embed_tokens.weight.shape[0])  # no row past the table
    return mx.random.randint(0, vocab, (L,), key=mx.random.key(L)).tolist()


def prefill_row(ad, L: int, chunk: int, repeats: int) -> dict:
    """Our prefill and mlx-lm's of one L-token prompt: tok/s, ratio, memory, logits apart."""
    ids, row, logits = prompt_ids(ad, L), {}, {}
    for name, fn in (("ours", lambda: ours(ad, ids, chunk)), ("mlx_lm", lambda: mlx_lm_prefill(ad.model, ids, chunk))):
        r = best(fn, repeats)
        row[name] = {"tok_s": L / r["seconds"], "seconds": r["seconds"], "peak_gb": r["peak_gb"],
                     "above_held_gb": r["above_held_gb"]}
        logits[name] = r["out"].astype(mx.float32)
    row["ratio"] = row["ours"]["tok_s"] / row["mlx_lm"]["tok_s"]
    row["logits_rel_err"] = rel_err(logits["ours"], logits["mlx_lm"])
    row["same_argmax"] = bool((mx.argmax(logits["ours"], axis=-1) == mx.argmax(logits["mlx_lm"], axis=-1)).all())
    return row


def fp32_reference(model_path: str, ad, L: int, chunk: int, row: dict) -> None:
    """mlx-lm's model with every float parameter in float32 (quantized weights stay as stored;
    their scales in float32 too) over the L-token prompt: each bf16 prefill's logits against it."""
    from mlx_lm import load as mlx_lm_load

    model, _ = mlx_lm_load(model_path)
    model.set_dtype(mx.float32)
    ids = prompt_ids(ad, L)
    ref = mlx_lm_prefill(model, ids, chunk).astype(mx.float32)
    for name, fn in (("ours", lambda: ours(ad, ids, chunk)), ("mlx_lm", lambda: mlx_lm_prefill(ad.model, ids, chunk))):
        got = fn().astype(mx.float32)
        row[f"{name}_vs_fp32"] = rel_err(got, ref)
        row[f"{name}_argmax_as_fp32"] = bool((mx.argmax(got, axis=-1) == mx.argmax(ref, axis=-1)).all())
    del model


def sweep(ad, L: int, chunks, repeats: int) -> dict:
    ids = prompt_ids(ad, L)
    rows = {}
    for chunk in chunks:
        r = best(lambda: ours(ad, ids, chunk), repeats)
        rows[chunk] = {"tok_s": L / r["seconds"], "peak_gb": r["peak_gb"], "above_held_gb": r["above_held_gb"]}
        log(f"sweep {L} tokens, chunk {chunk}: {rows[chunk]['tok_s']:.0f} tok/s, peak {r['peak_gb']:.2f} GB")
    return {"length": L, "chunks": rows, "fastest": max(rows, key=lambda c: rows[c]["tok_s"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--stand-in", action="store_true", help="the reference in the kernel's place")
    ap.add_argument("--check-lengths", type=int, nargs="+", default=[1, 7, 512, 2048])
    ap.add_argument("--layer-tokens", type=int, default=512)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--chunk", type=int, default=stream.PREFILL_CHUNK, help="chunk size of the --lengths runs")
    ap.add_argument("--fp32-reference", type=int, default=None,
                    help="prompt length held to a float32 run of mlx-lm's model (default: the first --lengths; 0: none)")
    ap.add_argument("--sweep-length", type=int, default=8192)
    ap.add_argument("--chunks", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args(argv)
    if a.stand_in:
        gdn.gated_delta_prefill = stand_in
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()), "stand_in": a.stand_in,
              "kernel_checks": {}}
    fails = 0
    for T in a.check_lengths:
        report["kernel_checks"][T] = row = check_kernel(T)
        fails += not row["ok"]
        log(f"kernel at T={T}: {row}")
    report["layer_ms"] = layer_ms(a.layer_tokens)
    log(f"one layer's recurrence: {report['layer_ms']}")
    ad = load_adapter(a.model, compute_dtype="native")
    if a.stand_in:
        ad.backend.long = backends.GpuPrefill()
    report["backend"], report["long_runner"] = ad.backend.name, type(ad.backend.long).__name__
    if not isinstance(ad.backend.long, backends.GpuPrefill):
        fails += 1
        log(f"the prefill runner is {report['long_runner']} ({ad.backend.note}): the kernel is not in use")
    warm = prompt_ids(ad, min(a.lengths))  # compile what the first prefill compiles, on both sides
    ours(ad, warm, a.chunk)
    mlx_lm_prefill(ad.model, warm, a.chunk)
    report["prefill"] = {}
    for L in a.lengths:
        report["prefill"][L] = row = prefill_row(ad, L, a.chunk, a.repeats)
        log(f"prefill {L} tokens: ours {row['ours']['tok_s']:.0f} tok/s, mlx_lm {row['mlx_lm']['tok_s']:.0f} tok/s "
            f"({row['ratio']:.2f}x), peak {row['ours']['peak_gb']:.2f} / {row['mlx_lm']['peak_gb']:.2f} GB, "
            f"logits rel err {row['logits_rel_err']:.2e}")
    L32 = a.lengths[0] if a.fp32_reference is None else a.fp32_reference
    if L32:
        report["fp32_reference"] = row = {"tokens": L32}
        fp32_reference(a.model, ad, L32, a.chunk, row)
        log(f"against float32 at {L32} tokens: ours {row['ours_vs_fp32']:.2e} (argmax "
            f"{'same' if row['ours_argmax_as_fp32'] else 'differs'}), mlx_lm {row['mlx_lm_vs_fp32']:.2e} "
            f"(argmax {'same' if row['mlx_lm_argmax_as_fp32'] else 'differs'})")
    report["chunk_sweep"] = sweep(ad, a.sweep_length, a.chunks, a.repeats)
    log(f"fastest chunk at {a.sweep_length} tokens: {report['chunk_sweep']['fastest']}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=1))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
