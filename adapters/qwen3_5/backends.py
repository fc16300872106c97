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
  through one kernel launch, and every quantized linear of 1-8 rows through the row kernel
  (kernels/cuda_qmm.py: the weights read once for all rows, each row as alone), with the
  linears that share an input joined into one product and residuals added inside it; prefill
  stays on MLX's own path. mlx-lm's modules keep their types and values (the joined weights'
  row views), so mlx_lm.stream_generate on the same weights keeps MLX's path (benchmarks
  against stock mlx-lm stay honest).
- "metal-kernels": the recurrence kernel only (MLX's Metal matvec is already good).

The GPU kernels check themselves once at load (kernels.self_check); one that fails to build or
disagrees falls back to "mlx", saying so.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.base import create_attention_mask, create_ssm_mask, scaled_dot_product_attention
from mlx_lm.models.gated_delta import compute_g, gated_delta_kernel, gated_delta_ops, normalize_qk

from .. import kernel_cache, kernels
from ..kernels import cpu_attention, cuda_attention, cuda_qmm, gdn, gdn_fused
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


def rope_table(p: AttnParams, x, cos, sin):
    """RoPE from a table: cos, sin [S, dims/2], mlx's non-traditional layout (halves)."""
    half = p.rope_dims // 2
    x1, x2, rest = x[..., :half], x[..., half : p.rope_dims], x[..., p.rope_dims :]
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


class MlxOps:
    """MLX's own ops, run eagerly: the same ops in the same order as mlx-lm's modules."""

    def __init__(self, cpu_attention: bool = False, row_invariant: bool = False):
        self.cpu_attention = cpu_attention  # long forwards on the CPU: kernels/cpu_attention.py
        self.row_invariant = row_invariant  # a GPU's few-token runner: see row_invariant_sdpa

    # -- primitives ---------------------------------------------------------------------
    def linear(self, m, x):
        return m(x)

    def linears(self, modules, x):
        """Linears that share an input, each as its own product (a GPU runner fuses them)."""
        return [self.linear(m, x) for m in modules]

    def linear_add(self, m, x, residual):
        """residual + linear(x) (a GPU runner adds inside the product's kernel)."""
        y = self.linear(m, x)
        return y if residual is None else residual + y

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

    def gdn_middle(self, p: GdnParams, xn, conv_state, state, mask):
        """A Gated-DeltaNet layer from its normed input to out_proj's input in one launch:
        (output, conv_input, states), or None where the backend has no such kernel."""
        return None

    def attention_gated(self, p: AttnParams, q, k, v, gate, cache):
        """Attention of q over the cache's keys times sigmoid(gate), laid out for o_proj, from
        one kernel; None where the backend has none (then sdpa and attention_out's gate)."""
        return None

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
        if isinstance(offset, tuple):   # a RoPE table: a chunk with a picture's multimodal positions
            return rope_table(p, x, *offset)
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
        return rope_table(p, x, *pos)

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


@dataclass
class _Fused:
    """Linears that share an input as one weight: their rows concatenated (views of it stay in
    the modules, so nothing is held twice) and where each one's outputs end."""

    weight: mx.array
    scales: mx.array
    biases: mx.array
    bits: int
    group_size: int
    ends: List[int]


class GpuKernels(MlxOps):
    """MLX's ops with the adapter's own kernels where they apply (a few positions, one sequence).

    On CUDA every quantized linear of 1-8 rows goes through the row kernel (kernels/cuda_qmm.py):
    one launch reads the weights once for all rows, and a row's result does not depend on how
    many rows travel with it, so a verify row is the decode step's row bit for bit (greedy MTP
    == AR) and a verify costs about one decode step in weight reads. Linears that share an input
    (a Gated-DeltaNet layer's four input projections, gate and up, q/k/v) run as one product,
    and the residual after out_proj, o_proj and down_proj is added inside it: fewer launches.
    Wider inputs (a batch) go through it 8 rows at a time. `row_kernel=False` keeps MLX's own
    matmul at most QMV_ROWS rows a call (also row-invariant; scripts/gpu_profile.py compares)."""

    def __init__(self, backend: str, row_kernel: bool = True, fused_gdn: bool = False,
                 fused_attention: bool = False):
        super().__init__(row_invariant=True)
        self.backend = backend  # "cuda" | "metal"
        self.row_kernel = row_kernel and backend == "cuda"
        # kernels/gdn_fused.py and kernels/cuda_attention.py: off until measured on a GPU
        # (scripts/gpu_fused_gdn.py and scripts/gpu_attention.py check them)
        self.fused_gdn = fused_gdn and self.row_kernel
        self.fused_attention = fused_attention and backend == "cuda"
        self._fused: Dict[tuple, Optional[_Fused]] = {}
        self._gdn_inputs: Dict[int, tuple] = {}
        self._lock = threading.Lock()

    compiled_layers = False

    def linear(self, m, x):
        return self._rows(m, x, m)

    def linear_add(self, m, x, residual):
        if self.row_kernel and residual is not None and _kernel_fits(m, x):
            return _kernel_rows(x, m["weight"], m["scales"], m["biases"], m.bits, m.group_size, residual)
        return super().linear_add(m, x, residual)

    def linears(self, modules, x):
        joined = self._joined(modules, x)
        if joined is None:
            return super().linears(modules, x)
        y = _kernel_rows(x, joined.weight, joined.scales, joined.biases, joined.bits, joined.group_size)
        return mx.split(y, joined.ends[:-1], axis=-1)

    def lm_head(self, module, tied: bool, x):
        return self._rows(module, x, lambda x: MlxOps.lm_head(self, module, tied, x))

    def attention_gated(self, p: AttnParams, q, k, v, gate, cache):
        if not self.fused_attention or cache is None or not cuda_attention.supported(q.shape, k.shape, q.dtype):
            return None
        return cuda_attention.gated_attention(q, k, v, gate, p.scale)

    def gdn_middle(self, p: GdnParams, xn, conv_state, state, mask):
        if not self.fused_gdn or mask is not None or p.project is not layers.separate_projections \
                or xn.ndim != 3 or xn.shape[0] != 1:
            return None
        at = p.attn
        joined = self._joined((at.in_proj_qkv, at.in_proj_z, at.in_proj_b, at.in_proj_a), xn)
        if joined is None or not gdn_fused.supported(xn.shape[1], p.Hk, p.Hv, p.Dk, p.Dv, p.K, state.dtype, xn.dtype):
            return None
        if id(p) not in self._gdn_inputs:  # made on the layer's first (eager) call, never inside a trace
            conv_w = at.conv1d.weight.reshape(p.conv_dim, p.K)
            cst = gdn_fused.consts(p.Dk, at.norm.eps)
            mx.eval(conv_w, cst)
            self._gdn_inputs[id(p)] = (conv_w, cst)
        conv_w, cst = self._gdn_inputs[id(p)]
        proj = _kernel_rows(xn, joined.weight, joined.scales, joined.biases, joined.bits, joined.group_size)
        return gdn_fused.gdn_fused(proj, tuple(joined.ends[:3]), conv_state, conv_w, p.neg_A, at.dt_bias,
                                   at.norm.weight, cst, state, (p.Hk, p.Hv, p.Dk, p.Dv, p.K))

    def _rows(self, module, x, plain):
        if self.row_kernel and _kernel_fits(module, x):
            return _kernel_rows(x, module["weight"], module["scales"], module["biases"], module.bits, module.group_size)
        rows = _rows_of(x)
        if self.backend != "cuda" or rows <= QMV_ROWS:
            return plain(x)
        flat = x.reshape(rows, x.shape[-1])
        y = mx.concatenate([plain(flat[i:i + QMV_ROWS]) for i in range(0, rows, QMV_ROWS)])
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def _joined(self, modules, x) -> Optional[_Fused]:
        """The joined weight of `modules` where the row kernel serves it for x, else None."""
        if not self.row_kernel or len(modules) < 2:
            return None
        joined = self._fuse(tuple(modules))
        if joined is None or not cuda_qmm.qmm_supported((min(_rows_of(x), MAX_ROWS), x.shape[-1]), x.dtype,
                                                        joined.weight.shape, joined.scales.dtype, joined.bits,
                                                        joined.group_size):
            return None
        return joined

    def _fuse(self, modules) -> Optional[_Fused]:
        key = tuple(id(m) for m in modules)
        if key in self._fused:
            return self._fused[key]
        with self._lock:
            if key not in self._fused:
                self._fused[key] = _fuse(modules)
        return self._fused[key]

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


class CompiledGpuKernels(GpuKernels):
    """GpuKernels with each layer's few-token forward one compiled function (mx.compile).

    Why: on MLX CUDA a 9B decode step was host-bound. Building its graph op by op from Python
    took 7.4 ms of a 10.3 ms forward (docs/bench/2026-12-02/gpu-profile-9b-rowkernel-v1.json);
    a compiled layer is one call that replays its recorded graph, and MLX fuses the elementwise
    ops between the kernels. The same functions serve every width (each traced per shape), and
    elementwise fusion computes each element as before, so a verify row is still the decode
    step's row. A layer's first call runs eagerly: it joins the layer's weights (_fuse), which
    cannot happen inside a trace. The KV cache update and the attention stay outside, as in
    the CPU's compiled runner."""

    compiled_layers = True

    def __init__(self, backend: str, row_kernel: bool = True, fused_gdn: bool = False,
                 fused_attention: bool = False):
        super().__init__(backend, row_kernel, fused_gdn, fused_attention)
        self._compiled: Dict[tuple, Callable] = {}

    def _fn(self, key, make):
        fn = self._compiled.get(key)
        if fn is None:
            self._compiled[key] = mx.compile(make())
            return make()  # this first call eagerly (see the class's note)
        return fn

    def positions(self, offset, S: int):
        # An array, not an int: a Python offset would be traced as a constant (one trace a position).
        return mx.array(offset, dtype=mx.int32)

    def gdn(self, p: GdnParams, h, conv_state, state, capture: bool, mask):
        if mask is not None:
            return super().gdn(p, h, conv_state, state, capture, mask)

        def make():
            def step(x, conv_state, state):
                # The conv window to keep is cut inside the compiled step: one primitive fewer a layer.
                x, conv_input, states = layers.gdn_layer(self, p, x, conv_state, state, capture=capture)
                keep = mx.contiguous(conv_input[:, -(p.K - 1):])
                return (x, keep, conv_input, *states) if capture else (x, keep, states[-1])
            return step

        out = self._fn((id(p), "gdn", capture), make)(h, conv_state, state)
        if capture:
            return out[0], out[1], list(out[3:]), out[2]
        return out[0], out[1], [out[2]], None

    def attention_in(self, p: AttnParams, x, pos):
        if not isinstance(pos, mx.array) or pos.ndim:
            # a RoPE table (a chunk with a picture) or a batch at per-row positions (RoPE may read
            # them on the host): eagerly
            return super().attention_in(p, x, pos)
        return self._fn((id(p), "in"), lambda: lambda x, pos: layers.attention_in(self, p, x, pos))(x, pos)

    def attention_out(self, p: AttnParams, x, o, gate, final_norm=None):
        if gate is None:  # o already gated (attention_gated)
            fn = self._fn((id(p), "out-gated", id(final_norm)),
                          lambda: lambda x, o: layers.attention_out(self, p, x, o, None, final_norm))
            return fn(x, o)
        fn = self._fn((id(p), "out", id(final_norm)),
                      lambda: lambda x, o, gate: layers.attention_out(self, p, x, o, gate, final_norm))
        return fn(x, o, gate)

    def final_norm(self, norm, h):
        return self._fn((id(norm), "norm"), lambda: lambda h: norm(h))(h)

    def head_input(self, head, hidden, embedding):
        fn = self._fn((id(head), "head"), lambda: lambda h, e: layers.head_input(self, head, h, e))
        return fn(hidden, embedding)


MAX_ROWS = cuda_qmm.MAX_ROWS


def _rows_of(x: mx.array) -> int:
    return x.size // x.shape[-1]


def _kernel_fits(m, x) -> bool:
    """Whether the row kernel serves module m for x (of any row count: wider goes 8 at a time)."""
    return cuda_qmm.module_fits(m, min(_rows_of(x), MAX_ROWS), x.shape[-1], x.dtype)


def _kernel_rows(x, w, scales, biases, bits, group_size, residual=None):
    """The row kernel on x [..., K], 8 rows a launch where there are more (each row as alone)."""
    rows = _rows_of(x)
    if rows <= MAX_ROWS:
        return cuda_qmm.quantized_matmul_rows(x, w, scales, biases, bits, group_size, residual)
    K, N = x.shape[-1], w.shape[0]
    flat = x.reshape(rows, K)
    res = None if residual is None else residual.reshape(rows, N)
    y = mx.concatenate([cuda_qmm.quantized_matmul_rows(flat[i:i + MAX_ROWS], w, scales, biases, bits, group_size,
                                                       None if res is None else res[i:i + MAX_ROWS])
                        for i in range(0, rows, MAX_ROWS)])
    return y.reshape(*x.shape[:-1], N)


def _fuse(modules) -> Optional[_Fused]:
    """One weight for quantized linears of one input size and one quantization, or None.

    The modules keep views of the joined arrays (row slices share its memory), so mlx-lm's
    model computes what it computed and nothing is held twice."""
    first = modules[0]
    same = all(isinstance(m, nn.QuantizedLinear) and "bias" not in m and m.get("biases") is not None
               and (m.bits, m.group_size, m.mode) == (first.bits, first.group_size, first.mode)
               and m["weight"].shape[1] == first["weight"].shape[1] and m["scales"].dtype == first["scales"].dtype
               for m in modules)
    if not same:
        return None
    joined = {k: mx.concatenate([m[k] for m in modules]) for k in ("weight", "scales", "biases")}
    mx.eval(joined)
    ends, at = [], 0
    for m in modules:
        n = m["weight"].shape[0]
        for k, v in joined.items():
            m[k] = v[at:at + n]
        at += n
        ends.append(at)
    mx.eval([m[k] for m in modules for k in joined])
    return _Fused(joined["weight"], joined["scales"], joined["biases"], first.bits, first.group_size, ends)


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


# The fused Gated-DeltaNet middle and the few-row attention kernel: written, checked on the CPU
# through their references, not yet run on a GPU (docs/bench/2026-12-02/GPU.md). When on, the
# load-time check covers them too.
FUSED_GDN = False
FUSED_ATTENTION = False


@lru_cache(maxsize=None)
def _verdict(backend: str) -> Optional[str]:
    return kernels.self_check(backend, fused_gdn=FUSED_GDN, fused_attention=FUSED_ATTENTION)


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
            runner = CompiledGpuKernels if compiled and kb == "cuda" else GpuKernels
            few = runner(kb, fused_gdn=FUSED_GDN, fused_attention=FUSED_ATTENTION)
            return Backend(f"{kb}-kernels", few, MlxOps(), note=said if few.compiled_layers else said + "; layers not compiled")
        log(f"GPU kernels off ({kb}: {why}); using MLX's own path.")
        return Backend("mlx", MlxOps(row_invariant=True), MlxOps(), note=f"{kb} kernels failed their check: {why}")
    on_gpu = device == mx.gpu  # MLX's GPU attention over several queries is not row-invariant
    return Backend("mlx", MlxOps(row_invariant=on_gpu), MlxOps())
