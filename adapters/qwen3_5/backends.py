"""How the reference layers (layers.py) run: one backend object, chosen once at load.

A backend has two runners: `few` for forwards of at most FEW_TOKENS positions of one sequence
(decode steps, verifies, MTP head steps) and `long` for the rest (prefill chunks). A runner
supplies the primitives the reference math calls (linear, norm, conv, RoPE, recurrence,
attention) and runs each layer with them. The backends:

- "mlx": MLX's own ops, eagerly; bit-identical to mlx-lm's modules (the same ops in the same
  order). What the CPU runs when the compiled path is off or the compute dtype is not fp32.
- "cpu-compiled": on MLX's CPU backend every primitive costs ~7 us to dispatch, and
  mx.fast.rope / mx.fast.rms_norm run as multi-op fallbacks (~110 / ~40 us per call). On the
  demo model a 9.7 ms decode step held only 2.8 ms of matmuls; the rest was dispatch. So the few
  runner compiles each layer (mx.compile over the reference, one function per layer and width):
  RMSNorm written out so it fuses, RoPE from one cos/sin table per forward, the conv as a sum of
  taps, positions taken as slices. Results agree with mlx-lm to fp32 rounding (~1e-6), not bit
  for bit; the AR lane is 1.1-1.5x mlx_lm's on this CPU because of it. (Fusing the projections
  that share an input into one matmul was measured slower: OpenBLAS's 3-row products cost twice
  the 2-row ones, and more so for wide matrices.) Long forwards go through "mlx" with the CPU
  prefill attention (kernels/cpu_attention.py).
- "cuda-kernels": the few runner sends the Gated-DeltaNet recurrence of up to 8 positions
  through one kernel launch, and quantized linears through MLX's own matmul at most 4 rows a
  call (row-invariant; the adapter's row kernel, kernels/cuda_qmm.py, measured slower, is off
  unless asked); prefill stays on MLX's own path. mlx-lm's model object is not touched, so
  mlx_lm.stream_generate on the same weights keeps MLX's path (benchmarks against stock mlx-lm
  stay honest).
- "metal-kernels": the recurrence kernel only (MLX's Metal matvec is already good).

The GPU kernels check themselves once at load (kernels.self_check); one that fails to build or
disagrees falls back to "mlx", saying so.
"""
from __future__ import annotations

import sys
import time
from functools import lru_cache
from typing import Callable, Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.base import create_attention_mask, create_ssm_mask, scaled_dot_product_attention
from mlx_lm.models.gated_delta import compute_g, gated_delta_kernel, gated_delta_ops, normalize_qk

from .. import kernel_cache, kernels
from ..kernels import cpu_attention, cuda_qmm, gdn
from . import layers
from .layers import AttnParams, GdnParams, _const

FEW_TOKENS = 8  # widest few-token forward (a verify is depth + 1 <= 8)


def _rms(x, w, eps):
    return w * (x * mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True) + eps))


def _metal_kernel_fits(k: mx.array) -> bool:
    """Where mlx-lm's gated_delta_update takes its own Metal kernel."""
    return (mx.default_device() == mx.gpu and mx.metal.is_available()
            and k.shape[-1] >= 32 and k.shape[-1] % 32 == 0)


_recurrence = mx.compile(gdn.recurrence)  # a verify's positions as one graph, every state kept


class MlxOps:
    """MLX's own ops, run eagerly: the same ops in the same order as mlx-lm's modules."""

    def __init__(self, cpu_attention: bool = False, row_invariant: bool = False):
        self.cpu_attention = cpu_attention  # long forwards on the CPU: kernels/cpu_attention.py
        self.row_invariant = row_invariant  # a GPU's few-token runner: see row_invariant_sdpa

    # -- primitives ---------------------------------------------------------------------
    def linear(self, m, x):
        return m(x)

    def norm(self, m, x):
        return m(x)

    def swiglu(self, gate, x):
        return swiglu(gate, x)

    def conv(self, p: GdnParams, conv_input, S):
        return p.attn.conv1d(conv_input)

    def qk_norm(self, q, k, Dk):
        return normalize_qk(q, k, inv_scale=Dk**-0.5, eps=1e-6)

    def decay(self, p: GdnParams, a):
        return compute_g(p.attn.A_log, a, p.attn.dt_bias)

    def gated_norm(self, m, y, z):
        return m(y, z)

    def recurrence(self, q, k, v, g, beta, state, mask, capture):
        kernel = _metal_kernel_fits(k)
        if not capture:
            y, state = (gated_delta_kernel if kernel else gated_delta_ops)(q, k, v, g, beta, state, mask)
            return y, [state]
        if mask is None and not kernel:
            return _recurrence(q, k, v, g, beta, state)
        step = gated_delta_kernel if kernel else gated_delta_ops
        ys, states = [], []
        for t in range(q.shape[1]):
            sl = slice(t, t + 1)
            y, state = step(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], state,
                            None if mask is None else mask[:, sl])
            ys.append(y)
            states.append(state)
        return mx.concatenate(ys, axis=1), states

    def rope(self, p: AttnParams, x, offset):
        if isinstance(offset, mx.array) and offset.ndim == 1 and type(p.attn.rope) is not nn.RoPE:
            # A batch at per-row positions; only mx.fast.rope (nn.RoPE) takes a vector of offsets.
            return mx.concatenate([p.attn.rope(x[b:b + 1], offset=o) for b, o in enumerate(offset.tolist())])
        return p.attn.rope(x, offset=offset)

    def positions(self, offset: int, S: int):
        return offset

    def masks(self, h, fa_cache, ssm_cache):
        return create_attention_mask(h, fa_cache), create_ssm_mask(h, ssm_cache)

    def sdpa(self, q, k, v, scale, mask, cache):
        if self.cpu_attention and isinstance(mask, (str, type(None))):
            return cpu_attention.attention(q, k, v, scale)
        if self.row_invariant:
            return row_invariant_sdpa(self._sdpa, q, k, v, scale, mask, cache)
        return self._sdpa(q, k, v, scale, mask, cache)

    @staticmethod
    def _sdpa(q, k, v, scale, mask, cache):
        return scaled_dot_product_attention(q, k, v, cache=cache, scale=scale, mask=mask)

    def lm_head(self, module, tied: bool, x):
        return module.as_linear(x) if tied else module(x)

    # -- running the reference ------------------------------------------------------------
    def enter(self, x):
        """Activations as this runner keeps them ([B, S, H] here)."""
        return x

    def leave(self, x):
        """Back to [B, S, ...]."""
        return x

    def gdn(self, p: GdnParams, h, conv_state, state, capture: bool, mask):
        """-> (h', the conv window to keep, states, conv_input when capturing)."""
        h, conv_input, states = layers.gdn_layer(self, p, h, conv_state, state, capture=capture, mask=mask)
        return h, mx.contiguous(conv_input[:, -(p.K - 1):]), states, (conv_input if capture else None)

    def attention_in(self, p: AttnParams, x, pos):
        return layers.attention_in(self, p, x, pos)

    def attention_out(self, p: AttnParams, x, o, gate, final_norm=None):
        return layers.attention_out(self, p, x, o, gate, final_norm)

    def final_norm(self, norm, h):
        return norm(h)

    def head_input(self, head, hidden, embedding):
        return layers.head_input(self, head, hidden, embedding)


class CpuCompiled(MlxOps):
    """One sequence, a few positions, fp32 on MLX's CPU backend: each layer one compiled function."""

    def __init__(self, rope: nn.RoPE):
        super().__init__()
        half = rope.dims // 2
        inv_freq = _const(mx.exp(-mx.arange(half, dtype=mx.float32) * (2.0 * mx.log(mx.array(rope.base, mx.float32)) / rope.dims)))

        @mx.compile
        def table(offset, steps):
            theta = ((offset + steps).astype(mx.float32) * rope.scale)[:, None] * inv_freq
            return mx.cos(theta), mx.sin(theta)

        self._table = table
        self._aranges = [mx.arange(s, dtype=mx.int32) for s in range(FEW_TOKENS + 1)]
        mx.eval(self._aranges)
        self._compiled: Dict[tuple, Callable] = {}

    # -- primitives (traced inside the compiled functions) --------------------------------
    def norm(self, m, x):
        return _rms(x, m.weight, m.eps)

    def swiglu(self, gate, x):
        return nn.silu(gate) * x

    def conv(self, p: GdnParams, conv_input, S):
        out = conv_input[..., 0:S, :] * p.taps[0]
        for k in range(1, p.K):
            out = out + conv_input[..., k : k + S, :] * p.taps[k]
        return out

    def qk_norm(self, q, k, Dk):
        eps = 1e-6 * Dk**-1  # normalize_qk's eps, moved onto the mean as mx.fast.rms_norm does
        return _rms(q, Dk**-1, eps), _rms(k, Dk**-0.5, eps)

    def decay(self, p: GdnParams, a):
        return mx.exp(p.neg_A * nn.softplus(a + p.attn.dt_bias))

    def gated_norm(self, m, y, z):
        return _rms(y, m.weight, m.eps) * nn.silu(z)

    def recurrence(self, q, k, v, g, beta, state, mask, capture):
        return gdn.recurrence(q, k, v, g, beta, state)

    def rope(self, p: AttnParams, x, pos):
        cos, sin = pos  # [S, dims/2]; mlx's non-traditional layout (halves)
        half = p.rope_dims // 2
        x1, x2, rest = x[..., :half], x[..., half : p.rope_dims], x[..., p.rope_dims :]
        return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)

    def positions(self, offset: int, S: int):
        return self._table(mx.array(offset, dtype=mx.int32), self._aranges[S])

    def masks(self, h, fa_cache, ssm_cache):
        return None, None

    def sdpa(self, q, k, v, scale, mask, cache):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal" if q.shape[2] > 1 else None)

    # -- each layer compiled once per role ------------------------------------------------
    def enter(self, x):
        return x.reshape(x.shape[1:])  # one sequence: no batch axis (see layers.py)

    def leave(self, x):
        return x[None]

    def _fn(self, key, make):
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compiled[key] = mx.compile(make())
        return fn

    def gdn(self, p: GdnParams, h, conv_state, state, capture: bool, mask):
        def make():
            def step(x, conv_state, state):
                x, conv_input, states = layers.gdn_layer(self, p, x, conv_state.reshape(conv_state.shape[1:]),
                                                         state, capture=capture)
                if capture:
                    return (x, conv_input[None], *states)
                return x, conv_input[None, x.shape[0]:], states[-1]
            return step

        out = self._fn((id(p), "gdn", capture), make)(h, conv_state, state)
        if capture:
            return out[0], out[1][:, h.shape[0]:], list(out[2:]), out[1]
        return out[0], out[1], [out[2]], None

    def attention_in(self, p: AttnParams, x, pos):
        fn = self._fn((id(p), "in"), lambda: lambda x, cos, sin: layers.attention_in(self, p, x, (cos, sin)))
        return fn(x, *pos)

    def attention_out(self, p: AttnParams, x, o, gate, final_norm=None):
        fn = self._fn((id(p), "out", id(final_norm)),
                      lambda: lambda x, o, gate: layers.attention_out(self, p, x, o, gate, final_norm))
        return fn(x, o, gate)

    def final_norm(self, norm, h):
        return self._fn((id(norm), "norm"), lambda: lambda h: _rms(h, norm.weight, norm.eps))(h)

    def head_input(self, head, hidden, embedding):
        fn = self._fn((id(head), "head"), lambda: lambda h, e: layers.head_input(self, head, h, e))
        return fn(hidden, embedding)


class CpuCompiledBatch(CpuCompiled):
    """The compiled CPU runner over a batch axis [B, S, H]: several sequences, each at its own
    position (layers.run_trunk_batch). The same compiled math per row as `CpuCompiled`; only the
    matmuls see B times the rows, and the BLAS may sum those in another order (float32 rounding:
    bit for bit on some processors, not on others; core/exactness.py measures which at load)."""

    def __init__(self, rope: nn.RoPE):
        super().__init__(rope)
        half = rope.dims // 2
        inv_freq = _const(mx.exp(-mx.arange(half, dtype=mx.float32) * (2.0 * mx.log(mx.array(rope.base, mx.float32)) / rope.dims)))

        @mx.compile
        def table(offsets, steps):
            # offsets [B] -> cos, sin [B, 1, S, dims/2]: broadcast over the heads of q, k [B, heads, S, hd]
            theta = ((offsets[:, None] + steps).astype(mx.float32) * rope.scale)[..., None] * inv_freq
            return mx.cos(theta)[:, None], mx.sin(theta)[:, None]

        self._batch_table = table

    def positions(self, offsets, S: int):
        return self._batch_table(offsets, self._aranges[S])

    def enter(self, x):
        return x

    def leave(self, x):
        return x

    def gdn(self, p: GdnParams, h, conv_state, state, capture: bool, mask):
        def make():
            def step(x, conv_state, state):
                x, conv_input, states = layers.gdn_layer(self, p, x, conv_state, state, capture=capture)
                if capture:
                    return (x, conv_input, *states)
                return x, conv_input[:, x.shape[1]:], states[-1]
            return step

        out = self._fn((id(p), "gdn-batch", capture), make)(h, conv_state, state)
        if capture:
            return out[0], out[1][:, h.shape[1]:], list(out[2:]), out[1]
        return out[0], out[1], [out[2]], None


QMV_ROWS = 4  # MLX CUDA's quantized matmul computes each of up to 4 rows as it computes one


class GpuKernels(MlxOps):
    """MLX's ops with the adapter's own kernels where they apply (a few positions, one sequence).

    Quantized linears on CUDA go through MLX's own matmul, at most QMV_ROWS rows a call, so a
    verify's row is the decode step's row bit for bit (greedy MTP == AR) and a decode step is
    mlx_lm's. The adapter's row kernel (kernels/cuda_qmm.py, `row_kernel=True`) is row-invariant
    too but measured slower at the 9B shape on an H200: a decode step 21.0 ms vs 13.2 ms, AR
    0.82x mlx_lm vs 1.21x (docs/bench/2026-12-01/GPU.md, scripts/gpu_profile.py)."""

    def __init__(self, backend: str, row_kernel: bool = False):
        super().__init__(row_invariant=True)
        self.backend = backend  # "cuda" | "metal"
        self.row_kernel = row_kernel and backend == "cuda"

    def linear(self, m, x):
        return self._rows(m, x, m)

    def lm_head(self, module, tied: bool, x):
        return self._rows(module, x, lambda x: MlxOps.lm_head(self, module, tied, x))

    def _rows(self, module, x, plain):
        if self.row_kernel:
            y = cuda_qmm.linear_rows(module, x)
            if y is not None:
                return y
        rows = x.size // x.shape[-1]
        if self.backend != "cuda" or rows <= QMV_ROWS:
            return plain(x)
        flat = x.reshape(rows, x.shape[-1])
        y = mx.concatenate([plain(flat[i:i + QMV_ROWS]) for i in range(0, rows, QMV_ROWS)])
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def recurrence(self, q, k, v, g, beta, state, mask, capture):
        B = q.shape[0]
        if mask is None and gdn.gdn_supported((1, *q.shape[1:]), (1, *v.shape[1:]), state.dtype):
            # One launch for all positions, a separate fp32 buffer per state; a batch's sequences
            # one launch each, so that each computes what it computes alone.
            runs = [gdn.gated_delta_steps(q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1], beta[b:b + 1],
                                          state[b:b + 1], backend=self.backend) for b in range(B)]
            if B == 1:
                return runs[0]
            return (mx.concatenate([y for y, _ in runs]),
                    [mx.concatenate([states[t] for _, states in runs]) for t in range(q.shape[1])])
        return super().recurrence(q, k, v, g, beta, state, mask, capture)



def row_invariant_sdpa(sdpa, q, k, v, scale, mask, cache):
    """Attention of L queries computed as L one-query attentions, each over exactly the keys the
    one-token decode step at that position sees.

    Why: MLX's GPU attention over L > 1 queries reduces in another order than over one (on the
    H200 the first differing layer of a 3-token verify vs 3 decode steps was always a full-attention
    layer, max |d| 1e-3 to 3e-2 in bf16), so greedy MTP left AR's text after 38-55 tokens. The
    other ops of a verify (the row kernels, the recurrence, norms, RoPE) already compute each row
    as the decode step does. This costs L-1 more launches per attention layer."""
    L = q.shape[2]
    if L == 1 or cache is None:
        return sdpa(q, k, v, scale, mask, cache)
    S = k.shape[2]
    return mx.concatenate([sdpa(q[:, :, i:i + 1], k[:, :, :S - L + i + 1], v[:, :, :S - L + i + 1], scale, None, cache)
                           for i in range(L)], axis=2)


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


@lru_cache(maxsize=None)
def _verdict(backend: str) -> Optional[str]:
    return kernels.self_check(backend)


_checked_once: set = set()


def _checked(backend: str) -> Tuple[Optional[str], str]:
    """The kernels' self-check (once a process) and what to say of it: how long it took and
    whether it compiled (MLX CUDA keeps compiled kernels in adapters/kernel_cache.py's folder)."""
    if backend in _checked_once:
        return _verdict(backend), f"{backend} kernels checked earlier in this process"
    folder = kernel_cache.folder() if backend == "cuda" else None
    before, t0 = kernel_cache.entries(folder), time.perf_counter()
    why = _verdict(backend)
    seconds, compiled = time.perf_counter() - t0, kernel_cache.entries(folder) - before
    _checked_once.add(backend)
    where = f" (compiled kernels kept in {folder})" if folder else ""
    how = f"compiled {compiled} kernel(s) and checked them" if compiled > 0 else "checked"
    return why, f"{backend} kernels {how} in {seconds:.1f} s{where}"


def choose(compute_dtype: str, ropes, *, compiled: bool = True, gpu_kernels: bool = True,
           device=None, cuda: Optional[bool] = None, log=None) -> Backend:
    """The backend for a model whose attention layers use `ropes`, decided once at load."""
    log = log or (lambda m: print(f"mtp-chat: {m}", file=sys.stderr))
    device = device or mx.default_device()
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
        why, said = _checked(kb)
        if why is None:
            return Backend(f"{kb}-kernels", GpuKernels(kb), MlxOps(), note=said)
        log(f"GPU kernels off ({kb}: {why}); using MLX's own path.")
        return Backend("mlx", MlxOps(row_invariant=True), MlxOps(), note=f"{kb} kernels failed their check: {why}")
    on_gpu = device == mx.gpu  # MLX's GPU attention over several queries is not row-invariant
    return Backend("mlx", MlxOps(row_invariant=on_gpu), MlxOps())
