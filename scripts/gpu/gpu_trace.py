#!/usr/bin/env python3
"""Where the GPU's time goes inside one AR step, one verify and one MTP head step, kernel by kernel.

    python scripts/gpu/gpu_trace.py --model /tmp/q9b --json out/trace.json [--runs 5] [--context 64]

Why: the MTP head's step is 0.19 AR steps on the H200 (1.36-1.48 ms, docs/bench/2026-12-04/GPU.md
section 19) where its weights take ~0.3 ms to read, and synchronised timings cannot say whether the
rest is the GPU running many small kernels or the GPU waiting for the host. MLX has no per-kernel
timer, but CUPTI sees every kernel a process launches, whoever launches it: PyTorch's profiler (the
GPU machine's image has it) records MLX's kernels too.

For each part (the step at `--context` tokens, the same state gpu_long.py times), `--runs` calls,
each synchronised and followed by a pause (so that calls never overlap in the trace):
- wall: the call's host time (build + launch + wait), as gpu_long.py measures it;
- span: first kernel start to last kernel end, busy: the kernels' summed durations, idle: span - busy
  (the GPU waiting inside the call), lead: from the call's start to its first kernel (the host's
  build before the GPU gets anything), kernels: how many a call launches;
- the kernels by total time (name, launches, us a call), and the CUDA API calls on the host
  (graph launches and updates, synchronisations) by total time;
- build: the host's Python build of the call's graph alone (us), and the primitives it holds by kind
  (mx.export_to_dot): the lead minus the build is MLX's encoding and launching.
Needs torch with CUDA beside MLX CUDA; without it, says so and writes nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from adapters import load_adapter  # noqa: E402
from scripts.gpu.gpu_long import prefilled, step_fns  # noqa: E402
from scripts.gpu.gpu_profile import primitive_kinds  # noqa: E402

PAUSE_S = 0.003    # between calls: the GPU idle, so one call's kernels never run inside the next


def parts(ad, cache, draft, hidden, ids) -> dict:
    """gpu_long.py's timed parts (an AR step, a verify of 3, the MTP step), then the head's step in two."""
    fns = step_fns(ad, cache, draft, hidden, ids, (1, 3))
    t = mx.array([ids[-1:]], dtype=mx.int32)
    return {"ar_step": fns[1], "verify_3": fns[3], "mtp_step": fns["mtp"],
            "head_layer": lambda: [ad.mtp_forward(hidden, t, draft)],
            "lm_head": lambda: [ad.lm_head(hidden[:, -1:])]}


def calls_in(trace: dict, runs: int) -> list:
    """The trace's kernels and CUDA API calls grouped by the call (a "call N" annotation) they fall in."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    # (the host's annotation: the GPU's timeline carries a copy of it, as "gpu_user_annotation")
    marks = sorted((e for e in events if e.get("cat") == "user_annotation" and e.get("name", "").startswith("call ")),
                   key=lambda e: e["ts"])[:runs]
    out = [{"start": m["ts"], "wall": m["dur"], "kernels": [], "runtime": []} for m in marks]
    for e in events:
        cat = e.get("cat", "")
        kind = "kernels" if cat in ("kernel", "gpu_memcpy", "gpu_memset") else \
            "runtime" if cat in ("cuda_runtime", "cuda_driver") else None
        for c in out if kind else ():
            if c["start"] <= e["ts"] <= c["start"] + c["wall"]:
                c[kind].append(e)
                break
    return out


def summarise(calls: list) -> dict:
    rows, names, apis = [], defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    for c in calls:
        ks = sorted(c["kernels"], key=lambda e: e["ts"])
        if not ks:
            continue
        span = max(e["ts"] + e["dur"] for e in ks) - ks[0]["ts"]
        busy = sum(e["dur"] for e in ks)
        rows.append({"wall_us": c["wall"], "span_us": span, "busy_us": busy, "idle_us": span - busy,
                     "lead_us": ks[0]["ts"] - c["start"], "kernels": len(ks)})
        for e in ks:
            names[e["name"][:90]][0] += 1
            names[e["name"][:90]][1] += e["dur"]
        for e in c["runtime"]:
            apis[e["name"]][0] += 1
            apis[e["name"]][1] += e["dur"]
    if not rows:
        return {"error": "no kernels in the trace (CUPTI saw nothing: is torch's CUDA in this process?)"}
    n = len(rows)
    top = sorted(names.items(), key=lambda kv: -kv[1][1])
    return {"calls": n, "median": {k: statistics.median(r[k] for r in rows) for k in rows[0]},
            "kernels_by_time": [{"name": k, "launches_a_call": c / n, "us_a_call": d / n} for k, (c, d) in top[:25]],
            "runtime_by_time": [{"name": k, "calls_a_call": c / n, "us_a_call": d / n}
                                for k, (c, d) in sorted(apis.items(), key=lambda kv: -kv[1][1])[:12]]}


def graph_of(fn, runs: int) -> dict:
    """The host's side of a call before MLX sees it: the Python build of its graph (us, median of
    `runs`, nothing evaluated meanwhile) and the primitives it holds (mx.export_to_dot's, first run),
    by kind: what MLX then encodes one by one."""
    builds, kinds = [], None
    for _ in range(runs):
        mx.synchronize()
        t0 = time.perf_counter()
        out = fn()
        builds.append(time.perf_counter() - t0)
        if kinds is None:
            with tempfile.NamedTemporaryFile(suffix=".dot") as f:
                # a verify's outputs nest (logits, [each cache's state, None where a slot is
                # empty]): the dot takes arrays only
                leaves = [a for _, a in tree_flatten(list(out)) if isinstance(a, mx.array)]
                mx.export_to_dot(f.name, *leaves)
                kinds = primitive_kinds(Path(f.name).read_text())
        mx.eval(*out)
    return {"build_us": statistics.median(builds) * 1e6, "primitives": sum(kinds.values()),
            "primitive_kinds": dict(kinds.most_common())}


def trace_part(fn, runs: int, torch) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function
    for _ in range(3):   # warm: compiled functions traced, kernels loaded
        mx.eval(*fn())
    mx.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(runs):
            mx.synchronize()
            time.sleep(PAUSE_S)
            with record_function(f"call {i}"):   # the call's window in the trace's own clock
                mx.eval(*fn())
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    return summarise(calls_in(trace, runs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--context", type=int, default=64)
    a = ap.parse_args(argv)
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        torch.cuda.init()
    except Exception as exc:  # noqa: BLE001
        print(f"gpu_trace: needs torch with CUDA beside MLX ({type(exc).__name__}: {exc}); nothing traced")
        return 2
    ad = load_adapter(a.model)
    ids, (cache, draft, hidden) = prefilled(ad, a.context)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "torch": torch.__version__, "model": a.model,
              "describe": ad.describe(), "context": len(ids), "runs": a.runs, "parts": {}}
    for name, fn in parts(ad, cache, draft, hidden, ids).items():
        try:
            report["parts"][name] = row = trace_part(fn, a.runs, torch)
            row.update(graph_of(fn, a.runs))
            row["median"].update(build_us=row["build_us"], primitives=row["primitives"])
        except Exception as exc:  # noqa: BLE001  one part failing must not hide the others
            report["parts"][name] = row = {"error": f"{type(exc).__name__}: {exc}"}
        m = row.get("median")
        print(f"{name}: " + (", ".join(f"{k} {v:.0f}" for k, v in m.items()) if m else row.get("error", "")), flush=True)
        for k in row.get("kernels_by_time", [])[:6]:
            print(f"    {k['us_a_call']:8.1f} us  x{k['launches_a_call']:.0f}  {k['name']}", flush=True)
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
