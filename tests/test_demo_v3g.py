"""Demo v3g's data generators (scripts/demo_model/everyday_v3.py section i, conversations_v3.VARIANTS["v3g"],
check_v3.check_v3g) on small hand-made inputs: explained answers of 3-5 sentences that name the subject
and state the facts as the short answers state them; tool names of real words that only copying gets
right (never an evaluation name nor one of its stems), listed in the thought and called. Fast: no
WordNet, no model."""
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
from tests.test_demo_v3_data import ARITH, EXCLUDE, GOOD, SHORT, SMALL, _chat, _listing, _write_corpus  # noqa: E402


def _noun(w, h, np_, kinds=(), parts=(), sibs=(), ex=None, eg=None, freq=1):
    return {**V3._noun_fmt(w, V3._article(w)), "h": h, "ha": V3._article(h), "np": np_, "kinds": list(kinds), "parts": list(parts),
            "sibs": list(sibs), "ex": ex, "eg": eg, "freq": freq}


VIOLIN = _noun("violin", "bowed stringed instrument", "a bowed stringed instrument that is the highest member of the violin family",
               kinds=["Amati", "Guarnerius", "Stradavarius"], parts=["chin rest", "fiddlestick"], sibs=["cello", "viola"], freq=25)
LANTERN = _noun("lantern", "lamp", "a light in a transparent protective case", kinds=["Chinese lantern", "dark lantern"],
                eg=("dark lantern", "a lantern with a single opening and a sliding shutter"))
HOUSE = _noun("house", "dwelling", "a dwelling that serves as living quarters for one or more families",
              kinds=["beach house", "bungalow"], parts=["loft", "porch"], sibs=["cabin", "hut"], ex="he has a house on Cape Cod")
BOX = _noun("box", "container", "a container with a flat base and sides")            # a definition and a kind only
EXAMPLE = _noun("example", "information", "an item of information that is typical of a class", sibs=["datum", "fact"])
TELESCOPE = _noun("telescope", "magnifier", "a magnifier of images of distant objects", kinds=["solar telescope", "radio telescope"])
RADIO_TELESCOPE = _noun("radio telescope", "astronomical telescope", "an astronomical telescope that picks up radio waves",
                        sibs=["reflector", "refractor"])
KEPLER = {"names": ["Johannes Kepler", "Kepler"], "desc": "German astronomer who first stated laws of planetary motion",
          "years": ("1571", "1630"), "born_in": None, "known_as": ["astronomer", "mathematician"]}
HERZBERG = {"names": ["Gerhard Herzberg", "Herzberg"], "desc": "Canadian physicist noted for work on molecules",
            "years": ("1904",), "born_in": "Germany", "known_as": ["physicist"]}
GALILEO = {"names": ["Galileo Galilei", "Galileo"], "desc": "Italian astronomer", "years": ("1564", "1642"), "born_in": None,
           "known_as": ["astronomer"]}
MEAGER = {"w": "meager", "gloss": "deficient in amount or quality or extent", "ex": "meager resources", "opp": "ample",
          "sim": ["meagre", "stingy"]}


def _sentences(text):
    return [s for s in re.split(r'(?<=[.!?])(?<!\b[A-Z]\.)"?\s+(?=["A-Z])', text) if s]


def test_explained_noun_answers_have_3_to_5_sentences_and_state_the_short_answers_facts():
    """The definition and the kind as the short answers and notes state them (fact_phrasings: the same
    fact, the same words), then kinds, parts, related kinds and an example; the asked example kept when
    the answer runs long; a thought naming the subject and the plan."""
    for f in (VIOLIN, LANTERN, HOUSE):
        for form in ("what", "example", "word"):
            made = V3.explain_noun(f, form)
            if form == "example" and not (f["ex"] or f["eg"]):
                assert made is None   # no example to give: never asked for one
                continue
            ans, thought, n = made
            sents = _sentences(ans)
            assert 3 <= n == len(sents) <= 5 and V3.EXPLAIN_MIN_WORDS <= len(ans.split()) <= V3.EXPLAIN_MAX_WORDS, ans
            assert sents[0] in V3.fact_phrasings("definition", f), sents[0]
            kind = sents[1].replace("It is", f"{f['A']} {f['w']} is")
            assert kind in V3.fact_phrasings("kind", f), sents[1]
            assert sents[0].startswith('The word "' if form == "word" else f"{f['A']} {f['w']} is ")
            assert f["w"] in thought and thought.startswith("The user asks") and "I will define it" in thought
            if form == "example":
                assert sents[-1].startswith("For example") and "wants an example" in thought
    ans = V3.explain_noun(HOUSE, "example")[0]
    assert 'For example: "he has a house on Cape Cod".' in ans        # WordNet's own sentence first
    assert "For example, a dark lantern is a lantern with" in V3.explain_noun(LANTERN, "example")[0]
    assert V3.explain_noun(BOX, "what") is None                        # two sentences are not an explanation


def test_explained_people_and_adjectives_name_the_asked_subject_in_every_sentence():
    ans, thought, n = V3.explain_person({**KEPLER, "asked": "Kepler"})
    assert n == len(_sentences(ans)) == 4 and all(s.startswith("Kepler ") for s in _sentences(ans)), ans
    assert "Kepler lived from 1571 to 1630." in ans and "is also called Johannes Kepler" in ans
    assert "an astronomer and a mathematician" in ans and "who Kepler was" in thought
    ans, thought, _ = V3.explain_person({**HERZBERG, "asked": "Gerhard Herzberg"})
    assert ans.startswith("Gerhard Herzberg is a Canadian physicist") and "was born in Germany in 1904." in ans
    assert V3._an("United States physicist") == "a" and V3._an("Italian astronomer") == "an"
    ans, thought, n = V3.explain_adjective(MEAGER)
    assert 3 <= n <= 5 and ans.startswith('The word "meager" means deficient')
    # the opposite as the short answers and the notes state it
    assert V3.fact_phrasings("opposite", {"w": "meager", "a": "ample", "W": "Meager"})[0] in ans
    assert '"meager"' in thought


def test_explained_answers_skip_held_out_subjects_and_race_prompts_and_vary_the_questions():
    """Every question asks for an explanation in one of many phrasings; none names a held-out subject
    (any category, as the drills) nor a subject of the race and everyday prompts (conversations.HELDOUT_TOPICS,
    as a whole word: "telescope", "a radio telescope", "Galileo"); a subject made of the questions' own words ("example") is left out; common
    nouns are asked twice; the same seed gives the same exchanges."""
    import conversations as C

    evals = {l.strip().lower() for f in ("everyday_prompts.txt", "race_prompts.txt")
             for l in (REPO / "scripts" / "demo_model" / f).read_text().splitlines() if l.strip()}
    exclude = lambda d: EXCLUDE(d) or C.held_out(d, set(), evals)  # noqa: E731
    nouns = [VIOLIN, LANTERN, HOUSE, BOX, EXAMPLE, TELESCOPE, RADIO_TELESCOPE]
    made = lambda s: V3.explained_answers(random.Random(s), nouns, [KEPLER, HERZBERG, GALILEO], [MEAGER],  # noqa: E731
                                          {"house"} | C.HELDOUT_TOPICS, exclude)   # as conversations_v3 passes them
    items = made(0)
    assert made(0) == items and made(1) != items
    about = [d.get("word") or d.get("subject") for d in items]
    assert sorted(about) == sorted(["violin", "violin", "lantern", "Kepler" if "Kepler" in about else "Johannes Kepler",
                                    "Herzberg" if "Herzberg" in about else "Gerhard Herzberg", "meager"])
    for d in items:
        q, a = d["messages"]
        assert q.lower() not in evals and not re.search(r"telescope|galileo|house", q, re.I), q
        assert 3 <= d["sentences"] <= 5 and (d.get("word") or d.get("subject")) in d["thought"]
    # many phrasings over many draws
    qs = {re.sub(r"violin", "X", d["messages"][0]) for s in range(60) for d in made(s) if d.get("word") == "violin"}
    assert len(qs) >= 12
    assert V3.thought(items[0]) == items[0]["thought"]   # the document's thought is the item's own


def test_real_names_avoid_the_evaluation_names_and_their_stems_and_are_each_new():
    import eval_v3

    stems = V3.copy_stems(eval_v3.EVAL_NAMES)
    assert {"wordbook", "dict", "meaning", "glossary", "explain", "term", "word", "vocabulary", "semantics", "defn",
            "look"} <= stems and not stems & {"api", "tool", "service", "finder", "oracle"}
    assert all(V3.clashes(n, eval_v3.EVAL_NAMES, stems) for n in eval_v3.EVAL_NAMES)
    assert V3.clashes("dictApi", eval_v3.EVAL_NAMES, stems) and V3.clashes("swordfish_api", eval_v3.EVAL_NAMES, stems)
    assert V3.clashes("term_finder", eval_v3.EVAL_NAMES, stems) and not V3.clashes("lantern_api", eval_v3.EVAL_NAMES, stems)
    words = ["lantern", "harbor", "river", "velvet", "anchor", "meadow", "copper", "falcon", "pebble", "thistle", "sword",
             "dictum", "terminal", "marble", "quiver", "ember", "saddle", "walnut", "beacon", "tundra"]
    names = V3.real_names(random.Random(0), words, ["give_way", "break_even"], 1500,
                          lambda n: V3.clashes(n, eval_v3.EVAL_NAMES, stems))
    assert len(set(names)) == len(names) == 1500
    with pytest.raises(ValueError):   # too few words for the names asked: said, not looped on
        V3.real_names(random.Random(0), words[:2], [], 1000)
    assert not any(V3.clashes(n, eval_v3.EVAL_NAMES, stems) or re.search("sword|dictum|terminal", n.lower()) for n in names)
    shapes = {"word": r"[a-z]+", "snake": r"[a-z]+_[a-z]+", "camel": r"[a-z]+[A-Z][a-z]+"}
    for shape, pat in shapes.items():   # every shape of the evaluation's names, none dominant
        share = sum(bool(re.fullmatch(pat, n)) for n in names) / len(names)
        assert 0.05 < share < 0.8, (shape, share)


def test_v3g_tool_conversations_list_the_offered_names_and_call_the_dictionarys():
    """With a pool of names (v3g), every made tool takes a new name from it, the other offered tools take
    one in about `rename_frac` of the conversations, the thought lists the offered names in the system
    turn's order, and the call names the offered dictionary."""
    import eval_v3

    stems = V3.copy_stems(eval_v3.EVAL_NAMES)
    words = ["lantern", "harbor", "river", "velvet", "anchor", "meadow", "copper", "falcon", "pebble", "thistle",
             "marble", "quiver", "ember", "saddle", "walnut", "beacon", "tundra", "orchard", "cobalt", "juniper"]
    pool = V3.real_names(random.Random(1), words, ["give_way"], 1000, lambda n: V3.clashes(n, eval_v3.EVAL_NAMES, stems))
    dict_words = [("lantern", "a light with a transparent case"), ("violin", "a bowed stringed instrument")]
    convs = V3.tool_conversations_v3e(random.Random(2), dict_words, [("Peru", "Lima")], ARITH, SHORT["v3_opposite"], EXCLUDE,
                                      200, think_frac=1.0, dict_frac=0.7, list_tools=True, names=iter(pool), rename_frac=0.4)
    fixed = {t[0] for t in V3.OTHER} | {"get_weather", "get_time", "search_web", "send_email", "translate"}
    used, renamed, dict_calls = [], 0, 0
    for msgs, tools, _ in convs:
        names = [t["function"]["name"] for t in tools]
        made = [n for n in names if n not in fixed]
        used += made
        renamed += len(made) == len(names)
        dicts = [t["function"]["name"] for t in tools if t["function"]["description"] in V3.DICT_DESC]
        for m in msgs:
            if m.get("tool_calls"):
                called = m["tool_calls"][0]["function"]["name"]
                listed = m["reasoning_content"].split("the tools offered are ")[1].split(". The ")[0]
                assert re.split(r", | and ", listed) == names and f"The {called} tool fits." in m["reasoning_content"]
                if called in dicts:
                    dict_calls += 1
                    assert json.loads(m["tool_calls"][0]["function"]["arguments"]) and called in pool
    assert len(used) == len(set(used)) and set(used) <= set(pool)   # each name once
    assert 0.25 < renamed / len(convs) < 0.55 and dict_calls > 120


def _explain_doc(q, thought, ans):
    return _chat(q, (f"<think>\n{thought}\n</think>\n\n" if thought else "") + ans)


def _tools_doc(name, listed):
    tool = json.dumps(V3.tool_schema(name, V3.DICT_DESC[0], {"word": "the word"}))
    return f"<|im_start|>system\n# Tools\n<tools>\n{tool}\n</tools><|im_end|>\n" + _listing(name, listed)


V3G_GOOD = GOOD + [
    ("tools", _tools_doc("lantern_api", ["get_weather", "lantern_api"])),
    ("explain", _explain_doc("Describe a violin.", "The user asks what a violin is. I will define it.",
                             V3.explain_noun(VIOLIN, "what")[0])),
    ("explain", _explain_doc("Who was Kepler?", None, V3.explain_person({**KEPLER, "asked": "Kepler"})[0]))]
V3G_SMALL = {**SMALL, "listed_min": 0.5, "explain_share": (0.05, 0.9), "explain_tokens_mean": (20, 120), "dict_names_min": 1}


def _v3g_corpus(work, docs, sentences=None, data=True):
    _write_corpus(work, "v3g", docs, 0.27)
    stats = json.loads((work / "corpus" / "stats.json").read_text())
    stats["v3g"] = {"sentences": sentences or {"4": 2}}
    (work / "corpus" / "stats.json").write_text(json.dumps(stats))
    if data:   # a mask (every token trained on, ten a document) and the tokenizer the token counts read
        import shutil

        import numpy as np

        np.save(work / "data" / "mask.npy", np.ones(10 * len(docs), dtype=np.uint8))
        np.save(work / "data" / "docs.npy", np.arange(0, 10 * len(docs), 10))
        (work / "tokenizer").mkdir(exist_ok=True)
        shutil.copy(REPO / "models" / "demo" / "tokenizer.json", work / "tokenizer" / "tokenizer.json")
    return work


@pytest.mark.parametrize("flaw, docs, sentences, named", [
    ("none", V3G_GOOD, None, None),
    ("a two-sentence answer", V3G_GOOD + [("explain", _explain_doc("Describe a box.", None, "A box is a container. It holds things."))],
     None, "read as 3-5 sentences"),
    ("the generator counted two", V3G_GOOD, {"2": 1, "4": 1}, "want 3-5"),
    ("a thought about something else", V3G_GOOD + [("explain", _explain_doc(
        "Describe a violin.", "The user asks about music. I will answer.", V3.explain_noun(VIOLIN, "what")[0]))],
     None, "thought does not name the subject"),
    ("an evaluation name offered", V3G_GOOD + [("tools", _tools_doc("wordbook", ["wordbook", "get_weather"]))], None,
     "clashes with the evaluation's names: 'wordbook'"),
    ("a stem of one", V3G_GOOD + [("tools", _tools_doc("glossary_hub", ["glossary_hub", "get_weather"]))], None,
     "'glossary_hub'"),
    ("a held-out subject explained", V3G_GOOD + [("explain", _explain_doc("Tell me about Ghana.", None, "x. y. z."))], None,
     "names a held-out subject"),
    ("a race subject explained", V3G_GOOD + [("explain", _explain_doc(
        "What is a radio telescope?", None, "A radio telescope is a telescope. It is a kind of telescope. It hears."))], None,
     "names a held-out subject: 'What is a radio telescope?'"),
])
def test_the_v3g_check_passes_a_fit_corpus_and_names_each_flaw(tmp_path, flaw, docs, sentences, named):
    import check_v3

    problems = check_v3.check_v3g(_v3g_corpus(tmp_path, docs, sentences), V3G_SMALL)
    if named is None:
        assert problems == []
        real = check_v3.check_v3g(tmp_path)   # the real bounds: far too few names and tool conversations
        assert any("distinct dictionary names" in p for p in real) and any("tool conversations" in p for p in real)
    else:
        assert any(named in p for p in problems), (flaw, problems)


def test_the_v3g_check_bounds_the_explained_share_of_the_trained_tokens(tmp_path):
    import check_v3

    work = _v3g_corpus(tmp_path, V3G_GOOD)
    assert check_v3.reply_tokens_by_kind(work) == {**{k: 10 * sum(d == k for d, _ in V3G_GOOD) for k, _ in V3G_GOOD},
                                                   "total": 10 * len(V3G_GOOD)}
    problems = check_v3.check_v3g(work, {**V3G_SMALL, "explain_share": (0.5, 0.9)})
    assert any("of the trained-on tokens, outside" in p for p in problems), problems
    problems = check_v3.check_v3g(work, {**V3G_SMALL, "explain_tokens_mean": (100, 200)})
    assert any("tokens on average, outside" in p for p in problems), problems


def test_v3g_is_registered_where_variants_are():
    import check_v3
    import conversations_v3
    import prepare_v3

    cfg = conversations_v3.VARIANTS["v3g"]
    assert cfg["explain"] and cfg["real_names"] and cfg["list_tools"] and 0 < cfg["rename_frac"] < 1
    assert "v3g" in prepare_v3.WORKS and "v3g" in check_v3.CHECKS and "v3g" in check_v3.LIMITS
    # v3e's and v3f's settings are what they were (their corpora rebuild byte for byte)
    assert not {"explain", "real_names", "rename_frac", "v2_keep"} & (set(conversations_v3.VARIANTS["v3f"])
                                                                       | set(conversations_v3.VARIANTS["v3e"]))
