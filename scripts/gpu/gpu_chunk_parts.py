#!/usr/bin/env python3
"""Where a prefill chunk's time goes on the long runner: the host's part and each kernel class.

    python scripts/gpu/gpu_chunk_parts.py --model /tmp/mtp_chat_q9b --json out/chunk_parts.json [--tokens 64 512]
    python scripts/gpu/gpu_chunk_parts.py --model <tiny checkpoint> --json /tmp/p.json --stand-in   # any machine

Why: on the H200 a chunk of the prefill path costs ~0.021 s + 0.11 ms a token at any depth
(docs/bench/2026-12-03/GPU.md, section 13: 64 tokens 0.027 s, 512 tokens 0.075 s at depth 0),
where the few-token path runs 5 tokens in 0.0095 s. An agent's later turn pays that fixed part in
each of its chunks. For each size T, at depth 0 (a fresh cache each time):

1. the chunk as the engine runs it (`forward(fast=False)` and the head's absorb), built with the
   long runner's layers handed over only at the end: `build_ms` (the host's graph, Python),
   `encode_ms` (the host inside mx.async_eval: MLX encodes every kernel there), `wait_ms` (what is
   left until the device is done), their sum `wall_ms`; `wall_submit_ms` the same chunk with the
   runner's own submit_every (the default); its primitives by kind; `first`: the same parts of
   the length's first chunk in the process (a turn's remainder chunk is a length never run before:
   on the H200 it cost ~20 ms more, section 14 of GPU.md; which part is it?);
2. each kernel class the chunk launches, timed inside one evaluated graph of many independent
   calls at the checkpoint's shapes and T rows (as scripts/gpu/gpu_step_parts.py does for a
   decode step): MLX's quantized matmul for every linear of the chunk, the recurrence kernel,
   attention over T keys (mlx-lm's, causal), RMSNorm, the compiled SwiGLU, the conv's tap sum;
3. the sum of the classes (per call x calls a chunk) against wait and wall: what the kernels
   explain, and what is left to the host and the launches between them.
--stand-in skips the CUDA-only classes (checks the plumbing on a CPU).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402
from mlx_lm.models.base import scaled_dot_product_attention  # noqa: E402

from adapters import load_adapter  # noqa: E402
from adapters.kernels import gdn  # noqa: E402
from scripts.gpu.gpu_chunk_probe import _commit  # noqa: E402
from scripts.gpu.gpu_step_parts import copies_for, layer_shapes, per_call  # noqa: E402

_RECT = re.compile(r'\{ (\d+) \[label ="([^"]+)", shape=rectangle\]; \}')


def chunk(ad, T: int, submit_every, reps: int = 5) -> dict:
    """The long runner's chunk of T tokens at depth 0: host build, encode, wait (medians)."""
    run = ad.backend.long
    every = getattr(run, "submit_every", 0)
    tokens = _tokens(ad, T)
    rows = []
    try:
        run.submit_every = every if submit_every is None else submit_every
        for _ in range(reps + 1):
            cache = ad.make_cache()
            draft = ad.make_draft(cache)
            mx.synchronize()
            t0 = time.perf_counter()
            logits, hidden, _ = ad.forward(tokens, cache, all_logits=False, fast=False)
            ad.absorb(draft, cache, hidden[:, :-1], tokens[:, 1:])
            out = [logits, hidden[:, -1:], ad.state_arrays(cache, draft)]
            t1 = time.perf_counter()
            mx.async_eval(out)
            t2 = time.perf_counter()
            mx.synchronize()
            t3 = time.perf_counter()
            rows.append({"build_ms": (t1 - t0) * 1e3, "encode_ms": (t2 - t1) * 1e3, "wait_ms": (t3 - t2) * 1e3,
                         "wall_ms": (t3 - t0) * 1e3})
    finally:
        run.submit_every = every
    out = {k: statistics.median(r[k] for r in rows[1:]) for k in rows[0]}
    out["first"] = rows[0]   # this length's first chunk in the process (when nothing ran it before)
    return out


def _tokens(ad, T: int) -> mx.array:
    vocab = min(ad.vocab_size, 150_000)
    return mx.array([[(7919 * i + 13) % (vocab - 1000) + 500 for i in range(T)]], dtype=mx.int32)


def primitives(ad, T: int) -> Counter:
    tokens = _tokens(ad, T)
    cache = ad.make_cache()
    draft = ad.make_draft(cache)
    run = ad.backend.long
    every, run.submit_every = getattr(run, "submit_every", 0), 0
    try:
        logits, hidden, _ = ad.forward(tokens, cache, all_logits=False, fast=False)
        ad.absorb(draft, cache, hidden[:, :-1], tokens[:, 1:])
    finally:
        run.submit_every = every
    flat = [logits, hidden[:, -1:]]
    for a in ad.state_arrays(cache, draft):
        flat += [x for x in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(x, mx.array)]
    dot = Path(tempfile.mkdtemp(prefix="chunk-parts-")) / "chunk.dot"
    mx.export_to_dot(str(dot), *flat)
    kinds = Counter(kind for _, kind in _RECT.findall(dot.read_text()))
    mx.eval(flat)
    return kinds


def chunk_linears(ad) -> dict:
    """Every quantized linear of a chunk, as the long runner calls them (one module at a time):
    shape key -> (module, calls a chunk)."""
    gdns, attns, _ = layer_shapes(ad)
    found: dict = {}

    def add(m, calls=1):
        if "scales" not in m:
            return
        key = (tuple(m["weight"].shape), m.bits, m.group_size)
        found[key] = (found.get(key, (m, 0))[0], found.get(key, (m, 0))[1] + calls)

    for p in gdns:
        at = p.attn
        for m in (at.in_proj_qkv, at.in_proj_z, at.in_proj_b, at.in_proj_a, at.out_proj):
            add(m)
    for p in attns:
        at = p.attn
        for m in (at.q_proj, at.k_proj, at.v_proj, at.o_proj):
            add(m)
    for p in [*gdns, *attns]:
        if p.mlp.experts is None:
            for m in (p.mlp.module.gate_proj, p.mlp.module.up_proj, p.mlp.module.down_proj):
                add(m)
    return found


def class_times(ad, T: int, stand_in: bool) -> dict:
    """name -> (microseconds a call, calls a chunk), at T rows."""
    gdns, attns, H = layer_shapes(ad)
    dt = mx.bfloat16
    rnd = lambda shape, i: mx.random.normal(shape, key=mx.random.key(i)).astype(dt)  # noqa: E731
    out = {}
    for (shape, bits, gs), (m, calls) in chunk_linears(ad).items():
        K = shape[1] * 32 // bits
        w, s, b = m["weight"], m["scales"], m["biases"]
        us = per_call(lambda i, w=w, s=s, b=b, bits=bits, gs=gs, K=K: (
            lambda x, w, s, b: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits),
            rnd((1, T, K), i), *(a if i == 0 else a + 0 for a in (w, s, b))),
            copies_for(w.nbytes + s.nbytes + b.nbytes), calls=16, reps=5)
        out[f"qmm {shape[0]}x{K} ({bits}-bit)"] = (us, calls)
    if gdns and not stand_in:
        p = gdns[0]
        if gdn.prefill_supported((1, T, p.Hk, p.Dk), (1, T, p.Hv, p.Dv), mx.float32):
            out["recurrence kernel"] = (per_call(lambda i: (
                lambda q, k, v, g, beta, state: gdn.gated_delta_prefill(q, k, v, g, beta, state)[0],
                *gdn.random_inputs(mx.random.key(i), T, p.Hk, p.Hv, p.Dk, p.Dv, dt)), 4, calls=16, reps=5), len(gdns))
    if attns:
        a = attns[0]
        out[f"attention {T}x{T} causal"] = (per_call(lambda i: (
            lambda q, k, v: scaled_dot_product_attention(q, k, v, cache=None, scale=a.scale, mask="causal"),
            rnd((1, a.nh, T, a.hd), i), rnd((1, a.nkv, T, a.hd), i + 1), rnd((1, a.nkv, T, a.hd), i + 2)),
            4, calls=16, reps=5), len(attns) + 1)   # + the head's layer
    norm = ad.stack.layers[0].layer.input_layernorm
    out["rms_norm (hidden)"] = (per_call(lambda i: (lambda x: norm(x), rnd((1, T, H), i)), 8, calls=16, reps=5),
                                2 * len(ad.stack.layers) + 1)
    tc = ad.config.get("text_config", ad.config)
    inter = tc.get("intermediate_size") or 4 * H
    swiglu = mx.compile(lambda g, u: g * mx.sigmoid(g) * u)
    out["swiglu (compiled)"] = (per_call(lambda i: (swiglu, rnd((1, T, inter), i), rnd((1, T, inter), i + 1)), 8,
                                         calls=16, reps=5), len(ad.stack.layers))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--stand-in", action="store_true", help="skip the CUDA-only kernel classes")
    a = ap.parse_args(argv)
    ad = load_adapter(a.model)
    report = {"model": a.model, "describe": ad.describe(), "mlx": mx.__version__, "commit": _commit(), "sizes": {}}
    print(f"loaded: {ad.describe()}", flush=True)
    for T in a.tokens:
        row = {"chunk": chunk(ad, T, 0), "chunk_submitting": chunk(ad, T, None)}
        kinds = primitives(ad, T)
        row["primitives"], row["kinds"] = sum(kinds.values()), dict(kinds.most_common())
        classes = class_times(ad, T, a.stand_in)
        row["classes"] = {k: {"us_per_call": us, "calls": n, "ms_per_chunk": us * n / 1e3} for k, (us, n) in classes.items()}
        row["classes_sum_ms"] = sum(c["ms_per_chunk"] for c in row["classes"].values())
        c, f = row["chunk"], row["chunk"]["first"]
        print(f"T={T}: build {c['build_ms']:.2f} ms, encode {c['encode_ms']:.2f}, wait {c['wait_ms']:.2f}, wall "
              f"{c['wall_ms']:.2f} (submitting every {getattr(ad.backend.long, 'submit_every', 0)}: "
              f"{row['chunk_submitting']['wall_ms']:.2f}); first use {f['build_ms']:.2f} / {f['encode_ms']:.2f} / "
              f"{f['wait_ms']:.2f} = {f['wall_ms']:.2f} ms; {row['primitives']} primitives; kernel classes "
              f"{row['classes_sum_ms']:.2f} ms", flush=True)
        for k, v in sorted(row["classes"].items(), key=lambda kv: -kv[1]["ms_per_chunk"]):
            print(f"    {k}: {v['us_per_call']:.1f} us x {v['calls']} = {v['ms_per_chunk']:.2f} ms", flush=True)
        report["sizes"][str(T)] = row
    Path(a.json).write_text(json.dumps(report, indent=1))
    print(f"wrote {a.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
