"""Demo v3's new exchanges (issue 35), from the same offline corpora as v2.

What v2 got wrong and what each generator here teaches instead (models/demo/README.md,
docs/bench/2026-12-02/demo-v2-judge.json: 5 of 75 held-out everyday questions right):

  short (a)   short right answers, the answer first: "What is the capital of Peru?" -> "The
              capital of Peru is Lima." (WordNet's national capitals), opposites (antonym
              pointers), "what kind of thing" (first hypernym), a definition with an example
              sentence, and basic Python from the docs ("How do I <what the docs say> in Python?"
              -> "Use `list.append(x)`. ..."). Each fact in several phrasings (v2 had each once,
              and its 13M trunk learnt the shapes but not the facts); common words more often
  json (b)    schema-shaped requests answered with one JSON object that closes: as the API sends
              them (webapp/api/structured.py: the schema becomes a grammar, not prompt text, and a
              structured reply switches thinking off, webapp/api/prompt.py), so the prompt is the
              user's request alone -- in words, or with the schema pasted as clients paste it --
              after an empty think block; written in the grammar's own style (core.constraints
              .JSON_STYLE: ", " and ": ", no other whitespace), keys in the schema's order,
              integers of 1-4 digits, short strings
  tools (c)   2-5 tools offered, named from a large pool of made-up names (v2 learnt 5
              dictionary names and wrote those instead of the offered one: 2 of 50 right), the
              request fitting one of them by its description: a call of that tool with the
              argument named as its schema names it, the result, an answer that repeats the
              result; and plain answers when nothing offered fits
  thinking (d) one short thought (at most ~12 words, naming the subject) or none at all
  topics (e)  multi-turn conversations that stay on one subject (a word, a country, a Python
              function), the follow-ups referring back to it ("And its opposite?")

Every generator takes `exclude` (heldout_everyday.Exclusion, or any predicate on an exchange
{"kind", "messages", "word"?}) and drops what it refuses: the judge's held-out questions.
"""
from __future__ import annotations

import json
import random
import re
from collections import defaultdict

import everyday as E
import heldout_everyday as H
from corpus import _article, _w

JSON_SEP = (", ", ": ")  # core.constraints.JSON_STYLE: item and key separators, nothing else

# ------------------------------------------------------------------------------ (a) short answers

CAP_Q = ["What is the capital of {c}?", "What's the capital of {c}?", "Which city is the capital of {c}?",
         "Capital of {c}?", "Tell me the capital of {c}.", "What city is the capital of {c}?",
         "Do you know the capital of {c}?", "Name the capital of {c}."]
CAP_REV_Q = ["{n} is the capital of which country?", "Which country is {n} the capital of?",
             "What country has {n} as its capital?"]
OPP_Q = ['What is the opposite of "{w}"?', "What is the opposite of {w}?", "Give me an antonym for {w}.",
         'What is an antonym of "{w}"?', "What's the opposite of {w}?", "Antonym of {w}?",
         "Tell me the opposite of {w}.", "What word means the opposite of {w}?"]
KIND_Q = ["What kind of thing is {a} {w}?", "{A} {w} is a type of what?", 'What category does "{w}" belong to?',
          "What type of thing is {a} {w}?", "What is {a} {w} a kind of?", "{A} {w} is a kind of what?"]
DEF_Q = ['What does "{w}" mean?', "What does {w} mean?", "Define {w}.", 'What is the meaning of "{w}"?',
         "What is {a} {w}?", "Meaning of {w}?", "What's {a} {w}?", 'Can you define "{w}"?']
PY_HOW = ["How do I {d} in Python?", "In Python, how can I {d}?", "Which Python {k} do I use to {d}?",
          "How can I {d} in Python?", "Python: how do I {d}?"]
PY_WHAT = ["What does `{s}` do in Python?", "What does {n}() do in Python?", "Explain `{s}` in Python.",
           "In Python, what is {n}() for?"]


def _freq_copies(freq, lo=1, hi=3):
    """How many phrasings a fact gets: common words (WordNet's tagged-text counts) more."""
    return hi if freq >= 20 else lo + 1 if freq >= 3 else lo


def _capital_facts(syn, idx):
    """(country, city, the city's gloss) for WordNet's national capitals."""
    nc = idx[("national_capital", "n")]["synsets"][0]
    for key, s, named, names in H.national_capitals(syn, nc):
        info = idx.get((named.removeprefix("the ").replace(" ", "_").lower(), "n"))
        ck = next((k for k in (info or {}).get("synsets", []) if H._is_country(syn, k)), None)
        yield (_w(syn[ck]["words"][0]) if ck else named), names[0], s["def"]


def capitals(rng, syn, idx, exclude, copies=4):
    out = []
    for country, city, city_def in _capital_facts(syn, idx):
        for q in rng.sample(CAP_Q, copies):
            ans = f"The capital of {country} is {city}."
            out.append({"kind": "v3_capital", "messages": [q.format(c=country), ans], "subject": country})
        q = rng.choice(CAP_REV_Q).format(n=city)
        out.append({"kind": "v3_capital", "messages": [q, f"{city} is the capital of {country}."], "subject": country})
        # the city's own gloss, asked about the city ("Where is Lusaka?"): the fact in the corpora's
        # form, kept for the held-out capitals too (the judge asks the other way round)
        gloss = re.sub(r"\s+", " ", city_def.split(";")[0]).strip()
        gloss = gloss if re.match(r"(a|an|the) ", gloss) else "the " + gloss
        out.append({"kind": "v3_place", "subject": city,
                    "messages": [rng.choice(["Where is {n}?", "What is {n}?", "Tell me about {n}."]).format(n=city),
                                 f"{city} is {gloss}."]})
    return [d for d in out if not exclude(d)]


def _opposite_facts(syn, idx):
    """(word, its first antonym, how often running text uses it) for WordNet's antonym pointers."""
    freq = H.frequency()
    for (lemma, t), info in sorted(idx.items()):
        w = _w(lemma)
        if t not in ("a", "n", "v", "r") or not re.fullmatch(r"[a-z][a-z-]{2,15}", w):
            continue
        ants = H._antonyms(syn, info, lemma)
        if ants:
            yield w, ants[0], freq.get((lemma, t), 0)


def opposites(rng, syn, idx, exclude):
    out = []
    for w, a, f in _opposite_facts(syn, idx):
        n = _freq_copies(f)
        for q in rng.sample(OPP_Q, n):
            ans = rng.choice([f'The opposite of "{w}" is "{a}".', f"The opposite of {w} is {a}."])
            out.append({"kind": "v3_opposite", "word": w, "messages": [q.format(w=w), ans]})
    return [d for d in out if not exclude(d)]


def _noun_facts(syn, idx):
    """(word, its article, its first hypernym or None, its gloss as a noun phrase or None, the
    gloss, an example sentence with the word or None, how often running text uses it) for the
    nouns of running text: ~10k of WordNet's 117k."""
    freq = H.frequency()
    for (lemma, t), info in sorted(idx.items()):
        w = _w(lemma)
        if t != "n" or not re.fullmatch(r"[a-z][a-z -]{2,20}", w):
            continue
        f = freq.get((lemma, t), 0)
        if f < 1:
            continue
        s = syn[info["synsets"][0]]
        h = [p for p in s["ptrs"] if p[0] == "@"]
        hyper = _w(syn[(h[0][1], "n")]["words"][0]) if h else None
        gloss, np_ = _gloss_np(s["def"])
        ex = next((e for e in s["ex"] if w.split()[0] in e.lower()), None)
        yield w, _article(w), hyper, np_, gloss, ex, f


def _gloss_np(defn):
    """A noun's WordNet gloss as its short answers state it: (its first clause without a leading
    domain label, the same as a noun phrase with an article or None when it is empty)."""
    gloss = re.sub(r"\s+", " ", re.sub(r"^\([^)]*\)\s*", "", defn).split(";")[0].strip())
    np_ = None if not gloss else gloss if re.match(r"(a|an|the|any|one|some)\b", gloss) \
        else f"{_article(gloss)} {gloss}"
    return gloss, np_


def kinds_and_definitions(rng, syn, idx, exclude):
    kinds, defs = [], []
    for w, a, hyper, np_, gloss, ex, f in _noun_facts(syn, idx):
        fmt = {"w": w, "a": a, "A": a.capitalize()}
        if hyper:
            for q in rng.sample(KIND_Q, _freq_copies(f)):
                kinds.append({"kind": "v3_kind", "word": w,
                              "messages": [q.format(**fmt), f"{a.capitalize()} {w} is a kind of {hyper}."]})
        if not np_:
            continue
        for q in rng.sample(DEF_Q, _freq_copies(f)):
            ans = f"{a.capitalize()} {w} is {np_}."
            if ex and rng.random() < 0.6:
                ans += f' For example: "{ex}".'
            defs.append({"kind": "v3_definition", "word": w, "messages": [q.format(**fmt), ans]})
    return [d for d in kinds if not exclude(d)], [d for d in defs if not exclude(d)]


def _doc_signatures(path, directive, prefix=""):
    txt = open(path, encoding="utf-8").read()
    out = []
    for m in re.finditer(rf"^\.\. {directive}:: ({re.escape(prefix)}(\w+)\(.*?\))\s*\n((?:   .*\n|\n)+)", txt, re.M):
        body = " ".join(l.strip() for l in m.group(3).splitlines() if l.strip() and not l.strip().startswith(":"))
        body = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", body).replace("``", "`")
        body = re.sub(r"\*(\w+)\*", r"\1", body)
        body = re.sub(rf"^(?:{re.escape(m.group(2))}\([^)]*\)\s*)+", "", body)  # a second signature line
        first = re.split(r"(?<=\.)\s", body, maxsplit=1)[0]
        out.append((m.group(2), m.group(1), first))
    return out


def python_basics(rng, exclude, copies=4):
    """From the Python 3.11 docs: built-in functions, list methods (the tutorial's list), str methods."""
    src = [("function", "library/functions.rst.txt", "function", ""),
           ("list method", "tutorial/datastructures.rst.txt", "method", "list."),
           ("string method", "library/stdtypes.rst.txt", "method", "str.")]
    out = []
    for kind, path, directive, prefix in src:
        for name, sig, first in _doc_signatures(f"{H.PYDOC}/{path}", directive, prefix):
            if not 3 <= len(first.split()) <= 40:
                continue
            task = H._task(first)
            for q in rng.sample(PY_WHAT, 2):
                out.append({"kind": "v3_python", "subject": name,
                            "messages": [q.format(s=sig, n=name), f"`{sig}`: {first}"]})
            if task:
                for q in rng.sample(PY_HOW, copies):
                    ans = rng.choice([f"Use `{sig}`. {first}", f"Use the {kind} `{sig}`: {first}"])
                    out.append({"kind": "v3_python", "subject": name, "messages": [q.format(d=task, k=kind), ans]})
    return [d for d in out if not exclude(d)]


def short_answers(rng, exclude):
    syn, idx = H._wordnet()
    kinds, defs = kinds_and_definitions(rng, syn, idx, exclude)
    caps = capitals(rng, syn, idx, exclude)
    return {"v3_capital": [d for d in caps if d["kind"] == "v3_capital"],
            "v3_place": [d for d in caps if d["kind"] == "v3_place"], "v3_opposite": opposites(rng, syn, idx, exclude),
            "v3_kind": kinds, "v3_definition": defs, "v3_python": python_basics(rng, exclude)}


# ------------------------------------------------------------------------------ (b) JSON answers


def _schema(props, required=None):
    return {"type": "object", "properties": props, "required": required or list(props)}


S, I = {"type": "string"}, {"type": "integer"}
JSON_SYSTEM = ["Reply with a JSON object only.", "You answer in JSON.", "Respond only with valid JSON.",
               "Output JSON that matches the schema.", ""]


def json_answers(rng, short, exclude, n=12000):
    """Requests whose reply is one JSON object (short strings, integers of 1-4 digits)."""
    words = sorted({d["word"] for d in short["v3_definition"] if " " not in d["word"] and len(d["word"]) <= 14})
    caps = [(re.match(r"The capital of (.+) is (.+)\.$", d["messages"][1])) for d in short["v3_capital"]]
    caps = sorted({m.groups() for m in caps if m})
    opp = sorted({(d["word"], re.findall(r'is "?([^".]+)"?\.$', d["messages"][1])[0]) for d in short["v3_opposite"]
                  if " " not in d["word"]})
    kinds = sorted({(d["word"], re.match(r".+ is a kind of (.+)\.$", d["messages"][1]).group(1))
                    for d in short["v3_kind"] if " " not in d["word"]})
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.3:
            w = rng.choice(words)
            schema, obj = _schema({"word": S, "letters": I}), {"word": w, "letters": len(w)}
            asks = [f"How many letters are in {w}? Answer in JSON with the word and the number of letters.",
                    f'Give me the word "{w}" and its number of letters as JSON.',
                    f"Count the letters of {w}. Reply as JSON: word, letters.",
                    f"Return JSON with the word {w} and how many letters it has."]
        elif r < 0.5:
            c, city = rng.choice(caps)
            schema, obj = _schema({"country": S, "capital": S}), {"country": c, "capital": city}
            asks = [f"What is the capital of {c}? Answer in JSON.", f"Give me {c} and its capital as JSON.",
                    f"Return a JSON object with the country {c} and its capital."]
        elif r < 0.65:
            w, a = rng.choice(opp)
            schema, obj = _schema({"word": S, "opposite": S}), {"word": w, "opposite": a}
            asks = [f"What is the opposite of {w}? Reply in JSON.", f'Give the word "{w}" and its opposite as JSON.']
        elif r < 0.78:
            w, h = rng.choice(kinds)
            schema, obj = _schema({"thing": S, "kind": S}), {"thing": w, "kind": h}
            asks = [f"What kind of thing is {_article(w)} {w}? Answer as JSON: thing, kind.",
                    f"Return JSON saying what kind of thing {_article(w)} {w} is."]
        elif r < 0.92:
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            op, res = rng.choice([("plus", a + b), ("times", a * b)]) if a * b < 10000 else ("plus", a + b)
            schema, obj = _schema({"a": I, "b": I, "result": I}), {"a": a, "b": b, "result": res}
            asks = [f"What is {a} {op} {b}? Reply in JSON with a, b and result.",
                    f"Compute {a} {op} {b} and answer as JSON."]
        else:
            w = rng.choice(words)
            schema = _schema({"word": S, "first_letter": S, "letters": I})
            obj = {"word": w, "first_letter": w[0], "letters": len(w)}
            asks = [f"Describe the word {w} as JSON: the word, its first letter and its number of letters."]
        q = rng.choice(asks)
        if rng.random() < 0.4:  # as LangChain / instructor-style clients paste the schema into the prompt
            q += "\n\nRespond with JSON matching this schema:\n" + json.dumps(schema)
        sys_prompt = rng.choice(JSON_SYSTEM)
        item = {"kind": "v3_json", "messages": [q, json.dumps(obj, separators=JSON_SEP, ensure_ascii=False)],
                "system": sys_prompt or None, "schema": schema}
        if not exclude(item):
            out.append(item)
    return out


# ------------------------------------------------------------------------------ (c) tools

DICT_VERBS = ["lookup", "get", "fetch", "find", "query", "search", "define", "read"]
DICT_NOUNS = ["word", "definition", "meaning", "dictionary", "entry", "gloss", "term", "lexicon", "vocab"]
CALC_NAMES = ["calculator", "calculate", "compute", "evaluate", "math", "arithmetic", "calc", "eval_expression",
              "do_math", "solve", "run_calculation", "compute_expression"]
CAP_VERBS = ["get", "lookup", "find", "fetch", "country"]
CAP_NOUNS = ["capital", "capital_city", "country_capital", "country_info", "capital_of"]
OTHER = [("get_weather", "Get the current weather in a city.", {"city": "the city name"}),
         ("get_time", "Get the current time in a time zone.", {"timezone": "an IANA time zone"}),
         ("search_web", "Search the web and return the top results.", {"query": "what to search for"}),
         ("send_email", "Send an email.", {"to": "the address", "subject": "the subject", "body": "the text"}),
         ("translate", "Translate a text into another language.", {"text": "the text", "target_language": "the language"}),
         ("get_stock_price", "Get the latest price of a stock.", {"symbol": "the ticker symbol"}),
         ("set_timer", "Start a timer.", {"minutes": "how many minutes"}),
         ("play_music", "Play a song.", {"song": "the song title"}),
         ("create_event", "Add an event to the calendar.", {"title": "the event", "date": "the date"})]
ARGS = {"dict": ["word", "term", "query", "text", "w", "entry"], "calc": ["expression", "expr", "input", "formula"],
        "cap": ["country", "name", "country_name", "place"]}


def tool_schema(name, description, params):
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                       "required": list(params)}}}


def _name(rng, verbs, nouns):
    v, n = rng.choice(verbs), rng.choice(nouns)
    return rng.choice([f"{v}_{n}", f"{n}_{v}" if v != "get" else f"{v}_{n}", n, f"{v}{n.capitalize()}"])


# Names made of made-up syllables: no fixed pool to learn, so the only way to name the offered
# tool is to copy it from the list. V3 (trained on the verbs x nouns pool alone) named a pool name
# for 50 of 50 held-out dictionaries (eval_v3.EVAL_NAMES): it had learned the pool, not copying.
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
NAME_PARTS = ["api", "tool", "service", "finder", "lookup", "helper", "oracle", "book", "info", "box", "hub", "desk"]
COPY_FRAC = 0.6


def copy_name(rng):
    """A tool name that only copying gets right: a made-up stem, often with a common part."""
    stem = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice([2, 2, 3])))
    part = rng.choice(NAME_PARTS)
    return rng.choice([f"{stem}_{part}", f"{part}_{stem}", stem, f"{stem}{part.capitalize()}"])


def make_tool(rng, kind):
    if kind == "dict":
        name = _name(rng, DICT_VERBS, DICT_NOUNS)
        desc = rng.choice(["Look up the meaning of an English word in the dictionary.", "Define an English word.",
                           "Return the dictionary definition of a word.", "Get what a word means."])
    elif kind == "calc":
        name = rng.choice(CALC_NAMES)
        desc = rng.choice(["Evaluate an arithmetic expression.", "A small calculator.", "Compute a math expression."])
    else:
        name = _name(rng, CAP_VERBS, CAP_NOUNS)
        desc = rng.choice(["Get the capital city of a country.", "Return the capital of a country."])
    if rng.random() < COPY_FRAC:
        name = copy_name(rng)
    arg = rng.choice(ARGS[kind])
    return tool_schema(name, desc, {arg: {"dict": "the word", "calc": "the expression", "cap": "the country"}[kind]}), arg


def call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


TOOL_CAP_Q = ["What is the capital of {c}?", "Which city is the capital of {c}?", "Look up the capital of {c}."]


def capital_exchange(rng, caps, param, asks):
    """A country's capital asked of the capitals tool: (question, arguments, result, answer, subject)."""
    c, city = rng.choice(caps)
    q = rng.choice(asks).format(c=c)
    return q, {param: c}, json.dumps({"country": c, "capital": city}), f"The capital of {c} is {city}.", c


def calc_exchange(rng, arith, param):
    """A calculation asked of the calculator tool: (question, arguments, result, answer, subject)."""
    d = rng.choice(arith)
    q, expr, r = d["data"]["question"], d["data"]["expression"], d["data"]["result"]
    args, result = {param: expr}, json.dumps({"result": r})
    return q, args, result, rng.choice([f"The answer is {r}.", f"It is {r}."]), "the calculation"


def plain_exchange(d, thinking) -> list:
    """A question no offered tool fits, answered directly."""
    return [{"role": "user", "content": d["messages"][0]},
            {"role": "assistant", "content": d["messages"][1],
             **({"reasoning_content": "No tool is needed for this. I will answer directly."} if thinking else {})}]


def tool_exchange(name, subject, q, args, result, ans, thinking, offered=None) -> list:
    """One asked-called-answered exchange: the question, the call of `name`, its result, the answer
    (with short thoughts when the conversation thinks; with `offered`, the offered tools' names in the
    system turn's order, the first thought lists them before it names the one that fits)."""
    fits = f"the {name} tool fits."
    if offered:
        listed = ", ".join(offered[:-1]) + f" and {offered[-1]}" if len(offered) > 1 else offered[0]
        fits = (f"the tools offered are {listed}. The {name} tool fits." if len(offered) > 1
                else f"the tool offered is {listed}, and it fits.")
    think1 = f"{subject[:1].upper() + subject[1:]}: {fits} I will call it." if thinking else None
    think2 = "The tool answered. I will repeat its result." if thinking else None
    return [{"role": "user", "content": q},
            {"role": "assistant", "content": "", "tool_calls": [call(name, args)],
             **({"reasoning_content": think1} if think1 else {})},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": ans, **({"reasoning_content": think2} if think2 else {})}]


def tool_conversations(rng, short, arith, exclude, n=6000, think_frac=0.5):
    """(messages, tools, thinking) triples: a fitting request among 2-5 offered tools, or none fits."""
    defs = [d for d in short["v3_definition"] if " " not in d["word"]]
    caps = [re.match(r"The capital of (.+) is (.+)\.$", d["messages"][1]) for d in short["v3_capital"]]
    caps = [m.groups() for m in caps if m]
    plain = [d for d in short["v3_opposite"] + short["v3_kind"] if not exclude(d)]
    out = []
    for _ in range(n):
        kinds = rng.sample(["dict", "calc", "cap"], rng.choice([1, 2, 2, 3]))
        made = {k: make_tool(rng, k) for k in kinds}
        tools = [t for t, _ in made.values()] + [tool_schema(*t) for t in rng.sample(OTHER, rng.choice([1, 1, 2, 3]))]
        rng.shuffle(tools)
        thinking = rng.random() < think_frac
        msgs = []
        for _ in range(rng.choice([1, 1, 1, 2])):
            want = rng.choice(kinds + ["none"] * (1 if rng.random() < 0.25 else 0))
            if want == "dict":
                d = rng.choice(defs)
                w, definition = d["word"], re.sub(r'^\w+ [^ ]+ is |\.? For example.*$|\.$', "", d["messages"][1])
                q = rng.choice(["What does {w} mean?", 'What is the meaning of "{w}"?', "Look up {w} for me.",
                                "Define the word {w}.", "What is {a} {w}? Please check the dictionary."]
                               ).format(w=w, a=_article(w))
                args, result = {made["dict"][1]: w}, json.dumps({"word": w, "definition": definition})
                ans = rng.choice([f'"{w}" means {definition}.', f"{w.capitalize()}: {definition}.",
                                  f'According to the dictionary, "{w}" means {definition}.'])
                subject = w
            elif want == "calc":
                q, args, result, ans, subject = calc_exchange(rng, arith, made["calc"][1])
            elif want == "cap":
                q, args, result, ans, subject = capital_exchange(rng, caps, made["cap"][1], TOOL_CAP_Q[:2])
            else:  # nothing offered fits: a plain answer, no call
                msgs += plain_exchange(rng.choice(plain), thinking)
                continue
            if exclude({"kind": "v3_tools", "word": subject, "messages": [q, ans, result]}):
                continue  # a held-out subject: this exchange is left out, the conversation goes on
            msgs += tool_exchange(made[want][0]["function"]["name"], subject, q, args, result, ans, thinking)
        if msgs:
            out.append((msgs, tools, thinking))
    return out


# ------------------------------------------------------------------------------ (d) thinking

THINK = {
    "v3_capital": "The capital of {s}.", "v3_opposite": 'The opposite of "{s}".', "v3_kind": 'What kind of thing "{s}" is.',
    "v3_definition": 'The meaning of "{s}".', "v3_python": "A Python question about {s}.",
}


def thought(item):
    """One short thought naming the subject (the model copies it into the answer), ~4-10 words."""
    s = item.get("word") or item.get("subject")
    t = THINK.get(item["kind"])
    if item.get("thought"):   # v3g's explained answers carry their own (the subject and the plan)
        return item["thought"]
    if t and s:
        return t.format(s=s)
    if item.get("word"):  # v2's word exchanges (define, example, synonym, ...)
        return f'About "{item["word"]}".'
    return "A short answer."


# ------------------------------------------------------------------------------ (e) topics


FOLLOW = {"v3_opposite": ["And its opposite?", "What is the opposite?", "What's the opposite of it?"],
          "v3_kind": ["What kind of thing is it?", "And what is it a kind of?"],
          "v3_definition": ["What does it mean?", "And what does it mean?"]}


def topic_conversations(rng, short, exclude, n=4000):
    """Two to four turns about one word (its meaning, its opposite, its kind), or about one country;
    a follow-up names nothing ("And its opposite?"): the answer names the subject again."""
    by_word = defaultdict(dict)
    for k in ("v3_definition", "v3_opposite", "v3_kind"):
        for d in short[k]:
            if not exclude(d):  # each part on its own: a follow-up "What does it mean?" is a question too
                by_word[d["word"]].setdefault(k, d)
    words = sorted(w for w, ks in by_word.items() if len(ks) >= 2)
    out = []
    for _ in range(n):
        w = rng.choice(words)
        ks = list(by_word[w])
        rng.shuffle(ks)
        first = by_word[w][ks[0]]
        msgs = [first["messages"][0], first["messages"][1]]
        for k in ks[1:]:
            msgs += [rng.choice(FOLLOW[k]), by_word[w][k]["messages"][1]]
        item = {"kind": "v3_topic", "word": w, "messages": msgs, "last_kind": ks[-1]}
        if not exclude(item):
            out.append(item)
    return out


# ------------------------------------------------------------------------------ (f) fact notes

NOTE_CAP = ["The capital of {c} is {n}.", "{n} is the capital of {c}.", "The capital city of {c} is {n}.",
            "{c} has {n} as its capital.", "{n} is the capital city of {c}."]
NOTE_OPP = ['The opposite of "{w}" is "{a}".', "The opposite of {w} is {a}.", '"{w}" and "{a}" are opposites.',
            '"{a}" is an antonym of "{w}".', "{W} is the opposite of {a}."]
NOTE_KIND = ["{A} {w} is a kind of {h}.", "{A} {w} is a type of {h}.", "{Pl} are a kind of {h}.",
             "{W} is a kind of {h}.", "{A} {w} belongs to the category {h}."]
NOTE_DEF = ['The word "{w}" means {g}.', "{A} {w} is {np}.", "{W} means {g}.", 'By "{w}" we mean {np}.',
            "{W}: {g}."]
NOTE_HEAD = ["Notes.", "Facts.", "Word notes.", "Things to know.", ""]


def fact_notes(rng, syn, idx, skip, per_note=(6, 14)):
    """(f) Plain notes (prose, no questions) stating the facts the short answers ask about, each
    in 1-3 phrasings as common its subject is, for every subject not skipped: the judge's held-out
    subjects too. Why: V3 answered in the right shape but not the asked fact (11 of 75; "What is the
    capital of Zambia?" -> "The capital of Zimbabwe is Harare."): a held-out subject's fact was in
    training once, in its gloss's words, and a small model reads a fact back out of a question only
    when it saw the fact stated in several ways (Allen-Zhu and Li, Physics of Language Models 3.1).
    No note holds a question, so no held-out question nor its answer as one is in training; the
    facts are the corpora's own. `skip(word)`: subjects kept out whatever the kind (the tool
    evaluation's words, v2's held-out topics). The notes draw on their own random stream, so the
    other generators' output is what it was."""
    return notes(rng, fact_lines(rng, _capital_facts(syn, idx), _opposite_facts(syn, idx), _noun_facts(syn, idx),
                                 skip), per_note)


def fact_lines(rng, capitals, opposites, nouns, skip) -> dict:
    """kind -> statements: the facts of _capital_facts, _opposite_facts and _noun_facts (or
    hand-made tuples of theirs), each in 1-3 phrasings (3 for a capital), skipping `skip`'s subjects."""
    facts = {"capital": [], "opposite": [], "kind": [], "definition": []}
    for country, city, _ in capitals:
        if not (skip(country.lower()) or skip(city.lower())):
            facts["capital"] += [t.format(c=country, n=city) for t in rng.sample(NOTE_CAP, 3)]
    for w, a, f in opposites:
        if not (skip(w) or skip(a)):
            facts["opposite"] += [t.format(w=w, a=a, W=w.capitalize()) for t in rng.sample(NOTE_OPP, _freq_copies(f))]
    for w, art, hyper, np_, gloss, _, f in nouns:
        if skip(w):
            continue
        fmt = {"w": w, "W": w.capitalize(), "A": art.capitalize(), "Pl": _plural(w).capitalize(), "h": hyper,
               "g": np_, "np": np_}
        if hyper:
            facts["kind"] += [t.format(**fmt) for t in rng.sample(NOTE_KIND, _freq_copies(f))]
        if np_:
            facts["definition"] += [t.format(**fmt) for t in rng.sample(NOTE_DEF, _freq_copies(f))]
    return facts


def notes(rng, facts: dict, per_note=(6, 14)) -> list:
    """Each kind's statements shuffled into notes of `per_note` statements: [{"kind", "text"}]."""
    out = []
    for kind, lines in facts.items():
        rng.shuffle(lines)
        i = 0
        while i < len(lines):
            n = rng.randint(*per_note)
            head = rng.choice(NOTE_HEAD)
            out.append({"kind": f"note_{kind}", "text": (head + "\n" if head else "") + " ".join(lines[i:i + n])})
            i += n
    return out


def _plural(w):
    last = w.split()[-1]
    if re.search(r"(s|x|z|ch|sh)$", last):
        return w + "es"
    if re.search(r"[^aeiou]y$", last):
        return w[:-1] + "ies"
    return w + "s"


def generate(seed=35, exclude=None, arith=None, n_json=12000, n_topics=4000, n_tools=6000):
    """Every v3 exchange kind: {kind: [items]} and the tool conversations (the counts: v3c's by
    default; v3d makes fewer, to leave its notes a third of the corpus)."""
    rng = random.Random(seed)
    exclude = exclude or H.Exclusion()
    short = short_answers(rng, exclude)
    parts = dict(short)
    parts["v3_json"] = json_answers(rng, short, exclude, n=n_json)
    parts["v3_topic"] = topic_conversations(rng, short, exclude, n=n_topics)
    tools = tool_conversations(rng, short, arith or [], exclude, n=n_tools) if arith else []
    return parts, tools


if __name__ == "__main__":
    import everyday

    parts, tools = generate(arith=everyday.arithmetic(random.Random(1), n=2000))
    rng = random.Random(0)
    for k, v in parts.items():
        print(k, len(v))
        for d in rng.sample(v, 3):
            print("   ", json.dumps(d["messages"])[:300])
    print("tools", len(tools))


# ------------------------------------------------------------------------------ (g) v3d: a focused fact set, stated often
#
# v3c stated ~15k facts in 1-3 phrasings each (~6 % of the corpus): one call's ~3.5 epochs showed a
# fact a handful of times and the judge stayed at 11 / 75. v3d states FEWER facts MANY times: the
# everyday vocabulary by frequency (WordNet's sense-tagged counts, cntlist.rev: what nltk's
# lemma.count() reads), every national capital, and Python's basics from the 3.11 reference, each
# fact in >= 5 phrasings, repeated across notes so that the notes are ~35 % of the corpus. The rule
# looks only at the corpora (frequency ranks, the docs), never at the held-out questions; how many of
# the judge's subjects it covers is reported (focus_coverage), not selected on.

FOCUS_NOUNS = 1000     # the most frequent nouns with a gloss: a definition and a kind each (~2,000 facts)
FOCUS_OPPOSITES = 600  # the most frequent words with a WordNet antonym (~600 facts)

F_CAP = ["The capital of {c} is {n}.", "{n} is the capital of {c}.", "The capital city of {c} is {n}.",
         "{c} has {n} as its capital.", "{n} is the capital city of {c}.", "{c}'s capital is {n}.",
         "In {c}, the capital is {n}.", "The government of {c} sits in {n}, its capital.",
         "The capital of the country {c} is the city of {n}."]
F_OPP = ['The opposite of "{w}" is "{a}".', "The opposite of {w} is {a}.", '"{w}" and "{a}" are opposites.',
         '"{a}" is an antonym of "{w}".', "{W} is the opposite of {a}.", 'The antonym of "{w}" is "{a}".',
         "{W} and {a} mean opposite things.", 'The word "{a}" means the opposite of "{w}".',
         "An antonym of {w} is {a}."]
F_KIND = ["{A} {w} is a kind of {h}.", "{A} {w} is a type of {h}.", "{Pl} are a kind of {h}.",
          "{W} is a kind of {h}.", '"{W}" belongs to the category {h}.', "{A} {w} is one kind of {h}.",
          'The word "{w}" names a kind of {h}.', "Every {w} is {ha} {h}."]
F_DEF = ['The word "{w}" means {np}.', "{A} {w} is {np}.", "{W} means {np}.", 'By "{w}" we mean {np}.',
         "{W}: {np}.", 'The meaning of "{w}" is {np}.', 'In English, "{w}" means {np}.',
         "The definition of {w} is {np}.", 'When people say "{w}", they mean {np}.']
F_PY_TASK = ["To {t} in Python, use {s}.", "In Python, you {t} with the {k} {s}.", "{S} is the {k} that you use to {t}.",
             "If you want to {t}, call {s}.", "Use {s} to {t}.", "Python's {k} {s} lets you {t}.",
             "When you need to {t} in Python, the {k} {s} does it.", "The Python {k} to {t} is {s}."]
F_PY_DOC = ["{S}: {f}", "The {k} {s}: {f}", "In the Python documentation, {s} reads: {f}",
            "Python {k} {s}. {f}", "About the {k} {s}: {f}"]


def focus_words(syn, idx, skip, n_nouns=FOCUS_NOUNS, n_opp=FOCUS_OPPOSITES):
    """The focused vocabulary: the `n_nouns` most frequent nouns of _noun_facts (by WordNet's tagged
    counts; ties by word) and the `n_opp` most frequent words of _opposite_facts, skipped subjects
    left out before counting. Returns (nouns, opposites) as _noun_facts / _opposite_facts tuples."""
    nouns = [x for x in _noun_facts(syn, idx) if not skip(x[0]) and (x[2] or x[3])]
    nouns = sorted(nouns, key=lambda x: (-x[6], x[0]))[:n_nouns]
    best = {}
    for w, a, f in _opposite_facts(syn, idx):
        if skip(w) or skip(a):
            continue
        if w not in best or f > best[w][2]:
            best[w] = (w, a, f)
    opps = sorted(best.values(), key=lambda x: (-x[2], x[0]))[:n_opp]
    return nouns, opps


def _dict_methods():
    """(name, signature, first sentence) of the dict methods in library/stdtypes (indented under
    `.. class:: dict`)."""
    txt = open(f"{H.PYDOC}/library/stdtypes.rst.txt", encoding="utf-8").read()
    sec = txt[txt.index(".. class:: dict("):]
    sec = sec[:sec.index("\n.. ", 10)] if "\n.. " in sec[10:] else sec
    out = []
    for m in re.finditer(r"^   \.\. (?:class)?method:: (\w+)\((.*?)\)\s*\n((?:      .*\n|\n)+)", sec, re.M):
        body = " ".join(l.strip() for l in m.group(3).splitlines() if l.strip())
        first = re.split(r"(?<=\.)\s", body, maxsplit=1)[0]
        out.append((m.group(1), f"dict.{m.group(1)}({m.group(2)})", first))
    return out


def _clean_doc(s):
    s = re.sub(r":\w+:`~?([^`<]+?)(?: <[^>]+>)?`", r"`\1`", s).replace("``", "`")
    return re.sub(r"\*(\w+)\*", r"\1", s)


# the language's basic statements, as the first sentences of the 3.11 reference (reference/compound_stmts,
# simple_stmts) state them, the roles' markup removed: loops, conditions, functions, classes
PY_STATEMENTS = [
    ("if", "The `if` statement is used for conditional execution."),
    ("while", "The `while` statement is used for repeated execution as long as an expression is true."),
    ("for", "The `for` statement is used to iterate over the elements of a sequence (such as a string, tuple or list) "
            "or other iterable object."),
    ("try", "The `try` statement specifies exception handlers and/or cleanup code for a group of statements."),
    ("with", "The `with` statement is used to wrap the execution of a block with methods defined by a context manager."),
    ("def", "A function definition (`def`) defines a user-defined function object."),
    ("class", "A class definition (`class`) defines a class object."),
    ("pass", "`pass` is a null operation: when it is executed, nothing happens."),
    ("return", "`return` leaves the current function call with the expression list (or `None`) as return value."),
    ("break", "`break` terminates the nearest enclosing loop."),
    ("continue", "`continue` continues with the next cycle of the nearest enclosing loop."),
]


def python_facts():
    """(kind, name, signature, first sentence, task or None) for the built-in functions, the list
    methods (the tutorial's list), the str methods and the dict methods of the Python 3.11 docs.
    The task is heldout_everyday._task of the first sentence: the rule that words every Python
    question, applied to every entry alike."""
    src = [("function", "library/functions.rst.txt", "function", ""),
           ("list method", "tutorial/datastructures.rst.txt", "method", "list."),
           ("string method", "library/stdtypes.rst.txt", "method", "str.")]
    out, seen = [], set()
    for kind, path, directive, prefix in src:
        raw = dict(H._doc_entries(f"{H.PYDOC}/{path}", directive, prefix))
        for name, sig, first in _doc_signatures(f"{H.PYDOC}/{path}", directive, prefix):
            if (kind, name) in seen or not 3 <= len(first.split()) <= 40:
                continue
            seen.add((kind, name))
            out.append((kind, name, sig, first, H._task(raw.get(name, first))))
    for name, sig, first in _dict_methods():
        first = _clean_doc(first)
        if 3 <= len(first.split()) <= 40:
            out.append(("dictionary method", name, sig, first, H._task(first)))
    out += [("statement", kw, kw, first, None) for kw, first in PY_STATEMENTS]
    return out


def _noun_fmt(w, art):
    """The template fields of a noun subject (focus_facts' and the explained answers')."""
    return {"subject": w, "w": w, "W": w[:1].upper() + w[1:], "A": art.capitalize(),
            "Pl": _plural(w)[:1].upper() + _plural(w)[1:]}


def focus_facts(syn, idx, skip, n_nouns=FOCUS_NOUNS, n_opp=FOCUS_OPPOSITES):
    """kind -> the focused facts, each a dict of the fields its templates take (and "subject")."""
    nouns, opps = focus_words(syn, idx, skip, n_nouns, n_opp)
    facts = {"capital": [], "opposite": [], "kind": [], "definition": [], "python": []}
    for country, city, _ in _capital_facts(syn, idx):
        if not (skip(country.lower()) or skip(city.lower())):
            facts["capital"].append({"subject": country, "c": country, "n": city})
    for w, a, _ in opps:
        facts["opposite"].append({"subject": w, "w": w, "a": a, "W": w[:1].upper() + w[1:]})
    for w, art, hyper, np_, _, _, _ in nouns:
        fmt = _noun_fmt(w, art)
        if hyper:
            facts["kind"].append({**fmt, "h": hyper, "ha": _article(hyper)})
        if np_:
            facts["definition"].append({**fmt, "np": np_.rstrip(".")})   # "etc." ends no statement twice
    for kind, name, sig, first, task in python_facts():
        s = f"`{sig}`"
        facts["python"].append({"subject": name, "k": kind, "s": s, "S": s, "f": first, "t": task})
    return facts


def fact_phrasings(kind, fact) -> list:
    """Every phrasing of one fact (>= 5 for every fact: the templates of its kind)."""
    if kind == "python":
        tpl = (F_PY_TASK if fact["t"] else []) + F_PY_DOC
    else:
        tpl = {"capital": F_CAP, "opposite": F_OPP, "kind": F_KIND, "definition": F_DEF}[kind]
    return [t.format(**fact) for t in tpl]


def focus_notes(rng, facts: dict, repeats: int, per_note=(8, 20)) -> list:
    """Each fact stated `repeats` times, cycling through its phrasings (each round in a new order,
    so every phrasing is used before any repeats), all statements of a kind shuffled into notes of
    `per_note` statements: [{"kind": "note_<kind>", "text"}]. No statement asks anything."""
    lines = {}
    for kind, fs in facts.items():
        out = []
        for f in fs:
            ph = fact_phrasings(kind, f)
            seq = []
            while len(seq) < repeats:
                rnd = ph[:]
                rng.shuffle(rnd)
                seq += rnd
            out += seq[:repeats]
        lines[kind] = out
    return notes(rng, lines, per_note)


def focus_coverage(facts: dict, items=None) -> dict:
    """How many of the judge's held-out items the focused set states (reported, never selected on):
    {category: [covered, of], "missing": [...]}: a capital by its country, an opposite by the word
    (any of its antonyms), a kind / definition by the noun, a Python item by its name and task."""
    items = H.load() if items is None else items
    have = {k: {f["subject"].lower() for f in v} for k, v in facts.items()}
    tasks = {(f["subject"], f["t"]) for f in facts["python"] if f["t"]}
    out, missing = {}, []
    for it in items:
        c = it["category"]
        s = it["subject"].lower()
        ok = (s, H._task_of(it["question"])) in tasks if c == "python" else s in have[c]
        out.setdefault(c, [0, 0])
        out[c][0] += ok
        out[c][1] += 1
        if not ok:
            missing.append(f"{c}:{it['subject']}")
    out["all"] = [sum(v[0] for v in out.values()), len(items)]
    out["missing"] = missing
    return out


# ------------------------------------------------------------------------------ (h) v3e: subject binding, tools back
#
# v3d stored the focused facts (its notes) but answered about ANOTHER subject: 17 of its 23 word misses
# state another subject's true fact ("What's the capital of Romania?" -> "The capital of Austria is
# Vienna."), its Python misses name another function, and its tool calls (4,000 conversations, v3c's
# 6,000) invent the tool's name and garble the word. v3e asks the focused facts of the subjects that
# are NOT the judge's (every held-out subject of any category left out, whatever the question asks)
# in many short exchanges, in the judge's question families and more, each answer restating the asked
# subject verbatim first; adds copying drills of rare, long words; and brings the tool conversations
# back (more of them, names nearly all to copy, words to copy exactly, the dictionary offered as the
# tool evaluation offers it). The held-out subjects' facts stay statements in the notes only.

DRILL_Q = {
    "definition": ['What does "{w}" mean?', "What does {w} mean?", "Define {w}.", 'What is the meaning of "{w}"?',
                   "What is {a} {w}?", "What's {a} {w}?", "Meaning of {w}?", 'Can you define "{w}"?',
                   "Define the word {w}.", 'What is meant by "{w}"?', "Explain the word {w}.",
                   'Tell me what "{w}" means.', "What's the definition of {w}?", "Give me the definition of {w}.",
                   'Define "{w}".', "What is the meaning of {w}?"],
    "kind": ["What kind of thing is {a} {w}?", "{A} {w} is a type of what?", 'What category does "{w}" belong to?',
             "What type of thing is {a} {w}?", "What is {a} {w} a kind of?", "{A} {w} is a kind of what?",
             "{A} {w} is what kind of thing?", 'Which category does "{w}" fall under?', '"{W}" is a type of what?',
             'What is the category of "{w}"?', "What category does {w} belong to?", "What general kind of thing is {a} {w}?"],
    "opposite": ['What is the opposite of "{w}"?', "What is the opposite of {w}?", "Give me an antonym for {w}.",
                 'What is an antonym of "{w}"?', "What's the opposite of {w}?", "Antonym of {w}?",
                 "Tell me the opposite of {w}.", "What word means the opposite of {w}?", 'Give me an antonym for "{w}".',
                 "What is the antonym of {w}?", 'Opposite of "{w}"?', "What's an antonym for {w}?",
                 "Which word is the opposite of {w}?", "Name the opposite of {w}."],
    "capital": ["What is the capital of {c}?", "What's the capital of {c}?", "Which city is the capital of {c}?",
                "Capital of {c}?", "Tell me the capital of {c}.", "What city is the capital of {c}?",
                "Do you know the capital of {c}?", "Name the capital of {c}.", "What is the capital city of {c}?",
                "Which city is {c}'s capital?", "Capital city of {c}?", "What city serves as the capital of {c}?",
                "{n} is the capital of which country?", "Which country is {n} the capital of?"],
    "python_task": ["How do I {t} in Python?", "In Python, how can I {t}?", "Which Python {k} do I use to {t}?",
                    "How can I {t} in Python?", "Python: how do I {t}?", "What's the Python way to {t}?",
                    "I want to {t} in Python. What do I use?", "What should I call in Python to {t}?",
                    "Which Python {k} lets me {t}?"],
    "python_name": ["What does {s} do in Python?", "Explain {s} in Python.", "In Python, what is {s} for?",
                    "What is {s} used for in Python?"],
}
DRILL_A = {   # the asked subject first, then its fact (the first form most often: the one the judge reads)
    "definition": ["{A} {w} is {np}.", "{A} {w} is {np}.", 'The word "{w}" means {np}.'],
    "kind": ["{A} {w} is a kind of {h}.", "{A} {w} is a kind of {h}.", "{A} {w} is a type of {h}."],
    "opposite": ['The opposite of "{w}" is "{a}".', "The opposite of {w} is {a}.", 'An antonym of "{w}" is "{a}".'],
    "capital": ["The capital of {c} is {n}.", "The capital of {c} is {n}.", "{c}'s capital is {n}."],
    "capital_rev": ["{n} is the capital of {c}."],
    "python_task": ["To {t}, use {s}.", "To {t}, use {s}.", "To {t} in Python, use the {k} {s}: {f}"],
    "python_name": ["{S}: {f}", "The {k} {s}: {f}"],
}
# asks per fact (a noun has a definition and a kind: ~20 asks): v3e's "each subject 10-20 times"
DRILL_ASKS = {"definition": 11, "kind": 9, "opposite": 14, "capital": 16, "python": 14}


def heldout_subjects(items=None) -> set:
    """Every subject (lower case) of the judge's 75 items, of any category: no v3e drill asks about
    one of them, whatever it asks ("What does "home" mean?" is out though the judge asks home's kind)."""
    items = H.load() if items is None else items
    return {s.lower() for it in items for s in it["subjects"]}


def _names_heldout(text, held_re):
    return bool(held_re.search(text.lower()))


def binding_drills(rng, facts: dict, held: set, exclude, asks=None) -> list:
    """Short exchanges about the focused facts of subjects outside `held`: each fact asked asks[kind]
    times, cycling through its question phrasings (every phrasing before any repeats, a new order each
    round), the answer restating the asked subject first. A question naming any held-out subject as a
    whole word, or refused by `exclude`, is dropped. Items: {"kind": "v3_<kind>", "subject" / "word",
    "messages": [q, a]} (v3's kinds, so thought() names the subject)."""
    asks = DRILL_ASKS if asks is None else asks
    held_re = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(held, key=len, reverse=True)) + r")\b") \
        if held else re.compile(r"(?!x)x")
    out = []

    def cycle(qs, n):
        seq = []
        while len(seq) < n:
            r = qs[:]
            rng.shuffle(r)
            seq += r
        return seq[:n]

    for kind, fs in facts.items():
        for f in fs:
            subj = f["subject"]
            if subj.lower() in held or (kind == "capital" and f["n"].lower() in held) \
                    or (kind == "opposite" and f["a"].lower() in held):
                continue
            fmt = dict(f)
            if kind in ("definition", "kind"):
                fmt["a"] = fmt["A"].lower()
            if kind == "python":
                qk = "python_task" if f["t"] else "python_name"
                qs = DRILL_Q[qk] + (DRILL_Q["python_name"][:2] if f["t"] else [])
            else:
                qk, qs = kind, DRILL_Q[kind]
            for q in cycle(qs, asks[kind]):
                if kind == "python":
                    ak = "python_task" if "{t}" in q else "python_name"
                elif kind == "capital" and "{n}" in q:
                    ak = "capital_rev"
                else:
                    ak = kind
                a = rng.choice(DRILL_A[ak]).format(**fmt)
                if ak == "python_task":
                    a = a[0].upper() + a[1:]
                qq = q.format(**fmt)
                item = {"kind": f"v3_{kind}", ("word" if kind in ("definition", "kind", "opposite") else "subject"): subj,
                        "messages": [qq, a]}
                if _names_heldout(qq, held_re) or exclude(item):
                    continue
                out.append(item)
    return out


COPY_Q = ['Repeat this word exactly: {w}', 'Say "{w}" back to me.', "Copy the word: {w}",
          'What word did I write? "{w}"', "Please repeat: {w}", 'Write the word "{w}" again.',
          "Echo this word: {w}", 'Type "{w}" for me.']
COPY_A = ["{w}", '"{w}"', 'You wrote "{w}".', "{w}."]


GLOSS_WORDS, GLOSS_BAR = 14, r"[()\"`]"   # v3e-v3h: glosses of at most 14 words, none with these characters
LONG_GLOSS_WORDS, LONG_GLOSS_BAR = 32, r"[\"`]"   # v3i: up to 32 words, parentheses kept


def gloss_fits(g: str, most: int = GLOSS_WORDS, bar: str = GLOSS_BAR, least: int = 2) -> bool:
    return least <= len(g.split()) <= most and not re.search(bar, g)


def rare_words(syn, idx, skip, min_len=8, max_len=16, most=GLOSS_WORDS, bar=GLOSS_BAR):
    """(word, gloss as a noun phrase) for WordNet nouns of `min_len`-`max_len` letters (several tokens
    each: what a small model garbles when it copies), the first sense's gloss; skipped subjects left out."""
    out = []
    for (lemma, t), info in sorted(idx.items()):
        w = _w(lemma)
        if t != "n" or not re.fullmatch(rf"[a-z]{{{min_len},{max_len}}}", w) or skip(w):
            continue
        gloss = E._gloss(syn[info["synsets"][0]]["def"])
        if gloss_fits(gloss, most, bar):
            out.append((w, gloss))
    return out


def copy_drills(rng, words, n, exclude) -> list:
    """Copying drills: a rare, long word asked back; the reply is the word exactly."""
    out = []
    for w in rng.sample(words, min(n, len(words))):
        item = {"kind": "copy", "word": w,
                "messages": [rng.choice(COPY_Q).format(w=w), rng.choice(COPY_A).format(w=w)]}
        if not exclude(item):
            out.append(item)
    return out


# names of the v3e tools: made-up stems (copy_name) and real English words with a part, neither a pool
# name nor one of eval_v3.EVAL_NAMES (filtered by the caller): the name must be read off the offered list
def word_name(rng, words):
    w = rng.choice(words)
    part = rng.choice(NAME_PARTS)
    return rng.choice([f"{w}_{part}", f"{part}_{w}", f"{w}{part.capitalize()}", w])


DICT_DESC = ["Look up the meaning of an English word in the dictionary.", "Define an English word.",
             "Return the dictionary definition of a word.", "Get what a word means."]
DICT_Q = ["What does {w} mean?", 'What is the meaning of "{w}"?', "Look up {w} for me.", "Define the word {w}.",
          "What is {a} {w}? Please check the dictionary.", 'Can you look up "{w}"?', "Check the dictionary for {w}.",
          "What does the word {w} mean?"]
DICT_ANS = ['"{w}" means {d}.', "{W}: {d}.", 'According to the dictionary, "{w}" means {d}.', "{W} means {d}."]


# v3n: the names clients give a dictionary, banned from v3e's made names (DICT_VERBS x DICT_NOUNS) so
# that none could be recalled instead of read; none is an evaluation name (eval_v3.EVAL_NAMES)
NATURAL_DICT_NAMES = ["define_word", "define", "get_definition", "lookup_word", "dictionary", "word_lookup",
                      "lookup_definition", "get_meaning", "find_definition", "dictionary_lookup", "lexicon",
                      "defineWord", "getDefinition", "lookupWord"]


def tool_conversations_v3e(rng, dict_words, caps, arith, plain, exclude, n, banned=(), name_words=(),
                           think_frac=0.5, dict_frac=0.6, list_tools=False, names=None, rename_frac=0.0,
                           dict_draw=None, lookups=None, alone_frac=0.0, natural_frac=0.0):
    """(messages, tools, thinking) triples, as tool_conversations but: the first request is the
    dictionary's in `dict_frac` of them with the tools the tool evaluation offers (the dictionary,
    get_weather and one or two others, sometimes a calculator or a capitals tool too); every made
    tool's name is one to copy (copy_name or a real word with a part: none of the verbs x nouns pool,
    none of `banned`); the word is copied exactly into the call (half of the dictionary words are
    rare, long ones); the answer after the result repeats it. `dict_words`: [(word, definition)].
    `list_tools` (v3f): a thinking call's thought first lists the offered tools' names in the system
    turn's order, so the name is copied from nearby text rather than from the schemas far back.
    `names` (v3g): an iterator of names (real_names) that every made tool takes its name from, one each,
    instead of copy_name / word_name; and in `rename_frac` of the conversations the other offered tools
    (get_weather, ...) take one too, so that no offered name can be recalled instead of read.
    `dict_draw` (v3i): rng -> (word, definition), drawn in place of rng.choice(dict_words); `lookups`
    (v3i): the requests of a conversation that opens with the dictionary are a choice of these counts,
    each after the first a dictionary look-up in 70 % (the schemas read once for several copies).
    `alone_frac` (v3m): in that share only the made tools are offered (a third of the conversations
    that open with the dictionary then offer it alone): v3l, always offered 2-6 tools, answered a
    dictionary offered alone from memory in 50 of 50 (V3_PLAN section 30).
    `natural_frac` (v3n): in that share of the conversations that offer the dictionary beside other
    tools, it takes one of the NATURAL_DICT_NAMES clients give it instead of a fresh name (v3m, never
    trained on them, called get_weather when offered define_word beside it: V3_PLAN section 31)."""
    import conversations as C2

    def fresh_name(kind):
        while names is not None:
            nm = next(names)
            if nm not in banned:
                return nm
        while True:
            nm = copy_name(rng) if rng.random() < 0.6 else word_name(rng, name_words)
            if nm not in banned:
                return nm

    def tool(kind):
        desc = {"dict": rng.choice(DICT_DESC),
                "calc": rng.choice(["Evaluate an arithmetic expression.", "A small calculator.", "Compute a math expression."]),
                "cap": rng.choice(["Get the capital city of a country.", "Return the capital of a country."])}[kind]
        arg = rng.choice(ARGS[kind])
        return tool_schema(fresh_name(kind), desc, {arg: {"dict": "the word", "calc": "the expression",
                                                          "cap": "the country"}[kind]}), arg

    out = []
    for _ in range(n):
        if rng.random() < dict_frac:
            kinds = ["dict"] + rng.sample(["calc", "cap"], rng.choice([0, 0, 1]))
            others = [C2.OTHER_TOOLS[0]] + rng.sample(C2.OTHER_TOOLS[1:], rng.choice([1, 2]))
            first = "dict"
        else:
            kinds = rng.sample(["dict", "calc", "cap"], rng.choice([1, 2, 2, 3]))
            others = rng.sample(OTHER, rng.choice([1, 1, 2, 3]))
            first = None
        if alone_frac and rng.random() < alone_frac:   # v3m: only the made tools, as a client with one tool
            others = []
        made = {k: tool(k) for k in kinds}
        if natural_frac and others and "dict" in made and rng.random() < natural_frac:
            made["dict"][0]["function"]["name"] = rng.choice(NATURAL_DICT_NAMES)
        if rename_frac and rng.random() < rename_frac:
            others = [(fresh_name("other"), *t[1:]) for t in others]
        tools = [t for t, _ in made.values()] + [tool_schema(*t) for t in others]
        rng.shuffle(tools)
        thinking = rng.random() < think_frac
        msgs = []
        for j in range(rng.choice(lookups) if (lookups and first) else rng.choice([1, 1, 1, 2])):
            if j and lookups and first and rng.random() < 0.7:
                want = "dict"
            else:
                want = first if (j == 0 and first) else rng.choice(kinds + ["none"] * (1 if rng.random() < 0.2 else 0))
            if want == "dict":
                w, definition = dict_draw(rng) if dict_draw else rng.choice(dict_words)
                q = rng.choice(DICT_Q).format(w=w, a=_article(w))
                args, result = {made["dict"][1]: w}, json.dumps({"word": w, "definition": definition})
                ans = rng.choice(DICT_ANS).format(w=w, W=w[:1].upper() + w[1:], d=definition)
                subject = w
            elif want == "calc":
                q, args, result, ans, subject = calc_exchange(rng, arith, made["calc"][1])
            elif want == "cap":
                q, args, result, ans, subject = capital_exchange(rng, caps, made["cap"][1], TOOL_CAP_Q)
            else:  # nothing offered fits: a plain answer, no call
                msgs += plain_exchange(rng.choice(plain), thinking)
                continue
            if exclude({"kind": "v3_tools", "word": subject, "messages": [q, ans, result]}):
                continue
            offered = [t["function"]["name"] for t in tools] if list_tools else None
            msgs += tool_exchange(made[want][0]["function"]["name"], subject, q, args, result, ans, thinking, offered)
        if msgs:
            out.append((msgs, tools, thinking))
    return out


# ------------------------------------------------------------------------------ (j) v3h: copying spans
# v3g2-more (104M tokens) answered 68 of 75 held-out questions but used the dictionary tool's result in
# 6-11 of 50 answers: it starts copying the definition, then drifts into one it remembers ("large tough
# nonrigid bag carried into in cell or air"). In its training a common word's tool result was always
# the definition it had also learnt as a fact, so recalling and copying were the same answer. v3h: the
# result of a common word is often ANOTHER of its senses (a true definition, but not the remembered
# one), and span drills ask a whole unseen gloss back, word for word.

SPAN_Q = ['Repeat this exactly: "{t}"', "Copy this sentence word for word: {t}", 'Say this back to me: "{t}"',
          "Here is a note: {t}\nWhat does the note say, word for word?", 'Quote this: "{t}"',
          "Please repeat what I write, exactly: {t}"]
SPAN_A = ["{t}", '"{t}"', 'The note says: "{t}"', "{t}."]


def other_senses(syn, idx, words, last=4, most=GLOSS_WORDS, bar=GLOSS_BAR) -> list:
    """(word, gloss) of each given noun's second to `last`th WordNet senses: definitions the dictionary
    tool can return that are not the one a fact taught (whose gloss is the first sense's)."""
    out = []
    for w in words:
        info = idx.get((w.replace(" ", "_"), "n"))
        for key in (info or {}).get("synsets", [])[1:last]:
            g = E._gloss(syn[key]["def"])
            if gloss_fits(g, most, bar):
                out.append((w, g))
    return out


def span_drills(rng, syn, n, skipped, exclude, most=GLOSS_WORDS, bar=GLOSS_BAR) -> list:
    """Copying drills of whole spans: a WordNet gloss of 5-`most` words (any part of speech, none naming
    a subject that `skipped`, a regex of them in lower case, finds) asked back; the reply is the
    gloss exactly."""
    pool = sorted({g for g in (E._gloss(s["def"]) for s in syn.values())
                   if gloss_fits(g, most, bar, least=5) and not skipped.search(g.lower())})
    out = []
    for t in rng.sample(pool, min(n, len(pool))):
        item = {"kind": "span", "word": t.split()[0], "thought": "The text, word for word.",
                "messages": [rng.choice(SPAN_Q).format(t=t), rng.choice(SPAN_A).format(t=t)]}
        if not exclude(item):
            out.append(item)
    return out


# ------------------------------------------------------------------------------ (i) v3g: explained answers, names to copy
#
# v3f answers everything in one sentence: asked the Race tab's "What is a telescope? Explain it with an
# example." it thought "A short answer." and wrote ~20 tokens, so the live AR-vs-MTP race measured ~1.1x
# (a run's fixed costs weigh most on short replies; v2's 2-5 sentence answers showed 1.36x). v3g answers
# the questions that ask for an explanation (explain X, X with an example, in a few sentences, who was
# X, what does the word X mean) in 3-5 sentences built from the facts the short answers state (the
# definition and the kind exactly as they state them, then WordNet's kinds, parts and an example),
# after a thought that names the subject and the plan. The judge's families ("What is a X?", "Define
# X.") keep their short answers; an explained answer still passes the judge's shape (the definition
# and the kind in its first two sentences, at most EXPLAIN_MAX_WORDS words).

EXPLAIN_MAX_WORDS = 75   # judge.MAX_WORDS is 90
EXPLAIN_MIN_WORDS = 20   # "The word "away" means not present. It is an adjective. ..." is no explanation
EXPLAIN_Q = {   # by what the answer starts with and must hold
    "what": ["Explain what {a} {w} is.", "Can you explain what {a} {w} is?", "Explain what {a} {w} is in a few sentences.",
             "Tell me about {a} {w}.", "Describe {a} {w}.", "What exactly is {a} {w}?", "I would like to know what {a} {w} is.",
             "Explain {a} {w} to me.", "Give me a short explanation of {a} {w}.", "What is {a} {w}? Explain briefly.",
             "In a few sentences, what is {a} {w}?", "What is {a} {w}? Tell me a bit more than a definition.",
             "Could you describe what {a} {w} is?", "Explain the idea of {a} {w}."],
    "example": ["What is {a} {w}? Explain it with an example.", "What is {a} {w}? Give an example.",
                "Explain {a} {w} with an example.", "Explain {a} {w} to me, with an example.",
                "Tell me what {a} {w} is, with an example.", "Can you explain what {a} {w} is and give an example?",
                "What's {a} {w}? An example would help.", "Describe {a} {w} and give me an example."],
    "word": ['What does the word "{w}" mean?', "What does the word {w} mean? Explain it.",
             'Explain what the word "{w}" means.', "What is the meaning of the word {w}? Explain it in a few sentences.",
             'Can you explain the word "{w}" to me?'],
}
PERSON_Q = {"was": ["Who was {n}?", "Who was {n}? Tell me a little about them.", "Tell me about {n}.",
                    "What is {n} known for?", "Can you tell me who {n} was?", "Explain who {n} was.",
                    "Who was {n}? Explain in a few sentences."],
            "is": ["Who is {n}?", "Tell me about {n}.", "What is {n} known for?", "Can you tell me who {n} is?",
                   "Explain who {n} is."]}
ADJ_Q = ['What does the word "{w}" mean?', "What does the word {w} mean? Explain it.", 'Explain what the word "{w}" means.',
         "What is the meaning of the word {w}? Explain it with an example.", 'Can you explain the word "{w}" to me?',
         "What does {w} mean? Explain it in a few sentences."]


def template_words() -> set:
    """The words of the explained questions' templates (what is left of a question is its subject)."""
    return {w for qs in [*EXPLAIN_Q.values(), *PERSON_Q.values(), ADJ_Q] for q in qs
            for w in re.findall(r"[a-z][a-z'-]*", re.sub(r"\{\w+\}", " ", q).lower())} | {"a", "an"}


def _plan(steps):
    return steps[0] if len(steps) == 1 else ", ".join(steps[:-1]) + " and " + steps[-1]


def _fit(sentences, subject, keep_last=False, need=3, most=5):
    """(answer, thought, sentences) of the (sentence, plan step) pairs, cut to at most `most` sentences and
    EXPLAIN_MAX_WORDS words by dropping from the end (before the last one with `keep_last`: the asked
    example); None when fewer than `need` are left or they hold fewer than EXPLAIN_MIN_WORDS words.
    The thought: "The user asks <subject>. I will <plan>."."""
    out = list(sentences)
    while len(out) > most or (len(out) > need and sum(len(s.split()) for s, _ in out) > EXPLAIN_MAX_WORDS):
        out.pop(-2 if keep_last else -1)
    if len(out) < need or not EXPLAIN_MIN_WORDS <= sum(len(s.split()) for s, _ in out) <= EXPLAIN_MAX_WORDS:
        return None
    return " ".join(s for s, _ in out), f"The user asks {subject}. I will {_plan([p for _, p in out])}.", len(out)


def explain_noun(f, form):
    """An explained answer about a noun: (answer, thought, sentences) or None when its facts make fewer
    than three sentences (or the asked example is missing). `f`: a noun's template fields (_noun_fmt)
    with "np" and "h" as the short answers state them, "kinds" and "parts" (WordNet's hyponyms and part
    meronyms), "sibs" (other kinds of its kind, said only when the answer has room), "ex" (WordNet's
    example sentence, as the short definition quotes it) and "eg" ((a kind, its definition as a noun
    phrase): the example when WordNet has no sentence). `form`: "what", "example" (the example is
    asked: kept whatever else is dropped) or "word" (the word's meaning is asked)."""
    first = 'The word "{w}" means {np}.' if form == "word" else "{A} {w} is {np}."
    out = [(first.format(**f), "define it"),
           (("{A} {w} is a kind of {h}." if form == "word" else "It is a kind of {h}.").format(**f),
            "give its kind")]
    if len(f["kinds"]) >= 2:
        out.append((f"Kinds of {f['w']} include {E._list(f['kinds'])}.", "name kinds"))
    if len(f["parts"]) >= 2:
        out.append((f"Parts of {f['A'].lower()} {f['w']} include {E._list(f['parts'])}.", "name parts"))
    if len(f.get("sibs", ())) >= 2:   # dropped first when the answer runs long
        out.append((f"Other kinds of {f['h']} include {E._list(f['sibs'])}.", "name related kinds"))
    if f.get("ex"):
        out.append((f'For example: "{f["ex"]}".', "give an example"))
    elif f.get("eg"):
        k, k_np = f["eg"]
        out.append((f"For example, {_article(k)} {k} is {k_np}.", "give an example"))
    elif form == "example":
        return None
    asks = {"what": "what {a} {w} is", "example": "what {a} {w} is and wants an example",
            "word": 'what the word "{w}" means'}[form].format(a=f["A"].lower(), w=f["w"])
    return _fit(out, asks, keep_last=out[-1][1] == "give an example")


def _an(phrase):
    """The article of a phrase, "a" before the "you" sound of United, Ukrainian, European, ... (corpus._article
    reads only the first letter: v2 wrote "an United States physicist")."""
    return "a" if re.match(r"(?i)(u(ni|k|r|g|s|t)|eu|one\b)", phrase) else _article(phrase)


def explain_person(p, alias: bool = False):
    """An explained answer about a person, every sentence naming them as the question does (the drills'
    rule: the asked subject first): (answer, thought, sentences) or None. `p`: "asked" (the name the
    question uses), "names" (WordNet's names of the person, fullest first), "desc" (the gloss without
    its parentheses), "years" ((born, died) or (born,)), "born_in" (a place or None), "known_as" (the
    instance's classes). `alias` (v3h): the sentences after the first name them by the shortest other
    name of theirs that is part of the asked one ("Mozart" after "Wolfgang Amadeus Mozart", "Van Allen"
    after "James Alfred Van Allen"), as English does: a long name in every sentence repeats 8-token
    spans, which the loop measure counts."""
    n, verb = p["asked"], "was" if len(p["years"]) == 2 else "is"
    part = [x for x in p["names"] if x != n and re.search(rf"(^| ){re.escape(x)}( |$)", n)]
    m = min(part, key=len) if alias and part else n
    desc = p["desc"] if re.match(r"(a|an|the|one) ", p["desc"]) else f"{_an(p['desc'])} {p['desc']}"
    place = f" in {p['born_in']}" if p["born_in"] else ""
    out = [(f"{n} {verb} {desc}.", "say who they are" if verb == "is" else "say who they were"),
           (f"{m} lived from {p['years'][0]} to {p['years'][1]}." if len(p["years"]) == 2
            else f"{m} was born{place} in {p['years'][0]}.", "give the years")]
    if p["known_as"]:
        out.append((f"{m} is known as {E._list([f'{_an(k)} {k}' for k in p['known_as']])}.", "name the field"))
    if place and len(p["years"]) == 2:
        out.append((f"{m} was born{place}.", "give the birthplace"))
    others = [x for x in p["names"] if x not in (n, m)][:2]
    if others:
        out.append((f"{m} is also called {E._list(others)}.", "give other names"))
    return _fit(out, f"who {n} {verb}")


def explain_adjective(f):
    """An explained answer about an adjective: (answer, thought, sentences) or None. `f`: "w", "gloss", "ex"
    (an example holding the word), "opp" (its first antonym, as the short opposites state it), "sim"
    (other words of its first sense)."""
    w = f["w"]
    out = [(f'The word "{w}" means {f["gloss"]}.', "define it"), ("It is an adjective.", "say it is an adjective")]
    if f["ex"]:
        out.append((f'For example: "{f["ex"]}".', "give an example"))
    if f["opp"]:
        out.append((f'The opposite of "{w}" is "{f["opp"]}".', "give its opposite"))
    if f["sim"]:
        out.append((f"Words with a similar meaning are {E._list(f['sim'])}." if len(f["sim"]) > 1
                    else f'A word with a similar meaning is "{f["sim"][0]}".', "name similar words"))
    return _fit(out, f'what the word "{w}" means')


def explain_noun_facts(wn, skip, freq_min=1):
    """explain_noun's facts of the nouns of _noun_facts that have a kind (its first hypernym), skipped
    subjects left out, and none of the kinds, parts or example kinds a skipped word. `wn`: an
    everyday.WordNet (its `related` reads the hyponyms and parts as v2's concept answers did)."""
    out = []
    for w, art, hyper, np_, _, ex, f in _noun_facts(wn.syn, wn.idx):
        if not hyper or f < freq_min or skip(w):
            continue
        s = wn.syn[wn.idx[(w.replace(" ", "_"), "n")]["synsets"][0]]
        kinds = [k for k in wn.related(s, "~", 6) if k.lower() != w and not skip(k.lower())][:3]
        parts = [k for k in wn.related(s, "%p", 3) if not skip(k.lower())]
        eg = None
        for p in s["ptrs"]:   # a kind whose definition is short, to give as the example
            k = wn.first_word((p[1], "n")) if p[0] == "~" else None
            if k and re.fullmatch(r"[a-z][a-z -]+", k) and k != w and not skip(k):
                k_np = _gloss_np(wn.syn[(p[1], "n")]["def"])[1]
                if k_np and 3 <= len(k_np.split()) <= 16:
                    eg = (k, k_np.rstrip("."))
                    break
        h = next((p[1], "n") for p in s["ptrs"] if p[0] == "@")   # the kind's synset, as _noun_facts reads it
        sibs = [k for k in wn.related(wn.syn[h], "~", 6) if k.lower() != w and not skip(k.lower())
                and k not in kinds][:3]
        out.append({**_noun_fmt(w, art), "h": hyper, "ha": _article(hyper), "np": np_.rstrip("."), "kinds": kinds,
                    "parts": parts, "sibs": sibs, "ex": ex, "eg": eg, "freq": f})
    return out


def _person_classes(syn, root=("00007846", "n")):
    """Every synset under person (WordNet's hyponym tree): an instance of one of them is a person."""
    seen, todo = {root}, [root]
    while todo:
        for p in syn[todo.pop()]["ptrs"]:
            k = (p[1], "n")
            if p[0] == "~" and k not in seen and k in syn:
                seen.add(k)
                todo.append(k)
    return seen


def explain_person_facts(wn, skip):
    """explain_person's facts of WordNet's people with dates ("(1564-1642)", "(born in 1943)"), whose
    names hold no skipped word: the names everyday._person_name takes first (the fullest)."""
    classes = _person_classes(wn.syn)
    out = []
    for key, s in sorted(wn.syn.items()):
        inst = [(p[1], "n") for p in s["ptrs"] if p[0] == "@i"]
        if key[1] != "n" or not inst or not any(k in classes for k in inst):
            continue
        name = E._person_name(s["words"])
        d = E._gloss(s["def"])
        lived = re.search(r"\((\d{3,4})-(\d{3,4})\)", d) or re.search(r"\(born in (\d{4})\)", d)
        names = [_w(x) for x in s["words"]]
        if not name or not lived or any(skip(t) for x in names for t in re.findall(r"[a-z]+", x.lower())):
            continue
        born = re.search(r"\(born in ([A-Z][^)0-9]*)\)", d)
        desc = re.sub(r"\s+", " ", re.sub(r"\s*\([^)]*\)", "", d)).strip().rstrip(".")
        if not 2 <= len(desc.split()) <= 30:
            continue
        known = [k for k in (wn.first_word(k) for k in inst) if k and re.fullmatch(r"[a-z][a-z -]+", k)][:3]
        names = [name] + [x for x in names if x != name and re.fullmatch(r"[A-Z][A-Za-z.' -]+", x)]
        out.append({"names": names, "desc": desc, "years": lived.groups(), "born_in": born.group(1) if born else None,
                    "known_as": known})
    return out


def explain_adjective_facts(wn, skip, freq_min=3):
    """explain_adjective's facts of the adjectives running text uses (WordNet's tagged counts), first sense."""
    freq = H.frequency()
    out = []
    for (lemma, t), info in sorted(wn.idx.items()):
        if t != "a" or freq.get((lemma, t), 0) < freq_min or not re.fullmatch(r"[a-z]{3,15}", lemma) or skip(lemma):
            continue
        s = wn.syn[info["synsets"][0]]
        gloss = E._gloss(s["def"])
        if not 2 <= len(gloss.split()) <= 20:
            continue
        ants = [a for a in H._antonyms(wn.syn, info, lemma) if not skip(a)]
        sim = [x for x in (_w(x) for x in s["words"])
               if x != lemma and re.fullmatch(r"[a-z][a-z -]+", x) and not skip(x)]
        ex = next((e for e in s["ex"] if re.search(rf"\b{lemma}\b", e)), None)
        out.append({"w": lemma, "gloss": gloss, "ex": ex, "opp": ants[0] if ants else None, "sim": sim[:3]})
    return out


def explained_answers(rng, nouns, persons, adjectives, held, exclude, common_freq=20, alias=False):
    """Exchanges {"kind": "v3_explain", "word" / "subject", "about", "messages": [q, a], "thought",
    "sentences"}: every noun once (twice, in two forms, when running text uses it `common_freq` times or
    more), every person and adjective once. A question naming a held-out subject of any category (`held`, as the drills) or
    refused by `exclude` is dropped; the held-out subjects' facts stay statements in the notes. `alias`:
    explain_person's."""
    held_re = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(held, key=len, reverse=True)) + r")\b") \
        if held else re.compile(r"(?!x)x")
    out = []

    def add(q, made, **item):
        if made is None or held_re.search(q.lower()):
            return
        d = {"kind": "v3_explain", **item, "messages": [q, made[0]], "thought": made[1], "sentences": made[2]}
        if not exclude(d):
            out.append(d)

    plain = template_words()   # a subject made of the questions' own words ("a give", "the like") reads as none
    for f in nouns:
        if set(f["w"].split()) & plain:
            continue
        pool = ["what", "word", "example", "example"] if f.get("ex") or f.get("eg") else ["what", "word"]
        forms = list(dict.fromkeys(rng.sample(pool, len(pool))))   # each once; the example first in half the draws
        for form in forms[:2 if f["freq"] >= common_freq else 1]:
            q = rng.choice(EXPLAIN_Q[form]).format(a=f["A"].lower(), w=f["w"])
            add(q, explain_noun(f, form), word=f["w"], about="noun")
    for p in persons:
        n = rng.choice(p["names"])
        q = rng.choice(PERSON_Q["was" if len(p["years"]) == 2 else "is"]).format(n=n)
        add(q, explain_person({**p, "asked": n}, alias), subject=n, about="person")
    for f in adjectives:
        if not set(f["w"].split()) & plain:
            add(rng.choice(ADJ_Q).format(w=f["w"]), explain_adjective(f), word=f["w"], about="adjective")
    return out


# v3f's tool names to copy were made-up syllables with a common part (copy_name) or one of ~700 words with
# one (word_name): the model learnt to WRITE names of that shape instead of copying the offered one
# (offered "wordbook" it wrote "book_date", "dict_api" -> "vid_api", "glossary_service" -> "lodary_service").
# v3g's names come from a pool of thousands of real-looking names made of real English words, each used
# about once, in every shape the tool evaluation's names have (a word, word_part, wordPart, verb_noun, a
# closed compound, a short phrase, an abbreviation with a part): no shape or word predicts the name, so
# only the system turn does. None is an evaluation name or holds one of their stems (copy_stems).
REAL_PARTS = NAME_PARTS + ["search", "index", "guide", "reader", "base", "kit", "store", "center", "engine",
                           "client", "bot", "source", "check", "data", "list", "pro", "plus", "now"]


def _components(name):
    """A name's words: split at underscores and camelCase humps, lower case."""
    return [c.lower() for c in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)]


def copy_stems(names, parts=REAL_PARTS) -> set:
    """The stems the evaluation's names use (their words that are not a common part): "dict_api" -> dict,
    "wordbook" -> wordbook, "look_it_up" -> look, it, up."""
    return {c for n in names for c in _components(n)} - set(parts)


def clashes(name, names, stems) -> bool:
    """Whether a tool name is one of `names` (case and underscores aside), has one of `stems` as a word,
    or holds a stem of four letters or more anywhere ("swordfish" holds "word")."""
    flat = re.sub(r"[^a-z0-9]", "", name.lower())
    return flat in {re.sub(r"[^a-z0-9]", "", n.lower()) for n in names} or bool(set(_components(name)) & stems) \
        or any(s in flat for s in stems if len(s) >= 4)


def tool_name_words(skip, freq_min=1):
    """(words, phrases) for tool names: WordNet's single-word lemmas of 3-10 letters that running text uses,
    and its two- and three-word lemmas ("give_way"), none holding a skipped word."""
    freq = H.frequency()
    words, phrases = set(), set()
    for (lemma, t), f in freq.items():
        if f < freq_min or any(skip(x) for x in lemma.split("_")):
            continue
        if re.fullmatch(r"[a-z]{3,10}", lemma):
            words.add(lemma)
        elif re.fullmatch(r"[a-z]{2,10}(_[a-z]{2,10}){1,2}", lemma):
            phrases.add(lemma)
    return sorted(words), sorted(phrases)


def _real_name(rng, words, phrases):
    """One name in one of the shapes of the evaluation's names, by share: a word (15 %), word_part (25 %),
    part_word (7 %), wordPart (10 %), word_word (15 %), wordWord (8 %), a closed compound (6 %), a
    phrase (7 %), an abbreviation with a part (7 %)."""
    w, v, part = rng.choice(words), rng.choice(words), rng.choice(REAL_PARTS)
    r = rng.random()
    for upto, name in ((0.15, lambda: w), (0.40, lambda: f"{w}_{part}"), (0.47, lambda: f"{part}_{w}"),
                       (0.57, lambda: f"{w}{part.capitalize()}"), (0.72, lambda: f"{v}_{w}"),
                       (0.80, lambda: f"{v}{w.capitalize()}"), (0.86, lambda: f"{v}{w}"),
                       (0.93, lambda: rng.choice(phrases) if phrases else f"{v}_{w}")):
        if r < upto:
            return name()
    return f"{w[:rng.randint(3, 4)]}_{part}"


def real_names(rng, words, phrases, n, bad=lambda name: False) -> list:
    """`n` distinct tool names of real words (_real_name), none that `bad` refuses (ValueError when the
    words make too few)."""
    out, seen, tries = [], set(), 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n:
            raise ValueError(f"{len(words)} words and {len(phrases)} phrases make fewer than {n} names")
        name = _real_name(rng, words, phrases)
        if name not in seen and not bad(name):
            seen.add(name)
            out.append(name)
    return out
