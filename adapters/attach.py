"""Attach an MTP head to an MLX conversion: the original Hugging Face checkpoint's `mtp.*` tensors
written beside the conversion as a sidecar (`optiq/mtp.safetensors`), registered in its config.json.

`mlx_lm convert` drops every `mtp.*` tensor (its sanitize does, for every family), so a user's own
conversion has no head. The head is small (~0.4 GB of a 9B's 18 GB in bf16) and loads from the
sidecar with its Hugging Face names; `--bits` quantizes its matrices (the 29-tensor layout of the
OptiQ conversions: `fc` and the norms stay float; router gates keep at least 8 bits). A MoE head is
best kept in bf16 (see adapters/qwen3_5_moe). Nothing in the conversion's trunk is touched; its
config.json gains the registration keys, written atomically.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import mlx.core as mx

from . import family_of, sidecar
from .checkpoint import open_checkpoint
from .errors import CheckpointError

SIDECAR = "optiq/mtp.safetensors"
GATES = ("mlp.gate.weight", "mlp.shared_expert_gate.weight")
# What must agree between the Hugging Face checkpoint and the conversion for the head to fit it.
SAME = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "num_experts", "moe_intermediate_size", "shared_expert_intermediate_size", "intermediate_size")


@dataclass(frozen=True)
class Attached:
    sidecar: Path
    tensors: int
    quantization: Optional[dict]
    notes: tuple


def _quantize(tensors: Dict[str, mx.array], bits: int, group_size: int):
    """The head's matrices quantized (affine) but `fc`; router gates at >= 8 bits (registered per tensor)."""
    out, per_tensor = {}, {}
    for name, value in tensors.items():
        if value.ndim < 2 or name == "mtp.fc.weight" or value.shape[-1] % group_size:
            out[name] = value
            continue
        b = max(bits, 8) if name.endswith(GATES) else bits
        base = sidecar.base_name(name)
        if b != bits:
            per_tensor[base] = {"bits": b, "group_size": group_size}
        w, s, z = mx.quantize(value, group_size=group_size, bits=b)
        out[name], out[base + ".scales"], out[base + ".biases"] = w, s, z
    return out, per_tensor


def attach_head(source: Path, target: Path, bits: Optional[int] = None, group_size: int = 64) -> Attached:
    """Write `source`'s head (an original Hugging Face checkpoint) into the conversion at `target`."""
    src, src_config = open_checkpoint(source)
    dst, dst_config = open_checkpoint(target)
    family = family_of(src_config, src)
    if dst_config.get("model_type") != src_config.get("model_type"):
        raise CheckpointError(f"{dst}: model_type '{dst_config.get('model_type')}' is not the head's "
                              f"'{src_config.get('model_type')}' ({src}): the conversion is of another model.")
    tc_src, tc_dst = family.FAMILY.text_config(src_config), family.FAMILY.text_config(dst_config)
    for key in SAME:
        if tc_src.get(key) != tc_dst.get(key):
            raise CheckpointError(f"{dst}: config.json has {key} {tc_dst.get(key)!r} where the head's checkpoint "
                                  f"{src} has {tc_src.get(key)!r}: the conversion is of another model.")
    files = sidecar.head_shards(src)
    if not files:
        raise CheckpointError(f"{src} has no mtp.* tensors in its model*.safetensors: it is not an original "
                              "checkpoint with its MTP head (mlx_lm convert drops the head; give the "
                              "Hugging Face checkpoint it was converted from).")
    tensors = sidecar.read_shards(files)
    shapes, _, label = family.head_spec(src_config)
    sidecar.check(str(src), tensors, shapes, None, label, about=f" for hidden_size={tc_src['hidden_size']}",
                  fix=sidecar.FIX_CHECKPOINT)
    notes = []
    quant = None
    if bits:
        tensors, per_tensor = _quantize(tensors, bits, group_size)
        quant = {"bits": bits, "group_size": group_size, "mode": "affine", "prequantized": True, **per_tensor}
        if family.FAMILY.experts:
            notes.append("a quantized MoE head loses acceptance (MTPLX: 5-11 % against 79-85 % in bf16); "
                         "attach it without --bits to keep it in bf16")
    mx.eval(tensors)
    path = dst / SIDECAR
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.safetensors")
    mx.save_safetensors(str(tmp), tensors, metadata={"format": "mlx"})
    os.replace(tmp, path)

    config = dict(dst_config)
    config["mtp_file"] = SIDECAR
    config["mlx_lm_extra_tensors"] = {**(config.get("mlx_lm_extra_tensors") or {}), "mtp_file": SIDECAR}
    config["mtp_tensor_count"] = len(tensors)
    config["mtp_norm_convention"] = src_config.get("mtp_norm_convention", "zero_centered")  # as Hugging Face stores them
    for key in ("mtp_hidden_variant", "mtp_concat_order"):
        if key in src_config:
            config[key] = src_config[key]
    if quant:
        config["mtplx_mtp_quantization"] = quant
    else:
        config.pop("mtplx_mtp_quantization", None)
    if "mtp_num_hidden_layers" not in family.FAMILY.text_config(config):
        family.FAMILY.text_config(config)["mtp_num_hidden_layers"] = tc_src.get("mtp_num_hidden_layers", 1)
    tmp = dst / "config.json.tmp"
    tmp.write_text(json.dumps(config, indent=4))
    os.replace(tmp, dst / "config.json")
    return Attached(path, len(tensors), quant, tuple(notes))
