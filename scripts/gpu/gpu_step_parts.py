#!/usr/bin/env python3
"""Where a 9B decode step's milliseconds go, kernel class by kernel class (issue 32's table).

    python scripts/gpu/gpu_step_parts.py --model /tmp/mtp_chat_q9b --json out/step_parts.json
    python scripts/gpu/gpu_step_parts.py --model <tiny checkpoint> --json /tmp/p.json --stand-in  # any machine

1. Each kernel class a step launches, timed inside one evaluated graph of many independent calls
   (inputs in copies that together exceed the L2, as scripts/gpu/gpu_qmv.py does), at the shapes
   of the loaded checkpoint and 1 and 3 positions: the joined quantized matmuls, the fused
   Gated-DeltaNet middle, the few-row attention at 64 and 8k keys, RMSNorm, RoPE, the compiled
   SwiGLU, the KV cache's slice update, and an empty custom kernel (the per-launch floor);
2. the step itself: a synchronised forward of 1 and 3 positions, the host time to build its graph,
   its primitives by kind, and the AR lane's pipelined tokens/s;
3. the step's parts: each class's per-call time times its calls per step, their sum, and what
   the sum leaves of the step (launch gaps and host work the GPU waits for).
With --env-variants, step 2 again in subprocesses under MLX CUDA's dispatch settings
(MLX_USE_CUDA_GRAPHS=0, MLX_MAX_OPS_PER_BUFFER=400 / 1000).
--stand-in skips the CUDA-only classes (checks this script's plumbing on a CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402

from adapters import load_adapter  # noqa: E402
from adapters.kernels import cuda_attention, cuda_qmm, gdn_fused  # noqa: E402
from adapters.qwen3_5.layers import AttnParams, GdnParams  # noqa: E402
from core import AutoregressiveDecoder, Prompt, SamplerConfig, chat_prompt_ids  # noqa: E402
from core.stream import prefill  # noqa: E402
from scripts.gpu.gpu_exact import forward_and_commit, synced_seconds  # noqa: E402
from scripts.gpu.gpu_profile import step_graph  # noqa: E402

L2 = 64 << 20
ENV_VARIANTS = {"graphs off": {"MLX_USE_CUDA_GRAPHS": "0"}, "400 ops a graph": {"MLX_MAX_OPS_PER_BUFFER": "400"},
                "1000 ops a graph": {"MLX_MAX_OPS_PER_BUFFER": "1000"}}
EMPTY = "if (threadIdx.x == 0 && blockIdx.x == 0) { y[0] = x[0]; }"


def per_call(make, copies: int, calls: int = 48, reps: int = 7) -> float:
    """Microseconds per call inside one graph of `calls` calls, call i on input set i % copies."""
    sets = [make(i) for i in range(copies)]
    mx.eval(sets)
    fn = sets[0][0]
    times = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        mx.eval([fn(*sets[i % copies][1:]) for i in range(calls)])
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) / calls * 1e6


def copies_for(nbytes: int) -> int:
    return max(2, min(64, -(-4 * L2 // max(1, nbytes))))


def layer_shapes(ad):
    """The step's layers: (GDN params, attention params) of the loaded trunk, and its hidden size."""
    layers = ad.stack.layers
    return ([p for p in layers if isinstance(p, GdnParams)], [p for p in layers if isinstance(p, AttnParams)],
            ad.contract.hidden_size)


def step_linears(ad, gdns, attns) -> dict:
    """The quantized products of a step as the row kernel runs them (joined where they share an
    input): name -> (weight, scales, biases, bits, group size, calls per step)."""
    run = ad.backend.few
    out = {}
    if not hasattr(run, "_fuse"):  # not the GPU runner (a CPU backend): nothing joined to time
        return out

    def add(name, modules, calls):
        joined = run._fuse(tuple(modules)) if len(modules) > 1 else None
        if joined is not None:
            out[name] = (joined.weight, joined.scales, joined.biases, joined.bits, joined.group_size, calls)
        elif len(modules) == 1 and "scales" in modules[0]:
            m = modules[0]
            out[name] = (m["weight"], m["scales"], m["biases"], m.bits, m.group_size, calls)

    if gdns:
        at = gdns[0].attn
        add("gdn in (qkv|z|b|a)", (at.in_proj_qkv, at.in_proj_z, at.in_proj_b, at.in_proj_a), len(gdns))
        add("gdn out_proj", (at.out_proj,), len(gdns))
    if attns:
        at = attns[0].attn
        add("attn q|k|v", (at.q_proj, at.k_proj, at.v_proj), len(attns))
        add("attn o_proj", (at.o_proj,), len(attns))
    mlps = [p.mlp for p in [*gdns, *attns] if p.mlp.experts is None]
    if mlps:
        m = mlps[0].module
        add("mlp gate|up", (m.gate_proj, m.up_proj), len(mlps))
        add("mlp down", (m.down_proj,), len(mlps))
    add("lm_head", (ad._output,), 1)
    return out


def class_times(ad, T: int, stand_in: bool) -> dict:
    """Per-call microseconds of each kernel class at T positions (one sequence)."""
    gdns, attns, H = layer_shapes(ad)
    dt = mx.bfloat16
    out = {}
    rnd = lambda shape, i: mx.random.normal(shape, key=mx.random.key(i)).astype(dt)  # noqa: E731
    if not stand_in:
        kern = mx.fast.cuda_kernel(name="mtp_empty_probe", input_names=["x"], output_names=["y"], source=EMPTY)
        out["empty custom kernel"] = per_call(lambda i: (lambda x: kern(
            inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(1,)], output_dtypes=[dt])[0],
            rnd((1,), i)), 2)
        for name, (w, s, b, bits, gs, _) in step_linears(ad, gdns, attns).items():
            K = w.shape[1] * 32 // bits
            out[f"qmm {name}"] = per_call(lambda i, w=w, s=s, b=b, bits=bits, gs=gs, K=K: (
                lambda x, w, s, b: cuda_qmm.quantized_matmul_rows(x, w, s, b, bits, gs),
                rnd((1, T, K), i), *(a if i == 0 else a + 0 for a in (w, s, b))),  # copies in memory of their own
                copies_for(w.nbytes + s.nbytes + b.nbytes))
        p = gdns[0]
        if gdn_fused.supported(T, p.Hk, p.Hv, p.Dk, p.Dv, p.K, mx.float32, dt):
            C, at = p.conv_dim, p.attn
            ntot = C + p.Hv * p.Dv + 2 * p.Hv
            conv_w = at.conv1d.weight.reshape(C, p.K)
            cst = gdn_fused.consts(p.Dk, at.norm.eps)
            state_bytes = p.Hv * p.Dv * p.Dk * 4
            out["gdn middle"] = per_call(lambda i: (
                lambda proj, conv, state: gdn_fused.gdn_fused(proj, (C, C + p.Hv * p.Dv, C + p.Hv * p.Dv + p.Hv), conv,
                                                             conv_w, p.neg_A, at.dt_bias, at.norm.weight, cst, state,
                                                             (p.Hk, p.Hv, p.Dk, p.Dv, p.K)),
                rnd((1, T, ntot), i), rnd((1, p.K - 1, C), i + 1),
                mx.random.normal((1, p.Hv, p.Dv, p.Dk), key=mx.random.key(i + 2))), copies_for(2 * state_bytes))
        a = attns[0]
        for S in (64, 8192):
            kv_bytes = 2 * a.nkv * S * a.hd * 2
            out[f"attention {S} keys"] = per_call(lambda i, S=S: (
                lambda q, k, v, g: cuda_attention.gated_attention(q, k, v, g, a.scale),
                rnd((1, a.nh, T, a.hd), i), rnd((1, a.nkv, S, a.hd), i + 1), rnd((1, a.nkv, S, a.hd), i + 2),
                rnd((1, T, a.nh * a.hd), i + 3)), copies_for(kv_bytes))
    norm = ad.stack.layers[0].layer.input_layernorm
    out["rms_norm (hidden)"] = per_call(lambda i: (lambda x: norm(x), rnd((1, T, H), i)), 8)
    if attns:
        a = attns[0]
        qn = a.attn.q_norm
        out["rms_norm (q heads)"] = per_call(lambda i: (lambda x: qn(x), rnd((1, T, a.nh, a.hd), i)), 8)
        out["rope"] = per_call(lambda i: (lambda x: a.attn.rope(x, offset=100), rnd((1, a.nh, T, a.hd), i)), 8)
        out["kv slice update"] = per_call(lambda i: (
            lambda buf, k: mx.slice_update(buf, k, mx.array([0, 0, 100, 0]), (0, 1, 2, 3)),
            rnd((1, a.nkv, 256, a.hd), i), rnd((1, a.nkv, T, a.hd), i + 1)), 8)
    tc = ad.config.get("text_config", ad.config)
    inter = tc.get("intermediate_size") or tc.get("moe_intermediate_size") or 4 * H
    swiglu = mx.compile(lambda g, u: g * mx.sigmoid(g) * u)
    out["swiglu (compiled)"] = per_call(lambda i: (swiglu, rnd((1, T, inter), i), rnd((1, T, inter), i + 1)), 8)
    return out


def step(ad, widths=(1, 3)) -> dict:
    """The step: synchronised forward (+ commit) of each width, host build, primitives, AR tok/s."""
    ids = chat_prompt_ids(ad, [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm."}])
    cache = ad.make_cache()
    prefill(ad, Prompt(tuple(ids), (len(ids) - 1,)), cache, None, None)
    tokens = mx.array([ids[-5:]], dtype=mx.int32)
    res = {}
    for w in widths:
        res[f"forward_{w}_ms"] = synced_seconds(lambda: forward_and_commit(ad, cache, tokens, w), 15) * 1e3
        kinds, res[f"build_{w}_ms"] = step_graph(ad, cache, tokens, w, runs=7)
        res[f"kinds_{w}"] = dict(kinds.most_common())
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=8)
    _, st = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=64)
    res["ar_tok_s"] = st.tokens_per_second
    res["ar_ms_per_token"] = 1e3 / st.tokens_per_second
    return res


def parts(ad, kinds: dict, times: dict) -> dict:
    """Each class's milliseconds in a one-position step: its per-call time times its calls."""
    gdns, attns, _ = layer_shapes(ad)
    ms = {}
    for name, (*_, calls) in step_linears(ad, gdns, attns).items():
        if f"qmm {name}" in times:
            ms[f"qmm {name}"] = times[f"qmm {name}"] * calls / 1e3
    ms["gdn middles"] = times.get("gdn middle", 0) * len(gdns) / 1e3
    ms["attention (64 keys)"] = times.get("attention 64 keys", 0) * len(attns) / 1e3
    ms["rms norms"] = times.get("rms_norm (hidden)", 0) * kinds.get("RMSNorm", 0) / 1e3
    ms["rope"] = times.get("rope", 0) * kinds.get("RoPE", 0) / 1e3
    ms["kv slice updates"] = times.get("kv slice update", 0) * kinds.get("SliceUpdate", 0) / 1e3
    ms["compiled elementwise"] = times.get("swiglu (compiled)", 0) * sum(
        v for k, v in kinds.items() if k.startswith("Compiled")) / 1e3
    ms["sum"] = sum(ms.values())
    return ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--stand-in", action="store_true", help="skip the CUDA-only kernel classes")
    ap.add_argument("--step-only", action="store_true", help="only the step (the env variants' subprocesses)")
    ap.add_argument("--env-variants", action="store_true")
    a = ap.parse_args(argv)
    ad = load_adapter(a.model)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()), "model": a.model,
              "describe": ad.describe(), "env": {k: os.environ[k] for k in os.environ if k.startswith("MLX_")}}
    report["step"] = step(ad)
    print(json.dumps({k: v for k, v in report["step"].items() if not k.startswith("kinds")}), flush=True)
    if not a.step_only:
        report["per_call_us"] = {T: class_times(ad, T, a.stand_in) for T in (1, 3)}
        for T, times in report["per_call_us"].items():
            print(f"T={T}: " + ", ".join(f"{k} {v:.1f} us" for k, v in times.items()), flush=True)
        report["parts_ms_1"] = pm = parts(ad, report["step"]["kinds_1"], report["per_call_us"][1])
        pm["step (synchronised forward of 1)"] = report["step"]["forward_1_ms"]
        pm["AR lane, ms a token"] = report["step"]["ar_ms_per_token"]
        pm["host build of the step"] = report["step"]["build_1_ms"]
        print("parts of a one-position step (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in pm.items()), flush=True)
    if a.env_variants:
        report["env_variants"] = {}
        for name, env in ENV_VARIANTS.items():
            out = Path(a.json).with_suffix(f".{name.replace(' ', '_')}.json")
            subprocess.run([sys.executable, __file__, "--model", a.model, "--json", str(out), "--step-only"],
                           env={**os.environ, **env}, check=False, timeout=600)
            if out.exists():
                report["env_variants"][name] = json.loads(out.read_text())["step"]
                print(f"{name}: " + json.dumps({k: v for k, v in report["env_variants"][name].items()
                                                if not k.startswith("kinds")}), flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
