"""The everyday-questions judge of demo v3 (issue 35): is the answer right?

The model answers each held-out question of heldout_everyday.jsonl (heldout_everyday.py: 75
questions, 15 each of definitions, opposites, kinds of things, capitals, basic Python, with the
accepted answers taken from the corpora) greedily (T=0) with thinking off, and `judge` decides
right or wrong from the reply's text alone, with the reason.

How it talks to the model: it loads the checkpoint directly through this project's engine
(`adapters.load_adapter`, `core.chat.chat_prompt(..., enable_thinking=False)`,
`core.AutoregressiveDecoder` at temperature 0), not through a running server: the prompt is
the one the server renders for `enable_thinking: false` (the same template call), greedy decoding
is deterministic there, nothing has to be started, and it keeps working while webapp/ is being
restructured. The AR lane is the reference distribution (the MTP lane samples the same one).

What "right" means (strict: a reply that lists every candidate, or dumps a paragraph, is wrong):
  1. the answer is what follows the think block (a reply still inside an unclosed <think> has
     none); empty -> wrong
  2. at most MAX_WORDS words in all (a short everyday answer; a dump of words is not one)
  3. the HEAD -- the first two sentences (or lines), at most HEAD_WORDS[category] words -- is
     where the answer must be: a right word buried in a long reply does not count
  4. the head names none of the item's none_of (another country's capital, a synonym given as
     an opposite, another Python function, another item's category): naming several candidates
     is not an answer
  5. the head contains an accepted answer: for definitions at least `min_hits` (2) distinct
     content words of one gloss (a stem match: "publish" matches "published"), else one entry
     of any_of as a whole word or phrase (case-insensitive: "strip" does not match "lstrip")

    python scripts/demo_model/judge.py models/demo --json docs/bench/2026-12-02/demo-v2-judge.json
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
HELDOUT = HERE / "heldout_everyday.jsonl"

MAX_WORDS = 90
HEAD_WORDS = {"definition": 45, "opposite": 25, "kind": 30, "capital": 30, "python": 45}
MAX_TOKENS = 160


def answer_text(reply: str):
    """The reply without its think block; None when the reply never left it."""
    if "<think>" in reply and "</think>" not in reply.split("<think>", 1)[1]:
        return None
    if "</think>" in reply:
        reply = reply.rsplit("</think>", 1)[1]
    for tag in ("<|im_end|>", "<|endoftext|>"):
        reply = reply.split(tag, 1)[0]
    return reply.strip()


def head_of(text: str) -> str:
    """The first two sentences or lines (code fences count as lines)."""
    parts = [p for p in re.split(r"(?<=[.!?])\s+|\n+", text) if p.strip()]
    return " ".join(parts[:2])


def _phrase(term: str) -> re.Pattern:
    return re.compile(r"(?<![\w-])" + re.escape(term.lower()) + r"(?![\w-])")


def _stem(word: str) -> re.Pattern:
    w = word.lower()
    stem = w[:-2] if len(w) > 6 else w[:-1] if len(w) > 4 and w.endswith(("s", "e", "y")) else w
    return re.compile(r"(?<![\w-])" + re.escape(stem) + r"[a-z]*(?![\w-])")


def judge(item: dict, reply: str):
    """(right, why) for one reply to one held-out item."""
    text = answer_text(reply)
    if text is None:
        return False, "no answer: the reply never closed its think block"
    if not text:
        return False, "empty answer"
    n = len(text.split())
    if n > MAX_WORDS:
        return False, f"too long: {n} words (at most {MAX_WORDS})"
    head = head_of(text)
    cap = HEAD_WORDS[item["category"]]
    if len(head.split()) > cap:
        return False, f"the first two sentences run to {len(head.split())} words (at most {cap}): not a direct answer"
    low = head.lower()
    named = [x for x in item["none_of"] if _phrase(x).search(low)]
    if named:
        return False, f"names {', '.join(named[:4])}, which is wrong here"
    if item["category"] == "definition":
        best = []
        for sense in item["any_of"]:
            hits = [w for w in sense if _stem(w).search(low)]
            if len(hits) > len(best):
                best = hits
            if len(hits) >= min(item["min_hits"], len(sense)):
                return True, f"has {', '.join(hits)} of the gloss"
        return False, (f"has only {', '.join(best)} of a gloss" if best else "has no content word of the gloss")
    for group in item["any_of"]:
        hit = next((x for x in group if _phrase(x).search(low)), None)
        if hit:
            return True, f"names {hit}"
    return False, f"does not name {' / '.join(item['any_of'][0][:4])}"


def load_items(path=HELDOUT):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def summarise(rows):
    by = defaultdict(lambda: [0, 0])
    for r in rows:
        by[r["category"]][0] += r["right"]
        by[r["category"]][1] += 1
    right = sum(r["right"] for r in rows)
    return {"right": right, "questions": len(rows), "share_right": round(right / max(1, len(rows)), 4),
            "by_category": {k: {"right": a, "questions": b, "share_right": round(a / b, 4)} for k, (a, b) in by.items()}}


def run(model, items, max_tokens=MAX_TOKENS):
    sys.path.insert(0, str(REPO))
    from adapters.runtime import preload_blas

    preload_blas()
    from adapters import load_adapter
    from core import AutoregressiveDecoder, SamplerConfig
    from core.chat import chat_prompt

    ad = load_adapter(model)
    lane = AutoregressiveDecoder(ad, sampler=SamplerConfig(temperature=0.0, top_p=1.0, top_k=0))
    eos = set(ad.tokenizer.eos_token_ids)
    rows = []
    for it in items:
        prompt = chat_prompt(ad, [{"role": "user", "content": it["question"]}], enable_thinking=False)
        ids, st = lane.generate(list(prompt.ids), max_tokens=max_tokens)
        reply = ad.tokenizer.decode([t for t in ids if t not in eos])
        ok, why = judge(it, reply)
        rows.append({"id": it["id"], "category": it["category"], "question": it["question"], "reply": reply,
                     "right": ok, "why": why, "tokens": len(ids), "finish": st.finish_reason})
        print(f"{'RIGHT' if ok else 'wrong'}  {it['question']}  ->  {reply[:90]!r}  ({why})", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--items", default=str(HELDOUT))
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t0 = time.time()
    rows = run(a.model, load_items(a.items), a.max_tokens)
    res = {"model": a.model, "items": str(Path(a.items).relative_to(REPO)) if Path(a.items).is_relative_to(REPO)
           else a.items, "decoding": "AR lane, greedy (T=0), thinking off (enable_thinking=false), "
           f"max {a.max_tokens} tokens", **summarise(rows), "seconds": round(time.time() - t0), "rows": rows}
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
