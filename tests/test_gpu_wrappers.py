"""The GPU kernels' Python side, on a machine without a GPU: shape rules, dispatch, the
setting that turns them off, fallbacks, and the adapter's hooks driven by a stand-in kernel.

The kernels themselves run only on CUDA / Metal: scripts/gpu/gpu_check.py tests them there.
"""
from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from adapters import kernels, load_adapter
from adapters.kernels import cuda_qmm as gk, gdn
from adapters.qwen3_5 import backends, mlx_ops
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, sampling
from tests._ties import assert_greedy_equal

BF = mx.bfloat16


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_qmm_supported_accepts_the_kernel_shapes(bits, group):
    K, N = 4096, 248320
    w_shape = (N, K * bits // 32)
    for rows in range(1, 17):  # one or two tiles of 8 token columns
        assert gk.qmm_supported((1, rows, K), BF, w_shape, BF, bits, group)
    assert gk.qmm_supported((2, 3, K), mx.float16, w_shape, mx.float16, bits, group)


@pytest.mark.parametrize("change", [
    dict(x_shape=(17, 4096)),                      # more rows than two mma tiles
    dict(x_shape=(0, 4096)),
    dict(x_dtype=mx.float32, s_dtype=mx.float32),  # the fp32 path keeps MLX's kernels
    dict(s_dtype=mx.float16),                      # scales of another dtype
    dict(w_shape=(4100, 512)),                     # N not a multiple of 32 rows
    dict(bits=3), dict(bits=2), dict(group=16),
    dict(mode="mxfp4"), dict(has_biases=False),
    dict(x_shape=(1, 4000), w_shape=(4096, 500)),  # K not whole warp chunks
    dict(w_shape=(4096, 256)),                     # packed width does not match K
])
def test_qmm_supported_refuses_the_rest(change):
    args = dict(x_shape=(1, 4096), x_dtype=BF, w_shape=(4096, 512), s_dtype=BF, bits=4, group=64,
                mode="affine", has_biases=True)
    args.update(change)
    assert not gk.qmm_supported(args["x_shape"], args["x_dtype"], args["w_shape"], args["s_dtype"],
                                args["bits"], args["group"], args["mode"], args["has_biases"])


def test_gdn_supported():
    assert gdn.gdn_supported((1, 8, 16, 128), (1, 8, 32, 128), mx.float32)
    assert gdn.gdn_supported((1, 1, 2, 32), (1, 1, 4, 16), mx.float32)
    assert not gdn.gdn_supported((1, 9, 16, 128), (1, 9, 32, 128), mx.float32)  # T > 8
    assert not gdn.gdn_supported((2, 1, 16, 128), (2, 1, 32, 128), mx.float32)  # batch
    assert not gdn.gdn_supported((1, 1, 16, 48), (1, 1, 32, 128), mx.float32)   # Dk % 32
    assert not gdn.gdn_supported((1, 1, 16, 128), (1, 1, 32, 128), mx.bfloat16)  # state dtype
    assert not gdn.gdn_supported((1, 1, 3, 128), (1, 1, 32, 128), mx.float32)   # Hv % Hk


def test_one_gdn_body_for_both_backends():
    cuda, metal = gdn.gdn_source(3, "cuda"), gdn.gdn_source(3, "metal")
    body = gdn.GDN_BODY.split("GDN_STORE_STATES")[0]
    assert body in cuda and body in metal
    assert "thread_index_in_simdgroup" in metal and "threadIdx" not in metal
    assert "threadIdx" in cuda and "simdgroup" not in cuda
    assert [f"state_{i}[" in cuda for i in range(4)] == [True, True, True, False]


def test_gdn_reference_is_mlx_lm_recurrence():
    from mlx_lm.models.gated_delta import gated_delta_ops

    key = mx.random.key(0)
    k1, k2, k3, k4, k5, k6 = mx.random.split(key, 6)
    T, Hk, Hv, Dk, Dv = 3, 2, 4, 32, 16
    q = mx.random.normal((1, T, Hk, Dk), key=k1) * 0.2
    k = mx.random.normal((1, T, Hk, Dk), key=k2) * 0.2
    v = mx.random.normal((1, T, Hv, Dv), key=k3)
    g = mx.random.uniform(0.5, 1.0, (1, T, Hv), key=k4)
    beta = mx.random.uniform(0.0, 1.0, (1, T, Hv), key=k5)
    state = mx.random.normal((1, Hv, Dv, Dk), key=k6) * 0.1
    y, states = gdn.gated_delta_reference(q, k, v, g, beta, state)
    y_ops, final = gated_delta_ops(q, k, v, g, beta, state)
    assert len(states) == T
    np.testing.assert_allclose(np.array(y), np.array(y_ops), atol=1e-5)
    np.testing.assert_allclose(np.array(states[-1]), np.array(final), atol=1e-5)


def test_the_reference_recurrence_is_mlx_lm_ops_in_every_dtype():
    """kernels/gdn.recurrence (what the CPU-compiled backend traces and the kernels are held to)
    keeps mlx-lm's arithmetic: its states and outputs equal gated_delta_ops' to rounding."""
    from mlx_lm.models.gated_delta import gated_delta_ops

    keys = mx.random.split(mx.random.key(3), 6)
    T, Hk, Hv, Dk, Dv = 4, 2, 4, 32, 16
    for dtype in (mx.float32, mx.bfloat16):
        q = (mx.random.normal((1, T, Hk, Dk), key=keys[0]) * 0.2).astype(dtype)
        k = (mx.random.normal((1, T, Hk, Dk), key=keys[1]) * 0.2).astype(dtype)
        v = mx.random.normal((1, T, Hv, Dv), key=keys[2]).astype(dtype)
        g = mx.random.uniform(0.5, 1.0, (1, T, Hv), key=keys[3])
        beta = mx.random.uniform(0.0, 1.0, (1, T, Hv), key=keys[4]).astype(dtype)
        state = mx.random.normal((1, Hv, Dv, Dk), key=keys[5]) * 0.1
        y, states = gdn.recurrence(q, k, v, g, beta, state)
        y_ops, final = gated_delta_ops(q, k, v, g, beta, state)
        assert y.dtype == dtype and len(states) == T and states[0].shape == state.shape
        tol = 1e-5 if dtype == mx.float32 else 2e-2
        np.testing.assert_allclose(np.array(y.astype(mx.float32)), np.array(y_ops.astype(mx.float32)), atol=tol)
        np.testing.assert_allclose(np.array(states[-1]), np.array(final), atol=1e-5)


def test_kernel_backend_choice():
    assert backends.kernel_backend(device=mx.cpu, cuda=True, kernels_on=True) is None
    assert backends.kernel_backend(device=mx.gpu, cuda=True, kernels_on=False) is None  # gpu_kernels = false
    assert backends.kernel_backend(device=mx.gpu, cuda=True, kernels_on=True) == "cuda"
    assert backends.kernel_backend() is None  # this machine: CPU
    assert not kernels.cuda_available()


def _quantized_linear(K=256, N=64, bits=4, group=64, dtype=BF):
    lin = nn.QuantizedLinear.from_linear(nn.Linear(K, N, bias=False), group_size=group, bits=bits)
    lin.set_dtype(dtype)
    return lin


def _stand_in_kernel(calls: list):
    """The row kernel's stand-in on the CPU: MLX's quantized matmul (+ the residual), noting
    each launch's (rows, N, residual given)."""
    def stand_in(x, w, scales, biases, bits, group_size, residual=None, config=None, swiglu=False):
        calls.append((x.size // x.shape[-1], w.shape[0], residual is not None) + (("swiglu",) if swiglu else ()))
        x = gk.swiglu_rows(x) if swiglu else x
        y = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)
        return y if residual is None else residual + y
    return stand_in


def test_cuda_runner_takes_the_kernel_where_it_applies_and_leaves_the_model_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(gk, "quantized_matmul_rows", _stand_in_kernel(calls))
    lin, emb = _quantized_linear(), nn.QuantizedEmbedding(64, 256, group_size=64, bits=4)
    emb.set_dtype(BF)
    before = [type(lin), type(emb), [k for k, _ in tree_flatten(lin.parameters())]]
    x = mx.random.normal((1, 3, 256)).astype(BF)
    stock = lin(x)  # the module itself: MLX's own path, what mlx_lm.stream_generate runs
    assert calls == [] and bool(mx.any(stock != 0))
    run = backends.GpuKernels("cuda")  # on CUDA the row kernel is the default
    assert bool(mx.array_equal(run.linear(lin, x), stock)) and calls == [(3, 64, False)]
    assert bool(mx.array_equal(run.lm_head(emb, True, x), emb.as_linear(x)))  # the tied output projection
    assert calls[-1] == (3, 64, False)
    calls.clear()
    wide = mx.random.normal((2, 9, 256)).astype(BF)  # a batch wider than one launch: 8 rows at a time
    assert not gk.TWO_TILES["on"]   # two tiles a launch: a trial, off by default
    assert bool(mx.array_equal(run.linear(lin, wide), lin(wide)))
    assert calls == [(8, 64, False), (8, 64, False), (2, 64, False)]
    calls.clear()
    monkeypatch.setitem(gk.TWO_TILES, "on", True)  # tried, and past its load check: 16 at a time
    assert bool(mx.array_equal(run.linear(lin, wide), lin(wide)))
    assert calls == [(16, 64, False), (2, 64, False)]
    calls.clear()
    lin32 = _quantized_linear(dtype=mx.float32)
    run.linear(lin32, x.astype(mx.float32))
    assert calls == []  # fp32: MLX's path
    assert not backends.GpuKernels("metal").row_kernel  # Metal: MLX's matvec
    assert not backends.GpuKernels("cuda", row_kernel=False).row_kernel
    assert [type(lin), type(emb), [k for k, _ in tree_flatten(lin.parameters())]] == before


def test_a_dense_mlp_is_two_launches_with_the_activation_read_inside_down_proj(monkeypatch):
    """gate|up as one product, then down_proj reading silu(gate) * up from it and adding the
    residual: no split and no activation launch between them; the same values as the ops with
    the kernel's SwiGLU (swiglu_rows), and close to mlx-lm's own MLP."""
    from adapters.qwen3_5 import layers

    calls = []
    monkeypatch.setattr(gk, "quantized_matmul_rows", _stand_in_kernel(calls))
    mlp = nn.Module()
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = _quantized_linear(N=128), _quantized_linear(N=128), _quantized_linear(K=128, N=256)
    x = mx.random.normal((1, 3, 256)).astype(BF)
    res = mx.random.normal((1, 3, 256)).astype(BF)
    stock = res + mlp.down_proj(nn.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    run = backends.GpuKernels("cuda")
    plain = layers.mlp(run, layers.MlpParams(mlp), x, residual=res)  # the default: the activation as ops
    assert calls == [(3, 256, False), (3, 256, True)]
    calls.clear()
    run.swiglu_mlp = True  # the "swiglu" trial
    y = layers.mlp(run, layers.MlpParams(mlp), x, residual=res)
    assert calls == [(3, 256, False), (3, 256, True, "swiglu")]
    assert float(mx.abs(plain.astype(mx.float32) - stock.astype(mx.float32)).max()) < 0.05 * float(mx.abs(stock).max())
    gate_up = mx.concatenate([mlp.gate_proj(x), mlp.up_proj(x)], axis=-1)
    assert bool(mx.array_equal(y, res + mlp.down_proj(gk.swiglu_rows(gate_up))))
    assert float(mx.abs(y.astype(mx.float32) - stock.astype(mx.float32)).max()) < 0.05 * float(mx.abs(stock).max())
    calls.clear()
    assert layers.mlp(backends.GpuKernels("cuda", row_kernel=False), layers.MlpParams(mlp), x, res).shape == y.shape
    assert calls == []  # without the row kernel: MLX's matmuls and activation


def test_linears_sharing_an_input_run_as_one_product(monkeypatch):
    """q/k/v, gate/up and a Gated-DeltaNet layer's input projections: one launch over the rows
    of all of them; each module keeps a view of its rows, so the model computes what it did."""
    calls = []
    monkeypatch.setattr(gk, "quantized_matmul_rows", _stand_in_kernel(calls))
    mods = [_quantized_linear(N=n) for n in (64, 32, 16)]
    x = mx.random.normal((1, 2, 256)).astype(BF)
    alone = [m(x) for m in mods]
    run = backends.GpuKernels("cuda")
    ys = run.linears(mods, x)
    assert calls == [(2, 112, False)]
    assert all(bool(mx.array_equal(y, a)) for y, a in zip(ys, alone))
    assert all(bool(mx.array_equal(m(x), a)) for m, a in zip(mods, alone))  # the modules after joining
    assert all(m["weight"].shape == (n, 32) for m, n in zip(mods, (64, 32, 16)))
    run.linears(mods, x)
    assert len(calls) == 2  # joined once, reused
    calls.clear()
    mixed = [_quantized_linear(N=64), _quantized_linear(N=64, bits=8)]
    ys = run.linears(mixed, x)
    assert calls == [(2, 64, False), (2, 64, False)]  # other quantizations: each alone
    assert all(bool(mx.array_equal(y, m(x))) for y, m in zip(ys, mixed))


def test_the_residual_is_added_inside_the_product(monkeypatch):
    calls = []
    monkeypatch.setattr(gk, "quantized_matmul_rows", _stand_in_kernel(calls))
    lin = _quantized_linear()
    x, h = mx.random.normal((1, 3, 256)).astype(BF), mx.random.normal((1, 3, 64)).astype(BF)
    y = backends.GpuKernels("cuda").linear_add(lin, x, h)
    assert calls == [(3, 64, True)] and bool(mx.array_equal(y, h + lin(x)))
    assert bool(mx.array_equal(backends.MlxOps().linear_add(lin, x, h), h + lin(x)))  # the reference


def test_cuda_runner_gives_mlx_at_most_four_rows_a_call():
    """Without the row kernel: MLX CUDA's quantized matmul computes each of up to 4 rows as it computes one row; wider
    inputs (a depth-4+ verify, a batch) go in slices of 4 so each row stays the decode step's."""
    seen = []

    def module(x):
        seen.append(x.shape)
        return mx.concatenate([x, -x], axis=-1)

    run = backends.GpuKernels("cuda", row_kernel=False)
    for shape, calls in [((1, 1, 8), [(1, 1, 8)]), ((1, 4, 8), [(1, 4, 8)]),
                         ((1, 9, 8), [(4, 8), (4, 8), (1, 8)]), ((3, 2, 8), [(4, 8), (2, 8)])]:
        seen.clear()
        x = mx.random.normal(shape)
        y = run.linear(module, x)
        assert seen == calls, shape
        assert bool(mx.array_equal(y, mx.concatenate([x, -x], axis=-1)))
    # (Metal: as many rows a call as MLX's matmul keeps as alone, checked per shape; tests below.)


def _reference_kernel(seen: list, what):
    """A stand-in for the recurrence kernel (the fp32 reference), noting what(q) of each launch."""
    def stand_in(q, k, v, g, beta, state, backend="cuda"):
        seen.append(what(q))
        y, states = gdn.gated_delta_reference(q, k, v, g, beta, state)
        return y.astype(q.dtype), states
    return stand_in


def test_cuda_recurrence_runs_a_batch_one_sequence_a_launch(monkeypatch):
    """A batch's Gated-DeltaNet steps: each sequence through the kernel alone (the kernel takes
    one sequence), so a batched sequence's states are the ones it gets decoding alone."""
    launches = []
    monkeypatch.setattr(gdn, "gated_delta_steps", _reference_kernel(launches, lambda q: q.shape[0]))
    B, T, Hk, Hv, Dk, Dv = 3, 2, 2, 4, 64, 32
    keys = mx.random.split(mx.random.key(1), 6)
    q = mx.random.normal((B, T, Hk, Dk), key=keys[0]) * Dk**-0.5
    k = mx.random.normal((B, T, Hk, Dk), key=keys[1]) * Dk**-0.5
    v = mx.random.normal((B, T, Hv, Dv), key=keys[2])
    g = mx.random.uniform(0.5, 1.0, (B, T, Hv), key=keys[3])
    beta = mx.random.uniform(0.0, 1.0, (B, T, Hv), key=keys[4])
    state = mx.random.normal((B, Hv, Dv, Dk), key=keys[5]) * 0.1
    run = backends.GpuKernels("cuda")
    y, states = run.recurrence(q, k, v, g, beta, state, None, True)
    assert launches == [1, 1, 1] and y.shape == (B, T, Hv, Dv) and len(states) == T
    for b in range(B):
        y1, s1 = run.recurrence(q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1], beta[b:b + 1], state[b:b + 1], None, True)
        assert bool(mx.array_equal(y[b:b + 1], y1))
        assert all(bool(mx.array_equal(s[b:b + 1], one)) for s, one in zip(states, s1))


def test_few_and_long_runners():
    b = backends.Backend("cuda-kernels", backends.GpuKernels("cuda"), backends.MlxOps())
    assert b.runner((1, 1), fast=True) is b.few and b.runner((1, 8), fast=True) is b.few
    assert b.runner((1, 9), fast=True) is b.long          # wider than a verify
    assert b.runner((2, 3), fast=True) is b.long          # more than one sequence
    assert b.runner((1, 3), fast=False) is b.long         # chunked prefill keeps MLX's own path


def test_a_failed_kernel_check_falls_back_and_says_so(monkeypatch):
    said = []
    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: "it broke")
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, log=said.append)
    assert b.name == "mlx" and "cuda kernels failed their check: it broke" in b.note
    assert said == ["GPU kernels off (cuda: it broke); using MLX's own path."]
    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: None)
    assert backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True).name == "cuda-kernels"
    assert backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, gpu_kernels=False).name == "mlx"


def test_the_fused_kernels_are_forced_by_the_setting_and_checked_as_chosen(monkeypatch):
    """MTP_CHAT_GPU_FUSED=1 / 0 turns both fused CUDA kernels on / off whatever the default; the
    load-time check runs on exactly the kernels that will decode."""
    asked = []
    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: asked.append((backend, fused)))
    for fused, want in ((True, (True, True)), (False, (False, False)),
                        (None, (backends.FUSED_GDN, backends.FUSED_ATTENTION))):
        b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, compiled=False, fused=fused)
        assert (b.few.fused_gdn, b.few.fused_attention) == want and asked[-1] == ("cuda", want)
    from adapters.options import LoadOptions
    from core.settings import Settings
    assert LoadOptions.from_settings(Settings(gpu_fused=True)).gpu_fused is True
    assert LoadOptions.from_settings(Settings()).gpu_fused is None


def test_gpu_trials_are_off_by_default_and_turned_on_by_name(monkeypatch):
    """Kernel changes not yet measured to pay (settings.gpu_trials): off unless named; each named
    one reaches the runner (and says so in the load note); an unknown name is refused with the list.
    Two tiles a launch, measured to pay, are on by default where their load check passes (checked
    once a process), 8 rows a launch where it fails; the old trial name is accepted and changes nothing."""
    from adapters.options import LoadOptions
    from core.settings import Settings

    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: None)
    checked = []
    monkeypatch.setattr(kernels, "check_two_tiles", lambda *a: (checked.append(1), gk.TWO_TILES.update(on=True, why=None)))
    for k in ("on", "why"):
        monkeypatch.setitem(gk.TWO_TILES, k, gk.TWO_TILES[k])
    from functools import lru_cache
    # a cache of its own for this test (the fake check's verdict must not outlive it)
    monkeypatch.setattr(kernels, "_two_tiles_verdict", lru_cache(maxsize=None)(kernels._two_tiles_verdict.__wrapped__))
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)
    assert (b.few.submit_every, b.few.submit_verify_every, b.few.swiglu_mlp, gk.TWO_TILES["on"]) == (0, 0, False, True)
    assert b.few.submit_batch_verify_every == 8   # adopted: a batch's verify is handed every 8 layers
    assert checked == [1] and "8 rows a launch" not in b.note and "trials" not in b.note
    trials = LoadOptions.from_settings(Settings(gpu_trials=" swiglu, two-tiles,submit")).gpu_trials
    assert trials == {"submit", "swiglu"}
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, trials=trials)
    assert (b.few.submit_every, b.few.submit_verify_every, b.few.swiglu_mlp, gk.TWO_TILES["on"]) == (8, 0, True, True)
    assert checked == [1] and "trials on: submit, swiglu" in b.note and "8 rows a launch" not in b.note
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True,
                        trials=LoadOptions.from_settings(Settings(gpu_trials="verify-submit")).gpu_trials)
    assert (b.few.submit_every, b.few.submit_verify_every) == (0, 8) and "trials on: verify-submit" in b.note
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True,
                        trials=LoadOptions.from_settings(Settings(gpu_trials="batch-verify-wait")).gpu_trials)
    assert (b.few.submit_verify_every, b.few.submit_batch_verify_every) == (0, 0) and "batch-verify-wait" in b.note
    assert b.few.submit_batch_step_every == 0
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True,
                        trials=LoadOptions.from_settings(Settings(gpu_trials="batch-submit")).gpu_trials)
    assert (b.few.submit_batch_step_every, b.few.submit_batch_verify_every) == (8, 8) and "batch-submit" in b.note
    monkeypatch.setattr(kernels, "_two_tiles_verdict", lambda: (False, "9-16 rows in one launch differ"))
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)
    assert not gk.TWO_TILES["on"] and "batches' matmuls go 8 rows a launch (9-16 rows in one launch differ)" in b.note
    with pytest.raises(ValueError, match="'tiles' unknown; a comma list of submit, swiglu, verify-submit, batch-verify-wait, batch-submit, topk-mlx, topk-support"):
        Settings(gpu_trials="swiglu,tiles")


def test_the_topk_kernels_reference_is_the_samplers_support():
    """cuda_topk.reference, what the kernel is checked against at load, keeps the sampler's columns
    with its probabilities (SamplerConfig.support through MLX's ops), in the kernel's order, ties to
    the lower index; `supported` takes only wide rows and k <= MAX_K."""
    from adapters.kernels import cuda_topk

    x = (mx.random.normal((3, 20_000), key=mx.random.key(5)) * 3).astype(mx.bfloat16)
    for temp, k, top_p, min_p in ((0.6, 20, 0.95, 0.0), (1.0, 7, 1.0, 0.1), (0.3, 64, 0.5, 0.0)):
        idx, p = cuda_topk.reference(x, temp, k, top_p, min_p)
        want_idx, want_p = SamplerConfig(temperature=temp, top_k=k, top_p=top_p, min_p=min_p).support(x)
        for r in range(3):
            got = dict(zip(np.array(idx[r]).tolist(), np.array(p[r]).tolist()))
            want = dict(zip(np.array(want_idx[r]).tolist(), np.array(want_p[r]).tolist()))
            assert got.keys() == want.keys() and max(abs(got[c] - want[c]) for c in got) < 1e-6
        vals = np.array(x.astype(mx.float32))
        for r in range(3):   # the kernel's order: larger value first, of equal values the lower index
            pairs = [(-vals[r, c], c) for c in np.array(idx[r]).tolist()]
            assert pairs == sorted(pairs)
    tie = mx.where(mx.arange(20_000) % 997 == 3, mx.array(4.0), mx.zeros((20_000,)))[None]
    assert np.array(cuda_topk.reference(tie, 0.6, 5, 1.0, 0.0)[0]).tolist() == [[3, 1000, 1997, 2994, 3991]]
    assert cuda_topk.supported(mx.zeros((1, 248_320), mx.bfloat16), 20)
    assert not cuda_topk.supported(mx.zeros((1, 248_320), mx.bfloat16), 65)
    assert not cuda_topk.supported(mx.zeros((1, 8192)), 20)


def test_sampled_supports_go_through_the_backends_topk_kernel(tiny_model_dir, monkeypatch):
    """core.sampling.use_row_topk: a backend's top-k support serves both lanes' sampled draws and
    verifies where it takes the rows (a stand-in returning MLX's own support: the tokens stay
    those of MLX's path), never a grammar-masked row; a CUDA load sets the kernel where its check
    passed (the hook that also draws) and says why not where it failed ("topk-kernel" and
    "topk-draw", adopted, change nothing); "topk-support" sets the hook that leaves the draw to
    categorical, "topk-mlx" none."""
    from adapters.kernels import cuda_topk
    from adapters.options import LoadOptions
    from core import sampling
    from core.settings import Settings

    monkeypatch.setattr(sampling, "_row_topk", None)
    ad = load_adapter(tiny_model_dir)
    ids = ad.tokenizer.encode("Define harbor.")
    sampler = SamplerConfig(temperature=0.6, top_k=20, top_p=0.95)
    lanes = (("ar", AutoregressiveDecoder, {"seed": 3}), ("mtp", SpeculativeDecoder, {"depth": 2, "seed": 3}))
    want = {lane: list(dec(ad, sampler=sampler, **kw).generate(ids, max_tokens=12)[0]) for lane, dec, kw in lanes}
    seen = []
    plain = SamplerConfig.support

    def stand_in(logits, temperature, top_k, top_p, min_p):
        seen.append(logits.shape)
        sampling.use_row_topk(None)   # MLX's ops within the stand-in
        try:
            return plain(SamplerConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p), logits)
        finally:
            sampling.use_row_topk(stand_in)
    stand_in.supports = lambda x, k: True
    sampling.use_row_topk(stand_in)
    got = {lane: list(dec(ad, sampler=sampler, **kw).generate(ids, max_tokens=12)[0]) for lane, dec, kw in lanes}
    assert got == want and len(seen) >= 12
    seen.clear()
    SamplerConfig(temperature=0.6, top_k=20).support(mx.zeros((1, 64)), allowed=mx.ones((1, 64), dtype=mx.bool_))
    assert not seen   # a grammar's mask keeps MLX's ops
    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: None)
    monkeypatch.setattr(kernels, "_two_tiles_verdict", lambda: (True, None))
    def trials(names):
        return LoadOptions.from_settings(Settings(gpu_trials=names)).gpu_trials
    for verdict in (None, "the top-k support kernel keeps other columns than the reference"):
        monkeypatch.setattr(kernels, "topk_verdict", lambda draw=False, v=verdict: v)
        for names in ("", "topk-kernel", "topk-draw", "topk-kernel,topk-draw"):
            b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, trials=trials(names))
            assert sampling._row_topk is (cuda_topk.row_topk_drawing if verdict is None else None)
            assert (f"sampled supports through MLX's ops ({verdict})" in b.note) == (verdict is not None)
    asked = []
    monkeypatch.setattr(kernels, "topk_verdict", lambda draw=False: asked.append(draw))
    backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, trials=trials("topk-support"))
    assert sampling._row_topk is cuda_topk.row_topk_support and asked == [False]   # its check skips the draw
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, trials=trials("topk-mlx"))
    assert sampling._row_topk is None and "trials on: topk-mlx" in b.note
    backends.choose("native", [nn.RoPE(8)], device=mx.cpu, cuda=False)
    assert sampling._row_topk is None


def test_a_verify_of_several_sequences_is_handed_to_the_device_in_parts(monkeypatch):
    """layers._submit: with the GPU runner's defaults a verify of several sequences starts the
    device every 8 layers (never after the last), while one sequence's verify, a batch's plain
    step and one sequence's step are handed once, at the end (the caller's eval)."""
    from adapters.qwen3_5 import layers

    run = backends.CompiledGpuKernels("cuda")
    submitted = []
    monkeypatch.setattr(mx, "async_eval", lambda *a: submitted.append(a))
    h = mx.zeros((2, 3, 4))

    def parts(capture, batch, n=24):
        submitted.clear()
        for i in range(n):
            layers._submit(run, h, i, n, capture, batch)
        return len(submitted)

    assert (parts(True, True), parts(True, True, n=16)) == (2, 1)   # after layers 8 and 16; 8 alone
    assert (parts(True, False), parts(False, True), parts(False, False)) == (0, 0, 0)
    run.submit_batch_step_every = 8   # the "batch-submit" trial: a batch's plain step too, never one sequence's
    assert (parts(False, True), parts(False, False), parts(True, False)) == (2, 0, 0)
    run.submit_batch_step_every = 0
    run.submit_batch_verify_every = 0   # the "batch-verify-wait" trial
    assert parts(True, True) == 0


def test_every_gpu_few_runner_attends_row_by_row(monkeypatch):
    """On a GPU a verify's attention must compute each row as the decode step does (issue 20):
    whichever backend is chosen there, its few-token runner is row-invariant; the CPU's are not
    asked to be (greedy parity holds there without it) and prefill never is."""
    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: None)
    for kw in (dict(cuda=True), dict(cuda=True, gpu_kernels=False), dict(cuda=False)):
        b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, **kw)
        assert b.few.row_invariant and not b.long.row_invariant, (kw, b.name)
    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: "it broke")
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, log=lambda m: None)
    assert b.name == "mlx" and b.few.row_invariant
    for dtype in ("float32", "native"):
        assert not backends.choose(dtype, [nn.RoPE(8)], device=mx.cpu).few.row_invariant


@pytest.mark.parametrize("L", [2, 3, 5])
def test_row_invariant_attention_is_the_decode_steps_attention(L):
    """Row i of an L-query attention is bit for bit the one-query attention over the keys up to
    its own position, as the decode step at that position computes it."""
    kq, kk, kv = mx.random.split(mx.random.key(3), 3)
    S, H, KV, D = 37, 8, 2, 64
    q = mx.random.normal((1, H, L, D), key=kq).astype(BF)
    k = mx.random.normal((1, KV, S, D), key=kk).astype(BF)
    v = mx.random.normal((1, KV, S, D), key=kv).astype(BF)
    calls = []

    def sdpa(q, k, v, scale, mask, cache):
        calls.append((q.shape[2], k.shape[2], mask))
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    out = mlx_ops.row_invariant_sdpa(sdpa, q, k, v, 0.125, "causal", cache=object())
    assert calls == [(1, S - L + i + 1, None) for i in range(L)]
    for i in range(L):
        n = S - L + i + 1
        step = mx.fast.scaled_dot_product_attention(q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n], scale=0.125)
        assert mx.array_equal(out[:, :, i:i + 1], step).item(), i
    calls.clear()
    one = mlx_ops.row_invariant_sdpa(sdpa, q[:, :, :1], k, v, 0.125, None, cache=object())
    assert calls == [(1, S, None)] and one.shape == (1, H, 1, D)


def test_metal_self_check_fails_cleanly_without_a_gpu():
    why = kernels.self_check("metal")
    assert isinstance(why, str) and why


def test_cpu_adapter_runs_no_gpu_kernel(tiny_model_dir):
    assert load_adapter(tiny_model_dir).backend.name == "cpu-compiled"
    assert load_adapter(tiny_model_dir, compute_dtype="native").backend.name == "mlx"
    assert load_adapter(tiny_model_dir, compiled=False, log=lambda m: None).backend.name == "mlx"


def test_adapter_hooks_with_a_stand_in_kernel(tiny_checkpoint, monkeypatch):
    """Decode steps and verifies go through the Gated-DeltaNet kernel's entry point, states come
    back one per position, and greedy MTP == AR at depths 1-3 on that path."""
    ad = load_adapter(tiny_checkpoint(linear_key_head_dim=32), compute_dtype="native")
    ids = [5, 9, 13, 21, 34, 55]
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    ar_plain, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=24)
    widths = []
    monkeypatch.setattr(gdn, "gated_delta_steps", _reference_kernel(widths, lambda q: q.shape[1]))
    ad.backend = backends.Backend("stand-in", backends.GpuKernels("cuda"), backends.MlxOps())
    ar, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=24)
    assert 1 in widths and all(w <= gdn.GDN_MAX_T for w in widths)
    assert ar[:8] == ar_plain[:8]
    for depth in (1, 2, 3):
        widths.clear()
        mtp, _ = SpeculativeDecoder(ad, sampler=greedy, depth=depth).generate(ids, max_tokens=24)
        assert mtp == ar
        assert depth + 1 in widths
    cache = ad.make_cache()
    ad.forward(mx.array([ids]), cache)
    _, _, cap = ad.forward(mx.array([[3, 4, 5]]), cache, capture=True)
    conv_input, states = next(iter(cap.gdn.values()))
    assert isinstance(states, list) and len(states) == 3


def test_big_tensors_drawn_by_mlx_follow_the_numpy_rules(tmp_path):
    """make_tiny_checkpoint's big_draws (gpu_make_checkpoint.py draws a 9B trunk on the GPU so):
    the same tensors, shapes and dtypes as the NumPy build, each drawn by the same rule (std within
    a few %, the frequent output rows scaled), and the checkpoint decodes."""
    from mlx.utils import tree_flatten

    from scripts.checkpoints import make_tiny_checkpoint as mtc

    def trunk(path):
        ad = load_adapter(path)
        return ad, {k: v for k, v in tree_flatten(ad.model.parameters())}

    _, want = trunk(mtc.make_tiny_checkpoint(tmp_path / "np", bits=None, hidden_size=128, vocab_size=2048))
    ad, got = trunk(mtc.make_tiny_checkpoint(tmp_path / "mx", bits=None, hidden_size=128, vocab_size=2048,
                                             big_draws=mtc.mlx_draws(0), big_from=4096))
    assert {k: (v.shape, v.dtype) for k, v in got.items()} == {k: (v.shape, v.dtype) for k, v in want.items()}
    drawn = [k for k, v in got.items() if v.size >= 4096]
    assert len(drawn) >= 10 and any("embed_tokens" in k for k in drawn)
    for k in drawn:
        a, b = got[k].astype(mx.float32), want[k].astype(mx.float32)
        assert not bool(mx.array_equal(a, b)), k
        assert abs(float(a.std()) / float(b.std()) - 1) < 0.05, k
    embed = got[next(k for k in drawn if "embed_tokens" in k)].astype(mx.float32)
    norms = np.sqrt((np.array(embed) ** 2).sum(axis=-1))
    assert norms.max() > 2.5 * np.median(norms)   # the frequent rows, frequent_scale (3) times the rest
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    ar, _ = AutoregressiveDecoder(ad, sampler=greedy).generate([5, 6, 7], max_tokens=16)
    assert_greedy_equal(ad, [5, 6, 7], SpeculativeDecoder(ad, sampler=greedy, depth=2).generate([5, 6, 7], max_tokens=16)[0], ar)


def test_the_moe_gpu_checkpoint_builder_at_a_small_shape(tmp_path):
    """scripts/gpu/gpu_make_checkpoint.py's MoE path (the 35B-A3B / Next-80B-A3B shapes on a GPU), at a
    shape this CPU runs: it loads, with its bf16 head and the real models' context, and greedy MTP == AR."""
    import json

    from scripts.gpu.gpu_make_checkpoint import CONTEXT, build_moe

    ckpt = build_moe(str(tmp_path / "moe"), "moe-small")
    ad = load_adapter(ckpt)
    assert ad.context_length == CONTEXT == json.loads((ckpt / "tokenizer_config.json").read_text())["model_max_length"]
    assert ad.contract.family == "qwen3_5_moe" and ad.contract.num_experts == 4
    assert ad.contract.trunk_quantization["bits"] == 4 and ad.contract.mtp_quantization is None
    assert ad.contract.hidden_variant_source.startswith("family default")
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    ar, _ = AutoregressiveDecoder(ad, sampler=greedy).generate([5, 6, 7], max_tokens=24)
    assert_greedy_equal(ad, [5, 6, 7], SpeculativeDecoder(ad, sampler=greedy, depth=2).generate([5, 6, 7], max_tokens=24)[0], ar)


def test_compiled_kernels_are_kept_per_gpu_architecture(tmp_path, monkeypatch):
    """MLX CUDA's PTX cache moves from /tmp to the user's cache, one folder per mlx version and
    GPU architecture; a user's own MLX_PTX_CACHE_DIR wins; without MLX CUDA nothing is set."""
    from adapters import kernel_cache

    monkeypatch.setattr(kernel_cache, "_folder", None)   # put back after the test

    env = {"HOME": str(tmp_path)}
    got = kernel_cache.persist(env, cuda=True, arch="NVIDIA-H200-sm90")
    assert got == env["MLX_PTX_CACHE_DIR"] == kernel_cache.folder()
    assert got.startswith(str(tmp_path / ".cache" / "mtp-chat" / "ptx")) and got.endswith("/NVIDIA-H200-sm90")
    assert kernel_cache.persist({"HOME": str(tmp_path)}, cuda=True, arch="NVIDIA-B200-sm100") != got
    assert kernel_cache.persist({"MLX_PTX_CACHE_DIR": "/mine"}, cuda=True, arch="x") == "/mine"
    assert kernel_cache.persist({"HOME": str(tmp_path)}, cuda=False) is None
    (Path(got) / "a.ptx").write_text("x")
    assert kernel_cache.entries(got) == 1 and kernel_cache.entries(None) == 0


def test_the_banner_says_how_long_the_kernel_check_took_and_what_it_compiled(tmp_path, monkeypatch):
    from adapters import kernel_cache

    folder = tmp_path / "ptx"
    folder.mkdir()
    monkeypatch.setattr(kernel_cache, "_folder", str(folder))
    monkeypatch.setattr(backends, "_checked_once", set())

    def compiles(backend, *fused):
        (folder / "qmm.ptx").write_text("x")
        return None

    monkeypatch.setattr(backends, "_verdict", compiles)
    monkeypatch.setattr(kernels, "_two_tiles_verdict", lambda: (True, None))   # its own test above
    monkeypatch.setattr(kernels, "topk_verdict", lambda draw=False: None)            # and this one's
    monkeypatch.setattr(sampling, "_row_topk", None)
    for k in ("on", "why"):
        monkeypatch.setitem(gk.TWO_TILES, k, gk.TWO_TILES[k])
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)
    assert b.name == "cuda-kernels"
    assert b.note.startswith("cuda kernels compiled 1 kernel(s) and checked them in ") and str(folder) in b.note
    again = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)
    assert again.note == "cuda kernels checked earlier in this process"
    monkeypatch.setattr(backends, "_checked_once", set())
    cached = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)   # nothing new compiled
    assert cached.note.startswith("cuda kernels checked in ")

    def parts(backend, *fused):   # a check that took long says where its time went, slowest first
        kernels.last_check_seconds.clear()
        kernels.last_check_seconds.update({"row kernel": 0.5, "attention": 3.25, "recurrence": 0.1})
        return None

    monkeypatch.setattr(backends, "_verdict", parts)
    monkeypatch.setattr(backends, "SAY_PARTS_FROM", 0.0)
    monkeypatch.setattr(backends, "_checked_once", set())
    slow = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)
    assert ": attention 3.2 s, row kernel 0.5 s, recurrence 0.1 s (compiled kernels kept in" in slow.note, slow.note


def _row_by_row_kernel(calls: list):
    """The row kernel's contract on the CPU: each row computed alone (MLX's quantized matmul one
    row at a time), the residual added to the rounded product; notes (rows, N) per launch."""
    def stand_in(x, w, scales, biases, bits, group_size, residual=None, config=None, swiglu=False):
        x = gk.swiglu_rows(x) if swiglu else x
        K = x.shape[-1]
        flat = x.reshape(-1, K)
        calls.append((flat.shape[0], w.shape[0]))
        y = mx.concatenate([mx.quantized_matmul(flat[i:i + 1], w, scales, biases, transpose=True,
                                                group_size=group_size, bits=bits) for i in range(flat.shape[0])])
        y = y.reshape(*x.shape[:-1], w.shape[0])
        return y if residual is None else residual + y
    return stand_in


# A bf16 4-bit checkpoint whose every linear fits the row kernel (K whole chunks, joined N whole tiles).
_KERNEL_SHAPED = dict(hidden_size=128, intermediate_size=256, num_heads=4, head_dim=32, num_kv_heads=2,
                      linear_num_value_heads=8, linear_num_key_heads=2, linear_key_head_dim=32,
                      linear_value_head_dim=16, dtype="bfloat16", bits=4, group_size=32)


def test_the_cuda_runner_with_stand_in_kernels_keeps_greedy_mtp_equal_to_ar(tiny_checkpoint, monkeypatch):
    """The CUDA few runner end to end on the CPU with stand-ins that keep each kernel's contract:
    every linear through the row kernel (joined projections included), the recurrence through
    its kernel; greedy MTP == AR at depths 1-3 with each layer compiled, and the compiled runner
    decodes what the eager one decodes."""
    ad = load_adapter(tiny_checkpoint(**_KERNEL_SHAPED), compute_dtype="native")
    calls, widths = [], []
    monkeypatch.setattr(gk, "quantized_matmul_rows", _row_by_row_kernel(calls))
    monkeypatch.setattr(gdn, "gated_delta_steps", _reference_kernel(widths, lambda q: q.shape[1]))
    ids = [5, 9, 13, 21, 34, 55]
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    ad.backend = backends.Backend("stand-in", backends.GpuKernels("cuda"), backends.MlxOps())
    eager, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=20)
    assert SpeculativeDecoder(ad, sampler=greedy, depth=2).generate(ids, max_tokens=20)[0] == eager
    joined = {n for _, n in calls}
    # one product each: Gated-DeltaNet's four input projections (256 + 128 + 8 + 8), q|k|v (256 + 64 + 64),
    # gate|up (2 x 256); out_proj / o_proj / down (128) with their residuals
    assert {400, 384, 512, 128} <= joined
    few = backends.CompiledGpuKernels("cuda")
    ad.backend = backends.Backend("stand-in", few, backends.MlxOps())
    ar, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=20)
    assert ar == eager
    for depth in (1, 2, 3):
        mtp, _ = SpeculativeDecoder(ad, sampler=greedy, depth=depth).generate(ids, max_tokens=20)
        assert mtp == ar, depth
    assert len(few._compiled) >= 4  # every layer's functions were traced
    # The device handed each layer as soon as it is built (every layer here; 8 at a time with the
    # "submit" trial): the same tokens, and the same logits bit for bit.
    early = backends.CompiledGpuKernels("cuda")
    early.submit_every, submitted = 1, []
    real_async_eval = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: (submitted.append(len(a)), real_async_eval(*a))[1])
    ad.backend = backends.Backend("stand-in", early, backends.MlxOps())
    assert AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=20)[0] == ar
    assert SpeculativeDecoder(ad, sampler=greedy, depth=2).generate(ids, max_tokens=20)[0] == ar
    assert len(submitted) > 40
    # "verify-submit": a verify's layers handed every layer, an AR step's once: the same tokens
    early.submit_every, early.submit_verify_every = 0, 1
    submitted.clear()
    assert AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=20)[0] == ar
    plain = len(submitted)
    assert SpeculativeDecoder(ad, sampler=greedy, depth=2).generate(ids, max_tokens=20)[0] == ar
    assert len(submitted) - plain > 40 and plain < 40
    early.submit_every = 1
    logits = []
    for runner in (early, few):
        ad.backend = backends.Backend("stand-in", runner, backends.MlxOps())
        logits.append(ad.forward(mx.array([ids[:3]]), ad.make_cache())[0])
    assert bool(mx.array_equal(*logits))


def test_the_fused_gated_deltanet_middle_is_wired_as_its_reference(tiny_checkpoint, monkeypatch):
    """kernels/gdn_fused.py's launch, with its reference (the same computation as MLX ops) for
    the kernel: fed from the joined projection at the right offsets, its states and conv window
    roll back as the ops path's do (greedy MTP == AR at depths 1-3, compiled)."""
    from adapters.kernels import gdn_fused

    ad = load_adapter(tiny_checkpoint(**_KERNEL_SHAPED), compute_dtype="native")
    calls, launches = [], []
    monkeypatch.setattr(gk, "quantized_matmul_rows", _row_by_row_kernel(calls))
    monkeypatch.setattr(gdn, "gated_delta_steps", _reference_kernel([], lambda q: q.shape[1]))

    def stand_in(proj, *args):
        launches.append(proj.shape)
        return gdn_fused.reference(proj, *args)

    monkeypatch.setattr(gdn_fused, "gdn_fused", stand_in)
    ids = [5, 9, 13, 21, 34, 55]
    ad.backend = backends.Backend("stand-in", backends.GpuKernels("cuda"), backends.MlxOps())
    cache = ad.make_cache()
    ad.forward(mx.array([ids[:-1]]), cache)
    plain, _, _ = ad.forward(mx.array([ids[-1:]]), cache)
    assert launches == []
    few = backends.CompiledGpuKernels("cuda", fused_gdn=True)
    ad.backend = backends.Backend("stand-in", few, backends.MlxOps())
    cache = ad.make_cache()
    ad.forward(mx.array([ids[:-1]]), cache)
    fused, _, _ = ad.forward(mx.array([ids[-1:]]), cache)
    # both Gated-DeltaNet layers, from the joined projection (the 5-token prompt is a few-token forward
    # too); a layer's first call is built twice (eagerly for its joins, then traced: _first_call), and
    # the 1-token step is traced anew (a new shape)
    assert launches == [(1, 5, 400)] * 4 + [(1, 1, 400)] * 2
    assert fused.shape == plain.shape
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    ar, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=16)
    for depth in (1, 2, 3):
        assert SpeculativeDecoder(ad, sampler=greedy, depth=depth).generate(ids, max_tokens=16)[0] == ar, depth
    assert 4 in {shape[1] for shape in launches}  # a depth-3 verify went through it whole


def test_the_fused_middles_reference_is_the_ops_path_to_rounding(tiny_checkpoint):
    """What the GPU check holds the kernel to (gdn_fused.reference) computes a Gated-DeltaNet
    layer's middle as mlx-lm's ops do, to bf16 rounding: output, conv window and every state."""
    from adapters.kernels import gdn_fused
    from adapters.qwen3_5 import layers

    ad = load_adapter(tiny_checkpoint(**_KERNEL_SHAPED), compute_dtype="native")
    p = next(layer for layer in ad.stack.layers if isinstance(layer, layers.GdnParams))
    at, ops, T = p.attn, backends.MlxOps(), 3
    keys = mx.random.split(mx.random.key(2), 3)
    xn = mx.random.normal((1, T, 128), key=keys[0]).astype(BF)
    conv_state = (mx.random.normal((1, p.K - 1, p.conv_dim), key=keys[1]) * 0.5).astype(BF)
    state = mx.random.normal((1, p.Hv, p.Dv, p.Dk), key=keys[2]) * 0.1
    qkv, z, b, a = layers.separate_projections(ops, p, xn)
    conv_input = mx.concatenate([conv_state, qkv], axis=-2)
    q, k, v = mx.split(nn.silu(ops.conv(p, conv_input, T)), [p.key_dim, 2 * p.key_dim], axis=-1)
    q, k = ops.qk_norm(q.reshape(1, T, p.Hk, p.Dk), k.reshape(1, T, p.Hk, p.Dk), p.Dk)
    y, states = ops.recurrence(q, k, v.reshape(1, T, p.Hv, p.Dv), ops.decay(p, a), mx.sigmoid(b), state, None, True)
    out = ops.gated_norm(at.norm, y, z).reshape(1, T, -1)
    C, vd = p.conv_dim, p.Hv * p.Dv
    got, got_input, got_states = gdn_fused.reference(
        mx.concatenate([qkv, z.reshape(1, T, -1), b, a], axis=-1), (C, C + vd, C + vd + p.Hv), conv_state,
        at.conv1d.weight.reshape(C, p.K), p.neg_A, at.dt_bias, at.norm.weight, gdn_fused.consts(p.Dk, at.norm.eps),
        state, (p.Hk, p.Hv, p.Dk, p.Dv, p.K))
    assert bool(mx.array_equal(got_input, conv_input))
    f32 = mx.float32
    assert float(mx.abs(got.astype(f32) - out.astype(f32)).max()) <= 0.02 * float(mx.abs(out.astype(f32)).max())
    for mine, theirs in zip(got_states, states):
        assert float(mx.abs(mine - theirs).max()) <= 0.02 * float(mx.abs(theirs).max())


def test_the_attention_kernel_is_wired_as_its_reference(tiny_checkpoint, monkeypatch):
    """kernels/cuda_attention.py's launch with its reference (each row one SDPA over its own
    keys, then the gate) for the kernel: it reads the cache's views and the gate as the ops path
    does (the same logits bit for bit), and with every GPU kernel on and each layer compiled,
    greedy MTP == AR at depths 1-3."""
    from adapters.kernels import cuda_attention, gdn_fused

    ad = load_adapter(tiny_checkpoint(**dict(_KERNEL_SHAPED, head_dim=128)), compute_dtype="native")
    launches = []
    monkeypatch.setattr(gk, "quantized_matmul_rows", _row_by_row_kernel([]))
    monkeypatch.setattr(gdn, "gated_delta_steps", _reference_kernel([], lambda q: q.shape[1]))
    monkeypatch.setattr(gdn_fused, "gdn_fused", gdn_fused.reference)

    def stand_in(q, k, v, gate, scale):
        launches.append((q.shape[2], k.shape[2]))
        return cuda_attention.reference(q, k, v, gate, scale)

    monkeypatch.setattr(cuda_attention, "gated_attention", stand_in)
    ids = [5, 9, 13, 21, 34, 55]
    logits = {}
    for name, few in (("ops", backends.GpuKernels("cuda")), ("kernel", backends.GpuKernels("cuda", fused_attention=True))):
        ad.backend = backends.Backend("stand-in", few, backends.MlxOps())
        cache = ad.make_cache()
        ad.forward(mx.array([ids[:-3]]), cache)
        logits[name], _, _ = ad.forward(mx.array([ids[-3:]]), cache)
    assert launches == [(3, 3)] * 2 + [(3, 6)] * 2  # both attention layers: the prompt, then 3 rows over 6 keys
    assert bool(mx.array_equal(logits["kernel"], logits["ops"]))
    ad.backend = backends.Backend("stand-in", backends.CompiledGpuKernels("cuda", fused_gdn=True, fused_attention=True),
                                  backends.MlxOps())
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    ar, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=16)
    for depth in (1, 2, 3):
        assert SpeculativeDecoder(ad, sampler=greedy, depth=depth).generate(ids, max_tokens=16)[0] == ar, depth


def test_the_load_checks_of_the_fused_kernels_pass_their_references_and_catch_a_row_variant_one(monkeypatch):
    """kernels.check_fused_gdn / check_attention (run at load once the kernels are on) with each
    kernel's reference in its place pass; a kernel whose row depends on its neighbours fails."""
    from adapters.kernels import cuda_attention, gdn_fused

    monkeypatch.setattr(gdn_fused, "gdn_fused", gdn_fused.reference)
    monkeypatch.setattr(cuda_attention, "gated_attention", cuda_attention.reference)
    monkeypatch.setattr(cuda_attention, "gated_attention_batch", cuda_attention.reference_batch)
    assert kernels.check_fused_gdn() is None
    assert kernels.check_attention() is None

    def sequence_variant_attention(q, ks, vs, gate, scale, rows_block=None):  # a batch that rounds once more
        y = cuda_attention.reference_batch(q, ks, vs, gate, scale)
        return y if len(ks) == 1 else (y.astype(mx.float32) * 1.01).astype(y.dtype)

    monkeypatch.setattr(cuda_attention, "gated_attention_batch", sequence_variant_attention)
    assert "changes with the sequences beside it" in kernels.check_attention()

    def block_variant_attention(q, ks, vs, gate, scale, rows_block=None):  # all rows in a block round once more
        y = cuda_attention.reference_batch(q, ks, vs, gate, scale)
        return y if rows_block is None else (y.astype(mx.float32) * 1.01).astype(y.dtype)

    monkeypatch.setattr(cuda_attention, "gated_attention_batch", block_variant_attention)
    assert "change when one block takes them all" in kernels.check_attention()
    monkeypatch.setattr(cuda_attention, "gated_attention_batch", cuda_attention.reference_batch)

    def row_variant(q, k, v, gate, scale):  # a row that sees one key less when it travels alone
        y = cuda_attention.reference(q, k, v, gate, scale)
        return y if q.shape[2] > 1 else cuda_attention.reference(q, k[:, :, :-1], v[:, :, :-1], gate, scale)

    monkeypatch.setattr(cuda_attention, "gated_attention", row_variant)
    assert "changes with the rows beside it" in kernels.check_attention()

    def position_variant(proj, *args):  # a decode step that rounds its output once more
        y, conv_input, states = gdn_fused.reference(proj, *args)
        return (y if proj.shape[1] > 1 else (y.astype(mx.float32) * 1.01).astype(y.dtype)), conv_input, states

    monkeypatch.setattr(gdn_fused, "gdn_fused", position_variant)
    assert "changes with the positions beside it" in kernels.check_fused_gdn()

    def sequence_variant(proj, *args):  # a batch's launch that rounds its output once more
        y, conv_input, states = gdn_fused.reference(proj, *args)
        return (y if proj.shape[0] == 1 else (y.astype(mx.float32) * 1.01).astype(y.dtype)), conv_input, states

    monkeypatch.setattr(gdn_fused, "gdn_fused", sequence_variant)
    assert "changes with the sequences beside it" in kernels.check_fused_gdn()


def _cuda_runner_with_references(ad, monkeypatch, calls=None, middles=None, attention_launches=None):
    """The CUDA backend's runners on `ad` (its batch runner is its few runner, every kernel on:
    row kernel, recurrence, fused GDN middle, few-row attention, compiled layers), each kernel's
    reference standing in; `calls`, `middles` and `attention_launches` note the launches."""
    from adapters.kernels import cuda_attention, gdn_fused

    monkeypatch.setattr(gk, "quantized_matmul_rows", _row_by_row_kernel([] if calls is None else calls))
    monkeypatch.setattr(gdn, "gated_delta_steps", _reference_kernel([], lambda q: q.shape[1]))

    def middle(proj, *args):
        (middles if middles is not None else []).append(proj.shape[0])
        return gdn_fused.reference(proj, *args)

    monkeypatch.setattr(gdn_fused, "gdn_fused", middle)

    def attention(q, k, v, gate, scale):
        # The real kernel rounds otherwise than MLX's SDPA does; so does this stand-in (each row
        # still as alone), so a batch that took the SDPA path where alone takes the kernel shows.
        return (cuda_attention.reference(q, k, v, gate, scale).astype(mx.float32) * (1 + 2**-6)).astype(q.dtype)

    monkeypatch.setattr(cuda_attention, "gated_attention", attention)

    def attention_batch(q, ks, vs, gate, scale):  # each sequence through the stand-in above, alone
        (attention_launches if attention_launches is not None else []).append(len(ks))
        return mx.concatenate([attention(q[b:b + 1], k, v, gate[b:b + 1], scale) for b, (k, v) in enumerate(zip(ks, vs))])

    monkeypatch.setattr(cuda_attention, "gated_attention_batch", attention_batch)
    few = backends.CompiledGpuKernels("cuda", fused_gdn=True, fused_attention=True)
    ad.backend = backends.Backend("stand-in", few, backends.MlxOps())
    ad.backend.batch = few


def test_a_batch_through_the_cuda_runner_decodes_each_sequence_as_alone(tiny_checkpoint, monkeypatch):
    """Batching on the GPU (issue 32): the CUDA backend's batch runner is its few runner, every
    kernel on (row kernel, recurrence, fused GDN middle, few-row attention, compiled layers), here
    with each kernel's reference standing in. Three greedy requests joining at different steps
    decode, AR and MTP at depth 2, exactly what each decodes alone; the batch's linears ran
    several sequences' rows in one product, and its Gated-DeltaNet middles and attention one launch."""
    from tests.test_batch import run_batched

    ad = load_adapter(tiny_checkpoint(**dict(_KERNEL_SHAPED, head_dim=128)), compute_dtype="native")
    calls, middles, attention_launches = [], [], []
    _cuda_runner_with_references(ad, monkeypatch, calls, middles, attention_launches)
    prompts, lengths = [[5, 9, 13, 21, 34, 55], [100, 7, 300, 42], [3, 8]], [14, 10, 12]
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    for mode in ("ar", "mtp"):
        make = (lambda: AutoregressiveDecoder(ad, sampler=greedy)) if mode == "ar" else \
            (lambda: SpeculativeDecoder(ad, sampler=greedy, depth=2))
        alone = [make().generate(p, max_tokens=n)[0] for p, n in zip(prompts, lengths)]
        calls.clear()
        batched, sizes, _ = run_batched(ad, mode, 2, prompts, lengths, {0: [0, 1], 2: [2]})
        assert batched == alone, mode
        assert max(sizes) == 3 and max(rows for rows, _ in calls) > 1, mode
        assert max(middles) == 3, mode  # the fused middle: one launch for the batch's sequences
        assert max(attention_launches) == 3, mode  # and the attention: one launch pair


@pytest.mark.parametrize("width", [1, 2])
def test_the_heads_step_for_a_batch_is_each_sequences_step_alone(tiny_checkpoint, monkeypatch, width):
    """draft_batch where every sequence feeds as many positions (a cycle's later draft steps:
    one each) runs the head once for the batch on the CUDA runner: each sequence's g and draft
    logits are its draft step's alone, bit for bit, over histories of different lengths (each
    row roped at its own position, attending over its own history), two steps running."""
    ad = load_adapter(tiny_checkpoint(**dict(_KERNEL_SHAPED, head_dim=128)), compute_dtype="native")
    launches = []
    _cuda_runner_with_references(ad, monkeypatch, attention_launches=launches)
    prompts = [[5, 9, 13, 21, 34, 55, 89], [100, 7, 300, 42], [3, 8, 2, 11, 17]]

    def histories():
        out = []
        for ids in prompts:
            cache = ad.make_cache()
            draft = ad.make_draft(cache)
            _, hidden, _ = ad.forward(mx.array([ids]), cache)
            ad.absorb(draft, cache, hidden[:, :-width], mx.array([ids[1:len(ids) - width + 1]]))
            out.append((cache, draft, hidden[:, -width:], mx.array([ids[-width:]])))
        return out

    alone, batch = histories(), histories()
    for _ in range(2):
        want = [ad.draft_step(d, c, h, t) for c, d, h, t in alone]
        launches.clear()
        g, logits = ad.draft_batch([d for _, d, _, _ in batch], [c for c, _, _, _ in batch],
                                   [h for _, _, h, _ in batch], [t for _, _, _, t in batch])
        assert launches == [3]   # the head's attention: one launch for the batch
        for b, (wg, wl) in enumerate(want):
            assert bool(mx.array_equal(g[b:b + 1], wg)) and bool(mx.array_equal(logits[b:b + 1], wl)), b
        nxt = mx.argmax(logits, axis=-1)
        alone = [(c, d, wg, nxt[b:b + 1, None]) for b, ((c, d, _, _), (wg, _)) in enumerate(zip(alone, want))]
        batch = [(c, d, g[b:b + 1], nxt[b:b + 1, None]) for b, (c, d, _, _) in enumerate(batch)]


def test_a_batchs_plain_steps_keep_its_states_stacked(tiny_checkpoint, monkeypatch):
    """A batch's plain step starts each Gated-DeltaNet layer from the stacked states the step
    before wrote back from (no concatenation) while the same caches come in the same order and
    hold what was written (after a verify too, where nothing was rolled back); another order or
    a rolled-back cache are concatenated again, and a step alone or a rollback drops the note. Two steps batched give each
    sequence its two steps alone."""
    from adapters.qwen3_5 import layers

    ad = load_adapter(tiny_checkpoint(**dict(_KERNEL_SHAPED, head_dim=128)), compute_dtype="native")
    _cuda_runner_with_references(ad, monkeypatch)
    prompts = [[5, 9, 13, 21, 34], [100, 7, 300], [3, 8, 2, 11]]
    i, p = next((i, p) for i, p in enumerate(ad.stack.layers) if isinstance(p, layers.GdnParams))

    def prefilled():
        caches = [ad.make_cache() for _ in prompts]
        for ids, c in zip(prompts, caches):
            ad.forward(mx.array([ids]), c)
        return caches

    alone, batch = prefilled(), prefilled()
    steps = [mx.array([[40], [41], [42]]), mx.array([[50], [51], [52]])]
    for tokens in steps:
        want = [ad.forward(tokens[b:b + 1], c)[0] for b, c in enumerate(alone)]
        got, _, _ = ad.forward_batch(tokens, batch)
        assert all(bool(mx.array_equal(got[b:b + 1], w)) for b, w in enumerate(want))
        cs = [c[i] for c in batch]
        assert layers._stacked_states(p, cs, BF)[1] is cs[0].stacked[1]   # kept for the next step
    cs = [c[i] for c in batch]
    assert layers._stacked_states(p, cs[::-1], BF)[1] is not cs[0].stacked[1]   # another order
    cs[1][1] = cs[1][1] + 0   # as a rollback or a restore writes
    assert layers._stacked_states(p, cs, BF)[1] is not cs[0].stacked[1]
    ad.forward(mx.array([[7]]), batch[2])   # alone: the note goes (its arrays with it)
    assert batch[2][i].stacked is None and batch[0][i].stacked is not None
    _, _, captured = ad.forward_batch(mx.array([[1, 2], [3, 4], [5, 6]]), batch, capture=True)
    cs = [c[i] for c in batch]
    assert layers._stacked_states(p, cs, BF)[1] is cs[0].stacked[1]   # a verify that keeps every position
    ad.rollback(batch[1], captured[1], keep=1)   # one sequence keeps 1 of 2 positions: its note goes
    assert batch[1][i].stacked is None and batch[0][i].stacked is not None
    assert layers._stacked_states(p, [c[i] for c in batch], BF)[1] is not cs[0].stacked[1]


def test_every_kernels_name_changes_with_its_code(monkeypatch):
    """MLX keeps compiled kernels on disk under their name and template arguments, not their
    source: each of ours carries a hash of its code, so a warm cache never serves an old build."""
    import hashlib

    from adapters.kernels import cuda_attention, cuda_qmm, gdn_fused
    from adapters.kernels.naming import versioned

    made = []
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: made.append(kw))
    monkeypatch.setattr(mx.fast, "metal_kernel", lambda **kw: made.append(kw))
    builders = [cuda_attention._partials, cuda_attention._combine, cuda_qmm._qmm_kernel, gdn._gdn_kernel,
                gdn._prefill_kernel, gdn_fused._kernel]
    for b in builders:
        b.cache_clear()
    try:
        cuda_attention._partials(), cuda_attention._combine(), gdn._prefill_kernel(), gdn_fused._kernel(3)
        cuda_qmm._qmm_kernel(False), cuda_qmm._qmm_kernel(True), gdn._gdn_kernel(2, "cuda"), gdn._gdn_kernel(2, "metal")
    finally:
        for b in builders:
            b.cache_clear()
    assert len(made) == 8 and len({kw["name"] for kw in made}) == 8
    for kw in made:
        digest = hashlib.sha1(f"{kw.get('header', '')}\0{kw['source']}".encode()).hexdigest()[:10]
        assert kw["name"].startswith("mtp_") and kw["name"].endswith("_" + digest), kw["name"]
    assert versioned("k", "a + b") != versioned("k", "a - b") != versioned("k", "a - b", "#define X")


@pytest.mark.parametrize("keeps", [1, 4, 8])
def test_where_mlxs_own_matmul_mixes_rows_a_verify_goes_in_narrower_calls(keeps):
    """Metal (issue 32): MLX's quantized matmul serves the few-token linears, and whether it computes
    k rows as it computes one is the device's affair (`qmv_wide` sums otherwise). Checked per
    shape on first use: a matmul that keeps rows as alone only up to `keeps` a call gets at most
    that many, so every verify row equals its one-row call; the load note says so."""
    m = nn.QuantizedLinear(64, 32, bits=4, group_size=32)
    m.set_dtype(BF)
    calls = []

    def plain(x):   # exact up to `keeps` rows a call, then another summation order (a rounding apart)
        rows = x.size // x.shape[-1]
        calls.append(rows)
        y = m(x)
        return y if rows <= keeps else (y.astype(mx.float32) * (1 + 2**-6)).astype(y.dtype)

    run = backends.GpuKernels("metal")
    x = mx.random.normal((1, 6, 64), key=mx.random.key(4)).astype(BF)
    got = run._rows(m, x, plain)
    alone = mx.concatenate([m(x[:, i:i + 1]) for i in range(6)], axis=1)
    assert bool(mx.array_equal(got, alone))
    calls.clear()
    run._rows(m, x, plain)                                    # checked once: now only the verify's calls
    assert max(calls) == min(keeps, 6) and sum(calls) == 6
    assert (run.said == []) == (keeps == 8) and all(f"up to {keeps} a call" in s for s in run.said)


def test_the_load_check_of_mlxs_matmul_reads_every_linear_shape_once():
    linears = [nn.QuantizedLinear(64, 32, bits=4, group_size=32), nn.QuantizedLinear(64, 32, bits=4, group_size=32),
               nn.QuantizedLinear(128, 64, bits=8, group_size=64), nn.Linear(64, 16)]
    for m in linears:
        m.set_dtype(BF)
    run = backends.GpuKernels("metal")
    assert run.check_rows(linears, BF) == []      # MLX's CPU matmul keeps rows as alone: nothing to say
    assert len(run._row_limits) == 3 and set(run._row_limits.values()) == {8}


def test_a_metal_load_checks_the_models_linears(tiny_checkpoint, monkeypatch):
    """At load on Metal every linear shape of trunk and head is checked before the first reply,
    so the load note (the banner) can say where a verify's rows go one call each."""
    few = backends.GpuKernels("metal")
    monkeypatch.setattr(backends, "choose", lambda *a, **k: backends.Backend("metal-kernels", few, backends.MlxOps()))
    ad = load_adapter(tiny_checkpoint(**_KERNEL_SHAPED), compute_dtype="native")
    shapes = {k[0] for k in few._row_limits}
    assert ad.backend is not None and len(shapes) >= 4            # q|k|v, MLP, Gated-DeltaNet, head's fc, ...
    assert {tuple(ad.head.fc["weight"].shape)} <= shapes and all(k[1] == BF for k in few._row_limits)


def test_a_per_channel_gate_keeps_mlxs_recurrence(monkeypatch):
    """The recurrence kernels read one decay per head and position (g [B, T, Hv]); mlx-lm's ops
    also take a per-channel gate [B, T, Hv, Dk], which the kernels would misread: that keeps MLX's path."""
    launches = []
    monkeypatch.setattr(gdn, "gated_delta_steps", _reference_kernel(launches, lambda q: q.shape[1]))
    keys = mx.random.split(mx.random.key(9), 4)
    q = mx.random.normal((1, 2, 2, 64), key=keys[0]) * 0.1
    k = mx.random.normal((1, 2, 2, 64), key=keys[1]) * 0.1
    v = mx.random.normal((1, 2, 4, 32), key=keys[2])
    beta, state = mx.full((1, 2, 4), 0.5), mx.zeros((1, 4, 32, 64))
    run = backends.GpuKernels("cuda")
    run.recurrence(q, k, v, mx.full((1, 2, 4), 0.9), beta, state, None, True)
    assert launches == [2]
    y, states = run.recurrence(q, k, v, mx.full((1, 2, 4, 64), 0.9), beta, state, None, False)
    assert launches == [2] and y.shape == (1, 2, 4, 32) and states[-1].shape == state.shape


def test_attention_rows_share_a_partials_block_within_shared_memory():
    """A verify's rows share a partials block (the keys read once for all of them) as far as
    their vectors and scores fit the block's 48 KiB of static shared memory."""
    from adapters.kernels.cuda_attention import CHUNK, MAX_ROWS, rows_per_block

    for G, hd in ((1, 256), (4, 256), (8, 256), (4, 128), (8, 128)):
        for L in range(1, MAX_ROWS + 1):
            rb = rows_per_block(L, G, hd)
            assert 1 <= rb <= L
            assert 4 * rb * G * (hd + CHUNK) <= 48 * 1024
    assert [rows_per_block(L, 4, 256) for L in range(1, 9)] == list(range(1, 9))  # the 9B shape: all rows
    assert rows_per_block(8, 8, 256) == 4
    # Short contexts: a row a block (faster there on the H200; the same bits either way)
    assert rows_per_block(4, 4, 256, keys=8192) == 1 and rows_per_block(4, 4, 256, keys=32768) == 4


def test_two_tiles_of_rows_are_turned_off_alone_when_they_differ_from_one_tile(monkeypatch):
    """The load check of 9-16 rows a launch: equal to 8-row launches keeps it on; a kernel whose
    second tile differs turns it off (batches go 8 rows a launch) without failing the check."""
    monkeypatch.setitem(gk.TWO_TILES, "on", True)
    w = mx.random.normal((64, 256), key=mx.random.key(1)).astype(BF)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((8, 256), key=mx.random.key(2)).astype(BF)
    monkeypatch.setattr(gk, "quantized_matmul_rows", _row_by_row_kernel([]))
    kernels.check_two_tiles(x, wq, s, b)
    assert gk.TWO_TILES["on"] and gk.rows_per_launch() == 16
    honest = _row_by_row_kernel([])

    def second_tile_differs(x, *a, **k):
        y = honest(x, *a, **k)
        return y if x.shape[0] <= 8 else mx.concatenate([y[:8], y[8:] + 1])
    monkeypatch.setattr(gk, "quantized_matmul_rows", second_tile_differs)
    kernels.check_two_tiles(x, wq, s, b)
    assert not gk.TWO_TILES["on"] and gk.rows_per_launch() == 8 and "differ" in gk.TWO_TILES["why"]


def test_a_compiled_layers_first_call_takes_its_value_from_the_compiled_function():
    """CompiledGpuKernels._fn: the first call is built eagerly (weight joins) but its value is the
    compiled function's, as every later call's: on the H200 MLX's fused and op-by-op elementwise
    kernels rounded differently, and a lane whose first step ran eagerly left the other lane."""
    few = backends.CompiledGpuKernels("cuda")
    made = []

    def make():   # each made function scales by its own factor: the compiled one 1, the eager one 2
        factor = float(len(made) + 1)
        made.append(factor)
        return lambda x: x * factor

    x = mx.arange(4, dtype=mx.float32)
    first = few._fn(("layer", "gdn"), make)(x)
    again = few._fn(("layer", "gdn"), make)(x)
    assert made == [1.0, 2.0]   # the eager function was built and called (its joins happen) ...
    assert bool(mx.array_equal(first, x)) and bool(mx.array_equal(again, x))   # ... the value is the compiled one


def test_the_load_note_says_when_mlx_cuda_graphs_are_off(monkeypatch):
    """MLX reads MLX_USE_CUDA_GRAPHS with C's atoi: unset or a non-zero number is on, anything else
    off; a CUDA load says so when off (it moves the lanes' speed), and says nothing of it otherwise."""
    for value, on in ((None, True), ("1", True), (" 2", True), ("0", False), ("false", False),
                      ("", False), ("off", False), ("-1", True)):
        assert backends.cuda_graphs_on({} if value is None else {"MLX_USE_CUDA_GRAPHS": value}) is on, value
    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: None)
    monkeypatch.setattr(kernels, "_two_tiles_verdict", lambda: (True, None))
    monkeypatch.setattr(kernels, "topk_verdict", lambda draw=False: None)
    monkeypatch.delenv("MLX_USE_CUDA_GRAPHS", raising=False)
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)
    assert "CUDA graphs" not in b.note
    monkeypatch.setenv("MLX_USE_CUDA_GRAPHS", "0")
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True)
    assert "MLX's CUDA graphs off (MLX_USE_CUDA_GRAPHS='0')" in b.note
    b = backends.choose("native", [nn.RoPE(8)], device=mx.cpu, cuda=False)
    assert "CUDA graphs" not in b.note
