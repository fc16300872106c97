"""scripts/gpu/gpu_trace.py on a hand-made CUPTI trace: what it reports of each call (the GPU's busy
and idle time inside a call, the host's lead before the first kernel) is what the trace holds."""
from __future__ import annotations

from scripts.gpu import gpu_trace


def _x(name, cat, ts, dur):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


def test_each_call_is_its_kernels_between_its_marks():
    trace = {"traceEvents": [
        _x("call 0", "user_annotation", 1000, 100),
        _x("call 0", "gpu_user_annotation", 1040, 50),     # the GPU timeline's copy: not a call
        _x("cudaGraphLaunch", "cuda_runtime", 1030, 5),
        _x("qmv", "kernel", 1040, 20), _x("rms", "kernel", 1070, 5), _x("qmv", "kernel", 1080, 10),
        _x("call 1", "user_annotation", 5000, 80),
        _x("cudaGraphLaunch", "cuda_runtime", 5010, 4),
        _x("qmv", "kernel", 5020, 30), _x("rms", "kernel", 5060, 5),
        _x("qmv", "kernel", 9000, 50),                     # outside every call: not counted
        _x("call 2", "user_annotation", 20000, 10),        # beyond --runs: not counted
    ]}
    calls = gpu_trace.calls_in(trace, runs=2)
    assert [len(c["kernels"]) for c in calls] == [3, 2] and [len(c["runtime"]) for c in calls] == [1, 1]
    s = gpu_trace.summarise(calls)
    assert s["calls"] == 2
    # call 0: span 1040..1090 = 50, busy 35, lead 40, wall 100; call 1: span 45, busy 35, lead 20, wall 80
    assert s["median"] == {"wall_us": 90, "span_us": 47.5, "busy_us": 35, "idle_us": 12.5, "lead_us": 30, "kernels": 2.5}
    top = s["kernels_by_time"][0]
    assert top == {"name": "qmv", "launches_a_call": 1.5, "us_a_call": 30.0}   # (20 + 10 + 30) / 2
    assert s["runtime_by_time"] == [{"name": "cudaGraphLaunch", "calls_a_call": 1.0, "us_a_call": 4.5}]


def test_a_trace_without_kernels_says_so():
    assert "no kernels" in gpu_trace.summarise(gpu_trace.calls_in({"traceEvents": []}, runs=3))["error"]


def test_a_calls_graph_is_counted_and_its_build_timed():
    """graph_of: the primitives of what a call builds, by kind, and its build time; each run's
    outputs evaluated (the next call starts from them, as in the trace)."""
    import mlx.core as mx

    from scripts.gpu.gpu_trace import graph_of

    state = {"x": mx.ones((4, 4))}

    def step():
        state["x"] = mx.exp(state["x"] @ state["x"]) * 0.5
        return [state["x"]]

    g = graph_of(step, runs=3)
    assert g["build_us"] > 0 and g["primitives"] == sum(g["primitive_kinds"].values()) >= 3
    assert {"Matmul", "Exp", "Multiply"} <= set(g["primitive_kinds"])


def test_every_part_of_a_real_step_is_counted(tiny_model_dir):
    """The parts as the H200 traces them, on a tiny checkpoint: a verify returns (logits, [each
    cache's state, None in empty slots]), where the run of 2026-12-04 stopped (export_to_dot takes
    arrays only)."""
    from adapters import load_adapter
    from scripts.gpu.gpu_long import prefilled
    from scripts.gpu.gpu_trace import graph_of, parts

    ad = load_adapter(tiny_model_dir)
    ids, (cache, draft, hidden) = prefilled(ad, 32)
    counts = {name: graph_of(fn, runs=2)["primitives"] for name, fn in parts(ad, cache, draft, hidden, ids).items()}
    assert set(counts) == {"ar_step", "verify_3", "mtp_step", "head_layer", "lm_head"}
    assert counts["verify_3"] >= counts["ar_step"] > counts["mtp_step"] > counts["head_layer"] > counts["lm_head"] >= 1
