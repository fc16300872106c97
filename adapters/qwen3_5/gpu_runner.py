"""The GPU runners: MLX's ops with the adapter's own kernels for a few positions of one sequence,
and for prefill chunks on CUDA (`GpuPrefill`: the recurrence of a whole chunk in one launch).

Every quantized linear of 1-8 rows goes through the row kernel (kernels/cuda_qmm.py): the
weights read once for all rows, each row's arithmetic as alone, so a verify's rows are the decode
steps' rows by construction. Linears that share an input are joined into one product (`_fuse`),
residuals are added inside it, and `CompiledGpuKernels` compiles each layer's few-token forward
(the host's graph building was the step's bottleneck: docs/bench/2026-12-02/GPU.md).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..kernels import cuda_attention, cuda_qmm, gdn, gdn_fused
from . import layers
from .layers import AttnParams, GdnParams
from .mlx_ops import MlxOps

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
    matmul at most QMV_ROWS rows a call (also row-invariant; scripts/gpu/gpu_profile.py compares)."""

    def __init__(self, backend: str, row_kernel: bool = True, fused_gdn: bool = False,
                 fused_attention: bool = False):
        super().__init__(row_invariant=True)
        self.backend = backend  # "cuda" | "metal"
        self.row_kernel = row_kernel and backend == "cuda"
        # kernels/gdn_fused.py and kernels/cuda_attention.py (backends.FUSED_GDN / FUSED_ATTENTION
        # say whether a load turns them on; scripts/gpu/gpu_fused_gdn.py and gpu_attention.py check them)
        self.fused_gdn = fused_gdn and self.row_kernel
        self.fused_attention = fused_attention and backend == "cuda"
        self._fused: Dict[tuple, Optional[_Fused]] = {}
        self._row_limits: Dict[tuple, int] = {}   # MLX's own matmul: rows a call keeps as alone, per shape
        self.said: List[str] = []                 # what the row checks found (the load note reads it)
        self._gdn_inputs: Dict[int, tuple] = {}
        self._lock = threading.Lock()

    compiled_layers = False
    # Trials (settings.gpu_trials), off until measured to pay on the GPU; neither changes a value.
    # "submit": a forward's first layers go to the GPU every 8 layers while the host builds the
    # rest (after the cycle's one sync the verify otherwise waits for its whole graph, 1.2-1.8 ms
    # at the 9B shape, with the GPU idle). "swiglu": dense_mlp below.
    submit_every = 0
    swiglu_mlp = False
    # A verify of several sequences goes to the GPU every 8 layers (the "submit" trial's way, for
    # it alone): MTP's aggregate at 4 requests on the H200 +14 % on the means of 4 pairs, ahead in 5
    # of 6 pairs, where one sequence's verify lost ~8 % (docs/bench/2026-12-03/GPU.md, sections 15
    # and 16). "batch-verify-wait" turns it off.
    submit_batch_verify_every = 8
    # "batch-submit": a plain step of several sequences (AR at B > 1) the same way. Lost both pairs
    # on the H200 (AR at 4 requests 2.64 / 2.42x one request against 2.88 / 2.70x, 2026-12-04 GPU.md
    # section 18): a trial, off.
    submit_batch_step_every = 0

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

    def dense_mlp(self, m, x, residual):
        # gate|up as one product, then down_proj reading silu(gate) * up as it loads its input
        # (no split, no activation launch) and adding the residual: two launches for the MLP.
        if not self.swiglu_mlp:
            return None
        joined = self._joined((m.gate_proj, m.up_proj), x)
        down = m.down_proj
        if joined is None or joined.ends[1] != 2 * joined.ends[0] \
                or not cuda_qmm.module_fits(down, min(_rows_of(x), MAX_ROWS), joined.ends[0], x.dtype):
            return None
        gate_up = _kernel_rows(x, joined.weight, joined.scales, joined.biases, joined.bits, joined.group_size)
        return _kernel_rows(gate_up, down["weight"], down["scales"], down["biases"], down.bits, down.group_size,
                            residual, swiglu=True)

    def lm_head(self, module, tied: bool, x):
        return self._rows(module, x, lambda x: MlxOps.lm_head(self, module, tied, x))

    def attention_gated(self, p: AttnParams, q, k, v, gate, cache):
        if not self.fused_attention or cache is None or not cuda_attention.supported(q.shape, k.shape, q.dtype):
            return None
        return cuda_attention.gated_attention(q, k, v, gate, p.scale)

    def attention_gated_batch(self, p: AttnParams, q, fetched, gate, caches):
        # One launch pair for the batch (each sequence's rows over its own keys, as alone).
        if not self.fused_attention or len(fetched) > cuda_attention.MAX_SEQUENCES or any(
                c is None or not cuda_attention.supported(q[:1].shape, k.shape, q.dtype) for (k, _), c in zip(fetched, caches)):
            return super().attention_gated_batch(p, q, fetched, gate, caches)
        return cuda_attention.gated_attention_batch(q, [k for k, _ in fetched], [v for _, v in fetched], gate, p.scale)

    def prepare(self, attention: List[AttnParams], widths, sequences: int = 1, dtype=mx.bfloat16) -> int:
        """Build, never run, the attention launches a long context or a batch takes and a short
        warm-up does not: from cuda_attention.ROWS_BLOCK_FROM keys a block takes all of a
        verify's rows, one template per row count, and a batch of B sequences is a template of
        its own. Building one writes its compiled module to the machine's cache
        (kernels/jit_cache.py) where it is missing, so no request compiles it (~1.5 s each, the
        first long turn's 4-6 s on the H200). Returns the launches built."""
        if not self.fused_attention:
            return 0
        built = 0
        for nh, nkv, hd, scale in sorted({(p.nh, p.nkv, p.hd, p.scale) for p in attention}):
            if not cuda_attention.supported((1, nh, 1, hd), (1, nkv, 1, hd), dtype):
                continue
            for B in range(1, min(sequences, cuda_attention.MAX_SEQUENCES) + 1):
                # long contexts: a template per row count; short ones: a row a block, so one per
                # batch size (a single sequence's is the warm-up's own)
                launches = [(L, cuda_attention.ROWS_BLOCK_FROM) for L in widths] + ([(2, 128)] if B > 1 else [])
                for L, n in launches:
                    keys = [mx.zeros((1, nkv, n, hd), dtype)] * B
                    cuda_attention.gated_attention_batch(mx.zeros((B, nh, L, hd), dtype), keys, keys,
                                                         mx.zeros((B, L, nh * hd), dtype), scale)
                    built += 1
        return built

    def gdn_middle(self, p: GdnParams, xn, conv_state, state, mask):
        if not self.fused_gdn or mask is not None or p.project is not layers.separate_projections or xn.ndim != 3:
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
        # One launch for a batch: the kernel's blocks compute each sequence alone (batched == alone).
        return gdn_fused.gdn_fused(proj, tuple(joined.ends[:3]), conv_state, conv_w, p.neg_A, at.dt_bias,
                                   at.norm.weight, cst, state, (p.Hk, p.Hv, p.Dk, p.Dv, p.K))

    def _rows(self, module, x, plain):
        if self.row_kernel and _kernel_fits(module, x):
            return _kernel_rows(x, module["weight"], module["scales"], module["biases"], module.bits, module.group_size)
        rows = _rows_of(x)
        limit = QMV_ROWS if self.backend == "cuda" else self._row_limit(module, x, plain)
        if rows <= limit:
            return plain(x)
        flat = x.reshape(rows, x.shape[-1])
        y = mx.concatenate([plain(flat[i:i + limit]) for i in range(0, rows, limit)])
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def check_rows(self, modules, dtype) -> List[str]:
        """At load, where MLX's own matmul serves the few-token linears (Metal): each distinct
        shape's row limit (_row_limit), so the load note can say where rows go one at a time."""
        for m in modules:
            self._row_limit(m, mx.zeros((1, m["weight"].shape[-1] * 32 // getattr(m, "bits", 32)), dtype), m)
        return list(self.said)

    def _row_limit(self, module, x, plain) -> int:
        """How many rows MLX's own matmul takes in one call computing each as alone, for this
        module's shape and x's dtype: checked once, on its first call, against one-row calls
        (we cannot read Metal's kernel choice: MLX's `qmv_wide` sums in another order, and MTP
        left AR at 2 rows in another project). Where it is 1, a verify's rows go through one
        call each: exact, slower, and said."""
        key = (tuple(module["weight"].shape), x.dtype, getattr(module, "bits", None), getattr(module, "group_size", None))
        if key not in self._row_limits:
            probe = mx.random.normal((MAX_ROWS, x.shape[-1]), key=mx.random.key(7)).astype(x.dtype)
            alone = [plain(probe[i:i + 1]) for i in range(MAX_ROWS)]
            limit = 1
            for m in range(2, MAX_ROWS + 1):
                together = plain(probe[:m])
                if not all(bool(mx.array_equal(together[i:i + 1], alone[i])) for i in range(m)):
                    break
                limit = m
            self._row_limits[key] = limit
            if limit < MAX_ROWS:
                self.said.append(f"{self.backend}: MLX's matmul of weight {key[0]} keeps rows as alone up to "
                                 f"{limit} a call; a verify's rows go through it {limit} at a time")
        return self._row_limits[key]

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
        if mask is None and _scalar_gate(g, q) and gdn.gdn_supported((1, *q.shape[1:]), (1, *v.shape[1:]), state.dtype):
            # One launch for all positions, a separate fp32 buffer per state.
            return _as_batch(_each_sequence(lambda *a: gdn.gated_delta_steps(*a, backend=self.backend),
                                            q, k, v, g, beta, state))
        return super().recurrence(q, k, v, g, beta, state, mask, capture)


class GpuPrefill(MlxOps):
    """The long runner on CUDA (prefill chunks): MLX's own ops, with a chunk's Gated-DeltaNet
    recurrence as one kernel launch (kernels/gdn.py gated_delta_prefill). MLX's Metal kernel for
    it does not run on CUDA, so mlx-lm falls back to gated_delta_ops, a Python loop of ~10 ops a
    position: an 8k-token prompt took ~20 s (~400 tok/s) to prefill on the H200.

    Only the final state is kept, so capturing forwards (every state wanted) and masked ones (a
    padded batch) keep MLX's path. Exactness: every prefill chunk longer than a few tokens comes here
    (prefill_chunks asks fast=False but for chunks of at most core.stream.SHORT_CHUNK tokens,
    which take the few runner; a chunk is one sequence, unmasked, not captured), so the
    chunks after a prefix-cache mark compute the same whether the prompt was prefilled fresh or
    restored from the snapshot taken there (chunks end at the marks either way): the cache
    restores what a fresh prefill holds. Both lanes (AR and MTP) prefill this way, so greedy
    MTP == AR is unaffected. (The kernel's positions do not even depend on where a chunk ends,
    kernels.check_gdn_prefill; MLX's matmuls and attention may.)"""

    # A chunk's layers go to the device every 4 while the host builds the rest (layers._submit):
    # a prefill chunk keeps the GPU busy ~2.7 ms a layer (512 tokens at the 9B shape), so only
    # the first layers' building is waited for. Values are the same.
    submit_every = 4

    def conv(self, p: GdnParams, conv_input, S):
        # The depthwise conv as its taps summed in fp32 (the fused middle kernel's arithmetic),
        # one fused launch for any chunk length. Why: MLX CUDA's conv1d builds a cuDNN plan for
        # every new input shape, and a turn's chunks have new lengths: 0.14-0.3 s on the first
        # chunk of each length at the 9B shape (docs/bench/2026-12-03/GPU.md, section 12).
        if p.attn.conv1d.weight.shape[-1] != 1 or "bias" in p.attn.conv1d:
            return super().conv(p, conv_input, S)
        taps = [conv_input[..., k:k + S, :] for k in range(p.K)]
        return _tap_sum(p.K)(*taps, *p.taps)

    def recurrence(self, q, k, v, g, beta, state, mask, capture):
        if capture or mask is not None or not _scalar_gate(g, q) \
                or not gdn.prefill_supported((1, *q.shape[1:]), (1, *v.shape[1:]), state.dtype):
            return super().recurrence(q, k, v, g, beta, state, mask, capture)
        y, final = _as_batch(_each_sequence(gdn.gated_delta_prefill, q, k, v, g, beta, state))
        return y, [final]


class CompiledGpuKernels(GpuKernels):
    """GpuKernels with each layer's few-token forward one compiled function (mx.compile).

    Why: on MLX CUDA a 9B decode step was host-bound. Building its graph op by op from Python
    took 7.4 ms of a 10.3 ms forward (docs/bench/2026-12-02/gpu-profile-9b-rowkernel-v1.json);
    a compiled layer is one call that replays its recorded graph, and MLX fuses the elementwise
    ops between the kernels. The same functions serve every width (each traced per shape), and a
    fused kernel computes each row alike, so a verify row is still the decode step's row as long
    as both are compiled: fused and op-by-op elementwise kernels may round differently. So a
    layer's first call, built eagerly for the weight joins (_fuse) a trace cannot make, takes its
    value from the compiled function too (_first_call). The KV cache update and the attention
    stay outside, as in the CPU's compiled runner."""

    compiled_layers = True

    def __init__(self, backend: str, row_kernel: bool = True, fused_gdn: bool = False,
                 fused_attention: bool = False):
        super().__init__(backend, row_kernel, fused_gdn, fused_attention)
        self._compiled: Dict[tuple, Callable] = {}

    def _fn(self, key, make):
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compiled[key] = mx.compile(make())
            return _first_call(make(), fn)
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
                keep = layers.kept_window(conv_input, p.K - 1)
                return (x, keep, conv_input, *states) if capture else (x, keep, states[-1])
            return step

        out = self._fn((id(p), "gdn", capture), make)(h, conv_state, state)
        if capture:
            return out[0], out[1], list(out[3:]), out[2]
        return out[0], out[1], [out[2]], None

    def attention_in(self, p: AttnParams, x, pos):
        if not isinstance(pos, mx.array) or (pos.ndim and type(p.attn.rope) is not nn.RoPE):
            # a RoPE table (a chunk with a picture), or a batch at per-row positions with a RoPE
            # variant that reads them on the host (MlxOps.rope): eagerly
            return super().attention_in(p, x, pos)
        # One position, or a batch's positions (mx.fast.rope takes a vector of offsets): compiled,
        # traced once per shape. Eagerly, a batch's step built every attention layer's input op
        # by op from Python (scripts/bench/batch_graph.py).
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


@lru_cache(maxsize=None)
def _tap_sum(K: int) -> Callable:
    """x_0..x_{K-1} [..., S, C] (the conv window's shifted views), w_0..w_{K-1} [C] -> sum of
    x_k * w_k in fp32, rounded once to x's dtype. Shapeless: one trace serves every chunk length."""
    def tap_sum(*args):
        xs, ws = args[:K], args[K:]
        acc = xs[0].astype(mx.float32) * ws[0].astype(mx.float32)
        for x, w in zip(xs[1:], ws[1:]):
            acc = acc + x.astype(mx.float32) * w.astype(mx.float32)
        return acc.astype(xs[0].dtype)
    return mx.compile(tap_sum, shapeless=True)


MAX_ROWS = cuda_qmm.TILE_ROWS  # the support checks' row count, and Metal's probe of MLX's matmul


def _first_call(eager: Callable, compiled: Callable) -> Callable:
    """A layer function's first call: built eagerly, for what only an eager call can do (join
    the layer's weights, evaluated at once), its result dropped unevaluated (no device work);
    then computed by the compiled function, as every later call is.

    Why not return the eager result: MLX's fused elementwise kernels can round differently from
    its op-by-op ones (the 35B-A3B shape on the H200: layer 0's Gated-DeltaNet output differed
    by up to 0.0078), so a lane whose first decode step ran eagerly left the other lane, whose
    verify ran compiled, at its second token (docs/bench/2026-12-03/GPU.md, section 12)."""
    def first(*args):
        eager(*args)
        return compiled(*args)
    return first


def _each_sequence(kernel, q, k, v, g, beta, state) -> list:
    """`kernel` (a recurrence kernel: it takes one sequence) on each sequence of a batch alone,
    so that a batched sequence computes what it computes alone."""
    return [kernel(*(a[b:b + 1] for a in (q, k, v, g, beta, state))) for b in range(q.shape[0])]


def _as_batch(runs: list):
    """Per-sequence results (tuples of arrays, or of lists of arrays a position) as the batch's:
    each part concatenated along the batch axis, position by position for lists."""
    if len(runs) == 1:
        return runs[0]
    return tuple(mx.concatenate(parts) if isinstance(parts[0], mx.array) else [mx.concatenate(p) for p in zip(*parts)]
                 for parts in zip(*runs))


def _scalar_gate(g: mx.array, q: mx.array) -> bool:
    """The recurrence kernels read one decay per value head and position (g [B, T, Hv]); a
    per-channel gate ([B, T, Hv, Dk], gated_delta_ops' other form) keeps MLX's path."""
    return g.ndim == q.ndim - 1


def _rows_of(x: mx.array) -> int:
    return x.size // x.shape[-1]


def _kernel_fits(m, x) -> bool:
    """Whether the row kernel serves module m for x (of any row count: wider goes 8 at a time)."""
    return cuda_qmm.module_fits(m, min(_rows_of(x), MAX_ROWS), x.shape[-1], x.dtype)


def _kernel_rows(x, w, scales, biases, bits, group_size, residual=None, swiglu=False):
    """The row kernel on x [..., K], 16 rows a launch where there are more (each row as alone);
    `swiglu`: x is gate|up and the kernel's input silu(gate) * up."""
    rows, most = _rows_of(x), cuda_qmm.rows_per_launch()
    if rows <= most:
        return cuda_qmm.quantized_matmul_rows(x, w, scales, biases, bits, group_size, residual, swiglu=swiglu)
    K, N = x.shape[-1], w.shape[0]
    flat = x.reshape(rows, K)
    res = None if residual is None else residual.reshape(rows, N)
    y = mx.concatenate([cuda_qmm.quantized_matmul_rows(flat[i:i + most], w, scales, biases, bits, group_size,
                                                       None if res is None else res[i:i + most], swiglu=swiglu)
                        for i in range(0, rows, most)])
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
