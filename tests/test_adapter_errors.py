"""Every way a checkpoint can be wrong gives a CheckpointError that says what and what to do.

And nothing is half-loaded: config and sidecar are checked before mlx-lm touches the trunk,
so a broken sidecar fails fast, without the trunk being read.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import mlx.core as mx
import mlx_lm.utils
import pytest

from adapters import CheckpointError, load_adapter

SIDECAR = Path("optiq") / "mtp.safetensors"


# --------------------------------------------------------------------------- helpers
def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _write_config(path: Path, cfg: dict) -> None:
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def _edit_config(path: Path, **changes) -> dict:
    cfg = _config(path)
    for k, v in changes.items():
        if v is _DELETE:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    _write_config(path, cfg)
    return cfg


_DELETE = object()


def _edit_sidecar(path: Path, edit) -> None:
    f = path / SIDECAR
    tensors = dict(mx.load(str(f)))
    edit(tensors)
    mx.save_safetensors(str(f), tensors, metadata={"format": "mlx"})


def _truncate(f: Path, keep: float = 0.5) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * keep)])


def _error(path, **kw) -> str:
    with pytest.raises(CheckpointError) as info:
        load_adapter(path, **kw)
    return str(info.value)


def _has(msg: str, *fragments: str) -> None:
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in message:\n{msg}"


@pytest.fixture
def trunk_untouched(monkeypatch):
    """Fails the test if mlx-lm is asked to load the trunk (nothing may be half-loaded)."""
    calls = []

    def forbidden(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the trunk was loaded before the checkpoint was validated")

    monkeypatch.setattr(mlx_lm.utils, "load", forbidden)
    yield calls
    assert not calls, "the trunk was loaded before the checkpoint was validated"


# --------------------------------------------------------------------------- where and what
def test_missing_directory(tmp_path):
    msg = _error(tmp_path / "no-such-model")
    _has(msg, "No checkpoint directory at", "no-such-model", "local copy", "config.json")


def test_file_instead_of_directory(tiny_checkpoint):
    msg = _error(tiny_checkpoint() / "config.json")
    _has(msg, "is a file", "give the checkpoint directory")


def test_no_config_json(tmp_path):
    msg = _error(tmp_path)
    _has(msg, str(tmp_path), "has no config.json", "not a model checkpoint directory")


def test_invalid_json(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_5", ')
    msg = _error(tmp_path)
    _has(msg, "config.json is not valid JSON")


def test_config_without_model_type(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    _has(_error(tmp_path), "has no model_type", "cannot tell which model family")


@pytest.mark.parametrize("model_type", ["llama", "glm4_moe", "deepseek_v3"])
def test_unsupported_model_type(tiny_checkpoint, model_type):
    path = tiny_checkpoint(fresh=True)
    _edit_config(path, model_type=model_type)
    _has(_error(path), f"model_type '{model_type}' is not supported", "Supported: gemma4, gemma4_text, qwen3_5, qwen3_5_moe, qwen3_next")


def test_text_config_key_missing(tiny_checkpoint, trunk_untouched):
    path = tiny_checkpoint(fresh=True)
    cfg = _config(path)
    del cfg["text_config"]["hidden_size"]
    _write_config(path, cfg)
    _has(_error(path), "config.json: text_config has no 'hidden_size'")


# --------------------------------------------------------------------------- no MTP head
def test_no_mtp_head_says_so_and_never_falls_back(tiny_checkpoint, trunk_untouched):
    path = tiny_checkpoint(write_sidecar=False)
    msg = _error(path)
    _has(msg, "has no MTP head", "no sidecar at optiq/mtp.safetensors or mtp.safetensors",
         "config.json registers none", "Speculative decoding needs the head",
         "converted with its MTP tensors")
    assert not trunk_untouched


def test_registered_sidecar_missing(tiny_checkpoint, trunk_untouched):
    path = tiny_checkpoint(fresh=True, sidecar_path="heads/draft.safetensors")
    (path / "heads" / "draft.safetensors").unlink()
    _has(_error(path), "has no MTP head",
         "config.json registers 'heads/draft.safetensors' but no such file exists")


def test_unregistered_sidecar_in_a_non_default_place(tiny_checkpoint, trunk_untouched):
    """Nobody looks in heads/ unless config.json says so: that is 'no MTP head', plainly."""
    path = tiny_checkpoint(sidecar_path="heads/draft.safetensors", sidecar_keys="none")
    _has(_error(path), "has no MTP head", "optiq/mtp.safetensors or mtp.safetensors", "registers none")


def test_mtp_num_hidden_layers_zero(tiny_checkpoint, trunk_untouched):
    path = tiny_checkpoint(fresh=True)
    cfg = _config(path)
    cfg["text_config"]["mtp_num_hidden_layers"] = 0
    _write_config(path, cfg)
    _has(_error(path), "has no MTP head", "mtp_num_hidden_layers is 0", "Speculative decoding needs the head")


def test_two_mtp_layers_are_refused(tiny_checkpoint, trunk_untouched):
    msg = _error(tiny_checkpoint(mtp_num_hidden_layers=2))
    _has(msg, "mtp_num_hidden_layers is 2", "only one-layer MTP heads", "Use a checkpoint with a one-layer head")


@pytest.mark.parametrize("value", [None, "1", 1.5, -1, True])
def test_mtp_num_hidden_layers_not_a_count(tiny_checkpoint, trunk_untouched, value):
    path = tiny_checkpoint(fresh=True)
    cfg = _config(path)
    cfg["text_config"]["mtp_num_hidden_layers"] = value
    _write_config(path, cfg)
    _has(_error(path), "mtp_num_hidden_layers is", "expected a whole number")


# --------------------------------------------------------------------------- sidecar registration
@pytest.mark.parametrize("key", ["mtp_file", "mlx_lm_extra_tensors"])
@pytest.mark.parametrize("target", ["../mtp.safetensors", "optiq/../../x.safetensors", "/etc/passwd"])
def test_mtp_file_outside_the_checkpoint(tiny_checkpoint, trunk_untouched, key, target):
    path = tiny_checkpoint(fresh=True)
    # a real file there, so that only the location check can stop it
    if not target.startswith("/"):
        (path.parent / "mtp.safetensors").write_bytes((path / SIDECAR).read_bytes())
    # only this key registers the sidecar (an earlier valid entry would be used first)
    other = "mlx_lm_extra_tensors" if key == "mtp_file" else "mtp_file"
    value = target if key == "mtp_file" else {"mtp_file": target}
    _edit_config(path, **{key: value, other: _DELETE})
    _has(_error(path), f"mtp_file '{target}' points outside the checkpoint directory",
         "Put the sidecar inside the checkpoint")


@pytest.mark.parametrize("value", [5, ["optiq/mtp.safetensors"]])
def test_mtp_file_not_a_path(tiny_checkpoint, trunk_untouched, value):
    path = tiny_checkpoint(fresh=True)
    _edit_config(path, mtp_file=value, mlx_lm_extra_tensors=_DELETE)
    _has(_error(path), "mtp_file is", "must be a path relative to the checkpoint directory")


# --------------------------------------------------------------------------- sidecar contents
@pytest.mark.parametrize("name", ["mtp.norm.weight", "mtp.fc.weight", "mtp.layers.0.mlp.down_proj.weight"])
def test_sidecar_missing_tensor(tiny_checkpoint, trunk_untouched, name):
    path = tiny_checkpoint(fresh=True)
    _edit_sidecar(path, lambda t: t.pop(name))
    msg = _error(path)
    _has(msg, str(path / SIDECAR), "does not match a one-layer Qwen3.5 MTP head",
         f"Missing tensors: {name}.", "Re-export the sidecar")
    assert "Unexpected" not in msg


@pytest.mark.parametrize("suffix", [".scales", ".biases"])
def test_sidecar_missing_quantization_tensor(tiny_checkpoint, trunk_untouched, suffix):
    """A quantized linear without its scales (or biases) is reported as exactly that."""
    path = tiny_checkpoint(fresh=True)
    name = "mtp.layers.0.self_attn.k_proj" + suffix
    _edit_sidecar(path, lambda t: t.pop(name))
    msg = _error(path)
    _has(msg, f"Missing tensors: {name}.")
    assert "Unexpected" not in msg


@pytest.mark.parametrize("name", ["mtp.layers.1.input_layernorm.weight", "mtp.fc.bias", "mtp.embed_tokens.weight"])
def test_sidecar_extra_tensor(tiny_checkpoint, trunk_untouched, name):
    path = tiny_checkpoint(fresh=True)
    _edit_sidecar(path, lambda t: t.__setitem__(name, mx.zeros((64,), dtype=mx.bfloat16)))
    msg = _error(path)
    _has(msg, f"Unexpected tensors: {name}.", "belongs to this model")
    assert "Missing" not in msg


def test_sidecar_missing_and_extra_together(tiny_checkpoint, trunk_untouched):
    path = tiny_checkpoint(fresh=True)

    def edit(t):
        t["mtp.layers.0.mlp.up_proj.weight_renamed"] = t.pop("mtp.layers.0.mlp.up_proj.weight")

    _edit_sidecar(path, edit)
    _has(_error(path), "Missing tensors: mtp.layers.0.mlp.up_proj.weight.",
         "Unexpected tensors: mtp.layers.0.mlp.up_proj.weight_renamed.")


@pytest.mark.parametrize(
    "name, shape, expected",
    [
        ("mtp.norm.weight", (32,), "[64]"),
        ("mtp.layers.0.self_attn.q_norm.weight", (64,), "[16]"),
        ("mtp.fc.weight", (64, 64), "[64, 128]"),
        ("mtp.layers.0.self_attn.q_proj.weight", (64, 8), "[128, 8] (quantized with bits=4, group_size=32)"),
        ("mtp.layers.0.mlp.down_proj.scales", (64, 2), "[64, 4] (quantized with bits=4, group_size=32)"),
    ],
)
def test_sidecar_wrongly_shaped_tensor(tiny_checkpoint, trunk_untouched, name, shape, expected):
    path = tiny_checkpoint(fresh=True)

    def edit(t):
        dtype = t[name].dtype
        t[name] = mx.zeros(shape, dtype=dtype)

    _edit_sidecar(path, edit)
    msg = _error(path)
    _has(msg, f"tensor '{name}' has shape {list(shape)}, expected {expected}", "for hidden_size=64",
         "belongs to a different model or its quantization settings in config.json are wrong")


def test_sidecar_quantized_with_other_bits_than_registered(tiny_checkpoint, trunk_untouched):
    path = tiny_checkpoint(fresh=True)  # 4-bit head
    cfg = _config(path)
    cfg["mtplx_mtp_quantization"]["bits"] = 8
    _write_config(path, cfg)
    _has(_error(path), "has shape [128, 8], expected [128, 16] (quantized with bits=8, group_size=32)",
         "quantization settings in config.json are wrong")


def test_sidecar_quantized_weight_not_uint32(tiny_checkpoint, trunk_untouched):
    path = tiny_checkpoint(fresh=True)
    name = "mtp.layers.0.self_attn.v_proj.weight"
    _edit_sidecar(path, lambda t: t.__setitem__(name, t[name].astype(mx.float32)))
    _has(_error(path), f"quantized tensor '{name}' is", "expected uint32")


def test_sidecar_for_another_model(tiny_checkpoint, trunk_untouched):
    """A whole sidecar of a wider model: the first wrong tensor is named with both shapes."""
    path = tiny_checkpoint(fresh=True)
    other = tiny_checkpoint(hidden_size=128, num_layers=8, full_attention_interval=4, vocab_size=1024,
                            num_heads=8, intermediate_size=256)
    (path / SIDECAR).write_bytes((other / SIDECAR).read_bytes())
    _has(_error(path), "tensor 'mtp.pre_fc_norm_embedding.weight' has shape [128], expected [64]",
         "different model")


@pytest.mark.parametrize("how", ["half", "header_only", "few_bytes", "empty", "garbage_header", "not_safetensors"])
def test_sidecar_corrupt_or_truncated(tiny_checkpoint, trunk_untouched, how):
    path = tiny_checkpoint(fresh=True)
    f = path / SIDECAR
    data = f.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    f.write_bytes({
        "half": data[: len(data) // 2],
        "header_only": data[: 8 + header_len],
        "few_bytes": data[:5],
        "empty": b"",
        "garbage_header": data[:8] + b"{" + b"x" * (header_len - 1) + data[8 + header_len:],
        "not_safetensors": b"PK\x03\x04 this is a zip file, not safetensors" * 10,
    }[how])
    msg = _error(path)
    _has(msg, str(f), "cannot read the MTP sidecar", "corrupt or truncated",
         "copy it again from the original checkpoint")


def test_invalid_convention_keys(tiny_checkpoint, trunk_untouched):
    path = tiny_checkpoint(fresh=True)
    _edit_config(path, mtp_norm_convention="gemma")
    _has(_error(path), "mtp_norm_convention is 'gemma', expected 'zero_centered' or 'standard'")
    _edit_config(path, mtp_norm_convention="zero_centered", mtp_concat_order="sideways")
    _has(_error(path), "mtp_concat_order 'sideways' is not 'embedding_hidden' or 'hidden_embedding'")
    _edit_config(path, mtp_concat_order="embedding_hidden", mtp_hidden_variant="middle")
    _has(_error(path), "config.json: mtp_hidden_variant 'middle' is not 'pre_norm' or 'post_norm'")


# --------------------------------------------------------------------------- trunk
def test_truncated_trunk(tiny_checkpoint):
    path = tiny_checkpoint(fresh=True)
    _truncate(path / "model.safetensors")
    msg = _error(path)
    _has(msg, "mlx-lm could not load the trunk", "model.safetensors is corrupt or truncated",
         "copy it again from the original checkpoint")


def test_truncated_shard_is_named(tiny_checkpoint):
    path = tiny_checkpoint(fresh=True, max_shard_bytes=64 * 1024)
    shards = sorted(path.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2
    _truncate(shards[1], 0.3)
    _has(_error(path), f"{shards[1].name} is corrupt or truncated")


def test_trunk_weights_missing(tiny_checkpoint):
    path = tiny_checkpoint(fresh=True)
    (path / "model.safetensors").unlink()
    _has(_error(path), "has no model*.safetensors", "trunk weights are missing")


# --------------------------------------------------------------------------- nothing half-loaded
def test_broken_sidecar_fails_before_the_trunk_is_read(tiny_checkpoint):
    """Both broken: the sidecar is reported (it is checked first), the trunk never read."""
    path = tiny_checkpoint(fresh=True)
    _truncate(path / "model.safetensors")
    _edit_sidecar(path, lambda t: t.pop("mtp.norm.weight"))
    msg = _error(path)
    _has(msg, "Missing tensors: mtp.norm.weight")
    assert "trunk" not in msg
    _truncate(path / SIDECAR)
    _has(_error(path), "cannot read the MTP sidecar")


def test_every_sidecar_and_config_error_leaves_the_trunk_alone(tiny_checkpoint, trunk_untouched):
    """The trunk_untouched fixture in the tests above makes each of them prove this; and once more here."""
    path = tiny_checkpoint(fresh=True)
    _edit_sidecar(path, lambda t: t.__setitem__("mtp.fc.weight", mx.zeros((64, 64))))
    with pytest.raises(CheckpointError):
        load_adapter(path)
    assert trunk_untouched == []


def test_messages_name_the_checkpoint_or_file(tiny_checkpoint):
    """Every message starts with the path it is about, so a user with several copies knows which."""
    path = tiny_checkpoint(fresh=True)
    _edit_sidecar(path, lambda t: t.pop("mtp.norm.weight"))
    assert re.match(re.escape(str(path)), _error(path))
