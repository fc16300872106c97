"""scripts/bench/bench_grid.py: bench.py's paired benchmark for each temperature x depth in one
process. One short real run on a tiny checkpoint: a report per pair, named by the pattern, each with
its own sampler and depth, the checkpoint loaded once; at T = 0 the MTP lane's text is AR's. No
timing is asserted."""
from __future__ import annotations

import json

import pytest

from scripts.bench import bench
from scripts.bench.bench_grid import main
from tests._engine_helpers import MIXED


def test_a_report_per_pair_from_one_load(tiny_checkpoint, tmp_path, monkeypatch):
    model = tiny_checkpoint(**MIXED)
    loads = []
    real = bench.load_adapter
    monkeypatch.setattr(bench, "load_adapter", lambda *a, **k: loads.append(a) or real(*a, **k))
    monkeypatch.setattr(bench, "_LOADED", {})
    assert main(["--model", str(model), "--temperatures", "0", "0.6", "--depths", "1", "2",
                 "--json", str(tmp_path / "g_t{t}_d{d}.json"), "--", "--prompt", "Tell me a story",
                 "--max-tokens", "8", "--repeats", "1", "--no-mlx-lm"]) == 0
    assert len(loads) == 1
    for t in ("0", "0.6"):
        for d in (1, 2):
            r = json.loads((tmp_path / f"g_t{t}_d{d}.json").read_text())
            assert r["sampler"]["temperature"] == float(t) and r["mtp"]["depth"] == d
            assert r["repeats"] == 1 and "mlx_lm" not in r
            if t == "0":
                assert r["mtp"]["sample_text"] == r["ar"]["sample_text"]


@pytest.mark.parametrize("argv, said", [
    (["--json", "out.json"], "{t} and {d}"),
    (["--json", "o_{t}_{d}.json", "--", "--depth", "3"], "--depth is set by this script"),
])
def test_what_would_overwrite_or_clash_is_refused(argv, said, capsys):
    with pytest.raises(SystemExit):
        main(["--model", "m", "--temperatures", "0", "--depths", "1", *argv])
    assert said in capsys.readouterr().err
