"""A quantized matmul for 1-8 rows on CUDA: one launch reads each packed weight once for all rows.

Why: MLX CUDA's quantized matvec launches a grid over rows and re-reads the weights for
every row (~0.42 TB/s for one row of the 9B lm_head, linear in rows; KNOWLEDGE section 10),
so a verify of k tokens cost ~k decode steps. Here one launch reads each packed weight once
for all rows and multiplies on the tensor cores (mma.sync m16n8k16: 16 weight rows x 16 k
x 8 token columns, fp32 accumulation). Token columns never mix in an mma, and the k order
and the split over warps are fixed, so a row's result does not depend on how many rows
travel with it: AR steps and verifies compute the same logits.

Any family's quantized linears can use it (`linear_rows` takes an nn.QuantizedLinear or the
tied QuantizedEmbedding). The kernel is built lazily on first use; nothing here runs on the
CPU backend. The shape rules (`qmm_supported`) are plain Python and tested on the CPU.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

MAX_ROWS = 8  # one mma tile of token columns
QMM_WARPS = 8  # warps per block, splitting K; each block owns 32 output rows
QMM_ROWS = 32
QMM_BITS = (4, 8)
QMM_GROUPS = (32, 64, 128)


def cuda_available() -> bool:
    try:
        return bool(mx.cuda.is_available())
    except Exception:  # noqa: BLE001  (builds without the mx.cuda module)
        return False


# --------------------------------------------------------------------------- quantized matmul
# Layout (mlx affine): w uint32 [N, K*bits/32], value j of a word at bits j*bits (low first);
# scales, biases [N, K/group]; w_hat = q * scale + bias.
#
# Work split: a block = 8 warps = 32 output rows; warp w takes the K chunks w, w+8, ... A warp
# chunk covers 4*VPT k: lane (g = lane/4, t = lane%4) loads 16 bytes (VPT values) of rows
# g, g+8, g+16, g+24 at k0 = chunk*4*VPT + t*VPT, and VPT values of token row g of x.
# mma k-slot order is free as long as A and B agree; for 4-bit, slot pairs are the nibbles
# (i, i+4) of a word, which one shift and one mask turn into two bf16 numbers (128 + q, a
# trick from Marlin), and x is permuted to match with byte_perm.
#
# One traits struct per activation type (the magic number that turns a nibble into 128 + q
# or 1024 + q, the pair/pack conversions, the mma's type suffix), written once.
_QMM_TRAITS = r"""
template <> struct QmmTraits<@T@> {
  typedef @T2@ T2;
  static constexpr uint32_t MAGIC = @MAGIC@;  // @WHY@
  __device__ static T2 magic() { return @PACK@(@BASE@, @BASE@); }
  __device__ static T2 pack(float a, float b) { return @PACK@(a, b); }
  __device__ static T2 pair(@T@ s) { return @PAIR@(s); }
  __device__ static void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.@MMA@.@MMA@.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};"""


def _traits(**names) -> str:
    out = _QMM_TRAITS
    for k, v in names.items():
        out = out.replace(f"@{k}@", v)
    return out


QMM_HEADER = "\ntemplate <typename T> struct QmmTraits;" + _traits(
    T="__nv_bfloat16", T2="__nv_bfloat162", MAGIC="0x43004300u", WHY="bf16 128.0 twice: 0x4300 | q == 128 + q",
    PACK="__floats2bfloat162_rn", BASE="128.0f", PAIR="__bfloat162bfloat162", MMA="bf16",
) + _traits(
    T="__half", T2="__half2", MAGIC="0x64006400u", WHY="fp16 1024.0 twice: 0x6400 | q == 1024 + q",
    PACK="__floats2half2_rn", BASE="1024.0f", PAIR="__half2half2", MMA="f16",
) + r"""

template <typename T2> __device__ __forceinline__ uint32_t qmm_bits(T2 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two dequantized weights (one mma register) from word `w`.
// 4-bit: nibbles (s/4, s/4 + 4) of w, exact as 128 + q (bf16) or 1024 + q (fp16), one fma.
// 8-bit: bytes (s/8, s/8 + 1) of w through fp32.
template <typename T, int BITS>
__device__ __forceinline__ uint32_t qmm_dequant(uint32_t w, int shift,
                                               typename QmmTraits<T>::T2 s2,
                                               typename QmmTraits<T>::T2 b2,
                                               float s, float b) {
  typedef QmmTraits<T> Tr;
  if constexpr (BITS == 4) {
    uint32_t v = ((w >> shift) & 0x000F000Fu) | Tr::MAGIC;
    typename Tr::T2 q = *reinterpret_cast<typename Tr::T2*>(&v);
    q = __hsub2(q, Tr::magic());
    return qmm_bits(__hfma2(q, s2, b2));
  } else {
    float q0 = __uint_as_float(0x4B000000u | ((w >> shift) & 0xFFu)) - 8388608.0f;
    float q1 = __uint_as_float(0x4B000000u | ((w >> (shift + 8)) & 0xFFu)) - 8388608.0f;
    return qmm_bits(Tr::pack(fmaf(q0, s, b), fmaf(q1, s, b)));
  }
}

template <typename T, int BITS>
struct QmmChunk {
  static constexpr int VPT = 128 / BITS;  // values per 16 bytes
  uint4 w[4];                             // rows g, g+8, g+16, g+24
  T s[4], b[4];
  uint4 x[VPT / 8];                       // VPT values of token row g
};
"""

QMM_SOURCE = r"""
  typedef QmmTraits<T> Tr;
  constexpr int VPT = 128 / BITS;
  constexpr int KSTEPS = VPT / 4;
  constexpr int CHUNK = 4 * VPT;
  const int M = x_shape[0];
  const int K = x_shape[1];
  const int N = w_shape[0];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n0 = blockIdx.x * 32;
  const int G = K / GROUP;
  const int wrow = K * BITS / 32;
  const int n_chunks = K / CHUNK;
  const bool has_row = g < M;

  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};

  auto load = [&](int chunk, QmmChunk<T, BITS>& c) {
    const int k0 = chunk * CHUNK + t * VPT;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = n0 + g + 8 * i;
      c.w[i] = __ldg(reinterpret_cast<const uint4*>(w + (size_t)row * wrow + k0 * BITS / 32));
      c.s[i] = scales[(size_t)row * G + k0 / GROUP];
      c.b[i] = biases[(size_t)row * G + k0 / GROUP];
    }
#pragma unroll
    for (int i = 0; i < VPT / 8; ++i) {
      c.x[i] = has_row ? *reinterpret_cast<const uint4*>(x + (size_t)g * K + k0 + 8 * i)
                       : make_uint4(0u, 0u, 0u, 0u);
    }
  };

  auto compute = [&](const QmmChunk<T, BITS>& c) {
    const uint32_t* xr = reinterpret_cast<const uint32_t*>(c.x);
    typename Tr::T2 s2[4], b2[4];
    float sf[4], bf[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s2[i] = Tr::pair(c.s[i]);
      b2[i] = Tr::pair(c.b[i]);
      sf[i] = static_cast<float>(c.s[i]);
      bf[i] = static_cast<float>(c.b[i]);
    }
    const uint32_t* wr[4] = {
        reinterpret_cast<const uint32_t*>(&c.w[0]), reinterpret_cast<const uint32_t*>(&c.w[1]),
        reinterpret_cast<const uint32_t*>(&c.w[2]), reinterpret_cast<const uint32_t*>(&c.w[3])};
#pragma unroll
    for (int j = 0; j < KSTEPS; ++j) {
      int word, sh0, sh1;
      uint32_t b0, b1;
      if constexpr (BITS == 4) {
        // step j: word j/2; slot pairs = nibbles (2e, 2e+4) and (2e+1, 2e+5), e = j%2
        const int e = j & 1;
        word = j >> 1;
        sh0 = 8 * e;
        sh1 = 8 * e + 4;
        const uint32_t xa = xr[4 * word + e], xb = xr[4 * word + e + 2];
        b0 = __byte_perm(xa, xb, 0x5410);  // x[8w+2e], x[8w+2e+4]
        b1 = __byte_perm(xa, xb, 0x7632);  // x[8w+2e+1], x[8w+2e+5]
      } else {
        // step j: word j; slot pairs = bytes (0, 1) and (2, 3)
        word = j;
        sh0 = 0;
        sh1 = 16;
        b0 = xr[2 * j];
        b1 = xr[2 * j + 1];
      }
#pragma unroll
      for (int tile = 0; tile < 2; ++tile) {
        const int lo = 2 * tile, hi = 2 * tile + 1;
        uint32_t a[4];
        a[0] = qmm_dequant<T, BITS>(wr[lo][word], sh0, s2[lo], b2[lo], sf[lo], bf[lo]);
        a[1] = qmm_dequant<T, BITS>(wr[hi][word], sh0, s2[hi], b2[hi], sf[hi], bf[hi]);
        a[2] = qmm_dequant<T, BITS>(wr[lo][word], sh1, s2[lo], b2[lo], sf[lo], bf[lo]);
        a[3] = qmm_dequant<T, BITS>(wr[hi][word], sh1, s2[hi], b2[hi], sf[hi], bf[hi]);
        Tr::mma(acc[tile], a, b0, b1);
      }
    }
  };

  // Two chunks in flight: the next one's loads are issued before this one's arithmetic.
  QmmChunk<T, BITS> cur, nxt;
  int chunk = warp;
  if (chunk < n_chunks) load(chunk, cur);
  for (; chunk < n_chunks; chunk += WARPS) {
    if (chunk + WARPS < n_chunks) load(chunk + WARPS, nxt);
    compute(cur);
    cur = nxt;
  }

  // Sum the warps' partials in a fixed order (warp 0..7): the result is independent of M.
  __shared__ float red[WARPS][8][32];
#pragma unroll
  for (int tile = 0; tile < 2; ++tile)
#pragma unroll
    for (int r = 0; r < 4; ++r) red[warp][tile * 4 + r][lane] = acc[tile][r];
  __syncthreads();
  const int slot = threadIdx.x >> 5;  // tile*4 + r
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < WARPS; ++i) sum += red[i][slot][lane];
  // mma C fragment: r0,r1 -> (row g, cols 2t, 2t+1); r2,r3 -> (row g+8, same cols)
  const int tile = slot >> 2, r = slot & 3;
  const int row = n0 + 16 * tile + g + 8 * (r >> 1);
  const int col = 2 * t + (r & 1);
  if (col < M) y[(size_t)col * N + row] = static_cast<T>(sum);
"""


def qmm_supported(x_shape, x_dtype, w_shape, scales_dtype, bits: int, group_size: int,
                  mode: str = "affine", has_biases: bool = True) -> bool:
    """Whether quantized_matmul_rows can serve x [..., K] @ dequant(w [N, K*bits/32]).T."""
    if mode != "affine" or not has_biases or bits not in QMM_BITS or group_size not in QMM_GROUPS:
        return False
    if x_dtype not in (mx.bfloat16, mx.float16) or scales_dtype != x_dtype:
        return False
    if len(x_shape) < 1 or len(w_shape) != 2:
        return False
    K = x_shape[-1]
    rows = 1
    for d in x_shape[:-1]:
        rows *= d
    N = w_shape[0]
    return (
        1 <= rows <= MAX_ROWS
        and w_shape[1] * 32 == K * bits
        and K % (4 * 128 // bits) == 0  # whole warp chunks
        and K % group_size == 0
        and N % QMM_ROWS == 0
    )


@lru_cache(maxsize=None)
def _qmm_kernel():
    return mx.fast.cuda_kernel(
        name="mtp_qmm_rows",
        input_names=["x", "w", "scales", "biases"],
        output_names=["y"],
        source=QMM_SOURCE,
        header=QMM_HEADER,
    )


def quantized_matmul_rows(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array,
                          bits: int, group_size: int) -> mx.array:
    """x [..., K] (1-8 rows) @ dequant(w).T -> [..., N], one launch, weights read once.

    The caller checks qmm_supported first (gpu_decode does)."""
    K = x.shape[-1]
    N = w.shape[0]
    x2 = x.reshape(-1, K)
    (y,) = _qmm_kernel()(
        inputs=[x2, w, scales, biases],
        template=[("T", x.dtype), ("BITS", bits), ("GROUP", group_size), ("WARPS", QMM_WARPS)],
        grid=(N // QMM_ROWS * QMM_WARPS * 32, 1, 1),
        threadgroup=(QMM_WARPS * 32, 1, 1),
        output_shapes=[(x2.shape[0], N)],
        output_dtypes=[x.dtype],
    )
    return y.reshape(*x.shape[:-1], N)


def linear_rows(module, x: mx.array) -> Optional[mx.array]:
    """x @ dequant(module.weight).T through the kernel for an nn.QuantizedLinear without bias
    (or a tied nn.QuantizedEmbedding used as the output projection); None where it does not
    apply (the caller then uses the module itself)."""
    if not isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)) or "bias" in module:
        return None
    w, scales, biases = module["weight"], module["scales"], module.get("biases")
    if biases is None or not qmm_supported(x.shape, x.dtype, w.shape, scales.dtype, module.bits,
                                           module.group_size, module.mode):
        return None
    return quantized_matmul_rows(x, w, scales, biases, module.bits, module.group_size)
