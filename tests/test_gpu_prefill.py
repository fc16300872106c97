"""The CUDA prefill recurrence kernel's Python side on a machine without a GPU (kernels/gdn.py
gated_delta_prefill, gpu_runner.GpuPrefill): its source and launch, which forwards take it, the
load-time check and the fallback, with the fp32 reference standing in for the kernel.

The kernel itself runs only on CUDA: scripts/gpu/gpu_prefill.py checks and times it there.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from adapters import kernels, load_adapter
from adapters.kernels import cuda_qmm, gdn
from adapters.qwen3_5 import backends, layers
from core import AutoregressiveDecoder, PrefixCache, Prompt, SamplerConfig, SpeculativeDecoder
from core.stream import prefill

SHAPE = kernels.GDN_CHECK_SHAPE  # Hk, Hv, Dk, Dv
GREEDY = SamplerConfig(0.0, 1.0, 0, 0.0)


def _final_reference(q, k, v, g, beta, state):
    """The kernel's contract from the fp32 reference: y in q's dtype, the last state."""
    y, states = gdn.gated_delta_reference(q, k, v, g, beta, state)
    return y.astype(q.dtype), states[-1]


def _stand_in(launches: list):
    """gated_delta_prefill's stand-in: the reference, noting each launch's q shape."""
    def stand_in(q, k, v, g, beta, state):
        launches.append(tuple(q.shape))
        return _final_reference(q, k, v, g, beta, state)
    return stand_in


class _FakeCudaKernel:
    """mx.fast.cuda_kernel's stand-in: keeps what the kernel was built from and each launch's
    arguments, and answers a launch with the reference's outputs (checked against the
    shapes and dtypes the launch asked for)."""

    built: list = []
    launches: list = []

    def __init__(self, **spec):
        _FakeCudaKernel.built.append(spec)

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        _FakeCudaKernel.launches.append(dict(template=template, grid=grid, threadgroup=threadgroup,
                                             shapes=output_shapes, dtypes=output_dtypes))
        y, final = _final_reference(*inputs)
        assert [tuple(y.shape), tuple(final.shape)] == [tuple(s) for s in output_shapes]
        return [y.astype(output_dtypes[0]), final.astype(output_dtypes[1])]


@pytest.fixture
def fake_cuda_kernel(monkeypatch):
    monkeypatch.setattr(mx.fast, "cuda_kernel", _FakeCudaKernel)
    _FakeCudaKernel.built, _FakeCudaKernel.launches = [], []
    gdn._prefill_kernel.cache_clear()
    yield _FakeCudaKernel
    gdn._prefill_kernel.cache_clear()


def test_the_prefill_kernel_reads_T_at_run_time(fake_cuda_kernel):
    """One kernel for every chunk length: T comes from q's shape (MLX passes `q_shape` to a
    source that names it), never from the template (each template value is an NVRTC compile)."""
    src = gdn.prefill_source()
    assert "const int T = q_shape[1];" in src and "constexpr int T" not in src
    assert gdn.GDN_BODY.split("GDN_STORE_STATES")[0] in src  # the decode kernel's arithmetic
    assert "GDN_STORE_STATES" not in src and "state_0" not in src and "state_out[" in src
    for T in (5, 37, 512):
        gdn.gated_delta_prefill(*gdn.random_inputs(mx.random.key(T), T, *SHAPE, dtype=mx.bfloat16))
    assert len(fake_cuda_kernel.built) == 1  # built once, launched for three lengths
    built = fake_cuda_kernel.built[0]
    assert built["source"] == src and built["input_names"] == ["q", "k", "v", "g", "beta", "state_in"]
    assert built["output_names"] == ["y", "state_out"]
    templates = {tuple(name for name, _ in launch["template"]) for launch in fake_cuda_kernel.launches}
    assert templates == {("InT", "Dk", "Dv", "Hk", "Hv")}


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
def test_the_prefill_launch_shapes_and_dtypes(fake_cuda_kernel, dtype):
    """One warp per value row (Dv rows of each of Hv heads, 4 warps a block, as the decode
    kernel); y in the inputs' dtype, the final state fp32; values as the reference's."""
    Hk, Hv, Dk, Dv = SHAPE
    args = gdn.random_inputs(mx.random.key(1), 9, Hk, Hv, Dk, Dv, dtype=dtype)
    y, final = gdn.gated_delta_prefill(*args)
    launch = fake_cuda_kernel.launches[-1]
    assert launch["grid"] == (32, Dv, Hv) and launch["threadgroup"] == (32, 4, 1)
    assert dict(launch["template"]) == {"InT": dtype, "Dk": Dk, "Dv": Dv, "Hk": Hk, "Hv": Hv}
    assert y.shape == (1, 9, Hv, Dv) and y.dtype == dtype
    assert final.shape == (1, Hv, Dv, Dk) and final.dtype == mx.float32
    want_y, want_final = _final_reference(*args)
    assert bool(mx.array_equal(y, want_y)) and bool(mx.array_equal(final, want_final))


def test_prefill_supported():
    assert gdn.prefill_supported((1, 512, 16, 128), (1, 512, 32, 128), mx.float32)
    assert gdn.prefill_supported((1, 1, 2, 64), (1, 1, 4, 32), mx.float32)
    assert gdn.prefill_supported((1, 32768, 16, 128), (1, 32768, 32, 128), mx.float32)  # any length
    assert not gdn.prefill_supported((1, 0, 16, 128), (1, 0, 32, 128), mx.float32)
    assert not gdn.prefill_supported((2, 512, 16, 128), (2, 512, 32, 128), mx.float32)  # one sequence a launch
    assert not gdn.prefill_supported((1, 512, 16, 48), (1, 512, 32, 128), mx.float32)    # Dk % 32
    assert not gdn.prefill_supported((1, 512, 16, 128), (1, 512, 32, 128), mx.bfloat16)  # state dtype
    assert not gdn.prefill_supported((1, 512, 3, 128), (1, 512, 32, 128), mx.float32)    # Hv % Hk
    T = 2**31 // (32 * 128)  # y's offsets would pass the int range
    assert gdn.prefill_supported((1, T - 1, 16, 128), (1, T - 1, 32, 128), mx.float32)
    assert not gdn.prefill_supported((1, T, 16, 128), (1, T, 32, 128), mx.float32)
    assert not gdn.prefill_supported((512, 16, 128), (512, 32, 128), mx.float32)  # no batch axis


def _recurrence_inputs(B: int, T: int, seed: int = 0):
    keys = [mx.random.key(seed + b) for b in range(B)]
    per = [gdn.random_inputs(key, T, *SHAPE, dtype=mx.bfloat16) for key in keys]
    return [mx.concatenate([p[i] for p in per]) for i in range(6)]


def test_the_cuda_long_runner_takes_the_kernel_only_for_unmasked_uncaptured_forwards(monkeypatch):
    launches = []
    monkeypatch.setattr(gdn, "gated_delta_prefill", _stand_in(launches))
    run = backends.GpuPrefill()
    q, k, v, g, beta, state = _recurrence_inputs(1, 13)
    y, states = run.recurrence(q, k, v, g, beta, state, None, False)
    assert launches == [(1, 13, 2, 64)] and len(states) == 1
    want_y, want_states = gdn.gated_delta_reference(q, k, v, g, beta, state)
    assert bool(mx.array_equal(y, want_y.astype(y.dtype))) and bool(mx.array_equal(states[0], want_states[-1]))
    launches.clear()
    ys, every = run.recurrence(q, k, v, g, beta, state, None, True)  # capturing: every state, MLX's path
    assert launches == [] and len(every) == 13
    mask = mx.ones((1, 13), dtype=mx.bool_)
    masked, _ = run.recurrence(q, k, v, g, beta, state, mask, False)  # a padded batch: MLX's path
    assert launches == [] and masked.shape == y.shape
    assert float(mx.abs(masked.astype(mx.float32) - y.astype(mx.float32)).max()) < 0.02  # the same rule


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_the_cuda_long_runners_conv_is_its_taps_summed_in_fp32_at_any_length(dtype):
    """GpuPrefill.conv (no cuDNN plan per chunk length): the fp32 sum of the taps rounded once,
    the same from one shapeless trace at every length, and nn.Conv1d's result to rounding."""
    C, K = 24, 4
    conv1d = nn.Conv1d(C, C, K, groups=C, bias=False)
    conv1d.weight = (mx.random.normal(conv1d.weight.shape, key=mx.random.key(3)) * 0.5).astype(dtype)
    # What conv reads of a layer's GdnParams: its conv module, K and the taps.
    p = SimpleNamespace(K=K, attn=SimpleNamespace(conv1d=conv1d),
                        taps=[layers._const(conv1d.weight[:, k, 0]) for k in range(K)])
    run = backends.GpuPrefill()
    for S in (1, 7, 64, 301, 7):
        x = mx.random.normal((1, S + K - 1, C), key=mx.random.key(S)).astype(dtype)
        got = run.conv(p, x, S)
        acc = sum(x[:, k:k + S].astype(mx.float32) * p.taps[k].astype(mx.float32) for k in range(K))
        assert got.shape == (1, S, C) and got.dtype == dtype
        assert bool(mx.array_equal(got, acc.astype(dtype))), S
        ref = conv1d(x).astype(mx.float32)
        assert float(mx.abs(got.astype(mx.float32) - ref).max()) <= (0.05 if dtype == mx.bfloat16 else 1e-5)


def test_an_unmasked_batch_runs_one_sequence_a_launch(monkeypatch):
    launches = []
    monkeypatch.setattr(gdn, "gated_delta_prefill", _stand_in(launches))
    run = backends.GpuPrefill()
    q, k, v, g, beta, state = _recurrence_inputs(3, 11, seed=5)
    y, (final,) = run.recurrence(q, k, v, g, beta, state, None, False)
    assert launches == [(1, 11, 2, 64)] * 3 and y.shape == (3, 11, 4, 32) and final.shape == (3, 4, 32, 64)
    for b in range(3):
        one = [a[b:b + 1] for a in (q, k, v, g, beta, state)]
        y1, (f1,) = run.recurrence(*one, None, False)
        assert bool(mx.array_equal(y[b:b + 1], y1)) and bool(mx.array_equal(final[b:b + 1], f1))


def test_cuda_loads_take_the_prefill_runner_and_others_do_not(monkeypatch):
    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: None)
    cuda = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)
    assert cuda.name == "cuda-kernels" and type(cuda.long) is backends.GpuPrefill
    assert type(cuda.few) is not backends.GpuPrefill and cuda.batch is cuda.few  # batches: the few runner
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    metal = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=False)
    assert metal.name == "metal-kernels" and type(metal.long) is backends.MlxOps  # mlx-lm's own Metal kernel
    for kw in (dict(gpu_kernels=False), dict(device=mx.cpu)):
        b = backends.choose("native", [nn.RoPE(8)], **{"device": mx.gpu, "cuda": True, **kw})
        assert type(b.long) is backends.MlxOps, kw


def _with_prefill_stand_in(ad, monkeypatch, launches):
    monkeypatch.setattr(gdn, "gated_delta_prefill", _stand_in(launches))
    ad.backend = backends.Backend("stand-in", backends.MlxOps(row_invariant=True), backends.GpuPrefill())


def test_prefill_chunks_go_through_the_kernel_and_match_mlx_ops(tiny_checkpoint, monkeypatch):
    """core.stream.prefill on the CUDA long runner: each chunk, however short, one launch per
    Gated-DeltaNet layer; the cache it leaves equals MLX's ops path's to rounding, and it
    prefills the same, to float32 rounding, whether or not the chunks end at a prefix-cache mark
    (the kernel's own result does not depend on the cut, bit for bit: check_gdn_prefill's test)."""
    ad = load_adapter(tiny_checkpoint(linear_key_head_dim=32), compute_dtype="native")
    gdn_layers = [i for i, p in enumerate(ad.stack.layers) if isinstance(p, layers.GdnParams)]
    n_gdn = len(gdn_layers)
    ids = tuple(int(i) for i in np.random.default_rng(0).integers(3, 200, size=45))
    plain = ad.make_cache()
    want = prefill(ad, Prompt(ids), plain, None, chunk=16)
    launches = []
    _with_prefill_stand_in(ad, monkeypatch, launches)
    cache = ad.make_cache()
    got = prefill(ad, Prompt(ids), cache, None, chunk=16)
    assert sorted(launches) == sorted([(1, 16, 2, 32)] * (2 * n_gdn) + [(1, 13, 2, 32)] * n_gdn)
    f32 = mx.float32
    assert float(mx.abs(got.logits.astype(f32) - want.logits.astype(f32)).max()) < 0.05 * float(mx.abs(want.logits).max())
    states = [(cache[i][1], plain[i][1]) for i in gdn_layers]
    assert len(states) == n_gdn and all(float(mx.abs(a - b).max()) < 0.02 * float(mx.abs(b).max()) for a, b in states)
    launches.clear()
    marked = ad.make_cache()
    again = prefill(ad, Prompt(ids, (7,)), marked, None, chunk=16)  # chunks 7, 16, 16, 6: counted from the mark
    assert sorted(launches) == sorted([(1, 7, 2, 32), (1, 16, 2, 32), (1, 16, 2, 32), (1, 6, 2, 32)] * n_gdn)
    # Other chunk ends give other row counts to the linears around the kernel: MLX's CPU matmul
    # (its BLAS) may sum 7 rows otherwise than 16 (it does on AMD EPYC), so float32 rounding only.
    diff = float(mx.abs(again.logits.astype(f32) - got.logits.astype(f32)).max())
    print("marked vs unmarked chunks, max logit difference:", diff)
    assert diff <= 1e-4 * float(mx.abs(got.logits).max())
    assert int(mx.argmax(again.logits[0, -1])) == int(mx.argmax(got.logits[0, -1]))


def test_greedy_mtp_equals_ar_with_the_prefill_kernel_through_the_prefix_cache(tiny_checkpoint, monkeypatch):
    """Both lanes prefill through the kernel (the reference in its place), every chunk of them,
    fresh and restored from the prefix cache (then only the chunk after the snapshot): greedy
    MTP == AR at depths 1-3, and a restored lane decodes what a fresh one does."""
    ad = load_adapter(tiny_checkpoint(linear_key_head_dim=32), compute_dtype="native")
    n_gdn = sum(isinstance(p, layers.GdnParams) for p in ad.stack.layers)
    launches = []
    _with_prefill_stand_in(ad, monkeypatch, launches)
    ids = [5, 9, 13, 21, 34, 55, 89, 144, 7, 11, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53]
    prompt = Prompt(tuple(ids), (8,))
    ar, _ = AutoregressiveDecoder(ad, sampler=GREEDY).generate(prompt, max_tokens=16)
    assert sorted(w for _, w, _, _ in launches) == [8] * n_gdn + [12] * n_gdn  # chunks end at the mark
    for depth in (1, 2, 3):
        assert SpeculativeDecoder(ad, sampler=GREEDY, depth=depth).generate(prompt, max_tokens=16)[0] == ar, depth
    pc = PrefixCache(2**30)
    first, _ = SpeculativeDecoder(ad, sampler=GREEDY, depth=2, prefix_cache=pc).generate(prompt, max_tokens=16)
    launches.clear()
    restored, st = SpeculativeDecoder(ad, sampler=GREEDY, depth=2, prefix_cache=pc).generate(prompt, max_tokens=16)
    assert st.cached_tokens == 8 and [w for _, w, _, _ in launches] == [12] * n_gdn
    assert first == restored == ar


def _row_stand_in(x, w, scales, biases, bits, group_size, residual=None, config=None, swiglu=False):
    x = cuda_qmm.swiglu_rows(x) if swiglu else x
    y = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)
    return y if residual is None else residual + y


def _steps_stand_in(q, k, v, g, beta, state, backend="cuda"):
    y, states = gdn.gated_delta_reference(q, k, v, g, beta, state)
    return y.astype(q.dtype), states


@pytest.fixture
def fresh_verdict(monkeypatch):
    """backends' load-time check as it runs at load (not remembered from another test)."""
    monkeypatch.setattr(backends, "_checked_once", set())
    backends._verdict.cache_clear()
    yield
    backends._verdict.cache_clear()


def test_the_load_check_covers_the_prefill_kernel_and_a_failure_falls_back(monkeypatch, fresh_verdict):
    """kernels.self_check("cuda") runs check_gdn_prefill: with the reference for the kernel it
    passes; a kernel off its reference, or one whose result depends on the chunk's length,
    fails it, and the load falls back to MLX's own path (mlx-lm's gated_delta_ops for prefill)."""
    monkeypatch.setattr(cuda_qmm, "quantized_matmul_rows", _row_stand_in)
    monkeypatch.setattr(gdn, "gated_delta_steps", _steps_stand_in)
    monkeypatch.setattr(gdn, "gated_delta_prefill", _final_reference)
    assert kernels.check_gdn_prefill() is None and kernels.self_check("cuda") is None

    def off(*args):
        y, final = _final_reference(*args)
        return (y.astype(mx.float32) * 1.05).astype(y.dtype), final

    def length_dependent(*args):  # the last state a little off after odd lengths (37, 17; not 20)
        y, final = _final_reference(*args)
        T = args[0].shape[1]
        return y, final * (1 + 1e-5 * T * (T % 2))

    for broken, why in ((off, "differs from its reference"), (length_dependent, "depends on where the positions are cut")):
        monkeypatch.setattr(gdn, "gated_delta_prefill", broken)
        assert why in kernels.self_check("cuda")
        backends._verdict.cache_clear()
        said = []
        b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, fused=False, log=said.append)
        assert b.name == "mlx" and type(b.long) is backends.MlxOps and why in b.note and said


def test_the_gpu_prefill_script_runs_with_the_stand_in(tmp_path, monkeypatch):
    """scripts/gpu/gpu_prefill.py's plumbing on the CPU at small sizes (the reference for the
    kernel): the kernel checks, the layer timing, our prefill vs mlx-lm's and both against float32,
    the chunk sweep."""
    from scripts.gpu import gpu_prefill

    monkeypatch.setattr(gdn, "gated_delta_prefill", gdn.gated_delta_prefill)  # --stand-in replaces it
    out = tmp_path / "prefill.json"
    rc = gpu_prefill.main(["--model", "models/demo", "--json", str(out), "--stand-in", "--check-lengths", "1", "7",
                           "--layer-tokens", "8", "--lengths", "40", "--chunks", "16", "32", "--sweep-length", "40",
                           "--repeats", "1"])
    report = json.loads(out.read_text())
    assert rc == 0 and report["stand_in"] and report["long_runner"] == "GpuPrefill"
    assert set(report["kernel_checks"]) == {"1", "7"} and all(r["ok"] for r in report["kernel_checks"].values())
    assert set(report["layer_ms"]) == {"kernel", "gated_delta_ops", "tokens", "speedup"}
    row = report["prefill"]["40"]
    assert row["ours"]["tok_s"] > 0 and row["mlx_lm"]["tok_s"] > 0 and row["ratio"] > 0
    assert set(report["chunk_sweep"]["chunks"]) == {"16", "32"} and report["chunk_sweep"]["fastest"] in (16, 32)
    ref = report["fp32_reference"]  # both prefills held to a float32 run of the same weights
    assert ref["tokens"] == 40 and 0 <= ref["ours_vs_fp32"] < 0.05 and 0 <= ref["mlx_lm_vs_fp32"] < 0.05


def test_the_chunk_probe_takes_a_restored_chunk_apart(tmp_path):
    """scripts/gpu/gpu_chunk_probe.py on the demo model at a small depth: a snapshot at the mark,
    then each size of new tokens restored, copied and through the engine, each part timed; the
    overlap variants and the sizes by depth (small, for the CPU: the defaults are the H200's)."""
    from scripts.gpu import gpu_chunk_probe

    out = tmp_path / "probe.json"
    assert gpu_chunk_probe.main(["--model", "models/demo", "--depth", "100", "--tokens", "5", "40", "--repeats", "2",
                                 "--overlap", "30", "--fresh-prefill", "60", "--depths", "0", "50", "--fresh", "37", "41",
                                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["depth"] == 100 and set(report["sizes"]) == {"5", "40"}
    for row in report["sizes"].values():
        assert all(len(row[k]) == 2 for k in ("restored", "copied", "engine"))
        assert all(r["total_s"] >= r["trunk_s"] > 0 for r in row["restored"] + row["copied"])
        assert row["engine"][0]["parts"]["chunks"] == 1 and row["median_after_first"]["engine"] > 0
    assert [r["conv"] for r in report["first_use"].values()] == ["ours", "mlx_conv1d"]
    assert all(r["first_s"] > 0 and r["second_s"] > 0 for r in report["first_use"].values())
    # whole prefills under the four overlap variants, and each size after each depth's snapshot
    assert set(report["overlap"]) == {"30 after 100", "60 fresh"}
    assert all(set(v) == {"pipeline+submit", "pipeline", "submit", "neither"} and all(x["median_s"] > 0 for x in v.values())
               for v in report["overlap"].values())
    assert set(report["by_depth"]) == {"0+5", "0+40", "50+5", "50+40"} and "cleared" not in report   # cleared: CUDA only


def test_the_chunk_parts_script_times_a_chunk_and_its_kernel_classes(tmp_path):
    """scripts/gpu/gpu_chunk_parts.py on the demo model (--stand-in: no CUDA classes): a chunk's
    host build, encode and wait within its wall time, its primitives, and the classes' sum."""
    from scripts.gpu import gpu_chunk_parts

    out = tmp_path / "parts.json"
    assert gpu_chunk_parts.main(["--model", "models/demo", "--tokens", "16", "--stand-in", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["sizes"]["16"]
    c = row["chunk"]
    assert 0 < c["build_ms"] <= c["wall_ms"] and c["encode_ms"] >= 0 and c["wait_ms"] >= 0
    assert row["primitives"] == sum(row["kinds"].values()) > 0 and row["chunk_submitting"]["wall_ms"] > 0
    assert {"rms_norm (hidden)", "swiglu (compiled)"} <= set(row["classes"]) and row["classes_sum_ms"] > 0
