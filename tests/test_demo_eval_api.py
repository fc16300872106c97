"""scripts/bench/eval_api.py end to end on the bundled demo: the real server started and
killed by the script, the official openai client's json_schema and LangChain's json_mode."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain_openai")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "bench"))

import eval_api  # noqa: E402


def test_eval_api_reports_both_measures_through_the_server(tmp_path):
    out = tmp_path / "api.json"
    assert eval_api.main([str(REPO / "models" / "demo"), "--n", "3", "--max-tokens", "40", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    js, jm = res["json_schema"], res["json_mode"]
    assert js["requests"] == 3 and len(js["rows"]) == 3 and jm["requests"] == 3
    for r in js["rows"]:
        # the grammar holds: every reply that ended parses and has both keys of their types
        assert r["finish"] in ("stop", "length") and (r["valid"] or r["finish"] == "length"), r
    assert js["valid_and_closed"] == sum(r["valid"] and r["closed"] for r in js["rows"])
    assert jm["objects"] == sum(r["ok"] for r in jm["rows"]) and jm["asked"] <= jm["objects"]
    assert all(r["asked"] == (isinstance(r["object"], dict) and r["object"].get("word") == r["word"]) for r in jm["rows"])
