"""A Gated-DeltaNet layer's middle as one CUDA launch: from the joined input projection to the
gated-normed output that out_proj reads.

Why: a GPU decode step is bound by its launch count (docs/bench/2026-12-02/GPU.md). Between the
input projection and out_proj, MLX runs ~10 launches per layer (the conv window's concat, the
depthwise conv, SiLU, two RMSNorms for q and k, the decay and beta, the recurrence, the gated
RMSNorm, the conv window's copy); 24 layers of the 9B make that ~240 of a step's ~980
primitives. Here one block per value head does all of it: the conv of its q, k and v channels,
SiLU, the q/k norms, beta and the decay for all positions at once, then the delta rule on its
state rows position by position (fp32 in registers, as the recurrence kernel does; the only
step that waits on the previous position, so a verify's extra positions cost only it), then
the RMSNorm gated by SiLU(z) for all positions at once. It
reads q|k|v, z, b and a straight from the joined projection (no split, no copies), writes the
conv window with the new rows (what a rollback keeps), and the fp32 state after each position.

Exact by construction in the sense that matters: position t's arithmetic is the same whether it
is computed alone (a decode step) or among T (a verify): the same operations in the same order
over the same lanes, the delta rule's positions one after another, and the window rows it reads
are the same values either way. Its rounding
points follow mlx-lm's ops (bf16 after the conv, the SiLU, each norm, beta, the recurrence's
output), so it agrees with the ops path to bf16 rounding, not bit for bit.
`reference` is the same computation as MLX ops, what the GPU check holds the kernel to.
"""
from __future__ import annotations

from functools import lru_cache
from typing import List, Tuple

import mlx.core as mx
import mlx.nn as nn

from . import jit_cache
from .naming import versioned

MAX_T = 8
WARPS = 16  # one block per value head: 16 warps, Dv / 16 state rows each (512 threads leave
            # room for 128 registers a thread: at 1024, T = 7-8 needed more than the 64 allowed)

GDN_FUSED_SOURCE = r"""
  // proj [T, NTOT] (q|k|v at 0, z at Z_OFF, b at B_OFF, a at A_OFF); conv_state [K-1, C];
  // conv_w [C, K]; neg_a, dt_bias [Hv]; norm_w [Dv]; consts: q/k rms eps, q scale, k scale,
  // gated-norm eps; state_in [Hv, Dv, Dk] fp32. Each of these per sequence, B of them (blockIdx.y).
  // Three phases. Only the delta rule depends on the previous position, so everything before it
  // (conv, SiLU, q/k norms, beta, decay) is done for all T positions at once, and everything after
  // it (the gated norm, the output) too; the delta rule runs position after position on the
  // state rows each warp holds in registers, with no block-wide barrier between positions. Each
  // position's arithmetic (its operations, their order, the lanes its sums reduce over) is the
  // same for any T, so position t computes the same bits alone (a decode step) or among T (a verify).
  constexpr int KD = Hk * Dk;
  constexpr int C = 2 * KD + Hv * Dv;
  constexpr int RPW = Dv / NW;
  constexpr int NPT = Dk / 32;
  const int hv = blockIdx.x;
  // The sequence (blockIdx.y): a block reads and writes only its own sequence's rows, so each
  // sequence of a batch computes exactly what it computes alone.
  const size_t bi = blockIdx.y;
  const size_t PO = bi * T * NTOT, WO = bi * (K - 1) * C, IO = bi * (K - 1 + T) * C;
  const size_t SO = bi * Hv * Dv * Dk, YO = bi * T * (Hv * Dv);
  const int hk = hv / (Hv / Hk);
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const float qk_eps = consts[0], q_scale = consts[1], k_scale = consts[2], norm_eps = consts[3];

  __shared__ float sq[T][Dk], sk[T][Dk], sv[T][Dv], sy[T][Dv];
  __shared__ float s_beta[T], s_g[T], s_r[T];

  // The channels this block reads: its k-head's q and k, its own v.
  int chan = -1;
  if (tid < Dk) chan = hk * Dk + tid;
  else if (tid < 2 * Dk) chan = KD + hk * Dk + (tid - Dk);
  else if (tid < 2 * Dk + Dv) chan = 2 * KD + hv * Dv + (tid - 2 * Dk);
  // The conv window out: every channel once (q, k by the first value head of the k-head).
  const bool writes = chan >= 0 && (tid >= 2 * Dk || hv % (Hv / Hk) == 0);
  if (writes) {
    for (int r = 0; r < K - 1; ++r) conv_input[IO + r * C + chan] = conv_state[WO + r * C + chan];
    for (int t = 0; t < T; ++t) conv_input[IO + (K - 1 + t) * C + chan] = proj[PO + t * NTOT + chan];
  }

  // Phase 1, every position at once: the conv, SiLU, beta and the decay.
  if (chan >= 0) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float acc = 0.f;
      for (int j = 0; j < K; ++j) {
        const int row = t + j;  // conv window row: K-1 kept rows, then this call's positions
        const float xv = static_cast<float>(row < K - 1 ? conv_state[WO + row * C + chan]
                                                        : proj[PO + (row - (K - 1)) * NTOT + chan]);
        acc = fmaf(static_cast<float>(conv_w[chan * K + j]), xv, acc);
      }
      const float c = static_cast<float>(static_cast<InT>(acc));
      const float s = static_cast<float>(static_cast<InT>(c / (1.f + expf(-c))));
      if (tid < Dk) sq[t][tid] = s;
      else if (tid < 2 * Dk) sk[t][tid - Dk] = s;
      else sv[t][tid - 2 * Dk] = s;
    }
  } else if (tid - (2 * Dk + Dv) < T) {  // one thread a position
    const int t = tid - (2 * Dk + Dv);
    const float b = static_cast<float>(proj[PO + t * NTOT + B_OFF + hv]);
    s_beta[t] = static_cast<float>(static_cast<InT>(1.f / (1.f + expf(-b))));
    const float x = static_cast<float>(static_cast<InT>(
        static_cast<float>(proj[PO + t * NTOT + A_OFF + hv]) + static_cast<float>(dt_bias[hv])));
    const float sp = static_cast<float>(static_cast<InT>(x > 20.f ? x : log1pf(expf(x))));
    s_g[t] = expf(neg_a[hv] * sp);
  }
  __syncthreads();
  if (warp < 2 * T) {  // q and k of each position: RMSNorm over Dk by one warp each, then the scale, in T
    const int t = warp >> 1;
    float* s = (warp & 1) == 0 ? sq[t] : sk[t];
    float ss = 0.f;
    for (int i = 0; i < NPT; ++i) ss += s[NPT * lane + i] * s[NPT * lane + i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / Dk + qk_eps);
    const float scale = (warp & 1) == 0 ? q_scale : k_scale;
    for (int i = 0; i < NPT; ++i) {
      const float n = static_cast<float>(static_cast<InT>(s[NPT * lane + i] * r));
      s[NPT * lane + i] = static_cast<float>(static_cast<InT>(n * scale));
    }
  }
  __syncthreads();

  // Phase 2, position after position: the delta rule on this warp's state rows.
  float st[RPW][NPT];
#pragma unroll
  for (int r = 0; r < RPW; ++r)
#pragma unroll
    for (int i = 0; i < NPT; ++i)
      st[r][i] = state_in[SO + (hv * Dv + warp * RPW + r) * Dk + NPT * lane + i];

  for (int t = 0; t < T; ++t) {
    const float gt = s_g[t], bt = s_beta[t];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int dv = warp * RPW + r;
      float kv = 0.f;
#pragma unroll
      for (int i = 0; i < NPT; ++i) {
        st[r][i] = st[r][i] * gt;
        kv += st[r][i] * sk[t][NPT * lane + i];
      }
      for (int o = 16; o > 0; o >>= 1) kv += __shfl_xor_sync(0xffffffffu, kv, o);
      const float delta = (sv[t][dv] - kv) * bt;
      float out = 0.f;
#pragma unroll
      for (int i = 0; i < NPT; ++i) {
        st[r][i] = st[r][i] + sk[t][NPT * lane + i] * delta;
        out += st[r][i] * sq[t][NPT * lane + i];
      }
      for (int o = 16; o > 0; o >>= 1) out += __shfl_xor_sync(0xffffffffu, out, o);
      if (lane == 0) sy[t][dv] = static_cast<float>(static_cast<InT>(out));
#pragma unroll
      for (int i = 0; i < NPT; ++i) {
        const int at = (hv * Dv + dv) * Dk + NPT * lane + i;
        GDN_FUSED_STORE_STATES
      }
    }
  }
  __syncthreads();

  // Phase 3, every position at once: the gated RMSNorm over this head's Dv outputs, one warp a position.
  if (warp < T) {
    float ss = 0.f;
    for (int i = lane; i < Dv; i += 32) ss += sy[warp][i] * sy[warp][i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) s_r[warp] = rsqrtf(ss / Dv + norm_eps);
  }
  __syncthreads();
  for (int e = tid; e < T * Dv; e += NW * 32) {
    const int t = e / Dv, i = e - t * Dv;
    const float xn = static_cast<float>(static_cast<InT>(sy[t][i] * s_r[t] * static_cast<float>(norm_w[i])));
    const float z = static_cast<float>(proj[PO + t * NTOT + Z_OFF + hv * Dv + i]);
    y[YO + t * (Hv * Dv) + hv * Dv + i] = static_cast<InT>(z / (1.f + expf(-z)) * xn);
  }
"""


def fused_source(T: int) -> str:
    stores = " ".join(f"if (t == {i}) state_{i}[SO + at] = st[r][i];" for i in range(T))
    return GDN_FUSED_SOURCE.replace("GDN_FUSED_STORE_STATES", stores)


@lru_cache(maxsize=None)
def _kernel(T: int):
    return jit_cache.cuda_kernel(
        name=versioned(f"mtp_gdn_fused_{T}", fused_source(T)),
        input_names=["proj", "conv_state", "conv_w", "neg_a", "dt_bias", "norm_w", "consts", "state_in"],
        output_names=["y", "conv_input"] + [f"state_{i}" for i in range(T)],
        source=fused_source(T),
    )


def supported(T: int, Hk: int, Hv: int, Dk: int, Dv: int, K: int, state_dtype, proj_dtype) -> bool:
    return (1 <= T <= MAX_T and Dk % 32 == 0 and Dv % WARPS == 0 and Hv % Hk == 0
            and 2 * Dk + Dv + T <= WARPS * 32 and 2 * T <= WARPS and K >= 1
            and state_dtype == mx.float32 and proj_dtype in (mx.bfloat16, mx.float16))


def consts(Dk: int, norm_eps: float) -> mx.array:
    # normalize_qk's eps moved onto the mean (as mlx-lm does), its q and k scales, the gated norm's eps
    return mx.array([1e-6 / Dk, 1.0 / Dk, Dk**-0.5, norm_eps], dtype=mx.float32)


def gdn_fused(proj, offsets: Tuple[int, int, int], conv_state, conv_w, neg_a, dt_bias, norm_w, cst, state,
              dims: Tuple[int, int, int, int, int]) -> Tuple[mx.array, mx.array, List[mx.array]]:
    """proj [B, T, NTOT] (the joined q|k|v, z, b, a), conv_state [B, K-1, C], conv_w [C, K],
    state [B, Hv, Dv, Dk] fp32 -> (y [B, T, Hv*Dv], conv_input [B, K-1+T, C], T states [B, Hv, Dv, Dk]).
    One launch for the batch: each sequence's blocks compute it as alone (one row of blocks each)."""
    Hk, Hv, Dk, Dv, K = dims
    T, ntot = proj.shape[-2], proj.shape[-1]
    C = conv_state.shape[-1]
    lead = proj.shape[:-2]
    batch = proj.size // (T * ntot)
    z_off, b_off, a_off = offsets
    outs = _kernel(T)(
        inputs=[proj, conv_state, conv_w, neg_a, dt_bias, norm_w, cst, state],
        template=[("InT", proj.dtype), ("T", T), ("Dk", Dk), ("Dv", Dv), ("Hk", Hk), ("Hv", Hv), ("K", K),
                  ("NTOT", ntot), ("Z_OFF", z_off), ("B_OFF", b_off), ("A_OFF", a_off), ("NW", WARPS)],
        grid=(Hv * WARPS * 32, batch, 1),
        threadgroup=(WARPS * 32, 1, 1),
        output_shapes=[(*lead, T, Hv * Dv), (*lead, K - 1 + T, C)] + [state.shape] * T,
        output_dtypes=[proj.dtype, proj.dtype] + [mx.float32] * T,
    )
    return outs[0], outs[1], list(outs[2:])


def reference(proj, offsets, conv_state, conv_w, neg_a, dt_bias, norm_w, cst, state, dims):
    """gdn_fused as MLX ops with the kernel's rounding points (proj [B, T, NTOT], conv_state
    [B, K-1, C]; each sequence alone, as the kernel's blocks compute it): what the GPU check holds
    the kernel to, and the CPU tests' stand-in for it."""
    from .gdn import recurrence

    if proj.shape[0] > 1:
        runs = [reference(proj[b:b + 1], offsets, conv_state[b:b + 1], conv_w, neg_a, dt_bias, norm_w, cst,
                          state[b:b + 1], dims) for b in range(proj.shape[0])]
        return (mx.concatenate([r[0] for r in runs]), mx.concatenate([r[1] for r in runs]),
                [mx.concatenate(s) for s in zip(*(r[2] for r in runs))])

    Hk, Hv, Dk, Dv, K = dims
    T, dt, f32 = proj.shape[-2], proj.dtype, mx.float32
    z_off, b_off, a_off = offsets
    C, KD = conv_state.shape[-1], Hk * Dk

    def rounded(x):
        return x.astype(dt).astype(f32)

    conv_input = mx.concatenate([conv_state, proj[..., :C]], axis=-2)
    acc = conv_input[:, 0:T].astype(f32) * conv_w[:, 0].astype(f32)
    for j in range(1, K):
        acc = acc + conv_input[:, j:j + T].astype(f32) * conv_w[:, j].astype(f32)
    c = rounded(acc)
    s = rounded(c * mx.sigmoid(c))

    def norm(x, scale):
        x = x.reshape(1, T, Hk, Dk)
        return (rounded(x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + cst[0])) * scale).astype(dt)

    q, k, v = norm(s[..., :KD], cst[1]), norm(s[..., KD:2 * KD], cst[2]), s[..., 2 * KD:].astype(dt)
    beta = mx.sigmoid(proj[..., b_off:b_off + Hv].astype(f32)).astype(dt)
    x = rounded(proj[..., a_off:a_off + Hv].astype(f32) + dt_bias.astype(f32))
    g = mx.exp(neg_a * rounded(nn.softplus(x)))
    y, states = recurrence(q, k, v.reshape(1, T, Hv, Dv), g, beta, state)
    y = y.astype(f32)
    xn = rounded(y * mx.rsqrt(mx.mean(y * y, axis=-1, keepdims=True) + cst[3]) * norm_w.astype(f32))
    z = proj[..., z_off:z_off + Hv * Dv].astype(f32).reshape(1, T, Hv, Dv)
    return (z * mx.sigmoid(z) * xn).astype(dt).reshape(1, T, Hv * Dv), conv_input, states
