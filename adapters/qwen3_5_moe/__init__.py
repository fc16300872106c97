"""Qwen3.5 / Qwen3.6 MoE (e.g. Qwen3.6-35B-A3B): the Qwen3.5 hybrid trunk with routed experts in
every layer, and an MTP head whose layer has the same routed MLP: a router (`mlp.gate`), the
experts stored fused as Hugging Face ships them (`mlp.experts.gate_up_proj` [E, 2I, H], split at
the middle into gate and up at load; `mlp.experts.down_proj` [E, H, I]) and a shared expert with
its sigmoid gate (`mlp.shared_expert.*`, `mlp.shared_expert_gate`).

Everything else is adapters/qwen3_5's: the layers, the backends, the head's attention, the
loader. The head reads the trunk's post-norm hidden state by default, as vLLM and SGLang run
these heads; `scripts/checkpoints/inspect_model.py --measure` says which wiring a checkpoint needs.

Keep this head in bf16: MTPLX measured acceptance falling to 5-11 % with a quantized MoE head
against 79-85 % in bf16. A quantized one loads, with a warning that says so.
"""
from __future__ import annotations

from pathlib import Path

from ..checkpoint import text_config
from ..options import LoadOptions
from ..qwen3_5 import head_layer, parts
from ..qwen3_5.adapter import HybridAdapter
from ..qwen3_5.layers import separate_projections
from ..qwen3_5.load import REQUIRED, Family, load_family

MODEL_TYPES = ("qwen3_5_moe",)

FAMILY = Family(
    name="qwen3_5_moe",
    label="a one-layer Qwen3.5-MoE MTP head (routed experts, fused)",
    experts="fused",
    default_variant="post_norm",
    default_variant_source="family default (post-norm, as vLLM and SGLang feed it)",
    project=separate_projections,
    text_config=text_config,
    head_layer=head_layer,     # mlx-lm's qwen3_5 DecoderLayer builds the routed MLP when num_experts > 0
    parts=parts,
    required=REQUIRED + ("num_experts", "moe_intermediate_size", "shared_expert_intermediate_size"),
)


def load(path: Path, config: dict, options: LoadOptions) -> HybridAdapter:
    return load_family(FAMILY, path, config, options)


head_spec = FAMILY.head_spec


__all__ = ["MODEL_TYPES", "FAMILY", "load", "head_spec"]
