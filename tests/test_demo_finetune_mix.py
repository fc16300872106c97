"""scripts/demo_model/finetune_mix.py on a small hand-made encoded corpus: whole documents, each
with its own mask, drawn by kind to the asked shares; a corpus that does not match its folder, or
shares that do not add up, stop with a clear message. Fast: numpy only, no tokenizer, no model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "demo_model" / "finetune_mix.py"


def _encoded(tmp_path: Path):
    """30 documents of three kinds; a document's tokens all equal its index + 1, its mask its
    index's parity, its last token 0 as encode_corpus ends each one."""
    kinds = ["tools"] * 10 + ["drill"] * 10 + ["chat"] * 10
    rng = np.random.default_rng(0)
    docs = [np.append(np.full(int(rng.integers(20, 60)), i + 1, np.uint16), 0) for i in range(len(kinds))]
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "tokens.npy", np.concatenate(docs).astype(np.uint16))
    np.save(data / "mask.npy", np.concatenate([np.full(len(d), i % 2, np.uint8) for i, d in enumerate(docs)]))
    np.save(data / "docs.npy", np.cumsum([0] + [len(d) for d in docs[:-1]]).astype(np.int64))
    (data / "eval_prompts.json").write_text("[]")
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"kind": k, "text": "", "spans": []}) + "\n" for k in kinds))
    return data, corpus, kinds


def _run(data, corpus, out, shares, tokens=3000):
    return subprocess.run([sys.executable, str(SCRIPT), "--data", str(data), "--corpus", str(corpus),
                           "--shares", shares, "--tokens", str(tokens), "--seed", "3", "--out", str(out)],
                          capture_output=True, text=True)


def test_documents_are_whole_and_kinds_hold_their_shares(tmp_path):
    data, corpus, kinds = _encoded(tmp_path)
    out = tmp_path / "mix"
    r = _run(data, corpus, out, "tools=0.6,rest=0.4")
    assert r.returncode == 0, r.stderr
    tokens, mask, starts = (np.load(out / f) for f in ("tokens.npy", "mask.npy", "docs.npy"))
    ends = np.append(starts[1:], len(tokens))
    by_kind = {}
    for s, e in zip(starts, ends):
        doc = tokens[s:e]
        i = int(doc[0]) - 1
        # one source document, whole: its tokens, its closing 0 and its own mask
        assert (doc[:-1] == i + 1).all() and doc[-1] == 0
        assert (mask[s:e] == i % 2).all()
        by_kind[kinds[i]] = by_kind.get(kinds[i], 0) + (e - s)
    total = len(tokens)
    assert total >= 3000 and abs(by_kind["tools"] / total - 0.6) < 0.05
    assert by_kind["drill"] + by_kind["chat"] == total - by_kind["tools"] and by_kind["drill"] and by_kind["chat"]
    info = json.loads((out / "data_info.json").read_text())
    assert info["tokens"] == total and info["tokens_by_kind"]["tools"] == by_kind["tools"]
    assert (out / "eval_prompts.json").exists()
    # tools (~400 tokens) asked for 1,800: every tools document repeats before any comes a fourth time
    counts = np.bincount([int(tokens[s]) - 1 for s in starts], minlength=30)[:10]
    assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("shares, says", [("tools=0.5,rest=0.4", "add up to 0.900"),
                                          ("tools", "is not kind=share"),
                                          ("poems=0.5,rest=0.5", "which no document has")])
def test_bad_shares_say_what_is_wrong(tmp_path, shares, says):
    data, corpus, _ = _encoded(tmp_path)
    r = _run(data, corpus, tmp_path / "mix", shares)
    assert r.returncode != 0 and says in r.stderr
    assert not (tmp_path / "mix" / "tokens.npy").exists()


def test_a_corpus_that_is_not_the_folders_stops(tmp_path):
    data, corpus, _ = _encoded(tmp_path)
    corpus.write_text(corpus.read_text() + json.dumps({"kind": "chat", "text": "", "spans": []}) + "\n")
    r = _run(data, corpus, tmp_path / "mix", "tools=1")
    assert r.returncode != 0 and "not the same corpus" in r.stderr
