#!/usr/bin/env python3
"""What pipeline parallelism costs: AR and MTP over 1, 2 and 4 ranks on this machine (ring backend
on localhost), tok/s, MTP/AR, and per token the time rank 0 waited on the wire that was not the
other ranks' compute (the link's share: sends, receives, and on one host the ranks' contention).

    python scripts/bench/bench_distributed.py --model models/demo --ranks 1 2 4 --depth 2 --json out.json
    python scripts/bench/bench_distributed.py --tiny-moe --ranks 1 2 4 --json out.json

Each configuration is its own set of processes (MLX_RANK + MLX_HOSTFILE, as mlx.launch sets them);
1 rank is the single process (load_adapter, no pipeline). Runs are warm (an untimed run per lane
first), lanes alternate per repeat, medians are reported. The last table is the model of the
docs/distributed.md: MTP/AR = tau (a + lam) / (m + lam), with a the AR lane's compute per
token and m the MTP lane's per cycle (from the 1-rank run), tau the tokens per cycle, and lam a
pass's link time, 2 messages per hop and N hops per pass (rank 0 -> N-1 -> ... -> 1 -> 0).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

PROMPT = [{"role": "user", "content": "Tell me about Python lists."}]
LATENCIES_US = (2, 5, 20, 100, 1000)   # one message: Thunderbolt RDMA ~ a few us, a TCP ring ~ 100 us


def rank_job(job: dict) -> None:
    """One rank of one configuration; rank 0 writes its measurements to job["out"]."""
    import adapters  # noqa: F401  (the BLAS preload before mlx)
    from adapters import load_adapter
    from adapters.pipeline.launch import start
    from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt_ids

    load = {"log": lambda m: None}
    ad = load_adapter(job["model"], **load) if job["ranks"] == 1 else start(job["model"], log=lambda m: None,
                                                                            log_load=lambda m: None)
    if ad is None:
        return
    greedy = SamplerConfig(temperature=0)
    prompt = chat_prompt_ids(ad, PROMPT)
    lanes = {"ar": lambda: AutoregressiveDecoder(ad, sampler=greedy),
             "mtp": lambda: SpeculativeDecoder(ad, sampler=greedy, depth=job["depth"])}
    out = {lane: [] for lane in lanes}
    try:
        for lane in lanes:
            lanes[lane]().generate(prompt, max_tokens=16)   # warm: compiled functions, caches
        for r in range(job["repeats"]):
            for lane in (list(lanes) if r % 2 == 0 else list(lanes)[::-1]):
                w0, r0, f0 = (getattr(ad, "wire_seconds", 0.0), getattr(ad, "remote_seconds", 0.0),
                              getattr(ad, "forwards", 0))
                _, s = lanes[lane]().generate(prompt, max_tokens=job["max_tokens"])
                wire, remote = getattr(ad, "wire_seconds", 0.0) - w0, getattr(ad, "remote_seconds", 0.0) - r0
                out[lane].append({"tokens": s.generated_tokens, "tokens_per_second": s.tokens_per_second,
                                  "tokens_per_cycle": s.tokens_per_cycle if lane == "mtp" else 1.0,
                                  "acceptance": s.acceptance_rate, "forwards": getattr(ad, "forwards", 0) - f0,
                                  "wire_seconds": wire, "remote_compute_seconds": remote,
                                  "link_seconds": max(0.0, wire - remote), "decode_seconds": s.decode_seconds})
        out["describe"] = ad.describe()
        out["ranks_held"] = ad.ranks() if hasattr(ad, "ranks") else ["rank 0: every layer (single process)"]
        Path(job["out"]).write_text(json.dumps(out))
    finally:
        if hasattr(ad, "close"):
            ad.close()


def run_config(model: str, n: int, args, folder: Path) -> dict:
    from tests._pipeline import hostfile

    job = {"model": model, "ranks": n, "depth": args.depth, "repeats": args.repeats, "max_tokens": args.max_tokens,
           "out": str(folder / f"out{n}.json")}
    (folder / f"job{n}.json").write_text(json.dumps(job))
    hosts = hostfile(folder, n)
    procs = [subprocess.Popen([sys.executable, __file__, "--job", str(folder / f"job{n}.json")], cwd=REPO,
                              env={**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hosts)}) for r in range(n)]
    try:
        for p in procs:
            if p.wait(timeout=args.timeout) != 0:
                raise SystemExit(f"{n} ranks: a rank exited with {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    raw = json.loads(Path(job["out"]).read_text())
    med = lambda lane, key: statistics.median(r[key] for r in raw[lane])  # noqa: E731
    per_token = lambda lane, key: statistics.median(r[key] / max(1, r["tokens"] - 1) for r in raw[lane])  # noqa: E731
    return {"ranks": n, "held": raw["ranks_held"], "describe": raw["describe"],
            "ar_tokens_per_second": med("ar", "tokens_per_second"), "mtp_tokens_per_second": med("mtp", "tokens_per_second"),
            "mtp_over_ar": med("mtp", "tokens_per_second") / med("ar", "tokens_per_second"),
            "tokens_per_cycle": med("mtp", "tokens_per_cycle"), "acceptance": med("mtp", "acceptance"),
            "ar_link_ms_per_token": 1e3 * per_token("ar", "link_seconds"),
            "mtp_link_ms_per_token": 1e3 * per_token("mtp", "link_seconds"),
            "ar_link_ms_per_forward": 1e3 * statistics.median(r["link_seconds"] / max(1, r["forwards"]) for r in raw["ar"]),
            "runs": raw}


def latency_model(one: dict, rank_counts) -> list:
    """MTP/AR predicted for N ranks and a per-message latency, from the 1-rank run's parts."""
    a = 1 / one["ar_tokens_per_second"]                          # AR compute per token (s)
    tau = one["tokens_per_cycle"]
    m = tau / one["mtp_tokens_per_second"]                       # MTP compute per cycle (s)
    rows = []
    for n in rank_counts:
        if n < 2:
            continue
        for lat in LATENCIES_US:
            lam = 2 * n * lat * 1e-6
            rows.append({"ranks": n, "message_latency_us": lat, "pass_link_ms": lam * 1e3,
                         "mtp_over_ar": tau * (a + lam) / (m + lam)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "demo"))
    p.add_argument("--tiny-moe", action="store_true", help="a tiny random Qwen3.5-MoE checkpoint instead of --model")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", default=None)
    p.add_argument("--job", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        rank_job(json.loads(Path(args.job).read_text()))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as tmp:
        folder = Path(tmp)
        model = args.model
        if args.tiny_moe:
            from scripts.checkpoints.make_tiny_checkpoint import make_tiny_checkpoint
            from tests._engine_helpers import MIXED, make_mixed_head

            model = str(make_mixed_head(make_tiny_checkpoint(folder / "tiny-moe", family="qwen3_5_moe", **MIXED)))
        t0 = time.time()
        results = [run_config(model, n, args, folder) for n in args.ranks]
    print(f"{results[0]['describe']}\ndepth {args.depth}, {args.max_tokens} tokens, {args.repeats} repeats, "
          f"ring on localhost ({time.time() - t0:.0f} s)")
    print(f"{'ranks':>5} {'AR tok/s':>9} {'MTP tok/s':>10} {'MTP/AR':>7} {'tok/cycle':>9} "
          f"{'link ms/tok AR':>15} {'link ms/tok MTP':>16}")
    for r in results:
        print(f"{r['ranks']:>5} {r['ar_tokens_per_second']:>9.1f} {r['mtp_tokens_per_second']:>10.1f} "
              f"{r['mtp_over_ar']:>7.2f} {r['tokens_per_cycle']:>9.2f} {r['ar_link_ms_per_token']:>15.2f} "
              f"{r['mtp_link_ms_per_token']:>16.2f}")
    one = next((r for r in results if r["ranks"] == 1), None)
    model_rows = latency_model(one, args.ranks) if one else []
    if model_rows:
        print("model (1-rank compute + N hops x 2 messages x latency): MTP/AR")
        for row in model_rows:
            print(f"  {row['ranks']} ranks, {row['message_latency_us']:>5} us/message: {row['mtp_over_ar']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model if not args.tiny_moe else "tiny qwen3_5_moe (random)",
                                               "depth": args.depth, "max_tokens": args.max_tokens,
                                               "repeats": args.repeats, "results": results,
                                               "latency_model": model_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
