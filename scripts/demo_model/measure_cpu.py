"""CPU-side measurements on trained runs (PyTorch, fp32):

  * held-out loss: mean next-token CE of the trunk on the reference answers of the held-out
    conversations (the quality proxy used to pick the shipped run);
  * MTP head precision: per-depth acceptance with the head float vs 8-bit vs 4-bit
    (mx.quantize round trip, group 64), teacher-forced on the model's own T=0.6 replies that
    the GPU probe saved (`samples` in <run>.json), for T=0.6 and T=0 filters.

    python scripts/demo_model/measure_cpu.py --runs M1 R2_M1cont --json artifacts/demo/measure_cpu.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from blas import preload_openblas  # noqa: E402

preload_openblas()
import mlx.core as mx  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from train_torch import DemoModel, acceptance, load_state  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_head(model, bits, group_size=64):
    with torch.no_grad():
        for n, p in model.mtp.named_parameters():
            if p.dim() == 2 and any(l in n for l in LINEARS):
                w = mx.array(p.detach().float().numpy())
                q = mx.quantize(w, group_size=group_size, bits=bits)
                d = mx.dequantize(*q, group_size=group_size, bits=bits)
                p.copy_(torch.from_numpy(np.array(d)))


def heldout_loss(model, tok, refs):
    tot, n = 0.0, 0
    with torch.no_grad():
        for r in refs:
            p = f"<|im_start|>user\n{r['prompt']}<|im_end|>\n<|im_start|>assistant\n"
            pi = tok.encode(p).ids
            ai = tok.encode(r["reference"] + "<|im_end|>").ids
            ids = torch.tensor([pi + ai])
            logits, _ = model.trunk(ids)
            lp = F.cross_entropy(logits[0, len(pi) - 1: -1].float(), ids[0, len(pi):], reduction="sum")
            tot += lp.item()
            n += len(ai)
    return tot / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--runs-dir", default="artifacts/demo/runs")
    ap.add_argument("--text-config", default=str(HERE / "configs" / "h256_L12_i2.json"))
    ap.add_argument("--corpus", default="artifacts/demo/corpus")
    ap.add_argument("--data", default="artifacts/demo/data")
    ap.add_argument("--tokenizer", default="artifacts/demo/tokenizer")
    ap.add_argument("--bits", nargs="+", type=int, default=[0, 8, 4])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(a.tokenizer) / "tokenizer.json"))
    tc = json.loads(Path(a.text_config).read_text())
    refs = [json.loads(l) for l in open(Path(a.corpus) / "eval_prompts.jsonl")]
    refs = [r for r in refs if r["reference"]]
    ev = {e["prompt"]: e for e in json.loads((Path(a.data) / "eval_prompts.json").read_text())}
    evs = {e["prompt"]: e for e in json.loads((Path(a.data) / "eval_prompts_seen.json").read_text())}
    out = {}
    for run in a.runs:
        res = json.loads((Path(a.runs_dir) / f"{run}.json").read_text())
        variant = res["args"]["variant"]
        samples = [(ev.get(s["prompt"]) or evs.get(s["prompt"]), s["reply_ids"])
                   for s in res.get("samples", []) + res.get("seen_samples", [])]
        samples = [(e["ids"], r) for e, r in samples if e is not None]
        r_out = {}
        for bits in a.bits:
            m = DemoModel(tc, variant, attn_impl="eager")
            load_state(m, str(Path(a.runs_dir) / run))
            m = m.float().eval()
            if bits:
                quantize_head(m, bits)
            if bits == a.bits[0]:
                r_out["heldout_loss"] = round(heldout_loss(m, tok, refs), 4)
            prompts = [s[0] for s in samples]
            replies = [s[1] for s in samples]
            key = f"head_{bits}bit" if bits else "head_float"
            r_out[key] = {f"T{t}": acceptance(m, prompts, replies, t, depth=3, batch=16) for t in (0.6, 0.0)}
            print(run, key, r_out[key], flush=True)
        r_out["heldout_refs"] = len(refs)
        r_out["samples"] = len(samples)
        out[run] = r_out
        print(run, "heldout_loss", r_out["heldout_loss"], flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
