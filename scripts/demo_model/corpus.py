"""The demo corpus's sources: exchanges built offline from redistributable Debian packages
(assembled into conversations by conversations.py, with everyday.py's questions).

  wordnet-base        WordNet 3.0 (Princeton WordNet licence, BSD-like)  -> define / example /
                      synonyms / antonym / "what kind of thing" exchanges
  python3.11-doc      Python docs rst sources (PSF licence) -> FAQ Q/A, glossary Q/A, tutorial prose
  fortunes(-min)      fortune quote files (BSD; a filtered, attributed subset) -> "tell me a quote"
  dict-devil          Ambrose Bierce, The Devil's Dictionary (public domain) -> cynical definitions
  dict-jargon         The Jargon File 4.4.7 (public domain) -> hacker-slang definitions
  r-cran-janeaustenr  Jane Austen's six novels (public domain) -> plain prose
plus hand-written greetings / identity / thanks / help exchanges (this project, Apache-2.0).

Each exchange is {"kind": ..., "messages": [question, answer]} (prose: {"kind": "prose", "text"}).
The answers are deliberately formulaic (one fixed shape per question type): that is what makes
the demo's replies predictable enough for a one-layer MTP head to draft them.
"""
from __future__ import annotations

import glob
import gzip
import os
import re

WN = "/usr/share/wordnet"
PYDOC = "/usr/share/doc/python3.11/html/_sources"
FORTUNES = "/usr/share/games/fortunes"
DICTD = "/usr/share/dictd"
AUSTEN = "/usr/lib/R/site-library/janeaustenr/data"

# What each source needs on disk, and the Debian package or pip module that brings it: a corpus built
# without one is another corpus (austen() alone skips itself), so builders check first.
SOURCES = {"wordnet-base": f"{WN}/data.noun", "python3.11-doc": PYDOC, "fortunes": FORTUNES,
           "dict-devil": f"{DICTD}/devil.dict.dz", "dict-jargon": f"{DICTD}/jargon.dict.dz",
           "r-cran-janeaustenr": f"{AUSTEN}/Rdata.rdb"}


def missing_sources() -> str:
    """'' when every source is here, else what to install, as one line to run."""
    import importlib.util

    debs = [pkg for pkg, path in SOURCES.items() if not os.path.exists(path)]
    pips = [] if importlib.util.find_spec("rdata") else ["rdata"]
    todo = ([f"apt-get install -y {' '.join(debs)}"] if debs else []) + ([f"pip install {' '.join(pips)}"] if pips else [])
    return "; ".join(todo)


POS_NAME = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}

# --------------------------------------------------------------------------------------- WordNet


def _wn_synsets():
    syn = {}
    for pos in ("noun", "verb", "adj", "adv"):
        with open(f"{WN}/data.{pos}", encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                p = head.split()
                off, ss_type = p[0], p[2]
                wcnt = int(p[3], 16)
                words = [p[4 + 2 * i] for i in range(wcnt)]
                i = 4 + 2 * wcnt
                pcnt = int(p[i]); i += 1
                ptrs = []
                for _ in range(pcnt):
                    ptrs.append((p[i], p[i + 1], p[i + 2], p[i + 3]))
                    i += 4
                gloss = gloss.strip()
                exs = re.findall(r'"([^"]+)"', gloss)
                defn = re.split(r';\s*"', gloss)[0].strip().rstrip(";").strip()
                syn[(off, ss_type if ss_type != "s" else "a")] = {
                    "type": ss_type, "words": words, "ptrs": ptrs, "def": defn, "ex": exs,
                }
    return syn


def _wn_index():
    """lemma -> list of (synset key) in sense order, with tagged-sense count."""
    idx = {}
    for pos, t in (("noun", "n"), ("verb", "v"), ("adj", "a"), ("adv", "r")):
        with open(f"{WN}/index.{pos}", encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                p = line.split()
                lemma = p[0]
                scnt = int(p[2])
                pcnt = int(p[3])
                tagged = int(p[5 + pcnt])
                offs = p[6 + pcnt: 6 + pcnt + scnt]
                idx[(lemma, t)] = {"tagged": tagged, "synsets": [(o, t) for o in offs]}
    return idx


def _w(word):
    w = word.replace("_", " ")
    return re.sub(r"\(\w+\)$", "", w)


def _article(noun):
    return "an" if noun[:1].lower() in "aeiou" else "a"


def _quote_list(items):
    items = [f'"{x}"' for x in items]
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


DEFINE_Q = [
    'What does "{w}" mean?', "What does {w} mean?", "Define {w}.", "define {w}",
    'What is the meaning of "{w}"?', 'What is the meaning of the word "{w}"?',
    'Can you define "{w}" for me?', "Meaning of {w}?", 'What is the definition of "{w}"?',
    "{w}?", "What's {w}?", 'Explain the word "{w}".', "Please define the word {w}.",
]
DEFINE_Q_NOUN = ["What is {a} {w}?", "What's {a} {w}?"]
DEFINE_Q_VERB = ["What does it mean to {w}?"]
EXAMPLE_Q = [
    'Use "{w}" in a sentence.', "Give me an example sentence with {w}.",
    'Can you use the word "{w}" in a sentence?', 'How do I use "{w}" in a sentence?',
    "Example of {w} in a sentence?",
]
SYN_Q = [
    'What is another word for "{w}"?', "Give me a synonym for {w}.", "Synonyms of {w}?",
    'What are some synonyms for "{w}"?', "What's another way to say {w}?",
]
ANT_Q = [
    'What is the opposite of "{w}"?', "Give me an antonym for {w}.", "Antonym of {w}?",
    'What is an antonym of "{w}"?',
]
HYPER_Q = ["What kind of thing is {a} {w}?", 'What category does "{w}" belong to?', "{A} {w} is a type of what?"]


def _pick(rng, pool, k):
    """k distinct templates; k == 1 draws with rng.choice (the shipped corpus was built so)."""
    return [rng.choice(pool)] if k == 1 else rng.sample(pool, min(k, len(pool)))


def wordnet_chats(rng, min_tagged=1, phrasings=1):
    syn = _wn_synsets()
    idx = _wn_index()
    out = []
    for (lemma, t), info in idx.items():
        if info["tagged"] < min_tagged:
            continue
        w = _w(lemma)
        if not re.fullmatch(r"[a-z][a-z' -]*", w):
            continue
        senses = [syn[s] for s in info["synsets"] if s in syn]
        if not senses:
            continue
        pos = POS_NAME[t]
        s0 = senses[0]
        a = _article(w)
        fmt = {"w": w, "a": a, "A": a.capitalize()}
        # definition: first sense, second sense if present, one example
        defs = [s["def"] for s in senses[:2] if s["def"]]
        if defs:
            ans = f'"{w}" is {_article(pos)} {pos}. It means {defs[0]}.'
            if len(defs) > 1 and info["tagged"] >= 3:
                ans += f" It can also mean {defs[1]}."
            ex = next((e for s in senses[:2] for e in s["ex"] if w.split()[0] in e.lower()), None)
            if ex:
                ans += f'\n\nFor example: "{ex}"'
            qs = DEFINE_Q + (DEFINE_Q_NOUN if t == "n" else DEFINE_Q_VERB if t == "v" else [])
            used = _pick(rng, qs, phrasings)
            for q in used:
                out.append({"kind": "define", "messages": [q.format(**fmt), ans], "word": w, "qs": qs,
                            "fmt": fmt, "used": used})
        # example
        exs = [e for s in senses for e in s["ex"] if w.split()[0] in e.lower()]
        if exs:
            for q in _pick(rng, EXAMPLE_Q, phrasings):
                out.append({"kind": "example", "word": w,
                            "messages": [q.format(**fmt), f'Here is an example sentence with "{w}":\n\n"{exs[0]}"']})
        # synonyms: other words of the first two senses
        syns = []
        for s in senses[:2]:
            for x in s["words"]:
                x = _w(x)
                if x.lower() != w.lower() and x not in syns and re.fullmatch(r"[A-Za-z][A-Za-z' -]*", x):
                    syns.append(x)
        if syns:
            if len(syns) == 1:
                ans = f'A synonym of "{w}" is "{syns[0]}".'
            else:
                ans = f'Some synonyms of "{w}" are {_quote_list(syns[:4])}.'
            for q in _pick(rng, SYN_Q, phrasings):
                out.append({"kind": "synonym", "word": w, "messages": [q.format(**fmt), ans]})
        # antonym (lexical pointer '!')
        ants = []
        for s in senses[:3]:
            for sym, off, pt, st in s["ptrs"]:
                if sym == "!":
                    key = (off, pt if pt != "s" else "a")
                    if key in syn:
                        tgt = int(st[2:], 16)
                        words = syn[key]["words"]
                        if 1 <= tgt <= len(words):
                            x = _w(words[tgt - 1])
                            if x not in ants:
                                ants.append(x)
        if ants:
            for q in _pick(rng, ANT_Q, phrasings):
                out.append({"kind": "antonym", "word": w,
                            "messages": [q.format(**fmt), f'The opposite of "{w}" is "{ants[0]}".']})
        # hypernym (nouns)
        if t == "n":
            hyp = [p for p in s0["ptrs"] if p[0] in ("@", "@i")]
            if hyp:
                hs = syn.get((hyp[0][1], "n"))
                if hs:
                    h = _w(hs["words"][0])
                    for q in _pick(rng, HYPER_Q, phrasings):
                        out.append({"kind": "hypernym", "word": w,
                                    "messages": [q.format(**fmt), f"{a.capitalize()} {w} is a kind of {h}."]})
    return out


# --------------------------------------------------------------------------------------- Python docs


def rst_to_text(s: str) -> str:
    s = re.sub(r":[a-z]+(?::[a-z]+)?:`~?([^`<]*?)\s*<[^>]*>`", r"`\1`", s)
    s = re.sub(r":[a-z]+(?::[a-z]+)?:`~?([^`]*)`", lambda m: "`" + m.group(1).split(".")[-1] + "`"
               if m.group(1).startswith("~") else "`" + m.group(1) + "`", s)
    s = re.sub(r"`([^`<]+?)\s*<[^>]+>`_+", r"\1", s)
    s = s.replace("``", "`")
    lines = s.split("\n")
    out = []
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith(".. code-block::") or ln.startswith(".. doctest::") or ln.startswith(".. testcode::"):
            i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                if lines[i].strip().startswith(":"):
                    i += 1
                    continue
                block.append(lines[i])
                i += 1
            out.extend(_fence(block))
            continue
        if ln.startswith(".. "):
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                i += 1
            continue
        if ln.rstrip().endswith("::"):
            t = ln.rstrip()[:-2].rstrip()
            if t:
                out.append(t + ":")
            i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                block.append(lines[i])
                i += 1
            out.extend(_fence(block))
            continue
        out.append(ln)
        i += 1
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    return unwrap(text)


def unwrap(text: str) -> str:
    """Join hard-wrapped lines of prose paragraphs (fenced code blocks and lists stay as they are)."""
    parts = re.split(r"(```python\n.*?\n```)", text, flags=re.S)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"(?<=\S)[ \t]*\n(?!\n|\s*[*\-] |\s*\d+\. |\s*```)[ \t]*(?=\S)", " ", parts[i])
    return "".join(parts)


def _fence(block):
    while block and not block[0].strip():
        block = block[1:]
    while block and not block[-1].strip():
        block = block[:-1]
    if not block:
        return []
    ind = min(len(b) - len(b.lstrip()) for b in block if b.strip())
    return ["", "```python"] + [b[ind:] for b in block] + ["```", ""]


def python_faq(rng, repeats=1):
    """Each FAQ answer `repeats` times (v1 used 4: long answers it then recalled badly, in loops)."""
    out = []
    for fn in sorted(glob.glob(f"{PYDOC}/faq/*.rst.txt")):
        txt = open(fn, encoding="utf-8").read()
        parts = re.split(r"\n([^\n]+\?)\n-{3,}\n", "\n" + txt)
        for j in range(1, len(parts) - 1, 2):
            q = parts[j].strip()
            body = re.split(r"\n[^\n]+\n[=\-~^]{3,}\n", parts[j + 1])[0]
            a = rst_to_text(body)
            if 40 <= len(a) <= 2500:
                for _ in range(repeats):
                    out.append({"kind": "python_faq", "messages": [rst_to_text(q), a]})
    return out


def python_glossary(rng):
    txt = open(f"{PYDOC}/glossary.rst.txt", encoding="utf-8").read()
    out = []
    entries = re.findall(r"\n   (\S[^\n]*)\n((?:      [^\n]*\n|\n)+)", txt)
    qs = ["What is {t} in Python?", 'What does "{t}" mean in Python?', "Python: what is {t}?",
          "Explain {t} in Python."]
    for term, body in entries:
        term = term.strip()
        if term.startswith(">>>") or term.startswith("..."):
            continue
        body = "\n".join(l[6:] for l in body.split("\n"))
        a = rst_to_text(body)
        first = a.split("\n\n")[0].replace("\n", " ")
        if 30 <= len(first) <= 1200:
            for q in rng.sample(qs, 2):
                out.append({"kind": "python_glossary",
                            "messages": [q.format(t=term), f'In Python, "{term}" means: {first}']})
    return out


def python_prose():
    out = []
    for fn in sorted(glob.glob(f"{PYDOC}/tutorial/*.rst.txt")):
        txt = rst_to_text(open(fn, encoding="utf-8").read())
        txt = re.sub(r"\n[=\-~^*]{3,}\n", "\n", txt)
        for chunk in re.split(r"\n\n(?=[A-Z])", txt):
            if len(chunk) > 200:
                out.append({"kind": "prose", "text": chunk.strip()})
    return out


# --------------------------------------------------------------------------------------- quotes

FORTUNE_FILES = ["fortunes", "wisdom", "literature", "people", "science", "humorists", "education",
                 "work", "platitudes", "computers", "love", "kids", "food", "pets", "medicine",
                 "sports", "law", "magic", "miscellaneous", "art", "definitions", "goedel"]
QUOTE_Q = ["Tell me a quote.", "Give me a quote.", "Share a quote with me.", "Do you know a good quote?",
           "Tell me something wise.", "I need some inspiration.", "Can you give me a famous quote?",
           "Quote of the day?", "Say something clever.", "Tell me a fortune."]


def fortunes(rng):
    out = []
    for name in FORTUNE_FILES:
        fn = f"{FORTUNES}/{name}"
        if not os.path.exists(fn):
            continue
        raw = open(fn, encoding="latin-1").read()
        for item in raw.split("\n%\n"):
            item = item.strip("\n")
            m = re.match(r"(?s)(.*?)\n\s*--\s*([^\n]+)\s*$", item)
            if not m:
                continue
            body = " ".join(l.strip() for l in m.group(1).split("\n")).strip()
            author = m.group(2).strip()
            if not (20 <= len(body) <= 280) or len(author) > 60 or not re.match(r"[A-Z]", author):
                continue
            if re.search(r"\b(fuck|shit|sex|damn|nigg|bitch|whore|rape)", body, re.I):
                continue
            q = rng.choice(QUOTE_Q)
            out.append({"kind": "quote", "messages": [q, f'Here is a quote:\n\n"{body}"\n\n-- {author}']})
    return out


# --------------------------------------------------------------------------------------- dictd


def _b64(s):
    al = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    v = 0
    for c in s:
        v = v * 64 + al.index(c)
    return v


def _dict_entries(name):
    data = gzip.open(f"{DICTD}/{name}.dict.dz").read()
    out = []
    for line in open(f"{DICTD}/{name}.index", encoding="utf-8", errors="replace"):
        p = line.rstrip("\n").split("\t")
        if len(p) < 3 or p[0].startswith("00database"):
            continue
        off, ln = _b64(p[1]), _b64(p[2])
        out.append((p[0], data[off: off + ln].decode("utf-8", "replace")))
    return out


def devil(rng):
    out = []
    qs = ["How does the Devil's Dictionary define {w}?", "Give me a cynical definition of {w}.",
          "What did Ambrose Bierce say about {w}?", "Cynical definition of {w}?"]
    for head, body in _dict_entries("devil"):
        m = re.match(r"(?s)\s*([A-Z][A-Z' -]+),\s*([a-z.]+)\s+(.*)", body)
        if not m:
            continue
        w = m.group(1).strip().lower()
        para = re.split(r"\n\s*\n", m.group(3))[0]
        d = " ".join(para.split())
        d = re.sub(r"[{}]", "", d)
        if 15 <= len(d) <= 500:
            q = rng.choice(qs).format(w=w)
            out.append({"kind": "devil", "messages": [q, f'In The Devil\'s Dictionary, Ambrose Bierce defines "{w}" as: {d}']})
    return out


def jargon(rng):
    out = []
    qs = ['What does "{w}" mean in hacker slang?', "What is {w} in the Jargon File?",
          "Hacker jargon: what is {w}?", 'What do hackers mean by "{w}"?']
    for head, body in _dict_entries("jargon"):
        lines = body.split("\n")
        w = lines[0].strip()
        rest = "\n".join(lines[1:])
        paras = [p for p in re.split(r"\n\s*\n", rest) if p.strip()]
        if len(paras) < 2 or not re.fullmatch(r"[A-Za-z][A-Za-z' -]{1,30}", w):
            continue
        d = " ".join(paras[1].split())
        d = re.sub(r"^\[[^\]]*\]\s*", "", d)
        d = re.sub(r"[{}]", "", d)
        if 20 <= len(d) <= 600:
            q = rng.choice(qs).format(w=w)
            out.append({"kind": "jargon", "messages": [q, f'In hacker jargon, "{w}" means: {d}']})
    return out


# --------------------------------------------------------------------------------------- Austen


def austen():
    try:
        import struct  # noqa: F401
        import zlib

        import rdata
    except ImportError:
        print("rdata not installed (pip install rdata): skipping Austen prose")
        return []
    raw = gzip.decompress(open(f"{AUSTEN}/Rdata.rdx", "rb").read())
    idx = rdata.conversion.convert(rdata.parser.parse_data(raw))
    rdb = open(f"{AUSTEN}/Rdata.rdb", "rb").read()
    out = []
    import warnings
    for name, (off, ln) in idx["variables"].items():
        chunk = rdb[int(off): int(off) + int(ln)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lines = rdata.conversion.convert(rdata.parser.parse_data(zlib.decompress(chunk[4:])))
        text = "\n".join(str(x) for x in lines)
        paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
        paras = [p for p in paras if len(p) > 80 and not p.isupper()]
        # documents of ~6 paragraphs
        for i in range(0, len(paras), 6):
            out.append({"kind": "prose", "text": "\n\n".join(paras[i:i + 6])})
    return out


# --------------------------------------------------------------------------------------- small talk

INTRO = ("I am a small demo model for mtp-chat. I can define English words, explain simple things, answer "
         "small Python and arithmetic questions, share a quote, and use a dictionary or a calculator tool "
         "when you offer me one.")
GREET_Q = ["Hello!", "Hi!", "Hi there!", "Hey!", "Good morning!", "Good evening!", "Hello, how are you?",
           "Hi, how are you doing?", "Hey, what's up?", "Greetings!", "Yo!", "hello", "hi", "Howdy!",
           "Good afternoon!", "Hello there, friend!", "Hi! Who am I talking to?"]
GREET_A = [
    "Hello! " + INTRO + " What would you like to know?",
    "Hi! " + INTRO + " How can I help you today?",
    "Hello! I am doing well, thank you. " + INTRO + " What would you like to ask?",
    "Hi there! " + INTRO + " Ask me about a word, a Python question or a quote.",
]
ID_Q = ["Who are you?", "What are you?", "What can you do?", "What is your name?", "Tell me about yourself.",
        "Are you a real assistant?", "What do you know?", "How were you made?", "Help", "help",
        "What can I ask you?", "What are you good at?"]
ID_A = [
    INTRO + " I am a demo, not a real assistant: my answers are often wrong, so please check them.",
    "I am the demo model of mtp-chat, a small Qwen3.5-style model with a multi-token-prediction head. "
    + INTRO.replace("I am a small demo model for mtp-chat. ", "") + " Ask me something like \"What does serendipity mean?\"",
    INTRO + " For example, you can ask me \"Define harmony.\", \"Give me a synonym for happy.\" or \"Tell me a quote.\"",
]
THANKS_Q = ["Thank you!", "Thanks!", "Thanks a lot.", "Great, thanks.", "That was helpful.", "Cool, thanks!",
            "thank you", "Perfect, thank you."]
THANKS_A = ["You are welcome! Is there anything else you would like to know?",
            "You are welcome! Ask me about another word whenever you like.",
            "Glad I could help! What else would you like to know?"]
BYE_Q = ["Bye!", "Goodbye!", "See you later.", "Good night!", "bye", "I have to go now."]
BYE_A = ["Goodbye! Have a nice day.", "Bye! Come back any time you want to look up a word.",
         "Good night! It was nice talking to you."]


def small_talk(rng, n=6000):
    out = []
    pools = [(GREET_Q, GREET_A, "greeting"), (ID_Q, ID_A, "identity"), (THANKS_Q, THANKS_A, "thanks"),
             (BYE_Q, BYE_A, "bye")]
    for _ in range(n):
        qs, as_, kind = rng.choice(pools)
        out.append({"kind": kind, "messages": [rng.choice(qs), rng.choice(as_)]})
    return out
