"""Depth-1 acceptance of EXPORTED checkpoints (shipped precision, MLX, through the project's
adapter, on the CPU), teacher-forced on the probe's saved replies (self_distill.py gen ->
eval_replies.json): T=0.6 filter on the T=0.6 replies, argmax on the greedy replies; plus the
held-out answer loss of the trunk (measure_quant.py's definition, first 150 references).

    python scripts/demo_model/measure_export.py models/demo artifacts/demo/candidate \
        --replies artifacts/demo/sd/eval_replies.json --json artifacts/demo/measure_export.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from measure_quant import heldout_loss, probs  # noqa: E402  (also puts the repo on sys.path, loads MLX)
from adapters import load_adapter  # noqa: E402
import mlx.core as mx  # noqa: E402


def accept(path, sets, tags):
    ad = load_adapter(path)
    out = {}
    for tag in tags:
        temp = 0.6 if tag.endswith("T0.6") else 0.0
        e = sets[tag]
        a = n = 0.0
        for pids, rids in zip(e["prompts"], e["replies"]):
            seq = list(pids) + list(rids)
            if len(rids) < 2:
                continue
            x = mx.array([seq])
            logits, h, _ = ad.forward(x, ad.make_cache())
            g = ad.mtp_forward(h[:, :-1], x[:, 1:], ad.make_mtp_cache())
            q = np.array(ad.lm_head(g)[0].astype(mx.float32))
            lg = np.array(logits[0].astype(mx.float32))
            i0 = len(pids) - 1  # same positions as the probe: targets from the 2nd reply token on
            P = probs(lg[i0 + 1: len(seq) - 1], temp)
            Q = probs(q[i0: len(seq) - 2], temp)
            a += np.minimum(P, Q).sum()
            n += len(P)
        out[tag] = {"d1": round(a / n, 4), "positions": int(n)}
        print(path, tag, out[tag], flush=True)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--replies", default="artifacts/demo/sd/eval_replies.json")
    ap.add_argument("--tags", nargs="+", default=["T0.6", "T0.0"], help="also seen_T0.6 seen_T0.0")
    ap.add_argument("--tokenizer", default="artifacts/demo/tokenizer")
    ap.add_argument("--corpus", default="artifacts/demo/corpus")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from tokenizer import Encoder

    enc = Encoder(a.tokenizer)
    sets = json.loads(Path(a.replies).read_text())
    refs = [json.loads(l) for l in open(Path(a.corpus) / "eval_prompts.jsonl")]
    refs = [r for r in refs if r["reference"]][:150]
    res = {}
    for p in a.paths:
        r = accept(p, sets, a.tags)
        r["heldout_loss"] = heldout_loss(load_adapter(p), refs, enc)
        print(p, "heldout_loss", r["heldout_loss"], flush=True)
        res[p] = r
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
