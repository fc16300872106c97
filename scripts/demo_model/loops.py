"""The repetition measure of the demo's evaluation (issue 24): a reply loops when it repeats any
8-token span 3 or more times, or when it hits max tokens while repeating (some 8-token span
occurs twice and the reply was cut by the limit, not ended by the model).

v1 counted a 4-token phrase repeated 3+ times (10.7 % of its sampled replies); 4-token phrases
recur in fine answers ("is a kind of", a list of synonyms), 8-token spans do not, except the
prompt's own words: " Leonardo da Vinci" is 8 tokens in the demo's vocabulary, and a reply that
names its subject in four sentences repeated it. So every run of 3 or more tokens that the prompt
holds counts as one token before spans are counted (a reply that repeats the prompt over and
over still loops: its runs are the same one token).

    python scripts/demo_model/loops.py models/demo --json docs/bench/demo-v2-loops.json

samples one reply (T=0.6 / top_p 0.95 / top_k 20, seed = prompt index, 256 tokens at most) to
each of 200 held-out prompts with the engine's AR lane (exact sampling from the trunk): the 100
everyday prompts of everyday_prompts.txt and the first 100 of heldout_prompts.txt.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

SPAN, TIMES, ECHO = 8, 3, 3


def max_span_count(ids, n=SPAN) -> int:
    """How often the most frequent n-token span occurs in ids (overlaps counted)."""
    c = Counter(tuple(ids[i: i + n]) for i in range(len(ids) - n + 1))
    return max(c.values(), default=0)


def is_loop(ids, cut_by_limit: bool) -> bool:
    top = max_span_count(list(ids))
    return top >= TIMES or (cut_by_limit and top >= 2)


def collapse_echoes(ids, prompt, n: int = ECHO) -> list:
    """ids with every run of n or more tokens that the prompt also holds replaced by one marker
    (-1), the longest run first."""
    grams = {tuple(prompt[i:j]) for i in range(len(prompt)) for j in range(i + n, len(prompt) + 1)}
    longest = max((len(g) for g in grams), default=0)
    out, i = [], 0
    while i < len(ids):
        run = next((j - i for j in range(min(len(ids), i + longest), i + n - 1, -1) if tuple(ids[i:j]) in grams), 0)
        out.append(-1 if run else ids[i])
        i += run or 1
    return out


def loop_rate(replies, prompts=None) -> dict:
    """replies: [(ids, cut_by_limit)], prompts: each reply's prompt ids (as the model saw them) or
    None -> {"loops", "replies", "rate", "cut_by_limit", "looping"}."""
    if prompts is not None:
        replies = [(collapse_echoes(list(ids), list(p)), cut) for (ids, cut), p in zip(replies, prompts)]
    flags = [is_loop(ids, cut) for ids, cut in replies]
    return {"loops": sum(flags), "replies": len(flags), "rate": round(sum(flags) / max(1, len(flags)), 4),
            "cut_by_limit": sum(cut for _, cut in replies), "looping": [i for i, f in enumerate(flags) if f]}


def heldout_prompts(n_everyday=100, n_corpus=100):
    here = Path(__file__).resolve().parent
    read = lambda f: [l.strip() for l in (here / f).read_text().splitlines() if l.strip()]  # noqa: E731
    return read("everyday_prompts.txt")[:n_everyday] + read("heldout_prompts.txt")[:n_corpus]


def main():
    import argparse

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from adapters.runtime import preload_blas

    preload_blas()
    from adapters import load_adapter
    from core import AutoregressiveDecoder, SamplerConfig, chat_prompt_ids

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ad = load_adapter(a.model)
    lane = AutoregressiveDecoder(ad, sampler=SamplerConfig(temperature=0.6, top_p=0.95, top_k=20))
    replies, texts, prompts = [], [], []
    for i, p in enumerate(heldout_prompts()):
        lane.seed = i
        prompts.append(chat_prompt_ids(ad, [{"role": "user", "content": p}]))
        ids, stats = lane.generate(prompts[-1], max_tokens=a.max_tokens)
        replies.append((ids, stats.finish_reason == "max_tokens"))
        texts.append({"prompt": p, "reply": ad.tokenizer.decode(ids), "tokens": len(ids),
                      "finish": stats.finish_reason})
    res = loop_rate(replies, prompts)
    res["mean_tokens"] = round(sum(len(r) for r, _ in replies) / len(replies), 1)
    res["examples"] = [texts[i] for i in res["looping"][:10]]
    print(json.dumps({k: v for k, v in res.items() if k != "examples"}))
    if a.json:
        Path(a.json).write_text(json.dumps({**res, "replies_text": texts}, indent=1))


if __name__ == "__main__":
    main()
