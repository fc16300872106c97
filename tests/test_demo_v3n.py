"""Demo v3n's data (conversations_v3.VARIANTS["v3n"], check_v3.check_v3n; V3_PLAN section 31): the
names clients give a dictionary (define_word, get_definition, ...) in a share of the tool
conversations, always beside other tools, never an evaluation name. v3m, which never saw them,
called get_weather when offered define_word beside it. Fast: no WordNet, no model."""
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
from tests.test_demo_v3m import WORDS  # noqa: E402


def _conversations(natural_frac=None, n=120):
    kw = dict(dict_frac=1.0, name_words=["meaning", "word", "lamp", "river"], list_tools=True, think_frac=1.0,
              alone_frac=0.3, **({} if natural_frac is None else {"natural_frac": natural_frac}))
    return V3.tool_conversations_v3e(random.Random(0), WORDS, [("Peru", "Lima")], ARITH, SHORT["v3_opposite"],
                                     EXCLUDE, n, **kw)


def test_natural_names_come_beside_other_tools_and_are_called_by_name():
    natural = set(V3.NATURAL_DICT_NAMES)
    convs = _conversations(0.5)
    with_natural = [(msgs, tools) for msgs, tools, _ in convs if {t["function"]["name"] for t in tools} & natural]
    assert len(with_natural) > 10
    called = 0
    for msgs, tools in with_natural:
        assert len(tools) >= 2                                    # never the dictionary alone
        name = next(t["function"]["name"] for t in tools if t["function"]["name"] in natural)
        calls = [c["function"]["name"] for m in msgs for c in m.get("tool_calls", [])]
        called += name in calls                                   # called by the name offered
        C.render_doc(C.Renderer(), msgs, tools, True, check=True)
    assert called >= 0.8 * len(with_natural)   # (with two words to look up, a few turn to another tool)
    # natural_frac 0 draws nothing more: v3m's conversations are as they were
    assert _conversations(0.0) == _conversations()
    assert not any({t["function"]["name"] for t in tools} & natural for _, tools, _ in _conversations(0.0))


def test_v3n_is_registered_and_leaves_v3m_as_it_was():
    import check_v3
    import eval_v3
    import prepare_v3

    assert CV3.VARIANTS["v3n"] == {**CV3.VARIANTS["v3m"], "natural_frac": 0.1, "n_span": 12000}
    assert "natural_frac" not in CV3.VARIANTS["v3m"]
    assert "v3n" in prepare_v3.WORKS and check_v3.CHECKS["v3n"] is check_v3.check_v3n
    assert not set(V3.NATURAL_DICT_NAMES) & set(eval_v3.EVAL_NAMES)
