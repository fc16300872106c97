"""Demo v3j's data (conversations_v3.VARIANTS["v3j"], check_v3.check_v3j; V3_PLAN section 26): a
history reply to a tool's result starts right after `<|im_start|>assistant\\n`, where no inference
reply starts (the prompt opens a thought), so v3j keeps it as context, not as a trained span. Fast:
no WordNet, no model; the conversations are everyday_v3's own, rendered with the demo's template."""
from __future__ import annotations

import json
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
from tests.test_demo_v3g import V3G_GOOD  # noqa: E402
from tests.test_demo_v3h import _span_doc  # noqa: E402
from tests.test_demo_v3i import LONG, V3I_SMALL, _v3i_corpus  # noqa: E402

BARE = "</tool_response><|im_end|>\n<|im_start|>assistant\n"


def _look_ups():
    """A conversation of two or more dictionary look-ups with a thought in its last reply, as
    conversations_v3's emit hands it to render_doc (earlier thoughts dropped, as the template does)."""
    words = [("lantern", "a light with a transparent case"), ("cycloserine", LONG)]
    kw = dict(dict_frac=1.0, dict_draw=lambda rng: rng.choice(words), name_words=["meaning", "word", "lamp", "river"],
              list_tools=True, think_frac=1.0)
    for msgs, tools, thinking in V3.tool_conversations_v3e(random.Random(0), words, [("Peru", "Lima")], ARITH,
                                                           SHORT["v3_opposite"], EXCLUDE, 60, lookups=(3,), **kw):
        lq = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        if thinking and sum(m["role"] == "tool" for m in msgs) >= 2 and msgs[-2]["role"] == "tool" \
                and "reasoning_content" in msgs[-1]:
            for m in msgs[:lq]:
                m.pop("reasoning_content", None)
            return msgs, tools
    raise AssertionError("no conversation of two look-ups")


def _trained(text, spans):
    return ["".join(text[a:b]) for a, b in spans]


def test_v3j_leaves_history_replies_to_a_tool_result_untrained_and_the_rest_as_v3i():
    msgs, tools = _look_ups()
    render = C.Renderer()
    text_i, spans_i = C.render_doc(render, msgs, tools, True, check=True)
    text_j, spans_j = C.render_doc(render, msgs, tools, True, check=True, history_after_tool=False)
    assert text_j == text_i                       # the same document, only what is trained differs
    bare = [a for a, _ in spans_i if text_i[:a].endswith(BARE)]
    assert bare and not [a for a, _ in spans_j if text_j[:a].endswith(BARE)]
    assert spans_j == [s for s in spans_i if s[0] not in bare]
    # the last reply, which starts where the app's prompt ends (after "<think>\n"), is still trained
    assert spans_j[-1] == spans_i[-1] and text_j[: spans_j[-1][0]].endswith("<|im_start|>assistant\n<think>\n")
    assert msgs[-1]["reasoning_content"] in _trained(text_j, spans_j)[-1]


def test_the_v3j_check_refuses_a_trained_reply_to_a_tool_result_without_a_thought(tmp_path):
    import check_v3

    msgs, tools = _look_ups()
    render = C.Renderer()
    docs = V3G_GOOD + [("drill", _span_doc("a place of refuge and comfort"))]
    for history, named in ((False, None), (True, "trains a reply to a tool's result without a thought")):
        work = _v3i_corpus(tmp_path / str(history), docs, 10, 20)
        stats = json.loads((work / "corpus" / "stats.json").read_text())
        (work / "corpus" / "stats.json").write_text(json.dumps({**stats, "variant": "v3j"}))
        text, spans = C.render_doc(render, msgs, tools, True, history_after_tool=history)
        with open(work / "corpus" / "docs.jsonl", "a") as f:
            f.write(json.dumps({"kind": "tools", "text": text, "spans": spans}) + "\n")
        base, problems = check_v3.check_v3i(work, V3I_SMALL, variant="v3j"), check_v3.check_v3j(work, V3I_SMALL)
        assert problems[: len(base)] == base   # v3i's checks first, as they were
        added = problems[len(base):]
        assert (added == []) if named is None else (len(added) == 1 and named in added[0]), added


def test_v3j_is_registered_and_is_v3i_with_the_history_untrained():
    import check_v3
    import prepare_v3

    assert CV3.VARIANTS["v3j"] == {**CV3.VARIANTS["v3i"], "untrained_tool_history": True}
    assert "untrained_tool_history" not in CV3.VARIANTS["v3i"]
    assert "v3j" in prepare_v3.WORKS and "v3j" in check_v3.CHECKS and "v3j" in check_v3.LIMITS
