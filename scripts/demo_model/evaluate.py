"""The demo's CPU evaluation through the app's own engine (exported checkpoint, MLX, 8 bits):

  replies   one reply (T=0.6 / top_p 0.95 / top_k 20, seed = prompt index, 256 tokens at most) from
            the MTP lane at --depth to each of 200 held-out prompts (loops.heldout_prompts: the 100
            everyday prompts, then 100 held-out corpus conversations), with the drafts the engine
            made and accepted: acceptance per depth over the everyday prompts, the loop measure of
            loops.py over all 200 (the MTP lane samples exactly the AR lane's distribution)
  tools     the 50 dictionary requests of tools_eval.jsonl with a dictionary and a weather tool
            offered (tokenizer.TOOL_EVAL_*): a well-formed call is one block that the server's own
            parser (webapp/api/toolcalls.py) turns into a call of the dictionary with the word; then,
            given the tool's result, whether the answer repeats the definition

    python scripts/demo_model/evaluate.py models/demo --json docs/bench/demo-v2-eval.json

(`tools` reads artifacts/demo/corpus/tools_eval.jsonl: after_v3.sh copies it there from a v3 corpus; v2's: build.py --variant v2 --stages corpus.)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))
from adapters.runtime import preload_blas  # noqa: E402

preload_blas()
from adapters import load_adapter  # noqa: E402
from core import SamplerConfig, SpeculativeDecoder, chat_prompt_ids  # noqa: E402
from core.chat import render  # noqa: E402
from loops import heldout_prompts, loop_rate  # noqa: E402
from webapp.api.toolcalls import split_tool_calls  # noqa: E402

SAMPLER = SamplerConfig(temperature=0.6, top_p=0.95, top_k=20)


def replies(ad, depth, max_tokens=256, n_everyday=100, draw=0):
    lane = SpeculativeDecoder(ad, sampler=SAMPLER, depth=depth)
    acc, prop, out = [0] * depth, [0] * depth, []
    t0 = time.time()
    for i, p in enumerate(heldout_prompts()):
        lane.seed = i + 1000 * draw   # draw 0: the seeds every earlier figure used
        prompt = chat_prompt_ids(ad, [{"role": "user", "content": p}])
        ids, st = lane.generate(prompt, max_tokens=max_tokens)
        if i < n_everyday:
            for d in range(min(depth, len(st.accepted_per_depth))):
                acc[d] += st.accepted_per_depth[d]
                prop[d] += st.proposed_per_depth[d]
        out.append({"prompt": p, "reply": ad.tokenizer.decode(ids), "ids": ids, "finish": st.finish_reason,
                    "prompt_ids": prompt})
    res = loop_rate([(r["ids"], r["finish"] == "max_tokens") for r in out], [r["prompt_ids"] for r in out])
    res["everyday_acceptance"] = [round(a / max(p, 1), 4) for a, p in zip(acc, prop)]
    res["everyday_proposed"] = prop
    res["mean_tokens_everyday"] = round(sum(len(r["ids"]) for r in out[:n_everyday]) / n_everyday, 1)
    res["mean_tokens_heldout"] = round(sum(len(r["ids"]) for r in out[n_everyday:]) / max(1, len(out) - n_everyday), 1)
    res["seconds"] = round(time.time() - t0)
    res["samples"] = [{k: r[k] for k in ("prompt", "reply", "finish")} for r in out]
    return res


def tools(ad, n=50):
    from tokenizer import TOOL_EVAL_DICTIONARY, TOOL_EVAL_OTHER

    from core import AutoregressiveDecoder

    offered = [TOOL_EVAL_DICTIONARY, TOOL_EVAL_OTHER]
    lane = AutoregressiveDecoder(ad, sampler=SAMPLER)
    items = [json.loads(l) for l in open(HERE.parent.parent / "artifacts" / "demo" / "corpus" / "tools_eval.jsonl")][:n]
    calls = used = 0
    rows = []
    for i, e in enumerate(items):
        lane.seed = i
        msgs = [{"role": "user", "content": e["prompt"]}]
        ids, _ = lane.generate(render(ad, msgs, tools=offered), max_tokens=96)
        text = ad.tokenizer.decode(ids)
        rest, parsed = split_tool_calls(text.split("</think>")[-1])
        ok = (len(parsed) == 1 and parsed[0].name == "lookup_word"
              and e["word"] in [str(v).strip().lower() for v in json.loads(parsed[0].arguments).values()])
        calls += ok
        call = {"type": "function", "function": {"name": "lookup_word", "arguments": json.dumps({"word": e["word"]})}}
        result = json.dumps({"word": e["word"], "part_of_speech": e["pos"], "definition": e["definition"]})
        msgs += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": result}]
        ids, _ = lane.generate(render(ad, msgs, tools=offered), max_tokens=96)
        answer = ad.tokenizer.decode(ids).split("</think>")[-1].strip()
        uses = " ".join(e["definition"].lower().split()[:6]) in " ".join(answer.lower().split())
        used += uses
        rows.append({"prompt": e["prompt"], "reply": text, "well_formed": ok, "answer": answer, "uses_result": uses})
    return {"requests": len(items), "well_formed_calls": calls, "answers_using_result": used, "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--parts", nargs="+", default=["replies", "tools"], choices=["replies", "tools"])
    ap.add_argument("--draws", type=int, default=1,
                    help="replies: sample the 200 prompts with this many seeds (draw k seeds prompt i with "
                         "i + 1000 k) and total the loops: 1 % of 200 is 2 replies, so one draw says little")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ad = load_adapter(a.model)
    res = {"model": a.model, "depth": a.depth, "sampler": SAMPLER.__dict__}
    if "replies" in a.parts:
        res["replies"] = replies(ad, a.depth)
        print(json.dumps({k: v for k, v in res["replies"].items() if k not in ("samples", "looping")}), flush=True)
        if a.draws > 1:   # every draw's loops and acceptance, each looping reply kept to read
            res["replies_draws"] = []
            for k in range(a.draws):
                r = res["replies"] if k == 0 else replies(ad, a.depth, draw=k)
                res["replies_draws"].append({"loops": r["loops"], "replies": r["replies"], "acceptance":
                                             r["everyday_acceptance"], "looping": [r["samples"][i] for i in r["looping"]]})
                print(json.dumps({"draw": k, **{k2: v for k2, v in res["replies_draws"][-1].items() if k2 != "looping"}}),
                      flush=True)
            n, loops = (sum(d[key] for d in res["replies_draws"]) for key in ("replies", "loops"))
            res["loops_over_draws"] = {"loops": loops, "replies": n, "rate": round(loops / n, 4)}
            print(json.dumps(res["loops_over_draws"]), flush=True)
    if "tools" in a.parts:
        res["tools"] = tools(ad)
        print(json.dumps({k: v for k, v in res["tools"].items() if k != "rows"}), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
