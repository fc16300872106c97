"""Demo v3i's data (conversations_v3.VARIANTS["v3i"], check_v3.check_v3i; V3_PLAN section 25) on
small hand-made inputs: glosses up to 32 words with their parentheses, dictionary results drawn by
length and rarely a remembered definition, conversations of several look-ups, and the check that
counts the results only copying can answer. Fast: no WordNet, no model."""
from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "demo_model"))
sys.path.insert(0, str(REPO))

import conversations_v3 as CV3  # noqa: E402
import everyday_v3 as V3  # noqa: E402
from tests.test_demo_v3_data import ARITH, EXCLUDE, SHORT  # noqa: E402
from tests.test_demo_v3g import V3G_GOOD  # noqa: E402
from tests.test_demo_v3h import IDX, SKIPPED, SYN, V3H_SMALL, _span_doc, _v3h_corpus  # noqa: E402

LONG = ("a long narrow flexible tube (usually made of rubber or plastic) through which water or another liquid "
        "is carried from a tap to a garden")


def test_long_glosses_keep_their_parentheses_and_go_to_32_words():
    syn = {**SYN, (7, "n"): {"def": LONG}}
    idx = {**IDX, ("hose", "n"): {"synsets": [(6, "n"), (7, "n")]}}
    long = {"most": V3.LONG_GLOSS_WORDS, "bar": V3.LONG_GLOSS_BAR}
    assert 15 <= len(LONG.split()) <= 32
    # v3h's limits leave it out; v3i's keep it, parentheses and all, and still drop quotes
    assert ("hose", LONG) not in V3.other_senses(syn, idx, ["hose"])
    assert V3.other_senses(syn, idx, ["hose"], **long) == [("hose", LONG)]
    spans = {d["messages"][1] for d in V3.span_drills(random.Random(0), syn, 20, SKIPPED, lambda d: False, **long)}
    assert any(LONG in s for s in spans) and not any('"quoted"' in s for s in spans)
    assert not any(LONG in s for s in (d["messages"][1] for d in V3.span_drills(random.Random(0), syn, 20, SKIPPED,
                                                                                 lambda d: False)))


def test_the_draw_follows_the_length_strata_and_the_remembered_share():
    recall = [(f"r{i}", "a remembered thing") for i in range(20)]
    copy = [(f"s{i}", " ".join(["word"] * 5)) for i in range(50)] + [(f"m{i}", " ".join(["word"] * 12)) for i in range(50)] \
        + [(f"l{i}", " ".join(["word"] * 20)) for i in range(5)]
    draw = CV3._stratified_draw(recall, copy, ((2, 8, 0.35), (9, 14, 0.35), (15, 32, 0.30)), 0.10)
    rng = random.Random(1)
    kinds = Counter()
    for _ in range(4000):
        w, _ = draw(rng)
        kinds[w[0]] += 1
    share = {k: n / 4000 for k, n in kinds.items()}
    # 10 % remembered, the rest by stratum (the 5 long ones drawn as often as 50 of a shorter length)
    assert share["r"] == pytest.approx(0.10, abs=0.02)
    assert share["s"] == pytest.approx(0.9 * 0.35, abs=0.03) and share["m"] == pytest.approx(0.9 * 0.35, abs=0.03)
    assert share["l"] == pytest.approx(0.9 * 0.30, abs=0.03)
    # an empty stratum is skipped, its share going to the others
    only_short = CV3._stratified_draw(recall, copy[:50], ((2, 8, 0.35), (15, 32, 0.30)), 0.0)
    assert {only_short(rng)[0][0] for _ in range(200)} == {"s"}


def test_conversations_opening_with_the_dictionary_hold_several_look_ups_each_answer_repeating_its_result():
    words = [("lantern", "a light with a transparent case"), ("cycloserine", LONG)]
    kw = dict(dict_frac=1.0, dict_draw=lambda rng: rng.choice(words), name_words=["meaning", "word", "lamp", "river"])
    several = V3.tool_conversations_v3e(random.Random(0), words, [("Peru", "Lima")], ARITH, SHORT["v3_opposite"],
                                        EXCLUDE, 200, lookups=(2, 3, 4), **kw)
    one = V3.tool_conversations_v3e(random.Random(0), words, [("Peru", "Lima")], ARITH, SHORT["v3_opposite"],
                                    EXCLUDE, 200, **kw)

    def results(convs):
        return [[json.loads(m["content"]) for m in msgs if m["role"] == "tool" and m["content"].startswith('{"word"')]
                for msgs, _, _ in convs]

    per = [len(r) for r in results(several)]
    assert min(per) >= 1 and sum(per) / len(per) > 2.0 > sum(len(r) for r in results(one)) / len(one)
    for msgs, _, _ in several:
        for i, m in enumerate(msgs):
            if m["role"] == "tool" and m["content"].startswith('{"word"'):
                assert json.loads(m["content"])["definition"] in msgs[i + 1]["content"]
    counted = CV3.dict_results(several, {"a light with a transparent case"})
    flat = [d["definition"] for r in results(several) for d in r]
    assert counted == {"dict_results": len(flat), "dict_results_remembered": flat.count("a light with a transparent case"),
                       "dict_results_15plus_to_copy": flat.count(LONG)}


def _v3i_corpus(work, docs, copy15, remembered, results=100):
    _v3h_corpus(work, docs)
    stats = json.loads((work / "corpus" / "stats.json").read_text())
    stats["variant"] = "v3i"
    stats["v3e"].update(dict_results=results, dict_results_remembered=remembered, dict_results_15plus_to_copy=copy15)
    (work / "corpus" / "stats.json").write_text(json.dumps(stats))
    return work


V3I_SMALL = {**V3H_SMALL, "copy15_min": 10, "remembered_max": 0.20}


@pytest.mark.parametrize("flaw, copy15, remembered, named", [
    ("none", 10, 20, None),
    ("too few long results to copy", 9, 20, "of 15+ words to copy, fewer than 10"),
    ("too many remembered", 10, 21, "21 of 100 dictionary results repeat a definition"),
])
def test_the_v3i_check_counts_the_results_only_copying_answers(tmp_path, flaw, copy15, remembered, named):
    import check_v3

    docs = V3G_GOOD + [("drill", _span_doc("a place of refuge and comfort"))]
    problems = check_v3.check_v3i(_v3i_corpus(tmp_path, docs, copy15, remembered), V3I_SMALL)
    if named is None:
        assert problems == []
    else:
        assert any(named in p for p in problems), (flaw, problems)


def test_v3i_is_registered_and_leaves_v3h_as_it_was():
    import check_v3
    import prepare_v3

    added = {"long_glosses", "sense_last", "mid_words", "dict_strata", "recall_share", "lookups"}
    cfg = CV3.VARIANTS["v3i"]
    assert {k: v for k, v in cfg.items() if k not in added} == CV3.VARIANTS["v3h"]
    assert not added & set(CV3.VARIANTS["v3h"])
    assert "v3i" in prepare_v3.WORKS and "v3i" in check_v3.CHECKS and "v3i" in check_v3.LIMITS
