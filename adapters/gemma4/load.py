"""Loading a Gemma 4 backbone and its assistant drafter, and checking that they are a pair.

The drafter comes from `--drafter DIR` (LoadOptions.drafter), else from `BACKBONE/assistant/`
(DRAFTER_DIR). Both configs are read and compared, and the drafter's tensors checked, before
the backbone's weights are touched: nothing is half-loaded, and a refusal names both sides.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from .. import sidecar
from ..checkpoint import read_config, resolve, text_config
from ..cpu_layout import to_row_major
from ..errors import CheckpointError
from ..options import LoadOptions
from .adapter import Gemma4Adapter, kv_layers
from .drafter import Assistant, expected_tensors, head_kind

DRAFTER_DIR = "assistant"   # BACKBONE/assistant/: where the drafter is found without --drafter
REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "layer_types", "sliding_window")


def find_drafter(path: Path, options: LoadOptions) -> Path:
    if options.drafter is not None:
        return resolve(options.drafter)
    auto = path / DRAFTER_DIR
    if (auto / "config.json").is_file():
        return auto
    raise CheckpointError(
        f"{path} is a Gemma 4 backbone; its drafter is a separate checkpoint (the '-assistant' one, e.g. "
        f"gemma-4-E4B-it-assistant for gemma-4-E4B-it). Pass --drafter DIR, or put it in {auto}.")


def _kv_shape(tc: dict, kind: str) -> Tuple[int, int]:
    """(K/V heads, head dim) of the backbone's layers of this kind."""
    if kind == "full_attention":
        heads = (tc.get("num_global_key_value_heads") if tc.get("attention_k_eq_v") else None) \
            or tc["num_key_value_heads"]
        return heads, tc.get("global_head_dim") or tc["head_dim"]
    return tc["num_key_value_heads"], tc["head_dim"]


def _rope(tc: dict, kind: str) -> dict:
    rp = (tc.get("rope_parameters") or {}).get(kind, {})
    return {k: rp.get(k) for k in ("rope_type", "rope_theta", "partial_rotary_factor")}


def check_pair(backbone: Path, btc: dict, drafter: Path, dcfg: dict) -> None:
    """Refuse a drafter that was not made for this backbone, naming both sides."""
    b, d = f"backbone {backbone}", f"drafter {drafter}"
    dtc = dcfg["text_config"]
    problems: List[str] = []
    if dtc.get("vocab_size") != btc["vocab_size"]:
        problems.append(f"vocabulary: {d} has vocab_size {dtc.get('vocab_size')}, {b} has {btc['vocab_size']}")
    if dcfg.get("backbone_hidden_size") != btc["hidden_size"]:
        problems.append(f"hidden size: {d} reads a backbone of backbone_hidden_size {dcfg.get('backbone_hidden_size')}, "
                        f"{b} has hidden_size {btc['hidden_size']}")
    sources = kv_layers(btc["layer_types"][: btc["num_hidden_layers"]], btc.get("num_kv_shared_layers"))
    for kind in sorted(set(dtc.get("layer_types") or [])):
        if kind not in sources:
            problems.append(f"KV layers: {d} has {kind} layers, {b} has no {kind} layer that computes K/V")
            continue
        heads, dim = _kv_shape(btc, kind)
        want = (dtc.get("global_head_dim") or dtc.get("head_dim")) if kind == "full_attention" else dtc.get("head_dim")
        where = f"{b} layer {sources[kind]} ({kind}: {heads} K/V heads of {dim})"
        if want != dim:
            problems.append(f"KV layers: {d}'s {kind} queries have head dim {want}, {where}")
        elif dtc.get("num_attention_heads", 0) % heads:
            problems.append(f"KV layers: {d} has {dtc.get('num_attention_heads')} query heads, not a multiple of {where}")
        if _rope(dtc, kind) != _rope(btc, kind):
            problems.append(f"KV layers: {d}'s {kind} RoPE {_rope(dtc, kind)} differs from {b}'s {_rope(btc, kind)}")
    if dtc.get("sliding_window") != btc["sliding_window"]:
        problems.append(f"sliding window: {d} has {dtc.get('sliding_window')}, {b} has {btc['sliding_window']}")
    if problems:
        raise CheckpointError("The drafter does not belong to this backbone: " + "; ".join(problems)
                              + ". Use the '-assistant' checkpoint published with this backbone.")


def check_embed_scale(backbone: Path, inner, drafter: Path, dcfg: dict) -> None:
    """The drafter was trained on backbone_embed(token) * sqrt(backbone_hidden_size)."""
    want = math.sqrt(dcfg["backbone_hidden_size"])
    have = float(inner.embed_scale)
    if not math.isclose(want, have, rel_tol=1e-6):
        raise CheckpointError(f"embed_scale: drafter {drafter} expects sqrt(backbone_hidden_size) = {want:.4f}, "
                              f"backbone {backbone} scales its embeddings by {have:.4f}.")


def read_drafter_config(drafter: Path) -> dict:
    dcfg = read_config(drafter)
    if dcfg.get("model_type") != "gemma4_assistant":
        raise CheckpointError(f"drafter {drafter}: model_type is '{dcfg.get('model_type')}', expected "
                              "'gemma4_assistant' (a Gemma 4 '-assistant' checkpoint).")
    for key in ("backbone_hidden_size", "text_config"):
        if key not in dcfg:
            raise CheckpointError(f"drafter {drafter / 'config.json'} has no '{key}'.")
    return dcfg


def read_drafter_tensors(drafter: Path, dcfg: dict) -> Dict[str, mx.array]:
    """The drafter's tensors (Hugging Face names), checked against its config."""
    files = sidecar.shard_files(drafter)
    if not files:
        raise CheckpointError(f"drafter {drafter} has no model*.safetensors: its weights are missing.")
    tensors: Dict[str, mx.array] = {}
    for f in files:
        try:
            tensors.update(mx.load(str(f)))
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"drafter {f} cannot be read ({exc}): copy it again.") from None
    if dcfg.get("tie_word_embeddings", True):
        tensors.pop("lm_head.weight", None)   # the tied copy some exports write
    want = expected_tensors(dcfg)
    quantized = {k.rsplit(".", 1)[0] for k in tensors if k.endswith(".scales")}
    missing = [k for k in want if k not in tensors]
    extra = [k for k in tensors if k not in want and k.rsplit(".", 1)[0] not in quantized]
    bad = [f"'{k}' has shape {list(tensors[k].shape)}, expected {list(s)}" for k, s in want.items()
           if k in tensors and k.rsplit(".", 1)[0] not in quantized and tuple(tensors[k].shape) != s]
    if head_kind(dcfg) == "centroid" and "masked_embedding.centroids.weight" in missing:
        raise CheckpointError(
            f"drafter {drafter}: config.json says use_ordered_embeddings (a centroid head, as on E2B/E4B: it "
            f"scores only its top-{dcfg.get('centroid_intermediate_top_k', 32)} clusters) but "
            "'masked_embedding.centroids.weight' is missing. Copy the drafter again from its original.")
    if missing or bad or extra:
        parts = ([f"Missing tensors: {', '.join(missing)}."] if missing else []) + bad + \
                ([f"Unexpected tensors: {', '.join(sorted(extra))}."] if extra else [])
        raise CheckpointError(f"drafter {drafter} is not a Gemma 4 assistant of its config.json: " + " ".join(parts))
    if head_kind(dcfg) == "centroid":
        V, C = dcfg["text_config"]["vocab_size"], want["masked_embedding.centroids.weight"][0]
        order = tensors["masked_embedding.token_ordering"].astype(mx.int32)
        if V % C or not mx.array_equal(mx.sort(order), mx.arange(V)).item():
            raise CheckpointError(f"drafter {drafter}: 'masked_embedding.token_ordering' must list each of the "
                                  f"{V} tokens once, in {C} clusters of {V // C if V % C == 0 else '?'}.")
        tensors["masked_embedding.token_ordering"] = order
    return tensors


def build_drafter(dcfg: dict, tensors: Dict[str, mx.array]) -> Assistant:
    drafter = Assistant(dcfg)
    q = dcfg.get("quantization")
    if q:
        nn.quantize(drafter, q["group_size"], q["bits"],
                    class_predicate=lambda p, m: f"{p}.scales" in tensors)
    drafter.update(tree_unflatten(list(tensors.items())))
    return drafter


def load(path: Path, config: dict, options: LoadOptions) -> Gemma4Adapter:
    tc = text_config(config)
    for key in REQUIRED:
        if key not in tc:
            raise CheckpointError(f"{path / 'config.json'}: {'text_config has' if tc is not config else 'it has'} no '{key}'.")
    drafter_path = find_drafter(path, options)
    dcfg = read_drafter_config(drafter_path)
    check_pair(path, tc, drafter_path, dcfg)
    tensors = read_drafter_tensors(drafter_path, dcfg)

    if not sidecar.shard_files(path):
        raise CheckpointError(f"{path} has no model*.safetensors: the backbone's weights are missing.")
    from mlx_lm.utils import dequantize_model, load as mlx_lm_load

    try:
        model, tokenizer = mlx_lm_load(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path}: mlx-lm could not load the Gemma 4 backbone ({type(exc).__name__}: {exc}).") from None
    lm = model.language_model if hasattr(model, "language_model") else model
    check_embed_scale(path, lm.model, drafter_path, dcfg)
    drafter = build_drafter(dcfg, tensors)

    compute_dtype = options.compute_dtype
    if compute_dtype == "auto":
        compute_dtype = "float32" if mx.default_device() == mx.cpu else "native"
    if compute_dtype == "float32":
        for module in (model, drafter):
            dequantize_model(module)
            module.set_dtype(mx.float32)
            if mx.default_device() == mx.cpu:
                to_row_major(module)
    mx.eval(model.parameters(), drafter.parameters())
    return Gemma4Adapter(path, model, tokenizer, config, tc, drafter, drafter_path, compute_dtype,
                         context_length=int(tc.get("max_position_embeddings") or 8192))
