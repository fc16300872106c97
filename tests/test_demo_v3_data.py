"""Demo v3's data generators (scripts/demo_model/everyday_v3.py) on small hand-made inputs: the
JSON replies are what the API's grammar would let through and close; tool calls name an offered
tool, as the server's own parser reads them from the rendered template; answers use the result;
held-out subjects never appear. Fast: no WordNet, no model."""
from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "demo_model"))
sys.path.insert(0, str(REPO))

import everyday_v3 as V3  # noqa: E402
import heldout_everyday as H  # noqa: E402

SHORT = {
    "v3_definition": [{"kind": "v3_definition", "word": w, "messages": [f"What does {w} mean?", f"A {w} is {g}."]}
                      for w, g in [("lantern", "a light with a transparent case"), ("harbor", "a sheltered port"),
                                   ("violin", "a bowed stringed instrument"), ("madrid", "a city")]],
    "v3_capital": [{"kind": "v3_capital", "subject": c, "messages": [f"What is the capital of {c}?",
                                                                     f"The capital of {c} is {x}."]}
                   for c, x in [("Peru", "Lima"), ("Kenya", "Nairobi"), ("Spain", "Madrid")]],
    "v3_opposite": [{"kind": "v3_opposite", "word": w, "messages": [f"What is the opposite of {w}?",
                                                                    f'The opposite of "{w}" is "{a}".']}
                    for w, a in [("early", "late"), ("light", "dark")]],
    "v3_kind": [{"kind": "v3_kind", "word": w, "messages": [f"What kind of thing is a {w}?", f"A {w} is a kind of {h}."]}
                for w, h in [("violin", "bowed stringed instrument"), ("early", "time"), ("harbor", "port")]],
}
ARITH = [{"kind": "arithmetic", "messages": ["What is 2 + 3?", "2 + 3 = 5."],
          "data": {"question": "What is 2 + 3?", "expression": "2 + 3", "result": 5}}]
EXCLUDE = H.Exclusion([{"category": "capital", "subjects": ["Spain", "Madrid"], "question": "What is the capital of Spain?"},
                       {"category": "definition", "subjects": ["harbor"], "question": "Define harbor."}])


def _valid(schema, obj):
    assert list(obj) == list(schema["properties"]), (obj, schema)  # keys in the schema's order
    for k, v in obj.items():
        t = schema["properties"][k]["type"]
        if t == "integer":
            assert isinstance(v, int) and 1 <= len(str(abs(v))) <= 4, v
        else:
            assert isinstance(v, str) and 0 < len(v) <= 40, v


def test_json_replies_close_in_the_grammar_style_and_fit_their_schema():
    items = V3.json_answers(random.Random(0), SHORT, EXCLUDE, n=400)
    assert len(items) > 200  # the held-out Spain and harbor draws are dropped
    for d in items:
        reply = d["messages"][1]
        obj = json.loads(reply)
        _valid(d["schema"], obj)
        # core.constraints.JSON_STYLE: ", " and ": ", no other whitespace: the grammar's own text
        assert reply == json.dumps(obj, separators=(", ", ": "), ensure_ascii=False)
        assert "\n" not in reply and len(reply) < 120
    assert not any("Spain" in d["messages"][0] or "Madrid" in d["messages"][1] for d in items)
    assert {tuple(d["schema"]["properties"]) for d in items} >= {("word", "letters"), ("country", "capital")}


def test_json_replies_pass_the_engines_grammar():
    """The reply, tokenised by the demo's tokenizer, goes through the engine's own constraint for
    its schema (core.constraints, as webapp builds it for response_format) and ends it; the same
    object written with other whitespace does not."""
    pytest.importorskip("llguidance")
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from core.constraints import Constraint, GrammarError

    tok = load_tokenizer(REPO / "models" / "demo")
    for d in V3.json_answers(random.Random(1), SHORT, EXCLUDE, n=60)[:20]:
        c = Constraint.for_json(tok, d["schema"], 8192)
        c.advance(tok.encode(d["messages"][1], add_special_tokens=False))
        assert c.complete, d["messages"][1]
        bad = Constraint.for_json(tok, d["schema"], 8192)
        with pytest.raises(GrammarError):
            bad.advance(tok.encode(d["messages"][1].replace(": ", ":\n  "), add_special_tokens=False))


def _assert_rendered_calls_offered(render, msgs, tools, thinking, offered):
    """Every tool call a rendered reply holds parses and names an offered tool."""
    from conversations import render_doc
    from webapp.api.toolcalls import split_tool_calls

    text, spans = render_doc(render, [dict(m) for m in msgs], tools, thinking)
    for a, b in spans:
        reply = text[a:b].split("</think>")[-1].replace("<|im_end|>", "")
        if "<tool_call>" in reply:
            _, parsed = split_tool_calls(reply)
            assert parsed and all(p.name in offered for p in parsed)


def test_tool_calls_name_an_offered_tool_and_answers_use_the_result():
    from conversations import Renderer

    render = Renderer()
    convs = V3.tool_conversations(random.Random(0), SHORT, ARITH, EXCLUDE, n=120)
    assert len(convs) > 80  # the conversations of only held-out questions are dropped
    names_seen, calls = set(), 0
    for msgs, tools, thinking in convs:
        offered = {t["function"]["name"]: t for t in tools}
        assert 2 <= len(offered) <= 7
        for i, m in enumerate(msgs):
            for c in m.get("tool_calls") or []:
                calls += 1
                fn = c["function"]
                assert fn["name"] in offered
                params = offered[fn["name"]]["function"]["parameters"]["properties"]
                assert set(json.loads(fn["arguments"])) <= set(params)
                names_seen.add(fn["name"])
                result, answer = msgs[i + 1]["content"], msgs[i + 2]["content"]
                vals = [str(v) for v in json.loads(result).values()]
                assert any(v in answer for v in vals[-1:]), (result, answer)  # the answer repeats the result
        _assert_rendered_calls_offered(render, msgs, tools, thinking, offered)
    assert calls > 60 and len(names_seen) > 30  # many names: the model must copy, not recall


def test_held_out_questions_never_appear_in_topics_or_tools():
    topics = V3.topic_conversations(random.Random(0), SHORT, EXCLUDE, n=200)
    assert topics
    for t in topics:
        qs = t["messages"][0::2]
        assert not (t["word"] == "harbor" and any(re.search(r"mean|define", x, re.I) for x in qs)), qs
    for msgs, tools, _ in V3.tool_conversations(random.Random(2), SHORT, ARITH, EXCLUDE, n=200):
        for m in msgs:
            if m["role"] == "user":
                assert not re.search(r"capital of Spain", m["content"]) and not re.search(r"(mean|define).*harbor", m["content"], re.I)


def test_thoughts_are_short_and_name_the_subject():
    for d in SHORT["v3_opposite"] + SHORT["v3_capital"]:
        t = V3.thought(d)
        assert len(t.split()) <= 10 and (d.get("word") or d.get("subject")) in t


def test_the_tool_evaluation_offers_names_training_never_uses():
    """eval_v3.py's dictionary names must be copied from the offered tools: none of them is a name
    the v3 generator can make (every verb x noun form of everyday_v3._name, the calculator names)."""
    import eval_v3

    made = set(V3.CALC_NAMES)
    for verbs, nouns in ((V3.DICT_VERBS, V3.DICT_NOUNS), (V3.CAP_VERBS, V3.CAP_NOUNS)):
        for v in verbs:
            for n in nouns:
                made |= {f"{v}_{n}", f"{n}_{v}", n, f"{v}{n.capitalize()}"}
    made |= {t[0] for t in V3.OTHER}
    assert not set(eval_v3.EVAL_NAMES) & made
    # and the generator does produce many of its own (seeded draws cover most forms)
    rng = random.Random(0)
    drawn = [V3.make_tool(rng, "dict")[0]["function"]["name"] for _ in range(2000)]
    pooled = [n for n in drawn if n in made]
    assert len(set(pooled)) > 100 and 0.3 < len(pooled) / len(drawn) < 0.5
    # the rest are made-up names, nearly all different (copying is the only way to name them),
    # and none of them is an evaluation name either
    copied = [n for n in drawn if n not in made]
    assert len(set(copied)) > 0.9 * len(copied) and not set(eval_v3.EVAL_NAMES) & set(copied)
    assert all(V3.copy_name(random.Random(s)) not in eval_v3.EVAL_NAMES for s in range(20000))


def test_training_ids_are_the_ids_the_app_makes(tmp_path):
    """The corpus is encoded with the raw `tokenizers` file (tokenizer.encode_corpus); the app
    tokenizes through transformers, which gives a qwen3_5 checkpoint Qwen's pre-tokenizer whatever
    the file says. After as_the_app_tokenizes the file and the app agree id for id, on the
    whitespace runs where the demo's original file (a ByteLevel regex) did not."""
    import shutil

    import tokenizer as T
    import transformers
    from tokenizers import Tokenizer, pre_tokenizers

    tok_dir = tmp_path / "tok"
    shutil.copytree(REPO / "models" / "demo", tok_dir, ignore=shutil.ignore_patterns("*.safetensors", "optiq"))
    texts = ["<|im_start|>assistant\n<think>\n\n</think>\n\nA rest is a pause.<|im_end|>",
             "Hello\n\nWorld  two   spaces\t tab\r\n\r\nend \n", 'x = {"word": "café", "n": 12345}\n\n  indented',
             "naïve résumé — it's 3.14 ok?!\n\n\n", "</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>"]
    before = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    # the file as train_tokenizer writes it (the bundled demo's may have been rewritten already)
    before.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    before.save(str(tok_dir / "tokenizer.json"))
    app = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    assert any(before.encode(t, add_special_tokens=False).ids != app.encode(t, add_special_tokens=False)
               for t in texts)   # the mismatch v2 and v3 were trained with
    T.as_the_app_tokenizes(tok_dir)
    after = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    for t in texts:
        assert after.encode(t, add_special_tokens=False).ids == app.encode(t, add_special_tokens=False), t
    assert after.get_vocab() == before.get_vocab()
    assert transformers.AutoTokenizer.from_pretrained(str(tok_dir)).encode(texts[0]) == app.encode(texts[0])


def test_fact_notes_state_every_fact_in_its_own_words_and_ask_nothing():
    """(f) The notes state each fact (a held-out subject's too: the judge's questions are never
    asked or answered, the facts are read as statements), several ways for a common subject, never
    as a question; skipped subjects (the tool evaluation's words) appear in none; the same seed
    gives the same notes."""
    capitals = [("Spain", "Madrid", "the capital of Spain"), ("Peru", "Lima", "the capital of Peru"),
                ("France", "Paris", "the capital of France")]
    opposites = [("early", "late", 40), ("light", "dark", 1)]
    nouns = [("harbor", "a", "port", "a sheltered port", "sheltered port", None, 25),
             ("lantern", "a", "lamp", "a light with a transparent case", "light", None, 1),
             ("box", "a", "container", None, "", None, 5)]
    skip = lambda w: w in {"paris", "lantern"}  # noqa: E731

    def made(seed):
        rng = random.Random(seed)
        return V3.notes(rng, V3.fact_lines(rng, capitals, opposites, nouns, skip), per_note=(2, 3))

    notes = made(1)
    text = " ".join(n["text"] for n in notes)
    assert "?" not in text and made(1) == notes and made(2) != notes
    assert {n["kind"] for n in notes} == {"note_capital", "note_opposite", "note_kind", "note_definition"}
    assert not re.search(r"\b(paris|lantern)\b", text.lower())
    lines = [s for n in notes for s in re.split(r"(?<=\.) ", n["text"].split("\n")[-1])]
    assert sum("Madrid" in s for s in lines) == 3 and sum("Lima" in s for s in lines) == 3
    assert sum("harbor" in s.lower() and "port" in s for s in lines) == 6   # common: 3 kinds, 3 definitions
    assert sum("light" in s for s in lines) == 1 and sum("early" in s.lower() for s in lines) == 3
    assert sum("container" in s for s in lines) == 2 and not any("box" in s.lower() and "means" in s for s in lines)
    # the facts the held-out questions ask about are stated (Madrid's three times, above), the questions are not
    assert all(q not in text for q in ("What is the capital of Spain?", "Define harbor."))


# ------------------------------------------------------------------------------ v3d: the focused notes

FOCUS = {
    "capital": [{"subject": "Peru", "c": "Peru", "n": "Lima"}, {"subject": "Spain", "c": "Spain", "n": "Madrid"}],
    "opposite": [{"subject": "early", "w": "early", "a": "late", "W": "Early"}],
    "kind": [{"subject": "violin", "w": "violin", "W": "Violin", "A": "A", "Pl": "Violins", "h": "bowed stringed instrument",
              "ha": "a"}],
    "definition": [{"subject": "harbor", "w": "harbor", "W": "Harbor", "A": "A", "Pl": "Harbors", "np": "a sheltered port"}],
    "python": [{"subject": "append", "k": "list method", "s": "`list.append(x)`", "S": "`list.append(x)`",
                "f": "Add an item to the end of the list.", "t": "add an item to the end of the list"},
               {"subject": "iter", "k": "function", "s": "`iter(object)`", "S": "`iter(object)`",
                "f": "Return an iterator object.", "t": None}],
}


def test_focus_notes_state_every_fact_in_five_phrasings_or_more_and_ask_nothing():
    """v3d: each fact in >= 5 different phrasings, stated `repeats` times (every phrasing before any
    repeats), in notes that hold no question; the same seed gives the same notes."""
    for kind, fs in FOCUS.items():
        for f in fs:
            ph = V3.fact_phrasings(kind, f)
            assert len(set(ph)) == len(ph) >= 5, (kind, ph)
            assert all("?" not in p for p in ph)
    made = lambda seed: V3.focus_notes(random.Random(seed), FOCUS, repeats=12, per_note=(3, 6))  # noqa: E731
    notes = made(1)
    assert made(1) == notes and made(2) != notes
    text = " ".join(n["text"] for n in notes)
    assert "?" not in text
    assert {n["kind"] for n in notes} == {f"note_{k}" for k in FOCUS}
    for kind, fs in FOCUS.items():
        for f in fs:
            ph = V3.fact_phrasings(kind, f)
            used = [p for p in ph if p in text]
            assert len(used) >= 5, (kind, f["subject"], used)
            # 12 statements of the fact: each phrasing at least once when there are at most 12 of them
            assert sum(text.count(p) for p in ph) >= 12 if len(ph) <= 12 else True
    assert text.count("Lima") == 12 and text.count("Madrid") == 12
    assert all(q not in text for q in ("What is the capital of Spain?", "How do I add an item to the end of the list in Python?"))


def test_focus_coverage_counts_the_judges_subjects_it_states():
    items = [{"category": "capital", "subject": "Spain", "question": "What is the capital of Spain?"},
             {"category": "capital", "subject": "Ghana", "question": "What's the capital of Ghana?"},
             {"category": "opposite", "subject": "early", "question": "What is the opposite of early?"},
             {"category": "python", "subject": "append", "question": "How do I add an item to the end of the list in Python?"},
             {"category": "python", "subject": "iter", "question": "In Python, how can I get an iterator?"}]
    cov = V3.focus_coverage(FOCUS, items)
    assert cov["capital"] == [1, 2] and cov["opposite"] == [1, 1] and cov["python"] == [1, 2]
    assert cov["all"] == [3, 5] and cov["missing"] == ["capital:Ghana", "python:iter"]


# ------------------------------------------------------------------------------ v3e: binding drills, tools back

HELD = {"spain", "madrid", "harbor", "append", "late"}


def test_binding_drills_ask_each_fact_many_ways_restate_the_subject_and_skip_held_out_subjects():
    """v3e: every focused fact of a subject outside the held-out set is asked DRILL_ASKS times in
    different phrasings, each answer starting with the asked subject; no drill names a held-out
    subject (of any category: "late" is an antonym subject, so "early"'s opposite is not asked)."""
    facts = {**FOCUS, "capital": FOCUS["capital"] + [{"subject": "Kenya", "c": "Kenya", "n": "Nairobi"}],
             "definition": FOCUS["definition"] + [{"subject": "violin", "w": "violin", "W": "Violin", "A": "A",
                                                  "Pl": "Violins", "np": "a bowed stringed instrument"}]}
    made = lambda s: V3.binding_drills(random.Random(s), facts, HELD, EXCLUDE)  # noqa: E731
    drills = made(0)
    assert made(0) == drills and made(1) != drills
    held_re = re.compile(r"\b(" + "|".join(HELD) + r")\b", re.I)
    by = {}
    for d in drills:
        q, a = d["messages"]
        assert not held_re.search(q), q
        s = d.get("word") or d.get("subject")
        by.setdefault((d["kind"], s), []).append(d)
        if d["kind"] == "v3_python":
            assert a.startswith(("To get", "To ", "`iter", "The function `iter")) and "iter" in a, a
        elif d["kind"] == "v3_capital":
            assert a.startswith((f"The capital of {s}", f"{s}'s capital", "Lima is", "Nairobi is")) and s in a, a
        elif d["kind"] == "v3_opposite":
            assert False, "early's antonym is held out"
        else:
            assert re.match(rf'(A|An|The word) "?{s}"? ', a), a
    assert set(by) == {("v3_capital", "Peru"), ("v3_capital", "Kenya"), ("v3_kind", "violin"),
                       ("v3_definition", "violin"), ("v3_python", "iter")}
    for (kind, s), ds in by.items():
        n = V3.DRILL_ASKS[kind.removeprefix("v3_")]
        qs = [d["messages"][0] for d in ds]
        assert len(ds) == n and len(set(qs)) >= min(n, 4), (kind, s, qs)
    # the judge's own families are among the phrasings
    allq = " ".join(d["messages"][0] for d in drills)
    assert "What's the capital of Peru?" in allq or "What is the capital of Peru?" in allq
    assert "Define violin." in allq and "A violin is a type of what?" in allq


def test_copy_drills_copy_the_word_exactly():
    words = ["cycloserine", "pterodactyl", "harbor", "quadrangle"]
    items = V3.copy_drills(random.Random(0), words, 4, lambda d: d["word"] in HELD)
    assert len(items) == 3 and {d["word"] for d in items} == {"cycloserine", "pterodactyl", "quadrangle"}
    for d in items:
        assert d["word"] in d["messages"][0] and re.search(rf'(^|")\b{d["word"]}\b', d["messages"][1])


def test_v3e_tool_calls_name_the_offered_tool_copy_the_word_and_answers_use_the_result():
    """v3e's tool conversations: every call names an offered tool (never a pool name nor an evaluation
    name), the dictionary's argument is the asked word exactly, the answer repeats the result; most
    conversations open with the dictionary among get_weather and one or two others, as eval_v3 offers it."""
    import conversations as C
    import eval_v3
    from conversations import Renderer

    dict_words = [("lantern", "a light with a transparent case"), ("cycloserine", "an antibiotic drug"),
                  ("violin", "a bowed stringed instrument"), ("harbor", "a sheltered port")]
    banned = set(eval_v3.EVAL_NAMES) | {"get_word", "dictionary"}
    convs = V3.tool_conversations_v3e(random.Random(0), dict_words, [("Peru", "Lima"), ("Spain", "Madrid")], ARITH,
                                      SHORT["v3_opposite"], EXCLUDE, 300, banned=banned,
                                      name_words=["meaning", "word", "lamp", "river"])
    assert len(convs) > 200   # the held-out harbor and Spain requests are dropped
    render = Renderer()
    calls = dict_first = 0
    for msgs, tools, thinking in convs:
        offered = {t["function"]["name"]: t for t in tools}
        assert not set(offered) & banned
        first = next((m for m in msgs if m["role"] == "assistant"), {})
        if first.get("tool_calls") and "get_weather" in offered and \
                offered[first["tool_calls"][0]["function"]["name"]]["function"]["description"] in V3.DICT_DESC:
            dict_first += 1
        for i, m in enumerate(msgs):
            if m["role"] == "user":
                assert "harbor" not in m["content"] and "capital of Spain" not in m["content"]
            for c in m.get("tool_calls") or []:
                calls += 1
                fn = c["function"]
                assert fn["name"] in offered
                params = offered[fn["name"]]["function"]["parameters"]["properties"]
                args = json.loads(fn["arguments"])
                assert set(args) <= set(params)
                q = msgs[i - 1]["content"]
                result, answer = json.loads(msgs[i + 1]["content"]), msgs[i + 2]["content"]
                if "word" in result:
                    assert list(args.values()) == [result["word"]] and result["word"] in q
                    assert result["definition"] in answer
                else:
                    assert str(list(result.values())[-1]) in answer
        _assert_rendered_calls_offered(render, msgs, tools, thinking, offered)
    assert calls > 200 and dict_first > 100
    assert sum(C.OTHER_TOOLS[0][0] in {t["function"]["name"] for t in tools} for _, tools, _ in convs) > 150


# ------------------------------------------------------------------------------ a prepared corpus's checks
# prepare_v3.py runs scripts/demo_model/check_v3.py on what it prepared and stops on a problem; here the
# checks themselves, on corpora written by hand, each with one flaw they must name.

def _chat(*turns):
    return "".join(f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in zip(("user", "assistant") * 4, turns))


def _write_corpus(work, variant, docs, notes_share=0.27):
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    (work / "data").mkdir(exist_ok=True)
    with open(work / "corpus" / "docs.jsonl", "w") as f:
        for kind, text in docs:
            f.write(json.dumps({"kind": kind, "text": text}) + "\n")
    stats = {"variant": variant, "focus": {"phrasings_min": 5, "facts_total": 3, "facts": {}},
             "docs_by_kind": {"tools": sum(k == "tools" for k, _ in docs)},
             "v3e": {"drill_exchanges": sum(k == "drill" for k, _ in docs), "asks_per_subject_min_median_max": [2, 2, 2]}}
    (work / "corpus" / "stats.json").write_text(json.dumps(stats))
    (work / "data" / "tokens_by_kind.json").write_text(json.dumps({"total": 1000, "notes_share": notes_share}))
    return work


GOOD = [("note_capital", "Lima is the capital of Peru. Peru's capital city is Lima."),
        ("prose", "A violin is a bowed stringed instrument."),
        ("drill", _chat("What's the capital of Peru?", "The capital of Peru is Lima.")),
        ("drill", _chat("Define violin.", "A violin is a bowed stringed instrument.")),
        ("drill", _chat("In Python, how can I get an iterator?", "To get an iterator, call `iter(x)`.")),
        ("tools", _chat("What does lantern mean?", '<tool_call>{"name": "lookup"}</tool_call>',
                        '<tool_response>{"word": "lantern"}</tool_response>', "A lantern is a light."))]
SMALL = {"notes_share": (0.25, 0.30), "tokens_max": 2000, "tools_min": 1, "drills_min": 3, "asks_min": 2,
         "asks_median": (2, 3)}


@pytest.mark.parametrize("flaw, docs, share, named", [
    ("none", GOOD, 0.27, None),
    ("a drill asks about a held-out subject", GOOD + [("drill", _chat("What is the capital of Ghana?", "The capital of Ghana is Accra."))],
     0.27, "held-out"),
    ("a tool request names one", GOOD + [("tools", _chat("What does home mean?", "A home is a place."))], 0.27,
     "names a held-out subject"),
    ("a note asks", GOOD + [("note_kind", "Is a violin an instrument? It is.")], 0.27, "note asks"),
    ("an answer about something else", GOOD + [("drill", _chat("Define violin.", "Lima is a city in Peru."))], 0.27,
     "shares no word"),
    ("the subject comes late", GOOD + [("drill", _chat("Define violin.", "It is a bowed violin."))], 0.27,
     "does not name its subject"),
    ("too many notes", GOOD, 0.45, "notes are 45.0%"),
])
def test_the_v3e_check_passes_a_fit_corpus_and_names_each_flaw(tmp_path, flaw, docs, share, named):
    import check_v3

    problems = check_v3.check_v3e(_write_corpus(tmp_path, "v3e", docs, share), SMALL)
    if named is None:
        assert problems == []
        # the real bounds: a corpus of six documents is far too small to train on
        real = check_v3.check_v3e(tmp_path)
        assert any("drill exchanges" in p for p in real) and any("tool conversations" in p for p in real)
    else:
        assert any(named in p for p in problems), (flaw, problems)


def _listing(name, names):
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    return _chat("What does lantern mean?", f"<think>\nLantern: the tools offered are {listed}. The {name} tool fits. "
                 f'I will call it.\n</think>\n\n<tool_call>\n{{"name": "{name}", "arguments": {{"word": "lantern"}}}}\n</tool_call>',
                 '<tool_response>{"word": "lantern"}</tool_response>', "A lantern is a light.")


@pytest.mark.parametrize("flaw, extra, named", [
    ("none", [_listing("lookup", ["get_weather", "lookup"])], None),
    ("a listed name the call does not use", [_listing("lookup", ["get_weather", "lookup"]).replace('{"name": "lookup"', '{"name": "zadu"')],
     "the call names 'zadu'"),
    ("a name the list leaves out", [_listing("lookup", ["get_weather", "send_email"])], "and names 'lookup'"),
    ("too few thoughts list the tools", [], "hold a thought listing the offered tools"),
])
def test_the_v3f_check_wants_the_thoughts_to_list_the_offered_tools(tmp_path, flaw, extra, named):
    import check_v3

    # GOOD's tool document calls without a thought: one listing thought of two first calls is 50 %
    problems = check_v3.check_v3f(_write_corpus(tmp_path, "v3f", GOOD + [("tools", e) for e in extra], 0.27),
                                  dict(SMALL, listed_min=0.5))
    if named is None:
        assert problems == []
    else:
        assert any(named in p for p in problems), (flaw, problems)


def test_v3f_thoughts_list_the_offered_tools_in_the_system_turns_order():
    """v3f's tool conversations (list_tools): a thinking call's thought lists every offered tool's name
    in the order the system turn lists them, then names the one it calls; without list_tools, v3e's."""
    dict_words = [("lantern", "a light with a transparent case"), ("violin", "a bowed stringed instrument")]
    for listing in (True, False):
        convs = V3.tool_conversations_v3e(random.Random(1), dict_words, [("Peru", "Lima")], ARITH,
                                          SHORT["v3_opposite"], EXCLUDE, 80, name_words=["lamp", "river"],
                                          think_frac=1.0, list_tools=listing)
        thoughts = 0
        for msgs, tools, thinking in convs:
            names = [t["function"]["name"] for t in tools]
            for m in msgs:
                if m.get("tool_calls") and m.get("reasoning_content"):
                    thoughts += 1
                    called = m["tool_calls"][0]["function"]["name"]
                    text = m["reasoning_content"]
                    if listing:
                        listed = text.split("the tools offered are ")[1].split(". The ")[0]
                        assert re.split(r", | and ", listed) == names and f"The {called} tool fits." in text
                    else:
                        assert "offered" not in text and f"the {called} tool fits" in text
        assert thoughts > 40


def test_the_v3d_check_finds_a_held_out_question_and_a_corpus_of_the_wrong_variant(tmp_path):
    import check_v3

    lim = {"facts_total": (1, 5), "notes_share": (0.30, 0.40), "tokens_max": 2000}
    good = _write_corpus(tmp_path / "good", "v3d", GOOD, 0.35)
    assert check_v3.check_v3d(good, lim, sample=0) == []
    assert any("focused facts, outside" in p for p in check_v3.check_v3d(good, sample=0))
    asked = H.load()[0]["question"]
    leak = _write_corpus(tmp_path / "leak", "v3e", GOOD + [("chat", _chat(asked, "It is."))], 0.35)
    problems = check_v3.check_v3d(leak, lim, sample=0)
    assert any("held-out question asked" in p and asked.lower() in p for p in problems), problems
    assert any("variant 'v3e'" in p for p in problems), problems


def test_a_missing_source_is_named_with_what_installs_it(monkeypatch, tmp_path):
    """A corpus built without one of its sources is another corpus, so prepare_v3.py stops first and
    says what to install (2026-12-04: a new machine lacked dict-jargon and rdata)."""
    import corpus

    present = tmp_path / "here"
    present.write_text("x")
    monkeypatch.setattr(corpus, "SOURCES", {"wordnet-base": str(present), "dict-jargon": str(tmp_path / "gone")})
    assert corpus.missing_sources().startswith("apt-get install -y dict-jargon")
    monkeypatch.setattr(corpus, "SOURCES", {"wordnet-base": str(present)})
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rdata" else real(name, *a))
    assert corpus.missing_sources() == "pip install rdata"


DEFINITION = "light in a transparent protective case with a handle"


@pytest.mark.parametrize("reply, seen, uses, whole", [
    ("The tool answered. I will repeat its result.\n</think>\n\nLantern means light in a transparent protective case with a handle.",
     True, True, True),
    ("\n</think>\n\nLantern means light in a transparent protective case.", True, True, False),
    # no thought closed: the same words are reasoning to the server, and a client sees no answer
    ("Lantern means light in a transparent protective case with a handle.", False, True, True),
])
def test_a_tool_answer_counts_as_shown_only_where_the_server_shows_it(reply, seen, uses, whole):
    import eval_v3
    from webapp.api.text import ReplyShaper, join

    answer, used, copied, closed = eval_v3.read_answer(DEFINITION, reply)
    assert (used, copied, closed) == (uses, whole, seen)
    shaper = ReplyShaper(tools=True, reasoning=True, in_reasoning=True)   # the prompt opened <think>
    deltas = shaper.feed(reply)
    content, _ = join(deltas + shaper.finish()[0])
    assert (content.strip() == answer) == seen and bool(content.strip()) == seen
