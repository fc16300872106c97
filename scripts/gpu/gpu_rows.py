#!/usr/bin/env python3
"""Which op makes a verify's row 0 differ from the one-token decode step (row invariance), per runner.

    python scripts/gpu/gpu_rows.py --model /tmp/mtp_chat_q35a3b --json out/rows.json
    python scripts/gpu/gpu_rows.py --model CKPT --json rows.json --stand-in    # on a CPU: kernels' references

Greedy MTP == AR needs a verify forward of [t0, d1, ..., d(W-1)] to compute its row 0 as the
one-row decode step of [t0] computes it, bit for bit. On the H200 the 35B-A3B shape broke that
with the CUDA kernels on (not with MLX's own ops, not at the 9B dense shape). This script
prefills a chat prompt once, then for each runner and width W runs both forwards from copies of
the same post-prefill state (ad.snapshot / ad.restore, as the prefix cache does) and:

1. compares the logits (bit for bit, max |d|, and the 1-row logits' top-2 gap: a near tie?);
2. bisects: every array the runner's methods return (linear, linears, norm, recurrence,
   attention, ...), the routed experts' call (its expert indices and output), layers.mlp's output
   and the router's softmax / argpartition / take_along_axis, recorded in call order for both
   forwards, plus a replay of the two reductions of layers.mlp no wrapper sees (renormalised
   scores, the experts' weighted sum); each W-row output's position 0 is compared with the 1-row
   output, and the first op that differs is named (layer, op, module, call index, shape, max |d|);
3. runs greedy AR and MTP at depth 1 for --tokens tokens on a fresh runner, then both again
   (on a compiled runner the first pair makes the functions' first, eager, calls; the second
   replays), and says where they part.

Runners: "eager" (GpuKernels: the CUDA kernels, each op from Python), "compiled"
(CompiledGpuKernels: what a load picks on CUDA; each layer one mx.compile function) and "mlx"
(MlxOps(row_invariant=True): what MTP_CHAT_GPU_KERNELS=0 runs). Ops inside a compiled function
see tracers, so the compiled runner is bisected at its compiled functions' outputs only (a layer's
Gated-DeltaNet step, attention's halves, final norm, lm_head); and because a compiled runner's
first call of each layer runs eagerly (gpu_runner.CompiledGpuKernels._fn), its first 1-row forward
is also compared with the same forward replayed compiled: an AR lane's first decode step is such
a first call wherever it is the runner's first few-token forward.

Reading the result: eager differs -> the bisect names the op; only compiled differs -> compilation
is at fault (the layer-level bisect says where); compiled's first call differs from its replays
while the rows agree -> the lanes part because one ran a step eagerly and the other compiled.

--stand-in replaces the CUDA kernels by their references (as tests/test_gpu_wrappers.py does) so
that everything runs on a CPU. Exits 0 unless it crashes: it is a diagnostic.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload and the kernel cache before mlx)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from adapters import kernels, load_adapter  # noqa: E402
from adapters.kernels import cuda_attention, cuda_qmm, gdn, gdn_fused  # noqa: E402
from adapters.qwen3_5 import backends, layers  # noqa: E402
from adapters.qwen3_5.layers import AttnParams, GdnParams, MlpParams  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROMPT = [{"role": "user", "content": "Define the word harbor."}]
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0)
LIST_DIFFERING = 20
# Runner methods that return no activation (or only bookkeeping) are not recorded.
NOT_OPS = {"enter", "leave", "masks", "positions", "check_rows"}
# Outputs of the same shape in both forwards that are not position 0 in the wider one:
# a Gated-DeltaNet step's conv window kept after its *last* position.
NOT_ALIGNED = {("gdn", "[1]")}
# Recorded ops that call other recorded ops (the first differing op may be one of them, when the
# arithmetic between its recorded parts differs).
COMPOSITE = {"mlp", "gdn", "attention_in", "attention_out", "linears", "linear_add", "head_input"}
# The router's internals, as layers.mlp calls them through its `mx` (see _LayersMx).
ROUTER_OPS = ("softmax", "argpartition", "take_along_axis", "sigmoid")
BISECT_OPS = ("every runner op, the experts' calls (indices and output), layers.mlp, the router's "
              "softmax/argpartition/take_along_axis, mlp's two reductions replayed")
BISECT_LAYERS = ("the compiled functions' outputs only (a layer's Gated-DeltaNet step, attention's halves, final "
                 "norm, lm_head): ops inside a compiled function see tracers, so no op-level bisect here")
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


# --------------------------------------------------------------------------- recording
@dataclass
class Call:
    """One array a forward produced: which op, in which layer ("3", "final", "head"), of which
    module within it ("mlp.gate"), which part of the op's result ("" or "[2][0]", "in[1]")."""

    op: str
    layer: str
    module: str
    part: str
    value: mx.array


@dataclass
class Recorder:
    """What the wrappers share: whether they record, the forward's width (the row-variant option
    perturbs wider forwards only), the layer the last labelled call was in, the nesting depth
    (`outer_only`: record only calls made outside any other wrapped call, i.e. outside a compiled
    function's trace).

    Only the thread that made it records (`thread`): layers.mlp and layers.mx are wrapped module
    globals, so the wrappers also see every other thread's calls into layers.py in this process
    (a server's model thread, webapp/serving/worker.py, taking a conversation's snapshot while the
    script runs: tests/test_api_*.py leave one). Those are passed through untouched: recorded,
    they would pose as this forward's ops (labelled with its last layer), and their arrays, built
    on that thread's own MLX stream, fail to evaluate here ("There is no Stream(cpu, 1) in current
    thread"); perturbed (`vary`), they would change that thread's results."""

    owners: Dict[int, Tuple[str, str]]
    outer_only: bool = False
    variant: Optional[str] = None
    on: bool = False
    width: int = 1
    layer: str = "?"
    depth: int = 0
    calls: List[Call] = field(default_factory=list)
    thread: int = field(default_factory=threading.get_ident)

    def mine(self) -> bool:
        """Whether the calling thread is the one that records."""
        return threading.get_ident() == self.thread

    def start(self, width: int) -> None:
        self.on, self.width, self.layer, self.calls = True, width, "?", []

    def stop(self) -> List[Call]:
        self.on, self.width = False, 1
        return self.calls

    def label(self, args) -> Tuple[Optional[str], str]:
        """(layer, module) of the first argument that names a known module, else (None, "")."""
        for a in args:
            target = a
            if isinstance(a, (GdnParams, AttnParams)):
                target = a.layer
            elif isinstance(a, MlpParams):
                target = a.module
            elif isinstance(a, (tuple, list)) and a and all(isinstance(m, nn.Module) for m in a):
                named = [self.owners.get(id(m)) for m in a]
                if all(named):
                    return named[0][0], "+".join(n for _, n in named)
                continue
            if isinstance(target, nn.Module) and id(target) in self.owners:
                return self.owners[id(target)]
        return None, ""

    def note(self, op: str, layer: str, module: str, out, prefix: str = "") -> None:
        for part, value in flatten(out, prefix):
            self.calls.append(Call(op, layer, module, part, value))

    def vary(self, op: str, module: str, out):
        """The hidden --row-variant-op: that op's (first) output changed in forwards wider than one
        row, as a kernel that computes a row otherwise beside others would (tests only)."""
        v = self.variant
        if v is None or self.width <= 1 or not (op in (v, f"mx.{v}") or (module and module.endswith(v))):
            return out
        first = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(first, mx.array) or not mx.issubdtype(first.dtype, mx.floating):
            return out
        changed = (first.astype(mx.float32) * (1 + 2**-4) + 2**-4).astype(first.dtype)
        if isinstance(out, (tuple, list)):
            return type(out)([changed, *out[1:]])
        return changed


def flatten(out, prefix: str = "") -> List[Tuple[str, mx.array]]:
    """The arrays in a result (nested tuples and lists), each with its path ("[2][0]")."""
    if isinstance(out, mx.array):
        return [(prefix, out)]
    if isinstance(out, (tuple, list)):
        return [pv for i, o in enumerate(out) for pv in flatten(o, f"{prefix}[{i}]")]
    return []


def wrapped(rec: Recorder, op: str, fn: Callable, fixed: Optional[Tuple[str, str]] = None,
            inputs: Tuple[int, ...] = ()) -> Callable:
    """fn, recording its result (and its positional inputs `inputs`) in `rec` when it records.
    The layer is the one named by fn's arguments (or `fixed`), else the last one named. Another
    thread's calls go straight to fn (Recorder: only its thread records)."""
    def call(*args, **kwargs):
        if not rec.mine():
            return fn(*args, **kwargs)
        layer, module = fixed or rec.label(args)
        if layer is not None:
            rec.layer = layer
        layer = rec.layer
        rec.depth += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            rec.depth -= 1
        out = rec.vary(op, module, out)
        if rec.on and (rec.depth == 0 or not rec.outer_only):
            for i in inputs:
                rec.note(op, layer, module, args[i], f"in[{i}]")
            rec.note(op, layer, module, out)
        return out
    return call


def runner_ops(run) -> List[str]:
    """The runner's public methods (MlxOps' primitives and what a subclass adds)."""
    return sorted(n for n in dir(type(run)) if not n.startswith("_") and n not in NOT_OPS
                  and inspect.isfunction(getattr(type(run), n)))


class _LayersMx:
    """layers.py's `mx` with the router's ops recorded: softmax (gates), argpartition (the
    top-k), take_along_axis (scores), sigmoid (shared expert gate, and the others layers.py takes)."""

    def __init__(self, rec: Recorder):
        for name in ROUTER_OPS:
            setattr(self, name, wrapped(rec, f"mx.{name}", getattr(mx, name)))

    def __getattr__(self, name):
        return getattr(mx, name)


def owners_of(ad) -> Dict[int, Tuple[str, str]]:
    """id(module) -> (layer, name within it) for the trunk's layers, the head, the final norm and
    the output projection."""
    owners = {}
    for name, m in ad.head.named_modules():
        owners[id(m)] = ("head", name)
    for i, layer in enumerate(ad.inner.layers):
        for name, m in layer.named_modules():
            owners[id(m)] = (str(i), name)
    owners[id(ad.inner.norm)] = ("final", "norm")
    owners[id(ad._output)] = ("final", "lm_head")
    return owners


def routed(rec: Recorder, where: str, p: MlpParams, experts: Callable) -> Callable:
    """A MoE layer's experts call, recorded (its expert indices and output), followed by a replay
    of what layers.mlp computes between it and its other recorded ops: the renormalised scores and
    the experts' weighted sum. Both are reductions no wrapper sees (scores.sum, (...).sum(axis=-2));
    the replay runs the same ops on the same arrays at the same shapes, so it computes their values."""
    call = wrapped(rec, "experts", experts, fixed=(where, "mlp.switch_mlp"), inputs=(1,))

    def run(x, inds):
        out = call(x, inds)
        if rec.on and not rec.outer_only and rec.mine():
            raw = next((c.value for c in reversed(rec.calls)
                        if c.op == "mx.take_along_axis" and c.layer == where), None)
            if raw is not None:
                scores = raw / raw.sum(axis=-1, keepdims=True) if p.norm_topk else raw
                rec.note("mlp.scores (replayed)", where, "mlp", scores)
                rec.note("mlp.experts_sum (replayed)", where, "mlp", (out * scores[..., None]).sum(axis=-2))
        return out
    return run


@contextlib.contextmanager
def recording(ad, run, rec: Recorder):
    """Wrap `run`'s methods, every MoE layer's experts call, layers.mlp and layers.mx while inside."""
    params = [(str(i), p.mlp) for i, p in enumerate(ad.stack.layers) if p is not None]
    params.append(("head", ad.head_layer.mlp))
    moe = [(where, p, p.experts) for where, p in params if p.experts is not None]
    saved_mlp, saved_mx = layers.mlp, layers.mx
    try:
        for name in runner_ops(run):
            setattr(run, name, wrapped(rec, name, getattr(run, name)))
        for where, p, experts in moe:
            p.experts = routed(rec, where, p, experts)
        layers.mlp = wrapped(rec, "mlp", saved_mlp)
        layers.mx = _LayersMx(rec)
        yield rec
    finally:
        layers.mlp, layers.mx = saved_mlp, saved_mx
        for _, p, experts in moe:
            p.experts = experts
        for name in runner_ops(run):
            run.__dict__.pop(name, None)


# --------------------------------------------------------------------------- comparing
def position_zero(a: mx.array, b: mx.array, width: int):
    """b's part that corresponds to a: b itself where the shapes agree; where one axis has
    W - 1 more entries in b (the positions, or history + positions: conv input, fetched keys),
    b's first a.shape[axis] along it; None where the shapes do not pair up."""
    if a.ndim != b.ndim or a.dtype != b.dtype:
        return None
    axes = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
    if not axes:
        return b
    if len(axes) == 1 and b.shape[axes[0]] - a.shape[axes[0]] == width - 1:
        index = [slice(None)] * b.ndim
        index[axes[0]] = slice(0, a.shape[axes[0]])
        return b[tuple(index)]
    return None


def keyed(calls: List[Call]) -> List[Tuple[tuple, Call]]:
    """Each call's key: (op, layer, module, part, its occurrence among calls of that key)."""
    seen: Counter = Counter()
    out = []
    for c in calls:
        k = (c.op, c.layer, c.module, c.part)
        out.append(((*k, seen[k]), c))
        seen[k] += 1
    return out


def bisect(one: List[Call], many: List[Call], width: int, inner: bool = True) -> dict:
    """Compare every W-row output's position 0 with its 1-row counterpart, in the W-row call order
    (`inner`: the ops that composite ops call were recorded too)."""
    alone = dict(keyed(one))
    pairs, skipped = [], Counter()
    for index, (key, c) in enumerate(keyed(many)):
        partner = alone.get(key)
        if partner is None:
            skipped["no 1-row counterpart"] += 1
            continue
        if (c.op, c.part) in NOT_ALIGNED:
            skipped["not position-aligned"] += 1
            continue
        b = position_zero(partner.value, c.value, width)
        if b is None:
            skipped[f"shapes do not pair ({c.op}{c.part})"] += 1
            continue
        pairs.append((index, c, partner.value, b))
    same = [mx.array_equal(a, b) for _, _, a, b in pairs]
    diff = [mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))) if a.size else mx.array(0.0)
            for _, _, a, b in pairs]
    mx.eval(same, diff)
    differing = [{"call": index, "layer": c.layer, "op": c.op, "module": c.module, "part": c.part,
                  "shape": list(c.value.shape), "max_abs_diff": float(d)}
                 for (index, c, _, _), s, d in zip(pairs, same, diff) if not bool(s)]
    first = differing[0] if differing else None
    if first is not None and inner and first["op"] in COMPOSITE:
        first = dict(first, note=f"{first['op']} differs where the recorded ops it calls agree: the difference is "
                                 "in its own code between them (reshapes, concatenations, elementwise ops, reductions)")
    return {"first_differing_op": first,
            "differing_ops": differing[:LIST_DIFFERING], "ops_differing": len(differing),
            "ops_compared": len(pairs), "ops_skipped": sum(skipped.values()), "skipped_why": dict(skipped),
            "ops_recorded": {"one_row": len(one), "wide": len(many)}}


def compare_logits(one: mx.array, wide: mx.array) -> dict:
    """The 1-row logits [V] against the W-row forward's row 0 [V]."""
    a, b = one.astype(mx.float32), wide.astype(mx.float32)
    top2 = mx.topk(a, 2)
    mx.eval(a, b, top2)
    return {"logits_equal": bool(mx.array_equal(one, wide)), "max_abs_diff": float(mx.max(mx.abs(a - b))),
            "top2_gap": float(mx.max(top2) - mx.min(top2)),
            "argmax_one_row": int(mx.argmax(a)), "argmax_wide_row0": int(mx.argmax(b))}


# --------------------------------------------------------------------------- forwards
@dataclass
class Start:
    """The post-prefill state every forward starts from, and what the prompt predicts."""

    state: object          # core.model.State (ad.snapshot)
    t0: int                # the greedy next token
    prompt_tokens: int


def prefill_once(ad, ids) -> Start:
    """The prompt through core.stream.prefill, as both lanes run it (long runner, chunks), with
    the drafter's history as the MTP lane keeps it; a snapshot of the result."""
    from core.stream import as_prompt, prefill

    cache = ad.make_cache()
    draft = ad.make_draft(cache)
    done = prefill(ad, as_prompt(ids), cache, draft)
    t0 = int(mx.argmax(done.logits[0]).item())
    return Start(ad.snapshot(cache, draft), t0, len(ids))


def forward_from(ad, start: Start, tokens: List[int], capture: bool) -> mx.array:
    """One forward of `tokens` on a fresh copy of the post-prefill state: the AR lane's step
    (one token, last logits, no capture) or a verify (all logits, every position's state kept)."""
    cache = ad.make_cache()
    ad.restore(start.state, cache, ad.make_draft(cache))
    logits, _, _ = ad.forward(mx.array([tokens], dtype=mx.int32), cache, all_logits=capture, capture=capture)
    mx.eval(logits)
    return logits


def greedy_after(ad, start: Start, n: int) -> List[int]:
    """The n greedy tokens after t0 (one-row steps): draft tokens a verify would accept."""
    cache = ad.make_cache()
    ad.restore(start.state, cache, ad.make_draft(cache))
    out, t = [], start.t0
    for _ in range(n):
        logits, _, _ = ad.forward(mx.array([[t]], dtype=mx.int32), cache, all_logits=False)
        t = int(mx.argmax(logits[0, -1]).item())
        out.append(t)
    return out


# --------------------------------------------------------------------------- runners
@dataclass
class RunnerSpec:
    name: str            # "eager" | "compiled" | "mlx"
    make: Callable       # () -> a fresh few-token runner
    says: str            # what it is, for the JSON
    outer_only: bool     # record only the compiled functions' outputs


def runner_specs(ad, which: List[str], stand_in: bool) -> Tuple[List[RunnerSpec], List[str]]:
    """The runners to compare, with the loaded backend's kernel choices (fused middle and attention,
    trials), and notes on the ones this machine cannot run."""
    few = ad.backend.few
    flags = dict(fused_gdn=getattr(few, "fused_gdn", backends.FUSED_GDN),
                 fused_attention=getattr(few, "fused_attention", backends.FUSED_ATTENTION))
    kb = "cuda" if stand_in or kernels.cuda_available() else backends.kernel_backend()

    def kernel_runner(cls):
        def make():
            run = cls(kb, **flags)
            run.submit_every = getattr(few, "submit_every", 0)
            run.swiglu_mlp = getattr(few, "swiglu_mlp", False)
            return run
        return make

    said = f"({kb}, fused_gdn={flags['fused_gdn']}, fused_attention={flags['fused_attention']})"
    every = {
        "eager": RunnerSpec("eager", kernel_runner(backends.GpuKernels), f"GpuKernels{said}", False),
        "compiled": RunnerSpec("compiled", kernel_runner(backends.CompiledGpuKernels), f"CompiledGpuKernels{said}", True),
        "mlx": RunnerSpec("mlx", lambda: backends.MlxOps(row_invariant=True), "MlxOps(row_invariant=True)", False),
    }
    specs, notes = [], []
    for name in which:
        if name != "mlx" and kb is None:
            notes.append(f"{name}: no GPU kernel backend here (pass --stand-in to run the kernels' references)")
            continue
        specs.append(every[name])
    return specs, notes


def use(ad, spec: RunnerSpec, run, long) -> None:
    ad.backend = backends.Backend(f"rows-{spec.name}", run, long)


# --------------------------------------------------------------------------- per runner
@dataclass
class Forward:
    """One recorded forward: its logits and what its ops returned."""

    logits: mx.array
    calls: List[Call]


def recorded(ad, rec: Recorder, start: Start, tokens: List[int]) -> Forward:
    """A forward of `tokens` from the post-prefill state with `rec` recording: one token as the
    AR lane's step, more as a verify."""
    rec.start(len(tokens))
    logits = forward_from(ad, start, tokens, capture=len(tokens) > 1)
    calls = rec.stop()
    mx.eval([c.value for c in calls])
    return Forward(logits, calls)


def check_rows(ad, spec: RunnerSpec, start: Start, drafts: List[int], widths: List[int], long,
               variant: Optional[str], out: dict) -> Dict[str, Forward]:
    """Logits and bisect of each width for one runner, into `out` as they come; returns its
    recorded forwards by width ("1", "2", ...) for the comparison across runners."""
    run = spec.make()
    use(ad, spec, run, long)
    rec = Recorder(owners_of(ad), outer_only=spec.outer_only, variant=variant)
    out.update(runner=spec.says, bisect=BISECT_LAYERS if spec.outer_only else BISECT_OPS, widths={})
    forwards: Dict[str, Forward] = {}
    with recording(ad, run, rec):
        # A compiled runner runs each function's first call eagerly (a 1-row step's, and a
        # verify's capturing GDN step's): those first, so that what is compared below is replays.
        first = recorded(ad, rec, start, [start.t0])
        if widths:
            recorded(ad, rec, start, [start.t0, *drafts[:widths[0] - 1]])
        forwards["1"] = one = recorded(ad, rec, start, [start.t0])
        for W in widths:
            forwards[str(W)] = wide = recorded(ad, rec, start, [start.t0, *drafts[:W - 1]])
            row = compare_logits(one.logits[0, -1], wide.logits[0, 0])
            row.update(bisect(one.calls, wide.calls, W, inner=not spec.outer_only))
            out["widths"][str(W)] = row
            log(f"{spec.name} W={W}: logits equal {row['logits_equal']} (max |d| {row['max_abs_diff']:.3g}, "
                f"top-2 gap {row['top2_gap']:.3g}); {row['ops_compared']} ops compared, {row['ops_skipped']} skipped; "
                f"first differing: {describe_op(row['first_differing_op'])}")
    if spec.outer_only:
        # An AR lane's first decode step is this first (eager) call wherever nothing ran a
        # few-token forward before it; later steps and verifies replay the compiled functions.
        same = same_values(first.logits, one.logits)
        same.update(bisect(first.calls, one.calls, 1, inner=False))
        out["first_call_vs_replay"] = same
        log(f"{spec.name}: first (eager) call == compiled replay: {same['equal']} "
            f"(max |d| {same['max_abs_diff']:.3g}); first differing: {describe_op(same['first_differing_op'])}")
    return forwards


def same_values(a: mx.array, b: mx.array) -> dict:
    """Whether two arrays of one shape are equal bit for bit, and their max |d|."""
    d = mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32)))
    return {"equal": bool(mx.array_equal(a, b)), "max_abs_diff": float(d)}


def across(records: Dict[str, Dict[str, Forward]]) -> dict:
    """The same forwards through two runners. Equal values are not required (only row invariance
    within a runner is), but where the eager and the compiled kernel runners part, the compiled
    runner's function outputs (a subset of the eager runner's ops) say at which layer."""
    out = {}
    names = list(records)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            pair = {}
            for width, fx in records[x].items():
                fy = records[y].get(width)
                if fy is None:
                    continue
                pair[width] = same_values(fx.logits, fy.logits)
                if {x, y} == {"eager", "compiled"}:
                    e, c = (fx, fy) if x == "eager" else (fy, fx)
                    found = bisect(e.calls, c.calls, 1, inner=False)
                    pair[width].update(first_differing_op=found["first_differing_op"],
                                       differing_ops=found["differing_ops"], ops_compared=found["ops_compared"])
            out[f"{x}_vs_{y}"] = pair
    return out


def describe_op(op: Optional[dict]) -> str:
    if op is None:
        return "none"
    where = f"layer {op['layer']}" if op["layer"].isdigit() else op["layer"]
    module = f" {op['module']}" if op["module"] else ""
    return (f"{where} {op['op']}{op['part']}{module} (call {op['call']}, shape {op['shape']}, "
            f"max |d| {op['max_abs_diff']:.3g})")


def lanes(ad, spec: RunnerSpec, ids: List[int], tokens: int, long) -> dict:
    """Greedy AR, MTP depth 1, then both again, on one fresh runner. The first two run as
    gpu_check.py runs them: on a compiled runner AR's first step makes each layer's first call
    (eagerly), and so does MTP's first verify for the Gated-DeltaNet layers' capturing step; the
    second pair replays compiled functions only."""
    from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder

    use(ad, spec, spec.make(), long)
    greedy = SamplerConfig(**GREEDY)

    def ar():
        return AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=tokens)[0]

    def mtp():
        return SpeculativeDecoder(ad, sampler=greedy, depth=1).generate(ids, max_tokens=tokens)[0]

    runs = {"ar": ar(), "mtp_depth1": mtp(), "ar_again": ar(), "mtp_again": mtp()}
    out = dict(runs, ar_vs_mtp_first_difference=first_difference(runs["ar"], runs["mtp_depth1"]),
               ar_again_vs_mtp_again_first_difference=first_difference(runs["ar_again"], runs["mtp_again"]),
               ar_vs_ar_again_first_difference=first_difference(runs["ar"], runs["ar_again"]))
    log(f"{spec.name}: greedy AR vs MTP depth 1 first difference {out['ar_vs_mtp_first_difference']}, "
        f"run again {out['ar_again_vs_mtp_again_first_difference']}; "
        f"AR vs AR again {out['ar_vs_ar_again_first_difference']}")
    return out


def first_difference(a: List[int], b: List[int]) -> Optional[int]:
    """The first index where two token lists differ (or where the shorter ends), None if equal."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


# --------------------------------------------------------------------------- stand-ins
@contextlib.contextmanager
def stand_ins(on: bool):
    """The CUDA kernels replaced by their references (tests/test_gpu_wrappers.py's stand-ins):
    the row kernel by MLX's quantized matmul one row at a time, the recurrence by its fp32
    reference, the fused Gated-DeltaNet middle and the attention kernel by theirs."""
    if not on:
        yield
        return

    def rows(x, w, scales, biases, bits, group_size, residual=None, config=None, swiglu=False):
        x = cuda_qmm.swiglu_rows(x) if swiglu else x
        flat = x.reshape(-1, x.shape[-1])
        y = mx.concatenate([mx.quantized_matmul(flat[i:i + 1], w, scales, biases, transpose=True,
                                                group_size=group_size, bits=bits) for i in range(flat.shape[0])])
        y = y.reshape(*x.shape[:-1], w.shape[0])
        return y if residual is None else residual + y

    def steps(q, k, v, g, beta, state, backend="cuda"):
        y, states = gdn.gated_delta_reference(q, k, v, g, beta, state)
        return y.astype(q.dtype), states

    patches = [(cuda_qmm, "quantized_matmul_rows", rows), (gdn, "gated_delta_steps", steps),
               (gdn_fused, "gdn_fused", gdn_fused.reference), (cuda_attention, "gated_attention", cuda_attention.reference),
               (cuda_attention, "gated_attention_batch", cuda_attention.reference_batch)]
    saved = [(m, n, getattr(m, n)) for m, n, _ in patches]
    try:
        for m, n, f in patches:
            setattr(m, n, f)
        yield
    finally:
        for m, n, f in saved:
            setattr(m, n, f)


def cpu_head_in_float32(ad) -> Optional[str]:
    """On the CPU MLX has no bf16 gather_mm: a bf16 MoE head's experts run in fp32 there (only the
    drafts move; nothing this script compares reads the head's output)."""
    p = ad.head_layer.mlp
    if mx.default_device() != mx.cpu or p.experts is None:
        return None
    sw = p.experts
    params = dict(tree_flatten(sw.parameters()))
    if any(k.endswith("scales") for k in params) or not any(v.dtype == mx.bfloat16 for v in params.values()):
        return None   # quantized experts (gather_qmm runs on the CPU) or not bf16
    sw.set_dtype(mx.float32)
    p.experts = lambda x, i: sw(x.astype(mx.float32), i).astype(x.dtype)
    return "the MoE head's experts run in float32 on the CPU (no bf16 gather_mm there)"


# --------------------------------------------------------------------------- the report
def commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def verdict(report: dict) -> str:
    """A few lines: which runner breaks row invariance, where the bisect points, and whether the
    compiled runner's first (eager) call or the lanes part."""
    runs = report["runners"]
    lines = []
    for name, r in runs.items():
        if "error" in r:
            lines.append(f"{name}: failed ({r['error']})")
        bad = [W for W, w in r.get("widths", {}).items() if not w["logits_equal"]]
        if bad:
            w = r["widths"][bad[0]]
            lines.append(f"{name}: row 0 differs at widths {', '.join(bad)} (W={bad[0]}: max |d| {w['max_abs_diff']:.3g}, "
                         f"top-2 gap {w['top2_gap']:.3g}; first differing {describe_op(w['first_differing_op'])})")
        elif r.get("widths"):
            lines.append(f"{name}: row 0 exact at every width")
        replay = r.get("first_call_vs_replay")
        if replay is not None and not replay["equal"]:
            lines.append(f"{name}: its first (eager) call differs from its compiled replay (max |d| "
                         f"{replay['max_abs_diff']:.3g}; first differing {describe_op(replay['first_differing_op'])})")
        if r.get("ar_vs_mtp_first_difference") is not None or r.get("ar_again_vs_mtp_again_first_difference") is not None:
            lines.append(f"{name}: greedy MTP depth 1 leaves AR at token {r['ar_vs_mtp_first_difference']} "
                         f"(both run again: {r['ar_again_vs_mtp_again_first_difference']}; AR vs AR again: "
                         f"{r['ar_vs_ar_again_first_difference']})")
    bad = {name for name, r in runs.items() if any(not w["logits_equal"] for w in r.get("widths", {}).values())}
    one_row = report.get("across_runners", {}).get("eager_vs_compiled", {}).get("1")
    if one_row is not None and not one_row["equal"]:
        lines.append(f"eager vs compiled: the same 1-row step differs (max |d| {one_row['max_abs_diff']:.3g}; first "
                     f"differing {describe_op(one_row['first_differing_op'])}): harmless within one runner, not "
                     "where a lane runs a step eagerly and its verify compiled (a compiled runner's first calls)")
    if "compiled" in bad and runs.get("eager", {}).get("widths") and "eager" not in bad:
        lines.append("=> only the compiled runner differs: compilation is at fault (its layer-level bisect says where)")
    elif "eager" in bad:
        lines.append("=> the eager kernel runner differs: the bisect names the op")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", type=int, default=8, help="greedy AR vs MTP depth 1 over this many tokens (0: skip)")
    ap.add_argument("--width", type=int, nargs="+", default=[2, 3, 4], help="verify widths W (2-8)")
    ap.add_argument("--backend", choices=["auto", "eager", "compiled", "mlx"], default="auto")
    ap.add_argument("--stand-in", action="store_true",
                    help="the CUDA kernels' references instead of the kernels (any machine)")
    ap.add_argument("--compute-dtype", default=None,
                    help="load_adapter's compute_dtype (default: auto; native with --stand-in: the kernels take bf16)")
    ap.add_argument("--row-variant-op", default=None, help=argparse.SUPPRESS)  # tests: perturb this op in wider forwards
    a = ap.parse_args(argv)
    widths = sorted({w for w in a.width if 2 <= w <= backends.FEW_TOKENS})
    which = ["eager", "compiled", "mlx"] if a.backend == "auto" else [a.backend]
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(report: dict) -> None:  # after every runner: a run cut short still leaves what it found
        out.write_text(json.dumps(report, indent=2))

    with stand_ins(a.stand_in):
        report = run_all(a, widths, which, save)
    print(report["verdict"])
    return 0


def run_all(a, widths: List[int], which: List[str], save: Callable[[dict], None]) -> dict:
    from core import chat_prompt_ids

    ad = load_adapter(a.model, compute_dtype=a.compute_dtype or ("native" if a.stand_in else "auto"))
    log(f"loaded: {ad.describe()}")
    loaded, long = ad.backend, ad.backend.long
    notes = [n for n in [cpu_head_in_float32(ad), loaded.note] if n]
    report = {"commit": commit(), "mlx": mx.__version__, "device": str(mx.default_device()),
              "describe": ad.describe(), "loaded_backend": loaded.name, "stand_in": a.stand_in,
              "row_variant_op": a.row_variant_op, "widths": widths, "notes": notes}
    ids = chat_prompt_ids(ad, PROMPT)
    start = prefill_once(ad, ids)
    specs, skipped = runner_specs(ad, which, a.stand_in)
    notes += skipped
    # Draft tokens a verify would accept: the greedy continuation (with the loaded runner).
    drafts = greedy_after(ad, start, max(widths) - 1) if widths else []
    report.update(prompt_tokens=start.prompt_tokens, t0=start.t0, drafts=drafts, runners={})
    records = {}
    for spec in specs:
        # One runner failing (a kernel that does not build, a trace that breaks) must not hide the others.
        r = report["runners"][spec.name] = {}
        try:
            records[spec.name] = check_rows(ad, spec, start, drafts, widths, long, a.row_variant_op, r)
            if a.tokens > 0:
                r.update(lanes(ad, spec, ids, a.tokens, long))
        except Exception as exc:  # noqa: BLE001
            r["error"] = f"{type(exc).__name__}: {exc}"
            r["traceback"] = traceback.format_exc(limit=8)
            log(f"{spec.name}: {r['error']}")
        ad.backend = loaded
        save(report)
    report["across_runners"] = across(records)
    del records
    report["verdict"] = verdict(report)
    report["seconds"] = round(time.perf_counter() - T0, 1)
    save(report)
    return report


if __name__ == "__main__":
    sys.exit(main())
