"""The GPU side of few-token forwards: when the adapter's own kernels (gpu_kernels) run.

On MLX's CUDA backend the adapter's decode steps, verifies, MTP head steps and lm_head send
their quantized linears with 1-8 rows through `gpu_kernels.quantized_matmul_rows`, and the
Gated-DeltaNet layers of forwards of up to 8 tokens through `gpu_kernels.gated_delta_steps`.
On Apple GPUs only the Gated-DeltaNet kernel is used (MLX's Metal matvec is already good),
and only after it has matched the ops path once at load.

The quantized modules of the model are retyped in place to subclasses whose __call__ takes
the kernel only while an adapter method runs (`kernels_on`): the same model object, used by
mlx_lm.stream_generate outside the adapter, keeps MLX's own path, so benchmarks against
stock mlx-lm stay honest. Parameter names and shapes do not change.

MTP_CHAT_GPU_KERNELS=0 turns all of this off.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from contextlib import contextmanager
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from . import gpu_kernels

ENV = "MTP_CHAT_GPU_KERNELS"
_local = threading.local()


def _on() -> bool:
    return getattr(_local, "on", False)


@contextmanager
def _active():
    before = _on()
    _local.on = True
    try:
        yield
    finally:
        _local.on = before


def kernels_on(method):
    """Decorator for adapter methods: their few-row quantized linears take the kernel.

    Not for calls with fast=False (chunked prefill keeps mlx-lm's own path throughout)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        gpu = getattr(self, "_gpu", None)
        if gpu is None or gpu.backend != "cuda" or not kwargs.get("fast", True):
            return method(self, *args, **kwargs)
        with _active():
            return method(self, *args, **kwargs)

    return run


def _kernel_matmul(module, x: mx.array) -> Optional[mx.array]:
    """x @ dequant(module.weight).T through the kernel, or None where it does not apply."""
    if not _on() or "bias" in module:
        return None
    w, scales, biases = module["weight"], module["scales"], module.get("biases")
    if biases is None or not gpu_kernels.qmm_supported(
        x.shape, x.dtype, w.shape, scales.dtype, module.bits, module.group_size, module.mode
    ):
        return None
    return gpu_kernels.quantized_matmul_rows(x, w, scales, biases, module.bits, module.group_size)


class KernelQuantizedLinear(nn.QuantizedLinear):
    def __call__(self, x):
        y = _kernel_matmul(self, x)
        return super().__call__(x) if y is None else y


class KernelQuantizedEmbedding(nn.QuantizedEmbedding):
    def as_linear(self, x):  # the tied output projection
        y = _kernel_matmul(self, x)
        return super().as_linear(x) if y is None else y


_RETYPE = {nn.QuantizedLinear: KernelQuantizedLinear, nn.QuantizedEmbedding: KernelQuantizedEmbedding}


def retype(*modules) -> int:
    """Swap the quantized layers of `modules` to their kernel subclasses; returns how many."""
    n = 0
    for module in modules:
        for _, m in module.named_modules():
            new = _RETYPE.get(type(m))
            if new is not None:
                m.__class__ = new
                n += 1
    return n


def wanted(device=None, cuda: Optional[bool] = None, env: Optional[str] = None) -> Optional[str]:
    """The kernel backend to use: "cuda", "metal" or None (CPU, switched off, no GPU)."""
    env = os.environ.get(ENV, "1") if env is None else env
    if env == "0":
        return None
    if (device or mx.default_device()) != mx.gpu:
        return None
    if gpu_kernels.cuda_available() if cuda is None else cuda:
        return "cuda"
    return "metal" if mx.metal.is_available() else None


class GpuDecode:
    """What the adapter holds when its GPU kernels are on."""

    def __init__(self, backend: str, retyped: int = 0):
        self.backend = backend
        self.retyped = retyped

    def gdn_ok(self, q: mx.array, v: mx.array, state: mx.array, mask) -> bool:
        return mask is None and gpu_kernels.gdn_supported(q.shape, v.shape, state.dtype)

    def gdn(self, q, k, v, g, beta, state):
        return gpu_kernels.gated_delta_steps(q, k, v, g, beta, state, backend=self.backend)


@functools.lru_cache(maxsize=None)
def _verdict(backend: str) -> Optional[str]:
    return gpu_kernels.self_check(backend)


def attach(model, head, backend: Optional[str] = None) -> Optional[GpuDecode]:
    """Turn the kernels on for this model and head where they apply; None where none does.

    CUDA: quantized linears and the Gated-DeltaNet recurrence. Metal: the recurrence only."""
    backend = wanted() if backend is None else backend
    if backend is None:
        return None
    why = _verdict(backend)
    if why is not None:
        print(f"mtp-chat: GPU kernels off ({backend}: {why}); using MLX's own path.", file=sys.stderr)
        return None
    return GpuDecode(backend, retype(model, head) if backend == "cuda" else 0)
