#!/usr/bin/env python3
"""Write a random-weight checkpoint in the exact Qwythos layout (docs/checkpoint-layout.md).

    python scripts/checkpoints/make_tiny_checkpoint.py --out /tmp/tiny            # 4-bit trunk, 29-tensor head
    python scripts/checkpoints/make_tiny_checkpoint.py --out /tmp/tiny --bits 0   # float trunk

or from Python::

    from scripts.checkpoints.make_tiny_checkpoint import make_tiny_checkpoint
    make_tiny_checkpoint(tmp_path / "ckpt", bits=None, tie_word_embeddings=False)

What it writes:

- ``config.json``: top-level ``model_type: qwen3_5`` with a nested ``text_config``,
  ``quantization``/``quantization_config`` as ``mlx_lm.utils.quantize_model`` writes them,
  the OptiQ/MTPLX sidecar registration (``mtp_file``, ``mlx_lm_extra_tensors``,
  ``mtplx_mtp_quantization``, ``mtp_tensor_count``, ``mtp_policy``) and, unless told not to,
  the explicit convention keys (``mtp_hidden_variant``, ``mtp_concat_order``,
  ``mtp_norm_convention``).
- ``model.safetensors`` (+ ``model.safetensors.index.json``; sharded on request): the trunk
  of ``mlx_lm.models.qwen3_5.Model`` in mlx-lm's own layout, loadable by ``mlx_lm.load``.
- ``optiq/mtp.safetensors`` (or another location): the MTP head, 29 tensors (31 with
  ``quantize_fc``, 15 with an unquantized head), bf16 norms stored zero-centred by default.
- ``tokenizer.json`` / ``tokenizer_config.json`` / ``special_tokens_map.json``: a byte-level
  BPE trained at build time on a small built-in English text, ChatML specials, chat template.

The weights are random but shaped so that runs are not degenerate: the logits have a
controlled spread (``logit_std``) and a few "frequent" tokens get larger output-embedding
norms (``frequent_tokens``/``frequent_scale``), as in a trained model. With the defaults the
trunk and a random MTP head agree on the greedy token some of the time, not always, so
speculative tests see both accepted and rejected drafts.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shutil
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Optional, Union

# Fast BLAS before mlx.core is imported (no-op when unavailable or already imported).
_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))
try:  # pragma: no cover - best effort
    from adapters.runtime import preload_blas as _preload

    _preload()
except Exception:  # noqa: BLE001
    pass

import numpy as np  # noqa: E402

from scripts.checkpoints.shards import save_trunk  # noqa: E402
from scripts.checkpoints.tokenizer_files import (EOS_TOKEN, PAD_TOKEN, QWEN35_TOKENS, SPECIAL_TOKENS,  # noqa: E402
                                                 TEMPLATES, write_tokenizer)

SIDECAR_KEY_MODES = ("both", "extra", "mtp_file", "none")
DEFAULT_SIDECAR = "optiq/mtp.safetensors"

# --------------------------------------------------------------------------- weights
_OUT_PROJ = ("o_proj", "out_proj", "down_proj")


@dataclass(frozen=True)
class Draws:
    """Where random values come from and the few array ops the init rules use: NumPy's generator
    (the default, `numpy_draws`) or MLX's on the default device (`mlx_draws`: a 9B-shaped trunk's
    8.6 billion values drawn and scaled on a GPU, not on the host)."""

    normal: Callable      # shape -> standard normal values
    uniform: Callable     # (low, high, shape) -> uniform values
    log: Callable
    to32: Callable        # -> float32
    scale_rows: Callable  # (w, row ids, factor) -> w with those rows multiplied


def numpy_draws(rng: np.random.Generator) -> Draws:
    def scale_rows(w, ids, factor):
        w[ids] *= factor
        return w
    return Draws(rng.standard_normal, lambda lo, hi, shape: rng.uniform(lo, hi, size=shape), np.log,
                 lambda a: a.astype(np.float32), scale_rows)


def mlx_draws(seed: int) -> Draws:
    import mlx.core as mx

    key = [mx.random.key(seed)]

    def sub():
        key[0], k = mx.random.split(key[0])
        return k

    def scale_rows(w, ids, factor):
        rows = np.ones(w.shape[0], np.float32)
        rows[ids] = factor
        return w * mx.array(rows)[:, None]
    return Draws(lambda shape: mx.random.normal(tuple(shape), key=sub()),
                 lambda lo, hi, shape: mx.random.uniform(lo, hi, tuple(shape), key=sub()), mx.log,
                 lambda a: a.astype(mx.float32), scale_rows)


def _init_param(name: str, shape, d: Draws, *, num_layers: int,
                norm_std: float, residual_gain: float = 1.0):
    """Sensible random values for one parameter of a qwen3_5 trunk / decoder layer."""
    leaf = name.rsplit(".", 1)[-1]
    owner = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    if leaf == "A_log":
        return d.to32(d.log(d.uniform(1.0, 16.0, shape)))
    if leaf == "dt_bias":
        return d.to32(1.0 + 0.1 * d.normal(shape))
    if owner.endswith("norm") or owner.endswith("layernorm"):
        # RMSNorm weights as applied: near 1.
        return d.to32(1.0 + norm_std * d.normal(shape))
    if owner == "conv1d":  # (C, K, 1)
        k = shape[1]
        return d.to32(d.normal(shape) / math.sqrt(k))
    if len(shape) in (2, 3):  # linears, and experts stacked [E, out, in]
        fan_in = shape[-1]
        std = 1.0 / math.sqrt(fan_in)
        if owner in _OUT_PROJ:
            std *= residual_gain
        return d.to32(std * d.normal(shape))
    return d.to32(0.02 * d.normal(shape))


def _output_table(vocab: int, hidden: int, d: Draws, *, logit_std: float,
                  frequent_ids: np.ndarray, frequent_scale: float):
    """Rows whose dot product with a unit-RMS hidden state has std ``logit_std``."""
    w = d.to32(d.normal((vocab, hidden))) * (logit_std / math.sqrt(hidden))
    if len(frequent_ids):
        w = d.scale_rows(w, frequent_ids, frequent_scale)
    return w


# --------------------------------------------------------------------------- checkpoint
def _dtype(name: str):
    import mlx.core as mx

    return {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}[name]


def make_tiny_checkpoint(
    out_dir: Union[str, Path],
    *,
    hidden_size: int = 64,
    num_layers: int = 4,
    full_attention_interval: int = 2,
    vocab_size: int = 512,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    intermediate_size: int = 128,
    linear_num_value_heads: int = 4,
    linear_num_key_heads: int = 2,
    linear_key_head_dim: int = 16,
    linear_value_head_dim: int = 16,
    linear_conv_kernel_dim: int = 4,
    partial_rotary_factor: float = 0.25,
    rope_theta: float = 100000.0,
    rms_norm_eps: float = 1e-6,
    max_position_embeddings: int = 4096,
    mtp_num_hidden_layers: int = 1,
    seed: int = 0,
    bits: Optional[int] = 4,
    group_size: int = 32,
    mtp_bits: Optional[int] = 4,
    mtp_group_size: Optional[int] = None,
    quantize_fc: bool = False,
    tie_word_embeddings: bool = True,
    zero_centered_norms: bool = True,
    write_convention_keys: bool = True,
    hidden_variant: str = "pre_norm",
    concat_order: str = "embedding_hidden",
    dtype: str = "float32",
    mtp_dtype: str = "bfloat16",
    key_prefix: str = "",
    sidecar_path: str = DEFAULT_SIDECAR,
    sidecar_keys: str = "both",
    write_sidecar: bool = True,
    write_tensor_count: bool = True,
    mtp_weight_scale: float = 1.0,
    logit_std: float = 2.0,
    frequent_tokens: int = 8,
    frequent_scale: float = 3.0,
    norm_std: float = 0.05,
    residual_gain: float = 4.0,
    quant_overrides: Optional[dict] = None,
    max_shard_bytes: Optional[int] = None,
    big_draws: Optional[Draws] = None,
    big_from: int = 1 << 20,
    overwrite: bool = True,
    template: str = "chatml",
    family: str = "qwen3_5",
    layout: str = "mlx",
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    moe_intermediate_size: int = 32,
    shared_expert_intermediate_size: int = 32,
    mtp_gate_bits: int = 8,
    gemma4: Optional[dict] = None,
    vision: Optional[dict] = None,
) -> Path:
    """Write a random-weight Qwythos-layout checkpoint into ``out_dir`` and return its path.

    ``bits=None`` (or 0) keeps the trunk in ``dtype``; otherwise the trunk is quantized the
    way ``mlx_lm.convert -q`` does it (linears and embedding whose input dim divides by
    ``group_size``). ``mtp_bits=None`` writes an unquantized head (15 tensors); otherwise
    the 7 linears of the MTP layer are affine-quantized (29 tensors, 31 with ``quantize_fc``).
    ``sidecar_keys`` says which config keys register ``sidecar_path``: ``both``
    (``mtp_file`` and ``mlx_lm_extra_tensors.mtp_file``, as OptiQ writes), ``extra``,
    ``mtp_file`` or ``none`` (the loader must find it at a default location).
    ``write_sidecar=False`` makes a checkpoint with no MTP head at all.
    ``big_draws`` (``mlx_draws(seed)``) draws the trunk's tensors of ``big_from`` values or more
    there instead of with NumPy (the same rules, other values): scripts/gpu/gpu_make_checkpoint.py.
    ``quant_overrides`` (``{"lm_head": 8, "embed_tokens": 8}``: module-path suffix -> bits)
    gives those trunk modules their own bits, recorded per path in ``quantization`` the way
    mlx-lm's mixed-precision recipes (and OptiQ) write it.
    ``template="qwen3_5"`` writes a Qwen3.5-style chat template (tools, tool calls, a
    ``<think>`` block opened by the generation prompt, ``enable_thinking``) and its added tokens.
    ``max_shard_bytes`` splits the trunk into ``model-0000N-of-0000M.safetensors``.
    ``vision`` (a dict, ``{}`` for the defaults of scripts/checkpoints/tiny_vision.py) adds Qwen3.5's vision
    tower beside the trunk (``model.visual.*`` in the ``hf`` layout, ``vision_tower.*`` in the
    ``mlx`` one), its ``vision_config``, the image tokens and preprocessor_config.json.

    ``family``: ``qwen3_5`` (dense), ``qwen3_5_moe`` (routed experts in every layer and in the
    head, stored fused: ``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj``; config keys
    of Qwen3_5MoeTextConfig), ``qwen3_next`` (flat config.json, fused ``in_proj_qkvz`` /
    ``in_proj_ba``, experts one tensor each: ``experts.{e}.{gate,up,down}_proj.weight``) or
    ``gemma4`` (a backbone and its assistant drafter in ``out_dir/assistant``, written by
    scripts/checkpoints/tiny_gemma4.py; ``gemma4={"size": "large", ...}`` passes its own options).
    ``layout``: ``mlx`` (an ``mlx_lm convert`` conversion, head stripped, plus the head as a
    sidecar with Hugging Face names; a quantized MoE head keeps its router gates at
    ``mtp_gate_bits``, registered per tensor in ``mtplx_mtp_quantization``) or ``hf`` (the
    original Hugging Face checkpoint: float (``dtype``), Hugging Face tensor names, conv1d as
    [C, 1, K], RMSNorm weights stored zero-centred, ``mtp.*`` inside the shards, no sidecar and
    no ``mtp_*`` convention keys; ``bits``/``mtp_bits``/sidecar options do not apply).
    """
    if family == "gemma4":   # a backbone and its assistant drafter: scripts/checkpoints/tiny_gemma4.py
        from scripts.checkpoints.tiny_gemma4 import make_tiny_gemma4

        common = dict(layout=layout, hidden_size=hidden_size, vocab_size=vocab_size, seed=seed,
                      bits=bits if layout == "mlx" else None, group_size=group_size, template=template,
                      overwrite=overwrite, max_position_embeddings=max_position_embeddings)
        return make_tiny_gemma4(out_dir, **{**common, **(gemma4 or {})})
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.utils import get_total_parameters, quantize_model, save_config

    bits = bits or None
    mtp_bits = mtp_bits or None
    mtp_group_size = mtp_group_size or group_size
    if hidden_variant not in ("pre_norm", "post_norm"):
        raise ValueError("hidden_variant must be 'pre_norm' or 'post_norm'")
    if concat_order not in ("embedding_hidden", "hidden_embedding"):
        raise ValueError("concat_order must be 'embedding_hidden' or 'hidden_embedding'")
    if sidecar_keys not in SIDECAR_KEY_MODES:
        raise ValueError(f"sidecar_keys must be one of {SIDECAR_KEY_MODES}")
    if key_prefix not in ("", "language_model."):
        raise ValueError("key_prefix must be '' or 'language_model.'")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    if layout == "hf":  # an original checkpoint: float weights, the head inside, HF's own config
        bits = mtp_bits = None
        write_convention_keys = False
    moe = family != "qwen3_5"

    out = Path(out_dir)
    if out.exists() and overwrite:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(seed)

    text_config = {
        "model_type": "qwen3_5_text",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "linear_num_value_heads": linear_num_value_heads,
        "linear_num_key_heads": linear_num_key_heads,
        "linear_key_head_dim": linear_key_head_dim,
        "linear_value_head_dim": linear_value_head_dim,
        "linear_conv_kernel_dim": linear_conv_kernel_dim,
        "full_attention_interval": full_attention_interval,
        "layer_types": [
            "full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
            for i in range(num_layers)
        ],
        "vocab_size": vocab_size,
        "rms_norm_eps": rms_norm_eps,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "attn_output_gate": True,
        "hidden_act": "silu",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": rope_theta,
            "partial_rotary_factor": partial_rotary_factor,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "mtp_num_hidden_layers": mtp_num_hidden_layers,
        "mtp_use_dedicated_embeddings": False,
        "dtype": dtype,
    }
    if moe:  # Qwen3_5MoeTextConfig's / Qwen3NextConfig's keys
        text_config.update(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
                           moe_intermediate_size=moe_intermediate_size,
                           shared_expert_intermediate_size=shared_expert_intermediate_size,
                           router_aux_loss_coef=0.001, output_router_logits=False)
    if family == "qwen3_5_moe":
        text_config["model_type"] = "qwen3_5_moe_text"
        del text_config["intermediate_size"]  # every layer is routed
    if family == "qwen3_next":  # flat, RoPE keys at the top, every layer routed
        rope = text_config.pop("rope_parameters")
        for k in ("model_type", "attn_output_gate", "dtype"):
            text_config.pop(k)
        text_config.update(model_type="qwen3_next", rope_theta=rope["rope_theta"],
                           partial_rotary_factor=rope["partial_rotary_factor"], rope_scaling=None,
                           decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)

    # --- tokenizer (fixes the special ids) -------------------------------------------
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {sorted(TEMPLATES)}")
    if vision is not None:
        from scripts.checkpoints import tiny_vision

        vision = {**tiny_vision.DEFAULTS, **vision}
    special_ids = write_tokenizer(out, vocab_size, max_position_embeddings, template,
                                   tiny_vision.VISION_TOKENS if vision is not None else ())
    eos_id = special_ids[EOS_TOKEN]
    text_config["eos_token_id"] = eos_id
    text_config["pad_token_id"] = special_ids[PAD_TOKEN]

    # --- trunk -------------------------------------------------------------------------
    model, args = _trunk_model(family, text_config)
    params = dict(tree_flatten(model.parameters()))
    n_special = (len(SPECIAL_TOKENS) + (len(QWEN35_TOKENS) if template == "qwen3_5" else 0)
                 + (len(tiny_vision.VISION_TOKENS) if vision is not None else 0))
    frequent_ids = np.array([], dtype=np.int64)
    if frequent_tokens > 0:
        # Ordinary BPE ids (not bytes-only, not specials/fillers) become "frequent".
        lo, hi = 256, vocab_size - n_special
        if hi - lo < frequent_tokens:
            lo = 0
        frequent_ids = np.sort(rng.choice(np.arange(lo, hi), size=frequent_tokens, replace=False))
    new = {}
    small = numpy_draws(rng)
    for name in sorted(params):
        shape = params[name].shape
        d = big_draws if big_draws is not None and math.prod(shape) >= big_from else small
        if name.endswith("embed_tokens.weight"):
            if tie_word_embeddings:
                w = _output_table(vocab_size, hidden_size, d, logit_std=logit_std,
                                  frequent_ids=frequent_ids, frequent_scale=frequent_scale)
            else:
                w = d.to32(d.normal(shape))
        elif name.endswith("lm_head.weight"):
            w = _output_table(vocab_size, hidden_size, d, logit_std=logit_std,
                              frequent_ids=frequent_ids, frequent_scale=frequent_scale)
        else:
            w = _init_param(name, shape, d, num_layers=num_layers, norm_std=norm_std,
                            residual_gain=residual_gain)
        new[name] = w
    tdt = _dtype(dtype)
    cast = getattr(model, "cast_predicate", lambda k: not k.endswith("A_log"))
    from mlx.utils import tree_unflatten

    model.update(tree_unflatten([
        (k, mx.array(v).astype(tdt) if cast(k) else mx.array(v)) for k, v in new.items()   # (an mx.array too)
    ]))
    if family == "qwen3_next":
        config = {"architectures": ["Qwen3NextForCausalLM"], **text_config, "torch_dtype": dtype}
    else:
        config = {
            "architectures": ["Qwen3_5ForConditionalGeneration" if family == "qwen3_5"
                              else "Qwen3_5MoeForConditionalGeneration"],
            "model_type": family,
            "text_config": text_config,
            "tie_word_embeddings": tie_word_embeddings,
            "eos_token_id": eos_id,
            "torch_dtype": dtype,
        }
    if bits is not None:
        with contextlib.redirect_stdout(io.StringIO()):
            model, config = quantize_model(model, config, group_size, bits, mode="affine",
                                           quant_predicate=_override_predicate(
                                               quant_overrides, group_size))
    mx.eval(model.parameters())

    weights = dict(tree_flatten(model.parameters()))
    tower = {}
    if vision is not None:   # the tower beside the trunk, its config, tokens and processor
        vc = tiny_vision.vision_config(vision, hidden_size)
        tower = tiny_vision.tower_tensors(vc, rng, layout, vision["weight_scale"])
        tok = json.loads((out / "tokenizer.json").read_text())
        ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
        config.update(vision_config=vc, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                      vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
        tiny_vision.write_processor(out, vision)
    # --- MTP head ----------------------------------------------------------------------
    tensors, gate_params = {}, {}
    if write_sidecar:
        tensors, gate_params = _mtp_tensors(
            family, text_config, rng, hidden_size=hidden_size, head_dim=head_dim,
            n_layers=mtp_num_hidden_layers, fai=full_attention_interval,
            mtp_bits=mtp_bits, mtp_group_size=mtp_group_size, quantize_fc=quantize_fc,
            zero_centered=zero_centered_norms, norm_std=norm_std,
            weight_scale=mtp_weight_scale, mtp_dtype=_dtype(mtp_dtype), num_layers=num_layers,
            residual_gain=residual_gain, gate_bits=mtp_gate_bits,
        )
    if layout == "hf":
        weights = {**_hf_names(family, weights), **tower, **tensors}
        save_trunk(out, weights, get_total_parameters(model), max_shard_bytes)
        config.pop("mtp_tensor_count", None)
        save_config(config, out / "config.json", keep_vision_config=vision is not None)
        (out / "generation_config.json").write_text(json.dumps(
            {"eos_token_id": [eos_id], "pad_token_id": special_ids[PAD_TOKEN]}, indent=2))
        return out
    save_trunk(out, {**weights, **tower}, get_total_parameters(model), max_shard_bytes)

    if write_sidecar:
        tensors = {key_prefix + k: v for k, v in tensors.items()}
        path = out / sidecar_path
        path.parent.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(path), tensors, metadata={"format": "mlx"})
        if sidecar_keys in ("both", "mtp_file"):
            config["mtp_file"] = sidecar_path
        if sidecar_keys in ("both", "extra"):
            config["mlx_lm_extra_tensors"] = {"mtp_file": sidecar_path}
        if mtp_bits is not None:
            config["mtplx_mtp_quantization"] = {
                "bits": mtp_bits, "group_size": mtp_group_size, "mode": "affine",
                "policy": "cyankiwi", "prequantized": True, **gate_params,
            }
            config["mtp_policy"] = "cyankiwi"
        if write_tensor_count:
            config["mtp_tensor_count"] = len(tensors)
    if write_convention_keys:
        config["mtp_hidden_variant"] = hidden_variant
        config["mtp_concat_order"] = concat_order
        config["mtp_norm_convention"] = "zero_centered" if zero_centered_norms else "standard"

    save_config(config, out / "config.json", keep_vision_config=vision is not None)
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [eos_id], "pad_token_id": special_ids[PAD_TOKEN]}, indent=2))
    return out


FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "gemma4")
LAYOUTS = ("mlx", "hf")


def _trunk_model(family: str, text_config: dict):
    """mlx-lm's model of the family, built from its config (random weights)."""
    from mlx_lm.models import qwen3_5, qwen3_5_moe, qwen3_next

    cfg = json.loads(json.dumps(text_config))
    if family == "qwen3_next":
        args = qwen3_next.ModelArgs.from_dict(cfg)
        return qwen3_next.Model(args), args
    module = qwen3_5 if family == "qwen3_5" else qwen3_5_moe
    args = module.ModelArgs.from_dict({"model_type": family, "text_config": cfg})
    return module.Model(args), args


HF_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
            ".q_norm.weight", ".k_norm.weight")


def _hf_names(family: str, weights: dict) -> dict:
    """mlx-lm's trunk weights -> the original Hugging Face checkpoint's (the inverse of mlx-lm's
    sanitize): names, conv1d [C, 1, K], RMSNorm weights zero-centred, experts fused (Qwen3.5-MoE)
    or one tensor each (Qwen3-Next)."""
    out = {}
    for name, v in weights.items():
        if family != "qwen3_next":
            name = name.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head.", "lm_head.")
        if "conv1d.weight" in name:
            v = v.swapaxes(1, 2)
        if name.endswith(HF_NORMS) and v.ndim == 1:
            v = v - 1.0
        out[name] = v
    return hf_experts(family, out)


def hf_experts(family: str, tensors: dict) -> dict:
    """`...mlp.switch_mlp.{gate,up,down}_proj.weight` (stacked over experts, as mlx-lm keeps them)
    -> Hugging Face's: `...mlp.experts.gate_up_proj` (gate then up) and `...mlp.experts.down_proj`
    for Qwen3.5-MoE, `...mlp.experts.{e}.{gate,up,down}_proj.weight` for Qwen3-Next."""
    import mlx.core as mx

    out, fused = {}, {}
    for name, v in tensors.items():
        if ".switch_mlp." not in name:
            out[name] = v
            continue
        prefix, proj = name.split(".switch_mlp.")
        proj = proj[: -len(".weight")]
        if family == "qwen3_next":
            for e in range(v.shape[0]):
                out[f"{prefix}.experts.{e}.{proj}.weight"] = v[e]
        elif proj == "down_proj":
            out[f"{prefix}.experts.down_proj"] = v
        else:
            fused.setdefault(prefix, {})[proj] = v
    for prefix, parts in fused.items():
        cat = mx.concatenate if isinstance(parts["gate_proj"], mx.array) else np.concatenate
        out[f"{prefix}.experts.gate_up_proj"] = cat([parts["gate_proj"], parts["up_proj"]], axis=-2)
    return out


def _override_predicate(overrides: Optional[dict], group_size: int):
    if not overrides:
        return None

    def predicate(path, module):
        for suffix, b in overrides.items():
            if path.endswith(suffix):
                return {"group_size": group_size, "bits": int(b), "mode": "affine"}
        return True

    return predicate


def _mtp_tensors(family, text_config, rng, *, hidden_size, head_dim, n_layers, fai, mtp_bits, mtp_group_size,
                 quantize_fc, zero_centered, norm_std, weight_scale, mtp_dtype, num_layers,
                 residual_gain, gate_bits):
    """The ``mtp.*`` tensors (Hugging Face names, without prefix) in the stored form, and the
    per-tensor quantization of a quantized MoE head's router gates (for config.json)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    H = hidden_size
    applied = {}  # name -> float32 numpy, as applied
    applied["fc.weight"] = (rng.standard_normal((H, 2 * H)) / math.sqrt(2 * H)).astype(np.float32)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        applied[f"{n}.weight"] = (1.0 + norm_std * rng.standard_normal(H)).astype(np.float32)
    layer = _head_layer(family, text_config, fai)
    assert not layer.is_linear
    layer_params = dict(tree_flatten(layer.parameters()))
    for i in range(n_layers):
        for name in sorted(layer_params):
            applied[f"layers.{i}.{name}"] = _init_param(
                name, layer_params[name].shape, numpy_draws(rng), num_layers=num_layers, norm_std=norm_std,
                residual_gain=residual_gain)
    if weight_scale != 1.0:
        for k, v in applied.items():
            if v.ndim >= 2:
                applied[k] = v * weight_scale
    applied = hf_experts(family, applied)

    out, gate_params = {}, {}
    for k in sorted(applied):
        v = applied[k]
        name = "mtp." + k
        if v.ndim == 1:
            stored = v - 1.0 if zero_centered else v
            out[name] = mx.array(stored).astype(mtp_dtype)
            continue
        w = mx.array(v).astype(mtp_dtype)
        is_fc = k == "fc.weight"
        if mtp_bits is None or (is_fc and not quantize_fc):
            out[name] = w
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        bits = mtp_bits
        if k.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):  # router gates: >= 8 bits
            bits = max(gate_bits, mtp_bits)
            gate_params[base] = {"bits": bits, "group_size": mtp_group_size}
        if w.shape[-1] % mtp_group_size:
            raise ValueError(f"{name}: input dim {w.shape[-1]} not divisible by "
                             f"mtp_group_size {mtp_group_size}")
        wq, scales, biases = mx.quantize(w, group_size=mtp_group_size, bits=bits)
        out[name] = wq
        out[base + ".scales"] = scales
        out[base + ".biases"] = biases
    mx.eval(out)
    return out, gate_params


def _head_layer(family: str, text_config: dict, fai: int):
    """The mlx-lm decoder layer an MTP head of this family is (routed experts for the MoE ones)."""
    from mlx_lm.models import qwen3_5, qwen3_next

    cfg = json.loads(json.dumps(text_config))
    if family == "qwen3_next":
        args = qwen3_next.ModelArgs.from_dict(cfg)
        layer = qwen3_next.Qwen3NextDecoderLayer(args, layer_idx=fai - 1)
        layer.mlp = qwen3_next.Qwen3NextSparseMoeBlock(args)
        return layer
    return qwen3_5.DecoderLayer(qwen3_5.TextModelArgs.from_dict(cfg), layer_idx=fai - 1)


def expected_mtp_shapes(*, hidden_size=64, head_dim=16, num_heads=4, num_kv_heads=2,
                        intermediate_size=128, mtp_num_hidden_layers=1) -> dict:
    """Logical (dequantized) shape of each base ``mtp.*`` tensor."""
    H, I = hidden_size, intermediate_size
    shapes = {
        "mtp.fc.weight": (H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": (H,),
        "mtp.pre_fc_norm_hidden.weight": (H,),
        "mtp.norm.weight": (H,),
    }
    for i in range(mtp_num_hidden_layers):
        p = f"mtp.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
            p + "self_attn.q_proj.weight": (2 * num_heads * head_dim, H),
            p + "self_attn.k_proj.weight": (num_kv_heads * head_dim, H),
            p + "self_attn.v_proj.weight": (num_kv_heads * head_dim, H),
            p + "self_attn.o_proj.weight": (H, num_heads * head_dim),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
        })
    return shapes


# --------------------------------------------------------------------------- CLI
def _bits(s: str) -> Optional[int]:
    return None if s.lower() in ("0", "none", "float", "") else int(s)


def _bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "y", "on"):
        return True
    if s.lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {s}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    ints = ["hidden_size", "num_layers", "full_attention_interval", "vocab_size", "num_heads",
            "num_kv_heads", "head_dim", "intermediate_size", "linear_num_value_heads",
            "linear_num_key_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "max_position_embeddings", "mtp_num_hidden_layers",
            "seed", "group_size", "frequent_tokens"]
    defaults = make_tiny_checkpoint.__kwdefaults__
    for name in ints:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=defaults[name])
    for name in ["partial_rotary_factor", "rope_theta", "rms_norm_eps", "mtp_weight_scale",
                 "logit_std", "frequent_scale", "norm_std", "residual_gain"]:
        p.add_argument("--" + name.replace("_", "-"), type=float, default=defaults[name])
    p.add_argument("--bits", type=_bits, default=defaults["bits"], help="trunk bits; 0 = float")
    p.add_argument("--mtp-bits", type=_bits, default=defaults["mtp_bits"],
                   help="MTP linear bits; 0 = unquantized head")
    p.add_argument("--mtp-group-size", type=int, default=None, help="default: --group-size")
    p.add_argument("--max-shard-bytes", type=int, default=None)
    p.add_argument("--quant-override", action="append", default=[], metavar="SUFFIX=BITS",
                   help="per-module trunk bits, e.g. lm_head=8 (repeatable)")
    for name in ["quantize_fc", "tie_word_embeddings", "zero_centered_norms",
                 "write_convention_keys", "write_sidecar", "write_tensor_count"]:
        p.add_argument("--" + name.replace("_", "-"), type=_bool, default=defaults[name],
                       metavar="BOOL")
    p.add_argument("--hidden-variant", choices=["pre_norm", "post_norm"],
                   default=defaults["hidden_variant"])
    p.add_argument("--concat-order", choices=["embedding_hidden", "hidden_embedding"],
                   default=defaults["concat_order"])
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=defaults["dtype"])
    p.add_argument("--mtp-dtype", choices=["bfloat16", "float32", "float16"],
                   default=defaults["mtp_dtype"])
    p.add_argument("--key-prefix", choices=["", "language_model."], default="")
    p.add_argument("--sidecar-path", default=DEFAULT_SIDECAR)
    p.add_argument("--sidecar-keys", choices=SIDECAR_KEY_MODES, default="both")
    p.add_argument("--template", choices=sorted(TEMPLATES), default="chatml",
                   help="chat template: ChatML, or Qwen3.5-style with tools and thinking")
    p.add_argument("--family", choices=FAMILIES, default="qwen3_5")
    p.add_argument("--layout", choices=LAYOUTS, default="mlx")
    p.add_argument("--gemma4-size", choices=["small", "large"], default="small",
                   help="family gemma4: E2B/E4B-like (centroid drafter head) or 31B-like (full head)")
    p.add_argument("--vision", action="store_true",
                   help="add Qwen3.5's vision tower beside the trunk (scripts/checkpoints/tiny_vision.py's defaults)")
    a = vars(p.parse_args(argv))
    out = a.pop("out")
    a["vision"] = {} if a.pop("vision") else None
    size = a.pop("gemma4_size")
    a["gemma4"] = {"size": size} if a["family"] == "gemma4" else None
    a["quant_overrides"] = {k: int(v) for k, v in
                            (item.split("=", 1) for item in a.pop("quant_override"))} or None
    path = make_tiny_checkpoint(out, **a)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
