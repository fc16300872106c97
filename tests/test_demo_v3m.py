"""Demo v3m's data (conversations_v3.VARIANTS["v3m"], check_v3.check_v3m; V3_PLAN section 30): some
tool conversations offer only the tools they use (v3, always offered two to six tools, did not call a
dictionary offered alone), and no document holds what the tool and JSON evaluations ask about. Fast:
no WordNet, no model; the conversations are everyday_v3's own, rendered with the demo's template."""
from __future__ import annotations

import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "demo_model"))
sys.path.insert(0, str(REPO))

import conversations as C  # noqa: E402
import conversations_v3 as CV3  # noqa: E402
import everyday_v3 as V3  # noqa: E402
from tests.test_demo_v3_data import ARITH, EXCLUDE, SHORT  # noqa: E402

WORDS = [("lantern", "light in a transparent protective case"), ("harbor", "a sheltered port")]


def _conversations(alone_frac, n=60):
    kw = dict(dict_frac=1.0, name_words=["meaning", "word", "lamp", "river"], list_tools=True, think_frac=1.0)
    return V3.tool_conversations_v3e(random.Random(0), WORDS, [("Peru", "Lima")], ARITH, SHORT["v3_opposite"],
                                     EXCLUDE, n, alone_frac=alone_frac, **kw)


def test_a_dictionary_offered_alone_is_called_after_a_thought_naming_it():
    import check_v3

    convs = _conversations(1.0)
    alone = [(msgs, tools) for msgs, tools, _ in convs if len(tools) == 1]
    assert len(alone) > 20                       # the rest offer a calculator or capitals tool beside it
    assert all(len(tools) <= 2 for _, tools, _ in convs)   # only made tools: no weather, no e-mail
    for msgs, tools in alone:
        name = tools[0]["function"]["name"]
        call = next(m for m in msgs if m.get("tool_calls"))
        assert call["tool_calls"][0]["function"]["name"] == name
        thought = call.get("reasoning_content", "")
        m = check_v3.LISTED.search(thought)
        assert m and m["one"] == name and f"the tool offered is {name}, and it fits." in thought
        C.render_doc(C.Renderer(), msgs, tools, True, check=True)   # renders as the app's template does
    # v3l's conversations (alone_frac 0) never offer one tool: the measure v3m answers
    assert all(len(tools) >= 2 for _, tools, _ in _conversations(0.0))


def test_strict_held_out_drops_what_the_evaluations_ask(tmp_path):
    class WN:   # the slice of WordNet write_tools_eval reads: a word's first noun sense
        idx = {("lantern", "n"): {"synsets": [0]}}
        syn = [{"def": "light in a transparent protective case"}]

    words = CV3.json_eval_words()
    assert {"violin", "harbor"} <= words and "lantern" in words
    docs = [{"kind": "chat", "text": "A lamp is light in a transparent protective case.", "spans": []},
            {"kind": "json", "text": '{"word": "violin", "letters": 6}', "spans": []},
            {"kind": "json", "text": '{"word": "teapot", "letters": 6}', "spans": []},
            {"kind": "chat", "text": "A lantern is a lamp.", "spans": []}]
    kept, dropped = CV3.strict_held_out(docs, WN, {"lantern"})
    assert [d["text"] for d in kept] == [docs[2]["text"], docs[3]["text"]]
    assert dropped == {"tool_eval_definition": 1, "json_eval_word": 1}


def test_v3m_is_registered_and_leaves_v3l_as_it_was():
    import check_v3
    import prepare_v3

    assert CV3.VARIANTS["v3m"] == {**CV3.VARIANTS["v3l"], "alone_frac": 0.3, "strict_held_out": True}
    assert "alone_frac" not in CV3.VARIANTS["v3l"] and "strict_held_out" not in CV3.VARIANTS["v3l"]
    assert "v3m" in prepare_v3.WORKS and "v3m" in check_v3.CHECKS
    assert check_v3.LIMITS["v3m"] == {**check_v3.LIMITS["v3l"], "alone_min": 1300}
    # the JSON evaluation through the API asks about the words v3m keeps out
    from scripts.bench.eval_api import WORDS as API_WORDS

    assert set(API_WORDS) <= CV3.json_eval_words()
