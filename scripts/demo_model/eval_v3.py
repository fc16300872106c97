"""Demo v3's structured-output and tool evaluations (issue 35's done-when), through the engine.

  json    20 requests "the word and its number of letters as JSON" about held-out words, with the
          schema {"word": string, "letters": integer} as the API applies it (a grammar from
          core.constraints, thinking off: webapp/api/prompt.py), AR lane at T=0.6 (seed = index),
          80 tokens at most: valid = the reply parses and fits the schema; closed = it ended
          (end token) within the 80; plausible = letters has 1-4 digits and the word is short (v2's
          schema-valid replies hold 20-digit integers); right = letters is the word's length
  tools   50 dictionary requests about the tool evaluation's held-out words (tool_words.txt), with
          three or four tools offered: a dictionary under a name no training conversation uses
          (EVAL_NAMES: the model must copy the offered name), get_weather and one or two others; T=0.6:
          right = one call, parsed by the server's own parser (webapp/api/toolcalls.py), of the offered
          dictionary with the word; then, given the tool's result, whether the answer repeats the
          definition (its first six words, evaluate.py's rule; and whether it holds the whole of it), and
          whether a client sees it as `content` (the thought the prompt opens was closed first);
          --dictionary-alone offers the dictionary alone, as a client with one tool does

    python scripts/demo_model/eval_v3.py models/demo --json docs/bench/2026-12-02/demo-v2-eval-v3.json
    python scripts/demo_model/eval_v3.py models/demo --parts tools --hold-calls --json ...   # calls held
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

SCHEMA = {"type": "object", "properties": {"word": {"type": "string"}, "letters": {"type": "integer"}},
          "required": ["word", "letters"]}
# dictionary names that everyday_v3.make_tool cannot produce (its verbs x nouns): copied or not at all
EVAL_NAMES = ["wordbook", "dict_api", "meaning_finder", "glossary_service", "explain_term", "word_oracle",
              "vocabulary_tool", "semantics", "look_it_up", "defn"]
EVAL_ARGS = ["word", "term", "query"]


def json_eval(ad, words, n=20, max_tokens=80):
    from core import AutoregressiveDecoder, Constraint, SamplerConfig
    from core.chat import chat_prompt

    sampler = SamplerConfig(temperature=0.6, top_p=0.95, top_k=20)
    rows = []
    for i, w in enumerate(words[:n]):
        prompt = chat_prompt(ad, [{"role": "user", "content": f'Give me the word "{w}" and its number of letters as JSON.'}],
                             enable_thinking=False)
        lane = AutoregressiveDecoder(ad, sampler=sampler, seed=i,
                                     constraint=Constraint.for_json(ad.tokenizer, SCHEMA, ad.contract.vocab_size))
        ids, st = lane.generate(list(prompt.ids), max_tokens=max_tokens)
        text = ad.tokenizer.decode([t for t in ids if t not in set(ad.tokenizer.eos_token_ids)])
        try:
            obj = json.loads(text)
            valid = isinstance(obj.get("word"), str) and isinstance(obj.get("letters"), int)
        except (ValueError, AttributeError):
            obj, valid = None, False
        closed = st.finish_reason == "eos"  # core.stream: "eos" | "stop_string" | "max_tokens" | "stopped"
        # schema-valid is not enough: v2 writes {"letters": 345005256055515551552555555} (an integer);
        # plausible = a count of 1-4 digits and a short word, what the v3 data teaches
        plausible = bool(valid and 0 < obj["letters"] < 10000 and 0 < len(obj["word"]) <= 40)
        rows.append({"word": w, "reply": text, "tokens": st.generated_tokens, "finish": st.finish_reason,
                     "valid": valid, "closed": closed, "plausible": plausible,
                     "right": bool(valid and obj["letters"] == len(w))})
    ok = sum(r["valid"] and r["closed"] for r in rows)
    return {"requests": len(rows), "valid_and_closed": ok,
            "valid_closed_plausible": sum(r["valid"] and r["closed"] and r["plausible"] for r in rows),
            "right_letters": sum(r["right"] for r in rows), "max_tokens": max_tokens, "rows": rows}


def tools_eval(ad, items, seed=35, hold=False, temperature=0.6, alone=False, draw=0):
    from conversations import OTHER_TOOLS, tool_schema
    from core import AutoregressiveDecoder, SamplerConfig
    from core.chat import render
    from webapp.api.toolcalls import split_tool_calls

    rng = random.Random(seed)
    lane = AutoregressiveDecoder(ad, sampler=SamplerConfig(temperature=temperature, top_p=0.95, top_k=20))
    rows = []
    for i, e in enumerate(items):
        name, arg = EVAL_NAMES[i % len(EVAL_NAMES)], rng.choice(EVAL_ARGS)
        dict_tool = tool_schema(name, "Look up the meaning of an English word in the dictionary.", {arg: "the word"})
        tools = [dict_tool, tool_schema(*OTHER_TOOLS[0])] + [tool_schema(*t) for t in rng.sample(OTHER_TOOLS[1:], rng.choice([1, 2]))]
        rng.shuffle(tools)
        tools = [dict_tool] if alone else tools   # the draws above still made: the same names and words either way
        msgs = [{"role": "user", "content": e["prompt"]}]
        lane.seed = i + 1000 * draw   # draw 0: the seeds every earlier figure used
        # as the API holds a call the model opens to the offered tools (tool_choice auto)
        lane.constraint = held_calls(ad, tools) if hold else None
        ids, _ = lane.generate(render(ad, msgs, tools=tools), max_tokens=96)
        lane.constraint = None
        text = ad.tokenizer.decode(ids)
        _, parsed = split_tool_calls(text.split("</think>")[-1])
        ok = False
        if len(parsed) == 1 and parsed[0].name == name:
            try:
                vals = [str(v).strip().lower() for v in json.loads(parsed[0].arguments).values()]
                ok = e["word"] in vals
            except ValueError:
                pass
        call = {"type": "function", "function": {"name": name, "arguments": json.dumps({arg: e["word"]})}}
        result = json.dumps({"word": e["word"], "definition": e["definition"]})
        msgs += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": result}]
        ids, _ = lane.generate(render(ad, msgs, tools=tools), max_tokens=96)
        answer, uses, whole, closed = read_answer(e["definition"], ad.tokenizer.decode(ids))
        rows.append({"prompt": e["prompt"], "offered": [t["function"]["name"] for t in tools], "dictionary": name,
                     "reply": text, "names_offered_tool_with_word": ok, "answer": answer, "uses_result": uses,
                     "full_copy": whole, "thought_closed": closed})
    return {"requests": len(rows), "held_calls": hold, "temperature": temperature, "dictionary_alone": alone,
            "named_offered_tool": sum(r["names_offered_tool_with_word"] for r in rows),
            "answers_using_result": sum(r["uses_result"] for r in rows),
            "answers_copying_it_whole": sum(r["full_copy"] for r in rows),
            "answers_using_it_as_content": sum(r["uses_result"] and r["thought_closed"] for r in rows),
            "thoughts_closed": sum(r["thought_closed"] for r in rows), **call_counts(rows), "rows": rows}


def read_answer(definition: str, reply: str):
    """(answer, uses the result, copies it whole, thought closed) of a reply to a tool's result.
    The prompt opens a thought (thinking on, the app's default): an answer the model writes
    without closing it first is reasoning to the server (webapp/api/text.py), so a client's
    `content` stays empty. The answer is read after the thought either way."""
    answer = reply.split("</think>")[-1].strip()
    uses = " ".join(definition.lower().split()[:6]) in " ".join(answer.lower().split())
    return answer, uses, full_copy(definition, answer), "</think>" in reply


def full_copy(definition: str, answer: str) -> bool:
    """Whether the answer holds the whole definition, its words in order (case and punctuation aside):
    the done-when's first-six-words rule passes answers that garble the rest (V3_PLAN section 25)."""
    words = lambda t: re.findall(r"[a-z0-9]+", t.lower())  # noqa: E731
    return f" {' '.join(words(definition))} " in f" {' '.join(words(answer))} "


def call_counts(rows) -> dict:
    """How the replies' first calls went: well-formed at all, naming any offered tool, naming the
    dictionary (named_offered_tool also needs the word among its arguments)."""
    from webapp.api.toolcalls import split_tool_calls

    firsts = [(calls[0].name, r) for r in rows for calls in [split_tool_calls(r["reply"].split("</think>")[-1])[1]]
              if calls]
    return {"well_formed_calls": len(firsts),
            "calls_naming_an_offered_tool": sum(name in r["offered"] for name, r in firsts),
            "calls_naming_the_dictionary": sum(name == r["dictionary"] for name, r in firsts)}

def held_calls(ad, tools):
    from core.constraints import held
    from webapp.api.structured import tool_call_grammar

    return held(ad.tokenizer, tool_call_grammar(tools, lazy=True)(ad.tokenizer), ad.contract.vocab_size)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--parts", nargs="+", default=["json", "tools"], choices=["json", "tools"])
    ap.add_argument("--tools-eval", default=str(REPO / "artifacts" / "demo" / "v3" / "corpus" / "tools_eval.jsonl"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--hold-calls", action="store_true",
                    help="tools: hold a call the model opens to the offered tools, as the API does for tool_choice auto")
    ap.add_argument("--temperature", type=float, default=0.6,
                    help="tools: the sampler's temperature (0.6 as the done-when; 0 shows whether a copy's slips "
                         "are the model's own choice or the sampler's draw)")
    ap.add_argument("--draws", type=int, default=1,
                    help="tools: repeat the 50 requests with this many sampler seeds (draw k seeds request i with "
                         "i + 1000 k); a rate over 50 moves by about 3 requests from draw to draw")
    ap.add_argument("--dictionary-alone", action="store_true",
                    help="tools: offer the dictionary alone (a client's one-tool request) instead of beside 2-3 others")
    a = ap.parse_args()
    from adapters.runtime import preload_blas

    preload_blas()
    from adapters import load_adapter

    import judge

    ad = load_adapter(a.model)
    t0 = time.time()
    res = {"model": a.model}
    if "json" in a.parts:
        words = [it["subject"] for it in judge.load_items() if it["category"] in ("definition", "opposite")]
        res["json"] = json_eval(ad, words)
        print(json.dumps({k: v for k, v in res["json"].items() if k != "rows"}), flush=True)
    if "tools" in a.parts:
        items = [json.loads(l) for l in open(a.tools_eval)][:50]
        draws = [tools_eval(ad, items, hold=a.hold_calls, temperature=a.temperature, alone=a.dictionary_alone, draw=k)
                 for k in range(a.draws)]
        res["tools"] = draws[0]
        print(json.dumps({k: v for k, v in res["tools"].items() if k != "rows"}), flush=True)
        if a.draws > 1:
            counts = [k for k, v in draws[0].items() if isinstance(v, int) and not isinstance(v, bool)]
            res["tools_draws"] = {"draws": a.draws, "per_draw": [{k: d[k] for k in counts} for d in draws],
                                  "total": {k: sum(d[k] for d in draws) for k in counts},
                                  "rows": [d["rows"] for d in draws[1:]]}
            print(json.dumps({k: v for k, v in res["tools_draws"].items() if k != "rows"}), flush=True)
    res["seconds"] = round(time.time() - t0)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
