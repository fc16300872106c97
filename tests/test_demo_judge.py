"""The v3 everyday judge (scripts/demo_model/judge.py) on hand-made replies: right answers pass,
dumps, lists of candidates, echoes and wrong answers fail. Fast: no model, no WordNet (the
committed held-out set carries the accepted answers)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent / "scripts" / "demo_model"
sys.path.insert(0, str(HERE))

import heldout_everyday  # noqa: E402
import judge  # noqa: E402

ITEMS = {it["subject"]: it for it in judge.load_items()}


def test_the_heldout_set_is_large_balanced_and_answerable():
    items = judge.load_items()
    assert len(items) >= 60
    cats = {c: sum(it["category"] == c for it in items) for c in heldout_everyday.CATEGORIES}
    assert min(cats.values()) >= 12, cats
    assert len({it["question"].lower() for it in items}) == len(items)
    for it in items:
        assert it["any_of"] and all(it["any_of"]), it["id"]
        # the question must not hold its own answer (an echo would be judged right)
        if it["category"] != "definition":
            assert not any(judge._phrase(x).search(it["question"].lower()) for x in it["any_of"][0]), it["id"]
        assert not set(it["none_of"]) & set(it["any_of"][0]), it["id"]


@pytest.mark.parametrize("subject,reply,right", [
    ("Spain", "The capital of Spain is Madrid.", True),
    ("Spain", "<think>\nThe user asks for a capital.\n</think>\n\nThe capital of Spain is Madrid. It lies in the centre.", True),
    ("Spain", "The capital of 200 is 2.", False),                              # v2's reply in the issue
    ("Spain", "The capital of Spain is Madrid, Paris, Rome or London.", False),  # a list of capitals
    ("Spain", "<think>\nThe capital of Spain is Madrid", False),              # never left its thought
    ("Spain", "Spain is a country in Europe. It has a long history. Its capital is Madrid.", False),  # not in the head
    ("Spain", "", False),
    ("Spain", "The capital of Spain is Madridville.", False),                  # a whole word, not a prefix
])
def test_capitals(subject, reply, right):
    assert judge.judge(ITEMS[subject], reply)[0] is right, judge.judge(ITEMS[subject], reply)


def test_opposites_accept_the_antonym_and_refuse_a_synonym_or_a_list():
    it = next(i for i in judge.load_items() if i["category"] == "opposite" and i["none_of"])
    ant, syn = it["any_of"][0][0], it["none_of"][0]
    w = it["subject"]
    assert judge.judge(it, f'The opposite of "{w}" is "{ant}".')[0]
    assert not judge.judge(it, f'The opposite of "{w}" is "{syn}".')[0]
    assert not judge.judge(it, f'The opposite of "{w}" is "{syn}" or "{ant}".')[0]
    assert not judge.judge(it, f'The opposite of "{w}" is "{w}".')[0]
    words = " ".join(f'"{x}",' for x in ["big", "small", "hot", "cold", "good", "bad", "early", "late", ant, "up", "down",
                                          "light", "dark", "fast", "slow", "open", "shut", "rich", "poor", "old", "new"])
    assert not judge.judge(it, f"Some opposites are {words} and more.")[0]  # every word at once


def test_definitions_need_two_words_of_one_gloss_in_a_short_answer():
    it = next(i for i in judge.load_items() if i["category"] == "definition")
    sense = it["any_of"][0]
    w = it["subject"]
    assert judge.judge(it, f'"{w}" is a noun. It means {" ".join(sense)}.')[0]
    assert len(sense) >= 2 and not judge.judge(it, f'"{w}" is a noun. It means {sense[0]}.')[0]  # one word is not enough
    assert not judge.judge(it, f'"{w}" is a noun. It means a small round thing that people like.')[0]
    dump = " ".join(w2 for s in it["any_of"] for w2 in s) + " " + "and so on " * 40
    assert not judge.judge(it, dump)[0]


def test_kinds_refuse_another_items_category():
    it = next(i for i in judge.load_items() if i["category"] == "kind" and i["none_of"])
    w = it["subject"]
    a = "an" if w[0] in "aeiou" else "a"
    assert judge.judge(it, f"{a.capitalize()} {w} is a kind of {it['any_of'][0][0]}.")[0]
    assert not judge.judge(it, f"{a.capitalize()} {w} is a kind of {it['none_of'][0]}.")[0]
    assert not judge.judge(it, f"{a.capitalize()} {w} is a kind of {it['any_of'][0][0]}, {it['none_of'][0]} "
                               f"or {it['none_of'][1]}.")[0]


def test_python_names_the_function_and_no_other():
    it = ITEMS.get("append") or next(i for i in judge.load_items() if i["category"] == "python")
    name, other = it["any_of"][0][0], it["none_of"][0]
    assert judge.judge(it, f"Use the `{name}()` method:\n\n```python\nx.{name}(1)\n```")[0]
    assert not judge.judge(it, f"Use the `{other}()` method.")[0]
    assert not judge.judge(it, f"Use `{other}()` or `{name}()`.")[0]
    assert not judge.judge(it, f"Use the `x{name}()` method.")[0]


def test_exclusion_hook_leaves_out_the_held_out_questions_but_not_the_facts():
    ex = heldout_everyday.Exclusion()
    q = lambda *m, **k: {"kind": "x", "messages": list(m), **k}  # noqa: E731
    assert ex(q("What is the capital of Spain?", "The capital of Spain is Madrid."))
    assert ex(q("Madrid is the capital of which country?", "Madrid is the capital of Spain."))
    assert ex(q("Which city is the capital of Spain?", "...", subject="Spain"))
    # the fact in another form stays: the judge asks the model to recall it
    assert not ex(q("Where is Madrid?", "Madrid is the capital and largest city situated centrally in Spain."))
    assert not ex(q("What is the capital of Peru?", "The capital of Peru is Lima."))
    opp = next(i for i in judge.load_items() if i["category"] == "opposite")
    w, ant = opp["subject"], opp["any_of"][0][0]
    assert ex(q(f"What is the opposite of {w}?", "..."))
    assert ex(q(f"Give me an antonym for {ant}.", "..."))                 # the other direction too
    assert not ex(q(f"Give me a synonym for {ant}.", "..."))
    py = next(i for i in judge.load_items() if i["category"] == "python")
    assert ex(q(py["question"], "...", subject=py["subject"]))
    assert ex(q(py["question"].replace("How do I", "How can I").replace("In Python, how can I", "How can I"),
                "...")) or not py["question"].startswith(("How do I", "In Python, how can I"))
    assert ex(q(f"What does {py['subject']}() do in Python?", "..."))
    d = next(i for i in judge.load_items() if i["category"] == "definition")
    assert ex(q(f"Define {d['subject']}.", "...", word=d["subject"]))
    assert not ex(q(f"Use {d['subject']} in a sentence.", "...", word=d["subject"]))


def test_summary_counts_by_category():
    rows = [{"category": "capital", "right": True}, {"category": "capital", "right": False},
            {"category": "python", "right": True}]
    s = judge.summarise(rows)
    assert s["right"] == 2 and s["share_right"] == round(2 / 3, 4)
    assert s["by_category"]["capital"] == {"right": 1, "questions": 2, "share_right": 0.5}


def test_side_by_side_pairs_the_same_questions_by_category_not_by_result():
    import side_by_side

    def report(right_ids, reply):
        rows = [{"id": f"{c}-{i:02d}", "category": c, "question": f"q {c} {i} | pipe", "reply": reply,
                 "right": f"{c}-{i:02d}" in right_ids, "why": "because"} for c in ("capital", "kind") for i in range(6)]
        return {"rows": rows, "right": len(right_ids), "questions": len(rows)}

    a = report({"capital-05"}, "old\nreply")
    b = report({"capital-00", "kind-01"}, "")
    pairs = side_by_side.pick(a["rows"], b["rows"], per_category=4)
    assert [x["id"] for x, _ in pairs] == [f"{c}-{i:02d}" for c in ("capital", "kind") for i in range(4)]
    assert all(x["id"] == y["id"] for x, y in pairs)
    page = side_by_side.render(a, b, names=("v2", "v3"), per_category=4)
    assert "v2 0/8, v3 2/8" in page and "v2 1/12, v3 2/12" in page
    assert page.count("\n| q ") == 8 and "\\|" in page and "*(empty)*" in page and "old reply" in page
