#!/usr/bin/env python3
"""The fused Gated-DeltaNet middle (adapters/kernels/gdn_fused.py) on a GPU, before it is turned on.

    python scripts/gpu/gpu_fused_gdn.py --model /tmp/q9b --json out/fused_gdn.json
    python scripts/gpu/gpu_fused_gdn.py --model models/demo --json /tmp/x.json --stand-in   # any machine

For the first Gated-DeltaNet layer of the model, on random inputs (normed hidden rows, a conv
window, a recurrent state):
- the kernel against its reference (the same computation as MLX ops): output, conv window, and
  every position's state, relative to their largest value;
- positions computed together equal positions computed one at a time bit for bit (a verify of
  T = 2..6 against T decode steps, each carrying the state and conv window on), which is what
  greedy MTP == AR rests on;
- the time of one layer's middle (synchronised, median of 20): the kernel vs the ops path that
  runs today.
--stand-in runs the reference in the kernel's place (checks this script's plumbing on a CPU).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from adapters import load_adapter  # noqa: E402
from adapters.kernels import cuda_qmm, gdn_fused, rel_err  # noqa: E402
from adapters.qwen3_5 import backends, layers  # noqa: E402
from scripts.gpu.gpu_exact import synced_seconds  # noqa: E402


def layer_inputs(ad, T: int, seed: int = 0):
    p = next(layer for layer in ad.stack.layers if isinstance(layer, layers.GdnParams))
    keys = mx.random.split(mx.random.key(seed), 3)
    dtype = p.attn.in_proj_z["scales"].dtype if "scales" in p.attn.in_proj_z else p.attn.in_proj_z.weight.dtype
    H = ad.stack.layers[0].layer.input_layernorm.weight.shape[0]
    xn = mx.random.normal((1, T, H), key=keys[0]).astype(dtype)
    conv_state = (mx.random.normal((1, p.K - 1, p.conv_dim), key=keys[1]) * 0.5).astype(dtype)
    state = mx.random.normal((1, p.Hv, p.Dv, p.Dk), key=keys[2]) * 0.1
    return p, xn, conv_state, state


def middle(run: backends.GpuKernels, p, xn, conv_state, state):
    """The fused launch through the runner (joined projection included)."""
    return run.gdn_middle(p, xn, conv_state, state, None)


def ops_middle(p, xn, conv_state, state):
    """Today's path: the projections, conv, norms, recurrence and gated norm as MLX ops."""
    ops, T = backends.MlxOps(), xn.shape[1]
    qkv, z, b, a = layers.separate_projections(ops, p, xn)
    conv_input = mx.concatenate([conv_state, qkv], axis=-2)
    conv = nn.silu(ops.conv(p, conv_input, T))
    q, k, v = mx.split(conv, [p.key_dim, 2 * p.key_dim], axis=-1)
    q, k = ops.qk_norm(q.reshape(1, T, p.Hk, p.Dk), k.reshape(1, T, p.Hk, p.Dk), p.Dk)
    y, states = ops.recurrence(q, k, v.reshape(1, T, p.Hv, p.Dv), ops.decay(p, a), mx.sigmoid(b), state, None, True)
    return ops.gated_norm(p.attn.norm, y, z), conv_input, states


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--stand-in", action="store_true", help="the reference in the kernel's place")
    a = ap.parse_args(argv)
    if a.stand_in:  # each kernel's contract as MLX ops: the fused middle's reference, rows one at a time
        gdn_fused.gdn_fused = gdn_fused.reference

        def rows(x, w, scales, biases, bits, group_size, residual=None, config=None):
            flat = x.reshape(-1, x.shape[-1])
            y = mx.concatenate([mx.quantized_matmul(flat[i:i + 1], w, scales, biases, transpose=True,
                                                    group_size=group_size, bits=bits) for i in range(flat.shape[0])])
            y = y.reshape(*x.shape[:-1], w.shape[0])
            return y if residual is None else residual + y
        cuda_qmm.quantized_matmul_rows = rows
    ad = load_adapter(a.model, compute_dtype="native")
    run = backends.GpuKernels("cuda", fused_gdn=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()), "stand_in": a.stand_in,
              "against_reference": {}, "positions_as_steps": {}, "ms": {}}
    fails = 0
    for T in (1, 3, 6):
        p, xn, conv_state, state = layer_inputs(ad, T)
        got = middle(run, p, xn, conv_state, state)
        if got is None:
            print(f"T={T}: the fused middle does not apply to this model")
            return 1
        joined = run._fuse((p.attn.in_proj_qkv, p.attn.in_proj_z, p.attn.in_proj_b, p.attn.in_proj_a))
        proj = mx.concatenate(run.linears((p.attn.in_proj_qkv, p.attn.in_proj_z, p.attn.in_proj_b, p.attn.in_proj_a), xn),
                              axis=-1)
        conv_w, cst = run._gdn_inputs[id(p)]
        want = gdn_fused.reference(proj, tuple(joined.ends[:3]), conv_state, conv_w, p.neg_A, p.attn.dt_bias,
                                   p.attn.norm.weight, cst, state, (p.Hk, p.Hv, p.Dk, p.Dv, p.K))
        errs = {"out": rel_err(got[0], want[0]), "conv_input": rel_err(got[1], want[1]),
                "states": max(rel_err(s, w) for s, w in zip(got[2], want[2]))}
        ok = errs["out"] < 0.03 and errs["conv_input"] == 0 and errs["states"] < 0.03
        fails += not ok
        report["against_reference"][T] = {**errs, "ok": ok}
        print(f"T={T} vs reference: {errs} {'ok' if ok else 'FAILED'}")
    for T in (2, 3, 4, 6):
        p, xn, conv_state, state = layer_inputs(ad, T, seed=T)
        together = middle(run, p, xn, conv_state, state)
        window, st, same = conv_state, state, True
        for t in range(T):
            out, conv_input, states = middle(run, p, xn[:, t:t + 1], window, st)
            same &= bool(mx.array_equal(out[:, 0], together[0][:, t])) and bool(mx.array_equal(states[0], together[2][t]))
            window, st = conv_input[:, 1:], states[0]
        same &= bool(mx.array_equal(window, together[1][:, T:]))
        fails += not same
        report["positions_as_steps"][T] = same
        print(f"T={T}: positions together == one at a time: {same}")
    for T in (1, 3):
        p, xn, conv_state, state = layer_inputs(ad, T)
        report["ms"][T] = {"fused": synced_seconds(lambda: middle(run, p, xn, conv_state, state)) * 1e3,
                           "ops": synced_seconds(lambda: ops_middle(p, xn, conv_state, state)) * 1e3}
        print(f"T={T}: ms {report['ms'][T]}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=1))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
