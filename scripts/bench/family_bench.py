#!/usr/bin/env python3
"""The CPU benchmark of each family on a tiny random checkpoint: MTP/AR and the cycle costs.

    flock -x /work/locks/cpu.lock .venv/bin/python scripts/bench/family_bench.py --out docs/bench

For each family (qwen3_5, qwen3_5_moe, qwen3_next) a random checkpoint of one shape (hidden 128,
8 layers, for the MoE ones 8 experts with 2 routed per token; float, the head wired to copy the
trunk's embedding path so that drafts are accepted some of the time, as the tests do) is made by
scripts/checkpoints/make_tiny_checkpoint.py and run through scripts/bench/bench.py (greedy, depth 2, AR / MTP /
mlx_lm lanes interleaved, the cost model with whole cycles at depths 1-3). Random weights: the
acceptance is the head trick's, not a trained model's; the cycle costs are what the numbers are
for (how the MoE layers change a verify against a decode step on this CPU).

gemma4_small / gemma4_large: a Gemma 4 pair (scripts/checkpoints/tiny_gemma4.py, the
"aligned" drafter that copies part of the backbone; hidden 256, 16 layers): E2B-like with the centroid head, 31B-like
with the full head. The drafter's step cost is the cost model's mtp_step.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (first: the BLAS preload)
from scripts.bench import bench  # noqa: E402
from scripts.checkpoints.make_tiny_checkpoint import make_tiny_checkpoint  # noqa: E402
from tests._engine_helpers import make_mixed_head  # noqa: E402

SHAPE = dict(hidden_size=128, num_layers=8, full_attention_interval=4, num_heads=4, num_kv_heads=2, head_dim=32,
             intermediate_size=256, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=32,
             linear_value_head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
             shared_expert_intermediate_size=64, bits=None, mtp_bits=None, frequent_tokens=0, logit_std=2.0,
             residual_gain=0.7, seed=0)
GEMMA4_SHAPE = dict(hidden_size=256, num_layers=16, vocab_size=512, sliding_window=16, seed=0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/bench")
    ap.add_argument("--families", nargs="*", default=["qwen3_5", "qwen3_5_moe", "qwen3_next"],
                    help="also: gemma4_small, gemma4_large")
    ap.add_argument("--repeats", type=int, default=8)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in a.families:
            if family.startswith("gemma4_"):
                shape = {**GEMMA4_SHAPE, "size": family.split("_")[1]}
                path = make_tiny_checkpoint(Path(tmp) / family, family="gemma4", bits=None, gemma4=shape)
                head = "aligned assistant drafter (scripts/checkpoints/tiny_gemma4.py)"
            else:
                shape, head = SHAPE, "fc copies the embedding path (tests' mixed head)"
                path = make_mixed_head(make_tiny_checkpoint(Path(tmp) / family, family=family, **SHAPE))
            target = out / f"cpu-family-{family}.json"
            bench.main(["--model", str(path), "--depth", "2", "--temperature", "0", "--top-p", "1", "--top-k", "0",
                        "--max-tokens", "128", "--repeats", str(a.repeats), "--hidden-variant", "post_norm",
                        "--prompt", "Hi there", "--prompt", "What is the sea?", "--json", str(target)])
            r = json.loads(target.read_text())
            r["checkpoint"] = {"family": family, **shape, "head": head}
            target.write_text(json.dumps(r, indent=2))
            summary[family] = {"mtp_over_ar": r["speedup_vs_ar_pooled"], "ar_vs_mlx_lm": r.get("ar_vs_mlx_lm"),
                               "acceptance_per_depth": r["mtp"]["acceptance_per_depth"],
                               "verify_width": r["cost_model"]["verify_width"], "mtp_step": r["cost_model"]["mtp_step"],
                               "cycle": r["cost_model"]["cycle"]}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
