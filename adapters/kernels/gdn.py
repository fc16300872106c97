"""The Gated-DeltaNet recurrence over T positions, keeping the state after each one.

`recurrence` is the reference: the gated delta rule as plain MLX ops, written once. It is what
the CPU-compiled backend traces inside each layer's compiled function, what the GPU kernel below
is held to at load (`self_check`), and what tests compare mlx-lm's own ops with. Its layout is
chosen for few positions on a CPU: q and k broadcast as [B, 1, Hv, 1, Dk] against the state, v
as [B, 1, Hv, Dv, 1], one slice per position (an integer index is a Gather kernel on MLX's CPU
backend; there were ~70 of them per decode step), sums with keepdims (no reshapes in the loop).
Batched matmuls would be fewer ops but cost 3x more on this CPU.

`gated_delta_steps` runs the same rule as one kernel launch for T <= 8 positions on CUDA and
Metal: one kernel body for both backends with a small prelude each (thread indices, the
warp/simd sum); each position's state goes to its own fp32 output, so a commit of any prefix
keeps only its own buffer. `gated_delta_prefill` runs the same body over a whole prefill chunk
on CUDA (any T, read at run time: one compiled kernel for every chunk length), keeping only the
final state. Any family with a Gated-DeltaNet (Qwen3.5, Qwen3-Next) uses these.
"""
from __future__ import annotations

from functools import lru_cache
from typing import List, Tuple

import mlx.core as mx

from . import jit_cache
from .naming import versioned

GDN_MAX_T = 8


def recurrence(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
               state: mx.array) -> Tuple[mx.array, List[mx.array]]:
    """The gated delta rule, every state kept.

    q, k [B, T, Hk, Dk] (normalised as mlx-lm's normalize_qk does), v [B, T, Hv, Dv],
    g, beta [B, T, Hv], state [B, Hv, Dv, Dk] (fp32) -> y [B, T, Hv, Dv] in q's dtype and the
    T states after each position, each shaped as `state`. The batch axis may be left out
    (q [T, Hk, Dk], ..., state [1, Hv, Dv, Dk]): the CPU-compiled backend runs one sequence so,
    and a position's slice then broadcasts against the state with no reshape at all."""
    *batch, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if Hv > Hk:
        q, k = mx.repeat(q, Hv // Hk, axis=-2), mx.repeat(k, Hv // Hk, axis=-2)
    q, k = q.reshape(*batch, T, Hv, 1, Dk), k.reshape(*batch, T, Hv, 1, Dk)
    v = v.reshape(*batch, T, Hv, Dv, 1)
    g, beta = g.reshape(*batch, T, Hv, 1, 1), beta.reshape(*batch, T, Hv, 1, 1)
    st = state.reshape(*batch, 1, Hv, Dv, Dk)  # a position's slice is [..., 1, Hv, ., .]
    ys, states = [], []
    for t in range(T):
        at = (Ellipsis, slice(t, t + 1), slice(None), slice(None), slice(None))
        st = st * g[at]
        kv_mem = (st * k[at]).sum(axis=-1, keepdims=True)  # [..., 1, Hv, Dv, 1]
        delta = (v[at] - kv_mem) * beta[at]
        st = st + k[at] * delta
        ys.append((st * q[at]).sum(axis=-1))
        states.append(st.reshape(state.shape))
    return mx.concatenate(ys, axis=-3).astype(q.dtype), states


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


def gdn_supported(q_shape, v_shape, state_dtype, max_t: int = GDN_MAX_T) -> bool:
    """q [1, T, Hk, Dk], v [1, T, Hv, Dv], fp32 state, T <= max_t: what gated_delta_steps serves."""
    if len(q_shape) != 4 or len(v_shape) != 4 or q_shape[0] != 1 or v_shape[0] != 1:
        return False
    _, T, Hk, Dk = q_shape
    Hv, Dv = v_shape[2], v_shape[3]
    return (1 <= T <= max_t and Dk % 32 == 0 and Dv % 4 == 0 and Hv % Hk == 0
            and state_dtype == mx.float32)


def prefill_supported(q_shape, v_shape, state_dtype) -> bool:
    """What gated_delta_prefill serves: gdn_supported's shapes at any T whose element offsets
    fit the kernel's int arithmetic (2^31 / 4096 = 524k positions at the 9B shape)."""
    if len(q_shape) != 4 or len(v_shape) != 4:
        return False
    widest = max(q_shape[2] * q_shape[3], v_shape[2] * v_shape[3])
    return gdn_supported(q_shape, v_shape, state_dtype, max_t=(2**31 - 1) // widest)


@lru_cache(maxsize=None)
def _gdn_kernel(T: int, backend: str):
    source, header = gdn_source(T, backend), _CUDA_HEADER if backend == "cuda" else _METAL_HEADER
    names = dict(name=versioned(f"mtp_gdn_steps_{T}", source, header), input_names=["q", "k", "v", "g", "beta", "state_in"],
                 output_names=[f"state_{i}" for i in range(T)] + ["y"], source=source, header=header)
    if backend == "cuda":
        return jit_cache.cuda_kernel(**names)
    return mx.fast.metal_kernel(**names)


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


# The prefill variant (CUDA only: Metal keeps mlx-lm's own kernel). GDN_BODY as it is, with T a
# run-time value: MLX hands a kernel `q_shape` when its source names it, so one compiled kernel
# serves every chunk length (a template T would cost an NVRTC compile per length). Per position
# it does what the decode kernel does; only the state after the last position is written.
_CUDA_RUNTIME_T = """
  const int T = q_shape[1];  // q [1, T, Hk, Dk]
"""
_FINAL_STATE = """
  for (int i = 0; i < n_per_t; ++i) {
    state_out[(gdn_hv * Dv + gdn_dv) * Dk + n_per_t * gdn_lane + i] = st[i];
  }
"""


def prefill_source() -> str:
    """The prefill kernel's source: the shared body, T from q's shape, the final state stored."""
    return _CUDA_PRELUDE + _CUDA_RUNTIME_T + GDN_BODY.replace("GDN_STORE_STATES", "") + _FINAL_STATE


@lru_cache(maxsize=None)
def _prefill_kernel():
    return jit_cache.cuda_kernel(name=versioned("mtp_gdn_prefill", prefill_source(), _CUDA_HEADER),
                               input_names=["q", "k", "v", "g", "beta", "state_in"],
                               output_names=["y", "state_out"], source=prefill_source(), header=_CUDA_HEADER)


def gated_delta_prefill(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                        state: mx.array) -> Tuple[mx.array, mx.array]:
    """The gated delta rule over any T positions of one sequence in one CUDA launch.

    q, k [1, T, Hk, Dk] (normalised as mlx-lm does), v [1, T, Hv, Dv], g, beta [1, T, Hv],
    state [1, Hv, Dv, Dk] fp32 -> y [1, T, Hv, Dv] in q's dtype and the state after position T."""
    _, _, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    y, final = _prefill_kernel()(
        inputs=[q, k, v, g, beta, state],
        template=[("InT", q.dtype), ("Dk", Dk), ("Dv", Dv), ("Hk", Hk), ("Hv", Hv)],  # no T: see above
        grid=(32, Dv, Hv),
        threadgroup=(32, 4, 1),
        output_shapes=[v.shape, state.shape],
        output_dtypes=[q.dtype, mx.float32],
    )
    return y, final


def random_inputs(key, T: int, Hk: int, Hv: int, Dk: int, Dv: int, dtype=mx.float32):
    """Inputs as a layer hands them over: q, k about unit norm, v, and beta in `dtype`, the decay
    g (fp32, in [0.5, 1]) and a state (fp32) -> (q, k, v, g, beta, state), one sequence."""
    kq, kk, kv, kg, kb, ks = mx.random.split(key, 6)
    q = mx.random.normal((1, T, Hk, Dk), key=kq) * Dk**-0.5
    k = mx.random.normal((1, T, Hk, Dk), key=kk) * Dk**-0.5
    v = mx.random.normal((1, T, Hv, Dv), key=kv)
    g = mx.random.uniform(0.5, 1.0, (1, T, Hv), key=kg)
    beta = mx.random.uniform(0.0, 1.0, (1, T, Hv), key=kb)
    state = mx.random.normal((1, Hv, Dv, Dk), key=ks) * 0.1
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), g, beta.astype(dtype), state


def gated_delta_reference(q, k, v, g, beta, state) -> Tuple[mx.array, List[mx.array]]:
    """`recurrence` in fp32 whatever the inputs: what the kernel (fp32 inside) is held to."""
    f32 = [a.astype(mx.float32) for a in (q, k, v, g, beta)]
    return recurrence(*f32, state.astype(mx.float32))
