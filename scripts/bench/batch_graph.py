#!/usr/bin/env python3
"""The graph one batch step builds on the host, at B = 1, 2, 4: its primitives by kind, the
host's time to build it, and its host reads, for the AR step and one MTP cycle (depth 2).

    python scripts/bench/batch_graph.py [--model DIR] [--json out.json] [--batch 1 2 4] [--steps 8]

Why: on the H200 a batch of 4 made 1.84x one request's tokens (AR) and 1.44x (MTP), with
every kernel already one launch for the batch (docs/bench/2026-12-02/GPU.md, section 6). MLX
builds the step's graph on the host every step (a few microseconds a primitive), so what still
grows with B is work per sequence on the host. This counts it.

What runs is core.batch.Batch.step itself, on the GPU's runner: the CUDA few runner
(CompiledGpuKernels with the fused Gated-DeltaNet middle and the attention kernel, each layer
compiled) as the batch runner, as backends.choose sets it on CUDA. With CUDA the real kernels
run. Without it (this CPU) the kernels are stood in: the row kernel by MLX's quantized matmul
(+ the residual), the fused middle and the attention launch by a few ops of the right shapes
that read every input (their values are not the model's; what is measured is the graph around
them). A stand-in is a fixed handful of primitives a launch whatever B is, where the kernel is
one, so counts scale with B as the GPU's do; the kinds table says which are stand-ins
(QuantizedMatmul: a row-kernel launch).

A step is cut at its syncs (core.batch's mx.eval / mx.async_eval): each phase's primitives are
those built since the last sync and reachable from what is evaluated or kept (the caches, the
head's feed), counted once (mx.export_to_dot's rectangles); build_ms is the host's time from
the end of the last sync to this one (or to the step's end: the commit, the reads and the
events); submit_ms the host's time inside the syncs' calls (MLX CUDA encodes the kernels
there); step ms synced is one step with a sync at its end, back to back the wall time per step
of steps run as a batch decodes (each queued before the last one's tokens are read). Counting
and timing are separate passes (exporting the graph is slow). Host reads:
the step's calls of .item() / .tolist() on arrays; "evaluates": on an array with work still
to do (a slice of a computed one too), which waits for the device.

Without --model: a random 32-layer checkpoint at the 9B's layer pattern (24 Gated-DeltaNet +
8 attention layers) and tiny widths, made in a temporary folder. On the GPU machine:
    python scripts/bench/batch_graph.py --model /tmp/q9b --json out/batch-graph-9b.json
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from adapters.runtime import preload_blas  # noqa: E402

preload_blas()

import mlx.core as mx  # noqa: E402

import core.batch  # noqa: E402
from adapters import kernels, load_adapter  # noqa: E402
from adapters.kernels import cuda_attention, cuda_qmm, gdn_fused  # noqa: E402
from adapters.qwen3_5 import backends  # noqa: E402
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder  # noqa: E402
from core.batch import Batch, Sequence  # noqa: E402

GREEDY = SamplerConfig(temperature=0)
DEPTH = 2
# The 9B's layer pattern at widths every kernel (and stand-in) takes: tests/test_gpu_wrappers.py's
# kernel-shaped checkpoint with 32 layers, one attention layer in four.
SMALL = dict(num_layers=32, full_attention_interval=4, hidden_size=128, intermediate_size=256, num_heads=4,
             head_dim=128, num_kv_heads=2, linear_num_value_heads=8, linear_num_key_heads=2,
             linear_key_head_dim=32, linear_value_head_dim=16, dtype="bfloat16", bits=4, group_size=32)


# -- the kernels' stand-ins on a machine without CUDA ----------------------------------------------
def _qmm(x, w, scales, biases, bits, group_size, residual=None, config=None, swiglu=False):
    x = cuda_qmm.swiglu_rows(x) if swiglu else x  # the kernel's MLP input, here as ops
    y = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)
    return y if residual is None else residual + y


def _middle(proj, offsets, conv_state, conv_w, neg_a, dt_bias, norm_w, cst, state, dims):
    # The conv window is the kernel's (conv_state then the new q|k|v rows); y and the states only
    # have its shapes. One launch's outputs, from three primitives.
    Hv, Dv, T, C = dims[1], dims[3], proj.shape[-2], conv_state.shape[-1]
    conv_input = mx.concatenate([conv_state, proj[..., :C]], axis=-2)
    return proj[..., offsets[0]:offsets[0] + Hv * Dv], conv_input, [state + 0] * T


def _attention_batch(q, ks, vs, gate, scale, rows_block=None, threads=None):
    # Reads every sequence's keys and values, as the launch does; the values are not attention's.
    B, nh, L, hd = q.shape
    kv = mx.concatenate([*ks, *vs], axis=2).mean()
    return (q.transpose(0, 2, 1, 3).reshape(B, L, nh * hd) + kv) * mx.sigmoid(gate)


def stand_in_kernels() -> None:
    cuda_qmm.quantized_matmul_rows = _qmm
    gdn_fused.gdn_fused = _middle
    cuda_attention.gated_attention_batch = _attention_batch
    cuda_attention.gated_attention = lambda q, k, v, gate, scale: _attention_batch(q, [k], [v], gate, scale)


def gpu_runner(ad) -> str:
    """The CUDA backend's runners on this adapter: as loaded with CUDA (the real kernels, or
    MLX's path where their check failed: the name says which), stand-ins without."""
    if kernels.cuda_available():
        return f"as loaded: {ad.backend.name}"
    stand_in_kernels()
    few = backends.CompiledGpuKernels("cuda", fused_gdn=True, fused_attention=True)
    ad.backend = backends.Backend("cuda-stand-ins", few, backends.MlxOps())
    ad.backend.batch = few   # as backends.Backend sets it: the batch runner is the few runner
    return "stand-ins (no CUDA here)"


# -- cutting a step at its syncs ---------------------------------------------------------------------
_RECT = re.compile(r'\{ (\d+) \[label ="([^"]+)", shape=rectangle\]; \}')


def _arrays(x, out: list) -> list:
    if isinstance(x, mx.array):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _arrays(y, out)
    return out


def kept(seqs) -> list:
    """What a step leaves for the next: every cache array (not KVCache.state: it slices), the
    head's feed, the token ahead."""
    out = []
    for s in seqs:
        for c in list(s.cache or []) + ([s.draft] if s.draft is not None else []):
            _arrays([c.keys, c.values] if hasattr(c, "keys") else list(c.cache), out)
        _arrays([s.feed_h, s.feed_t, s.ahead[0] if s.ahead else None], out)
    return out


class Meter:
    """Stands in for core.batch's `mx` during a step: each eval / async_eval ends a phase."""

    def __init__(self, seqs, count: bool):
        self.seqs, self.count = seqs, count
        self.phases, self.seen, self.reads = [], set(), Counter()
        self.dot = Path(tempfile.mkdtemp(prefix="batch-graph-")) / "step.dot"

    def __getattr__(self, name):
        return getattr(mx, name)

    def eval(self, *args):
        self._phase("eval", args)
        mx.eval(*args)
        self._submitted()

    def async_eval(self, *args):
        self._phase("async_eval", args)
        mx.async_eval(*args)
        self._submitted()

    def _submitted(self):
        # MLX CUDA encodes a graph's kernels on the calling thread: host time too, beside the build.
        self.t = time.perf_counter()
        self.phases[-1]["submit_ms"] = (self.t - self.t_sync) * 1e3

    def _phase(self, name, args):
        self.t_sync = time.perf_counter()
        build = self.t_sync - self.t
        row = {"sync": name, "build_ms": build * 1e3}
        if self.count:
            kinds = self._new(_arrays(args, []) + kept(self.seqs))
            row.update(primitives=sum(kinds.values()), kinds=dict(kinds.most_common()), reads=dict(self.reads))
            self.reads.clear()
        self.phases.append(row)

    def _new(self, arrays) -> Counter:
        mx.export_to_dot(str(self.dot), *arrays)
        kinds = Counter()
        for node, kind in _RECT.findall(self.dot.read_text()):
            if node not in self.seen:
                self.seen.add(node)
                kinds[kind] += 1
        return kinds

    def _reading(self, name):
        read = getattr(mx.array, name)

        def counted(a, *args):
            # A read of an array still to compute evaluates it: a wait for the device.
            mx.export_to_dot(str(self.dot), a)
            self.reads[name + (" (evaluates)" if "rectangle" in self.dot.read_text() else "")] += 1
            return read(a, *args)
        return read, counted

    def step(self, batch: Batch) -> list:
        core.batch.mx = self
        reads = {name: self._reading(name) for name in (("item", "tolist") if self.count else ())}
        for name, (_, counted) in reads.items():
            setattr(mx.array, name, counted)
        self.t = t0 = time.perf_counter()
        try:
            batch.step()
        finally:
            for name, (read, _) in reads.items():
                setattr(mx.array, name, read)
            core.batch.mx = mx
        self._phase("end", [])   # the commit, the reads, the events: built after the last sync
        self.phases[-1]["wall_ms"] = (time.perf_counter() - t0) * 1e3
        return self.phases


# -- one lane at one batch size --------------------------------------------------------------------
def prompts(ad, n: int) -> list:
    V = ad.vocab_size
    return [[(7 + 31 * i + 13 * j) % (V - 10) + 5 for j in range(16 + 5 * i)] for i in range(n)]


def measure(ad, lane: str, B: int, steps: int, warm: int = 4) -> dict:
    make = (lambda: AutoregressiveDecoder(ad, sampler=GREEDY)) if lane == "ar" else \
        (lambda: SpeculativeDecoder(ad, sampler=GREEDY, depth=DEPTH))
    batch = Batch(ad)
    seqs = [Sequence(make(), p, 100_000) for p in prompts(ad, B)]
    for s in seqs:
        batch.join(s)
    for _ in range(warm):   # every compiled function traced at this width (the first call runs eagerly)
        batch.step()
    counted, timed = [], []
    for _ in range(steps):
        mx.eval(kept(seqs))   # nothing left over from the step before: a step counts its own graph
        counted.append(Meter(seqs, count=True).step(batch))
    for _ in range(steps):
        timed.append(Meter(seqs, count=False).step(batch))
    # Back to back, as a batch decodes (each step queued before the last one's tokens are read):
    # the time a step really takes, and how much of it the host spends submitting.
    mx.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        batch.step()
    mx.synchronize()
    pipelined = (time.perf_counter() - t0) * 1e3 / steps
    assert len(batch.running) == B and all(len(p) == len(counted[0]) for p in counted + timed)
    phases = []
    for i, first in enumerate(counted[0]):
        kinds = Counter()
        for p in counted:
            kinds.update(p[i]["kinds"])
        reads = Counter()
        for p in counted:
            reads.update(p[i]["reads"])
        phases.append({"sync": first["sync"],
                       "primitives": statistics.median(p[i]["primitives"] for p in counted),
                       "build_ms": statistics.median(p[i]["build_ms"] for p in timed),
                       "kinds": {k: v / steps for k, v in kinds.most_common()},
                       "reads": {k: v / steps for k, v in reads.items()}})
    return {"primitives": sum(p["primitives"] for p in phases),
            "build_ms": sum(p["build_ms"] for p in phases),
            "step_ms": statistics.median(p[-1]["wall_ms"] for p in timed),
            "submit_ms": statistics.median(sum(ph.get("submit_ms", 0) for ph in p) for p in timed),
            "pipelined_step_ms": pipelined,
            "reads": sum(sum(p["reads"].values()) for p in phases),
            "evaluating_reads": sum(v for p in phases for k, v in p["reads"].items() if "evaluates" in k),
            "phases": phases}


def table(report: dict) -> str:
    rows = ["| lane | B | primitives | per sequence | build ms | submit ms | step ms, synced / back to back "
            "(this machine) | host reads (evaluating) |",
            "|---|---|---|---|---|---|---|---|"]
    for lane, by_b in report["lanes"].items():
        for B, r in by_b.items():
            rows.append(f"| {lane} | {B} | {r['primitives']:.0f} | {r['primitives'] / int(B):.0f} | "
                        f"{r['build_ms']:.2f} | {r['submit_ms']:.2f} | {r['step_ms']:.2f} / {r['pipelined_step_ms']:.2f} | "
                        f"{r['reads']:.1f} ({r['evaluating_reads']:.1f}) |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a checkpoint (default: a random one at the 9B's layer pattern, tiny widths)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=8, help="steps counted, then as many timed (medians)")
    ap.add_argument("--lanes", nargs="+", default=["ar", "mtp"], choices=["ar", "mtp"])
    a = ap.parse_args(argv)
    path = a.model
    if path is None:
        from scripts.checkpoints.make_tiny_checkpoint import make_tiny_checkpoint
        path = make_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="batch-graph-")) / "model", **SMALL)
    ad = load_adapter(path, compute_dtype="native")
    kind = gpu_runner(ad)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()), "kernels": kind,
              "model": str(a.model or "random, 9B layer pattern, tiny widths"), "depth": DEPTH, "lanes": {}}
    for lane in a.lanes:
        report["lanes"][lane] = {}
        for B in a.batch:
            report["lanes"][lane][str(B)] = r = measure(ad, lane, B, a.steps)
            print(f"{lane} B={B}: {r['primitives']:.0f} primitives, build {r['build_ms']:.2f} ms, submit "
                  f"{r['submit_ms']:.2f} ms, step {r['step_ms']:.2f} ms (back to back {r['pipelined_step_ms']:.2f}), "
                  f"{r['reads']:.1f} reads", flush=True)
            if a.json:
                Path(a.json).parent.mkdir(parents=True, exist_ok=True)
                Path(a.json).write_text(json.dumps(report, indent=2))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
