"""Demo v3h's data (scripts/demo_model/everyday_v3.py section j, conversations_v3.VARIANTS["v3h"],
check_v3.check_v3h) on small hand-made inputs: span drills ask a whole gloss back and the reply is
that gloss exactly, never one naming a held-out subject; a dictionary result can be another sense
of the word than the one a fact taught. Fast: no WordNet, no model."""
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
from tests.test_demo_v3_data import _chat  # noqa: E402
from tests.test_demo_v3g import V3G_GOOD, V3G_SMALL, _v3g_corpus  # noqa: E402

SYN = {(1, "n"): {"def": "a sheltered port where ships can take on or discharge cargo"},
       (2, "n"): {"def": "a place of refuge and comfort and security"},
       (3, "n"): {"def": "(nautical) any place of shelter; a haven"},                      # parentheses dropped
       (4, "n"): {"def": "a native or inhabitant of New Zealand who speaks English"},    # names a held-out subject
       (5, "n"): {"def": "x"},                                                             # too short to copy
       (6, "n"): {"def": 'a "quoted" gloss that the template could not render well at all'}}
IDX = {("harbor", "n"): {"synsets": [(1, "n"), (2, "n"), (3, "n"), (5, "n")]},
       ("lantern", "n"): {"synsets": [(6, "n")]}}
SKIPPED = re.compile(r"\b(?:new zealand|ghana)\b")


def test_span_drills_ask_a_whole_gloss_back_and_the_reply_is_it_exactly():
    items = V3.span_drills(random.Random(0), SYN, 10, SKIPPED, lambda d: False)
    # "any place of shelter" is too short (4 words), New Zealand held out, "x" too short, quotes dropped
    want = {"a sheltered port where ships can take on or discharge cargo", "a place of refuge and comfort and security"}
    assert len(items) == 2
    for d in items:
        span = next(s for s in want if s in d["messages"][0])
        assert span in d["messages"][1] and d["kind"] == "span" and d["thought"]
    assert {next(s for s in want if s in d["messages"][0]) for d in items} == want
    # the caller's exclusion is asked too
    assert V3.span_drills(random.Random(0), SYN, 10, SKIPPED, lambda d: "refuge" in d["messages"][0]) \
        and all("refuge" not in d["messages"][0] for d in V3.span_drills(random.Random(0), SYN, 10, SKIPPED,
                                                                        lambda d: "refuge" in d["messages"][0]))


def test_other_senses_are_the_second_to_fourth_glosses_that_can_be_copied():
    assert V3.other_senses(SYN, IDX, ["harbor", "lantern", "absent"]) == [
        ("harbor", "a place of refuge and comfort and security"), ("harbor", "any place of shelter")]


def _span_doc(span):
    return _chat(f'Repeat this exactly: "{span}"', span)


V3H_SMALL = {**V3G_SMALL, "spans_min": 1, "senses_min": 1}


def _v3h_corpus(work, docs, spans=1, senses=1):
    _v3g_corpus(work, docs)
    stats = json.loads((work / "corpus" / "stats.json").read_text())
    stats["variant"] = "v3h"
    stats["v3e"].update(span_drills=spans, dict_words_common_rare_senses=[3, 3, senses])
    (work / "corpus" / "stats.json").write_text(json.dumps(stats))
    return work


@pytest.mark.parametrize("flaw, docs, spans, senses, named", [
    ("none", V3G_GOOD + [("drill", _span_doc("a place of refuge and comfort"))], 1, 1, None),
    ("a reply that drifts", V3G_GOOD + [("drill", _chat('Repeat this exactly: "a place of refuge and comfort"',
                                                        "a place of refuge and safety"))], 1, 1, "does not hold its span"),
    ("a held-out subject", V3G_GOOD + [("drill", _span_doc("an inhabitant of Ghana"))], 1, 1, "names a held-out subject"),
    ("none in the documents", V3G_GOOD, 1, 1, "0 span drills found"),
    ("too few counted", V3G_GOOD + [("drill", _span_doc("a place of refuge and comfort"))], 0, 1, "0 span drills, fewer"),
    ("no other senses", V3G_GOOD + [("drill", _span_doc("a place of refuge and comfort"))], 1, 0, "another sense"),
])
def test_the_v3h_check_passes_a_fit_corpus_and_names_each_flaw(tmp_path, flaw, docs, spans, senses, named):
    import check_v3

    problems = check_v3.check_v3h(_v3h_corpus(tmp_path, docs, spans, senses), V3H_SMALL)
    if named is None:
        assert problems == []
    else:
        assert any(named in p for p in problems), (flaw, problems)


def test_v3h_is_registered_where_variants_are_and_leaves_v3g_as_it_was():
    import check_v3
    import conversations_v3
    import prepare_v3

    cfg = conversations_v3.VARIANTS["v3h"]
    assert cfg["n_span"] >= 5000 and cfg["other_senses"]
    assert cfg["person_alias"]
    assert {k: v for k, v in cfg.items() if k not in ("n_span", "other_senses", "person_alias")} == conversations_v3.VARIANTS["v3g"]
    assert "v3h" in prepare_v3.WORKS and "v3h" in check_v3.CHECKS and "v3h" in check_v3.LIMITS
    assert not {"n_span", "other_senses", "person_alias"} & set(conversations_v3.VARIANTS["v3g"])


def test_v3h_names_an_explained_person_by_a_short_name_after_the_first_sentence():
    from tests.test_demo_v3g import GALILEO, KEPLER

    ans, thought, n = V3.explain_person({**KEPLER, "asked": "Johannes Kepler"}, alias=True)
    sentences = [s for s in re.split(r"(?<=\.) ", ans) if s]
    assert sentences[0].startswith("Johannes Kepler was") and "who Johannes Kepler was" in thought
    assert n == len(sentences) >= 3 and all(s.startswith("Kepler ") for s in sentences[1:]), ans
    # the long name no longer opens every sentence: no 8-word span three times (the loop measure's rule)
    assert ans.count("Johannes Kepler") == 1
    # a first name serves as well; the sentence of other names goes when no third name is left
    longer = {**GALILEO, "desc": "Italian astronomer and mathematician who first used a telescope to study the sky"}
    ans, _, _ = V3.explain_person({**longer, "asked": "Galileo Galilei"}, alias=True)
    assert "Galileo lived from 1564 to 1642." in ans and "also called" not in ans
    # asked by the short name, or without alias, as v3g wrote it
    assert V3.explain_person({**KEPLER, "asked": "Kepler"}, alias=True) == V3.explain_person({**KEPLER, "asked": "Kepler"})
    assert V3.explain_person({**KEPLER, "asked": "Johannes Kepler"})[0].count("Johannes Kepler") >= 3
