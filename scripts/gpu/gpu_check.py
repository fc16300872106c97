#!/usr/bin/env python3
"""Correctness and speed of the GPU kernels (adapters/kernels/), on a machine with MLX CUDA.

    python scripts/gpu/gpu_check.py --json out/check.json [--model /tmp/q9b]

1. Quantized matmul for 1-8 rows: against mx.quantized_matmul and an fp32 reference, 4- and
   8-bit, groups 32/64/128, bf16 and fp16; each row bit-identical whatever rows travel with it;
   time and bandwidth per 9B shape (bytes of weights, scales and biases over the time, as
   gpt-fast reports it), next to mx.quantized_matmul's.
2. Gated-DeltaNet over T = 1..8 positions: outputs and every state against the fp32 ops.
3. With --model: greedy MTP == AR at depths 1-3 over 128 tokens; AR with the kernels vs
   without; a sampled-distribution check (two-sample chi-square of the tokens at positions 2-3,
   MTP lane vs AR lane, many seeds).

Prints a short table last; exits 1 if a correctness check fails.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401
import mlx.core as mx  # noqa: E402

from adapters.kernels import cuda_qmm, gdn  # noqa: E402
from adapters.qwen3_5 import backends  # noqa: E402

# (K, N) of the 9B's quantized linears (KNOWLEDGE section 1).
SHAPES_9B = {
    "attn_q / gdn_qkv": (4096, 8192),
    "gdn_z / out / o_proj": (4096, 4096),
    "mlp gate / up": (4096, 12288),
    "mlp down": (12288, 4096),
    "attn k / v": (4096, 1024),
    "lm_head": (4096, 248320),
}
L2_BYTES = 64 << 20
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", flush=True)


def gpu_info() -> dict:
    info = {"mlx": mx.__version__, "cuda": cuda_qmm.cuda_available()}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
        info["gpu"] = out.strip()
    except Exception as exc:  # noqa: BLE001
        info["gpu"] = f"unknown ({exc})"
    return info


def rel_err(a: mx.array, ref: mx.array) -> float:
    a, ref = a.astype(mx.float32), ref.astype(mx.float32)
    return float(mx.linalg.norm((a - ref).reshape(-1)) / mx.linalg.norm(ref.reshape(-1)))


def quantized(K, N, bits, gs, dtype, key):
    w = (mx.random.normal((N, K), key=key) * K**-0.5).astype(dtype)
    wq, s, b = mx.quantize(w, group_size=gs, bits=bits)
    mx.eval(wq, s, b)
    return wq, s, b


def timed(thunks, repeats=5) -> float:
    """Median seconds per call of a batch of independent calls evaluated together."""
    mx.eval(thunks[0]())
    runs = []
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval([f() for f in thunks])
        mx.synchronize()
        runs.append((time.perf_counter() - t0) / len(thunks))
    return statistics.median(runs)


def check_qmm(fails: list) -> list:
    rows = []
    key = mx.random.key(1)
    K, N = 4096, 4096
    for dtype in (mx.bfloat16, mx.float16):
        for bits in cuda_qmm.QMM_BITS:
            for gs in cuda_qmm.QMM_GROUPS:
                if dtype == mx.float16 and gs != 64:
                    continue
                key, k1, k2 = mx.random.split(key, 3)
                wq, s, b = quantized(K, N, bits, gs, dtype, k1)
                x = mx.random.normal((cuda_qmm.MAX_ROWS, K), key=k2).astype(dtype)
                w32 = mx.dequantize(wq, s, b, group_size=gs, bits=bits).astype(mx.float32)
                ref = x.astype(mx.float32) @ w32.T
                full = cuda_qmm.quantized_matmul_rows(x, wq, s, b, bits, gs)
                mlx = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=gs, bits=bits)
                independent = all(
                    bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(x[:m], wq, s, b, bits, gs), full[:m]))
                    for m in range(1, cuda_qmm.MAX_ROWS)
                ) and bool(mx.array_equal(cuda_qmm.quantized_matmul_rows(x[3:4], wq, s, b, bits, gs), full[3:4]))
                e_k, e_m = rel_err(full, ref), rel_err(mlx, ref)
                ok = bool(mx.all(mx.isfinite(full))) and e_k < max(2 * e_m, 2e-3) and independent
                rows.append({"dtype": str(dtype), "bits": bits, "group": gs, "K": K, "N": N,
                             "err_kernel": e_k, "err_mlx": e_m, "rows_independent": independent, "ok": ok})
                if not ok:
                    fails.append(f"qmm {dtype} {bits}-bit g{gs}: err {e_k:.2e} (mlx {e_m:.2e}), independent {independent}")
    return rows


def bench_qmm(bits=4, gs=64, dtype=mx.bfloat16) -> list:
    rows = []
    key = mx.random.key(2)
    for name, (K, N) in SHAPES_9B.items():
        key, k1, k2 = mx.random.split(key, 3)
        one = quantized(K, N, bits, gs, dtype, k1)
        nbytes = sum(a.nbytes for a in one)
        sets = [one] + [quantized(K, N, bits, gs, dtype, k) for k in mx.random.split(k1, max(0, min(15, -(-4 * L2_BYTES // nbytes) - 1)))]
        n_calls = max(8, len(sets))
        for m in (1, 2, 3, 4, 5, 8):
            x = mx.random.normal((m, K), key=k2).astype(dtype)
            mx.eval(x)
            t_k = timed([lambda i=i: cuda_qmm.quantized_matmul_rows(x, *sets[i % len(sets)], bits, gs) for i in range(n_calls)])
            t_m = timed([lambda i=i: mx.quantized_matmul(x, *sets[i % len(sets)], transpose=True, group_size=gs, bits=bits)
                         for i in range(n_calls)])
            rows.append({"shape": name, "K": K, "N": N, "rows": m, "bytes": nbytes,
                         "kernel_us": t_k * 1e6, "kernel_TBps": nbytes / t_k / 1e12,
                         "mlx_us": t_m * 1e6, "mlx_TBps": nbytes / t_m / 1e12})
        del sets
    return rows


def check_gdn(fails: list) -> list:
    rows = []
    Hk, Hv, Dk, Dv = 16, 32, 128, 128  # the 9B's Gated-DeltaNet
    key = mx.random.key(3)
    for T in range(1, gdn.GDN_MAX_T + 1):
        key, *ks = mx.random.split(key, 7)
        q = (mx.random.normal((1, T, Hk, Dk), key=ks[0]) * Dk**-1).astype(mx.bfloat16)
        k = (mx.random.normal((1, T, Hk, Dk), key=ks[1]) * Dk**-0.5).astype(mx.bfloat16)
        v = mx.random.normal((1, T, Hv, Dv), key=ks[2]).astype(mx.bfloat16)
        g = mx.random.uniform(0.3, 1.0, (1, T, Hv), key=ks[3])
        beta = mx.random.uniform(0.0, 1.0, (1, T, Hv), key=ks[4]).astype(mx.bfloat16)
        state = mx.random.normal((1, Hv, Dv, Dk), key=ks[5]) * 0.1
        y, states = gdn.gated_delta_steps(q, k, v, g, beta, state)
        y_ref, states_ref = gdn.gated_delta_reference(q, k, v, g, beta, state)
        e_y = rel_err(y, y_ref)
        e_s = max(rel_err(a, b) for a, b in zip(states, states_ref))
        t = timed([lambda: gdn.gated_delta_steps(q, k, v, g, beta, state)[0]] * 16)
        ok = e_y < 1e-2 and e_s < 1e-5 and len(states) == T
        rows.append({"T": T, "err_y": e_y, "err_states": e_s, "us": t * 1e6, "ok": ok})
        if not ok:
            fails.append(f"gdn T={T}: err y {e_y:.2e}, states {e_s:.2e}")
    return rows


def check_model(path: str, fails: list, tokens: int = 128, samples: int = 120, budget: float = 90) -> dict:
    from adapters import load_adapter
    from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt_ids

    ad = load_adapter(path)
    log(f"loaded: {ad.describe()}")
    out = {"describe": ad.describe(), "backend": ad.backend.name}
    ids = chat_prompt_ids(ad, [{"role": "user", "content": "Define the word harbor."}])
    greedy = SamplerConfig(0.0, 1.0, 0, 0.0)
    ar, st = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=tokens)
    log(f"AR {len(ar)} tokens at {st.tokens_per_second:.1f} tok/s")
    parity = {}
    for d in (1, 2, 3):
        mtp, st = SpeculativeDecoder(ad, sampler=greedy, depth=d).generate(ids, max_tokens=tokens)
        log(f"MTP depth {d}: {len(mtp)} tokens at {st.tokens_per_second:.1f} tok/s, identical {mtp == ar}")
        first = next((i for i, (a, b) in enumerate(zip(ar, mtp)) if a != b), None)
        parity[str(d)] = {"identical": mtp == ar, "tokens": len(mtp), "first_difference": first}
        if mtp != ar:
            fails.append(f"greedy MTP depth {d} != AR (first difference at {first})")
    out["greedy_parity"] = parity
    chosen, ad.backend = ad.backend, backends.Backend("mlx", backends.MlxOps(), backends.MlxOps())  # MLX's own kernels
    ar_off, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(ids, max_tokens=tokens)
    ad.backend = chosen
    log(f"AR without the kernels: identical {ar_off == ar}")
    out["ar_kernels_vs_mlx"] = {"identical": ar_off == ar,
                                "first_difference": next((i for i, (a, b) in enumerate(zip(ar, ar_off)) if a != b), None)}

    # Sampled distribution: tokens 2-3 of many seeded runs, MTP (depth 2) vs AR, T=1, top-k 4.
    from scipy.stats import chi2_contingency

    sampler = SamplerConfig(1.0, 1.0, 4, 0.0)
    counts = {"ar": {}, "mtp": {}}
    start = time.perf_counter()
    for seed in range(samples):
        if time.perf_counter() - start > budget:
            break
        for lane, dec in (("ar", AutoregressiveDecoder(ad, sampler=sampler, seed=seed)),
                          ("mtp", SpeculativeDecoder(ad, sampler=sampler, seed=10_000 + seed, depth=2))):
            toks, _ = dec.generate(ids, max_tokens=3)
            k = tuple(toks[1:3])
            counts[lane][k] = counts[lane].get(k, 0) + 1
    keys = sorted(set(counts["ar"]) | set(counts["mtp"]))
    table = [[counts["ar"].get(k, 0) for k in keys], [counts["mtp"].get(k, 0) for k in keys]]
    p = float(chi2_contingency(table)[1]) if len(keys) > 1 else 1.0
    log(f"sampled {seed + 1} runs per lane")
    out["sampled_distribution"] = {"samples_per_lane": seed + 1, "outcomes": len(keys), "chi2_p": p,
                                   "ok": p > 0.001}
    if p <= 0.001:
        fails.append(f"sampled distribution: MTP vs AR chi-square p = {p:.2e}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--model", help="also check greedy parity and sampling on this checkpoint")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--model-only", action="store_true",
                    help="only the --model checks (the kernel checks compile every bits/group/dtype variant: minutes "
                         "where the PTX cache does not hold them)")
    a = ap.parse_args(argv)
    fails: list = []
    report = {"platform": gpu_info()}
    if not report["platform"]["cuda"]:
        print("no CUDA device: nothing to check here", file=sys.stderr)
        return 2
    steps = [] if a.model_only else [("qmm_checks", lambda: check_qmm(fails)), ("gdn_checks", lambda: check_gdn(fails))]
    steps += [] if a.no_bench or a.model_only else [("qmm_bandwidth", bench_qmm)]
    steps += [("model", lambda: check_model(a.model, fails))] if a.model else []
    for name, step in steps:  # one failing step must not hide the others' results
        log(f"{name} ...")
        try:
            report[name] = step()
        except Exception as exc:  # noqa: BLE001
            fails.append(f"{name}: {type(exc).__name__}: {exc}")
        report["failures"] = fails
        Path(a.json).write_text(json.dumps(report, indent=2))

    for r in report.get("qmm_bandwidth", []):
        print(f"{r['shape']:>22} rows {r['rows']}: kernel {r['kernel_us']:8.1f} us {r['kernel_TBps']:.2f} TB/s"
              f" | mlx {r['mlx_us']:8.1f} us {r['mlx_TBps']:.2f} TB/s")
    for r in report.get("gdn_checks", []):
        print(f"gdn T={r['T']}: err y {r['err_y']:.1e} states {r['err_states']:.1e}, {r['us']:.1f} us")
    if "model" in report:
        print(json.dumps(report["model"], indent=1))
    print("FAILURES:" if fails else "all checks passed", *fails, sep="\n  ")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
