"""The GPU kernels' Python side, on a machine without a GPU: shape rules, dispatch, the env
switch, fallbacks, and the adapter's hooks driven by a stand-in kernel.

The kernels themselves run only on CUDA / Metal: scripts/gpu_check.py tests them there.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from adapters import gpu_decode, gpu_kernels as gk, load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder

BF = mx.bfloat16


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_qmm_supported_accepts_the_kernel_shapes(bits, group):
    K, N = 4096, 248320
    w_shape = (N, K * bits // 32)
    for rows in range(1, 9):
        assert gk.qmm_supported((1, rows, K), BF, w_shape, BF, bits, group)
    assert gk.qmm_supported((2, 3, K), mx.float16, w_shape, mx.float16, bits, group)


@pytest.mark.parametrize("change", [
    dict(x_shape=(9, 4096)),                       # more rows than one mma tile
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
    assert gk.gdn_supported((1, 8, 16, 128), (1, 8, 32, 128), mx.float32)
    assert gk.gdn_supported((1, 1, 2, 32), (1, 1, 4, 16), mx.float32)
    assert not gk.gdn_supported((1, 9, 16, 128), (1, 9, 32, 128), mx.float32)  # T > 8
    assert not gk.gdn_supported((2, 1, 16, 128), (2, 1, 32, 128), mx.float32)  # batch
    assert not gk.gdn_supported((1, 1, 16, 48), (1, 1, 32, 128), mx.float32)   # Dk % 32
    assert not gk.gdn_supported((1, 1, 16, 128), (1, 1, 32, 128), mx.bfloat16)  # state dtype
    assert not gk.gdn_supported((1, 1, 3, 128), (1, 1, 32, 128), mx.float32)   # Hv % Hk


def test_one_gdn_body_for_both_backends():
    cuda, metal = gk.gdn_source(3, "cuda"), gk.gdn_source(3, "metal")
    body = gk.GDN_BODY.split("GDN_STORE_STATES")[0]
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
    y, states = gk.gated_delta_reference(q, k, v, g, beta, state)
    y_ops, final = gated_delta_ops(q, k, v, g, beta, state)
    assert len(states) == T
    np.testing.assert_allclose(np.array(y), np.array(y_ops), atol=1e-5)
    np.testing.assert_allclose(np.array(states[-1]), np.array(final), atol=1e-5)


def test_wanted_backend():
    assert gpu_decode.wanted(device=mx.cpu, cuda=True, env="1") is None
    assert gpu_decode.wanted(device=mx.gpu, cuda=True, env="0") is None
    assert gpu_decode.wanted(device=mx.gpu, cuda=True, env="1") == "cuda"
    assert gpu_decode.wanted() is None  # this machine: CPU
    assert not gk.cuda_available()


def _quantized_linear(K=256, N=64, bits=4, group=64, dtype=BF):
    lin = nn.QuantizedLinear.from_linear(nn.Linear(K, N, bias=False), group_size=group, bits=bits)
    lin.set_dtype(dtype)
    return lin


def test_retype_keeps_parameters_and_dispatches_only_when_active(monkeypatch):
    calls = []

    def fake(x, w, scales, biases, bits, group_size):
        calls.append(x.shape)
        return mx.zeros((*x.shape[:-1], w.shape[0]), dtype=x.dtype)

    monkeypatch.setattr(gk, "quantized_matmul_rows", fake)
    model = nn.Sequential(_quantized_linear(), nn.QuantizedEmbedding(64, 256, group_size=64, bits=4))
    model.set_dtype(BF)
    before = [k for k, _ in tree_flatten(model.parameters())]
    assert gpu_decode.retype(model) == 2
    assert [k for k, _ in tree_flatten(model.parameters())] == before
    lin, emb = model.layers
    x = mx.random.normal((1, 3, 256)).astype(BF)
    stock = lin(x)  # not active: MLX's own path
    assert calls == [] and bool(mx.any(stock != 0))
    with gpu_decode._active():
        assert bool(mx.all(lin(x) == 0)) and calls == [(1, 3, 256)]
        assert bool(mx.all(emb.as_linear(x) == 0)) and len(calls) == 2
        np.testing.assert_array_equal(np.array(lin(mx.zeros((9, 256), BF)).astype(mx.float32)), 0)
        assert len(calls) == 2  # 9 rows: MLX's path
        x32 = x.astype(mx.float32)
        lin.set_dtype(mx.float32)
        lin(x32)
        assert len(calls) == 2  # fp32: MLX's path
    assert not gpu_decode._on()


class _Holder:
    def __init__(self, gpu):
        self._gpu = gpu

    @gpu_decode.kernels_on
    def run(self, fast=True):
        return gpu_decode._on()


def test_kernels_on_decorator():
    assert _Holder(None).run() is False
    assert _Holder(gpu_decode.GpuDecode("metal")).run() is False  # Metal: MLX's matvec
    assert _Holder(gpu_decode.GpuDecode("cuda")).run() is True
    assert _Holder(gpu_decode.GpuDecode("cuda")).run(fast=False) is False  # chunked prefill


def test_attach_falls_back_and_says_so(capsys, monkeypatch):
    assert gpu_decode.attach(None, None) is None  # CPU: nothing to attach
    monkeypatch.setattr(gpu_decode, "_verdict", lambda backend: "it broke")
    assert gpu_decode.attach(None, None, backend="cuda") is None
    assert "GPU kernels off (cuda: it broke)" in capsys.readouterr().err


def test_metal_self_check_fails_cleanly_without_a_gpu():
    why = gk.self_check("metal")
    assert isinstance(why, str) and why


def test_cpu_adapter_has_no_gpu_hook(tiny_model_dir):
    assert load_adapter(tiny_model_dir)._gpu is None
    assert load_adapter(tiny_model_dir, compute_dtype="native")._gpu is None


class _OpsGpu(gpu_decode.GpuDecode):
    """The hooks of the GPU path with the kernel replaced by its ops reference."""

    def __init__(self):
        super().__init__("ops-stand-in")
        self.widths = []

    def gdn(self, q, k, v, g, beta, state):
        self.widths.append(q.shape[1])
        y, states = gk.gated_delta_reference(q, k, v, g, beta, state)
        return y.astype(q.dtype), states


def test_adapter_hooks_with_a_stand_in_kernel(tiny_checkpoint):
    """Decode steps and verifies go through gpu.gdn, states come back one per position, and
    greedy MTP == AR at depths 1-3 on that path."""
    ad = load_adapter(tiny_checkpoint(linear_key_head_dim=32), compute_dtype="native")
    ids = [5, 9, 13, 21, 34, 55]
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    ar_plain, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=24)
    ad._gpu = stand_in = _OpsGpu()
    ar, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=24)
    assert 1 in stand_in.widths and all(w <= gk.GDN_MAX_T for w in stand_in.widths)
    assert ar[:8] == ar_plain[:8]
    for depth in (1, 2, 3):
        stand_in.widths.clear()
        mtp, _ = SpeculativeDecoder(ad, sampler=greedy, depth=depth).generate(ids, max_tokens=24)
        assert mtp == ar
        assert depth + 1 in stand_in.widths
    cache = ad.make_cache()
    ad.forward(mx.array([ids]), cache)
    _, _, cap = ad.forward(mx.array([[3, 4, 5]]), cache, capture=True)
    conv_input, states = next(iter(cap.gdn.values()))
    assert isinstance(states, list) and len(states) == 3


def test_fast_rng_for_big_draws():
    from scripts.gpu_make_checkpoint import FastRng

    rng = FastRng(0)
    big = rng.standard_normal((1024, 1025))
    assert big.shape == (1024, 1025) and abs(float(big.std()) - 1) < 0.01
    assert rng.standard_normal(4).shape == (4,)
    assert rng.choice(np.arange(10), size=3, replace=False).shape == (3,)
