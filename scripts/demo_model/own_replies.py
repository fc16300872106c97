"""The model's OWN replies to the evaluation prompts, for teacher-forced acceptance
(measure_export.py --replies): the project's AR lane (exact sampling from the trunk) at
T=0.6 / top_p 0.95 / top_k 20 and greedy, on the prompts of an existing replies file.

A model whose trunk was changed (sweep 5 trains it with its head) must be measured on what it
says itself, not on the replies of the model it started from.  With --mtp-depth D the replies
come from the MTP lane instead (same distribution) and the engine's own acceptance per depth
over all of them is printed: what the race in the web app sees, not a teacher-forced average.

    python scripts/demo_model/own_replies.py artifacts/demo/cand_U1 \
        --prompts artifacts/demo/sd/eval_replies.json --out artifacts/demo/cand_U1.replies.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from adapters.runtime import preload_blas  # noqa: E402

preload_blas()
from adapters import load_adapter  # noqa: E402
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompts", default="artifacts/demo/sd/eval_replies.json")
    ap.add_argument("--tags", nargs="+", default=["T0.6", "T0.0"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--mtp-depth", type=int, default=0, help="> 0: the MTP lane at this depth")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ad = load_adapter(a.model)
    src = json.loads(Path(a.prompts).read_text())
    eos = ad.tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = {}
    for tag in a.tags:
        temp = 0.6 if tag.endswith("T0.6") else 0.0
        sampler = SamplerConfig(temperature=temp, top_p=0.95, top_k=20)
        lane = (SpeculativeDecoder(ad, sampler=sampler, depth=a.mtp_depth) if a.mtp_depth
                else AutoregressiveDecoder(ad, sampler=sampler))
        t0, replies = time.time(), []
        accepted, proposed = [0] * a.mtp_depth, [0] * a.mtp_depth
        for i, pids in enumerate(src[tag]["prompts"]):
            lane.seed = i
            ids, stats = lane.generate(list(pids), max_tokens=a.max_tokens)
            # the saved replies of the probe end with the end-of-turn token; generate drops it
            replies.append(ids + ([eos] if stats.finish_reason == "eos" else []))
            for d in range(a.mtp_depth):
                accepted[d] += stats.accepted_per_depth[d] if d < len(stats.accepted_per_depth) else 0
                proposed[d] += stats.proposed_per_depth[d] if d < len(stats.proposed_per_depth) else 0
        out[tag] = {"prompts": src[tag]["prompts"], "kinds": src[tag]["kinds"], "replies": replies}
        if a.mtp_depth:
            out[tag]["engine_acceptance"] = [round(x / max(y, 1), 4) for x, y in zip(accepted, proposed)]
            out[tag]["engine_proposed"] = proposed
        print(tag, len(replies), "replies", f"{time.time() - t0:.0f}s", out[tag].get("engine_acceptance", ""), flush=True)
    Path(a.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
