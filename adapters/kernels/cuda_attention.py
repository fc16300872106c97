"""Attention of a few query rows over the KV cache, each row over exactly its own keys, with the
output gate applied: two CUDA launches whatever the row count.

Why: a verify's rows must be the decode steps' rows bit for bit, and MLX's attention over several
queries reduces in another order than over one, so the GPU runner has computed a verify's
attention one query at a time (mlx_ops.row_invariant_sdpa): per row a slice of the cache and an
SDPA call, which for head_dim 256 MLX runs as matmul + softmax + matmul set up per call; then the
gate's transpose, reshape, sigmoid and product. Here:

- `partials`: one block per (key chunk, query row, KV head), a chunk's rows side by side. A chunk is CHUNK keys at a fixed
  position of the cache (keys [c*CHUNK, (c+1)*CHUNK)), cut to the row's own keys (row i of L sees
  the first S-L+i+1); the block scores them against its KV head's G query heads (the keys and
  values read once for the group), and keeps the chunk's max, sum of exponentials and weighted
  values in fp32;
- `combine`: one block per (query head, row): the row's chunks summed in order, normalised,
  rounded, times sigmoid(gate), written as o_proj reads it ([L, heads * head_dim]).

A row's chunks, their boundaries and every sum's order depend on the row's key count only, never
on how many rows travel together: row invariance by construction. The keys and values are read
in place through their strides (the cache hands out a view of its buffer; a copy would move the
whole cache every step).
"""
from __future__ import annotations

from functools import lru_cache

import mlx.core as mx

from .naming import versioned

CHUNK = 128  # keys per partial: fixed positions in the cache, so a row's split never depends on L
MAX_ROWS = 8
MAX_SEQUENCES = 8  # a launch's sequences (each one its own key and value inputs)
HEAD_DIMS = (128, 256)

PARTIALS = r"""
  // q [B, nh, L, HD] (strided); sequence b's keys and values k_b, v_b [1, nkv, S_b, HD] (strided,
  // last stride 1; the block's sequence picks its own below); consts[0] = scale.
  // Out: pm, pl [B, L, nh, C]; po [B, L, nh, C, HD] (fp32), C the batch's widest chunk count.
PARTIALS_SEQUENCE
  constexpr int VPL = HD / 32;   // a lane's share of one key's dims
  constexpr int DPT = HD / 128;  // a thread's share of the output dims
  const int L = q_shape[2];
  const int nh = q_shape[1];
  const int C = gridDim.x / L;  // chunks past a sequence's own keys are written empty (see combine)
  // A chunk's rows are neighbours in the grid (blockIdx.x = chunk * L + row): they run together
  // and read the chunk's keys and values once from memory, the rest from L2.
  const int c = blockIdx.x / L, i = blockIdx.x % L, kvh = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = S - L + i + 1;            // this row's keys
  const int k0 = c * CHUNK;
  const int cnt = min(CHUNK, n - k0);     // this chunk's keys for this row (<= 0: none)
  const float scale = consts[0];

  __shared__ float sq[G][HD];
  __shared__ float sp[G][CHUNK];

  for (int idx = tid; idx < G * HD; idx += 128) {
    const int g = idx / HD, d = idx % HD;
    sq[g][d] = static_cast<float>(q[b * q_strides[0] + (kvh * G + g) * q_strides[1] + i * q_strides[2] + d * q_strides[3]]);
  }
  __syncthreads();
  if (cnt > 0) {
#pragma unroll 4
    for (int j = warp; j < cnt; j += 4) {  // a warp per key, its lanes over the dims
      const T* kr = kp + kvh * k1 + (k0 + j) * k2 + lane * VPL;
      float dot[G];
#pragma unroll
      for (int g = 0; g < G; ++g) dot[g] = 0.f;
#pragma unroll
      for (int e = 0; e < VPL; ++e) {
        const float kv = static_cast<float>(kr[e]);
#pragma unroll
        for (int g = 0; g < G; ++g) dot[g] = fmaf(sq[g][lane * VPL + e], kv, dot[g]);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = dot[g];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) sp[g][j] = s * scale;
      }
    }
  }
  __syncthreads();
  for (int g = warp; g < G; g += 4) {
    // A warp per query head: the chunk's max, then its sum of exponentials (each lane's keys in
    // order, then a fixed butterfly): an order set by the chunk's key count alone.
    float m = -__int_as_float(0x7f800000);  // -inf
    for (int j = lane; j < cnt; j += 32) m = fmaxf(m, sp[g][j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int j = lane; j < cnt; j += 32) {
      const float e = expf(sp[g][j] - m);
      sp[g][j] = e;
      l += e;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) {
      const int at = ((b * L + i) * nh + kvh * G + g) * C + c;
      pm[at] = m;
      pl[at] = l;
    }
  }
  __syncthreads();
  // A thread's DPT adjacent output dims, every key of the chunk in order; unrolled so that the
  // loads of several keys are in flight at once (the sums' order is unchanged).
  const int d0 = tid * DPT;
  float acc[DPT][G];
#pragma unroll
  for (int e = 0; e < DPT; ++e)
#pragma unroll
    for (int g = 0; g < G; ++g) acc[e][g] = 0.f;
#pragma unroll 8
  for (int j = 0; j < cnt; ++j) {
    const T* vr = vp + kvh * v1 + (k0 + j) * v2 + d0;
#pragma unroll
    for (int e = 0; e < DPT; ++e) {
      const float vv = static_cast<float>(vr[e]);
#pragma unroll
      for (int g = 0; g < G; ++g) acc[e][g] = fmaf(sp[g][j], vv, acc[e][g]);
    }
  }
#pragma unroll
  for (int e = 0; e < DPT; ++e)
#pragma unroll
    for (int g = 0; g < G; ++g) po[((size_t)((b * L + i) * nh + kvh * G + g) * C + c) * HD + d0 + e] = acc[e][g];
"""

COMBINE = r"""
  // pm, pl [B, L, nh, C], po [B, L, nh, C, HD]; gate [B, L, nh * HD] (contiguous) -> y [B, L, nh * HD]
  const int L = pm_shape[1];
  const int nh = pm_shape[2];
  const int C = pm_shape[3];
  const int h = blockIdx.x, i = blockIdx.y, b = blockIdx.z, d = threadIdx.x;
  const int row = (b * L + i) * nh + h;
  const int base = row * C;
  // Chunks past this row's keys hold max -inf, sum 0 and zeros: they add exact zeros, so a row's
  // result is the same whatever C (the last row's, or the batch's widest) is. Unrolled: several chunks'
  // loads in flight, the sums in chunk order as before.
  float M = -__int_as_float(0x7f800000);  // -inf
#pragma unroll 8
  for (int c = 0; c < C; ++c) M = fmaxf(M, pm[base + c]);
  float l = 0.f, o = 0.f;
#pragma unroll 8
  for (int c = 0; c < C; ++c) {
    const float w = expf(pm[base + c] - M);
    l += pl[base + c] * w;
    o += po[(size_t)(base + c) * HD + d] * w;
  }
  const float a = static_cast<float>(static_cast<T>(o / l));
  const float gv = static_cast<float>(gate[row * HD + d]);
  const float sg = static_cast<float>(static_cast<T>(1.f / (1.f + expf(-gv))));
  y[row * HD + d] = static_cast<T>(a * sg);
"""


def partials_source(B: int) -> str:
    """PARTIALS for a launch of B sequences: block row b (blockIdx.z) reads sequence b's keys and
    values, each its own cache's view (the arrays differ in length, so each is an input)."""
    pick = ["  const int b = blockIdx.z;",
            "  const T* kp = k_0;", "  const T* vp = v_0;", "  int S = k_0_shape[2];",
            "  long long k1 = k_0_strides[1], k2 = k_0_strides[2], v1 = v_0_strides[1], v2 = v_0_strides[2];"]
    for i in range(1, B):
        pick.append(f"  if (b == {i}) {{ kp = k_{i}; vp = v_{i}; S = k_{i}_shape[2]; k1 = k_{i}_strides[1]; "
                    f"k2 = k_{i}_strides[2]; v1 = v_{i}_strides[1]; v2 = v_{i}_strides[2]; }}")
    return PARTIALS.replace("PARTIALS_SEQUENCE", "\n".join(pick))


@lru_cache(maxsize=None)
def _partials(B: int = 1):
    source = partials_source(B)
    return mx.fast.cuda_kernel(name=versioned(f"mtp_attn_partials_{B}", source),
                               input_names=["q", *(f"k_{i}" for i in range(B)), *(f"v_{i}" for i in range(B)), "consts"],
                               output_names=["pm", "pl", "po"], source=source, ensure_row_contiguous=False)


@lru_cache(maxsize=None)
def _scale(scale: float) -> mx.array:
    return mx.array([scale], dtype=mx.float32)


@lru_cache(maxsize=None)
def _combine():
    return mx.fast.cuda_kernel(name=versioned("mtp_attn_combine", COMBINE), input_names=["pm", "pl", "po", "gate"],
                               output_names=["y"], source=COMBINE)


def supported(q_shape, k_shape, dtype) -> bool:
    """q [1, nh, L, hd], k [1, nkv, S, hd]: what gated_attention serves (one sequence; a batch's
    sequences each)."""
    if len(q_shape) != 4 or len(k_shape) != 4 or q_shape[0] != 1 or k_shape[0] != 1:
        return False
    _, nh, L, hd = q_shape
    nkv, S = k_shape[1], k_shape[2]
    return (hd in HEAD_DIMS and k_shape[3] == hd and 1 <= L <= MAX_ROWS and L <= S and nkv >= 1
            and nh % nkv == 0 and nh // nkv <= 8 and dtype in (mx.bfloat16, mx.float16))


def gated_attention(q: mx.array, k: mx.array, v: mx.array, gate: mx.array, scale: float) -> mx.array:
    """softmax(q k^T * scale) v for each row over its own keys (row i of L: the first S-L+i+1),
    times sigmoid(gate): q [1, nh, L, hd], k, v [1, nkv, S, hd] (views of the cache are read in
    place), gate [1, L, nh * hd] -> [1, L, nh * hd] in q's dtype."""
    return gated_attention_batch(q, [k], [v], gate, scale)


def gated_attention_batch(q: mx.array, ks: list, vs: list, gate: mx.array, scale: float) -> mx.array:
    """gated_attention for B sequences in two launches: q [B, nh, L, hd], sequence b's keys and
    values ks[b], vs[b] [1, nkv, S_b, hd] (its own cache's views), gate [B, L, nh * hd] ->
    [B, L, nh * hd]. Each sequence computes what it computes alone: its chunks are its own, and
    the chunks a longer neighbour adds are empty ones, which add exact zeros."""
    B, nh, L, hd = q.shape
    nkv = ks[0].shape[1]
    C = max(-(-k.shape[2] // CHUNK) for k in ks)
    pm, pl, po = _partials(B)(
        inputs=[q, *ks, *vs, _scale(scale)],
        template=[("T", q.dtype), ("HD", hd), ("G", nh // nkv), ("CHUNK", CHUNK)],
        grid=(C * L * 128, nkv, B), threadgroup=(128, 1, 1),
        output_shapes=[(B, L, nh, C), (B, L, nh, C), (B, L, nh, C, hd)],
        output_dtypes=[mx.float32] * 3,
    )
    (y,) = _combine()(
        inputs=[pm, pl, po, mx.contiguous(gate)],
        template=[("T", q.dtype), ("HD", hd)],
        grid=(nh * hd, L, B), threadgroup=(hd, 1, 1),
        output_shapes=[(B, L, nh * hd)], output_dtypes=[q.dtype],
    )
    return y


def reference(q: mx.array, k: mx.array, v: mx.array, gate: mx.array, scale: float) -> mx.array:
    """gated_attention as MLX ops (each row one SDPA over its own keys, then the gate), in the
    dtype's rounding: what the GPU check holds the kernel to, and the CPU tests' stand-in."""
    _, nh, L, hd = q.shape
    S = k.shape[2]
    rows = [mx.fast.scaled_dot_product_attention(q[:, :, i:i + 1], k[:, :, :S - L + i + 1], v[:, :, :S - L + i + 1],
                                                 scale=scale) for i in range(L)]
    o = mx.concatenate(rows, axis=2).transpose(0, 2, 1, 3).reshape(1, L, nh * hd)
    return o * mx.sigmoid(gate.reshape(1, L, nh * hd))


def reference_batch(q: mx.array, ks: list, vs: list, gate: mx.array, scale: float) -> mx.array:
    """gated_attention_batch as each sequence's reference alone (the CPU tests' stand-in)."""
    return mx.concatenate([reference(q[b:b + 1], k, v, gate[b:b + 1], scale) for b, (k, v) in enumerate(zip(ks, vs))])
