#!/usr/bin/env python3
"""What measuring the waterfall costs: the same replies with the per-cycle timing on (one cycle
in 8 synced and timed phase by phase, core/waterfall.py) and off, paired and interleaved.

    python scripts/bench/bench_waterfall.py --model models/demo --json docs/bench/cpu-waterfall-overhead-demo.json

Greedy, so both settings decode the same tokens; per lane, decode tok/s pooled over the prompts
and repeats (tokens after the first over decode seconds, model load and a warm-up excluded).
The overhead is 1 - on/off; on a shared machine that pooled ratio drifts by more than the
effect, so the same replies also give a paired figure that does not: the timed cycles' mean
duration against the other cycles' (interleaved, one in 8), times the share of timed cycles
(`overhead_from_cycles`; the first cycle of every reply is a timed one, which makes it an upper
bound: a first cycle also catches the drafter up). It also reports how closely the parts add up to the lane's own
compute time (the figure the browser test checks within 5 %).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402  (first: the BLAS preload must precede mlx)
from adapters import load_adapter  # noqa: E402
from adapters.runtime import runtime_info  # noqa: E402
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt  # noqa: E402
from core.waterfall import SAMPLE_EVERY  # noqa: E402

PROMPTS_FILE = Path(__file__).resolve().parents[1] / "demo_model" / "everyday_prompts.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    adapter = load_adapter(Path(a.model))
    greedy = SamplerConfig(temperature=0)
    prompts = [line.strip() for line in PROMPTS_FILE.read_text().splitlines() if line.strip()][: a.prompts]
    prompts = [chat_prompt(adapter, [{"role": "user", "content": p}]) for p in prompts]
    lanes = {"ar": AutoregressiveDecoder(adapter, sampler=greedy),
             "mtp": SpeculativeDecoder(adapter, sampler=greedy, depth=a.depth)}
    for lane in lanes.values():
        lane.generate(prompts[0], max_tokens=32)                       # warm-up, untimed
    pooled = {(name, on): [0, 0.0] for name in lanes for on in (True, False)}
    per_repeat = {name: [] for name in lanes}   # on/off of each repeat: the noise around the pooled figure
    sums = []
    cycles = {name: [0.0, 0, 0.0, 0] for name in lanes}   # timed cycles' seconds, count; the others'
    for r in range(a.repeats):
        mark = {k: list(v) for k, v in pooled.items()}
        for i, prompt in enumerate(prompts):
            order = (True, False) if (r + i) % 2 == 0 else (False, True)
            for name, lane in lanes.items():
                out = {}
                for on in order:
                    lane.waterfall_every = SAMPLE_EVERY if on else 0
                    ids, s = lane.generate(prompt, max_tokens=a.max_tokens)
                    out[on] = ids
                    pooled[(name, on)][0] += s.generated_tokens - 1
                    pooled[(name, on)][1] += s.decode_seconds
                    if on:
                        sums.append(sum(s.waterfall.values()) / s.compute_seconds)
                        (ts, tn), (us, un) = lane.last_waterfall.cycle_seconds()
                        cycles[name] = [cycles[name][0] + ts, cycles[name][1] + tn,
                                        cycles[name][2] + us, cycles[name][3] + un]
                assert out[True] == out[False], "the timing changed a token"
        for name in lanes:
            tps = {on: (pooled[(name, on)][0] - mark[(name, on)][0]) / (pooled[(name, on)][1] - mark[(name, on)][1])
                   for on in (True, False)}
            per_repeat[name].append(tps[True] / tps[False])
    result = {}
    for name in lanes:
        on = pooled[(name, True)][0] / pooled[(name, True)][1]
        off = pooled[(name, False)][0] / pooled[(name, False)][1]
        result[name] = {"tokens_per_second_on": on, "tokens_per_second_off": off, "on_over_off": on / off,
                        "overhead": 1 - on / off, "tokens": pooled[(name, True)][0],
                        "on_over_off_per_repeat": per_repeat[name]}
        ts, tn, us, un = cycles[name]
        # Inside the same replies, so the machine's drift cancels: a timed cycle's extra cost,
        # paid by 1 cycle in SAMPLE_EVERY, is the overhead on the decode's cycles.
        extra = (ts / tn) / (us / un) - 1
        result[name].update({"timed_cycle_seconds_mean": ts / tn, "other_cycle_seconds_mean": us / un,
                             "timed_cycles": tn, "other_cycles": un, "timed_cycle_extra": extra,
                             "overhead_from_cycles": extra * tn / (tn + un)})
    out = {"platform": runtime_info(), "model": adapter.describe(), "depth": a.depth, "sample_every": SAMPLE_EVERY,
           "prompts": len(prompts), "repeats": a.repeats, "max_tokens": a.max_tokens, "lanes": result,
           "parts_over_compute_seconds": {"min": min(sums), "max": max(sums)},
           "command": "python " + " ".join(sys.argv)}
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
