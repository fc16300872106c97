"""scripts/checkpoints/inspect_model.py and scripts/checkpoints/inspect_mtp_weights.py on good and broken checkpoints.

The main cases run the scripts as subprocesses, all started at once (each pays ~3 s of
imports); the remaining variants call the same ``main(argv)`` in-process.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from scripts.checkpoints import inspect_model, inspect_mtp_weights

REPO = Path(__file__).resolve().parent.parent
SIDECAR = Path("optiq") / "mtp.safetensors"


def _break_sidecar(path: Path) -> None:
    """One missing, one extra, one wrongly shaped tensor."""
    f = path / SIDECAR
    t = dict(mx.load(str(f)))
    del t["mtp.norm.weight"]
    t["mtp.layers.1.input_layernorm.weight"] = mx.zeros((64,), dtype=mx.bfloat16)
    t["mtp.layers.0.mlp.up_proj.weight"] = t["mtp.layers.0.mlp.up_proj.weight"][:, :4]
    mx.save_safetensors(str(f), t, metadata={"format": "mlx"})


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


@pytest.fixture(scope="module")
def runs(tiny_checkpoint):
    """{(script, case): CompletedProcess-like (rc, out)} for the subprocess cases, run concurrently."""
    good = tiny_checkpoint()
    broken = tiny_checkpoint(fresh=True)
    _break_sidecar(broken)
    cases = {
        ("model", "good"): good,
        ("model", "broken_sidecar"): broken,
        ("weights", "good"): good,
        ("weights", "broken_sidecar"): broken,
    }
    script = {"model": "inspect_model.py", "weights": "inspect_mtp_weights.py"}
    env = dict(os.environ, PYTHONPATH="")
    procs = {
        key: subprocess.Popen([sys.executable, str(REPO / "scripts" / "checkpoints" / script[key[0]]), "--model", str(p)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              cwd="/")  # not the repo root: the scripts find it themselves
        for key, p in cases.items()
    }
    out = {}
    for key, proc in procs.items():
        stdout, _ = proc.communicate(timeout=120)
        out[key] = (proc.returncode, stdout, cases[key])
    return out


def _in_process(module, capsys, *argv):
    rc = module.main([str(a) for a in argv])
    return rc, capsys.readouterr().out


# --------------------------------------------------------------------------- inspect_model
def test_inspect_model_good(runs):
    rc, out, path = runs[("model", "good")]
    assert rc == 0, out
    for line in (
        f"checkpoint: {path}",
        "family: qwen3_5 (HybridAdapter)",
        "layout: mlx + sidecar; head from optiq/mtp.safetensors",
        "backend: mlx",  # inspect loads the trunk as stored (native), so MLX's own ops
        "hidden size: 64",
        "vocab size: 512",
        "trunk layers: 4 = 2 Gated-DeltaNet (L) + 2 full attention (A): LALA",
        "MTP layers: 1",
        "hidden variant: pre_norm (config)",
        "concat order: embedding_hidden (config)",
        "norm convention: zero_centered (config)",
        "trunk quantization: 4-bit, group_size 32, affine",
        "MTP head quantization: 4-bit, group_size 32; 29 tensors in optiq/mtp.safetensors",
        "lm_head: tied to embed_tokens",
        "OK: nothing flagged.",
    ):
        assert line in out.splitlines(), (line, out)
    assert re.search(r"^contract: MTPContract\(hidden_size=64, vocab_size=512, num_layers=4 \[LALA", out, re.M)
    assert "FLAG" not in out and "Traceback" not in out


def test_inspect_model_broken_sidecar(runs):
    rc, out, path = runs[("model", "broken_sidecar")]
    assert rc == 1, out
    assert "Traceback" not in out
    flag = next(l for l in out.splitlines() if l.startswith("FLAG: "))
    assert "Missing tensors: mtp.norm.weight." in flag
    assert "Unexpected tensors: mtp.layers.1.input_layernorm.weight." in flag
    # still tells what config.json says, and where to look next
    assert "from config.json alone (the adapter did not load):" in out
    assert "  hidden_size: 64" in out and "  layer kinds: LALA (2 Gated-DeltaNet + 2 attention)" in out
    assert "inspect_mtp_weights.py --model" in out


def test_inspect_model_variants(tiny_checkpoint, capsys):
    path = tiny_checkpoint(tie_word_embeddings=False, bits=8, quantize_fc=True, mtp_bits=8,
                           key_prefix="language_model.", write_convention_keys=False,
                           sidecar_keys="none")
    rc, out = _in_process(inspect_model, capsys, "--model", path)
    assert rc == 0, out
    lines = out.splitlines()
    assert "trunk quantization: 8-bit, group_size 32, affine" in lines
    assert "MTP head quantization: 8-bit, group_size 32; 31 tensors in optiq/mtp.safetensors" in lines
    assert "lm_head: own weights (untied)" in lines
    assert "hidden variant: pre_norm (Qwythos default)" in lines
    assert "concat order: embedding_hidden (Qwythos default)" in lines
    assert any(l.startswith("norm convention: zero_centered (detected, mean ") for l in lines)
    # notes do not fail the run; they say what was assumed
    assert any(l.startswith("note: config.json has no mtp_norm_convention") for l in lines)
    assert any(l.startswith("note: the sidecar was found at a default location") for l in lines)

    rc, out = _in_process(inspect_model, capsys, "--model", path, "--hidden-variant", "post_norm")
    assert rc == 0 and "hidden variant: post_norm (override)" in out.splitlines()

    rc, out = _in_process(inspect_model, capsys, "--model", tiny_checkpoint(bits=None, num_layers=8,
                                                                           full_attention_interval=4))
    assert rc == 0
    assert "trunk layers: 8 = 6 Gated-DeltaNet (L) + 2 full attention (A): LLLALLLA" in out
    assert "trunk quantization: none (float)" in out


def test_inspect_model_flags_config_disagreements(tiny_checkpoint, capsys):
    """Loads fine, but config.json contradicts what is on disk: flagged, exit 1."""
    path = tiny_checkpoint(fresh=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["mtp_norm_convention"] = "standard"  # the stored norms are zero-centred
    cfg["mtp_tensor_count"] = 31
    (path / "config.json").write_text(json.dumps(cfg))
    rc, out = _in_process(inspect_model, capsys, "--model", path)
    assert rc == 1
    flags = [l for l in out.splitlines() if l.startswith("FLAG: ")]
    assert any("mtp_norm_convention 'standard' but the norm weights look zero_centered" in f for f in flags)
    assert any("mtp_tensor_count 31, the sidecar holds 29" in f for f in flags)
    assert "2 problem(s) flagged." in out


def test_inspect_model_errors(tiny_checkpoint, capsys, tmp_path):
    rc, out = _in_process(inspect_model, capsys, "--model", tmp_path / "nowhere")
    assert rc == 1 and out.startswith("FLAG: No checkpoint directory")
    rc, out = _in_process(inspect_model, capsys, "--model", tiny_checkpoint(write_sidecar=False))
    assert rc == 1 and "has no MTP head" in out
    with pytest.raises(SystemExit) as info:
        inspect_model.main([])
    assert info.value.code == 2
    capsys.readouterr()


# --------------------------------------------------------------------------- inspect_mtp_weights
def _table(out: str) -> dict:
    """name -> (dtype, stored, logical, status) from the tensor table."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(mtp\.\S+)\s+(\S+)\s+(\[[^\]]*\]|-)\s+(\[[^\]]*\])?\s*(\S+)$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3), m.group(4) or "", m.group(5))
    return rows


def test_inspect_mtp_weights_good(runs):
    rc, out, path = runs[("weights", "good")]
    assert rc == 0, out
    lines = out.splitlines()
    assert "sidecar: optiq/mtp.safetensors (registered in config.json as mlx_lm_extra_tensors.mtp_file, mtp_file)" in lines
    assert "tensors: 29 (config.json mtp_tensor_count: 29)" in lines
    assert any(l.startswith("head quantization: bits=4, group_size=32 (config.json mtplx_mtp_quantization)")
               for l in lines)
    assert any(l.startswith("norm convention: zero_centered (config); magnitude heuristic: zero_centered")
               for l in lines)
    rows = _table(out)
    assert len(rows) == 29
    assert rows["mtp.fc.weight"] == ("bfloat16", "[64, 128]", "[64, 128]", "ok")
    assert rows["mtp.norm.weight"] == ("bfloat16", "[64]", "[64]", "ok")
    assert rows["mtp.layers.0.self_attn.q_proj.weight"] == ("uint32", "[128, 8]", "[128, 64]", "ok")
    assert rows["mtp.layers.0.self_attn.q_proj.scales"] == ("bfloat16", "[128, 2]", "", "ok")
    assert rows["mtp.layers.0.mlp.down_proj.weight"] == ("uint32", "[64, 16]", "[64, 128]", "ok")
    assert lines[-1] == "OK: 29 tensors match a one-layer Qwen3.5 MTP head."


def test_inspect_mtp_weights_broken_sidecar_lists_then_flags(runs):
    rc, out, path = runs[("weights", "broken_sidecar")]
    assert rc == 1, out
    assert "Traceback" not in out
    rows = _table(out)
    assert len(rows) == 30  # the 29 stored (28 expected + 1 extra) and the missing one
    assert "tensors: 29 (config.json mtp_tensor_count: 29)" in out.splitlines()
    assert rows["mtp.layers.1.input_layernorm.weight"][3] == "unexpected"
    assert rows["mtp.layers.0.mlp.up_proj.weight"] == ("uint32", "[128, 4]", "[128, 32]", "shape")
    assert rows["mtp.norm.weight"] == ("-", "-", "", "MISSING")
    assert rows["mtp.fc.weight"][3] == "ok"
    flags = [l for l in out.splitlines() if l.startswith("FLAG: ")]
    assert "FLAG: missing tensor 'mtp.norm.weight' (expected shape [64])" in flags
    assert "FLAG: unexpected tensor 'mtp.layers.1.input_layernorm.weight' [64]" in flags
    assert any("tensor 'mtp.layers.0.mlp.up_proj.weight' has shape [128, 4], expected [128, 8] "
               "(quantized with bits=4, group_size=32)" in f for f in flags)
    assert len(flags) == 3
    assert out.splitlines()[-1].startswith("3 problem(s) flagged")


def test_inspect_mtp_weights_does_not_read_the_trunk(tiny_checkpoint, capsys):
    path = tiny_checkpoint(fresh=True)
    _truncate(path / "model.safetensors")
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", path)
    assert rc == 0, out
    assert "OK: 29 tensors" in out
    rc, out = _in_process(inspect_model, capsys, "--model", path)
    assert rc == 1 and "model.safetensors is corrupt or truncated" in out


def test_inspect_mtp_weights_variants(tiny_checkpoint, capsys):
    path = tiny_checkpoint(quantize_fc=True, mtp_bits=8, key_prefix="language_model.",
                           sidecar_path="heads/draft.safetensors", sidecar_keys="extra")
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", path)
    assert rc == 0, out
    lines = out.splitlines()
    assert "sidecar: heads/draft.safetensors (registered in config.json as mlx_lm_extra_tensors.mtp_file)" in lines
    assert "key prefix: 'language_model.' (normalised to 'mtp.')" in lines
    assert "tensors: 31 (config.json mtp_tensor_count: 31)" in lines
    rows = _table(out)
    assert rows["mtp.fc.weight"] == ("uint32", "[64, 32]", "[64, 128]", "ok")
    assert rows["mtp.fc.scales"] == ("bfloat16", "[64, 4]", "", "ok")

    # unquantized head, unregistered at the top-level default, no convention keys
    path = tiny_checkpoint(mtp_bits=None, sidecar_path="mtp.safetensors", sidecar_keys="none",
                           write_convention_keys=False, zero_centered_norms=False)
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", path)
    assert rc == 0, out
    lines = out.splitlines()
    assert "sidecar: mtp.safetensors (default location, not registered in config.json)" in lines
    assert "head quantization: none (float linears)" in lines
    assert any(re.match(r"norm convention: standard \(detected, mean [01]\.\d{3}; config.json has no", l) for l in lines)
    assert _table(out)["mtp.layers.0.self_attn.q_proj.weight"] == ("bfloat16", "[128, 64]", "[128, 64]", "ok")

    # quantization not registered: inferred, and said so
    path = tiny_checkpoint(fresh=True, mtp_bits=8, mtp_group_size=64)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["mtplx_mtp_quantization"]
    (path / "config.json").write_text(json.dumps(cfg))
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", path)
    assert rc == 0
    assert "head quantization: bits=8, group_size=64 (inferred from the shapes" in out


def test_inspect_mtp_weights_flags(tiny_checkpoint, capsys, tmp_path):
    # no sidecar at all
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", tiny_checkpoint(write_sidecar=False))
    assert rc == 1 and out.splitlines()[-1].startswith("FLAG: no MTP sidecar: nothing at optiq/mtp.safetensors")
    # truncated sidecar
    path = tiny_checkpoint(fresh=True)
    _truncate(path / SIDECAR)
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", path)
    assert rc == 1 and "cannot read the MTP sidecar" in out and "corrupt or truncated" in out
    # mis-declared norm convention, two MTP layers, sidecar outside the checkpoint
    path = tiny_checkpoint(fresh=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["mtp_norm_convention"] = "standard"
    (path / "config.json").write_text(json.dumps(cfg))
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", path)
    assert rc == 1 and "FLAG: config.json says mtp_norm_convention 'standard' but the norm weights look zero_centered" in out
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", tiny_checkpoint(mtp_num_hidden_layers=2))
    assert rc == 1
    assert "FLAG: config.json says mtp_num_hidden_layers 2; the adapter supports exactly one MTP layer." in out
    assert "FLAG: unexpected tensor 'mtp.layers.1.mlp.down_proj.biases'" in out  # the second layer is listed
    cfg.update(mtp_norm_convention="zero_centered", mtp_file="../x.safetensors")
    cfg.pop("mlx_lm_extra_tensors")
    (path / "config.json").write_text(json.dumps(cfg))
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", path)
    assert rc == 1 and "points outside the checkpoint directory" in out
    rc, out = _in_process(inspect_mtp_weights, capsys, "--model", tmp_path / "nowhere")
    assert rc == 1 and out.startswith("FLAG: No checkpoint directory")
