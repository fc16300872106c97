"""The sampler's top-k support of vocabulary-wide logit rows in two CUDA launches (issue 32).

`core.sampling.SamplerConfig.support` with top_k on keeps the k largest logits of a row, then
softmax, the top-p cut and min-p over those k. Through MLX's ops that is ~10 small launches:
0.29 ms at one row, 0.45 ms at four on the H200 at the 9B's 248,320 columns, and a sampled draw
0.45 / 0.56 ms (docs/bench/2026-12-04/GPU.md, section 18) against a 5.5-6.7 ms AR step. Here:

1. partials: a row's columns split over BLOCKS blocks; each block loads its chunk (scaled by 1/T)
   into shared memory and picks its k best in k rounds, each round the best element after the
   previous pick in one fixed order (larger value first, of equal values the lower index);
2. fold: one block a row picks the k best of the BLOCKS * k candidates the same way, then one
   thread computes the softmax over them, the top-p cut and min-p, and normalises. Its drawing
   variant (row_topk_draw, SamplerConfig.draw's path) then also draws the token, by inverse CDF
   over the k in that order from one uniform a row, in place of categorical's ~8 small launches
   (0.33 ms of a 0.52 ms draw at one row on the H200).

The order makes the kept set a function of the row alone (ties at the k-th value go to the lower
index, whatever the split), and the indices come out sorted by it. MLX's `argpartition` leaves
both unspecified, so the two paths' draws differ for a given key while their distributions agree
to rounding; the load check compares the two supports column by column, and the drawn tokens
with reference_draw's. Both lanes draw through the same path, so greedy and sampled exactness
between AR and MTP are unchanged.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import mlx.core as mx
import numpy as np

from . import jit_cache
from .naming import versioned

BLOCKS = 64
THREADS = 256
MAX_K = 64            # top_k above this goes through MLX's ops
MIN_COLUMNS = 16384   # narrower rows: MLX's ops

ORDER = r"""
// (value, index) pairs in the sampler's order: a larger value first, of equal values the lower index.
__device__ __forceinline__ bool before_(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}
// The best of a thread's pairs after (pv, pi) in that order (pi < 0: no previous pick).
__device__ __forceinline__ void offer_(float v, int i, float pv, int pi, float& bv, int& bi) {
  const bool after = pi < 0 || before_(pv, pi, v, i);
  if (after && (bi < 0 || before_(v, i, bv, bi))) { bv = v; bi = i; }
}
__device__ __forceinline__ void warp_best_(float& bv, int& bi) {
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_down_sync(0xffffffff, bv, off);
    const int oi = __shfl_down_sync(0xffffffff, bi, off);
    if (oi >= 0 && (bi < 0 || before_(ov, oi, bv, bi))) { bv = ov; bi = oi; }
  }
}
// The block's best of its threads' pairs, in thread 0 (wv, wi: a shared slot a warp).
template <int NTT>
__device__ __forceinline__ void block_best_(float& bv, int& bi, float* wv, int* wi, int t) {
  warp_best_(bv, bi);
  if ((t & 31) == 0) { wv[t >> 5] = bv; wi[t >> 5] = bi; }
  __syncthreads();
  if (t == 0)
    for (int w = 1; w < NTT / 32; ++w)
      if (wi[w] >= 0 && (bi < 0 || before_(wv[w], wi[w], bv, bi))) { bv = wv[w]; bi = wi[w]; }
}
"""

PARTIALS = r"""
  // x [R, V] (row-contiguous), temp [1], kin [1] (k <= KMAX) -> cv, ci [R, NB * k]: block (b, r)
  // keeps the k best of columns [b * CH, min(V, (b + 1) * CH)) of row r, in order.
  const int V = x_shape[1];
  const int K = kin[0];
  const int r = blockIdx.y, b = blockIdx.x, t = threadIdx.x;
  const int lo = b * CH;
  const int n = max(0, min(V, lo + CH) - lo);
  const float T = temp[0];
  __shared__ float sv[CH];
  __shared__ float wv[NT / 32];
  __shared__ int wi[NT / 32];
  __shared__ float pick_v;
  __shared__ int pick_i;
  const T_IN* row = x + (size_t)r * V + lo;
  for (int j = t; j < n; j += NT) sv[j] = static_cast<float>(row[j]) / T;
  if (t == 0) { pick_v = 0.f; pick_i = -1; }
  __syncthreads();
  for (int k = 0; k < K; ++k) {
    const float pv = pick_v;
    const int pi = pick_i;
    float bv = 0.f;
    int bi = -1;
    for (int j = t; j < n; j += NT) offer_(sv[j], lo + j, pv, pi, bv, bi);
    block_best_<NT>(bv, bi, wv, wi, t);
    if (t == 0) {
      // A chunk with fewer than k columns pads with -inf at an index past every real one.
      if (bi < 0) { bv = -__int_as_float(0x7f800000); bi = 0x7fffffff - (NB * K) + b * K + k; }
      const size_t o = (size_t)r * NB * K + b * K + k;
      cv[o] = bv;
      ci[o] = bi;
      pick_v = bv;
      pick_i = bi;
    }
    __syncthreads();
  }
"""

_FOLD = r"""
  // cv, ci [R, NB * k], params [2] (top_p, min_p), kin [1] -> idx [R, k] (uint32), p [R, k] (fp32).
  const int r = blockIdx.x, t = threadIdx.x;
  const int K = kin[0];
  const int C = NB * K;
  __shared__ float sv[NB * KMAX];
  __shared__ int si[NB * KMAX];
  __shared__ float tv[KMAX];
  __shared__ int ti[KMAX];
  __shared__ float wv[NT / 32];
  __shared__ int wi[NT / 32];
  for (int j = t; j < C; j += NT) { sv[j] = cv[(size_t)r * C + j]; si[j] = ci[(size_t)r * C + j]; }
  __syncthreads();
  float pv = 0.f;
  int pi = -1;
  for (int k = 0; k < K; ++k) {
    float bv = 0.f;
    int bi = -1;
    for (int j = t; j < C; j += NT) offer_(sv[j], si[j], pv, pi, bv, bi);
    block_best_<NT>(bv, bi, wv, wi, t);
    if (t == 0) {
      tv[k] = bv;
      ti[k] = bi;
    }
    __syncthreads();
    pv = tv[k];
    pi = ti[k];
  }
  if (t == 0) {
    // softmax over the K kept (tv[0] is their maximum), then SamplerConfig.support's cuts in its order
    const float top_p = params[0], min_p = params[1];
    float e[KMAX];
    float s = 0.f;
    for (int k = 0; k < K; ++k) { e[k] = expf(tv[k] - tv[0]); s += e[k]; }
    for (int k = 0; k < K; ++k) e[k] = e[k] / s;
    if (top_p < 1.f) {
      // keep the smallest head whose mass reaches top_p: the values whose mass before them is < top_p
      float seen = 0.f, cutoff = __int_as_float(0x7f800000);
      for (int k = 0; k < K; ++k) { if (seen < top_p) cutoff = fminf(cutoff, e[k]); seen += e[k]; }
      for (int k = 0; k < K; ++k) e[k] = e[k] >= cutoff ? e[k] : 0.f;
    }
    if (min_p > 0.f) {
      const float floor_p = min_p * e[0];
      for (int k = 0; k < K; ++k) e[k] = e[k] >= floor_p ? e[k] : 0.f;
    }
    float total = 0.f;
    for (int k = 0; k < K; ++k) total += e[k];
"""

FOLD = _FOLD + r"""    for (int k = 0; k < K; ++k) {
      p[(size_t)r * K + k] = e[k] / total;
      idx[(size_t)r * K + k] = (unsigned int)ti[k];
    }
  }
"""

# The draw by inverse CDF from one uniform a row, over the kept columns in the order above, the
# sums sequential in fp32 (reference_draw repeats them in NumPy). The running sum ends at `mass`
# itself, so only rounding of u * mass can leave no column: then the last with p > 0. A column of
# p 0 never raises the sum, so it is never the first to pass the target.
FOLD_DRAW = _FOLD + r"""    // the drawing variant: also u [R] (fp32 in [0, 1)) -> tok [R] (uint32)
    float mass = 0.f;
    for (int k = 0; k < K; ++k) {
      e[k] = e[k] / total;
      mass += e[k];
      p[(size_t)r * K + k] = e[k];
      idx[(size_t)r * K + k] = (unsigned int)ti[k];
    }
    const float target = u[r] * mass;
    float run = 0.f;
    int j = -1, last = 0;
    for (int k = 0; k < K; ++k) {
      run += e[k];
      if (e[k] > 0.f) last = k;
      if (j < 0 && run > target) j = k;
    }
    tok[r] = (unsigned int)ti[j < 0 ? last : j];
  }
"""


@lru_cache(maxsize=None)
def _partials():
    return jit_cache.cuda_kernel(name=versioned("mtp_topk_partials", PARTIALS, ORDER), input_names=["x", "temp", "kin"],
                                 output_names=["cv", "ci"], source=PARTIALS, header=ORDER)


@lru_cache(maxsize=None)
def _fold():
    return jit_cache.cuda_kernel(name=versioned("mtp_topk_fold", FOLD, ORDER), input_names=["cv", "ci", "params", "kin"],
                                 output_names=["idx", "p"], source=FOLD, header=ORDER)


@lru_cache(maxsize=None)
def _fold_draw():
    return jit_cache.cuda_kernel(name=versioned("mtp_topk_fold_draw", FOLD_DRAW, ORDER),
                                 input_names=["cv", "ci", "params", "kin", "u"], output_names=["idx", "p", "tok"],
                                 source=FOLD_DRAW, header=ORDER)


@lru_cache(maxsize=256)   # a request's sampler settings: a few arrays each, built once
def _consts(temperature: float, top_k: int, top_p: float, min_p: float):
    return (mx.array([temperature], dtype=mx.float32), mx.array([top_k], dtype=mx.int32),
            mx.array([top_p, min_p], dtype=mx.float32))


def supported(x: mx.array, top_k: int) -> bool:
    return (x.ndim >= 1 and x.shape[-1] >= MIN_COLUMNS and 0 < top_k <= MAX_K
            and x.dtype in (mx.bfloat16, mx.float16, mx.float32))


def _candidates(x: mx.array, temperature: float, top_k: int, top_p: float, min_p: float):
    """The partials launch: (rows R, leading shape, cv, ci, the fold's params and kin)."""
    lead, V = x.shape[:-1], x.shape[-1]
    R = 1
    for n in lead:
        R *= n
    ch = -(-V // BLOCKS)
    temp, kin, params = _consts(float(temperature), int(top_k), float(top_p), float(min_p))
    cv, ci = _partials()(inputs=[x.reshape(R, V), temp, kin],
                         template=[("T_IN", x.dtype), ("NB", BLOCKS), ("NT", THREADS), ("CH", ch)],
                         grid=(BLOCKS * THREADS, R, 1), threadgroup=(THREADS, 1, 1),
                         output_shapes=[(R, BLOCKS * top_k), (R, BLOCKS * top_k)],
                         output_dtypes=[mx.float32, mx.int32])
    return R, lead, cv, ci, params, kin


def row_topk_support(x: mx.array, temperature: float, top_k: int, top_p: float, min_p: float):
    """SamplerConfig.support(x) with top_k on, for rows `supported` takes: (indices [..., k] uint32
    in the sampler's order, probabilities [..., k] fp32). k is read at run time (one compiled pair
    for every k up to MAX_K, so a new top_k from a request compiles nothing)."""
    R, lead, cv, ci, params, kin = _candidates(x, temperature, top_k, top_p, min_p)
    idx, p = _fold()(inputs=[cv, ci, params, kin], template=[("NB", BLOCKS), ("NT", THREADS), ("KMAX", MAX_K)],
                     grid=(R * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
                     output_shapes=[(R, top_k), (R, top_k)], output_dtypes=[mx.uint32, mx.float32])
    return idx.reshape(*lead, top_k), p.reshape(*lead, top_k)


def row_topk_draw(x: mx.array, u: mx.array, temperature: float, top_k: int, top_p: float, min_p: float):
    """row_topk_support(x) and a token drawn from it in the same launches: u [...] (fp32 in [0, 1),
    one a row) -> (tokens [...] uint32, indices [..., k] uint32, probabilities [..., k] fp32). The
    token is the inverse CDF of the support at u in its order (reference_draw): the first column
    whose running sum exceeds u times the row's sum. It saves categorical's ~8 small launches."""
    R, lead, cv, ci, params, kin = _candidates(x, temperature, top_k, top_p, min_p)
    idx, p, tok = _fold_draw()(inputs=[cv, ci, params, kin, u.astype(mx.float32).reshape(R)],
                               template=[("NB", BLOCKS), ("NT", THREADS), ("KMAX", MAX_K)],
                               grid=(R * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
                               output_shapes=[(R, top_k), (R, top_k), (R,)],
                               output_dtypes=[mx.uint32, mx.float32, mx.uint32])
    return tok.reshape(lead), idx.reshape(*lead, top_k), p.reshape(*lead, top_k)


def row_topk_drawing(x: mx.array, temperature: float, top_k: int, top_p: float, min_p: float):
    """row_topk_support as a hook that also draws (`.draw`: SamplerConfig.draw's fused path): the
    default on CUDA since it was paired on the H200 (docs/bench/2026-12-04/GPU.md section 20; the
    "topk-support" trial keeps row_topk_support, categorical drawing after it)."""
    return row_topk_support(x, temperature, top_k, top_p, min_p)


for _hook in (row_topk_support, row_topk_drawing):
    _hook.supports = supported   # what core.sampling.use_row_topk asks of it
    _hook.max_k = MAX_K
row_topk_drawing.draw = row_topk_draw


def reference(x: mx.array, temperature: float, top_k: int, top_p: float, min_p: float):
    """The same support through MLX's ops, its k columns chosen and ordered as the kernel's (NumPy's
    stable sort: larger value first, of equal values the lower index): what the check compares with."""
    xs = x.astype(mx.float32) / temperature
    flat = np.array(xs.reshape(-1, xs.shape[-1]))
    cols = np.arange(flat.shape[-1])
    order = np.stack([np.lexsort((cols, -row))[:top_k] for row in flat]).reshape(*xs.shape[:-1], top_k)
    order = mx.array(order.astype(np.uint32))
    p = mx.softmax(mx.take_along_axis(xs, order.astype(mx.int32), axis=-1), axis=-1)
    if top_p < 1.0:
        before = mx.cumsum(p, axis=-1) - p
        cutoff = mx.min(mx.where(before < top_p, p, mx.inf), axis=-1, keepdims=True)
        p = mx.where(p >= cutoff, p, 0.0)
    if min_p > 0:
        p = mx.where(p >= min_p * p.max(axis=-1, keepdims=True), p, 0.0)
    return order, p / p.sum(axis=-1, keepdims=True)


def inverse_cdf(idx, p, u):
    """The kernel's draw from a support in NumPy: idx, p [..., k], u [...] -> tokens [...] (uint32).
    Sums sequential in fp32, in the columns' order, as FOLD_DRAW adds them."""
    idx, p = np.asarray(idx), np.asarray(p, dtype=np.float32)
    u = np.asarray(u, dtype=np.float32)
    flat_i, flat_p = idx.reshape(-1, idx.shape[-1]), p.reshape(-1, p.shape[-1])
    flat_u = u.reshape(-1)
    out = np.empty(flat_p.shape[0], dtype=np.uint32)
    for r, (row, pr) in enumerate(zip(flat_i, flat_p)):
        mass = np.float32(0)
        for v in pr:
            mass = np.float32(mass + v)
        target = np.float32(flat_u[r] * mass)
        run, pick, last = np.float32(0), -1, 0
        for k, v in enumerate(pr):
            run = np.float32(run + v)
            if v > 0:
                last = k
            if pick < 0 and run > target:
                pick = k
        out[r] = row[last if pick < 0 else pick]
    return out.reshape(u.shape)


def reference_draw(x: mx.array, u, temperature: float, top_k: int, top_p: float, min_p: float):
    """row_topk_draw's token from reference()'s support: tokens [...] uint32 (NumPy)."""
    idx, p = reference(x, temperature, top_k, top_p, min_p)
    return inverse_cdf(np.array(idx), np.array(p), np.asarray(u, dtype=np.float32).reshape(x.shape[:-1]))


def _near_a_step(p, u, tol: float = 1e-5) -> bool:
    """Whether each row's u lies within tol of a step of its CDF between columns of p > 0 (p [R, k],
    u [R]): there supports that agree to tol may draw different columns."""
    for row, x in zip(np.asarray(p, np.float64), np.asarray(u, np.float64)):
        last = int(np.flatnonzero(row > 0)[-1]) if (row > 0).any() else 0
        steps = np.cumsum(row)[:last] / row.sum()
        if not (np.abs(steps - x) < tol).any():
            return False
    return True


def check(seed: int = 0, draw: bool = True) -> Optional[str]:
    """row_topk_support and row_topk_draw against the MLX reference: random rows at the 9B's
    vocabulary for the app's default sampler and other settings, the kept indices equal (ties
    included: a row whose k-th value repeats) and the probabilities within 1e-5; the drawn tokens,
    at u = 0, just below 1 and at random u, those of inverse_cdf on the kernel's own support
    (exactly) and reference_draw's (unless u is within rounding of a step of the CDF); draw=False
    checks the support alone (the default hook's)."""
    ks = mx.random.split(mx.random.key(seed), 3)
    cases = [((mx.random.normal((3, 248_320), key=ks[0]) * 3).astype(mx.bfloat16), 0.6, 20, 0.95, 0.0),
             ((mx.random.normal((1, 151_936), key=ks[1]) * 5), 1.0, 40, 1.0, 0.05),
             ((mx.random.normal((4, 248_320), key=ks[2]) * 2).astype(mx.float16), 0.7, 8, 0.8, 0.0)]
    tie = mx.where(mx.arange(248_320) % 7_919 == 3, mx.array(4.0), mx.zeros((248_320,))).astype(mx.bfloat16)[None]
    cases.append((tie, 0.6, 20, 0.95, 0.0))   # 32 equal maxima: the 20 lowest indices must be kept
    rng = np.random.default_rng(seed)
    below_one = np.nextafter(np.float32(1), np.float32(0))
    for x, temp, k, top_p, min_p in cases:
        R = x.shape[0]
        want_i, want_p = reference(x, temp, k, top_p, min_p)
        us = [np.zeros(R, np.float32), np.full(R, below_one, np.float32)]
        us += [rng.random(R, dtype=np.float32) for _ in range(3)]
        got = [(None, *row_topk_support(x, temp, k, top_p, min_p))]
        got += [row_topk_draw(x, mx.array(u), temp, k, top_p, min_p) for u in us] if draw else []
        for n, (tok, got_i, got_p) in enumerate(got):
            if not bool(mx.array_equal(got_i, want_i)):
                return (f"the top-k support kernel keeps other columns than the reference ({x.dtype}, {x.shape}, "
                        f"k={k}{', drawing' if n else ''})")
            err = float(mx.abs(got_p - want_p).max())
            if not err <= 1e-5:
                return (f"the top-k support kernel's probabilities differ from the reference by {err:.1e} "
                        f"(k={k}{', drawing' if n else ''})")
            if tok is None:
                continue
            u, tok = us[n - 1], np.array(tok)
            if not np.array_equal(tok, inverse_cdf(np.array(got_i), np.array(got_p), u)):
                return f"the top-k draw kernel's tokens are not the inverse CDF of its support (k={k}, u={u.tolist()})"
            want_t = inverse_cdf(np.array(want_i), np.array(want_p), u)   # reference_draw's, its support reused
            off = tok != want_t
            if off.any() and not _near_a_step(np.array(want_p)[off], u[off]):
                return f"the top-k draw kernel draws other tokens than the reference (k={k}, u={u.tolist()})"
    return None
