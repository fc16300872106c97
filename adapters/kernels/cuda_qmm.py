"""A quantized matmul for 1-16 rows on CUDA: one launch reads each packed weight once for all rows.

Why: MLX CUDA's quantized matvec launches a grid over rows and re-reads the weights for
every row (~0.42 TB/s for one row of the 9B lm_head, linear in rows; KNOWLEDGE section 10),
so a verify of k tokens cost ~k decode steps. Here one launch reads each packed weight once
for all rows and multiplies on the tensor cores (mma.sync m16n8k16: 16 weight rows x 16 k
x 8 token columns, fp32 accumulation). Token columns never mix in an mma, and the k order
and the split over warps are fixed, so a row's result does not depend on how many rows
travel with it: AR steps and verifies compute the same logits.

Any family's quantized linears can use it (`module_fits` says which: an nn.QuantizedLinear or
the tied QuantizedEmbedding). The kernel is built lazily on first use; nothing here runs on the
CPU backend. The shape rules (`qmm_supported`) are plain Python and tested on the CPU.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from . import jit_cache
from .naming import versioned

TILE_ROWS = 8  # one mma tile of token columns
MAX_ROWS = 16  # two tiles (a batch's verify: 4 sequences x 3 positions) in one launch
# 9-16 rows in one launch: the default, unless its load check fails (then 8 rows a launch).
# Each tile of 8 rows has its own blocks, interleaved with the other tile's (block 2b and 2b + 1
# read the same weight rows at the same time, so the second read is served by L2): a tile's
# registers and arithmetic are exactly the one-tile launch's. (Two tiles in one block's registers
# were measured slower on the H200, section 8 of docs/bench/2026-12-02/GPU.md.)
TWO_TILES_OFF = "two tiles a launch switched off (8 rows a launch)"
TWO_TILES = {"on": False, "why": TWO_TILES_OFF}


def rows_per_launch() -> int:
    """Rows one launch takes: two tiles unless their load check failed (then 8 at a time)."""
    return MAX_ROWS if TWO_TILES["on"] else TILE_ROWS
QMM_ROWS = 16  # output rows of one mma tile: N must be whole tiles
QMM_MAX_WARPS = 8  # warps of a block splitting K (the kernel's shared partials hold 8)
QMM_TARGET_WARPS = 2048  # warps a launch aims for (132 SMs x ~16), so loads stay in flight
QMM_WIDE_N = 8192  # from this N a warp takes two tiles (x loaded once for 32 rows)
QMM_UNROLL = 2  # chunks a warp loads before it computes
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

// A SwiGLU input (the MLP's down projection): 8 values of silu(gate) * up from gate|up,
// rounded after each op as MLX's compiled silu(g) * u rounds them (sigmoid, g * sigmoid, * up).
template <typename T>
__device__ __forceinline__ uint4 qmm_swiglu(uint4 gv, uint4 uv) {
  const T* gp = reinterpret_cast<const T*>(&gv);
  const T* up = reinterpret_cast<const T*>(&uv);
  uint4 out;
  T* op = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float gf = static_cast<float>(gp[e]);
    const T s = static_cast<T>(1.f / (1.f + expf(-gf)));
    const T a = static_cast<T>(gf * static_cast<float>(s));
    op[e] = static_cast<T>(static_cast<float>(a) * static_cast<float>(up[e]));
  }
  return out;
}

"""

QMM_SOURCE = r"""
  typedef QmmTraits<T> Tr;
  constexpr int VPT = 128 / BITS;   // values in one lane's 16-byte load
  constexpr int KSTEPS = VPT / 4;   // mma k-steps in a chunk
  constexpr int CHUNK = 4 * VPT;    // k per warp chunk (the 4 lanes of a quad side by side)
  constexpr int XV = VPT / 8;       // uint4 loads of x per lane and chunk
  // x [..., K]: every leading axis is rows; with SWIGLU, x is gate|up [..., 2K] and the
  // product's input is silu(gate) * up, made here as it is read (one launch and no copy fewer).
  const int XK = x_shape[x_ndim - 1];
  const int K = SWIGLU ? XK / 2 : XK;
  int M = 1;
  for (int i = 0; i < x_ndim - 1; ++i) M *= x_shape[i];
  const int N = w_shape[0];
  const int W = blockDim.x >> 5;    // warps splitting K; fixed per shape, never per M
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  // CT tiles of 8 token rows, each with its own blocks: block b computes output rows of block
  // b / CT for token rows 8 * (b % CT) .. + 7, exactly as a one-tile launch computes rows 0..7.
  const int n0 = (blockIdx.x / CT) * (16 * TILES);
  const int c0 = 8 * (blockIdx.x % CT);
  const int G = K / GROUP;
  const int wrow = K * BITS / 32;
  const int n_chunks = K / CHUNK;

  float acc[TILES][4];
#pragma unroll
  for (int i = 0; i < TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  uint4 wv[U][TILES][2];
  T sv[U][TILES][2], bv[U][TILES][2];
  uint4 xv[U][XV];

  for (int base = warp; base < n_chunks; base += U * W) {
    // Every load of U chunks first (memory-level parallelism), then their arithmetic.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int chunk = base + u * W;
      if (chunk < n_chunks) {
        const int k0 = chunk * CHUNK + t * VPT;
#pragma unroll
        for (int i = 0; i < TILES; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const size_t row = (size_t)(n0 + 16 * i + g + 8 * h);
            wv[u][i][h] = __ldg(reinterpret_cast<const uint4*>(w + row * wrow + k0 * BITS / 32));
            sv[u][i][h] = scales[row * G + k0 / GROUP];
            bv[u][i][h] = biases[row * G + k0 / GROUP];
          }
        }
        const int xrow = c0 + g;
        const bool has_row = xrow < M;
#pragma unroll
        for (int i = 0; i < XV; ++i) {
          if constexpr (SWIGLU) {
            xv[u][i] = has_row ? qmm_swiglu<T>(__ldg(reinterpret_cast<const uint4*>(x + (size_t)xrow * XK + k0 + 8 * i)),
                                               __ldg(reinterpret_cast<const uint4*>(x + (size_t)xrow * XK + K + k0 + 8 * i)))
                               : make_uint4(0u, 0u, 0u, 0u);
          } else {
            xv[u][i] = has_row ? __ldg(reinterpret_cast<const uint4*>(x + (size_t)xrow * K + k0 + 8 * i))
                               : make_uint4(0u, 0u, 0u, 0u);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * W < n_chunks) {
#pragma unroll
        for (int i = 0; i < TILES; ++i) {
          const typename Tr::T2 s_lo = Tr::pair(sv[u][i][0]), s_hi = Tr::pair(sv[u][i][1]);
          const typename Tr::T2 b_lo = Tr::pair(bv[u][i][0]), b_hi = Tr::pair(bv[u][i][1]);
          const float sf_lo = static_cast<float>(sv[u][i][0]), sf_hi = static_cast<float>(sv[u][i][1]);
          const float bf_lo = static_cast<float>(bv[u][i][0]), bf_hi = static_cast<float>(bv[u][i][1]);
          const uint32_t* wl = reinterpret_cast<const uint32_t*>(&wv[u][i][0]);
          const uint32_t* wh = reinterpret_cast<const uint32_t*>(&wv[u][i][1]);
#pragma unroll
          for (int j = 0; j < KSTEPS; ++j) {
            int word, sh0, sh1;
            if constexpr (BITS == 4) {
              // step j: word j/2; slot pairs = nibbles (2e, 2e+4) and (2e+1, 2e+5), e = j%2
              word = j >> 1;
              sh0 = 8 * (j & 1);
              sh1 = 8 * (j & 1) + 4;
            } else {
              word = j;
              sh0 = 0;
              sh1 = 16;
            }
            uint32_t a[4];
            a[0] = qmm_dequant<T, BITS>(wl[word], sh0, s_lo, b_lo, sf_lo, bf_lo);
            a[1] = qmm_dequant<T, BITS>(wh[word], sh0, s_hi, b_hi, sf_hi, bf_hi);
            a[2] = qmm_dequant<T, BITS>(wl[word], sh1, s_lo, b_lo, sf_lo, bf_lo);
            a[3] = qmm_dequant<T, BITS>(wh[word], sh1, s_hi, b_hi, sf_hi, bf_hi);
            const uint32_t* xr = reinterpret_cast<const uint32_t*>(xv[u]);
            uint32_t b0, b1;
            if constexpr (BITS == 4) {
              const int e = j & 1;
              const uint32_t xa = xr[4 * word + e], xb = xr[4 * word + e + 2];
              b0 = __byte_perm(xa, xb, 0x5410);
              b1 = __byte_perm(xa, xb, 0x7632);
            } else {
              b0 = xr[2 * j];
              b1 = xr[2 * j + 1];
            }
            Tr::mma(acc[i], a, b0, b1);
          }
        }
      }
    }
  }

  // The warps' partials summed in a fixed order (warp 0, 1, ...): a row's result does not
  // depend on how many rows travel with it.
  __shared__ float red[8][TILES * 4][32];
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) red[warp][i * 4 + r][lane] = acc[i][r];
  __syncthreads();
  for (int s = threadIdx.x; s < TILES * 4 * 32; s += blockDim.x) {
    const int slot = s >> 5, l = s & 31;
    float sum = 0.f;
    for (int v = 0; v < W; ++v) sum += red[v][slot][l];
    // mma C fragment: r0,r1 -> (row g, cols 2t, 2t+1); r2,r3 -> (row g+8, same cols); this
    // block's columns are token rows c0..c0+7
    const int i = slot >> 2, r = slot & 3;
    const int row = n0 + 16 * i + (l >> 2) + 8 * (r >> 1);
    const int col = c0 + 2 * (l & 3) + (r & 1);
    if (col < M) {
      T out = static_cast<T>(sum);
      QMM_RESIDUAL
      y[(size_t)col * N + row] = out;
    }
  }
"""


def qmm_supported(x_shape, x_dtype, w_shape, scales_dtype, bits: int, group_size: int,
                  mode: str = "affine", has_biases: bool = True, swiglu: bool = False) -> bool:
    """Whether quantized_matmul_rows can serve x [..., K] @ dequant(w [N, K*bits/32]).T (with
    `swiglu`, x is gate|up [..., 2K])."""
    if mode != "affine" or not has_biases or bits not in QMM_BITS or group_size not in QMM_GROUPS:
        return False
    if x_dtype not in (mx.bfloat16, mx.float16) or scales_dtype != x_dtype:
        return False
    if len(x_shape) < 1 or len(w_shape) != 2:
        return False
    K = x_shape[-1] // 2 if swiglu else x_shape[-1]
    if swiglu and x_shape[-1] != 2 * K:
        return False
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


def qmm_config(N: int, K: int, bits: int) -> Tuple[int, int]:
    """(tiles of 16 output rows per warp, warps splitting K) for an N x K weight.

    A function of the weight's shape only, never of the row count: the reduction order (which
    warp sums which k, in which order the warps' partials add up) is then the same for 1 row
    and for 8, so a verify row equals the decode step's row bit for bit. Enough warps keep
    enough loads in flight to stream the weights; two tiles per warp halve x's traffic where
    N is wide enough to fill the GPU anyway."""
    chunks = K // (4 * 128 // bits)
    tiles = 2 if N >= QMM_WIDE_N and N % 32 == 0 else 1
    blocks = N // (16 * tiles)
    warps = 1
    while warps < QMM_MAX_WARPS and blocks * warps < QMM_TARGET_WARPS and chunks >= 4 * warps:
        warps *= 2
    return tiles, warps


def _strip(source: str) -> str:
    # MLX rebuilds and hashes a custom kernel's whole source on every call: keep it short.
    lines = (line.split("//")[0].rstrip() for line in source.splitlines())
    return "\n".join(line for line in lines if line.strip())


# The residual is added to the product rounded to T, as `res + (x @ w.T)` in T would add it.
_RESIDUAL = "out = static_cast<T>(static_cast<float>(out) + static_cast<float>(res[(size_t)col * N + row]));"


@lru_cache(maxsize=None)
def _qmm_kernel(residual: bool, swiglu: bool = False):
    source = _strip(QMM_SOURCE.replace("QMM_RESIDUAL", _RESIDUAL if residual else ""))
    return jit_cache.cuda_kernel(
        name=versioned("mtp_qmv" + ("_swiglu" if swiglu else "") + ("_res" if residual else ""), source,
                       _strip(QMM_HEADER)),
        input_names=["x", "w", "scales", "biases"] + (["res"] if residual else []),
        output_names=["y"],
        source=source,
        header=_strip(QMM_HEADER),
    )


def quantized_matmul_rows(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array,
                          bits: int, group_size: int, residual: Optional[mx.array] = None,
                          config: Optional[Tuple[int, int]] = None, swiglu: bool = False) -> mx.array:
    """x [..., K] (1-16 rows) @ dequant(w).T -> [..., N], one launch, weights read once for all
    rows (9-16: two tiles of 8 token rows, each in its own blocks and computed as in one tile);
    `residual` [..., N] is added to the rounded product (as `residual + x @ w.T` would).
    `swiglu`: x is an MLP's gate|up [..., 2K] and the input is silu(gate) * up (swiglu_rows),
    computed as the kernel reads it.

    The caller checks qmm_supported first (gpu_decode does). `config` overrides qmm_config
    (benchmarks only: a row's bits depend on it)."""
    # No reshapes around the launch: every primitive costs the host time in a decode step.
    N = w.shape[0]
    K = x.shape[-1] // 2 if swiglu else x.shape[-1]
    rows = x.size // x.shape[-1]
    template, grid, block = _launch(x.dtype, bits, group_size, N, K, config, swiglu, -(-rows // TILE_ROWS))
    (y,) = _qmm_kernel(residual is not None, swiglu)(
        inputs=[x, w, scales, biases] if residual is None else [x, w, scales, biases, residual],
        template=template, grid=grid, threadgroup=block,
        output_shapes=[(*x.shape[:-1], N)], output_dtypes=[x.dtype],
    )
    return y


def swiglu_rows(gate_up: mx.array) -> mx.array:
    """What the kernel's SwiGLU input is, as MLX ops: silu(gate) * up from gate|up [..., 2K],
    rounded to the dtype after each op (the CPU tests' stand-in and the load check's reference)."""
    dt, K = gate_up.dtype, gate_up.shape[-1] // 2
    g, u = gate_up[..., :K].astype(mx.float32), gate_up[..., K:].astype(mx.float32)
    s = (1.0 / (1.0 + mx.exp(-g))).astype(dt).astype(mx.float32)
    return ((g * s).astype(dt).astype(mx.float32) * u).astype(dt)


@lru_cache(maxsize=None)
def _launch(dtype, bits: int, group_size: int, N: int, K: int, config: Optional[Tuple[int, int]],
            swiglu: bool = False, ct: int = 1):
    tiles, warps = config or qmm_config(N, K, bits)
    # ct tiles of 8 token rows: ct times the blocks, a tile's block beside the other tile's
    template = [("T", dtype), ("BITS", bits), ("GROUP", group_size), ("TILES", tiles),
                ("U", QMM_UNROLL), ("SWIGLU", int(swiglu)), ("CT", ct)]
    return template, (N // (16 * tiles) * ct * warps * 32, 1, 1), (warps * 32, 1, 1)


def module_fits(module, rows: int, K: int, dtype) -> bool:
    """Whether an nn.QuantizedLinear without bias (or a tied nn.QuantizedEmbedding used as the
    output projection) runs through quantized_matmul_rows for `rows` rows of K values."""
    if not isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)) or "bias" in module \
            or module.get("biases") is None:
        return False
    return qmm_supported((rows, K), dtype, module["weight"].shape, module["scales"].dtype, module.bits,
                         module.group_size, module.mode)
