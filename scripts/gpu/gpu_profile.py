#!/usr/bin/env python3
"""Where a GPU decode step's time goes: the few-token runner's parts switched one at a time.

    python scripts/gpu/gpu_profile.py --model /tmp/q9b --json out/profile.json [--tokens 128]

Why: with the CUDA row kernel, the AR lane ran at 0.74-0.82x mlx_lm.stream_generate at the 9B
shape (issue 20); this found the row kernel slower than MLX's own matmul for a decode step.
Each variant replaces the few runner (`adapter.backend.few`), so prefill, sampling and the lanes
stay the same:

    default   as loaded (cuda-kernels: each layer's few-token forward compiled, the row kernel for
              quantized linears of 1-8 rows, joined projections and fused residuals, the
              one-launch recurrence kernel)
    eager     the same, not compiled (each op built from Python)
    fused-gdn  the default with each Gated-DeltaNet layer's middle as one launch (kernels/gdn_fused.py;
              check it first with scripts/gpu/gpu_fused_gdn.py)
    all-kernels  fused-gdn plus the few-row attention kernel (kernels/cuda_attention.py; check it
              first with scripts/gpu/gpu_attention.py)
    mlx-qmv   MLX's quantized matmul at most 4 rows a call instead of the row kernel (the
              default of 2026-12-01)
    no-gdn    MLX's recurrence ops instead of the recurrence kernel
    submit    the default handing the GPU a forward's first layers every 8 while the rest is
              built (the "submit" trial of settings.gpu_trials)
    swiglu    the default with the MLP's activation read inside down_proj (the "swiglu" trial)
    batched-attn  eager, with MLX's attention over a verify's queries at once instead of row by
              row (not row-invariant: a probe of what the exact attention costs)
    mlx       MLX's own ops (what the backend falls back to; row-invariant attention kept)
    compiled  each layer one compiled function (backends.CpuCompiled's, fewer launches), MLX's
              quantized matmul, row-invariant attention
    compiled-kernels  the same with the row kernel and the recurrence kernel inside

For each: the synchronised time of a forward of 1-4 positions (median of 9), then the AR and
MTP (depth 2) lanes' greedy tokens/s over --tokens, interleaved with mlx_lm on the same prompt,
and whether MTP's text equals AR's.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402
from mlx_lm import stream_generate  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402

from adapters import load_adapter  # noqa: E402
from adapters.kernels import cuda_qmm  # noqa: E402
from adapters.qwen3_5 import backends, mlx_ops  # noqa: E402
from core import AutoregressiveDecoder, Prompt, SamplerConfig, SpeculativeDecoder, chat_prompt_ids  # noqa: E402
from core.stream import prefill  # noqa: E402
from scripts.gpu.gpu_exact import forward_and_commit, forward_seconds, synced_seconds  # noqa: E402

GREEDY = SamplerConfig(0.0, 1.0, 0, 0.0)
PROMPT = "Tell me a long story about a lighthouse keeper and a storm."
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


class Compiled(backends.CpuCompiled):
    """The compiled per-layer runner (fewer launches: MLX fuses each layer's elementwise ops),
    with MLX's quantized matmul, the recurrence as ops and the row-invariant attention."""

    def sdpa(self, q, k, v, scale, mask, cache):
        def one(q, k, v, scale, mask, cache):
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
        return mlx_ops.row_invariant_sdpa(one, q, k, v, scale, mask, cache)


class CompiledKernels(Compiled):
    """The compiled runner with the row kernel and the recurrence kernel inside it."""

    def __init__(self, rope, kind):
        super().__init__(rope)
        self.kernels = backends.GpuKernels(kind)

    def linear(self, m, x):
        return self.kernels.linear(m, x)

    def recurrence(self, q, k, v, g, beta, state, mask, capture):
        return self.kernels.recurrence(q, k, v, g, beta, state, mask, capture)


def variants(loaded, ad):
    kind = getattr(loaded, "backend", "cuda")
    rope = next(l.self_attn.rope for l in ad.inner.layers if not l.is_linear)
    no_gdn = backends.GpuKernels(kind)
    no_gdn.recurrence = lambda *a: backends.MlxOps.recurrence(no_gdn, *a)
    batched_attn = backends.GpuKernels(kind)
    batched_attn.row_invariant = False  # MLX's attention over all queries at once (not exact)
    on = dict(fused_gdn=getattr(loaded, "fused_gdn", False), fused_attention=getattr(loaded, "fused_attention", False))
    same = (lambda: type(loaded)(kind, **on)) if isinstance(loaded, backends.GpuKernels) else (lambda: backends.GpuKernels(kind))
    submit, swiglu = same(), same()
    submit.submit_every = 8    # layers handed to the GPU as they are built
    swiglu.swiglu_mlp = True   # gate|up, then down_proj reading silu(gate) * up
    return {"default": loaded, "submit": submit, "swiglu": swiglu, "eager": backends.GpuKernels(kind), "mlx-qmv": backends.GpuKernels(kind, row_kernel=False),
            "no-gdn": no_gdn, "batched-attn": batched_attn, "fused-gdn": backends.CompiledGpuKernels(kind, fused_gdn=True),
            "all-kernels": backends.CompiledGpuKernels(kind, fused_gdn=True, fused_attention=True),
            "mlx": backends.MlxOps(row_invariant=True),
            "compiled": Compiled(rope), "compiled-kernels": CompiledKernels(rope, kind)}


def step_costs(ad, ids) -> tuple:
    """Synchronised forwards of 1-5 positions (ms), then per width the primitives of its graph
    (mx.export_to_dot's rectangles) and the host's time to build it (median of 5), all on one
    prefilled cache."""
    cache = ad.make_cache()
    prefill(ad, Prompt(tuple(ids), (len(ids) - 1,)), cache, ad.make_draft(cache), None)
    tokens = mx.array([ids[-8:]], dtype=mx.int32)
    widths = (1, 2, 3, 4, 5)
    secs = forward_seconds(ad, cache, tokens, widths=widths)
    # Width 2 without capturing every position's state (and without the commit): what the
    # capture costs, since widths 2-5 cost about the same and width 1 captures nothing.
    runs = []
    for _ in range(9):
        mx.synchronize()
        t0 = time.perf_counter()
        logits, _, _ = ad.forward(tokens[:, :2], cache, capture=False)
        mx.eval(logits, ad.state_arrays(cache, None))
        runs.append(time.perf_counter() - t0)
    secs["2-no-capture"] = statistics.median(runs[2:])
    sizes = {}
    for w in widths:
        kinds, build_ms = step_graph(ad, cache, tokens, w)
        sizes[str(w)] = {"primitives": sum(kinds.values()), "build_ms": build_ms, "kinds": dict(kinds.most_common())}
    return {str(w): s * 1e3 for w, s in secs.items()}, sizes


def step_graph(ad, cache, tokens, width: int, runs: int = 5) -> tuple:
    """A forward (+ commit) of `width` positions: its primitives by kind (mx.export_to_dot's
    rectangles, first run) and the host's time to build it (ms, median of `runs`)."""
    builds, kinds, dot = [], Counter(), Path("/tmp/mtp_chat_step.dot")
    for r in range(runs):
        mx.synchronize()
        t0 = time.perf_counter()
        logits, state = forward_and_commit(ad, cache, tokens, width)
        builds.append(time.perf_counter() - t0)
        if r == 0:
            mx.export_to_dot(str(dot), logits)
            kinds = primitive_kinds(dot.read_text())
        mx.eval(logits, state)
    return kinds, statistics.median(builds) * 1e3


def primitive_kinds(dot: str) -> Counter:
    """mx.export_to_dot's rectangles (one per primitive) counted by label: what a step is made of."""
    return Counter(re.findall(r'label ="([^"]+)", shape=rectangle', dot))


def head_costs(ad, ids) -> dict:
    """The MTP head's draft step in parts, each synchronised (ms, median of 20 after 3 warm-ups):
    its layer alone, with the output projection, with a greedy draw, with the default sampler's
    draw; the output projection alone; then the full step's primitives and host build time.
    Each run appends one position to the head's history, as a cycle's first step does."""
    cache, sampler = ad.make_cache(), SamplerConfig()
    draft = ad.make_draft(cache)
    h = prefill(ad, Prompt(tuple(ids), (len(ids) - 1,)), cache, draft, None).hidden
    t = mx.array([ids[-1:]], dtype=mx.int32)
    g = ad.mtp_forward(h, t, draft)
    mx.eval(g)
    parts = {"head_layer": lambda: ad.mtp_forward(h, t, draft),
             "head_layer_lm_head": lambda: ad.draft_step(draft, cache, h, t)[1],
             "greedy_draw": lambda: mx.argmax(ad.draft_step(draft, cache, h, t)[1], axis=-1),
             "default_sampler_draw": lambda: sampler.draw(ad.draft_step(draft, cache, h, t)[1], mx.random.key(1))[0],
             "lm_head_alone": lambda: ad.lm_head(g)}
    out = {name: synced_seconds(fn) * 1e3 for name, fn in parts.items()}
    builds, dot = [], Path("/tmp/mtp_chat_head.dot")
    for r in range(7):
        mx.synchronize()
        t0 = time.perf_counter()
        y = mx.argmax(ad.draft_step(draft, cache, h, t)[1], axis=-1)
        builds.append(time.perf_counter() - t0)
        if r == 0:
            mx.export_to_dot(str(dot), y)
            out["primitives"] = sum(primitive_kinds(dot.read_text()).values())
        mx.eval(y)
    out["build_ms"] = statistics.median(builds[1:]) * 1e3
    return out


def lane(decoder, ids, tokens, waterfalls=None):
    out, stats = decoder.generate(ids, max_tokens=tokens)
    if waterfalls is not None:
        waterfalls.append(stats.waterfall)
    return list(out), stats.tokens_per_second


def shares(waterfalls) -> dict:
    """The lanes' waterfalls summed: each part's share of the decode time."""
    total = {k: sum(w.get(k, 0.0) for w in waterfalls) for k in (waterfalls[0] if waterfalls else {})}
    whole = sum(v for k, v in total.items() if k != "prefill") or 1.0
    return {k: v / whole for k, v in total.items() if k != "prefill"}


def mlx_lm_tok_s(ad, ids, tokens) -> float:
    times = []
    for _ in stream_generate(ad.model, ad.tokenizer, mx.array(ids), max_tokens=tokens, sampler=make_sampler(temp=0.0)):
        times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="variants to run (default: all)")
    a = ap.parse_args(argv)
    ad = load_adapter(a.model)
    log(f"loaded: {ad.describe()}")
    ids = chat_prompt_ids(ad, [{"role": "user", "content": PROMPT}])
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()),
              "cuda_kernels": cuda_qmm.cuda_available(), "backend": ad.backend.name, "tokens": a.tokens,
              "prompt": PROMPT, "variants": {}}
    all_variants = variants(ad.backend.few, ad)
    for name, runner in all_variants.items():
        if a.only and name not in a.only:
            continue
        ad.backend.few = runner
        try:
            lane(AutoregressiveDecoder(ad, sampler=GREEDY), ids, 16)  # warm-up: compiles this variant's kernels
            lane(SpeculativeDecoder(ad, sampler=GREEDY, depth=2), ids, 16)
            mlx_lm_tok_s(ad, ids, 16)
            costs, sizes = step_costs(ad, ids)
            head = head_costs(ad, ids)
            ar, mtp, ref, wf_ar, wf_mtp = [], [], [], [], []
            for _ in range(a.repeats):
                ar_ids, s = lane(AutoregressiveDecoder(ad, sampler=GREEDY), ids, a.tokens, wf_ar)
                ar.append(s)
                mtp_ids, s = lane(SpeculativeDecoder(ad, sampler=GREEDY, depth=2), ids, a.tokens, wf_mtp)
                mtp.append(s)
                ref.append(mlx_lm_tok_s(ad, ids, a.tokens))
            row = {"forward_ms": costs, "verify_in_steps": {w: v / costs["1"] for w, v in costs.items()},
                   "graph": sizes, "head_ms": head, "head_in_steps": {k: v / costs["1"] for k, v in head.items()
                                                                     if k not in ("primitives", "build_ms")},
                   "waterfall_shares": {"ar": shares(wf_ar), "mtp_d2": shares(wf_mtp)},
                   "ar_tok_s": statistics.median(ar), "mtp_d2_tok_s": statistics.median(mtp),
                   "mlx_lm_tok_s": statistics.median(ref),
                   "ar_vs_mlx_lm": statistics.median(x / y for x, y in zip(ar, ref)),
                   "mtp_vs_ar": statistics.median(x / y for x, y in zip(mtp, ar)),
                   "greedy_mtp_equals_ar": mtp_ids == ar_ids,
                   "first_difference": next((i for i, (x, y) in enumerate(zip(ar_ids, mtp_ids)) if x != y), None)}
        except Exception as exc:  # noqa: BLE001  one failing variant must not hide the others
            row = {"error": f"{type(exc).__name__}: {exc}"}
        report["variants"][name] = row
        log(f"{name}: " + json.dumps(row))
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2))
    ad.backend.few = all_variants["default"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
