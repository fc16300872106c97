"""Demo v3's corpus (issue 35): v3's new exchanges (everyday_v3.py) and a share of v2's, held out
of the judge's questions, assembled into whole conversations and rendered with the demo's chat
template exactly as v2's (conversations.Renderer / render_doc: every reply starts where the
app's generation prompt ends). v2's own build (conversations.build) is untouched: this is a
separate entry point with its own seed and output folder.

    python scripts/demo_model/conversations_v3.py --out artifacts/demo/v3/corpus [--examples 3]
    python scripts/demo_model/conversations_v3.py --variant v3d --out artifacts/demo/v3d/corpus

Documents (docs.jsonl, the format tokenizer.encode_corpus reads):
  chat     1-6 exchanges of any kind, v3's short answers first among them
  topic    (e) a conversation about one word, follow-ups referring back to it
  json     (b) one request, thinking off (the API turns it off for a structured reply), and the
           JSON reply; a third of them after a short chat
  tools    (c) 2-5 tools offered, calls of the fitting one, results, answers that repeat them
  long     conversations of 1.5-4k tokens (a quarter with a pasted passage), so that the 4,096-token
           windows stay filled with whole conversations as in v2
  prose    v2's plain documents (Python tutorial, Jane Austen)
  explain  (--variant v3g) 1-3 questions that ask for an explanation ("Explain what a X is.", "What is a X?
           Give an example.", "Who was X?", "What does the word X mean?"), each answered in 3-5 sentences
           from the short answers' facts (everyday_v3 section i)
  note_*   (f) plain notes stating the short answers' facts in several phrasings, no questions
           (everyday_v3.fact_notes), for every subject but the tool evaluation's words and v2's
           held-out topics: the judge's held-out subjects' facts too, as statements only
           (--variant v3d: notes of a focused set only, everyday_v3.focus_facts, each fact stated
           80 times in >= 5 phrasings, ~35 % of the tokens; the other kinds thinned: VARIANTS)
Thinking (d): the last reply of a document has a short thought (everyday_v3.thought: the subject
named in a few words) in THINK_FRAC of the documents, an empty think block otherwise.

Held out: the judge's 75 questions (heldout_everyday.Exclusion on every exchange, v2's included;
their facts are stated in notes, never asked or answered) and everything v2 held out
(conversations.held_out: the everyday and race prompts' subjects, the tool evaluation's words).
"""
from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from pathlib import Path

import conversations as C
import everyday
import everyday_v3 as V3
import heldout_everyday as H

HERE = Path(__file__).resolve().parent
THINK_FRAC = 0.5
# what to keep of v2's exchange kinds (fraction): v3's short answers replace v2's long concept
# answers to "What is a X?" (two shapes for one question confuse a small model), and arithmetic and
# the word-level shapes are thinned so that v3's kinds are most of what the model writes
V2_KEEP = {"concept": 0.0, "define": 0.35, "example": 0.5, "synonym": 0.5, "antonym": 0.0, "hypernym": 0.0,
           "arithmetic": 0.4, "difference": 0.3, "spelling": 0.5}


def _v2_exchanges(rng, exclude, keep=V2_KEEP):
    parts, prose, wn = C.exchanges(rng)
    tool_words = {w.strip() for w in (HERE / "tool_words.txt").read_text().split()}
    evals = {l.strip().lower() for f in ("everyday_prompts.txt", "race_prompts.txt")
             for l in (HERE / f).read_text().splitlines() if l.strip()}
    items, removed = [], 0
    for d in (d for v in parts.values() for d in v):
        if C.held_out(d, tool_words, evals) or exclude(d):
            removed += 1
        elif rng.random() < keep.get(d["kind"], 1.0):
            items.append(d)
    return items, prose, wn, removed, tool_words


# The corpus variants. v3c: V3's documents and notes of ~15k facts in 1-3 phrasings (~6 % of the
# corpus). v3d: notes of a focused set (everyday_v3.focus_facts: the 1,000 most frequent nouns'
# definitions and kinds, the 600 most frequent words with an antonym, every national capital, the
# Python basics; ~2.9k facts), each fact stated REPEATS times in >= 5 phrasings, ~1/3 of the corpus;
# V3's other documents thinned to leave them room, the short answers about focused subjects first.
VARIANTS = {
    "v3c": {"n_docs_chat": 17000, "n_long": 900, "n_json": 12000, "n_topics": 4000, "n_tools": 6000,
            "prose_keep": 1.0, "notes": "all"},
    "v3d": {"n_docs_chat": 13000, "n_long": 300, "n_json": 9000, "n_topics": 3000, "n_tools": 4000,
            "prose_keep": 0.6, "notes": "focus", "repeats": 80, "per_note": (8, 20)},
    # v3e: v3d's focused notes, fewer statements each (~27 % of the tokens), and (everyday_v3 section h)
    # the focused facts of the subjects that are not the judge's ASKED in short drills (each fact
    # DRILL_ASKS times, the answer restating the subject first), copying drills of rare long words, and
    # the tool conversations back above v3c's count (names to copy, words copied exactly)
    "v3e": {"n_docs_chat": 9000, "n_long": 150, "n_json": 9000, "n_topics": 3000, "n_tools": 0,
            "n_tools_v3e": 6500, "prose_keep": 0.6, "notes": "focus", "repeats": 68, "per_note": (8, 20),
            "drills": True, "n_copy": 6000},
}
# v3f: v3e's corpus with more tool conversations, thinking in most of them, each thought listing the
# offered tools' names before it names the one that fits (V3_PLAN.md section 13: v3e-more2 copied the
# word into the call, but named the offered dictionary in 10 of 50)
VARIANTS["v3f"] = {**VARIANTS["v3e"], "n_tools_v3e": 9000, "tool_think_frac": 0.85, "list_tools": True}
# v3g: v3f's corpus with (everyday_v3 section i) explained answers of 3-5 sentences to the questions that ask
# for an explanation (v3f wrote ~20 tokens to the Race tab's prompts: the race showed ~1.1x), and every
# made tool's name from a pool of real-word names used about once each, the other offered tools renamed
# in `rename_frac` of the conversations, the dictionary first in `dict_frac` (v3f named the offered
# dictionary 9 times of 50, writing names of its training's shapes). Room for them: JSON 5,000 (v3f
# 9,000), chats 8,000 (9,000), long conversations 120 (150), v2's prose 30 % (60 %), each focused fact
# stated 60 times (68); v2's one-sentence "Who was X?" answers left out (the explained ones answer it)
VARIANTS["v3g"] = {**VARIANTS["v3f"], "n_json": 5000, "n_docs_chat": 8000, "n_long": 120, "prose_keep": 0.3,
                   "repeats": 60, "v2_keep": {"person": 0.0}, "explain": True, "real_names": True, "dict_frac": 0.7,
                   "rename_frac": 0.4}
# v3h: v3g's corpus with (everyday_v3 section j) a common word's dictionary result often another of its
# senses, so that the answer can only come from the result (v3g-more used it in 6-11 of 50 answers,
# drifting from the copied definition into a remembered one), 6,000 drills asking a whole unseen
# gloss back word for word, and an explained person named by a shorter name of theirs after the first
# sentence (v3g2-more's 3 "loops" in 200 were "Leonardo da Vinci ..." opening four sentences)
VARIANTS["v3h"] = {**VARIANTS["v3g"], "n_span": 6000, "other_senses": True, "person_alias": True}
# v3i: v3h's corpus with the dictionary results that must be copied longer and more of them (V3_PLAN
# section 25: v3h-more copied definitions of up to 6 words in 11 of 12 tool answers, of 11+ words in 2
# of 19, and its training held 11 results of 15+ words that were not also a fact it learnt): glosses
# of up to 32 words with their parentheses (rare words, other senses up to the sixth, span drills), a
# pool of 4-9-letter nouns whose first sense is no fact of the corpus, the results drawn by length
# (35 % of 2-8 words, 35 % 9-14, 30 % 15-32) and from the remembered definitions in 10 % only, and a
# conversation that opens with the dictionary holding 1-4 requests, most of them look-ups
VARIANTS["v3i"] = {**VARIANTS["v3h"], "long_glosses": True, "sense_last": 6, "mid_words": True,
                   "dict_strata": ((2, 8, 0.35), (9, 14, 0.35), (15, 32, 0.30)), "recall_share": 0.10,
                   "lookups": (1, 2, 2, 3, 4)}
# v3j: v3i's corpus with the history replies to a tool's result left untrained (context, weighted as
# prompts are): v3i-ft, fine-tuned on v3i's tool conversations, answered a tool's result inside the
# thought the prompt opens in 50 of 50 (V3_PLAN section 26), and v3i held 9,342 such replies that start
# right after `<|im_start|>assistant\n` against 8,667 that think first (v3h: 2,251 against 8,686)
VARIANTS["v3j"] = {**VARIANTS["v3i"], "untrained_tool_history": True}
# v3k: v3j's with those replies weighed 0 (mask 2), not as prompts are: at 0.3 v3j's 9,342 still weigh
# more than v3h's 2,251 trained ones, and v3h-more already left 5 of 50 thoughts open
VARIANTS["v3k"] = {**VARIANTS["v3j"], "quiet_tool_history": True}
# v3l: v3k's with half the thinking conversations' earlier replies after the last question sent back
# without their thought, as clients do: in v3k a call rendered bare came only in conversations with
# thinking off, where the answer follows `<think>\n\n</think>\n\n`, so after a client's bare call and
# the `<think>\n` the app's prompt opens, v3k-ft answered inside the thought (47 of 50, V3_PLAN section 27)
VARIANTS["v3l"] = {**VARIANTS["v3k"], "client_drops_thoughts": 0.5}
# v3m: v3l's with (V3_PLAN section 30) 30 % of the tool conversations offering only the tools they
# use, so a third of those that open with the dictionary offer it alone (v3l, always offered two to six
# tools, never called a dictionary offered alone: 0 of 50), and the evaluations' leaks closed: no
# document holds a tool evaluation word's definition (37 in v3l, through synonyms sharing a gloss and
# v2's comparisons) or a JSON answer about a JSON evaluation's word (eval_v3.py's and eval_api.py's)
VARIANTS["v3m"] = {**VARIANTS["v3l"], "alone_frac": 0.3, "strict_held_out": True}
# v3n: v3m's with (V3_PLAN section 31) the names clients give a dictionary (everyday_v3.NATURAL_DICT_NAMES)
# in 10 % of the conversations that offer it beside other tools (v3m, offered define_word beside
# get_weather, called get_weather: the name was never trained, and the API's hold then picked "get"),
# and twice the span drills (v3m answered 76 % of unseen results with their first six words)
VARIANTS["v3n"] = {**VARIANTS["v3m"], "natural_frac": 0.1, "n_span": 12000}
# the system prompts an explained answer may follow: none that asks for brevity
LONG_OK_SYSTEM = [p for p in C.SYSTEM_PROMPTS if not re.search(r"brief|concise|short", p)]


def _v3e_docs(seed, cfg, focus, parts, arith, exclude, tool_words, emit, system):
    """v3e's added documents: "drill" (2-8 short exchanges of the binding drills and copying drills;
    half of them one kind only, so the context holds other subjects of the same kind and the answer
    must follow the last question's subject) and "tools" (tool_conversations_v3e). Returns stats."""
    import eval_v3

    rng = random.Random(seed + 3)
    held = V3.heldout_subjects()
    skip = lambda w: w.lower() in held or w in tool_words or w in C.HELDOUT_TOPICS  # noqa: E731
    drills = V3.binding_drills(rng, focus, held, exclude)
    syn, idx = H._wordnet()
    gl = {"most": V3.LONG_GLOSS_WORDS, "bar": V3.LONG_GLOSS_BAR} if cfg.get("long_glosses") else {}
    rare = V3.rare_words(syn, idx, skip, **gl)
    copies = V3.copy_drills(rng, [w for w, _ in rare], cfg["n_copy"], exclude)
    asked = Counter((d["kind"], str(d.get("word") or d.get("subject")).lower()) for d in drills)
    # v3h's texts name no held-out subject, no tool evaluation word, no held-out topic
    skipped = {s.lower() for s in held | set(tool_words) | set(C.HELDOUT_TOPICS)}
    skipped_re = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(skipped, key=len, reverse=True)) + r")\b")
    # v3h: whole glosses asked back (their own generator, so the earlier variants' draws stay theirs)
    spans = V3.span_drills(random.Random(seed + 7), syn, cfg["n_span"], skipped_re, exclude, **gl) if cfg.get("n_span") else []
    items = drills + copies + spans
    rng.shuffle(items)
    half = len(items) // 2
    grouped = sorted(items[:half], key=lambda d: d["kind"])   # stable: one kind per run, shuffled within
    n_docs = 0
    for block in (grouped, items[half:]):
        i = 0
        while i < len(block):
            k = rng.choice([2, 3, 4, 4, 5, 6, 8])
            msgs = system([])
            for d in block[i:i + k]:
                msgs += [C.user(d["messages"][0]), C.assistant(d["messages"][1])]
            emit("drill", msgs, None, rng.random() < THINK_FRAC, block[i:i + k][-1])
            i += k
            n_docs += 1
    # tools: dictionary words half common (v3's definitions), half rare and long; capitals; names to copy
    trng = random.Random(seed + 4)
    held_re = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(held, key=len, reverse=True)) + r")\b")
    common = {}
    for d in parts["v3_definition"]:
        if " " not in d["word"] and not held_re.search(d["word"]) and d["word"] not in common:
            common[d["word"]] = re.sub(r'^\w+ [^ ]+ is |\.? For example.*$|\.$', "", d["messages"][1])
    common = sorted(common.items())
    rare_pick = trng.sample(sorted(rare), min(len(common), len(rare)))
    dict_words = common + rare_pick
    senses = []
    if cfg.get("other_senses"):   # v3h: a common word's result often another of its senses (not the fact learnt)
        senses = [(w, g) for w, g in V3.other_senses(syn, idx, [w for w, _ in common], last=cfg.get("sense_last", 4), **gl)
                  if not skipped_re.search(g.lower())]
        dict_words += senses
    mid, dict_draw = [], None
    if cfg.get("mid_words"):   # v3i: shorter nouns whose first sense is no fact the corpus teaches
        taught = {w for w, _ in common}
        mid = [(w, g) for w, g in V3.rare_words(syn, idx, skip, min_len=4, max_len=9, **gl)
               if w not in taught and not skipped_re.search(g.lower())]
    if cfg.get("dict_strata"):
        dict_draw = _stratified_draw(common, rare_pick + senses + mid, cfg["dict_strata"], cfg["recall_share"])
    caps = sorted({m.groups() for m in (re.match(r"The capital of (.+) is (.+)\.$", d["messages"][1])
                                        for d in parts["v3_capital"]) if m and not (set(map(str.lower, m.groups())) & held)})
    plain = [d for d in parts["v3_opposite"] + parts["v3_kind"] if not exclude(d) and not held_re.search(d["messages"][0].lower())]
    banned = set(eval_v3.EVAL_NAMES) | set(V3.CALC_NAMES) | {t[0] for t in V3.OTHER} | {t[0] for t in C.OTHER_TOOLS}
    for verbs, nouns in ((V3.DICT_VERBS, V3.DICT_NOUNS), (V3.CAP_VERBS, V3.CAP_NOUNS)):
        banned |= {f"{v}_{n}" for v in verbs for n in nouns} | {f"{n}_{v}" for v in verbs for n in nouns} \
            | set(nouns) | {f"{v}{n.capitalize()}" for v in verbs for n in nouns}
    name_words = sorted({f["subject"] for f in focus["definition"] if re.fullmatch(r"[a-z]{3,9}", f["subject"])})
    pool = None
    if cfg.get("real_names"):   # v3g: names of real words, each once, none an evaluation name or of its stems
        stems = V3.copy_stems(eval_v3.EVAL_NAMES)
        pool = V3.real_names(random.Random(seed + 6), *V3.tool_name_words(skip), 4 * cfg["n_tools_v3e"],
                             lambda nm: nm in banned or V3.clashes(nm, eval_v3.EVAL_NAMES, stems))
    convs = V3.tool_conversations_v3e(trng, dict_words, caps, arith, plain, exclude, cfg["n_tools_v3e"],
                                      banned=banned, name_words=name_words,
                                      think_frac=cfg.get("tool_think_frac", 0.5), list_tools=cfg.get("list_tools", False),
                                      dict_draw=dict_draw, lookups=cfg.get("lookups"), alone_frac=cfg.get("alone_frac", 0.0),
                                      natural_frac=cfg.get("natural_frac", 0.0),
                                      **({"names": iter(pool), "rename_frac": cfg["rename_frac"],
                                          "dict_frac": cfg["dict_frac"]} if pool else {}))
    for msgs, tools, thinking in convs:
        emit("tools", system([]) + msgs, tools, thinking)
    dict_names = Counter(t["function"]["name"] for _, tools, _ in convs for t in tools
                         if t["function"]["description"] in V3.DICT_DESC)
    per_subject = Counter()
    for (k, s), n in asked.items():
        per_subject[s] += n
    vals = sorted(per_subject.values())
    return {"drill_exchanges": len(drills), "copy_drills": len(copies), "span_drills": len(spans), "drill_docs": n_docs,
            "drill_exchanges_by_kind": dict(Counter(d["kind"] for d in drills)),
            "drilled_subjects": len(per_subject),
            "asks_per_subject_min_median_max": [vals[0], vals[len(vals) // 2], vals[-1]] if vals else None,
            "held_out_subjects": len(held), "tool_conversations_v3e": len(convs),
            "dict_words_common_rare_senses": [len(common), len(rare_pick), len(senses)],
            **({"dict_mid_words": len(mid), **dict_results(convs, {d for _, d in common})} if cfg.get("dict_strata") else {}),
            **({"dict_names_distinct": len(dict_names), "dict_names_most_used": dict_names.most_common(1)[0][1],
                "name_pool": len(pool)} if pool else {})}


def _stratified_draw(recall, copy, strata, recall_share):
    """rng -> (word, definition): a remembered definition (`recall`: the facts' own) in `recall_share`
    of draws, else one to copy, its length in words drawn first by `strata` ((least, most, share))."""
    by = [([(w, g) for w, g in copy if lo <= len(g.split()) <= hi], share) for lo, hi, share in strata]
    pools, shares = zip(*[(pool, share) for pool, share in by if pool])   # an empty stratum's share goes to the rest

    def draw(rng):
        if rng.random() < recall_share:
            return rng.choice(recall)
        return rng.choice(rng.choices(pools, shares)[0])
    return draw


def dict_results(convs, remembered: set) -> dict:
    """What the tool conversations' dictionary results ask to be copied: how many, how many also a
    definition the corpus teaches as a fact (`remembered`: answerable from memory), how many of 15+
    words that are not."""
    defs = [json.loads(m["content"]).get("definition") for msgs, _, _ in convs for m in msgs
            if m["role"] == "tool" and m["content"].startswith('{"word"')]
    defs = [d for d in defs if d]
    recall = sum(d in remembered for d in defs)
    return {"dict_results": len(defs), "dict_results_remembered": recall,
            "dict_results_15plus_to_copy": sum(len(d.split()) >= 15 and d not in remembered for d in defs)}


def _v3g_docs(seed, wn, held, skip, exclude, emit, think_frac=0.7, alias=False):
    """v3g's explained answers (everyday_v3 section i) in documents of their own ("explain": 1-3 exchanges,
    the last one's thought naming the subject and the plan in `think_frac` of them; a system prompt in a
    quarter, never one asking for brevity), from streams of their own (seed + 5); `alias`: v3h's
    person answers (everyday_v3.explain_person). Returns stats."""
    rng = random.Random(seed + 5)
    nouns = V3.explain_noun_facts(wn, skip)
    persons = V3.explain_person_facts(wn, skip)
    adjectives = V3.explain_adjective_facts(wn, skip)
    items = V3.explained_answers(rng, nouns, persons, adjectives, held, exclude, alias=alias)
    rng.shuffle(items)
    i = n_docs = 0
    while i < len(items):
        k = rng.choice([1, 1, 2, 3])
        msgs = [{"role": "system", "content": rng.choice(LONG_OK_SYSTEM)}] if rng.random() < 0.25 else []
        for d in items[i:i + k]:
            msgs += [C.user(d["messages"][0]), C.assistant(d["messages"][1])]
        emit("explain", msgs, None, rng.random() < think_frac, items[i:i + k][-1])
        i += k
        n_docs += 1
    words = [len(d["messages"][1].split()) for d in items]
    return {"explained": len(items), "explain_docs": n_docs,
            "explained_by_kind": dict(Counter(d["about"] for d in items)),
            "facts_nouns_persons_adjectives": [len(nouns), len(persons), len(adjectives)],
            "sentences": dict(sorted(Counter(d["sentences"] for d in items).items())),
            "words_mean_max": [round(sum(words) / len(words), 1), max(words)]}


def json_eval_words() -> set:
    """The words the JSON evaluations ask about: eval_v3.py's (the judge's definition and opposite
    subjects) and eval_api.py's (json_words.txt)."""
    import judge

    words = {it["subject"].lower() for it in judge.load_items() if it["category"] in ("definition", "opposite")}
    return words | set((HERE / "json_words.txt").read_text().split())


def evaluation_leak(doc, definitions, words):
    """Why a document gives away an evaluation's answer, or None: it holds a tool evaluation word's
    definition (lower case), or it is a JSON answer about a JSON evaluation's word."""
    low = doc["text"].lower()
    if any(x in low for x in definitions):
        return "tool_eval_definition"
    if doc["kind"] == "json" and any(w in words for w in re.findall(r'"word": "([^"]+)"', low)):
        return "json_eval_word"
    return None


def strict_held_out(docs, wn, tool_words):
    """(docs kept, {why: documents dropped}): none that gives away an evaluation's answer
    (evaluation_leak; the definitions are write_tools_eval's, the words' first noun sense)."""
    defs = [everyday._gloss(wn.syn[wn.idx[(w, "n")]["synsets"][0]]["def"]).lower() for w in sorted(tool_words)]
    words = json_eval_words()
    kept, dropped = [], Counter()
    for d in docs:
        why = evaluation_leak(d, defs, words)
        if why:
            dropped[why] += 1
        else:
            kept.append(d)
    return kept, dict(dropped)


def build(out_dir, seed=35, n_docs_chat=None, n_long=None, examples=0, notes=True, variant="v3c"):
    cfg = VARIANTS[variant]
    n_docs_chat = cfg["n_docs_chat"] if n_docs_chat is None else n_docs_chat
    n_long = cfg["n_long"] if n_long is None else n_long
    rng = random.Random(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    judge_ex = H.Exclusion()
    render = C.Renderer()
    v2_items, prose, wn, removed, tool_words = _v2_exchanges(rng, judge_ex, {**V2_KEEP, **cfg.get("v2_keep", {})})
    evals = {l.strip().lower() for f in ("everyday_prompts.txt", "race_prompts.txt")
             for l in (HERE / f).read_text().splitlines() if l.strip()}
    # v3's own exchanges keep v2's held-out rules too (evaluate.py's everyday and race prompts and the
    # tool evaluation's words stay unseen, so v2 and v3 are measured on the same unseen prompts)
    exclude = lambda d: judge_ex(d) or C.held_out(d, tool_words, evals)  # noqa: E731
    arith = [d for d in v2_items if d["kind"] == "arithmetic"]
    parts, tool_convs = V3.generate(seed, exclude, arith, cfg["n_json"], cfg["n_topics"], cfg["n_tools"])
    skip = lambda w: w in tool_words or w in C.HELDOUT_TOPICS  # noqa: E731  (the notes' subjects kept out)
    focus = V3.focus_facts(*H._wordnet(), skip) if cfg["notes"] == "focus" else None
    v3_single = [d for k, v in parts.items() if k not in ("v3_json", "v3_topic") for d in v]
    rng.shuffle(v3_single)
    rng.shuffle(v2_items)
    # held-out conversations of v3's own kinds (stratified), for the probe's held-out loss
    eval_set = []
    for k in ("v3_capital", "v3_place", "v3_opposite", "v3_kind", "v3_definition", "v3_python"):
        ds = [d for d in v3_single if d["kind"] == k][:8]
        eval_set += ds
    ids = {id(d) for d in eval_set}
    v3_single = [d for d in v3_single if id(d) not in ids]
    if focus:  # v3d: the short answers about the focused subjects first (all of them used), the rest after
        subj = {"v3_definition": "definition", "v3_kind": "kind", "v3_opposite": "opposite", "v3_capital": "capital",
                "v3_python": "python"}
        have = {k: {f["subject"].lower() for f in v} for k, v in focus.items()}
        have["place"] = {f["n"].lower() for f in focus["capital"]}
        key = lambda d: str(d.get("word") or d.get("subject") or "").lower() not in have[  # noqa: E731
            subj.get(d["kind"], "place")]
        v3_single.sort(key=key)
    if cfg["prose_keep"] < 1.0:  # from a stream of its own
        keep = random.Random(seed + 2)
        prose = [p for p in prose if keep.random() < cfg["prose_keep"]]
    passages = [p["text"] for p in prose if len(p["text"]) > 400]
    docs, shown = [], Counter()
    q3, q2 = iter(v3_single), iter(v2_items)

    def take():
        # two of three exchanges from v3's kinds while they last
        src = q3 if rng.random() < 0.67 else q2
        d = next(src, None) or next(q2, None) or next(q3, None)
        return d

    def ex(d, thinking_last=False):
        msgs = [C.user(d["messages"][0]), C.assistant(d["messages"][1])]
        for i in range(2, len(d["messages"]), 2):  # topic conversations: follow-ups
            msgs += [C.user(d["messages"][i]), C.assistant(d["messages"][i + 1])]
        return msgs

    drops = random.Random(seed + 1) if cfg.get("client_drops_thoughts") else None   # its own stream: v3k's text stays

    def emit(kind, msgs, tools, thinking, last=None):
        if thinking and last is not None and msgs[-1]["role"] == "assistant" and "reasoning_content" not in msgs[-1]:
            msgs[-1]["reasoning_content"] = V3.thought(last)
        if not thinking:
            for m in msgs:
                m.pop("reasoning_content", None)
        else:  # only the replies after the last user question keep a thought (the template drops the rest)
            lq = max(i for i, m in enumerate(msgs) if m["role"] == "user")
            for m in msgs[:lq]:
                m.pop("reasoning_content", None)
            # v3l: as a client sends a call back, without its thought (the openai client keeps no
            # reasoning), so the answer to its result must think after a bare call, too
            if drops is not None and drops.random() < cfg["client_drops_thoughts"]:
                for m in msgs[lq:-1]:
                    m.pop("reasoning_content", None)
        quiet = [] if cfg.get("quiet_tool_history") else None
        text, spans = C.render_doc(render, msgs, tools, thinking, check=len(docs) % 300 == 0,
                                   history_after_tool=not cfg.get("untrained_tool_history"), quiet=quiet)
        docs.append({"kind": kind, "text": text, "spans": spans, **({"quiet": quiet} if quiet else {})})
        if shown[kind] < examples:
            shown[kind] += 1
            print(f"--- {kind} example {shown[kind]}\n{text}\n", flush=True)

    def system(msgs):
        if rng.random() < 0.25:
            msgs.append({"role": "system", "content": rng.choice(C.SYSTEM_PROMPTS)})
        return msgs

    # (e) topics and (b) JSON requests
    for d in parts["v3_topic"]:
        thinking = rng.random() < THINK_FRAC
        emit("topic", system([]) + ex(d), None, thinking, {"kind": d["last_kind"], "word": d["word"]})
    for d in parts["v3_json"]:
        msgs = [{"role": "system", "content": d["system"]}] if d["system"] else []
        if rng.random() < 0.3:
            pre = take()
            if pre:
                msgs += ex(pre)
        msgs += [C.user(d["messages"][0]), C.assistant(d["messages"][1])]
        emit("json", msgs, None, False)
    # (c) tools
    for msgs, tools, thinking in tool_convs:
        emit("tools", system([]) + msgs, tools, thinking)
    drill_stats = None
    if cfg.get("drills"):   # v3e: binding and copying drills, tools back; streams of their own (seed + 3, + 4)
        drill_stats = _v3e_docs(seed, cfg, focus, parts, arith, exclude, tool_words, emit, system)
    explain_stats = None
    if cfg.get("explain"):  # v3g: explained answers, the drills' subjects kept out, and no question naming one of
        held = V3.heldout_subjects()   # the race's or everyday prompts' subjects at all ("a radio telescope")
        explain_stats = _v3g_docs(seed, wn, held | C.HELDOUT_TOPICS | tool_words,
                                  lambda w: w.lower() in held or w in tool_words or w in C.HELDOUT_TOPICS, exclude, emit,
                                  alias=cfg.get("person_alias", False))
    # chats of 1-6 exchanges, then long conversations
    for _ in range(n_docs_chat):
        msgs, last = system([]), None
        for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 4, 6])):
            last = take()
            if last is None:
                break
            msgs += ex(last)
        if last is None:
            break
        emit("chat", msgs, None, rng.random() < THINK_FRAC, last)
    for _ in range(n_long):
        target = rng.randint(1500, 4000) * 3.9
        msgs, last = system([]), None
        if rng.random() < 0.25 and passages:
            p = rng.choice(passages)
            while len(p) < rng.uniform(0.2, 0.8) * target:
                p += "\n\n" + rng.choice(passages)
            last = take()
            msgs += [C.user(rng.choice(C.PASSAGE_INTROS) + p + "\n\n" + last["messages"][0]),
                     C.assistant(last["messages"][1])]
        while sum(len(m["content"]) for m in msgs) < target:
            last = take()
            if last is None:
                break
            msgs += ex(last)
        if last is None or len(msgs) < 2:
            break
        emit("long", msgs, None, rng.random() < THINK_FRAC, last)
    if notes:   # (f), from a stream of their own: the documents above hold what they held without them
        made = V3.focus_notes(random.Random(seed + 1), focus, cfg["repeats"], cfg["per_note"]) if focus \
            else V3.fact_notes(random.Random(seed + 1), *H._wordnet(), skip)
        for n in made:
            docs.append({"kind": n["kind"], "text": n["text"], "spans": [[0, len(n["text"])]]})
            if shown[n["kind"]] < examples:
                shown[n["kind"]] += 1
                print(f"--- {n['kind']} example {shown[n['kind']]}\n{n['text']}\n", flush=True)
    strict = None
    if cfg.get("strict_held_out"):
        docs, strict = strict_held_out(docs, wn, tool_words)
    C.write_corpus(out, docs, prose, eval_set, wn, tool_words, rng)
    unused = sum(1 for _ in q3), sum(1 for _ in q2)
    chars = Counter()
    for d in docs:
        chars[d["kind"]] += len(d["text"])
    stats = {"seed": seed, "docs": len(docs), "chars": sum(chars.values()),
             "docs_by_kind": dict(Counter(d["kind"] for d in docs)), "chars_by_kind": dict(chars),
             "v3_exchanges_by_kind": {k: len(v) for k, v in parts.items()}, "v3_tool_conversations": len(tool_convs),
             "v2_exchanges_kept": len(v2_items), "v2_removed_as_held_out": removed,
             "unused_exchanges_v3_v2": list(unused), "eval_prompts": len(eval_set),
             "v2_exchanges_kept_by_kind": dict(Counter(d["kind"] for d in v2_items)), "variant": variant,
             "notes_share_of_chars": round(sum(v for k, v in chars.items() if k.startswith("note_")) / sum(chars.values()), 4)}
    if strict:
        stats["v3m_dropped"] = strict
    if drill_stats:
        stats["v3e"] = drill_stats
    if explain_stats:
        stats["v3g"] = explain_stats
    if focus:
        stats["focus"] = {"facts": {k: len(v) for k, v in focus.items()}, "facts_total": sum(map(len, focus.values())),
                          "statements_per_fact": cfg["repeats"],
                          "phrasings_min": min(len(V3.fact_phrasings(k, f)) for k, v in focus.items() for f in v),
                          "judge_subjects_covered": V3.focus_coverage(focus)}
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    print(json.dumps(stats, indent=1))
    return stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(HERE.parent.parent / "artifacts" / "demo" / "v3" / "corpus"))
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--examples", type=int, default=0, help="print this many rendered documents of each kind")
    ap.add_argument("--variant", default="v3c", choices=sorted(VARIANTS))
    a = ap.parse_args()
    build(a.out, a.seed, examples=a.examples, variant=a.variant)


if __name__ == "__main__":
    main()
