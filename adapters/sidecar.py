"""Find, read and check the MTP sidecar (`optiq/mtp.safetensors`) before anything is loaded."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Tuple

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


def locate(ckpt: Path, config: dict) -> Optional[Path]:
    """The registered sidecar path, in the look-up order of the existing loaders."""
    candidates = []
    extra = config.get("mlx_lm_extra_tensors")
    if isinstance(extra, dict) and extra.get("mtp_file"):
        candidates.append(extra["mtp_file"])
    if config.get("mtp_file"):
        candidates.append(config["mtp_file"])
    candidates += DEFAULT_LOCATIONS
    root = ckpt.resolve()
    for rel in candidates:
        path = (ckpt / rel).resolve()
        # A config must not point the loader outside its own checkpoint.
        if root not in path.parents:
            raise CheckpointError(f"{ckpt / 'config.json'}: mtp_file '{rel}' points outside the checkpoint directory.")
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


def check(path: Path, tensors: Dict[str, mx.array], text_config: dict, quant: Optional[dict]) -> Tuple[set, Optional[dict]]:
    """Validate names and shapes; return (names of quantized linears, {bits, group_size})."""
    shapes = logical_shapes(text_config)
    linears = [n for n in shapes if n.endswith("_proj.weight") or n == "mtp.fc.weight"]
    quantized = {n[: -len(".weight")] for n in linears if n[: -len(".weight")] + ".scales" in tensors}
    expected = set(shapes) | {q + s for q in quantized for s in (".scales", ".biases")}
    missing = sorted(expected - set(tensors))
    extra = sorted(set(tensors) - expected)
    if missing or extra:
        msg = [f"{path}: the MTP sidecar does not match a one-layer Qwen3.5 MTP head."]
        if missing:
            msg.append(f"missing tensors: {', '.join(missing)}")
        if extra:
            msg.append(f"unexpected tensors: {', '.join(extra)}")
        msg.append("Re-export the sidecar (29 tensors: 8 float + 7 quantized linears) or check that it belongs to this model.")
        raise CheckpointError(" ".join(msg))

    params = None
    if quantized:
        bits = (quant or {}).get("bits")
        group = (quant or {}).get("group_size")
        if bits is None or group is None:
            # No registration: infer from the first quantized linear.
            name = sorted(quantized)[0]
            out_f, in_f = shapes[name + ".weight"]
            bits = tensors[name + ".weight"].shape[-1] * 32 // in_f
            group = in_f // tensors[name + ".scales"].shape[-1]
        params = {"bits": int(bits), "group_size": int(group)}

    for name, logical in shapes.items():
        base = name[: -len(".weight")]
        if base in quantized:
            out_f, in_f = logical
            want = {
                name: (out_f, in_f * params["bits"] // 32),
                base + ".scales": (out_f, in_f // params["group_size"]),
                base + ".biases": (out_f, in_f // params["group_size"]),
            }
        else:
            want = {name: logical}
        for tname, wshape in want.items():
            found = tuple(tensors[tname].shape)
            if found != wshape:
                how = f" (quantized with bits={params['bits']}, group_size={params['group_size']})" if base in quantized else ""
                raise CheckpointError(
                    f"{path}: tensor '{tname}' has shape {list(found)}, expected {list(wshape)}{how} "
                    f"for hidden_size={text_config['hidden_size']}. The sidecar belongs to a different model "
                    "or its quantization settings in config.json are wrong."
                )
        if base in quantized and tensors[name].dtype != mx.uint32:
            raise CheckpointError(f"{path}: quantized tensor '{name}' is {tensors[name].dtype}, expected uint32.")
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
    mean = mx.mean(mx.concatenate([tensors[n].astype(mx.float32).reshape(-1) for n in NORMS])).item()
    return ("zero_centered" if mean < 0.5 else "standard"), f"detected, mean {mean:.3f}"
