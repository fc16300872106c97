"""Which dictionary names the demo calls, alone and beside get_weather (issue 35; V3_PLAN section 31).

eval_v3.py offers its dictionary under ten held-out names; clients name theirs as they please
(define_word, lookup_word, dictionary, ...). This offers a dictionary under each NAMES entry, alone
and beside get_weather, for the first 20 tool-evaluation requests, greedy, the call held to the
offered names as the API holds it (tool_choice auto), and counts the calls naming the dictionary.

    python scripts/demo_model/tool_names.py models/demo artifacts/demo/v3l/v3l-gpuhead/model --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).parent))

NAMES = ["define_word", "lookup_word", "dictionary", "get_definition", "define", "lexicon"]


def tool(name, description, props):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in props}, "required": props}}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tools-eval", default=str(REPO / "artifacts" / "demo" / "v3m" / "corpus" / "tools_eval.jsonl"))
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from adapters.runtime import preload_blas

    preload_blas()
    from adapters import load_adapter
    from core import AutoregressiveDecoder, SamplerConfig
    from core.chat import render
    from eval_v3 import held_calls
    from webapp.api.toolcalls import split_tool_calls

    weather = tool("get_weather", "Get the current weather for a city.", ["city"])
    items = [json.loads(line) for line in open(a.tools_eval)][:a.n]
    out = {"requests": len(items), "decoding": "greedy, calls held to the offered names", "models": {}}
    for m in a.models:
        ad = load_adapter(m)
        lane = AutoregressiveDecoder(ad, sampler=SamplerConfig(temperature=0))
        res = out["models"][m] = {}
        for name in NAMES:
            d = tool(name, "Define an English word.", ["word"])
            for where, tools in (("alone", [d]), ("beside_weather", [d, weather])):
                n = 0
                for e in items:
                    lane.constraint = held_calls(ad, tools)
                    ids, _ = lane.generate(render(ad, [{"role": "user", "content": e["prompt"]}], tools=tools),
                                           max_tokens=64)
                    _, calls = split_tool_calls(ad.tokenizer.decode(ids).split("</think>")[-1])
                    n += len(calls) == 1 and calls[0].name == name
                res.setdefault(name, {})[where] = n
            print(m, name, res[name], f"of {len(items)}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
