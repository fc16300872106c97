#!/usr/bin/env python3
"""Paired benchmark: our AR lane, our MTP lane and mlx_lm.stream_generate on one model.

Runs are warm (one untimed warm-up per lane), interleaved (the lane order rotates every
repeat), model load excluded; speeds are decode tokens/s (tokens after the first over the
time after the first) and the report gives medians and ratios.

    python scripts/bench/bench.py --model models/demo --prompt "Define the word harbor." \
        --max-tokens 128 --temperature 0.6 --top-p 0.95 --top-k 20 --depth 1 --repeats 5 --json out.json
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402  (first: the BLAS preload must precede mlx)
from adapters import load_adapter  # noqa: E402
from adapters.runtime import describe_runtime, runtime_info  # noqa: E402
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt_ids, padded_chat_prompt  # noqa: E402
from core.calibrate import measure_costs  # noqa: E402
from core.costs import expected_tokens, predicted_speedup  # noqa: E402
from core.settings import Settings  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx_lm import stream_generate  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402


def run_ours(decoder, prompt_ids, max_tokens) -> dict:
    ids, stats = decoder.generate(prompt_ids, max_tokens=max_tokens)
    return {
        "tokens": stats.generated_tokens,
        "decode_seconds": stats.decode_seconds,
        "tokens_per_second": stats.tokens_per_second,
        "time_to_first_token": stats.time_to_first_token,
        "acceptance_rate": stats.acceptance_rate,
        "acceptance_per_depth": stats.acceptance_per_depth,
        "tokens_per_cycle": stats.tokens_per_cycle,
        "proposed": stats.proposed,
        "accepted": stats.accepted,
        "accepted_per_depth": stats.accepted_per_depth,
        "proposed_per_depth": stats.proposed_per_depth,
        "depth": stats.depth,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "prefilled_tokens": stats.prefilled_tokens,
        "prefill_seconds": stats.prefill_seconds,
        "text": decoder.adapter.tokenizer.decode(ids),
    }


def run_mlx_lm(adapter, prompt_ids, max_tokens, sampler_cfg, seed) -> dict:
    mx.random.seed(seed)
    sampler = make_sampler(
        temp=sampler_cfg.temperature, top_p=sampler_cfg.top_p, top_k=sampler_cfg.top_k, min_p=sampler_cfg.min_p
    )
    times, n, text = [], 0, ""
    t0 = time.perf_counter()
    for resp in stream_generate(adapter.model, adapter.tokenizer, mx.array(prompt_ids), max_tokens=max_tokens, sampler=sampler):
        times.append(time.perf_counter())
        # mlx-lm counts the EOS token in its final response; our lanes do not output it.
        n = resp.generation_tokens - (resp.finish_reason == "stop")
        text += resp.text
    decode = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "tokens": n,
        "decode_seconds": decode,
        "tokens_per_second": (n - 1) / decode if decode > 0 else 0.0,
        "time_to_first_token": times[0] - t0 if times else 0.0,
        "text": text,
    }


# One load per checkpoint and process: bench_grid.py and --context run main() several times, and a
# GPU load (kernels checked, layers compiled) costs more than a short paired run.
_LOADED: dict = {}


def loaded_adapter(model, hidden_variant, drafter):
    key = (str(model), hidden_variant, drafter)
    if key not in _LOADED:
        _LOADED[key] = load_adapter(model, hidden_variant=hidden_variant, drafter=drafter)
    return _LOADED[key]


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


def add_sampler_arguments(ap: argparse.ArgumentParser, d) -> None:
    """The sampler's flags, defaulting to the app's settings `d` (here and in bench_race.py, whose
    lanes must decode what this benchmark's do)."""
    ap.add_argument("--temperature", type=float, default=d.temperature)
    ap.add_argument("--top-p", type=float, default=d.top_p)
    ap.add_argument("--top-k", type=int, default=d.top_k)
    ap.add_argument("--min-p", type=float, default=d.min_p)
    ap.add_argument("--depth", default=str(d.depth))


def sampler_and_prompts(args):
    """The sampler of add_sampler_arguments' flags, and the user messages of --prompt and
    --prompts-file (one a line), in that order."""
    prompts = list(args.prompt or [])
    if args.prompts_file:
        prompts += [line.strip() for line in Path(args.prompts_file).read_text().splitlines() if line.strip()]
    return SamplerConfig(args.temperature, args.top_p, args.top_k, args.min_p), prompts or ["Define the word harbor."]


def main(argv=None) -> int:
    d = Settings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(d.model))
    ap.add_argument("--prompt", action="append", help="user message (repeatable: runs cycle through them)")
    ap.add_argument("--prompts-file", help="one user message per line (added to --prompt)")
    ap.add_argument("--raw", action="store_true", help="use the prompt as raw text, without the chat template")
    ap.add_argument("--max-tokens", type=int, default=128)
    add_sampler_arguments(ap, d)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hidden-variant", choices=["pre_norm", "post_norm"], default=d.hidden_variant)
    ap.add_argument("--drafter", default=None, help="the drafter's checkpoint when it is kept apart (Gemma 4)")
    ap.add_argument("--no-mlx-lm", action="store_true", help="skip the mlx_lm.stream_generate lane")
    ap.add_argument("--context", type=int, action="append", metavar="N",
                    help="pad each prompt to about N tokens (repeatable: the whole paired benchmark runs "
                         "per context and the report has a 'contexts' table of speed-ups)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    if args.context and len(args.context) > 1:
        return per_context(args, argv)

    depth = "auto" if args.depth == "auto" else int(args.depth)
    sampler, prompts = sampler_and_prompts(args)
    print(describe_runtime(), file=sys.stderr)
    adapter = loaded_adapter(args.model, args.hidden_variant, args.drafter)
    print(adapter.describe(), file=sys.stderr)
    context = args.context[0] if args.context else None
    encoded = [
        adapter.tokenizer.encode(p) if args.raw
        else padded_chat_prompt(adapter, p, context) if context
        else chat_prompt_ids(adapter, [{"role": "user", "content": p}])
        for p in prompts
    ]
    max_depth = depth if depth != "auto" else Settings().max_depth
    # The cost model at the context it is used at (the bucket of the prompts' length).
    costs = measure_costs(adapter, max_width=max(max_depth + 1, 4), context=len(encoded[0]))

    lanes = {
        "ar": lambda ids, seed: run_ours(AutoregressiveDecoder(adapter, sampler=sampler, seed=seed), ids, args.max_tokens),
        "mtp": lambda ids, seed: run_ours(SpeculativeDecoder(adapter, sampler=sampler, seed=seed, depth=depth), ids, args.max_tokens),
    }
    if not args.no_mlx_lm:
        lanes["mlx_lm"] = lambda ids, seed: run_mlx_lm(adapter, ids, args.max_tokens, sampler, seed)
    names = list(lanes)
    for name in names:  # warm-up, untimed
        lanes[name](encoded[0], 10_000)
    runs = {name: [] for name in names}
    for r in range(args.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        ids = encoded[r % len(encoded)]
        for name in order:
            gc.collect()  # the previous lane's caches must not count towards this one's peak
            mx.reset_peak_memory()  # peak of this run alone (weights included)
            runs[name].append({**lanes[name](ids, r), "peak_memory_bytes": mx.get_peak_memory()})
        line = "  ".join(f"{n} {runs[n][-1]['tokens_per_second']:.1f} tok/s" for n in names)
        print(f"repeat {r + 1}/{args.repeats}: {line}", file=sys.stderr)

    report = {
        "platform": runtime_info(),
        "model": {"path": str(args.model), "describe": adapter.describe(), "contract": adapter.contract.summary() if hasattr(adapter, "contract") else None,
                  **({"pair": adapter.report()} if hasattr(adapter, "report") else {})},
        "sampler": {**sampler.__dict__, "seed_per_repeat": "repeat index"},
        "prompts": prompts,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "prompt_tokens": [len(e) for e in encoded],
        "context": context,
    }
    for name in names:
        report[name] = {
            "tokens_per_second": median_of(runs[name], "tokens_per_second"),
            "tokens": median_of(runs[name], "tokens"),
            "decode_seconds": median_of(runs[name], "decode_seconds"),
            "time_to_first_token": median_of(runs[name], "time_to_first_token"),
            "runs_tokens_per_second": [r["tokens_per_second"] for r in runs[name]],
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in runs[name]),
            "sample_text": runs[name][0]["text"][:400],
        }
    # Paired ratios: per repeat, then the median.
    speedups = [m["tokens_per_second"] / a["tokens_per_second"] for m, a in zip(runs["mtp"], runs["ar"])]
    proposed = sum(r["proposed"] for r in runs["mtp"])
    accepted = sum(r["accepted"] for r in runs["mtp"])
    per_depth_acc, per_depth_prop = [], []
    for r in runs["mtp"]:
        for i, (a, p) in enumerate(zip(r["accepted_per_depth"], r["proposed_per_depth"])):
            while len(per_depth_acc) <= i:
                per_depth_acc.append(0)
                per_depth_prop.append(0)
            per_depth_acc[i] += a
            per_depth_prop[i] += p
    acc_depth = [a / p if p else 0.0 for a, p in zip(per_depth_acc, per_depth_prop)]
    report["mtp"].update({
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "acceptance_per_depth": acc_depth,
        "tokens_per_cycle": median_of(runs["mtp"], "tokens_per_cycle"),
        "depth": depth,
    })
    used_depth = depth if depth != "auto" else max(1, len(acc_depth))
    report["speedup_vs_ar"] = statistics.median(speedups)
    report["speedups_per_repeat"] = speedups
    # Pooled over all runs (total decode tokens / total decode time per lane): with many short
    # replies the per-pair ratios are noisy, and long replies weigh as much as they take.
    pooled = {n: sum(r["tokens"] - 1 for r in runs[n]) / sum(r["decode_seconds"] for r in runs[n]) for n in names}
    report["pooled_tokens_per_second"] = pooled
    report["speedup_vs_ar_pooled"] = pooled["mtp"] / pooled["ar"]
    if "mlx_lm" in runs:
        report["ar_vs_mlx_lm"] = statistics.median(
            a["tokens_per_second"] / m["tokens_per_second"] for a, m in zip(runs["ar"], runs["mlx_lm"])
        )
    # What a cycle really cost in these replies, in AR tokens of the paired AR run (issue 32 item 4:
    # the calibration's cycle against the decoding's own): decode seconds over cycles, times AR tok/s.
    observed = [m["decode_seconds"] / ((m["tokens"] - 1) / m["tokens_per_cycle"]) * a["tokens_per_second"]
                for m, a in zip(runs["mtp"], runs["ar"]) if m["tokens_per_cycle"] and m["tokens"] > 1]
    report["cost_model"] = {
        **costs.as_dict(),
        "cycle_observed_in_ar_tokens": statistics.median(observed) if observed else None,
        "expected_tokens_per_cycle": expected_tokens(acc_depth, used_depth) if acc_depth else None,
        "predicted_speedup": predicted_speedup(costs, acc_depth, used_depth) if acc_depth else None,
    }
    out = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(out)
    summary = {k: report[k] for k in ("speedup_vs_ar", "speedup_vs_ar_pooled", "ar_vs_mlx_lm") if k in report}
    summary.update({
        "ar_tok_s": report["ar"]["tokens_per_second"],
        "mtp_tok_s": report["mtp"]["tokens_per_second"],
        "mlx_lm_tok_s": report.get("mlx_lm", {}).get("tokens_per_second"),
        "acceptance": report["mtp"]["acceptance_rate"],
        "acceptance_per_depth": acc_depth,
        "tokens_per_cycle": report["mtp"]["tokens_per_cycle"],
        "predicted_speedup": report["cost_model"]["predicted_speedup"],
        "verify_costs": report["cost_model"]["verify_width"],
        "mtp_step_cost": report["cost_model"]["mtp_step"],
        "cycle_calibrated_vs_observed": [report["cost_model"]["cycle"].get(str(used_depth)),
                                         report["cost_model"]["cycle_observed_in_ar_tokens"]],
    })
    print(json.dumps(summary, indent=2))
    return 0


def per_context(args, argv) -> int:
    """One paired benchmark per --context, each in this process on the one loaded model, then a
    table of MTP/AR per context relative to the shortest."""
    import contextlib
    import io
    import tempfile

    rows = []
    base = [a for i, a in enumerate(argv or sys.argv[1:]) if not (a == "--context" or (i and (argv or sys.argv[1:])[i - 1] == "--context"))]
    base = [a for a in base if not a.startswith("--context=")]
    if "--json" in base:
        j = base.index("--json")
        base = base[:j] + base[j + 2:]
    reports = {}
    for n in args.context:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            with contextlib.redirect_stdout(io.StringIO()):
                main(base + ["--context", str(n), "--json", f.name])
            reports[n] = json.loads(Path(f.name).read_text())
        r = reports[n]
        rows.append({"context": n, "prompt_tokens": statistics.median(r["prompt_tokens"]),
                     "ar_tok_s": r["ar"]["tokens_per_second"], "mtp_tok_s": r["mtp"]["tokens_per_second"],
                     "mlx_lm_tok_s": r.get("mlx_lm", {}).get("tokens_per_second"),
                     "speedup_vs_ar": r["speedup_vs_ar"], "speedup_vs_ar_pooled": r["speedup_vs_ar_pooled"],
                     "ar_vs_mlx_lm": r.get("ar_vs_mlx_lm"),
                     "acceptance_per_depth": r["mtp"]["acceptance_per_depth"],
                     "ttft_ar": r["ar"]["time_to_first_token"], "ttft_mtp": r["mtp"]["time_to_first_token"],
                     "predicted_speedup": r["cost_model"]["predicted_speedup"]})
    first = rows[0]["speedup_vs_ar_pooled"]
    for row in rows:
        row["relative_to_shortest"] = row["speedup_vs_ar_pooled"] / first if first else None
    out = {"contexts": rows, "reports": {str(k): v for k, v in reports.items()}}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
