"""The GPU probe of a trained run (PyTorch, float weights), run right after training so that a
run's quality comes back with it:

  everyday   acceptance per depth (T=0.6 and greedy), teacher-forced on the trunk's own replies
             to the 100 everyday prompts, and the mean reply length
  heldout    the same on held-out conversations of the corpus
  loops      loops.py's measure over 200 sampled replies (T=0.6, 256 tokens at most)
  context    depth-1 acceptance at T=0.6 with the 8 race prompts padded to 64 / 1024 / 2048 / 3500
             tokens the way bench.py --context pads them
  tools      of the 50 dictionary requests (tools_eval.json), how many replies are one well-formed
             call of the offered tool with the word, and how many follow-ups, given the tool's
             result, repeat the definition

Inputs are prompt ids made on the CPU by tokenizer.encode_prompts (the GPU machine renders no
template). Replies are sampled by model_torch.generate (full forward each step: exact for any
architecture, fast enough for a few hundred short replies).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from loops import loop_rate
from model_torch import EOS, acceptance, generate


def _replies(model, prompts, temp, max_new, seed=0, batch=64):
    out = generate(model, prompts, temp, max_new=max_new, batch=batch, seed=seed)
    done = [EOS in r for r in out]
    return [r[: r.index(EOS) + 1] if EOS in r else r for r in out], done


def probe(model, data_dir, log=print, depth=3, quick=False):
    data_dir = Path(data_dir)
    res = {}
    t0 = time.time()
    everyday = json.loads((data_dir / "everyday.json").read_text())
    heldout = json.loads((data_dir / "eval_prompts.json").read_text())[:100]
    for tag, items in (("everyday", everyday), ("heldout", heldout)):
        prompts = [e["ids"] for e in items]
        for temp in (0.6, 0.0):
            reps, done = _replies(model, prompts, temp, 256 if temp else 160)
            acc = acceptance(model, prompts, reps, temp, depth=depth)
            res[f"{tag}_T{temp}"] = {**acc, "mean_tokens": round(float(np.mean([len(r) for r in reps])), 1)}
            if temp == 0.6:
                res[f"{tag}_loops"] = loop_rate([(r[:-1] if d else r, not d) for r, d in zip(reps, done)], prompts)
                res[f"{tag}_samples"] = [{"prompt": e["prompt"], "reply_ids": r} for e, r in zip(items[:24], reps[:24])]
            log(f"probe {tag} T={temp}: {acc} ({time.time() - t0:.0f}s)")
    lo = [res["everyday_loops"], res["heldout_loops"]]
    res["loops"] = {"loops": lo[0]["loops"] + lo[1]["loops"], "replies": lo[0]["replies"] + lo[1]["replies"]}
    res["loops"]["rate"] = round(res["loops"]["loops"] / res["loops"]["replies"], 4)
    if quick:
        return res
    ctx = json.loads((data_dir / "context_prompts.json").read_text())
    res["context"] = {}
    for n, prompts in ctx.items():
        reps, _ = _replies(model, prompts, 0.6, 128, batch=8)
        res["context"][n] = acceptance(model, prompts, reps, 0.6, depth=2, batch=8)
        log(f"probe context {n}: {res['context'][n]} ({time.time() - t0:.0f}s)")
    res["tools"] = tool_probe(model, data_dir, log)
    log(f"probe done in {time.time() - t0:.0f}s")
    return res


def tool_probe(model, data_dir, log=print):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(data_dir) / "tokenizer.json"))
    items = json.loads((Path(data_dir) / "tools_eval.json").read_text())
    calls = [e["ids"] for e in items]
    reps, _ = _replies(model, calls, 0.6, 96)
    ok = 0
    for e, r in zip(items, reps):
        e["reply"] = tok.decode(r, skip_special_tokens=False)
        ok += well_formed(e["reply"], e["tool"], e["word"])
    follow = [e["follow_ids"] for e in items]
    reps2, _ = _replies(model, follow, 0.6, 96)
    used = 0
    for e, r in zip(items, reps2):
        e["answer"] = tok.decode(r, skip_special_tokens=True)
        used += uses_result(e["answer"], e["definition"])
    res = {"requests": len(items), "well_formed_calls": ok, "answers_using_result": used,
           "examples": [{"prompt": e["prompt"], "reply": e["reply"], "answer": e["answer"]} for e in items[:5]]}
    log(f"probe tools: {ok}/{len(items)} well-formed calls, {used}/{len(items)} answers use the result")
    return res


def well_formed(reply: str, tool: str, word: str) -> bool:
    """One <tool_call> block, valid JSON, the offered tool's name, the word as its argument."""
    import re

    m = re.fullmatch(r"\s*<tool_call>\s*(\{.*\})\s*</tool_call>\s*(<\|im_end\|>)?\s*", reply, re.S)
    if not m:
        return False
    try:
        obj = json.loads(m.group(1))
    except ValueError:
        return False
    args = obj.get("arguments")
    return obj.get("name") == tool and isinstance(args, dict) and word in [str(v).strip().lower() for v in args.values()]


def uses_result(answer: str, definition: str) -> bool:
    """The answer repeats the tool's definition (its first 6 words at least, in order)."""
    words = definition.lower().split()[:6]
    return " ".join(words) in " ".join(answer.lower().split())


def main():
    import argparse

    import torch

    from model_torch import DemoModel, fast_kernels, load_state

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="prefix of the training shards")
    ap.add_argument("text_config")
    ap.add_argument("data")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = DemoModel(json.loads(Path(a.text_config).read_text())).to(dev)
    load_state(model, a.run)
    fast_kernels(model, dev, print)
    model.eval()
    Path(a.json).write_text(json.dumps(probe(model, a.data)))


if __name__ == "__main__":
    main()
