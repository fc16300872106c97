"""How the reference layers (layers.py) run: one backend object, chosen once at load.

A backend has two runners: `few` for forwards of at most FEW_TOKENS positions of one sequence
(decode steps, verifies, MTP head steps) and `long` for the rest (prefill chunks). A runner
supplies the primitives the reference math calls (linear, norm, conv, RoPE, recurrence,
attention) and runs each layer with them. The backends:

- "mlx": MLX's own ops, eagerly (mlx_ops.py); bit-identical to mlx-lm's modules (the same ops in
  the same order). What the CPU runs when the compiled path is off or the compute dtype is not fp32.
- "cpu-compiled": each layer's few-token forward compiled (cpu_runner.py): on MLX's CPU backend a
  step was mostly dispatch. Results agree with mlx-lm to fp32 rounding (~1e-6), not bit for bit;
  the AR lane is 1.1-1.5x mlx_lm's on this CPU because of it. (Fusing the projections that share
  an input into one matmul was measured slower: OpenBLAS's 3-row products cost twice the 2-row
  ones, and more so for wide matrices.) Long forwards go through "mlx" with the CPU prefill
  attention (kernels/cpu_attention.py).
- "cuda-kernels": the few runner sends the Gated-DeltaNet recurrence of up to 8 positions
  through one kernel launch, and every quantized linear of 1-8 rows through the row kernel
  (gpu_runner.py, kernels/cuda_qmm.py: the weights read once for all rows, each row as alone),
  with the linears that share an input joined into one product and residuals added inside it.
  The long runner (prefill) is MLX's own path with each chunk's recurrence as one kernel launch
  (gpu_runner.GpuPrefill). mlx-lm's modules keep their types and values (the joined
  weights' row views), so mlx_lm.stream_generate on the same weights keeps MLX's path
  (benchmarks against stock mlx-lm stay honest).
- "metal-kernels": the few-token recurrence kernel only (MLX's Metal matvec is already good;
  prefill keeps mlx-lm's own Metal kernel for the recurrence). Whether MLX's matmul computes a
  verify's rows as it computes one is checked at load for every linear shape of the model
  (GpuKernels.check_rows); where it does not, rows go through it in narrower calls (exact,
  slower), and the load note says so.

The GPU kernels check themselves once at load (kernels.self_check); one that fails to build or
disagrees falls back to "mlx", saying so.
"""
from __future__ import annotations

import os
import re
import sys
import time
from functools import lru_cache
from typing import Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from core import sampling

from .. import kernel_cache, kernels
from .cpu_runner import CpuCompiled, CpuCompiledBatch
from .gpu_runner import CompiledGpuKernels, GpuKernels, GpuPrefill
from .mlx_ops import FEW_TOKENS, MlxOps


class Backend:
    """The runners of one loaded model: `few` (<= FEW_TOKENS positions, one sequence), `long`,
    and `batch` (a few positions of several sequences at once, layers.run_trunk_batch)."""

    def __init__(self, name: str, few: MlxOps, long: MlxOps, note: str = ""):
        self.name, self.few, self.long, self.note = name, few, long, note
        # MLX's own ops, and a GPU's row kernels, take a batch's rows as they are; the compiled
        # CPU runner drops the batch axis, so its backend sets a batched one of its own. On a GPU
        # a batch [B, S, H] reaches GpuKernels.linear as B*S rows, given to MLX's matmul at most
        # 4 a call (each row as alone); the recurrence kernel runs once per sequence; attention
        # runs per sequence over its own cache, row-invariant as alone. tests/test_batch.py runs
        # the MLX-ops path (bf16, row-invariant attention) on the CPU.
        self.batch = few

    def runner(self, shape, fast: bool) -> MlxOps:
        return self.few if fast and shape[0] == 1 and shape[1] <= FEW_TOKENS else self.long


def kernel_backend(device=None, cuda: Optional[bool] = None, kernels_on: bool = True) -> Optional[str]:
    """The GPU kernel backend to use: "cuda", "metal" or None (CPU, switched off, no GPU)."""
    if not kernels_on or (device or mx.default_device()) != mx.gpu:
        return None
    if kernels.cuda_available() if cuda is None else cuda:
        return "cuda"
    return "metal" if mx.metal.is_available() else None


# The fused Gated-DeltaNet middle and the few-row attention kernel: on since measured on the H200
# (docs/bench/2026-12-02/GPU.md, section 4: a 1-position forward 10.7 -> 5.9 ms, 978 -> 450
# primitives, greedy MTP == AR over 512 tokens at 64 and 8k tokens of context). The load-time
# check covers them; MTP_CHAT_GPU_FUSED=0 turns them off.
FUSED_GDN = True
FUSED_ATTENTION = True


@lru_cache(maxsize=None)
def _verdict(backend: str, fused_gdn: bool, fused_attention: bool) -> Optional[str]:
    return kernels.self_check(backend, fused_gdn=fused_gdn, fused_attention=fused_attention)


_checked_once: set = set()
SAY_PARTS_FROM = 1.0   # seconds of checking from which the note names its parts (15-21 s a start on the H200)


def _checked(backend: str, fused: Tuple[bool, bool]) -> Tuple[Optional[str], str]:
    """The kernels' self-check (once a process for each choice of fused kernels) and what to say
    of it: how long it took and whether it compiled (MLX CUDA keeps compiled kernels in
    adapters/kernel_cache.py's folder)."""
    if (backend, fused) in _checked_once:
        return _verdict(backend, *fused), f"{backend} kernels checked earlier in this process"
    folder = kernel_cache.folder() if backend == "cuda" else None
    before, failed, t0 = kernel_cache.entries(folder), kernels.jit_cache.stats["failed"], time.perf_counter()
    why = _verdict(backend, *fused)
    seconds, compiled = time.perf_counter() - t0, kernel_cache.entries(folder) - before
    _checked_once.add((backend, fused))
    where = f" (compiled kernels kept in {folder})" if folder else ""
    failed = kernels.jit_cache.stats["failed"] - failed
    if failed:   # MLX compiled those itself, as in every process before (kernels/jit_cache.py)
        where += f"; {failed} of ours not kept on disk ({kernels.jit_cache.errors[0] if kernels.jit_cache.errors else '?'})"
    how = f"compiled {compiled} kernel(s) and checked them" if compiled > 0 else "checked"
    parts = sorted(kernels.last_check_seconds.items(), key=lambda kv: -kv[1])
    took = f": {', '.join(f'{name} {s:.1f} s' for name, s in parts)}" if seconds >= SAY_PARTS_FROM and parts else ""
    return why, f"{backend} kernels {how} in {seconds:.1f} s{took}{where}"


def cuda_graphs_on(env=os.environ) -> bool:
    """Whether MLX CUDA records each evaluation as a CUDA graph: MLX reads MLX_USE_CUDA_GRAPHS once a
    process with C's atoi (unset: on; "0", "false", "" or any text without a leading number: off).
    Said in the load note when off, since it moves the lanes' speed (docs/bench/2026-12-04/GPU.md
    sections 20-21)."""
    value = env.get("MLX_USE_CUDA_GRAPHS")
    if value is None:
        return True
    m = re.match(r"\s*([+-]?\d+)", value)
    return bool(m and int(m.group(1)))


def choose(compute_dtype: str, ropes, *, compiled: bool = True, gpu_kernels: bool = True,
           fused: Optional[bool] = None, device=None, cuda: Optional[bool] = None, log=None,
           trials: frozenset = frozenset()) -> Backend:
    """The backend for a model whose attention layers use `ropes`, decided once at load; `fused`
    forces the fused CUDA kernels on or off (None: FUSED_GDN / FUSED_ATTENTION); `trials` turns
    on kernel changes not yet measured to pay (settings.gpu_trials: submit, swiglu, verify-submit,
    batch-verify-wait, batch-submit, topk-mlx, topk-support)."""
    log = log or (lambda m: print(f"mtp-chat: {m}", file=sys.stderr))
    device = device or mx.default_device()
    sampling.use_row_topk(None)   # MLX's ops unless the CUDA kernel below passes its check
    on_cpu = device == mx.cpu
    if on_cpu and compute_dtype == "float32":
        long = MlxOps(cpu_attention=True)
        plain = all(type(r) is nn.RoPE and not r.traditional for r in ropes)
        if compiled and plain and len({(r.dims, r.base, r.scale) for r in ropes}) == 1:
            backend = Backend("cpu-compiled", CpuCompiled(ropes[0]), long)
            backend.batch = CpuCompiledBatch(ropes[0])
            return backend
        why = "switched off (compiled = false)" if not compiled else "a RoPE variant it does not write out"
        return Backend("mlx", long, long, note=f"compiled CPU path off: {why}")
    kb = kernel_backend(device, cuda, gpu_kernels)
    if kb is not None:
        on = (FUSED_GDN, FUSED_ATTENTION) if fused is None else (fused, fused)
        on = on if kb == "cuda" else (False, False)
        why, said = _checked(kb, on)
        if why is None:
            if kb == "cuda":
                kernels.two_tiles(True)   # its load check decides
                if not kernels.cuda_qmm.TWO_TILES["on"]:
                    said += f"; batches' matmuls go 8 rows a launch ({kernels.cuda_qmm.TWO_TILES['why']})"
            runner = CompiledGpuKernels if compiled and kb == "cuda" else GpuKernels
            few = runner(kb, fused_gdn=on[0], fused_attention=on[1])
            few.submit_every = 8 if "submit" in trials else 0
            few.submit_verify_every = 8 if "verify-submit" in trials else 0
            if "batch-verify-wait" in trials:
                few.submit_batch_verify_every = 0
            few.submit_batch_step_every = 8 if "batch-submit" in trials else 0
            if "topk-mlx" not in trials and kb == "cuda":
                drawing = "topk-support" not in trials
                why_topk = kernels.topk_verdict(drawing)
                if why_topk is None:
                    sampling.use_row_topk(kernels.cuda_topk.row_topk_drawing if drawing
                                          else kernels.cuda_topk.row_topk_support)
                else:
                    said += f"; sampled supports through MLX's ops ({why_topk})"
            few.swiglu_mlp = "swiglu" in trials and kb == "cuda"
            if trials:
                said += f"; trials on: {', '.join(sorted(trials))}"
            if kb == "cuda" and not cuda_graphs_on():
                said += (f"; MLX's CUDA graphs off (MLX_USE_CUDA_GRAPHS={os.environ['MLX_USE_CUDA_GRAPHS']!r}): "
                         "measured, AR's lane slower by ~15 %, MTP's the same")
            long = GpuPrefill() if kb == "cuda" else MlxOps()
            return Backend(f"{kb}-kernels", few, long, note=said if few.compiled_layers else said + "; layers not compiled")
        log(f"GPU kernels off ({kb}: {why}); using MLX's own path.")
        return Backend("mlx", MlxOps(row_invariant=True), MlxOps(), note=f"{kb} kernels failed their check: {why}")
    on_gpu = device == mx.gpu  # MLX's GPU attention over several queries is not row-invariant
    return Backend("mlx", MlxOps(row_invariant=on_gpu), MlxOps())
