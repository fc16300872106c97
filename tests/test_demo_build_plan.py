"""scripts/demo_model/build.py's plan, without training: the commands it would run for a variant
(subprocess.run recorded, not run). v3m reads only its own corpus; the shipped v3 and the v3n-ft
candidate keep v3m's four phases, prepare v3n beside it, draw their lean folder from it, resume the
lean from V3D packed int8 per row (as the calls resumed from the bundled weights) and train the head
alone on the whole v3n corpus; the candidate exports beside models/demo, never into it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "demo_model"))
import build  # noqa: E402


def _plan(monkeypatch, tmp_path, variant, stages):
    calls, exported = [], []
    monkeypatch.setattr(build.subprocess, "run", lambda cmd, **kw: calls.append([str(c) for c in cmd]))
    import export

    monkeypatch.setattr(export, "export", lambda run, cfg, tok, out, **kw: exported.append(Path(out)))
    build.main(["--variant", variant, "--work", str(tmp_path), "--stages", *stages])
    return calls, exported


def _arg(cmd, flag):
    """The value argparse keeps: the last one given."""
    return [cmd[i + 1] for i, c in enumerate(cmd) if c == flag][-1]


def _trains(calls):
    return {_arg(c, "--name"): c for c in calls if c[1].endswith("train_torch.py")}


def _assert_v3m_phases_kept(monkeypatch, tmp_path, trains):
    """v3m's four phases as its own build runs them."""
    v3m, _ = _plan(monkeypatch, tmp_path, "v3m", ["train"])
    for name, cmd in _trains(v3m).items():
        assert trains[name][trains[name].index("--name"):] == cmd[cmd.index("--name"):]


def test_v3n_ft_leans_on_v3n_and_keeps_the_shipped_phases(monkeypatch, tmp_path):
    calls, _ = _plan(monkeypatch, tmp_path, "v3n-ft", ["corpus", "tokenizer", "train"])
    prepared = [_arg(c, "--variant") for c in calls if c[1].endswith("prepare_v3.py")]
    assert prepared == ["v3m", "v3n"]
    (mix,) = [c for c in calls if c[1].endswith("finetune_mix.py")]
    assert _arg(mix, "--data") == str(tmp_path / "v3n" / "data")
    assert _arg(mix, "--out") == str(tmp_path / "v3n" / "ft_data")
    assert (_arg(mix, "--tokens"), _arg(mix, "--seed"), _arg(mix, "--shares")) == ("1300000", "41", "tools=0.6,drill=0.1,rest=0.3")

    trains = _trains(calls)
    assert list(trains) == ["V3A", "V3B", "V3C", "V3D", "V3E", "V3F"]
    _assert_v3m_phases_kept(monkeypatch, tmp_path, trains)
    lean, head = trains["V3E"], trains["V3F"]
    assert _arg(lean, "--data") == str(tmp_path / "v3n" / "ft_data")
    assert _arg(lean, "--resume").endswith("V3Dq8")
    assert [c for c in calls if c[1].endswith("shards_q8.py")][0][2] == "pack"
    assert (_arg(lean, "--seq"), _arg(lean, "--batch"), _arg(lean, "--max-steps"), _arg(lean, "--lr")) == ("2048", "4", "127", "1e-4")
    assert "--head-only" not in lean
    assert _arg(head, "--data") == str(tmp_path / "v3n" / "data")
    assert _arg(head, "--resume").endswith("V3E")
    assert "--head-only" in head and _arg(head, "--accept-w") == "1.0" and _arg(head, "--max-steps") == "57"


def test_the_shipped_v3_is_v3m_leaned_on_the_gpu(monkeypatch, tmp_path):
    calls, _ = _plan(monkeypatch, tmp_path, "v3", ["corpus", "tokenizer", "train"])
    assert [_arg(c, "--variant") for c in calls if c[1].endswith("prepare_v3.py")] == ["v3m", "v3n"]
    (mix,) = [c for c in calls if c[1].endswith("finetune_mix.py")]
    assert _arg(mix, "--out") == str(tmp_path / "v3n" / "ft_data4")
    assert (_arg(mix, "--tokens"), _arg(mix, "--seed"), _arg(mix, "--shares")) == ("4200000", "41", "tools=0.6,drill=0.1,rest=0.3")
    trains = _trains(calls)
    assert list(trains) == ["V3A", "V3B", "V3C", "V3D", "V3G", "V3H"]
    _assert_v3m_phases_kept(monkeypatch, tmp_path, trains)
    lean, head = trains["V3G"], trains["V3H"]
    assert _arg(lean, "--data") == str(tmp_path / "v3n" / "ft_data4") and _arg(lean, "--resume").endswith("V3Dq8")
    # the call's shape and schedule (gpu_v3.sh leans: LEANS="91:2e-4" EXTRA="--accept-w 1.5")
    assert [_arg(lean, f) for f in ("--seq", "--batch", "--max-steps", "--lr", "--warmup", "--seed", "--accept-w")] == \
        ["4096", "16", "91", "2e-4", "10", "38", "1.5"]
    assert "--head-only" not in lean
    assert _arg(head, "--data") == str(tmp_path / "v3n" / "data") and _arg(head, "--resume").endswith("V3G")
    assert "--head-only" in head
    assert [_arg(head, f) for f in ("--max-steps", "--lr", "--warmup", "--seed", "--accept-w")] == ["500", "3e-4", "20", "36", "1.0"]


def test_v3m_reads_only_its_own_corpus(monkeypatch, tmp_path):
    calls, _ = _plan(monkeypatch, tmp_path, "v3m", ["corpus", "tokenizer", "train"])
    assert [_arg(c, "--variant") for c in calls if c[1].endswith("prepare_v3.py")] == ["v3m"]
    assert not [c for c in calls if c[1].endswith("finetune_mix.py")]
    assert {_arg(c, "--data") for c in _trains(calls).values()} == {str(tmp_path / "data")}


@pytest.mark.parametrize("variant, beside", [("v3", None), ("v3m", None), ("v3n-ft", "v3n-ft/model")])
def test_a_candidate_exports_beside_the_shipped_demo(monkeypatch, tmp_path, variant, beside):
    _, exported = _plan(monkeypatch, tmp_path, variant, ["export"])
    assert exported == [REPO / "models" / "demo" if beside is None else tmp_path / beside]
