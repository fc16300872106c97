"""What a prepared v3c / v3d / v3e / v3f / v3g / v3h / v3i / v3j / v3k / v3l / v3m / v3n corpus must hold before a GPU call trains on it (issue 35):
prepare_v3.py runs these after its data step and stops on any problem;
`python scripts/demo_model/check_v3.py --variant v3e` re-checks a folder already prepared.

Each check returns a list of problems in words (empty: the corpus is fit). The size bounds are
the variant's own (LIMITS) and can be passed smaller, as the tests do on hand-made corpora.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import everyday_v3 as V3  # noqa: E402
import heldout_everyday as H  # noqa: E402

LIMITS = {
    "v3d": {"facts_total": (2000, 4000), "notes_share": (0.30, 0.40), "tokens_max": 10_500_000},
    "v3e": {"notes_share": (0.25, 0.30), "tokens_max": 11_000_000, "tools_min": 6000, "drills_min": 20000,
            "asks_min": 10, "asks_median": (10, 25)},
}
# v3f: v3e with 9,000 tool conversations (their schemas add tokens, so the notes' share falls)
LIMITS["v3f"] = {**LIMITS["v3e"], "notes_share": (0.20, 0.30), "tokens_max": 13_500_000, "tools_min": 8500,
                 "listed_min": 0.5}
# v3g: v3f's with the explained answers' share of the trained-on tokens (mask.npy: replies, thoughts, notes,
# prose) and mean length, and the distinct dictionary names
LIMITS["v3g"] = {**LIMITS["v3f"], "notes_share": (0.18, 0.30), "tokens_max": 13_000_000,
                 "explain_share": (0.12, 0.25), "explain_tokens_mean": (50, 90), "dict_names_min": 5000}
# v3h: v3g's with the span drills and the dictionary results of other senses
LIMITS["v3h"] = {**LIMITS["v3g"], "spans_min": 5000, "senses_min": 500}
# v3i: v3h's with the dictionary results to copy: 15+-word ones not answerable from memory, and the
# share that is (its more look-ups a conversation add tokens)
LIMITS["v3i"] = {**LIMITS["v3h"], "tokens_max": 15_000_000, "copy15_min": 2000, "remembered_max": 0.20}
LIMITS["v3j"] = LIMITS["v3k"] = LIMITS["v3i"]
# v3l: half the thinking calls lose their listing thought as a client sends them back (the bare call
# is context), so fewer documents hold one: 3,650 of 8,844
LIMITS["v3l"] = {**LIMITS["v3k"], "after_bare_call_min": 2000, "listed_min": 0.35}
# v3m: v3l's with tool conversations that offer one tool (the dictionary alone in most of them)
LIMITS["v3m"] = {**LIMITS["v3l"], "alone_min": 1300}
# v3n: v3m's with the names clients give a dictionary in some conversations, always beside other tools
LIMITS["v3n"] = {**LIMITS["v3m"], "natural_min": 300}
WORDS = re.compile(r"[a-z][a-z'-]+")
TURN = re.compile(r"<\|im_start\|>(user|assistant)\n(.*?)<\|im_end\|>", re.S)
# drill questions that ask how to do something: their answers start with the doing, not the subject
HOW = ("How", "In Python", "Which Python", "Python", "What's the Python", "I want", "What should I call")


def leak_check(corpus_dir):
    """No held-out question (nor a Python one's task) is asked in the corpus: {what: count} over
    the user turns (the docs' own sentences, "Add an item to the end of the list.", stay in the
    tutorial prose and in answers: that is the corpora's knowledge, not the question)."""
    items = H.load()
    keys = [it["question"].lower() for it in items] + [t for t in (H._task_of(it["question"]) for it in items
                                                                   if it["category"] == "python") if t]
    pat = re.compile("|".join(re.escape(k) for k in sorted(set(keys), key=len, reverse=True)))
    found = {}
    with open(Path(corpus_dir) / "docs.jsonl") as f:
        for line in f:
            for turn in re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", json.loads(line)["text"].lower(), re.S):
                for m in pat.finditer(turn):
                    found[m.group(0)] = found.get(m.group(0), 0) + 1
    return found


def notes_check(corpus_dir):
    """The notes state, they never ask: {what: count} of notes holding a question mark or a
    held-out question's text (the user turns are leak_check's)."""
    qs = [it["question"].lower() for it in H.load()]
    found = {}
    with open(Path(corpus_dir) / "docs.jsonl") as f:
        for line in f:
            d = json.loads(line)
            if not d["kind"].startswith("note_"):
                continue
            t = d["text"].lower()
            if "?" in t:
                found["a note with '?'"] = found.get("a note with '?'", 0) + 1
            for q in qs:
                if q in t:
                    found[q] = found.get(q, 0) + 1
    return found


def _between(x, lo_hi):
    return lo_hi[0] <= x <= lo_hi[1]


def check_held_out(work: Path, lim: dict | None = None) -> list:
    """Every variant (v3c's whole check): no held-out question asked, no note that asks."""
    corpus = Path(work) / "corpus"
    return ([f"held-out question asked: {k!r} x{n}" for k, n in leak_check(corpus).items()]
            + [f"note asks: {k!r} x{n}" for k, n in notes_check(corpus).items()])


def common(work: Path, variant: str) -> tuple[list, dict]:
    """check_held_out, and the stats of this variant with every focused fact in >= 5 phrasings:
    (problems, stats)."""
    corpus = Path(work) / "corpus"
    problems = check_held_out(work)
    stats = json.loads((corpus / "stats.json").read_text())
    if stats.get("variant") != variant:
        problems.append(f"stats.json is of variant {stats.get('variant')!r}, not {variant!r}")
    if stats["focus"]["phrasings_min"] < 5:
        problems.append(f"a focused fact has {stats['focus']['phrasings_min']} phrasings (< 5)")
    return problems, stats


def shares(work: Path, lim: dict) -> list:
    by_kind = Path(work) / "data" / "tokens_by_kind.json"
    if not by_kind.exists():
        return []   # the corpus step alone: no tokens yet
    toks = json.loads(by_kind.read_text())
    out = []
    if not _between(toks["notes_share"], lim["notes_share"]):
        out.append(f"notes are {toks['notes_share']:.1%} of the tokens, outside {lim['notes_share']}")
    if toks["total"] > lim["tokens_max"]:
        out.append(f"{toks['total']:,} tokens, more than {lim['tokens_max']:,}")
    return out


def check_v3d(work: Path, lim: dict | None = None, sample: int = 12) -> list:
    """v3d: the common checks, 2,000-4,000 focused facts, notes 30-40 % of <= 10.5M tokens, and where
    WordNet is installed a seeded sample of each kind's facts found in >= 5 phrasings in the notes."""
    lim = lim or LIMITS["v3d"]
    problems, stats = common(work, "v3d")
    if not _between(stats["focus"]["facts_total"], lim["facts_total"]):
        problems.append(f"{stats['focus']['facts_total']} focused facts, outside {lim['facts_total']}")
    problems += shares(work, lim)
    if sample and Path("/usr/share/wordnet/data.noun").exists():
        import conversations as C

        tool_words = {w.strip() for w in (HERE / "tool_words.txt").read_text().split()}
        facts = V3.focus_facts(*H._wordnet(), lambda w: w in tool_words or w in C.HELDOUT_TOPICS)
        if {k: len(v) for k, v in facts.items()} != stats["focus"]["facts"]:
            problems.append("the focused facts counted now differ from stats.json's")
        notes = " ".join(json.loads(l)["text"] for l in open(Path(work) / "corpus" / "docs.jsonl")
                         if '"kind": "note_' in l)
        rng = random.Random(0)
        for kind, fs in facts.items():
            for f in rng.sample(fs, min(sample, len(fs))):
                ph = set(V3.fact_phrasings(kind, f))
                if len(ph) < 5 or sum(p in notes for p in ph) < 5:
                    problems.append(f"{kind} fact about {f['subject']!r} in fewer than 5 phrasings in the notes")
    return problems


def check_v3e(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3e") -> list:
    """v3e: the common checks; no user turn of a drill or tool document names a held-out subject (any
    category); no short user question anywhere asks a held-out item's question about its subject;
    every drill answer shares a word with its question and, unless it tells how to do something,
    names the question's subject before its first " is "; the drills, tool conversations, asks per
    subject and token shares within LIMITS."""
    lim = lim or LIMITS[variant]
    problems, stats = common(work, variant)
    if stats["docs_by_kind"].get("tools", 0) < lim["tools_min"]:
        problems.append(f"{stats['docs_by_kind'].get('tools', 0)} tool conversations, fewer than {lim['tools_min']}")
    lo, med, _ = stats["v3e"]["asks_per_subject_min_median_max"]
    if lo < lim["asks_min"] or not _between(med, lim["asks_median"]):
        problems.append(f"asks per subject min {lo} median {med}, want min >= {lim['asks_min']}, median in {lim['asks_median']}")
    held = V3.heldout_subjects() if held is None else held
    held_re = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(held, key=len, reverse=True)) + r")\b")
    ex = H.Exclusion()
    n_drill = 0
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        if d["kind"].startswith("note_") or d["kind"] == "prose":
            continue
        turns = TURN.findall(d["text"])
        for i, (role, t) in enumerate(turns):
            if role != "user" or t.startswith("<tool_response>"):
                continue
            if len(t) <= 200 and ex({"kind": "x", "messages": [t]}):   # a question, not a pasted passage
                problems.append(f"a held-out item's question is asked: {t!r}")
            if d["kind"] in ("drill", "tools") and held_re.search(t.lower()):
                problems.append(f"a {d['kind']} question names a held-out subject: {t!r}")
            if d["kind"] == "drill" and i + 1 < len(turns):
                n_drill += 1
                ans = turns[i + 1][1].split("</think>")[-1].strip()
                words = set(WORDS.findall(t.lower()))
                if not words & set(WORDS.findall(ans.lower())):
                    problems.append(f"a drill answer shares no word with its question: {t!r} -> {ans!r}")
                elif not t.startswith(HOW) and "`" not in ans and \
                        not set(WORDS.findall(ans.split(" is ")[0].lower())) & words:
                    problems.append(f"a drill answer does not name its subject first: {t!r} -> {ans!r}")
    if n_drill < lim["drills_min"] or stats["v3e"]["drill_exchanges"] < lim["drills_min"]:
        problems.append(f"{n_drill} drill exchanges found ({stats['v3e']['drill_exchanges']} counted), "
                        f"fewer than {lim['drills_min']}")
    return problems + shares(work, lim)


# (v3m: a tool offered alone is "the tool offered is X, and it fits.")
LISTED = re.compile(r"the tools offered are (?P<names>.+?)\. The (?P<name>\S+) tool fits\."
                    r"|the tool offered is (?P<one>\S+), and it fits\.")
CALLED = re.compile(r'<tool_call>\s*\{"name": "([^"]+)"')


def check_v3f(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3f") -> list:
    """v3f: v3e's checks with v3f's limits; and in the tool documents, every thought that lists the
    offered tools names one of them, the call that follows calls that one, and at least `listed_min`
    of the documents with a call hold such a thought before one."""
    lim = lim or LIMITS[variant]
    problems = check_v3e(work, lim, held, variant=variant)
    listed = with_call = 0
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        if d["kind"] != "tools":
            continue
        text = d["text"]
        if CALLED.search(text) is None:
            continue
        with_call += 1
        # the call the listing thought leads to: the chat template keeps only the last turn's thought,
        # so in a conversation of several look-ups (v3i) it is the last call's, not the first's
        m = LISTED.search(text)
        call = CALLED.search(text, m.end()) if m else None
        if call is None:
            continue
        listed += 1
        names = re.split(r", | and ", m["names"]) if m["names"] else [m["one"]]
        name = m["name"] or m["one"]
        if name not in names or call.group(1) != name:
            problems.append(f"a thought lists {names} and names {name!r}; the call names {call.group(1)!r}")
    if not with_call or listed / with_call < lim["listed_min"]:
        problems.append(f"{listed} of {with_call} documents with a call hold a thought listing the offered tools before one, "
                        f"fewer than {lim['listed_min']:.0%}")
    return problems


THINK = re.compile(r"^<think>\n(.*?)\n</think>\n\n", re.S)
SENTENCE_END = re.compile(r'(?<=[.!?])(?<!\b[A-Z]\.)"?\s+(?=["A-Z])')   # not after an initial ("C. S. Forester")
TOOL_DEF = re.compile(r'^\{"type": "function", "function": \{"name": "([^"]+)", "description": "([^"]+)"', re.M)


def reply_tokens_by_kind(work: Path) -> dict | None:
    """The trained-on tokens (mask.npy: replies, their thoughts, notes, prose) by document kind, and
    "total"; None before the data step."""
    import numpy as np

    data = Path(work) / "data"
    if not (data / "mask.npy").exists():
        return None
    kinds = [json.loads(l)["kind"] for l in open(Path(work) / "corpus" / "docs.jsonl")]
    mask = np.load(data / "mask.npy")
    starts = np.append(np.load(data / "docs.npy"), len(mask))
    cum = np.concatenate([[0], np.cumsum(mask == 1, dtype=np.int64)])
    out = {}
    for k, a, b in zip(kinds, starts[:-1], starts[1:]):
        out[k] = out.get(k, 0) + int(cum[b] - cum[a])
    out["total"] = int(cum[-1])
    return out


def check_v3g(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3g") -> list:
    """v3g: v3f's checks with v3g's limits; the explained answers ("explain" documents) of 3-5 sentences
    (as the generator counted them, and >= 97 % by their text), within EXPLAIN_MAX_WORDS words, each
    naming its question's subject in its first sentence and in its thought (when it has one), none asked
    about a held-out subject (the judge's, or the race's and everyday prompts'); their share of the
    trained-on tokens and their mean length in tokens within LIMITS; the dictionary tools' names
    distinct enough, none an evaluation name nor holding one of their stems."""
    import eval_v3

    lim = lim or LIMITS[variant]
    problems = check_v3f(work, lim, held, variant=variant)
    import conversations as C

    sentences = json.loads((Path(work) / "corpus" / "stats.json").read_text()).get("v3g", {}).get("sentences")
    if not sentences or set(sentences) - {"3", "4", "5"}:
        problems.append(f"explained answers of {sorted(sentences or [])} sentences, want 3-5")
    # the build keeps the race's and everyday prompts' subjects out of the explained questions too
    held = (V3.heldout_subjects() if held is None else held) | C.HELDOUT_TOPICS
    held_re = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(held, key=len, reverse=True)) + r")\b")
    stems = V3.copy_stems(eval_v3.EVAL_NAMES)
    template = V3.template_words()
    answers, in_range, dict_names = [], 0, set()
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        if d["kind"] == "tools":
            dict_names |= {n for n, desc in TOOL_DEF.findall(d["text"]) if desc in V3.DICT_DESC}
        if d["kind"] != "explain":
            continue
        turns = TURN.findall(d["text"])
        for (_, q), (_, a) in zip(turns[0::2], turns[1::2]):
            m = THINK.match(a)
            thought, ans = (m.group(1), a[m.end():]) if m else (None, a.split("</think>")[-1].strip())
            answers.append(ans)
            n = len(SENTENCE_END.split(ans))
            in_range += 3 <= n <= 5
            subject = set(WORDS.findall(q.lower())) - template
            if held_re.search(q.lower()):
                problems.append(f"an explained question names a held-out subject: {q!r}")
            if len(ans.split()) > V3.EXPLAIN_MAX_WORDS:
                problems.append(f"an explained answer of {len(ans.split())} words: {ans[:80]!r}")
            if not subject & set(WORDS.findall(SENTENCE_END.split(ans)[0].lower())):
                problems.append(f"an explained answer does not name its subject first: {q!r} -> {ans[:80]!r}")
            if thought and not subject & set(WORDS.findall(thought.lower())):
                problems.append(f"a thought does not name the subject: {q!r} -> {thought!r}")
    if not answers or in_range / len(answers) < 0.97:
        problems.append(f"{in_range} of {len(answers)} explained answers read as 3-5 sentences (want >= 97 %)")
    if len(dict_names) < lim["dict_names_min"]:
        problems.append(f"{len(dict_names)} distinct dictionary names, fewer than {lim['dict_names_min']}")
    # v3n offers the names clients give a dictionary on purpose: their stems are the evaluation's
    natural = set(V3.NATURAL_DICT_NAMES) if "natural_min" in lim else set()
    problems += [f"a dictionary name clashes with the evaluation's names: {n!r}" for n in sorted(dict_names - natural)
                 if V3.clashes(n, eval_v3.EVAL_NAMES, stems)][:20]
    replies = reply_tokens_by_kind(work)
    if replies:
        share = replies.get("explain", 0) / replies["total"]
        if not _between(share, lim["explain_share"]):
            problems.append(f"explained answers are {share:.1%} of the trained-on tokens, "
                            f"outside {lim['explain_share']}")
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(work) / "tokenizer" / "tokenizer.json"))
        mean = sum(len(e.ids) for e in tok.encode_batch(answers)) / len(answers)
        if not _between(mean, lim["explain_tokens_mean"]):
            problems.append(f"explained answers of {mean:.1f} tokens on average, outside {lim['explain_tokens_mean']}")
    return problems


def check_v3h(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3h") -> list:
    """v3h: v3g's checks; at least LIMITS' span drills, each reply holding its question's span word
    for word, none naming a held-out subject; at least LIMITS' dictionary words with a result of
    another sense, and such results in the tool conversations."""
    lim = lim or LIMITS[variant]
    problems = check_v3g(work, lim, held, variant=variant)
    stats = json.loads((Path(work) / "corpus" / "stats.json").read_text())["v3e"]
    if stats.get("span_drills", 0) < lim["spans_min"]:
        problems.append(f"{stats.get('span_drills', 0)} span drills, fewer than {lim['spans_min']}")
    senses = stats.get("dict_words_common_rare_senses", [0, 0, 0])[2]
    if senses < lim["senses_min"]:
        problems.append(f"{senses} dictionary results of another sense, fewer than {lim['senses_min']}")
    held = V3.heldout_subjects() if held is None else held
    held_re = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(held, key=len, reverse=True)) + r")\b")
    span_q = [re.compile(re.escape(q).replace(re.escape("{t}"), "(.+)") + "$", re.S) for q in V3.SPAN_Q]
    seen = 0
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        if d["kind"] != "drill":
            continue
        turns = TURN.findall(d["text"])
        for (_, q), (_, a) in zip(turns[0::2], turns[1::2]):
            m = next((m for m in (r.match(q) for r in span_q) if m), None)
            if m is None:
                continue
            seen += 1
            span = m.group(1)
            if span not in a.split("</think>")[-1]:
                problems.append(f"a span drill's reply does not hold its span: {q!r} -> {a[-80:]!r}")
            if held_re.search(span.lower()):
                problems.append(f"a span drill names a held-out subject: {span!r}")
    if seen < lim["spans_min"]:
        problems.append(f"{seen} span drills found in the documents, fewer than {lim['spans_min']}")
    return problems[:40]


def check_v3i(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3i") -> list:
    """v3i: v3h's checks; at least LIMITS' dictionary results of 15+ words that only copying can
    answer, and at most LIMITS' share of results that repeat a definition the corpus teaches."""
    lim = lim or LIMITS["v3i"]
    problems = check_v3h(work, lim, held, variant=variant)
    stats = json.loads((Path(work) / "corpus" / "stats.json").read_text())["v3e"]
    n, remembered = stats.get("dict_results", 0), stats.get("dict_results_remembered", 0)
    if stats.get("dict_results_15plus_to_copy", 0) < lim["copy15_min"]:
        problems.append(f"{stats.get('dict_results_15plus_to_copy', 0)} dictionary results of 15+ words to copy, "
                        f"fewer than {lim['copy15_min']}")
    if not n or remembered / n > lim["remembered_max"]:
        problems.append(f"{remembered} of {n} dictionary results repeat a definition the corpus teaches "
                        f"(at most {lim['remembered_max']:.0%})")
    return problems


# a reply to a tool's result that starts without a thought: the history form (conversations.render_doc)
BARE_AFTER_TOOL = re.compile(r"</tool_response><\|im_end\|>\n<\|im_start\|>assistant\n(?!<think>)")


def check_v3j(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3j") -> list:
    """v3j: v3i's checks, and no trained reply to a tool's result that starts without a thought
    (every such reply in the history form is context: conversations.render_doc)."""
    lim = lim or LIMITS[variant]
    problems = check_v3i(work, lim, held, variant=variant)
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        for m in BARE_AFTER_TOOL.finditer(d["text"]):
            if any(a <= m.end() < b for a, b in d.get("spans", ())):
                problems.append(f"a {d['kind']} document trains a reply to a tool's result without a thought: "
                                f"{d['text'][m.end(): m.end() + 60]!r}")
                break
        if len(problems) > 40:
            break
    return problems


def check_v3k(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3k") -> list:
    """v3k: v3j's checks, and every reply to a tool's result in the history form (before the last
    user turn) read only: a quiet span of its document, and, once encoded, mask.npy 2 (which
    train_torch weighs 0)."""
    import numpy as np

    problems = check_v3j(work, lim, held, variant=variant)
    quiet = 0
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        starts = {a for a, _ in d.get("quiet", ())}
        quiet += len(starts)
        last_q = d["text"].rfind("<|im_start|>user\n")   # the replies after it think (render_doc)
        for m in BARE_AFTER_TOOL.finditer(d["text"]):
            if m.end() < last_q and m.end() not in starts:
                problems.append(f"a {d['kind']} document reads a reply to a tool's result without a thought "
                                f"that is not quiet: {d['text'][m.end(): m.end() + 60]!r}")
                break
        if len(problems) > 40:
            break
    if not quiet:
        problems.append("no quiet span: the history replies to a tool's result would weigh as prompts do")
    data = Path(work) / "data" / "mask.npy"
    if quiet and data.exists() and not (np.load(data) == 2).any():
        problems.append("mask.npy marks nothing read only (2): the quiet spans did not reach the encoding")
    return problems


# a thinking answer to a tool's result after a call rendered bare (its thought not sent back)
AFTER_BARE_CALL = re.compile(r"<\|im_start\|>assistant\n<tool_call>(?:(?!<\|im_start\|>user\n(?!<tool_response>)).)*?"
                             r"</tool_response><\|im_end\|>\n<\|im_start\|>assistant\n<think>\n(?!\n</think>)", re.S)


def check_v3l(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3l") -> list:
    """v3l: v3k's checks, and at least LIMITS' after_bare_call_min answers that think after a call a
    client sent back without its thought (trained, from right after the `<think>\n` the prompt opens),
    no such call trained (the model wrote it after a thought)."""
    lim = lim or LIMITS["v3l"]
    problems = check_v3k(work, lim, held, variant=variant)
    found = 0
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        for m in AFTER_BARE_CALL.finditer(d["text"]):
            found += any(a == m.end() for a, _ in d["spans"])
            call = m.start() + len("<|im_start|>assistant\n")
            if any(a == call for a, _ in d["spans"]):
                problems.append(f"a {d['kind']} document trains a call whose thought was dropped: "
                                f"{d['text'][call: call + 60]!r}")
    if found < lim["after_bare_call_min"]:
        problems.append(f"{found} answers think after a call sent back without its thought, "
                        f"fewer than {lim['after_bare_call_min']}")
    return problems


# the tool list of a system turn (Qwen3.5's template: one JSON object a line inside <tools>)
TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)


def check_v3m(work: Path, lim: dict | None = None, held: set | None = None, variant: str = "v3m") -> list:
    """v3m: v3l's checks, at least LIMITS' alone_min tool conversations that offer a single tool, and
    none of the evaluations' leaks that conversations_v3.strict_held_out drops."""
    import conversations_v3 as CV3

    lim = lim or LIMITS[variant]
    problems = check_v3l(work, lim, held, variant=variant)
    defs = [json.loads(l)["definition"].lower() for l in open(Path(work) / "corpus" / "tools_eval.jsonl")]
    words = CV3.json_eval_words()
    alone = 0
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        m = TOOLS_BLOCK.search(d["text"])
        alone += bool(m and len(m.group(1).strip().splitlines()) == 1)
        why = CV3.evaluation_leak(d, defs, words)
        if why:
            problems.append(f"a {d['kind']} document gives away an evaluation's answer ({why}): {d['text'][:80]!r}")
        if len(problems) > 40:
            break
    if alone < lim["alone_min"]:
        problems.append(f"{alone} tool conversations offer a single tool, fewer than {lim['alone_min']}")
    return problems


def check_v3n(work: Path, lim: dict | None = None, held: set | None = None) -> list:
    """v3n: v3m's checks (where a dictionary may take one of everyday_v3.NATURAL_DICT_NAMES), at least
    LIMITS' natural_min conversations offering one, each beside other tools, and none offering an
    evaluation name."""
    import eval_v3

    lim = lim or LIMITS["v3n"]
    natural = set(V3.NATURAL_DICT_NAMES)
    problems = check_v3m(work, lim, held, variant="v3n")
    found = 0
    for line in open(Path(work) / "corpus" / "docs.jsonl"):
        d = json.loads(line)
        m = TOOLS_BLOCK.search(d["text"]) if d["kind"] == "tools" else None
        names = {n for n, _ in TOOL_DEF.findall(m.group(1))} if m else set()
        if names & natural:
            found += 1
            if len(names) < 2:
                problems.append(f"a natural dictionary name offered alone: {sorted(names)}")
        if names & set(eval_v3.EVAL_NAMES):
            problems.append(f"an evaluation name offered in training: {sorted(names & set(eval_v3.EVAL_NAMES))}")
    if found < lim["natural_min"]:
        problems.append(f"{found} tool conversations offer a natural dictionary name, fewer than {lim['natural_min']}")
    return problems


CHECKS = {"v3c": check_held_out, "v3d": check_v3d, "v3e": check_v3e, "v3f": check_v3f, "v3g": check_v3g,
          "v3h": check_v3h, "v3i": check_v3i, "v3j": check_v3j,
          "v3k": check_v3k, "v3l": check_v3l, "v3m": check_v3m, "v3n": check_v3n}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=sorted(CHECKS), required=True)
    ap.add_argument("--work", default=None, help="the prepared folder (default artifacts/demo/<variant>, v3c: artifacts/demo/v3)")
    a = ap.parse_args()
    work = Path(a.work or REPO / "artifacts" / "demo" / {"v3c": "v3"}.get(a.variant, a.variant))   # prepare_v3.WORKS
    if not (work / "corpus" / "docs.jsonl").exists():
        raise SystemExit(f"{work}/corpus/docs.jsonl is missing: prepare it first "
                         f"(python scripts/demo_model/prepare_v3.py --variant {a.variant})")
    problems = CHECKS[a.variant](work)
    for p in problems[:50]:
        print(p)
    if problems:
        raise SystemExit(f"{len(problems)} problems in {work}")
    print(f"{work}: fit to train")


if __name__ == "__main__":
    main()
