"""Per-step CPU costs of candidate shapes through the project's own engine path.

For each shape, a random-weight float checkpoint in the Qwythos layout is written with
scripts/checkpoints/make_tiny_checkpoint.py, loaded with adapters.load_adapter (fp32 on the CPU, fast
BLAS), and core.calibrate.measure_costs times: an AR step (1 token), a verify of width 2/3/4 (one
trunk forward capturing per-position GDN state, as the engine does), and an MTP step (head +
lm_head), all relative to the AR step, at a 64-token context.  Several rounds, median.
The predicted speedup uses the per-depth acceptance given with --accept.

    python scripts/demo_model/engine_costs.py --shapes 256x12i2 256x12i4 384x12i2 --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
import adapters  # noqa: E402,F401  (BLAS preload first)
from adapters import load_adapter  # noqa: E402
from core import calibrate, costs as C  # noqa: E402
from scripts.checkpoints.make_tiny_checkpoint import make_tiny_checkpoint  # noqa: E402


def shape_ckpt(spec, root):
    s, _, iv = spec.partition("i")
    parts = [int(x) for x in s.split("x")]
    h, l = parts[0], parts[1]
    inter = parts[2] if len(parts) > 2 else 3 * h
    nh = h // 64
    return make_tiny_checkpoint(
        Path(root) / spec, hidden_size=h, num_layers=l, full_attention_interval=int(iv or 4), vocab_size=8192,
        num_heads=nh, num_kv_heads=max(1, nh // 2), head_dim=64, intermediate_size=inter,
        linear_num_value_heads=h // 64, linear_num_key_heads=max(1, h // 128), linear_key_head_dim=64,
        linear_value_head_dim=64, bits=None, mtp_bits=8, group_size=64, dtype="float32",
        hidden_variant="post_norm")


def measure(path, rounds=5, repeats=15):
    ad = load_adapter(path)
    rows = []
    for _ in range(rounds):
        C._CACHE.pop(ad, None)
        rows.append(calibrate.measure_costs(ad, max_width=4, repeats=repeats))
    med = lambda xs: statistics.median(xs)
    return {
        "ar_step_ms": round(med([r.ar_step_seconds for r in rows]) * 1000, 2),
        "verify_rel": {w: round(med([r.verify[w] for r in rows]), 3) for w in (2, 3, 4)},
        "mtp_rel": round(med([r.mtp_step for r in rows]), 3),
    }


def predicted(row, acc):
    out = {}
    for D in (1, 2, 3):
        out[f"D{D}"] = round(C.expected_tokens(acc, D) / (row["verify_rel"][D + 1] + D * row["mtp_rel"]), 2)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["256x12i2", "256x12i4", "256x8i2", "256x16i2", "384x12i2"])
    ap.add_argument("--model", nargs="*", default=[], help="also measure these checkpoints")
    ap.add_argument("--accept", nargs=3, type=float, default=[0.75, 0.72, 0.65])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    res = []
    with tempfile.TemporaryDirectory() as tmp:
        targets = [(s, None) for s in a.shapes] + [(m, m) for m in a.model]
        for name, path in targets:
            p = path or shape_ckpt(name, tmp)
            row = {"shape": name, **measure(p, rounds=a.rounds)}
            row["predicted_speedup"] = predicted(row, a.accept)
            res.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"accept": a.accept, "rows": res}, indent=1))
