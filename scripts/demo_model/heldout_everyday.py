"""The held-out everyday questions of demo v3 (issue 35) and the exclusion hook of its data.

75 questions, 15 in each of five categories, drawn (seeded) from the same offline corpora the
training data comes from, each with what a right answer must contain, so that a committed
script (judge.py) can say "right" or "wrong" without a person:

  definition  "What does X mean?" about a common WordNet noun; right = at least two content
              words of one of its first two glosses (one if the gloss has one), e.g. violin ->
              bowed, stringed, instrument
  opposite    "What is the opposite of X?" about a common adjective with a WordNet antonym;
              right = one of its direct antonyms; wrong if the answer names one of its synonyms
  kind        "What kind of thing is a X?"; right = a lemma of its first sense's hypernyms up
              to three levels (violin -> bowed stringed instrument, stringed instrument,
              musical instrument)
  capital     "What is the capital of C?" from WordNet's instances of "national capital" whose
              gloss names the country ("the capital and largest city of Spain"); right = the
              city (or a WordNet synonym of it); wrong if another national capital is named
  python      "How do I <what the docs say it does> in Python?" from the Python 3.11 docs
              (built-in functions, list methods as the tutorial lists them, str methods);
              right = the function's or method's name; wrong if another one of the pool is named

Each line of heldout_everyday.jsonl: {"id", "category", "question", "subject", "subjects" (every
name the exclusion hook keys on), "any_of" (accepted answers), "min_hits" (how many distinct
any_of entries must appear), "none_of" (names whose mention makes the answer wrong), "source"}.

Why these questions are held out of training: the judge measures whether v3 answers from what it
learnt of the corpora, not whether it replays a training exchange of the very question. The data
generators of v3 call `Exclusion()(item)` on every exchange: one that names a held-out subject and
asks what the held-out question asks (the capital of Spain, or which country Madrid is the capital
of; the opposite of a word either way; its kind; its meaning; the Python function) is left out;
the rest of what the corpora say about the subject stays (see INTENT).

    python scripts/demo_model/heldout_everyday.py          # rewrites heldout_everyday.jsonl (seed 35)
"""
from __future__ import annotations

import argparse
import json
import random
import re
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELDOUT = HERE / "heldout_everyday.jsonl"
PYDOC = "/usr/share/doc/python3.11/html/_sources"
PER_CATEGORY = 15
CATEGORIES = ("definition", "opposite", "kind", "capital", "python")

# Words that say nothing about a particular meaning: a reply that hits only these has not
# defined anything (and every long reply would hit them by chance).
STOP = set("""a an the of in on at to for from by with without into onto or and but not no as is are was be being
been that which who whom whose this these those it its their his her one ones some any all each
other another such than then so very more most less least much many used use using especially
usually often typically something someone somebody thing things part kind sort type person people
way ways make makes made act action state quality having has have given give given place time
person's being also can may might e.g etc i.e either neither both whether when where while
within about over under between up down out off only just same similar""".split())

GENERIC = {"entity", "physical entity", "abstraction", "abstract entity", "object", "physical object", "whole",
           "unit", "thing", "matter", "causal agent", "cause", "causal agency", "living thing", "animate thing",
           "artifact", "artefact", "organism", "being", "instrumentality", "instrumentation", "part", "portion",
           "location", "group", "grouping", "relation", "measure", "quantity", "amount", "attribute"}

DEF_Q = ['What does "{w}" mean?', "What does {w} mean?", "Define {w}.", 'What is the meaning of "{w}"?',
         "What is {a} {w}?"]
OPP_Q = ['What is the opposite of "{w}"?', "What is the opposite of {w}?", "Give me an antonym for {w}.",
         'What is an antonym of "{w}"?']
KIND_Q = ["What kind of thing is {a} {w}?", "{A} {w} is a type of what?", 'What category does "{w}" belong to?']
CAP_Q = ["What is the capital of {c}?", "What's the capital of {c}?", "Which city is the capital of {c}?"]
PY_Q = ["How do I {d} in Python?", "In Python, how can I {d}?", "Which Python {k} do I use to {d}?"]


def _article(w):
    return "an" if w[:1].lower() in "aeiou" else "a"


def _w(lemma):
    return re.sub(r"\(\w+\)$", "", lemma.replace("_", " "))


def content_words(gloss: str, exclude=()):
    """The words of a gloss's first clause that carry meaning (no stop words, no word itself)."""
    first = re.sub(r"^\([^)]*\)\s*", "", gloss).split(";")[0]
    out = []
    for t in re.findall(r"[a-z][a-z'-]+", first.lower()):
        if t not in STOP and len(t) > 2 and t not in exclude and t not in out:
            out.append(t)
    return out


@lru_cache(maxsize=1)
def _wordnet():
    import sys

    sys.path.insert(0, str(HERE))
    from corpus import _wn_index, _wn_synsets

    return _wn_synsets(), _wn_index()


@lru_cache(maxsize=1)
def frequency():
    """(lemma, pos) -> how often WordNet's sense-tagged texts use it (cntlist.rev): "common" means
    frequent in running text, not rich in senses (index.*'s tagged count counts senses)."""
    pos = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}
    out = {}
    with open("/usr/share/wordnet/cntlist.rev", encoding="latin-1") as f:
        for line in f:
            key, _, cnt = line.split()
            lemma, _, rest = key.partition("%")
            k = (lemma, pos[rest[0]])
            out[k] = out.get(k, 0) + int(cnt)
    return out


def _lemmas(syn, key):
    return [_w(x) for x in syn[key]["words"]]


def definitions(rng, syn, idx, n):
    pool = []
    for (lemma, t), info in sorted(idx.items()):
        w = _w(lemma)
        if t != "n" or frequency().get((lemma, t), 0) < 40 or not re.fullmatch(r"[a-z]{4,12}", w):
            continue
        glosses = [syn[k]["def"] for k in info["synsets"][:2] if k in syn]
        senses = [content_words(g, exclude={w, w + "s"}) for g in glosses]
        if senses and len(senses[0]) >= 2:
            pool.append((w, senses, glosses))
    out = []
    for w, senses, glosses in rng.sample(pool, n):
        q = rng.choice(DEF_Q).format(w=w, a=_article(w))
        # any_of per sense: the judge needs min_hits of ONE sense's words (not one word of each)
        out.append({"category": "definition", "question": q, "subject": w, "subjects": [w],
                    "any_of": senses, "min_hits": 2, "none_of": [],
                    "source": "WordNet 3.0 glosses: " + " | ".join(glosses)})
    return out


def _antonyms(syn, info, lemma):
    ants = []
    for k in info["synsets"][:3]:
        for sym, off, pt, st in syn[k]["ptrs"]:
            if sym != "!":
                continue
            src, tgt = int(st[:2], 16), int(st[2:], 16)
            words = syn[k]["words"]
            if src and src <= len(words) and words[src - 1].split("(")[0].lower() != lemma:
                continue
            key = (off, pt if pt != "s" else "a")
            if key in syn and 1 <= tgt <= len(syn[key]["words"]):
                a = _w(syn[key]["words"][tgt - 1])
                if a not in ants:
                    ants.append(a)
    return ants


def opposites(rng, syn, idx, n):
    pool = []
    for (lemma, t), info in sorted(idx.items()):
        w = _w(lemma)
        if t != "a" or frequency().get((lemma, t), 0) < 30 or not re.fullmatch(r"[a-z]{3,12}", w):
            continue
        ants = _antonyms(syn, info, lemma)
        if not ants:
            continue
        syns = sorted({x for k in info["synsets"][:3] for x in _lemmas(syn, k)} - {w} - set(ants))
        syns = [s for s in syns if re.fullmatch(r"[a-z][a-z -]+", s)]
        pool.append((w, ants, syns))
    out, taken = [], set()
    for w, ants, syns in rng.sample(pool, len(pool)):
        if len(out) == n:
            break
        if w in taken or taken & set(ants):  # not hot and cold both: each pair once
            continue
        taken |= {w, *ants}
        q = rng.choice(OPP_Q).format(w=w)
        out.append({"category": "opposite", "question": q, "subject": w, "subjects": [w, *ants],
                    "any_of": [ants], "min_hits": 1, "none_of": syns[:8],
                    "source": f"WordNet 3.0 antonyms of {w}: {', '.join(ants)}"})
    return out


def kinds(rng, syn, idx, n):
    pool = []
    for (lemma, t), info in sorted(idx.items()):
        w = _w(lemma)
        if t != "n" or frequency().get((lemma, t), 0) < 25 or not re.fullmatch(r"[a-z]{4,12}", w):
            continue
        key, path = info["synsets"][0], []
        if w.endswith("s") or not any(p[0] == "@" for p in syn[key]["ptrs"]):
            continue  # "a clothes"; "more" whose first sense is Thomas More (an instance)
        while len(path) < 20:
            h = [p for p in syn[key]["ptrs"] if p[0] in ("@", "@i")]
            if not h:
                break
            key = (h[0][1], "n")
            path.append([x for x in _lemmas(syn, key) if x.lower() != w])
        # things, not abstractions ("What kind of thing is a violin?"), and never a top-level
        # category as an answer ("entity", "object" are right of nearly everything: not a test)
        if not any("physical entity" in level for level in path):
            continue
        chain = [[x for x in level if x not in GENERIC] for level in path[:3]]
        chain = [level for level in chain if level]
        if chain and len(chain[0]) == len(path[0]):
            pool.append((w, chain))
    out = []
    picked = rng.sample(pool, n)
    for w, chain in picked:
        q = rng.choice(KIND_Q).format(w=w, a=_article(w), A=_article(w).capitalize())
        accepted = sorted({x for level in chain for x in level})
        out.append({"category": "kind", "question": q, "subject": w, "subjects": [w],
                    "any_of": [accepted], "min_hits": 1, "none_of": [],
                    "source": "WordNet 3.0 hypernyms: " + " > ".join("/".join(l) for l in chain)})
    # a reply listing categories wholesale names the others' direct hypernyms: those are wrong here
    direct = {w: set(c[0]) for w, c in picked}
    for item, (w, chain) in zip(out, picked):
        mine = {x for level in chain for x in level}
        item["none_of"] = sorted({x for v, d in direct.items() if v != w for x in d} - mine)
    return out


def capitals(rng, syn, idx, n):
    nc = idx[("national_capital", "n")]["synsets"][0]
    pool = {}
    for key, s, country, names in national_capitals(syn, nc):
        if any(n.lower() in country.lower() or country.lower() in n.lower() for n in names):
            continue  # Djibouti, Djibouti: the question would hold its answer
        c_lemma = country.removeprefix("the ").replace(" ", "_")
        info = idx.get((c_lemma.lower(), "n")) or idx.get((c_lemma, "n"))
        # a country WordNet knows by that name ("Uzbek" is a people, "capital_of_Uzbek" an oddity)
        ck = next((k for k in (info or {}).get("synsets", []) if _is_country(syn, k)), None)
        if ck is None:
            continue
        country = _w(syn[ck]["words"][0])  # its first name: "Uzbekistan", not "Uzbek"
        pool.setdefault(country, (names, s["def"]))
    all_caps = sorted({x for names, _ in pool.values() for x in names})
    out = []
    for country in rng.sample(sorted(pool), n - 1) if "Spain" in pool else rng.sample(sorted(pool), n):
        out.append(_capital_item(rng, country, *pool[country], all_caps))
    if "Spain" in pool and not any(o["subject"] == "Spain" for o in out):
        # the issue's own example ("The capital of 200 is 2."): always in the set
        out.insert(0, _capital_item(rng, "Spain", *pool["Spain"], all_caps))
    return out[:n]


def national_capitals(syn, nc):
    """(synset key, synset, the country as WordNet words it, the city's names) of each national
    capital (an instance of `nc`) whose country can be read off its lemmas or gloss."""
    for key, s in sorted(syn.items()):
        if not any(p[0] == "@i" and (p[1], "n") == nc for p in s["ptrs"]):
            continue
        # the country: from a lemma "capital_of_Spain" (Madrid's gloss only says "situated
        # centrally in Spain"), else from the gloss ("the capital and largest city of Namibia")
        m = next((re.match(r"capital of (.+)", _w(x)) for x in s["words"] if _w(x).startswith("capital of ")), None)
        m = m or re.search(r"\bcapital (?:and largest city )?of ((?:the )?[A-Z][A-Za-z]+(?: (?:and )?[A-Z][A-Za-z]+)*)",
                           s["def"])
        names = [x for x in (_w(x) for x in s["words"]) if not x.lower().startswith("capital of")
                 and not re.search(r"\b(capital|city)\b", x, re.I)]
        if m and names and not m.group(1).startswith("the Republic"):
            yield key, s, m.group(1), names


def _is_country(syn, key):
    hyper = [p for p in syn[key]["ptrs"] if p[0] in ("@", "@i")]
    return any(re.search(r"\b(country|state|nation|kingdom|republic|monarchy|sultanate|island|islands)\b",
                         " ".join(syn[(p[1], "n")]["words"]).lower().replace("_", " ")) for p in hyper)


def _capital_item(rng, country, names, gloss, all_caps):
    q = rng.choice(CAP_Q).format(c=country)
    return {"category": "capital", "question": q, "subject": country, "subjects": [country, *names],
            "any_of": [names], "min_hits": 1, "none_of": [c for c in all_caps if c not in names],
            "source": f"WordNet 3.0: {names[0]}, {gloss}"}


def _doc_entries(path, directive, prefix=""):
    """(name, first sentence) of each `.. function::` / `.. method::` entry of an rst source."""
    txt = open(path, encoding="utf-8").read()
    out = []
    for m in re.finditer(rf"^\.\. {directive}:: {re.escape(prefix)}(\w+)\(.*?\n((?:   .*\n|\n)+)", txt, re.M):
        body = " ".join(l.strip() for l in m.group(2).splitlines() if l.strip() and not l.strip().startswith(":"))
        first = re.split(r"(?<=\.)\s", body, maxsplit=1)[0]
        out.append((m.group(1), first))
    return out


def _task(first):
    """'Return the absolute value of a number.' -> 'get the absolute value of a number';
    'Return True if all characters in the string are digits ..., False otherwise.' -> 'check
    whether all characters in the string are digits'; None when the sentence is not a plain task."""
    s = re.sub(r"\s*\([^)]*\)", "", first).rstrip(".")
    s = re.sub(r"``([^`]+)``", r"\1", s)
    s = re.sub(r":\w+:`~?([^`]+)`", r"\1", s)
    m = re.match(r"Return `?True`? if (.+?)(?:,? (?:and|or) `?False`? otherwise)?$", s)
    if m:
        s = "Check whether " + m.group(1).split(",")[0]
    if re.search(r"[`*\[\]:]|\bTrue\b|\bFalse\b|\bthis\b|\bits\b", s) or not 3 <= len(s.split()) <= 16:
        return None
    verb, _, rest = s.partition(" ")
    verb = {"Return": "get", "Returns": "get"}.get(verb, verb.lower())
    if verb not in {"get", "add", "remove", "insert", "reverse", "sort", "extend", "count", "convert", "check",
                    "split", "join", "strip", "open", "print", "round", "create", "construct", "delete", "take"}:
        return None
    return f"{verb} {rest}"


def python(rng, n):
    entries = [("function", name, d) for name, d in _doc_entries(f"{PYDOC}/library/functions.rst.txt", "function")]
    entries += [("list method", name, d) for name, d in
                _doc_entries(f"{PYDOC}/tutorial/datastructures.rst.txt", "method", "list.")]
    entries += [("string method", name, d) for name, d in
                _doc_entries(f"{PYDOC}/library/stdtypes.rst.txt", "method", "str.")]
    pool, seen = [], set()
    for k, name, d in entries:
        t = _task(d)
        if t and t not in seen and name not in {x[1] for x in pool} and not re.search(rf"\b{name}", t):
            seen.add(t)
            pool.append((k, name, t, d))
    names = sorted({x[1] for x in pool})
    out = []
    for k, name, t, d in rng.sample(pool, min(n, len(pool))):
        q = rng.choice(PY_Q).format(d=t, k=k)
        out.append({"category": "python", "question": q, "subject": name, "subjects": [name],
                    "any_of": [[name]], "min_hits": 1, "none_of": [x for x in names if x != name],
                    "source": f"Python 3.11 docs ({k}): {name}: {d}"})
    return out


def generate(seed=35, per_category=PER_CATEGORY):
    rng = random.Random(seed)
    syn, idx = _wordnet()
    items = (definitions(rng, syn, idx, per_category) + opposites(rng, syn, idx, per_category)
             + kinds(rng, syn, idx, per_category) + capitals(rng, syn, idx, per_category) + python(rng, per_category))
    for i, it in enumerate(items):
        it["id"] = f"{it['category']}-{i:02d}"
    return [{"id": it.pop("id"), **it} for it in items]


# ------------------------------------------------------------------------------ the exclusion hook


def load(path=HELDOUT):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


# What a question must ask (besides naming a held-out subject) to be the held-out question again.
# Other exchanges about the subject stay: the judge asks for what the corpora hold in another form
# (WordNet's gloss of Madrid, "the capital and largest city situated centrally in Spain", stays as
# "Where is Madrid?"; a held-out word keeps its synonyms and examples, and its synset-mates keep
# the shared gloss), so answering means recalling a fact, not replaying an exchange.
INTENT = {
    "capital": re.compile(r"\bcapital|\bcountry\b"),
    "opposite": re.compile(r"opposite|antonym"),
    "kind": re.compile(r"\bkind\b|\btype\b|categor|belong"),
    # a definition is any question about the word that asks for none of its other relations
    "definition": re.compile(r"^(?!.*(?:opposite|antonym|\bkind\b|\btype\b|categor|belong|synonym|another word|"
                             r"another way|spell|letters|sentence|example)).*$", re.S),
    "python": re.compile(r"python|\(\)|`"),
}


def _task_of(question):
    """The task phrase of a held-out Python question ("add an item to the end of the list")."""
    m = re.match(r"(?:How do I|In Python, how can I|Which Python [a-z ]+ do I use to) (.+?)(?: in Python)?\?$", question)
    return m.group(1).lower() if m else None


class Exclusion:
    """Is a training exchange one of the held-out questions again? An exchange is left out when it
    names a held-out item's subject (its "word"/"subject", or a whole-word match in its question)
    AND its question asks what that item asks (INTENT: the capital of the country or the country of
    the city, the opposite in either direction, the kind, the meaning, the Python function), or
    when its question holds a held-out Python question's task ("add an item to the end of the
    list"), whatever the function's name. One compiled alternation per category: ~200 subjects over
    ~150k exchanges in seconds."""

    def __init__(self, items=None):
        items = load() if items is None else items
        alt = lambda xs: re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(xs, key=len, reverse=True))) + r")\b")
        self.by_cat = {}
        for it in items:
            self.by_cat.setdefault(it["category"], set()).update(s.lower() for s in it["subjects"])
        self.words = {s for v in self.by_cat.values() for s in v}
        self._re = {c: alt(v) for c, v in self.by_cat.items()}
        tasks = [t for t in (_task_of(it.get("question", "")) for it in items if it["category"] == "python") if t]
        self._tasks = alt(tasks) if tasks else None

    def __call__(self, item) -> bool:
        key = str(item.get("word") or item.get("subject") or "").lower()
        q = item["messages"][0].lower()
        if self._tasks and self._tasks.search(q):
            return True
        for cat, subjects in self.by_cat.items():
            if (key in subjects or self._re[cat].search(q)) and INTENT[cat].search(q):
                return True
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--out", default=str(HELDOUT))
    a = ap.parse_args()
    items = generate(a.seed)
    Path(a.out).write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))
    from collections import Counter

    print(len(items), dict(Counter(it["category"] for it in items)))


if __name__ == "__main__":
    main()
