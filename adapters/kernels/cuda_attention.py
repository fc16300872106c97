"""Attention of a few query rows over the KV cache, each row over exactly its own keys, with the
output gate applied: two CUDA launches whatever the row count.

Why: a verify's rows must be the decode steps' rows bit for bit, and MLX's attention over several
queries reduces in another order than over one, so the GPU runner has computed a verify's
attention one query at a time (mlx_ops.row_invariant_sdpa): per row a slice of the cache and an
SDPA call, which for head_dim 256 MLX runs as matmul + softmax + matmul set up per call; then the
gate's transpose, reshape, sigmoid and product. Here:

- `partials`: one block per (key chunk, KV head, sequence) for all query rows (as many as fit its
  shared memory). A chunk is CHUNK keys at a fixed position of the cache (keys [c*CHUNK,
  (c+1)*CHUNK)), cut to each row's own keys (row i of L sees the first S-L+i+1); the block scores
  them against its rows' G query heads each (the keys and values read once for all of them), and
  keeps each vector's chunk max, sum of exponentials and weighted values in fp32;
- `combine`: one block per (query head, row): the row's chunks summed in order, normalised,
  rounded, times sigmoid(gate), written as o_proj reads it ([L, heads * head_dim]).

A row's chunks, their boundaries and every sum's order depend on the row's key count only, never
on how many rows travel together: row invariance by construction. The keys and values are read
in place through their strides (the cache hands out a view of its buffer; a copy would move the
whole cache every step).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import mlx.core as mx

from . import jit_cache
from .naming import versioned

CHUNK = 128  # keys per partial: fixed positions in the cache, so a row's split never depends on L
MAX_ROWS = 8
MAX_SEQUENCES = 8  # a launch's sequences (each one its own key and value inputs)
HEAD_DIMS = (128, 256)

PARTIALS = r"""
  // q [B, nh, L, HD] (strided); sequence b's keys and values k_b, v_b [1, nkv, S_b, HD] (strided,
  // last stride 1; the block's sequence picks its own below); consts[0] = scale.
  // Out: pm, pl [B, L, nh, C]; po [B, L, nh, C, HD] (fp32), C the batch's widest chunk count.
  // A block: one chunk of one KV head of one sequence, for RB query rows (R = RB * G query
  // vectors); NT threads. Every vector's arithmetic is the same whatever RB and NT are: its dot
  // products by one warp's lanes and a fixed butterfly, its softmax over its own keys by one warp,
  // its weighted values summed key by key in order. So a row computes what it computes alone.
PARTIALS_SEQUENCE
  constexpr int VPL = HD / 32;   // a lane's share of one key's dims
  constexpr int DPT = HD / NT;   // a thread's share of the output dims
  constexpr int NW = NT / 32;
  constexpr int R = RB * G;
  const int L = q_shape[2];
  const int nh = q_shape[1];
  const int NB = (L + RB - 1) / RB;
  const int C = gridDim.x / NB;  // chunks past a sequence's own keys are written empty (see combine)
  // A chunk's row blocks are neighbours in the grid (blockIdx.x = chunk * NB + row block).
  const int c = blockIdx.x / NB, r0 = (blockIdx.x % NB) * RB, kvh = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k0 = c * CHUNK;
  // Row r0 + r's keys in this chunk (row i of L sees the first S-L+i+1; <= 0: none).
  auto keys_of = [&](int r) { return r0 + r < L ? min(CHUNK, (S - L + r0 + r + 1) - k0) : 0; };
  int cnt[RB];
  int top = 0;
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    cnt[r] = keys_of(r);
    top = max(top, cnt[r]);
  }
  const float scale = consts[0];

  __shared__ float sq[R][HD];
  __shared__ float sp[R][CHUNK];

  // Lane l reads dims l*VPL .. l*VPL+VPL-1 of a query vector. Stored plainly, lanes l and
  // l + 32/VPL would hit the same shared-memory bank (an 8-way conflict on every read at head_dim
  // 256, for every key and vector); rotating each lane's VPL floats by l / (32/VPL) puts the 32
  // lanes' reads on 32 banks. Only where a float sits changes: every sum reads the same values.
  constexpr int LPB = 32 / VPL;  // lanes whose dims fill the 32 banks once
  auto at = [&](int d) { const int l = d / VPL; return l * VPL + (d % VPL + l / LPB) % VPL; };
  for (int idx = tid; idx < R * HD; idx += NT) {
    const int u = idx / HD, d = idx % HD, i = r0 + u / G, g = u % G;
    sq[u][at(d)] = i < L ? static_cast<float>(q[b * q_strides[0] + (kvh * G + g) * q_strides[1] + i * q_strides[2] + d * q_strides[3]]) : 0.f;
  }
  __syncthreads();
#pragma unroll 2
  for (int j = warp; j < top; j += NW) {  // a warp per key, its lanes over the dims
    const T* kr = kp + kvh * k1 + (k0 + j) * k2 + lane * VPL;
    float kv[VPL];
#pragma unroll
    for (int e = 0; e < VPL; ++e) kv[e] = static_cast<float>(kr[e]);
#pragma unroll
    for (int u = 0; u < R; ++u) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < VPL; ++e) s = fmaf(sq[u][at(lane * VPL + e)], kv[e], s);
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) sp[u][j] = s * scale;
    }
  }
  __syncthreads();
  for (int u = warp; u < R; u += NW) {
    // A warp per query vector: the chunk's max, then its sum of exponentials (each lane's keys in
    // order, then a fixed butterfly): an order set by the row's key count alone.
    const int r = u / G, n = keys_of(r);  // cnt[r], without indexing it at run time
    float m = -__int_as_float(0x7f800000);  // -inf
    for (int j = lane; j < n; j += 32) m = fmaxf(m, sp[u][j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int j = lane; j < n; j += 32) {
      const float e = expf(sp[u][j] - m);
      sp[u][j] = e;
      l += e;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0 && r0 + r < L) {
      const int at = ((b * L + r0 + r) * nh + kvh * G + u % G) * C + c;
      pm[at] = m;
      pl[at] = l;
    }
  }
  __syncthreads();
  // A thread's DPT adjacent output dims, every key of the chunk in order (a row's own keys only);
  // unrolled so that several keys' loads are in flight (each sum's order unchanged).
  const int d0 = tid * DPT;
  float acc[DPT][R];
#pragma unroll
  for (int e = 0; e < DPT; ++e)
#pragma unroll
    for (int u = 0; u < R; ++u) acc[e][u] = 0.f;
#pragma unroll 4
  for (int j = 0; j < top; ++j) {
    const T* vr = vp + kvh * v1 + (k0 + j) * v2 + d0;
    float vv[DPT];
#pragma unroll
    for (int e = 0; e < DPT; ++e) vv[e] = static_cast<float>(vr[e]);
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (j < cnt[u / G]) {
#pragma unroll
        for (int e = 0; e < DPT; ++e) acc[e][u] = fmaf(sp[u][j], vv[e], acc[e][u]);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const int i = r0 + u / G;
    if (i < L) {
#pragma unroll
      for (int e = 0; e < DPT; ++e) po[((size_t)((b * L + i) * nh + kvh * G + u % G) * C + c) * HD + d0 + e] = acc[e][u];
    }
  }
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
  // result is the same whatever C (the last row's, or the batch's widest) is. A block per (head,
  // row) is few blocks (16 for a decode step's row at the 9B shape) reading C chunks each (1,024 at
  // 128k keys, 1 MiB of partials): each thread loads CB chunks' values at once, then folds them in
  // chunk order, the same operations in the same order as one chunk at a time.
  constexpr int CB = 16;
  float M = -__int_as_float(0x7f800000);  // -inf
  for (int c0 = 0; c0 < C; c0 += CB) {
    float mv[CB];
#pragma unroll
    for (int j = 0; j < CB; ++j) mv[j] = c0 + j < C ? pm[base + c0 + j] : M;
#pragma unroll
    for (int j = 0; j < CB; ++j) if (c0 + j < C) M = fmaxf(M, mv[j]);
  }
  float l = 0.f, o = 0.f;
  for (int c0 = 0; c0 < C; c0 += CB) {
    float mv[CB], lv[CB], ov[CB];
#pragma unroll
    for (int j = 0; j < CB; ++j) {
      const bool in = c0 + j < C;
      mv[j] = in ? pm[base + c0 + j] : 0.f;
      lv[j] = in ? pl[base + c0 + j] : 0.f;
      ov[j] = in ? po[(size_t)(base + c0 + j) * HD + d] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < CB; ++j) {
      if (c0 + j < C) {
        const float w = expf(mv[j] - M);
        l += lv[j] * w;
        o += ov[j] * w;
      }
    }
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
    return jit_cache.cuda_kernel(name=versioned(f"mtp_attn_partials_{B}", source),
                               input_names=["q", *(f"k_{i}" for i in range(B)), *(f"v_{i}" for i in range(B)), "consts"],
                               output_names=["pm", "pl", "po"], source=source, ensure_row_contiguous=False)


@lru_cache(maxsize=None)
def _scale(scale: float) -> mx.array:
    return mx.array([scale], dtype=mx.float32)


@lru_cache(maxsize=None)
def _combine():
    return jit_cache.cuda_kernel(name=versioned("mtp_attn_combine", COMBINE), input_names=["pm", "pl", "po", "gate"],
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


# From this many keys a partials block takes all of a verify's rows; below it, a row a block. On
# the H200 at the 9B shape, 4 rows (docs/bench/2026-12-02/GPU.md, section 7, one run, same bits):
# a row a block 0.120 / 0.144 / 0.238 / 0.688 ms at 64 / 2k / 8k / 32k keys, all rows in a block
# 0.153 / 0.229 / 0.283 / 0.527: reading the keys once pays only where there are many of them.
ROWS_BLOCK_FROM = 16384


def rows_per_block(L: int, G: int, hd: int = 256, keys: Optional[int] = None) -> int:
    """How many query rows a partials block takes: past ROWS_BLOCK_FROM `keys` (or when not
    given) all L where their vectors and scores fit the 48 KiB of static shared memory (R vectors
    x (HD + CHUNK) floats), else as many as fit; below it one. A block reads its chunk's keys and
    values once for its rows; a row's result does not depend on how many it takes."""
    if keys is not None and keys < ROWS_BLOCK_FROM:
        return 1
    return max(1, min(L, (48 * 1024) // (4 * G * (hd + CHUNK))))


THREADS = 128  # a partials block's threads (<= head_dim); a row's result does not depend on it


def gated_attention_batch(q: mx.array, ks: list, vs: list, gate: mx.array, scale: float,
                          rows_block: Optional[int] = None, threads: Optional[int] = None) -> mx.array:
    """gated_attention for B sequences in two launches: q [B, nh, L, hd], sequence b's keys and
    values ks[b], vs[b] [1, nkv, S_b, hd] (its own cache's views), gate [B, L, nh * hd] ->
    [B, L, nh * hd]. Each sequence computes what it computes alone: its chunks are its own, and
    the chunks a longer neighbour adds are empty ones, which add exact zeros. `rows_block` and
    `threads` (tests and scripts/gpu/gpu_attention.py) change the launch, never a row's result."""
    B, nh, L, hd = q.shape
    nkv = ks[0].shape[1]
    G = nh // nkv
    C = max(-(-k.shape[2] // CHUNK) for k in ks)
    rb = rows_block or rows_per_block(L, G, hd, max(k.shape[2] for k in ks))
    nt = threads or THREADS
    nb = -(-L // rb)
    pm, pl, po = _partials(B)(
        inputs=[q, *ks, *vs, _scale(scale)],
        template=[("T", q.dtype), ("HD", hd), ("G", G), ("CHUNK", CHUNK), ("RB", rb), ("NT", nt)],
        grid=(C * nb * nt, nkv, B), threadgroup=(nt, 1, 1),
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


def reference_batch(q: mx.array, ks: list, vs: list, gate: mx.array, scale: float,
                    rows_block: Optional[int] = None, threads: Optional[int] = None) -> mx.array:
    """gated_attention_batch as each sequence's reference alone (the CPU tests' stand-in; the
    launch's shape does not change a row's result, so it is not needed here)."""
    return mx.concatenate([reference(q[b:b + 1], k, v, gate[b:b + 1], scale) for b, (k, v) in enumerate(zip(ks, vs))])
