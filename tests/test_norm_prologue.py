"""The "norm-prologue" trial on a machine without a GPU: a layer's input and post-attention
RMSNorms handed to the row kernel that reads them (kernels/cuda_qmm.py computes them as it loads
x), with a stand-in kernel that keeps the contract (rms_norm, then each row alone). The kernel
itself runs only on CUDA: its load check (kernels.check_norm_prologue) tests it there."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from adapters import kernels, load_adapter
from adapters.kernels import cuda_attention, cuda_qmm as gk, gdn, gdn_fused
from adapters.qwen3_5 import backends
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, sampling
from tests.test_gpu_wrappers import _KERNEL_SHAPED, _reference_kernel

GREEDY = SamplerConfig(0.0, 1.0, 0, 0.0)


def _row_kernel_with_norm(launches: list):
    """The row kernel's contract with its prologue: norm(x) as mx.fast.rms_norm computes it, then
    MLX's quantized matmul one row at a time; notes each launch's (rows, N, with a norm)."""
    def stand_in(x, w, scales, biases, bits, group_size, residual=None, config=None, swiglu=False, norm=None):
        x = gk.swiglu_rows(x) if swiglu else x
        if norm is not None:
            x = mx.fast.rms_norm(x, norm[0], norm[1].item())
        flat = x.reshape(-1, x.shape[-1])
        launches.append((flat.shape[0], w.shape[0], norm is not None))
        y = mx.concatenate([mx.quantized_matmul(flat[i:i + 1], w, scales, biases, transpose=True,
                                                group_size=group_size, bits=bits) for i in range(flat.shape[0])])
        y = y.reshape(*x.shape[:-1], w.shape[0])
        return y if residual is None else residual + y
    return stand_in


@pytest.fixture
def kernel_adapter(tiny_checkpoint, monkeypatch):
    ad = load_adapter(tiny_checkpoint(**dict(_KERNEL_SHAPED, head_dim=128)), compute_dtype="native")
    launches = []
    monkeypatch.setattr(gk, "quantized_matmul_rows", _row_kernel_with_norm(launches))
    monkeypatch.setattr(gdn, "gated_delta_steps", _reference_kernel([], lambda q: q.shape[1]))
    monkeypatch.setattr(gdn_fused, "gdn_fused", gdn_fused.reference)
    monkeypatch.setattr(cuda_attention, "gated_attention", cuda_attention.reference)
    return ad, launches


def _runner(prologue: bool):
    few = backends.CompiledGpuKernels("cuda", fused_gdn=True, fused_attention=True)
    few.norm_prologue = prologue
    return backends.Backend("stand-in", few, backends.MlxOps())


def test_each_layers_two_norms_go_into_the_product_that_reads_them(kernel_adapter):
    """With the trial, every layer's input norm (into q|k|v, or the Gated-DeltaNet's four input
    projections) and post-attention norm (into gate|up) are computed by the row kernel: as many
    launches with a norm as twice the layers, and the logits are the ones the norms as their own
    launches give (the stand-in computes them alike)."""
    ad, launches = kernel_adapter
    ids = mx.array([[5, 9, 13, 21]])
    logits = {}
    for prologue in (False, True):
        ad.backend = _runner(prologue)
        cache = ad.make_cache()
        ad.forward(ids[:, :1], cache)
        launches.clear()
        logits[prologue], _, _ = ad.forward(ids[:, 1:], cache)
        mx.eval(logits[prologue])
        normed = sum(n for _, _, n in launches)
        assert normed == (2 * len(ad.stack.layers) if prologue else 0), (prologue, launches)
    assert bool(mx.array_equal(logits[True], logits[False]))


def test_greedy_mtp_equals_ar_with_the_norm_prologue(kernel_adapter):
    ad, launches = kernel_adapter
    ad.backend = _runner(True)
    ids = [5, 9, 13, 21, 34, 55]
    ar, _ = AutoregressiveDecoder(ad, sampler=GREEDY).generate(ids, max_tokens=16)
    for depth in (1, 2, 3):
        assert SpeculativeDecoder(ad, sampler=GREEDY, depth=depth).generate(ids, max_tokens=16)[0] == ar, depth
    # the MTP head's own layer takes its norms into its products too
    assert any(n and rows <= 3 for rows, _, n in launches)


def test_the_trial_is_checked_at_load_and_falls_back_saying_why(monkeypatch):
    from adapters.options import LoadOptions
    from core.settings import Settings

    monkeypatch.setattr(backends, "_verdict", lambda backend, *fused: None)
    monkeypatch.setattr(kernels, "_two_tiles_verdict", lambda: (True, None))
    for k in ("on", "why"):   # choose() sets two tiles a launch and the sampler's top-k hook
        monkeypatch.setitem(gk.TWO_TILES, k, gk.TWO_TILES[k])   # process-wide: put them back after
    monkeypatch.setattr(sampling, "_row_topk", sampling._row_topk)
    monkeypatch.setattr(kernels, "topk_verdict", lambda draw=False: None)
    trials = LoadOptions.from_settings(Settings(gpu_trials="norm-prologue")).gpu_trials
    assert backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True).few.norm_prologue is False
    checked = []
    monkeypatch.setattr(kernels, "norm_prologue_verdict", lambda: checked.append(1))
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, trials=trials)
    assert b.few.norm_prologue is True and checked == [1] and "trials on: norm-prologue" in b.note
    monkeypatch.setattr(kernels, "norm_prologue_verdict", lambda: "its rows change with the row count (3 vs 8)")
    b = backends.choose("native", [nn.RoPE(8)], device=mx.gpu, cuda=True, trials=trials)
    assert b.few.norm_prologue is False
    assert "norms stay their own launches (its rows change with the row count (3 vs 8))" in b.note


def test_only_the_norm_variants_source_carries_the_prologue():
    plain = gk.QMM_SOURCE.replace("QMM_RESIDUAL", "")
    normed = gk._norm_source(plain)
    assert "inv_s" not in plain and "qmm_norm" not in plain + gk.QMM_HEADER
    assert normed.count("qmm_norm<T>(") == 1 and "rsqrtf(ss / static_cast<float>(K) + eps[0])" in normed
    assert "qmm_norm" in gk.QMM_NORM_HEADER
    # the check at load fails cleanly where there is no CUDA (the trial is then off, said so)
    assert "the norm prologue failed" in kernels.norm_prologue_verdict()
