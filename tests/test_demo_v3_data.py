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
    from tokenizers import Tokenizer

    tok_dir = tmp_path / "tok"
    shutil.copytree(REPO / "models" / "demo", tok_dir, ignore=shutil.ignore_patterns("*.safetensors", "optiq"))
    texts = ["<|im_start|>assistant\n<think>\n\n</think>\n\nA rest is a pause.<|im_end|>",
             "Hello\n\nWorld  two   spaces\t tab\r\n\r\nend \n", 'x = {"word": "café", "n": 12345}\n\n  indented',
             "naïve résumé — it's 3.14 ok?!\n\n\n", "</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>"]
    before = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
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


V3D = REPO / "artifacts" / "demo" / "v3d"


@pytest.mark.skipif(not (V3D / "corpus" / "docs.jsonl").exists(), reason="v3d not prepared (prepare_v3.py --variant v3d)")
def test_the_prepared_v3d_corpus_holds_no_held_out_question_and_a_third_of_notes():
    """On the prepared corpus: no held-out question is asked (user turns) nor written in a note,
    no note asks anything, every focused fact in >= 5 phrasings (a seeded sample of them found in
    the notes), and the notes are 30-40 % of the tokens."""
    import prepare_v3

    corpus = V3D / "corpus"
    assert prepare_v3.leak_check(corpus) == {}
    assert prepare_v3.notes_check(corpus) == {}
    stats = json.loads((corpus / "stats.json").read_text())
    assert stats["variant"] == "v3d" and stats["focus"]["phrasings_min"] >= 5
    assert 2000 <= stats["focus"]["facts_total"] <= 4000
    by_kind = V3D / "data" / "tokens_by_kind.json"
    if by_kind.exists():
        toks = json.loads(by_kind.read_text())
        assert 0.30 <= toks["notes_share"] <= 0.40 and toks["total"] <= 10_500_000
    if not Path("/usr/share/wordnet/data.noun").exists():
        return
    import conversations as C

    tool_words = {w.strip() for w in (REPO / "scripts" / "demo_model" / "tool_words.txt").read_text().split()}
    facts = V3.focus_facts(*H._wordnet(), lambda w: w in tool_words or w in C.HELDOUT_TOPICS)
    assert {k: len(v) for k, v in facts.items()} == stats["focus"]["facts"]
    notes = " ".join(json.loads(l)["text"] for l in open(corpus / "docs.jsonl") if '"kind": "note_' in l)
    rng = random.Random(0)
    for kind, fs in facts.items():
        for f in rng.sample(fs, min(12, len(fs))):
            ph = V3.fact_phrasings(kind, f)
            assert len(set(ph)) >= 5 and sum(p in notes for p in set(ph)) >= 5, (kind, f["subject"])


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


V3E = REPO / "artifacts" / "demo" / "v3e"


@pytest.mark.skipif(not (V3E / "corpus" / "docs.jsonl").exists(), reason="v3e not prepared (prepare_v3.py --variant v3e)")
def test_the_prepared_v3e_corpus_asks_no_held_out_subject_in_its_drills_and_keeps_the_shares():
    """On the prepared v3e corpus: no held-out question asked nor in a note (leak_check, notes_check);
    no user turn of a drill or tool document names a held-out subject (any category); no user question
    anywhere asks a held-out item's question about its subject (heldout_everyday.Exclusion); every
    drill answer names a subject of its question; the notes 25-30 % of <= 11M tokens; the tool
    conversations at least v3c's 6,000."""
    import prepare_v3

    corpus = V3E / "corpus"
    assert prepare_v3.leak_check(corpus) == {}
    assert prepare_v3.notes_check(corpus) == {}
    stats = json.loads((corpus / "stats.json").read_text())
    assert stats["variant"] == "v3e" and stats["focus"]["phrasings_min"] >= 5
    assert stats["docs_by_kind"]["tools"] >= 6000 and stats["v3e"]["drill_exchanges"] > 20000
    lo, med, hi = stats["v3e"]["asks_per_subject_min_median_max"]
    assert lo >= 10 and 10 <= med <= 25
    held = V3.heldout_subjects()
    held_re = re.compile(r"\b(?:" + "|".join(re.escape(s) for s in sorted(held, key=len, reverse=True)) + r")\b")
    ex = H.Exclusion()
    turn = re.compile(r"<\|im_start\|>(user|assistant)\n(.*?)<\|im_end\|>", re.S)
    n_drill = 0
    for line in open(corpus / "docs.jsonl"):
        d = json.loads(line)
        if d["kind"].startswith("note_") or d["kind"] == "prose":
            continue
        turns = turn.findall(d["text"])
        for i, (role, t) in enumerate(turns):
            if role != "user" or t.startswith("<tool_response>"):
                continue
            if len(t) <= 200:   # a question (a pasted passage names words without asking about them)
                assert not ex({"kind": "x", "messages": [t]}), t
            if d["kind"] in ("drill", "tools"):
                assert not held_re.search(t.lower()), t
            if d["kind"] == "drill" and i + 1 < len(turns):
                n_drill += 1
                ans = turns[i + 1][1].split("</think>")[-1].strip()
                words = set(re.findall(r"[a-z][a-z'-]+", t.lower()))
                head = ans.split(" is ")[0].lower()
                assert words & set(re.findall(r"[a-z][a-z'-]+", ans.lower())), (t, ans)
                if not t.startswith(("How", "In Python", "Which Python", "Python", "What's the Python", "I want",
                                     "What should I call")):
                    assert set(re.findall(r"[a-z][a-z'-]+", head)) & words or "`" in ans, (t, ans)
    assert n_drill > 20000
    toks = json.loads((V3E / "data" / "tokens_by_kind.json").read_text()) if (V3E / "data" / "tokens_by_kind.json").exists() else None
    if toks:
        assert 0.25 <= toks["notes_share"] <= 0.30 and toks["total"] <= 11_000_000
