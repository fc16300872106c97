"""Loading a Qwen hybrid checkpoint with its MTP head, in either layout, for any of the families.

A `Family` says what differs between Qwen3.5, Qwen3.5/3.6-MoE and Qwen3-Next: where the language
model's config is, the Gated-DeltaNet's input projection, the head's MLP (dense, fused experts,
one tensor per expert), the mlx-lm classes, and the default head wiring. Everything else is
shared: the head is found and checked before the trunk is touched (nothing is half-loaded), the
trunk loads through mlx-lm (its sanitize reads both an MLX conversion and the original Hugging
Face names), the backend is chosen once.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from .. import sidecar
from ..contract import MTPContract
from ..cpu_layout import to_row_major
from ..errors import CheckpointError
from ..options import LoadOptions
from . import backends
from .adapter import HybridAdapter
from .head import NORMS, MTPHead, build_mtp_head, head_shapes, num_experts

REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads")


@dataclass(frozen=True)
class Family:
    name: str
    label: str                       # "a one-layer Qwen3.5 MTP head": what a refusal says was expected
    experts: Optional[str]           # the head's experts: None (dense), "fused" or "per_expert"
    default_variant: str             # the hidden state the head reads unless the checkpoint says
    default_variant_source: str
    project: Callable                # layers.separate_projections / layers.fused_projections
    text_config: Callable[[dict], dict]
    head_layer: Callable[[dict], nn.Module]    # text config -> the mlx-lm decoder layer the head runs as
    parts: Callable[[nn.Module], Tuple[nn.Module, nn.Module, bool]]  # model -> (inner, output, tied)
    required: Tuple[str, ...] = REQUIRED

    def head_spec(self, config: dict):
        """(expected head tensors: Hugging Face name -> logical shape, the norm tensors, label)."""
        return head_shapes(self.text_config(config), self.experts), NORMS, self.label


DEFAULT_CONCAT_ORDER = "embedding_hidden"


def head_in_trunk_dtype(head, projection) -> None:
    """Cast the head's floating parameters to the dtype the output projection computes in.

    Why: zero-centred norms are folded in fp32 (build_mtp_head), and one fp32 weight makes every
    activation after it fp32: on a bf16 model the head's linears and the lm_head then left the
    GPU's bf16 kernels, and a draft step cost 3.1 ms against the trunk's whole 6.2 ms step on the
    H200 (docs/bench/2026-12-02/GPU.md, section 4). The values round as mlx-lm's own fold
    (`v + 1.0` in the stored dtype) rounds the trunk's norms."""
    dtype = projection_dtype(projection)
    if dtype is not None:
        head.set_dtype(dtype)
        mx.eval(head.parameters())


def projection_dtype(projection):
    """The dtype a quantized or dense output projection computes in (its scales' or weight's)."""
    ref = projection.get("scales") if "scales" in projection else projection.get("weight")
    return ref.dtype if ref is not None and mx.issubdtype(ref.dtype, mx.floating) else None


def _unreadable_trunk_file(path: Path) -> Optional[Path]:
    """The first model*.safetensors whose header mlx cannot read (mx.load reads headers, data lazily)."""
    for f in sidecar.shard_files(path):
        try:
            mx.load(str(f))
        except Exception:  # noqa: BLE001
            return f
    return None


def _check_config(family: Family, path: Path, config: dict, tc: dict) -> None:
    for key in family.required:
        if key not in tc:
            where = "text_config has" if tc is not config else "it has"
            raise CheckpointError(f"{path / 'config.json'}: {where} no '{key}'.")
    n_mtp = tc.get("mtp_num_hidden_layers", 1)
    if not isinstance(n_mtp, int) or isinstance(n_mtp, bool) or n_mtp < 0:
        raise CheckpointError(
            f"{path / 'config.json'}: mtp_num_hidden_layers is {n_mtp!r}, expected a whole number (1 for Qwythos)."
        )
    if n_mtp == 0:
        raise CheckpointError(
            f"{path} has no MTP head: config.json says mtp_num_hidden_layers is 0. Speculative decoding "
            "needs the head; use a checkpoint converted with its MTP tensors (for example the MTPLX/OptiQ "
            "conversion). Plain autoregressive generation does not need this app."
        )
    if n_mtp > 1:
        raise CheckpointError(
            f"{path}: mtp_num_hidden_layers is {n_mtp}; only one-layer MTP heads (mtp.layers.0 only) are "
            "supported; a deeper stacked head is not. Use a checkpoint with a one-layer head (draft depth > 1 "
            "reuses that one layer, no second layer is needed)."
        )
    if family.experts is not None:
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
            if not tc.get(key):
                raise CheckpointError(f"{path / 'config.json'}: {key} is {tc.get(key)!r}; a {family.name} "
                                      "checkpoint has routed experts (num_experts > 0).")


def _expert_count(family: Family, tensors: dict, tc: dict) -> Optional[str]:
    """A sentence when the head's experts are not config.json's num_experts, naming a tensor."""
    E = num_experts(tc)
    if family.experts == "per_expert":
        seen = sorted({int(n.split(".")[5]) for n in tensors if n.startswith("mtp.layers.0.mlp.experts.")
                       and n.split(".")[5].isdigit()})
        if seen and seen != list(range(E)):
            extra = [e for e in seen if e >= E]
            gap = [e for e in range(E) if e not in seen]
            name = (f"mtp.layers.0.mlp.experts.{extra[0]}.gate_proj.weight" if extra
                    else f"mtp.layers.0.mlp.experts.{gap[0]}.gate_proj.weight")
            return (f"the MTP head has {len(seen)} experts where config.json says num_experts {E}"
                    f" ('{name}' is {'one too many' if extra else 'missing'}).")
    elif family.experts == "fused":
        t = tensors.get("mtp.layers.0.mlp.experts.gate_up_proj")
        if t is not None and t.ndim == 3 and t.shape[0] != E:
            return (f"the MTP head has {t.shape[0]} experts where config.json says num_experts {E} "
                    "('mtp.layers.0.mlp.experts.gate_up_proj' is stacked over its experts).")
    return None


class Elsewhere(nn.Module):
    """A trunk layer another rank of a pipeline holds: its kind, no weights."""

    def __init__(self, is_linear: bool):
        super().__init__()
        self.is_linear = is_linear


def _nbytes(module) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))   # shapes only: nothing is read


def hold_only(inner, output, tied: bool, head_tensors: dict, held_layers: Callable) -> None:
    """Keep the layers `held_layers(sizes, extra)` names; the others become `Elsewhere` before
    anything is read from disk (the trunk was loaded lazily), so a rank needs memory for its own."""
    extra = sum(t.nbytes for t in head_tensors.values()) + (0 if tied else _nbytes(output))
    held = held_layers([_nbytes(l) for l in inner.layers], extra)
    for i, layer in enumerate(inner.layers):
        if i not in held:
            inner.layers[i] = Elsewhere(layer.is_linear)
    mx.eval(inner.parameters(), output.parameters())   # the held layers, the embedding, the output, now


def load_family(family: Family, path: Path, config: dict, options: LoadOptions) -> HybridAdapter:
    tc = family.text_config(config)
    _check_config(family, path, config, tc)

    # The head is found and checked before the trunk is touched: nothing is half-loaded.
    found = sidecar.find(path, config)
    if found is None:
        raise CheckpointError(sidecar.no_head_message(path, config))
    where = found.files[0] if found.kind == "sidecar" else path
    quant = config.get("mtplx_mtp_quantization")
    count = _expert_count(family, found.tensors, tc)
    shapes = head_shapes(tc, family.experts)
    try:
        quantized, qparams = sidecar.check(
            str(where), found.tensors, shapes, quant, family.label, about=f" for hidden_size={tc['hidden_size']}",
            fix=sidecar.FIX_SIDECAR if found.kind == "sidecar" else sidecar.FIX_CHECKPOINT)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc} {count[0].upper()}{count[1:]}" if count else str(exc)) from None
    if count:
        raise CheckpointError(f"{where}: {count}")
    if found.kind == "checkpoint" and "mtp_norm_convention" not in config:
        # Hugging Face stores Qwen's RMSNorm weights as w - 1 (applied as 1 + w), trunk and head alike.
        convention, convention_source = "zero_centered", "Hugging Face layout"
    else:
        convention, convention_source = sidecar.detect_norm_convention(found.tensors, config, NORMS)

    variant = options.hidden_variant or config.get("mtp_hidden_variant")
    variant_source = "override" if options.hidden_variant else ("config" if variant else family.default_variant_source)
    variant = variant or family.default_variant
    if variant not in ("pre_norm", "post_norm"):
        where_v = "hidden_variant argument" if options.hidden_variant else f"{path / 'config.json'}: mtp_hidden_variant"
        raise CheckpointError(f"{where_v} '{variant}' is not 'pre_norm' or 'post_norm'.")
    concat_order = options.concat_order or config.get("mtp_concat_order", DEFAULT_CONCAT_ORDER)
    if concat_order not in ("embedding_hidden", "hidden_embedding"):
        raise CheckpointError(f"config.json: mtp_concat_order '{concat_order}' is not 'embedding_hidden' or 'hidden_embedding'.")

    if not sidecar.shard_files(path):
        raise CheckpointError(f"{path} has no model*.safetensors: the trunk weights are missing.")
    from mlx_lm.utils import dequantize_model, load as mlx_lm_load

    try:
        model, tokenizer = mlx_lm_load(str(path), lazy=options.held_layers is not None)
    except Exception as exc:
        bad = _unreadable_trunk_file(path)
        raise CheckpointError(
            f"{path}: mlx-lm could not load the trunk ({type(exc).__name__}: {exc}). "
            + (f"{bad.name} is corrupt or truncated: copy it again from the original checkpoint."
               if bad else
               "A truncated or corrupt model*.safetensors, a missing or misnamed tensor (named above), or "
               "missing tokenizer files are the usual causes.")
        ) from None

    inner, output, tied = family.parts(model)
    if options.held_layers is not None:
        hold_only(inner, output, tied, found.tensors, options.held_layers)
    head = MTPHead(tc["hidden_size"], tc.get("rms_norm_eps", 1e-6), family.head_layer(tc), concat_order)
    head = build_mtp_head(head, found.tensors, quantized, qparams, quant, convention == "zero_centered")

    projection = inner.embed_tokens if tied else output
    compute_dtype = options.compute_dtype
    if compute_dtype == "auto":
        # Quantized and half-precision matmuls are slower than fp32 on the CPU backend.
        compute_dtype = "float32" if mx.default_device() == mx.cpu else "native"
    if compute_dtype == "float32":
        for module in (model, head):
            dequantize_model(module)
            module.set_dtype(mx.float32)
            if mx.default_device() == mx.cpu:
                to_row_major(module)
        mx.eval(model.parameters(), head.parameters())
    else:
        head_in_trunk_dtype(head, projection)

    ropes = [l.self_attn.rope for l in inner.layers if not l.is_linear and not isinstance(l, Elsewhere)]
    ropes.append(head.layers[0].self_attn.rope)
    backend = backends.choose(compute_dtype, ropes, compiled=options.compiled, gpu_kernels=options.gpu_kernels,
                              fused=options.gpu_fused, trials=options.gpu_trials, log=options.log)
    notes = []
    if family.experts is not None and qparams is not None:
        notes.append(
            f"the MTP head's experts are quantized ({qparams['bits']}-bit): MoE heads lose acceptance when "
            "quantized (MTPLX measured 5-11 % against 79-85 % in bf16 on Qwen3.6-35B-A3B); keep the head in "
            "bf16 (mtp-chat attach-head without --bits)")
    if backend.note:
        notes.append(backend.note)
    if backend.name == "metal-kernels" and projection_dtype(projection) is not None:
        # MLX's own matmul serves the few-token linears there: how many rows a call computes as
        # alone is checked shape by shape, and rows go through it in calls no wider than that.
        linears = [m for part in (model, head) for _, m in part.named_modules() if type(m) in (nn.QuantizedLinear, nn.Linear)]
        notes += backend.few.check_rows(linears, projection_dtype(projection))
    for note in notes:
        options.log(note)

    from . import vision as vision_tower

    tower = vision_tower.load(path, config, tc, tokenizer, compute_dtype, options.image_max_pixels)
    if tower is None and config.get("vision_config"):
        options.log("config.json has a vision_config but the shards hold no tower (a text-only conversion): "
                    "pictures are refused")

    layer_kinds = tuple("linear" if l.is_linear else "full" for l in inner.layers)
    contract = MTPContract(
        hidden_size=tc["hidden_size"],
        vocab_size=tc["vocab_size"],
        num_layers=len(inner.layers),
        layer_kinds=layer_kinds,
        mtp_num_layers=1,
        hidden_variant=variant,
        concat_order=concat_order,
        norm_convention=convention,
        norm_convention_source=convention_source,
        hidden_variant_source=variant_source,
        trunk_quantization=config.get("quantization"),
        mtp_quantization=qparams,
        mtp_tensor_count=len(found.tensors),
        sidecar=found.where(path),
        family=family.name,
        num_experts=num_experts(tc) if family.experts else 0,
        layout="mlx + sidecar" if found.kind == "sidecar" else "Hugging Face",
    )
    return HybridAdapter(
        family.name, path, model, tokenizer, config, contract, head, compute_dtype, backend,
        inner=inner, output=output, tied=tied, project=family.project,
        context_length=int(tc.get("max_position_embeddings") or 4096), notes=tuple(notes), vision=tower,
    )
