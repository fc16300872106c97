"""Demo v3k's data (conversations_v3.VARIANTS["v3k"], check_v3.check_v3k; V3_PLAN section 27): a
history reply to a tool's result is read but weighs 0 in the loss (mask.npy 2, a document's "quiet"
spans), where v3j weighed it as a prompt (0.3). Fast: no WordNet; the conversations are everyday_v3's
own, rendered with the demo's template and encoded with its tokenizer file."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "demo_model"))
sys.path.insert(0, str(REPO))

import conversations as C  # noqa: E402
import conversations_v3 as CV3  # noqa: E402
from tests.test_demo_v3g import V3G_GOOD  # noqa: E402
from tests.test_demo_v3h import _span_doc  # noqa: E402
from tests.test_demo_v3i import V3I_SMALL, _v3i_corpus  # noqa: E402
from tests.test_demo_v3j import BARE, _look_ups  # noqa: E402


def _v3k_doc():
    msgs, tools = _look_ups()
    quiet = []
    text, spans = C.render_doc(C.Renderer(), msgs, tools, True, check=True, history_after_tool=False, quiet=quiet)
    return {"kind": "tools", "text": text, "spans": spans, "quiet": quiet}


def test_v3k_reads_the_history_replies_to_a_tool_result_and_weighs_them_0():
    from tokenizers import Tokenizer

    import tokenizer as T

    msgs, tools = _look_ups()
    render = C.Renderer()
    text_i, spans_i = C.render_doc(render, msgs, tools, True)
    doc = _v3k_doc()
    bare = [s for s in spans_i if text_i[: s[0]].endswith(BARE)]
    # the same text; the replies v3i trained and v3j left as context are now quiet, the rest as v3j's
    assert doc["text"] == text_i and bare and doc["quiet"] == bare
    assert doc["spans"] == [s for s in spans_i if s not in bare]
    enc = Tokenizer.from_file(str(REPO / "models" / "demo" / "tokenizer.json")).encode(doc["text"], add_special_tokens=False)
    mask = T.doc_mask(enc.offsets, doc)
    starts = np.array([o[0] for o in enc.offsets])
    in_quiet = np.zeros(len(starts), bool)
    for a, b in bare:
        in_quiet |= (starts >= a) & (starts < b)
    assert set(np.unique(mask)) == {0, 1, 2} and ((mask == 2) == in_quiet).all()
    # a quiet reply's tokens spell the reply (its answer and <|im_end|>), and the last reply is still written
    first = "".join(doc["text"][enc.offsets[k][0]: enc.offsets[k][1]] for k in np.flatnonzero(mask == 2))
    assert doc["text"][bare[0][0]: bare[0][1]] in first and first.count("<|im_end|>") == len(bare)
    assert mask[-3:].tolist() == [1, 1, 1] or mask[-1] == 1


def test_the_loss_weighs_read_only_tokens_0_and_the_acceptance_term_skips_them(tmp_path):
    import windows

    tokens = np.arange(1, 13, dtype=np.uint16)
    mask = np.array([0, 0, 1, 1, 2, 2, 0, 1, 2, 0, 1, 0], np.uint8)
    for name, arr in (("tokens", tokens), ("mask", mask), ("docs", np.array([0, 6], np.int64))):
        np.save(tmp_path / f"{name}.npy", arr)
    ids, w, _ = next(windows.packed_windows(tmp_path, 1, 16, np.random.default_rng(0)))
    order = {int(t): k for k, t in enumerate(ids[0].tolist()) if t in tokens}
    weights = np.array(windows.loss_weights(0.3))[w][0]
    for t, m in zip(tokens, mask):
        assert float(weights[order[int(t)]]) == pytest.approx({0: 0.3, 1: 1.0, 2: 0.0}[int(m)])
    assert int((w == 2).sum()) == int((mask == 1).sum())   # the acceptance term's tokens: the written only
    assert (ids[0][w[0] == 0] == windows.PAD).all() and (weights[w[0] == 0] == 0).all()  # padding


def test_the_v3k_check_refuses_a_history_reply_to_a_tool_result_that_is_not_quiet(tmp_path):
    import check_v3

    docs = V3G_GOOD + [("drill", _span_doc("a place of refuge and comfort"))]
    good = _v3k_doc()
    for flaw, doc, encoded, named in (
            ("none", good, [1, 2, 0], None),
            ("v3j's form", {k: v for k, v in good.items() if k != "quiet"}, [1, 2, 0], "that is not quiet"),
            ("encoded without them", good, [1, 1, 0], "did not reach the encoding")):
        work = _v3i_corpus(tmp_path / flaw.replace(" ", "_").replace("'", ""), docs, 10, 20)
        mask = np.load(work / "data" / "mask.npy")
        np.save(work / "data" / "mask.npy", np.append(mask[: -len(encoded)], encoded).astype(np.uint8))
        stats = json.loads((work / "corpus" / "stats.json").read_text())
        (work / "corpus" / "stats.json").write_text(json.dumps({**stats, "variant": "v3k"}))
        with open(work / "corpus" / "docs.jsonl", "a") as f:
            f.write(json.dumps(doc) + "\n")
        base, problems = check_v3.check_v3j(work, V3I_SMALL, variant="v3k"), check_v3.check_v3k(work, V3I_SMALL)
        assert problems[: len(base)] == base   # v3j's checks first, as they were
        added = problems[len(base):]
        if named is None:
            assert added == [], added
        else:
            assert len(added) == 1 + (flaw == "v3j's form") and named in added[0], added
            assert flaw != "v3j's form" or "no quiet span" in added[1]


def test_reply_tokens_count_what_is_written_not_what_is_read_only(tmp_path):
    import check_v3

    (tmp_path / "data").mkdir()
    (tmp_path / "corpus").mkdir()
    np.save(tmp_path / "data" / "mask.npy", np.array([1, 2, 2, 0, 1, 1, 2, 0], np.uint8))
    np.save(tmp_path / "data" / "docs.npy", np.array([0, 4], np.int64))
    (tmp_path / "corpus" / "docs.jsonl").write_text('{"kind": "tools"}\n{"kind": "chat"}\n')
    assert check_v3.reply_tokens_by_kind(tmp_path) == {"tools": 1, "chat": 2, "total": 3}


def test_v3k_is_registered_and_leaves_v3j_as_it_was():
    import check_v3
    import prepare_v3

    assert CV3.VARIANTS["v3k"] == {**CV3.VARIANTS["v3j"], "quiet_tool_history": True}
    assert "quiet_tool_history" not in CV3.VARIANTS["v3j"]
    assert "v3k" in prepare_v3.WORKS and "v3k" in check_v3.CHECKS and check_v3.LIMITS["v3k"] == check_v3.LIMITS["v3j"]


def test_v3l_trains_the_answer_after_a_call_sent_back_without_its_thought():
    """The openai client sends a call back without its reasoning, so the template renders it bare and
    the app's prompt then opens `<think>\\n`: v3l trains the thinking answer there, and leaves the
    bare call (which the model wrote after a thought) as context."""
    import check_v3

    msgs, tools = _look_ups()
    lq = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    for m in msgs[lq:-1]:
        m.pop("reasoning_content", None)
    quiet = []
    text, spans = C.render_doc(C.Renderer(), msgs, tools, True, check=True, history_after_tool=False, quiet=quiet)
    call = text.rindex("<|im_start|>user\n" + msgs[lq]["content"])
    call = text.index("<|im_start|>assistant\n", call) + len("<|im_start|>assistant\n")
    assert text.startswith("<tool_call>", call)                  # rendered bare, as a client's history
    assert call in [a for a, _ in quiet] and call not in [a for a, _ in spans]
    last = spans[-1][0]
    assert text[:last].endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert msgs[-1]["reasoning_content"] in text[last: spans[-1][1]]
    assert [m.end() for m in check_v3.AFTER_BARE_CALL.finditer(text)] == [last]


def test_v3l_is_registered_and_leaves_v3k_as_it_was():
    import check_v3
    import prepare_v3

    assert CV3.VARIANTS["v3l"] == {**CV3.VARIANTS["v3k"], "client_drops_thoughts": 0.5}
    assert "v3l" in prepare_v3.WORKS and "v3l" in check_v3.CHECKS
    assert check_v3.LIMITS["v3l"] == {**check_v3.LIMITS["v3k"], "after_bare_call_min": 2000, "listed_min": 0.35}
