"""Trunk precision: float (shipped) vs 8-bit vs 4-bit trunk, measured in MLX through the
project's adapter: held-out loss on reference answers and teacher-forced depth-1 acceptance
(T=0.6 and T=0 filters) on the model's own saved replies.

    python scripts/demo_model/measure_quant.py --run artifacts/demo/runs/M1 --json artifacts/demo/measure_quant.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
import adapters  # noqa: E402,F401
from adapters import load_adapter  # noqa: E402
import mlx.core as mx  # noqa: E402

import export as E  # noqa: E402


def probs(logits, temp, top_k=20, top_p=0.95):
    x = np.asarray(logits, dtype=np.float64)
    if temp <= 0:
        out = np.zeros_like(x)
        out[np.arange(len(x)), x.argmax(-1)] = 1
        return out
    x = x / temp
    kth = np.sort(x, -1)[:, -top_k][:, None]
    x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    order = np.argsort(-p, -1)
    sp = np.take_along_axis(p, order, -1)
    drop = (np.cumsum(sp, -1) - sp) >= top_p
    sp[drop] = 0
    out = np.zeros_like(p)
    np.put_along_axis(out, order, sp, -1)
    return out / out.sum(-1, keepdims=True)


def evaluate(path, samples, refs, tok):
    ad = load_adapter(path)
    acc = {0.6: [0, 0], 0.0: [0, 0]}
    for pids, rids in samples:
        seq = pids + rids
        x = mx.array([seq])
        logits, h, _ = ad.forward(x, ad.make_cache())
        g = ad.mtp_forward(h[:, :-1], x[:, 1:], ad.make_mtp_cache())
        q = np.array(ad.lm_head(g)[0])
        lg = np.array(logits[0])
        i0 = len(pids) - 1
        for t in acc:
            P = probs(lg[i0 + 1: len(seq) - 1], t)
            Q = probs(q[i0: len(seq) - 2], t)
            acc[t][0] += np.minimum(P, Q).sum()
            acc[t][1] += len(P)
    size = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return {"d1_T0.6": round(acc[0.6][0] / acc[0.6][1], 4), "d1_T0": round(acc[0.0][0] / acc[0.0][1], 4),
            "heldout_loss": heldout_loss(ad, refs, tok), "size_MiB": round(size / 2**20, 2)}


def heldout_loss(ad, refs, tok) -> float:
    """Mean next-token NLL of the trunk on the held-out reference answers (nats/token)."""
    nll = n = 0
    for r in refs:
        pi = tok.encode(f"<|im_start|>user\n{r['prompt']}<|im_end|>\n<|im_start|>assistant\n")
        ai = tok.encode(r["reference"] + "<|im_end|>")
        logits, _, _ = ad.forward(mx.array([pi + ai]), ad.make_cache())
        lp = logits[0, len(pi) - 1: -1].astype(mx.float32)
        lse = mx.logsumexp(lp, axis=-1)
        nll += float(mx.sum(lse - mx.take_along_axis(lp, mx.array(ai)[:, None], axis=-1)[:, 0]))
        n += len(ai)
    return round(nll / n, 4)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="artifacts/demo/runs/M1")
    ap.add_argument("--text-config", default=str(HERE / "configs" / "h256_L12_i2.json"))
    ap.add_argument("--tokenizer", default="artifacts/demo/tokenizer")
    ap.add_argument("--corpus", default="artifacts/demo/corpus")
    ap.add_argument("--data", default="artifacts/demo/data")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from tokenizer import Encoder

    enc = Encoder(a.tokenizer)
    res = json.loads(Path(a.run + ".json").read_text())
    ev = {e["prompt"]: e for f in ("eval_prompts.json", "eval_prompts_seen.json")
          for e in json.loads((Path(a.data) / f).read_text())}
    samples = [(ev[s["prompt"]]["ids"], s["reply_ids"]) for s in res["samples"] + res.get("seen_samples", [])
               if s["prompt"] in ev]
    refs = [json.loads(l) for l in open(Path(a.corpus) / "eval_prompts.jsonl")]
    refs = [r for r in refs if r["reference"]][:150]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for bits in (0, 8, 4):
            p = E.export(a.run, a.text_config, a.tokenizer, Path(tmp) / f"t{bits}", mtp_bits=8,
                         trunk_bits=bits or None, hidden_variant="post_norm")
            out[f"trunk_{bits or 'float'}"] = evaluate(p, samples, refs, enc)
            print(bits, out[f"trunk_{bits or 'float'}"], flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
