"""Custom GPU kernels for few-token forwards: a quantized matmul for 1-8 rows (CUDA) and
the Gated-DeltaNet recurrence over T <= 8 positions keeping every state (CUDA and Metal).

Why: MLX CUDA's quantized matvec launches a grid over rows and re-reads the weights for
every row (~0.42 TB/s for one row of the 9B lm_head, linear in rows; KNOWLEDGE section 10),
so a verify of k tokens cost ~k decode steps. Here one launch reads each packed weight once
for all rows and multiplies on the tensor cores (mma.sync m16n8k16: 16 weight rows x 16 k
x 8 token columns, fp32 accumulation). Token columns never mix in an mma, and the k order
and the split over warps are fixed, so a row's result does not depend on how many rows
travel with it: AR steps and verifies compute the same logits.

The kernels are built lazily on first use; nothing here runs on the CPU backend. The
shape/dtype rules (`qmm_supported`, `gdn_supported`) are plain Python and tested on the CPU.
"""
from __future__ import annotations

from functools import lru_cache
from typing import List, Optional, Tuple

import mlx.core as mx

MAX_ROWS = 8  # one mma tile of token columns
QMM_WARPS = 8  # warps per block, splitting K; each block owns 32 output rows
QMM_ROWS = 32
QMM_BITS = (4, 8)
QMM_GROUPS = (32, 64, 128)
GDN_MAX_T = 8


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


def cuda_available() -> bool:
    try:
        return bool(mx.cuda.is_available())
    except Exception:  # noqa: BLE001  (builds without the mx.cuda module)
        return False


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


# --------------------------------------------------------------------------- Gated-DeltaNet
# One kernel body for both backends; a prelude names the thread indices and the warp/simd sum.
# Layout as mlx-lm's kernel: a 32-lane warp owns one value row (hv, dv) of the state, each lane
# Dk/32 elements; the state stays in registers over the T positions and is written (fp32)
# after each one into its own output, so a commit of any prefix keeps only its own buffer.
GDN_BODY = r"""
  constexpr int n_per_t = Dk / 32;
  const int hk = gdn_hv / (Hv / Hk);
  // q, k: [T, Hk, Dk]; v, y: [T, Hv, Dv]; g, beta: [T, Hv]; state: [Hv, Dv, Dk]
  float st[n_per_t];
  for (int i = 0; i < n_per_t; ++i) {
    st[i] = static_cast<float>(state_in[(gdn_hv * Dv + gdn_dv) * Dk + n_per_t * gdn_lane + i]);
  }
  for (int t = 0; t < T; ++t) {
    const float gt = static_cast<float>(g[t * Hv + gdn_hv]);
    const int qk = (t * Hk + hk) * Dk + n_per_t * gdn_lane;
    float kv_mem = 0.0f;
    for (int i = 0; i < n_per_t; ++i) {
      st[i] = st[i] * gt;
      kv_mem += st[i] * static_cast<float>(k[qk + i]);
    }
    kv_mem = gdn_sum(kv_mem);
    const float delta = (static_cast<float>(v[(t * Hv + gdn_hv) * Dv + gdn_dv]) - kv_mem)
                        * static_cast<float>(beta[t * Hv + gdn_hv]);
    float out = 0.0f;
    for (int i = 0; i < n_per_t; ++i) {
      st[i] = st[i] + static_cast<float>(k[qk + i]) * delta;
      out += st[i] * static_cast<float>(q[qk + i]);
    }
    out = gdn_sum(out);
    if (gdn_lane == 0) {
      y[(t * Hv + gdn_hv) * Dv + gdn_dv] = static_cast<InT>(out);
    }
    GDN_STORE_STATES
  }
"""

_CUDA_PRELUDE = """
  const int gdn_lane = threadIdx.x & 31;
  const int gdn_dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int gdn_hv = blockIdx.z;
"""
_CUDA_HEADER = """
__device__ __forceinline__ float gdn_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
"""
_METAL_PRELUDE = """
  const int gdn_lane = thread_index_in_simdgroup;
  const int gdn_dv = thread_position_in_grid.y;
  const int gdn_hv = thread_position_in_grid.z;
"""
_METAL_HEADER = """
inline float gdn_sum(float v) { return simd_sum(v); }
"""


def gdn_source(T: int, backend: str) -> str:
    """The kernel source for T positions: the shared body with the backend's prelude; one
    state output per position (`state_0` .. `state_{T-1}`)."""
    stores = "\n".join(
        f"    if (t == {i}) {{ for (int i = 0; i < n_per_t; ++i) "
        f"state_{i}[(gdn_hv * Dv + gdn_dv) * Dk + n_per_t * gdn_lane + i] = st[i]; }}"
        for i in range(T)
    )
    prelude = _CUDA_PRELUDE if backend == "cuda" else _METAL_PRELUDE
    return prelude + GDN_BODY.replace("GDN_STORE_STATES", stores)


def gdn_supported(q_shape, v_shape, state_dtype) -> bool:
    """q [1, T, Hk, Dk], v [1, T, Hv, Dv], fp32 state: what gated_delta_steps serves."""
    if len(q_shape) != 4 or len(v_shape) != 4 or q_shape[0] != 1 or v_shape[0] != 1:
        return False
    _, T, Hk, Dk = q_shape
    Hv, Dv = v_shape[2], v_shape[3]
    return (1 <= T <= GDN_MAX_T and Dk % 32 == 0 and Dv % 4 == 0 and Hv % Hk == 0
            and state_dtype == mx.float32)


@lru_cache(maxsize=None)
def _gdn_kernel(T: int, backend: str):
    names = dict(name=f"mtp_gdn_steps_{T}", input_names=["q", "k", "v", "g", "beta", "state_in"],
                 output_names=[f"state_{i}" for i in range(T)] + ["y"], source=gdn_source(T, backend))
    if backend == "cuda":
        return mx.fast.cuda_kernel(header=_CUDA_HEADER, **names)
    return mx.fast.metal_kernel(header=_METAL_HEADER, **names)


def gated_delta_steps(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                      state: mx.array, backend: str = "cuda") -> Tuple[mx.array, List[mx.array]]:
    """The gated delta rule over T <= 8 positions in one launch.

    q, k [1, T, Hk, Dk] (normalised as mlx-lm does), v [1, T, Hv, Dv], g, beta [1, T, Hv],
    state [1, Hv, Dv, Dk] fp32 -> y [1, T, Hv, Dv] and the T states after each position."""
    _, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    outs = _gdn_kernel(T, backend)(
        inputs=[q, k, v, g, beta, state],
        template=[("InT", q.dtype), ("T", T), ("Dk", Dk), ("Dv", Dv), ("Hk", Hk), ("Hv", Hv)],
        grid=(32, Dv, Hv),
        threadgroup=(32, 4, 1),
        output_shapes=[state.shape] * T + [v.shape],
        output_dtypes=[mx.float32] * T + [q.dtype],
    )
    return outs[-1], list(outs[:-1])


def gated_delta_reference(q, k, v, g, beta, state) -> Tuple[mx.array, List[mx.array]]:
    """The same recurrence as plain ops (mlx-lm's step, all in fp32): the check the kernels
    are held to."""
    rep = v.shape[2] // q.shape[2]
    if rep > 1:
        q, k = mx.repeat(q, rep, -2), mx.repeat(k, rep, -2)
    q, k, v = q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32)
    g, beta = g.astype(mx.float32), beta.astype(mx.float32)
    ys, states = [], []
    for t in range(q.shape[1]):
        state = state * g[:, t, :, None, None]
        kv_mem = (state * k[:, t, :, None, :]).sum(-1)
        delta = (v[:, t] - kv_mem) * beta[:, t, :, None]
        state = state + k[:, t, :, None, :] * delta[..., None]
        ys.append((state * q[:, t, :, None, :]).sum(-1))
        states.append(state)
    return mx.stack(ys, axis=1), states


def self_check(backend: str, seed: int = 0) -> Optional[str]:
    """Run the kernels once against plain ops; None if they agree, else why not.

    A kernel that fails to compile or disagrees must not silently decode: the adapter falls
    back to MLX's own path, saying so. (We have no Apple GPU: the Metal path proves itself
    here at load.)"""
    try:
        key = mx.random.key(seed)
        if backend == "cuda":
            kw, kx, key = mx.random.split(key, 3)
            w = mx.random.normal((64, 256), key=kw).astype(mx.bfloat16)
            wq, s, b = mx.quantize(w, group_size=64, bits=4)
            x = mx.random.normal((3, 256), key=kx).astype(mx.bfloat16)
            y = quantized_matmul_rows(x, wq, s, b, 4, 64)
            ref = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
            err = float(mx.abs(y.astype(mx.float32) - ref.astype(mx.float32)).max())
            scale = float(mx.abs(ref.astype(mx.float32)).max())
            if not err <= 0.02 * scale:
                return f"the quantized matmul differs from mx.quantized_matmul by {err:.2e}"
        kq, kk, kv, kg, kb, ks = mx.random.split(key, 6)
        T, Hk, Hv, Dk, Dv = 3, 2, 4, 64, 32
        q = mx.random.normal((1, T, Hk, Dk), key=kq) * Dk**-0.5
        k = mx.random.normal((1, T, Hk, Dk), key=kk) * Dk**-0.5
        v = mx.random.normal((1, T, Hv, Dv), key=kv)
        g = mx.random.uniform(0.5, 1.0, (1, T, Hv), key=kg)
        beta = mx.random.uniform(0.0, 1.0, (1, T, Hv), key=kb)
        state = mx.random.normal((1, Hv, Dv, Dk), key=ks) * 0.1
        y, states = gated_delta_steps(q, k, v, g, beta, state, backend=backend)
        y_ref, states_ref = gated_delta_reference(q, k, v, g, beta, state)
        err = max(float(mx.abs(y - y_ref).max()),
                  *(float(mx.abs(a - b).max()) for a, b in zip(states, states_ref)))
        return None if err < 1e-4 else f"the Gated-DeltaNet kernel differs from the ops path by {err:.2e}"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
