"""scripts/bench/bench_models.py: two checkpoints' MTP/AR paired in one process. The comparison's
arithmetic on made-up runs (a model whose MTP lane is twice as fast per repeat is 2x its base,
whatever the host did to that repeat), and one short real run on two tiny checkpoints: the
report has both models and their paired quotient. No timing is asserted."""
from __future__ import annotations

import json

import pytest

from scripts.bench.bench_models import compare, main
from tests._engine_helpers import MIXED, SURE


def _runs(ar_tps, mtp_tps, tokens=33):
    def run(tps):
        return {"tokens": tokens, "decode_seconds": (tokens - 1) / tps, "tokens_per_second": tps}
    return {"ar": [run(t) for t in ar_tps], "mtp": [run(t) for t in mtp_tps]}


def test_the_quotient_is_paired_by_repeat():
    host = [50.0, 100.0, 20.0, 80.0, 60.0]            # the host's speed, repeat by repeat
    base = _runs(host, [1.5 * h for h in host])
    twice = _runs([0.5 * h for h in host], [1.5 * h for h in host])   # AR half as fast: MTP/AR 3.0x
    c = compare(base, twice)
    assert c["median"] == pytest.approx(2.0) and c["pooled"] == pytest.approx(2.0)
    assert c["median_95"] == pytest.approx([2.0, 2.0]) and c["pooled_95"] == pytest.approx([2.0, 2.0])
    same = compare(base, base)
    assert same["median"] == pytest.approx(1.0) and same["per_repeat"] == pytest.approx([1.0] * 5)
    noisy = _runs(host, [1.5 * h * f for h, f in zip(host, [0.8, 1.2, 1.0, 0.9, 1.1])])
    lo, hi = compare(base, noisy)["median_95"]
    assert lo < 1.0 < hi


def test_a_short_run_on_two_tiny_checkpoints(tiny_checkpoint, tmp_path, capsys):
    a, b = tiny_checkpoint(**MIXED), tiny_checkpoint(**SURE)
    out = tmp_path / "report.json"
    assert main(["--model", str(a), "--model", str(b), "--prompt", "Tell me a story",
                 "--max-tokens", "8", "--depth", "2", "--repeats", "2", "--temperature", "0.6",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    first, second = report["models"]
    assert first["path"] == str(a) and second["path"] == str(b) and "over_base" not in first
    assert len(second["over_base"]["per_repeat"]) == 2 and second["over_base"]["median"] > 0
    assert all(len(m["runs"][lane]) == 2 for m in report["models"] for lane in ("ar", "mtp"))
    assert report["depth"] == 2 and report["platform"]["mlx"]
    assert json.loads(capsys.readouterr().out)[1]["over_base"]["median"] == second["over_base"]["median"]


def test_one_model_or_auto_depth_is_refused_with_what_to_pass(tiny_checkpoint):
    a = tiny_checkpoint(**MIXED)
    with pytest.raises(SystemExit):
        main(["--model", str(a)])
    with pytest.raises(SystemExit):
        main(["--model", str(a), "--model", str(a), "--depth", "auto"])
