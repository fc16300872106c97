"""The argmax of each row of a wide logit array (the vocabulary: 248,320 columns at the 9B shape) on CUDA.

A greedy draft step ends in an argmax over the vocabulary, and so does every greedy AR step: on
the H200 a draft step with its argmax measured 0.19 ms more than without (0.71 -> 0.90 ms,
docs/bench/2026-12-02/GPU.md section 7), a fifth of the head's step. MLX reduces a row in one
block; here a row is split over `BLOCKS` blocks that each find their chunk's best (value, index),
and one warp a row folds the partials in chunk order.

Exact by definition, not by arithmetic: the result is the lowest index of the row's maximum, as
`mx.argmax` gives it (checked against it at load, ties included), whatever the split. Rows that
hold a NaN are the callers' to reject (core.sampling flags a non-finite row before its token is
used); there the two may differ.
"""
from __future__ import annotations

from functools import lru_cache

import mlx.core as mx

from . import jit_cache
from .naming import versioned

BLOCKS = 64      # blocks a row: 248,320 columns -> 3,880 a block, 16 loads a thread
THREADS = 256
MIN_COLUMNS = 8192   # narrower rows: MLX's one block a row is as good

# The (value, index) order both passes use: a larger value wins, and of equal values the lower
# index, so the fold's result does not depend on how the row was split.
BETTER = r"""
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}
"""

PARTIALS = r"""
  // x [R, V] (row-contiguous) -> pv, pi [R, NB]: block (b, r) takes columns [b * chunk, (b + 1) * chunk).
  const int V = x_shape[1];
  const int r = blockIdx.y, b = blockIdx.x, t = threadIdx.x;
  const int chunk = (V + NB - 1) / NB;
  const int lo = b * chunk;
  const int hi = min(V, lo + chunk);
  const T* row = x + (size_t)r * V;
  float bv = -__int_as_float(0x7f800000);   // -inf
  int bi = 0x7fffffff;
  for (int i = lo + t; i < hi; i += NT) {
    const float v = static_cast<float>(row[i]);
    if (better(v, i, bv, bi)) { bv = v; bi = i; }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_down_sync(0xffffffff, bv, off);
    const int oi = __shfl_down_sync(0xffffffff, bi, off);
    if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
  }
  __shared__ float sv[NT / 32];
  __shared__ int si[NT / 32];
  if ((t & 31) == 0) { sv[t >> 5] = bv; si[t >> 5] = bi; }
  __syncthreads();
  if (t == 0) {
    for (int w = 1; w < NT / 32; ++w) if (better(sv[w], si[w], bv, bi)) { bv = sv[w]; bi = si[w]; }
    pv[r * NB + b] = bv;
    pi[r * NB + b] = bi;
  }
"""

FOLD = r"""
  // pv, pi [R, NB] -> out [R]: one warp a row.
  const int r = blockIdx.x, t = threadIdx.x;
  float bv = -__int_as_float(0x7f800000);
  int bi = 0x7fffffff;
  for (int j = t; j < NB; j += 32) {
    const float v = pv[r * NB + j];
    const int i = pi[r * NB + j];
    if (better(v, i, bv, bi)) { bv = v; bi = i; }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_down_sync(0xffffffff, bv, off);
    const int oi = __shfl_down_sync(0xffffffff, bi, off);
    if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
  }
  // A row of -inf only (every token masked) keeps index 0, as mx.argmax does.
  if (t == 0) out[r] = bi == 0x7fffffff ? 0u : (unsigned int)bi;
"""


@lru_cache(maxsize=None)
def _partials():
    return jit_cache.cuda_kernel(name=versioned("mtp_argmax_partials", PARTIALS, BETTER), input_names=["x"],
                                 output_names=["pv", "pi"], source=PARTIALS, header=BETTER)


@lru_cache(maxsize=None)
def _fold():
    return jit_cache.cuda_kernel(name=versioned("mtp_argmax_fold", FOLD, BETTER), input_names=["pv", "pi"],
                                 output_names=["out"], source=FOLD, header=BETTER)


def supported(x: mx.array) -> bool:
    return x.ndim >= 1 and x.shape[-1] >= MIN_COLUMNS and x.dtype in (mx.bfloat16, mx.float16, mx.float32)


def row_argmax(x: mx.array) -> mx.array:
    """mx.argmax(x, axis=-1) (uint32, the leading axes kept) through the split-row kernels."""
    lead, V = x.shape[:-1], x.shape[-1]
    R = 1
    for n in lead:
        R *= n
    flat = x.reshape(R, V)
    pv, pi = _partials()(inputs=[flat], template=[("T", x.dtype), ("NB", BLOCKS), ("NT", THREADS)],
                         grid=(BLOCKS * THREADS, R, 1), threadgroup=(THREADS, 1, 1),
                         output_shapes=[(R, BLOCKS), (R, BLOCKS)], output_dtypes=[mx.float32, mx.int32])
    (out,) = _fold()(inputs=[pv, pi], template=[("NB", BLOCKS)], grid=(R * 32, 1, 1), threadgroup=(32, 1, 1),
                     output_shapes=[(R,)], output_dtypes=[mx.uint32])
    return out.reshape(lead)


row_argmax.supports = supported   # what core.sampling.use_row_argmax asks of it


def check(seed: int = 0) -> str | None:
    """row_argmax against mx.argmax: random rows of each dtype at the 9B's vocabulary and odd
    widths, a row whose maximum appears several times (the lowest index must win), a row of
    -inf but one, and a row masked to -inf entirely."""
    ks = mx.random.split(mx.random.key(seed), 4)
    rows = []
    for dt in (mx.bfloat16, mx.float16, mx.float32):
        for V in (248_320, 151_936, MIN_COLUMNS + 3):
            rows.append((mx.random.normal((3, V), key=ks[0]) * 8).astype(dt))
    tie = mx.zeros((2, 248_320), dtype=mx.bfloat16)
    tie = mx.where(mx.arange(248_320) % 9_973 == 5, mx.array(3.0, mx.bfloat16), tie)   # 25 equal maxima a row
    rows.append(tie)
    one = mx.full((1, 248_320), -mx.inf, dtype=mx.bfloat16)
    rows.append(mx.where(mx.arange(248_320) == 200_001, mx.array(-5.0, mx.bfloat16), one))
    rows.append(mx.full((1, 248_320), -mx.inf, dtype=mx.bfloat16))
    for x in rows:
        got, want = row_argmax(x), mx.argmax(x, axis=-1)
        if got.dtype != want.dtype or not bool(mx.array_equal(got, want)):
            return f"the row argmax kernel differs from mx.argmax ({x.dtype}, {x.shape})"
    return None
