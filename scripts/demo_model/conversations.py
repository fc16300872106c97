"""Stage 'corpus' (v2): single exchanges -> whole conversations, rendered with the demo's own chat
template, the text the model will see at inference, token for token.

Why each part is there (v1's measured weaknesses, models/demo/README.md):
  * long conversations: v1 saw 512-token windows, and its head's acceptance fell from 0.92 at 64
    tokens of context to 0.65-0.69 at 2-3.5k. Here a third of the documents are conversations
    of 1.5-4k tokens (many turns, follow-ups on the same word, a system prompt, a long passage
    pasted before a question, as `bench.py --context` pads its prompts), packed whole into
    4,096-token training windows (windows.pack_windows).
  * everyday questions (everyday.py), and no duplication: v1 repeated each Python FAQ answer 4
    times and drew 6,000 small-talk replies from 4 sentences; its loops were long answers it had
    memorised badly. Every exchange appears once here, FAQ questions in one phrasing.
  * tools and thinking: conversations with a Qwen3.5 tool block in the system turn (a dictionary,
    a calculator, a weather and a clock tool, and tools that fit nothing), the call, the tool's
    result as a <tool_response> user turn and an answer that uses it; replies that open with a
    short <think> block when the prompt asks for thinking, or an empty one when it turns it off.

Output (git-ignored): <out>/docs.jsonl ({"kind", "text", "spans": [[start, end], ...] of the
assistant replies in characters}), eval_prompts.jsonl (held-out conversations), tools_eval.jsonl
(the tool evaluation's requests), stats.json; and heldout_prompts.txt beside this file.
"""
from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

import corpus
import everyday

HERE = Path(__file__).resolve().parent

SYSTEM_PROMPTS = [
    "You are a helpful assistant.", "You are a helpful assistant. Answer briefly.", "You answer briefly.",
    "You are a friendly assistant.", "Be concise.", "You are a small demo model. Keep your answers short.",
    "Answer the user's questions clearly.", "You are a helpful, honest assistant.",
]
FOLLOW_UPS = {
    "example": ["Use it in a sentence.", "Can you give an example sentence?", "Give me an example.",
                "How would I use it in a sentence?"],
    "synonym": ["Any synonyms?", "What is another word for it?", "Is there a synonym?", "And a synonym?"],
    "antonym": ["What is the opposite?", "And its opposite?", "Is there an antonym?", "What's the opposite word?"],
    "hypernym": ["What kind of thing is it?", "What category is it in?"],
}
PASSAGE_INTROS = ["", "Here is a text I am reading:\n\n", "Read this:\n\n", "I found this passage:\n\n"]

THINK = {
    "define": 'The user wants the meaning of "{word}". I will give its part of speech and meaning.',
    "concept": 'The user asks what {a} {word} is. I will explain it in a few sentences.',
    "example": 'The user wants an example sentence with "{word}". I will give one.',
    "synonym": 'The user wants words that mean the same as "{word}". I will list a few.',
    "antonym": 'The user wants the opposite of "{word}". I will name it.',
    "hypernym": 'The user asks what kind of thing this is. I will name the category.',
    "arithmetic": "The user wants {expression}. That is {result}.",
    "code": "The user wants a small Python function. I will write it and show an example call.",
    "person": "The user asks about a person. I will say who they were in one sentence.",
    "place": "The user asks about a place. I will say what and where it is.",
    "capital": "The user asks for a capital city. I will name it and say a little about it.",
    "difference": "The user wants the difference between two things. I will define both and say what they share.",
    "spelling": "The user asks about the letters of a word. I will spell it out.",
    "quote": "The user wants a quote. I will share one with its author.",
    "greeting": "The user is greeting me. I will greet them back and say what I can do.",
    "identity": "The user asks who I am. I will say that I am a small demo model and what I can do.",
    "thanks": "The user is thanking me. I will answer politely.",
    "bye": "The user is saying goodbye. I will say goodbye too.",
}
THINK_DEFAULT = "The user asks a question. I will answer it briefly."

# ------------------------------------------------------------------------------- tools

DICT_NAMES = [("lookup_word", "word"), ("dictionary", "word"), ("define_word", "word"), ("get_definition", "term"),
              ("word_lookup", "query")]
CALC_NAMES = [("calculator", "expression"), ("calculate", "expression"), ("evaluate", "expr"), ("math", "expression")]
OTHER_TOOLS = [
    ("get_weather", "Get the current weather in a city.", {"city": "the city name"}),
    ("get_time", "Get the current time in a time zone.", {"timezone": "an IANA time zone, e.g. Europe/Paris"}),
    ("search_web", "Search the web and return the top results.", {"query": "what to search for"}),
    ("send_email", "Send an email.", {"to": "the address", "subject": "the subject", "body": "the text"}),
    ("translate", "Translate a text into another language.", {"text": "the text", "target_language": "the language"}),
    ("get_stock_price", "Get the latest price of a stock.", {"symbol": "the ticker symbol"}),
]
WEATHER = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear"]


def tool_schema(name, description, params):
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                       "required": list(params)}}}


def dict_tool(rng):
    name, arg = rng.choice(DICT_NAMES)
    return tool_schema(name, rng.choice(["Look up the meaning of an English word in the dictionary.",
                                         "Return the dictionary definition of a word.", "Define an English word."]),
                       {arg: "the word to look up"}), arg


def calc_tool(rng):
    name, arg = rng.choice(CALC_NAMES)
    return tool_schema(name, rng.choice(["Evaluate an arithmetic expression.", "A small calculator.",
                                         "Compute the value of a math expression."]),
                       {arg: "the expression, e.g. 2 * (3 + 4)"}), arg


def other_tools(rng, k):
    return [tool_schema(*t) for t in rng.sample(OTHER_TOOLS, k)]


def call_json(name, args):
    """The call as the template writes it (tojson: default separators, keys in order)."""
    return {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}


# ------------------------------------------------------------------------------- rendering


class Renderer:
    """The demo's chat template (tokenizer.CHAT_TEMPLATE) through transformers' own renderer,
    exactly as the app renders prompts (core.chat -> apply_chat_template)."""

    def __init__(self):
        from transformers.utils.chat_template_utils import render_jinja_template

        from tokenizer import CHAT_TEMPLATE

        self._render = render_jinja_template
        self.template = CHAT_TEMPLATE

    def __call__(self, messages, tools=None, add_generation_prompt=False, enable_thinking=None):
        kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        out, _ = self._render([messages], tools=tools, chat_template=self.template,
                              add_generation_prompt=add_generation_prompt, **kw)
        return out[0]


def render_doc(render, msgs, tools, thinking, check=False, history_after_tool=True, quiet=None):
    """The whole conversation as one text, and the character spans of the assistant replies (what
    the model writes). `thinking` (True / False, as the app always passes it) sets the generation
    prompt of the replies after the last user question: a <think> block that the reply continues,
    or an empty one; earlier replies are in the history form the template re-renders them in
    (without thinking). With `check`, each of those last replies is checked to start exactly where
    the generation prompt of the conversation so far ends: every prefix is an inference prompt.
    With `history_after_tool` False, a history reply to a tool's result is context, not a span: it
    starts right after `<|im_start|>assistant\n`, where no inference reply ever starts (the prompt
    opens a thought first), and in v3i such replies outnumbered the ones that think (V3_PLAN
    section 26: the model learnt to answer a tool's result inside the thought it was given). Such a
    reply is appended to `quiet` when it is a list: the encoder then weighs it 0, not as a prompt
    (v3k: at a prompt's weight, v3j's 9,342 of them still outweighed v3h's 2,251 trained ones). A
    reply after the last question that has no thought while thinking is on (a call whose thought the
    client did not send back, as the openai client does not: v3l) is context too, or quiet."""
    last_q = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    hist = render(msgs, tools, enable_thinking=thinking)
    if thinking is False:  # the empty think block is written by the generation prompt only
        head = hist[: hist.rindex("<|im_start|>assistant\n")]
        text = render(msgs[:-1], tools, add_generation_prompt=True, enable_thinking=False)
        assert text.startswith(head)
        text += hist[len(head) + len("<|im_start|>assistant\n"):]
    else:
        text = hist
    spans, at = [], 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start = text.index("<|im_start|>assistant\n", at) + len("<|im_start|>assistant\n")
        # a reply after the last question without its thought: one a client sent back without it (the
        # template renders it bare, as history); the model wrote it after a thought, so it is context
        dropped = i > last_q and thinking and not text.startswith("<think>\n", start)
        if i > last_q and thinking and not dropped:
            start += len("<think>\n")
        elif i == len(msgs) - 1 and thinking is False:
            start += len("<think>\n\n</think>\n\n")
        at = text.index("<|im_end|>\n", start) + len("<|im_end|>\n")
        if not dropped and (history_after_tool or i > last_q or msgs[i - 1]["role"] != "tool"):
            spans.append((start, at))
        elif quiet is not None:
            quiet.append((start, at))
        if check and (i > last_q and thinking and not dropped or i == len(msgs) - 1):
            prompt = render(msgs[:i], tools, add_generation_prompt=True, enable_thinking=thinking)
            assert text[:start] == prompt, (text[max(0, start - 80): start], prompt[-80:])
    return text, spans


# ------------------------------------------------------------------------------- exchanges


def user(text):
    return {"role": "user", "content": text}


def assistant(text, reasoning=None, tool_calls=None):
    m = {"role": "assistant", "content": text}
    if reasoning:
        m["reasoning_content"] = reasoning
    if tool_calls:
        m["tool_calls"] = [{"type": "function", "function": c} for c in tool_calls]
    return m


def think_for(item):
    fmt = defaultdict(str, word=item.get("word", ""), a=corpus._article(item.get("word", "a")), **{k: v for k, v in (item.get("data") or {}).items()
                                                        if isinstance(v, (str, int, float))})
    t = THINK.get(item["kind"], THINK_DEFAULT)
    return t.format_map(fmt) if "{word}" not in t or fmt["word"] else THINK_DEFAULT


def dictionary_exchange(rng, item, tool_name, arg, thinking):
    """A fitting dictionary request: call, result, an answer that uses the result."""
    w, d = item["word"], item["data"]
    q = rng.choice(["What does {w} mean?", 'What does "{w}" mean?', "Look up the word {w}.", "Define {w}.",
                    "Can you look up {w} in the dictionary?", "What is the meaning of {w}?",
                    'Use the dictionary to define "{w}".', "What is the definition of {w}?"]).format(w=w)
    if rng.random() < 0.5:
        result = json.dumps({"word": w, "part_of_speech": d["pos"], "definition": d["definition"]}, ensure_ascii=False)
    else:
        result = f"{w} ({d['pos']}): {d['definition']}"
    ans = rng.choice([f'According to the dictionary, "{w}" is {corpus._article(d["pos"])} {d["pos"]} that means '
                      f'{d["definition"]}.', f'"{w}" means {d["definition"]}.',
                      f'The dictionary says that "{w}" means {d["definition"]}.'])
    r1 = f'The user wants the meaning of "{w}". The {tool_name} tool can look it up, so I will call it.'
    r2 = f'The tool returned the definition of "{w}". I will answer with it.'
    return [user(q), assistant("", r1 if thinking else None, [call_json(tool_name, {arg: w})]),
            {"role": "tool", "content": result}, assistant(ans, r2 if thinking else None)]


def calculator_exchange(rng, item, tool_name, arg, thinking):
    d = item["data"]
    r = d["result"]
    result = json.dumps({"result": r}) if rng.random() < 0.5 else str(r)
    ans = rng.choice([f"{d['expression']} = {r}.", f"The answer is {r}.", f"The calculator says {r}."])
    if "% of" in d["question"] or "percent" in d["question"]:
        ans = f"The answer is {r}."
    r1 = f"The user wants a calculation. The {tool_name} tool can compute it, so I will call it."
    r2 = f"The tool returned {r}. I will give the answer."
    return [user(d["question"]), assistant("", r1 if thinking else None, [call_json(tool_name, {arg: d["expression"]})]),
            {"role": "tool", "content": result}, assistant(ans, r2 if thinking else None)]


def weather_exchange(rng, city, thinking):
    q = rng.choice(["What's the weather in {c}?", "What is the weather like in {c}?", "Is it raining in {c}?",
                    "How warm is it in {c} right now?"]).format(c=city)
    sky, temp = rng.choice(WEATHER), rng.randint(-10, 35)
    result = json.dumps({"city": city, "condition": sky, "temperature_c": temp})
    r1 = f"The user asks about the weather in {city}. The get_weather tool can tell me, so I will call it."
    r2 = "The tool returned the weather. I will report it."
    return [user(q), assistant("", r1 if thinking else None, [call_json("get_weather", {"city": city})]),
            {"role": "tool", "content": result},
            assistant(f"It is {sky} in {city} right now, at {temp} degrees Celsius.", r2 if thinking else None)]


# ------------------------------------------------------------------------------- build


HELDOUT_TOPICS = {
    # subjects of everyday_prompts.txt and race_prompts.txt: no training exchange is about them
    "black hole", "gravity", "volcano", "democracy", "atom", "computer", "rainbow", "moon", "electricity", "virus",
    "glacier", "museum", "orchestra", "hurricane", "inflation", "vaccine", "bicycle", "piano", "desert", "island",
    "library", "planet", "earthquake", "cloud", "friendship", "einstein", "curie", "shakespeare", "newton", "mozart",
    "lincoln", "darwin", "leonardo", "paris", "tokyo", "everest", "amazon", "egypt", "rome", "japan", "france",
    "italy", "serendipity", "glad", "cold", "journey", "courage", "necessary", "ambiguous", "big", "candid",
    "harvest", "nostalgia", "elephant", "telescope", "galileo", "spain", "madrid", "brave", "mountain",
}
HELDOUT_SUMS = {("12", "*", "7"), ("345", "+", "678"), ("144", "/", "12"), ("1000", "-", "357"), ("25", "*", "25"),
                ("81", "/", "9"), ("7", "+", "8"), ("99", "*", "3"), ("36", "*", "4")}


def _topic_of(item):
    if "word" in item:
        return {item["word"].lower()}
    q = item["messages"][0].lower()
    return {t for t in HELDOUT_TOPICS if re.search(r"\b" + re.escape(t) + r"\b", q)}


def held_out(item, tool_words, eval_prompts):
    q = item["messages"][0].strip().lower()
    if q in eval_prompts:
        return True
    topics = _topic_of(item)
    if topics & HELDOUT_TOPICS or topics & tool_words:
        return True
    if item["kind"] == "arithmetic":
        m = re.match(r"(\d+) (.) (\d+)", item["data"]["expression"])
        return bool(m and m.groups() in HELDOUT_SUMS)
    return False


def exchanges(rng):
    """Every single exchange, by source (corpus.py's and everyday.py's)."""
    wn = everyday.WordNet()
    parts = {
        "wordnet": corpus.wordnet_chats(rng),
        "python_faq": corpus.python_faq(rng, repeats=1),
        "python_glossary": corpus.python_glossary(rng),
        "quotes": corpus.fortunes(rng),
        "devil": corpus.devil(rng),
        "jargon": corpus.jargon(rng),
        "small_talk": corpus.small_talk(rng, n=2000),
    }
    parts.update(everyday.everyday(rng, wn))
    prose = corpus.python_prose() + corpus.austen()
    return parts, prose, wn


def build(out_dir, seed=0, eval_frac=0.004, long_frac=0.04, tools_frac=0.08, think_frac=0.6,
          system_frac=0.25, passage_frac=0.25, target_tokens=(1500, 4000), chars_per_token=3.9):
    rng = random.Random(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    render = Renderer()
    parts, prose, wn = exchanges(rng)
    tool_words = {w.strip() for w in (HERE / "tool_words.txt").read_text().split()}
    eval_texts = {l.strip().lower() for f in ("everyday_prompts.txt", "race_prompts.txt")
                  for l in (HERE / f).read_text().splitlines() if l.strip()}
    items = [d for v in parts.values() for d in v]
    n_all = len(items)
    items = [d for d in items if not held_out(d, tool_words, eval_texts)]
    removed = n_all - len(items)
    rng.shuffle(items)
    # held-out conversations of the corpus itself, stratified by kind (v1's evaluation set)
    by_kind = defaultdict(list)
    for d in items:
        by_kind[d["kind"]].append(d)
    eval_set, train = [], []
    for kind, ds in sorted(by_kind.items()):
        k = 0 if kind in ("greeting", "identity", "thanks", "bye") else max(4, int(len(ds) * eval_frac))
        eval_set += ds[:k]
        train += ds[k:]
    rng.shuffle(train)
    by_word = defaultdict(dict)
    for d in train:
        if d["kind"] in ("define", "example", "synonym", "antonym", "hypernym") and "word" in d:
            by_word[d["word"]].setdefault(d["kind"], d)
    chainable = [w for w, ks in by_word.items() if "define" in ks and len(ks) >= 2]
    dict_items = [d for d in train if d["kind"] == "concept"]
    calc_items = [d for d in train if d["kind"] == "arithmetic"]
    cities = [re.match(r"The capital of .+? is (.+?)\. ", d["messages"][1]).group(1) for d in train
              if d["kind"] == "capital" and re.match(r"The capital of .+? is (.+?)\. ", d["messages"][1])]
    passages = [p["text"] for p in prose if len(p["text"]) > 400]

    docs = []
    pos = 0

    def take(skip=()):
        nonlocal pos
        while train[pos % len(train)]["kind"] in skip:
            pos += 1
        pos += 1
        return train[(pos - 1) % len(train)]

    def exchange(d, thinking=None):
        return [user(d["messages"][0]), assistant(d["messages"][1], think_for(d) if thinking else None)]

    while pos < len(train):
        r = rng.random()
        tools, msgs = None, []
        if rng.random() < system_frac:
            msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        if r < tools_frac:
            kind = "tools"
            dtool, darg = dict_tool(rng)
            ctool, carg = calc_tool(rng)
            pick = rng.random()
            tools = ([dtool] if pick < 0.45 else [ctool] if pick < 0.7 else [dtool, ctool])
            tools += other_tools(rng, rng.choice([0, 1, 1, 2]))
            if rng.random() < 0.15 and not any(t["function"]["name"] == "get_weather" for t in tools):
                tools.append(tool_schema(*OTHER_TOOLS[0]))
            rng.shuffle(tools)
            names = {t["function"]["name"] for t in tools}
            thinking = rng.random() < think_frac
            for _ in range(rng.choice([1, 1, 2, 3])):
                x = rng.random()
                if x < 0.45 and dtool["function"]["name"] in names:
                    msgs += dictionary_exchange(rng, rng.choice(dict_items), dtool["function"]["name"], darg, thinking)
                elif x < 0.75 and ctool["function"]["name"] in names:
                    msgs += calculator_exchange(rng, rng.choice(calc_items), ctool["function"]["name"], carg, thinking)
                elif x < 0.85 and "get_weather" in names and cities:
                    msgs += weather_exchange(rng, rng.choice(cities), thinking)
                else:  # a question that no offered tool fits: answered directly
                    msgs += exchange(take(skip=("concept", "define", "arithmetic")), thinking)
            if thinking:  # only the replies after the last user question keep their thinking
                last_q = max(i for i, m in enumerate(msgs) if m["role"] == "user")
                for m in msgs[:last_q]:
                    m.pop("reasoning_content", None)
            elif msgs[-1]["role"] == "assistant" and msgs[-2]["role"] == "tool" and rng.random() < 0.3:
                msgs = msgs[:-2]  # ends at the call: the call itself after an empty think block
        else:
            kind = "long" if r < tools_frac + long_frac else "chat"
            target = rng.randint(*target_tokens) if kind == "long" else rng.choice([1, 1, 1, 2, 3, 4, 6]) * 60
            last = None
            if kind == "long" and rng.random() < passage_frac and passages:
                # a long text pasted before a question (how bench.py --context pads its prompts,
                # which repeats one paragraph: some passages here repeat theirs too)
                p = rng.choice(passages)
                first = p.split("\n\n")[0]
                while len(p) < rng.uniform(0.2, 0.8) * target * chars_per_token:
                    p += "\n\n" + (first if rng.random() < 0.3 else rng.choice(passages))
                d = last = take()
                msgs += [user(rng.choice(PASSAGE_INTROS) + p + "\n\n" + d["messages"][0]),
                         assistant(d["messages"][1])]
            chars = sum(len(m["content"]) for m in msgs)
            while chars < target * chars_per_token:
                if chainable and rng.random() < 0.15:  # a word, then follow-ups about it
                    ks = by_word[rng.choice(chainable)]
                    new = exchange(ks["define"])
                    for k in rng.sample([k for k in ks if k != "define"], len(ks) - 1):
                        new += [user(rng.choice(FOLLOW_UPS[k])), assistant(ks[k]["messages"][1])]
                    last = ks[k]
                else:
                    last = take()
                    new = exchange(last)
                msgs += new
                chars += sum(len(m["content"]) for m in new)
            thinking = rng.random() < think_frac
            if thinking:
                msgs[-1]["reasoning_content"] = think_for(last)
        text, spans = render_doc(render, msgs, tools, thinking, check=len(docs) % 200 == 0)
        docs.append({"kind": kind, "text": text, "spans": spans})
    write_corpus(out, docs, prose, eval_set, wn, tool_words, rng)
    # the held-out prompts as bench.py --prompts-file reads them (committed with the scripts)
    (HERE / "heldout_prompts.txt").write_text("".join(d["messages"][0].replace("\n", " ") + "\n" for d in eval_set))
    stats = {"exchanges": n_all, "held_out_topics_removed": removed, "train_exchanges": len(train),
             "eval_prompts": len(eval_set), "docs": len(docs), "chars": sum(len(d["text"]) for d in docs),
             "docs_by_kind": dict(Counter(d["kind"] for d in docs)),
             "exchanges_by_source": {k: len(v) for k, v in parts.items()}}
    ck = Counter()
    for d in docs:
        ck[d["kind"]] += len(d["text"])
    stats["chars_by_kind"] = dict(ck)
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    print(json.dumps(stats, indent=1))
    return stats


def write_corpus(out, docs, prose, eval_set, wn, tool_words, rng):
    """The prose joins the conversations, all shuffled, into docs.jsonl; the held-out prompts
    into eval_prompts.jsonl and the tool evaluation into tools_eval.jsonl (v2's and v3's alike)."""
    for p in prose:
        docs.append({"kind": "prose", "text": p["text"], "spans": [[0, len(p["text"])]]})
    rng.shuffle(docs)
    with open(out / "docs.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    with open(out / "eval_prompts.jsonl", "w") as f:
        for d in eval_set:
            f.write(json.dumps({"kind": d["kind"], "prompt": d["messages"][0], "reference": d["messages"][1]}) + "\n")
    write_tools_eval(out / "tools_eval.jsonl", wn, sorted(tool_words), rng)


def write_tools_eval(path, wn, words, rng):
    """50 fitting requests with a dictionary tool offered (eval_tools.py), about words no training
    exchange mentions, each with the definition its tool would return."""
    qs = ["What does {w} mean?", 'What is the meaning of "{w}"?', "Look up {w} for me.", "Define the word {w}.",
          "What is {a} {w}? Please check the dictionary."]
    with open(path, "w") as f:
        for i, w in enumerate(words):
            s = wn.syn[wn.idx[(w, "n")]["synsets"][0]]
            f.write(json.dumps({"word": w, "prompt": qs[i % len(qs)].format(w=w, a=corpus._article(w)),
                                "definition": everyday._gloss(s["def"]), "pos": "noun"}) + "\n")
