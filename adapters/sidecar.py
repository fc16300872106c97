"""Find, read and check the MTP sidecar (`optiq/mtp.safetensors`) before anything is loaded."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import mlx.core as mx

from .errors import CheckpointError

DEFAULT_LOCATIONS = ("optiq/mtp.safetensors", "mtp.safetensors")
NORMS = (
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.norm.weight",
    "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.post_attention_layernorm.weight",
    "mtp.layers.0.self_attn.q_norm.weight",
    "mtp.layers.0.self_attn.k_norm.weight",
)
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def registered(config: dict) -> List[str]:
    """Sidecar paths config.json registers: mlx_lm_extra_tensors.mtp_file, then mtp_file."""
    out = []
    extra = config.get("mlx_lm_extra_tensors")
    if isinstance(extra, dict) and extra.get("mtp_file"):
        out.append(extra["mtp_file"])
    if config.get("mtp_file") and config["mtp_file"] not in out:
        out.append(config["mtp_file"])
    return out


def candidates(config: dict) -> List[str]:
    """Sidecar paths to try, relative to the checkpoint, in the look-up order of the existing loaders."""
    out = registered(config)
    return out + [d for d in DEFAULT_LOCATIONS if d not in out]


def locate(ckpt: Path, config: dict) -> Optional[Path]:
    """The registered sidecar path, in the look-up order of the existing loaders."""
    # Checked lexically, not with resolve(): Hugging Face cache snapshots (and users) keep the
    # files as symlinks to blobs elsewhere, which is fine; a config's `../` is not.
    root = Path(os.path.abspath(ckpt))
    for rel in candidates(config):
        if not isinstance(rel, str):
            raise CheckpointError(
                f"{ckpt / 'config.json'}: mtp_file is {rel!r}; it must be a path relative to the "
                "checkpoint directory, such as \"optiq/mtp.safetensors\"."
            )
        path = Path(os.path.normpath(root / rel))
        # A config must not point the loader outside its own checkpoint.
        if root not in path.parents:
            raise CheckpointError(
                f"{ckpt / 'config.json'}: mtp_file '{rel}' points outside the checkpoint directory. "
                "Put the sidecar inside the checkpoint (optiq/mtp.safetensors) and register it by "
                "its relative path."
            )
        if path.is_file():
            return path
    return None


def logical_shapes(text_config: dict) -> Dict[str, Tuple[int, ...]]:
    """Expected (dequantized) shape of every base tensor of a one-layer head."""
    H = text_config["hidden_size"]
    n_heads = text_config["num_attention_heads"]
    head_dim = text_config.get("head_dim") or H // n_heads
    n_kv = text_config["num_key_value_heads"]
    inter = text_config["intermediate_size"]
    shapes = {name: (H,) for name in NORMS}
    shapes["mtp.layers.0.self_attn.q_norm.weight"] = (head_dim,)
    shapes["mtp.layers.0.self_attn.k_norm.weight"] = (head_dim,)
    shapes["mtp.fc.weight"] = (H, 2 * H)
    attn = "mtp.layers.0.self_attn."
    shapes[attn + "q_proj.weight"] = (2 * n_heads * head_dim, H)
    shapes[attn + "k_proj.weight"] = (n_kv * head_dim, H)
    shapes[attn + "v_proj.weight"] = (n_kv * head_dim, H)
    shapes[attn + "o_proj.weight"] = (H, n_heads * head_dim)
    mlp = "mtp.layers.0.mlp."
    shapes[mlp + "gate_proj.weight"] = (inter, H)
    shapes[mlp + "up_proj.weight"] = (inter, H)
    shapes[mlp + "down_proj.weight"] = (H, inter)
    return shapes


def read(path: Path) -> Dict[str, mx.array]:
    try:
        tensors = mx.load(str(path))
    except Exception as exc:  # mlx raises RuntimeError/ValueError with terse texts
        raise CheckpointError(
            f"{path}: cannot read the MTP sidecar ({exc}). The file is corrupt or truncated: "
            "copy it again from the original checkpoint."
        ) from None
    if not isinstance(tensors, dict):
        raise CheckpointError(f"{path}: not a safetensors file of named tensors.")
    out = {}
    for key, value in tensors.items():
        name = key
        for prefix in ("language_model.model.", "language_model.", "model."):
            if name.startswith(prefix + "mtp."):
                name = name[len(prefix):]
        out[name] = value
    return out


@dataclass(frozen=True)
class Problem:
    """One way a sidecar differs from what the adapter expects."""

    kind: str  # "missing" | "unexpected" | "shape" | "dtype"
    tensor: str
    message: str  # names the tensor (and expected vs found); no file path


def quantized_linears(tensors: Dict[str, mx.array], text_config: dict) -> set:
    """Base names ("mtp.fc", "mtp.layers.0.mlp.up_proj", ...) of the linears stored quantized."""
    shapes = logical_shapes(text_config)
    bases = [n[: -len(".weight")] for n in shapes if n.endswith("_proj.weight") or n == "mtp.fc.weight"]
    return {
        b for b in bases
        if b + ".scales" in tensors or b + ".biases" in tensors
        or (b + ".weight" in tensors and tensors[b + ".weight"].dtype == mx.uint32)
    }


def quant_params(tensors: Dict[str, mx.array], text_config: dict, quantized: set, quant: Optional[dict]) -> Optional[dict]:
    """{bits, group_size} of the quantized linears: as registered, else inferred from the shapes."""
    if not quantized:
        return None
    bits = (quant or {}).get("bits")
    group = (quant or {}).get("group_size")
    if bits is None or group is None:
        # No registration: infer from the first quantized linear that is complete.
        shapes = logical_shapes(text_config)
        for name in sorted(quantized):
            w, s = tensors.get(name + ".weight"), tensors.get(name + ".scales")
            if w is None or s is None or w.ndim != 2 or s.ndim != 2 or s.shape[-1] == 0:
                continue
            in_f = shapes[name + ".weight"][1]
            bits = w.shape[-1] * 32 // in_f
            group = in_f // s.shape[-1]
            break
        else:
            return None
    return {"bits": int(bits), "group_size": int(group)}


def stored_shapes(logical: Tuple[int, ...], params: Optional[dict]) -> Dict[str, Tuple[int, ...]]:
    """Stored shape of a linear's weight/scales/biases (suffix -> shape); params None = float."""
    if params is None:
        return {".weight": tuple(logical)}
    out_f, in_f = logical
    return {
        ".weight": (out_f, in_f * params["bits"] // 32),
        ".scales": (out_f, in_f // params["group_size"]),
        ".biases": (out_f, in_f // params["group_size"]),
    }


def problems(tensors: Dict[str, mx.array], text_config: dict, quant: Optional[dict]) -> Tuple[set, Optional[dict], List[Problem]]:
    """Compare a sidecar with a one-layer Qwen3.5 MTP head; never raises on a bad sidecar.

    Returns (names of quantized linears, {bits, group_size} or None, problems in check order).
    """
    shapes = logical_shapes(text_config)
    quantized = quantized_linears(tensors, text_config)
    params = quant_params(tensors, text_config, quantized, quant)
    expected = set(shapes) | {q + s for q in quantized for s in (".scales", ".biases")}
    found: List[Problem] = []
    for name in sorted(expected - set(tensors)):
        base = name.rsplit(".", 1)[0]
        want = shapes.get(base + ".weight")
        if base in quantized and params is not None and want is not None:
            want = stored_shapes(want, params)["." + name.rsplit(".", 1)[1]]
        found.append(Problem("missing", name, f"missing tensor '{name}'" + (f" (expected shape {list(want)})" if want else "")))
    for name in sorted(set(tensors) - expected):
        found.append(Problem("unexpected", name, f"unexpected tensor '{name}' {list(tensors[name].shape)}"))

    for name, logical in shapes.items():
        base = name[: -len(".weight")]
        is_q = base in quantized
        if is_q and params is None:
            continue  # nothing to compare with: its scales are missing (reported above)
        for suffix, wshape in stored_shapes(logical, params if is_q else None).items():
            tname = base + suffix
            if tname not in tensors:
                continue
            shape = tuple(tensors[tname].shape)
            if shape != wshape:
                how = f" (quantized with bits={params['bits']}, group_size={params['group_size']})" if is_q else ""
                found.append(Problem(
                    "shape", tname,
                    f"tensor '{tname}' has shape {list(shape)}, expected {list(wshape)}{how} "
                    f"for hidden_size={text_config['hidden_size']}. The sidecar belongs to a different model "
                    "or its quantization settings in config.json are wrong.",
                ))
        if is_q and name in tensors and tensors[name].dtype != mx.uint32:
            found.append(Problem("dtype", name, f"quantized tensor '{name}' is {tensors[name].dtype}, expected uint32."))
    return quantized, params, found


def check(path: Path, tensors: Dict[str, mx.array], text_config: dict, quant: Optional[dict]) -> Tuple[set, Optional[dict]]:
    """Validate names and shapes; return (names of quantized linears, {bits, group_size})."""
    quantized, params, found = problems(tensors, text_config, quant)
    missing = [p.tensor for p in found if p.kind == "missing"]
    extra = [p.tensor for p in found if p.kind == "unexpected"]
    if missing or extra:
        msg = [f"{path}: the MTP sidecar does not match a one-layer Qwen3.5 MTP head."]
        if missing:
            msg.append(f"Missing tensors: {', '.join(missing)}.")
        if extra:
            msg.append(f"Unexpected tensors: {', '.join(extra)}.")
        msg.append("Re-export the sidecar (29 tensors: 8 float + 7 quantized linears) or check that it belongs to this model.")
        raise CheckpointError(" ".join(msg))
    if found:
        raise CheckpointError(f"{path}: {found[0].message}")
    return quantized, params


def detect_norm_convention(tensors: Dict[str, mx.array], config: dict) -> Tuple[str, str]:
    declared = config.get("mtp_norm_convention")
    if declared is not None:
        if declared not in ("zero_centered", "standard"):
            raise CheckpointError(
                f"config.json: mtp_norm_convention is '{declared}', expected 'zero_centered' or 'standard'."
            )
        return declared, "config"
    # MTPLX/OptiQ heuristic: applied weights sit near 1, zero-centred ones near 0.
    present = [n for n in NORMS if n in tensors]
    if not present:
        raise CheckpointError("the MTP sidecar has none of its norm tensors: cannot tell their convention.")
    mean = mx.mean(mx.concatenate([tensors[n].astype(mx.float32).reshape(-1) for n in present])).item()
    return ("zero_centered" if mean < 0.5 else "standard"), f"detected, mean {mean:.3f}"
