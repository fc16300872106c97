#!/usr/bin/env python3
"""MTP against AR measured at a chosen acceptance, on random weights: the speed-up the cost model
projects, timed instead.

    python scripts/gpu/gpu_oracle.py --model /tmp/q9b --json out/oracle.json [--tokens 256] [--repeats 3]

Why: on random weights the head's drafts are never accepted, so at the 9B shape MTP's speed was
only projected from synchronised parts (a verify of d + 1 positions plus d head steps, each timed
alone). In a real cycle those parts overlap (the drafts run on the GPU while the host builds the
verify's graph), and on the demo model the projection priced MTP ~12 % too dear
(docs/bench/2026-12-03/GPU.md, "calibrated twice"). Here the real cycle runs, with every part the
engine runs (the head's draft step, its output projection and draw, the verify, the rollback), and
only which drafts are right is chosen: an oracle knows greedy AR's tokens, and at each draft
depth j it lets the head's draft be the right token with probability a_j given the drafts before
it were right (the Qwythos head's 0.93 / 0.90 / 0.85 by default), else a wrong one. It does so by
overwriting one column of the head's logits (three small launches over the vocabulary, ~0.01 ms
against a ~1 ms head step; the head's whole step still runs, its result feeds the overwrite). Greedy verify then accepts exactly the
right drafts, so MTP's tokens must equal AR's, which is checked.

Each repeat times AR, then MTP at depths 1, 2, 3, on one prompt at --context tokens, and the ratio
is each repeat's own (MTP tok/s over that repeat's AR tok/s), reported as the median of repeats;
the acceptance each depth actually saw is reported beside the one asked for.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402

from adapters import load_adapter  # noqa: E402
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder  # noqa: E402
from core.chat import padded_chat_prompt  # noqa: E402
from core.costs import expected_tokens  # noqa: E402

GREEDY = SamplerConfig(0.0, 1.0, 0, 0.0)
QWYTHOS_ACCEPTANCE = (0.93, 0.90, 0.85)
RIGHT = 1e4   # the right draft's logit: above any a random head writes


class OracleHead:
    """The adapter with the head's drafts steered: the d-th draft of a cycle is `truth`'s token at
    its position with probability accept[d - 1] while every earlier draft of the cycle was right,
    else another token. Everything else is the adapter's own (attributes pass through)."""

    def __init__(self, adapter, truth, accept, seed: int = 0):
        self._ad, self._truth, self._accept = adapter, list(truth), accept
        self._rng = random.Random(seed)
        self._depth, self._right = 0, True

    def __getattr__(self, name):
        return getattr(self._ad, name)

    def draft_step(self, draft, cache, hidden, tokens):
        g, logits = self._ad.draft_step(draft, cache, hidden, tokens)
        # The head has now seen positions up to draft.offset - 1 (token t[n + 1] with the hidden at
        # n), so its logits predict the token at draft.offset + 1 of the whole sequence.
        at = draft.offset + 1
        self._depth += 1
        p = self._accept[min(self._depth, len(self._accept)) - 1]
        self._right = self._right and at < len(self._truth) and self._rng.random() < p
        want = self._truth[at] if at < len(self._truth) else 0
        if not self._right:
            want = (want + 1) % logits.shape[-1]
        col = mx.arange(logits.shape[-1]) == want
        return g, mx.where(col, mx.array(RIGHT, logits.dtype), logits)

    def end_cycle(self, draft, steps):
        self._depth, self._right = 0, True
        return self._ad.end_cycle(draft, steps)


def lane(decoder, ids, tokens):
    out, st = decoder.generate(ids, max_tokens=tokens)
    return list(out), st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--accept", type=float, nargs="+", default=list(QWYTHOS_ACCEPTANCE),
                    help="acceptance at draft depths 1, 2, 3 given the drafts before were right")
    a = ap.parse_args(argv)
    ad = load_adapter(a.model)
    print(f"loaded: {ad.describe()}", flush=True)
    ids = padded_chat_prompt(ad, "Summarise the text above in one sentence.", a.context)
    lane(AutoregressiveDecoder(ad, sampler=GREEDY), ids, 16)   # warm: kernels compiled, traces made
    truth, _ = lane(AutoregressiveDecoder(ad, sampler=GREEDY), ids, a.tokens)
    full = list(ids) + truth
    for d in (1, 2, 3):
        lane(SpeculativeDecoder(OracleHead(ad, full, a.accept), sampler=GREEDY, depth=d), ids, 16)
    rows = {str(d): {"ratios": [], "tok_s": [], "acceptance_per_depth": [], "equal": True} for d in (1, 2, 3)}
    ar_tok_s = []
    for r in range(a.repeats):
        out, st = lane(AutoregressiveDecoder(ad, sampler=GREEDY), ids, a.tokens)
        ar_tok_s.append(st.tokens_per_second)
        for d in (1, 2, 3):
            mtp, ms = lane(SpeculativeDecoder(OracleHead(ad, full, a.accept, seed=r), sampler=GREEDY, depth=d),
                           ids, a.tokens)
            row = rows[str(d)]
            row["tok_s"].append(ms.tokens_per_second)
            row["ratios"].append(ms.tokens_per_second / st.tokens_per_second)
            row["acceptance_per_depth"].append(list(getattr(ms, "acceptance_per_depth", []) or []))
            row["equal"] = row["equal"] and mtp == out == truth
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "mlx": mx.__version__, "device": str(mx.default_device()), "model": a.model,
              "describe": ad.describe(), "context": len(ids), "tokens": a.tokens, "accept": a.accept,
              "ar_tok_s": ar_tok_s, "depths": {}}
    for d, row in rows.items():
        row["mtp_vs_ar"] = statistics.median(row["ratios"])
        row["expected_tokens_a_cycle"] = expected_tokens(list(a.accept), int(d))
        report["depths"][d] = row
        print(f"depth {d}: MTP/AR {row['mtp_vs_ar']:.2f}x (repeats " + ", ".join(f"{x:.2f}" for x in row["ratios"])
              + f"), {statistics.median(row['tok_s']):.1f} tok/s against AR {statistics.median(ar_tok_s):.1f}; "
              f"acceptance seen {row['acceptance_per_depth'][-1]}; tokens equal AR's: {row['equal']}", flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=1))
    return 0 if all(r["equal"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
