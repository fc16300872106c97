"""Qwen3-Next (e.g. Qwen3-Next-80B-A3B): a hybrid trunk like Qwen3.5's whose Gated-DeltaNet fuses
its input projections (`in_proj_qkvz`, `in_proj_ba`, grouped per key head), with routed experts,
and an MTP head whose layer has routed experts stored one tensor each, as Hugging Face ships
them (`mlp.experts.{e}.{gate,up,down}_proj.weight`, stacked at load), a router and a shared
expert with its gate. Its config.json is flat (no text_config).

Everything else is adapters/qwen3_5's; the head reads the trunk's post-norm hidden state by
default, as vLLM and SGLang run it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from mlx_lm.models import qwen3_next as mlx_qwen3_next

from ..options import LoadOptions
from ..qwen3_5.adapter import HybridAdapter
from ..qwen3_5.layers import fused_projections
from ..qwen3_5.load import Family, load_family

MODEL_TYPES = ("qwen3_next",)


def head_layer(config: dict):
    args = mlx_qwen3_next.ModelArgs.from_dict(config)
    layer = mlx_qwen3_next.Qwen3NextDecoderLayer(args, layer_idx=args.full_attention_interval - 1)
    layer.mlp = mlx_qwen3_next.Qwen3NextSparseMoeBlock(args)  # the head's layer is routed whatever mlp_only_layers says
    return layer


def parts(model):
    tied = model.args.tie_word_embeddings
    return model.model, (model.model.embed_tokens if tied else model.lm_head), tied


FAMILY = Family(
    name="qwen3_next",
    label="a one-layer Qwen3-Next MTP head (routed experts, one tensor each)",
    experts="per_expert",
    default_variant="post_norm",
    default_variant_source="family default (post-norm, as vLLM and SGLang feed it)",
    project=fused_projections,
    text_config=lambda config: config,
    head_layer=head_layer,
    parts=parts,
    # every field mlx-lm's ModelArgs needs (it has no default for them)
    required=tuple(f.name for f in dataclasses.fields(mlx_qwen3_next.ModelArgs)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and f.name != "model_type"),
)


def load(path: Path, config: dict, options: LoadOptions) -> HybridAdapter:
    return load_family(FAMILY, path, config, options)


head_spec = FAMILY.head_spec


__all__ = ["MODEL_TYPES", "FAMILY", "load", "head_spec"]
