"""Qwen3.5 (and Qwythos, its OptiQ conversions): a hybrid trunk of Gated-DeltaNet and gated
full-attention layers with a one-layer MTP head.

The package is the model written once and run by one backend:

- layers.py: the reference math (the Gated-DeltaNet layer with per-position capture, gated
  attention with partial RoPE, the dense or routed MLP, the head's input);
- backends.py: how it runs (MLX ops, CPU-compiled, CUDA kernels, Metal kernels), chosen once at load,
  from the runners in mlx_ops.py (MLX's own ops), cpu_runner.py (compiled CPU layers) and
  gpu_runner.py (the GPU kernels, compiled per layer);
- head.py: the MTP head's tensors (Hugging Face names) and the module they load into;
- adapter.py: the adapter contract of core/model.py (caches, forward, rollback, the head as
  drafter, prefix-cache snapshots);
- load.py: finding and checking the head (sidecar or the original checkpoint's shards) before
  the trunk is loaded, and a `Family` that says what differs between the Qwen hybrids.

Qwen3.5/3.6-MoE (adapters/qwen3_5_moe) and Qwen3-Next (adapters/qwen3_next) are the same
machinery with their own `Family`.
"""
from __future__ import annotations

from pathlib import Path

from mlx_lm.models import qwen3_5 as mlx_qwen3_5

from ..checkpoint import text_config
from ..options import LoadOptions
from .adapter import Captured, HybridAdapter
from .layers import separate_projections
from .load import Family, load_family

MODEL_TYPES = ("qwen3_5",)


def head_layer(tc: dict):
    args = mlx_qwen3_5.TextModelArgs.from_dict(tc)
    return mlx_qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)


def parts(model):
    lm = model.language_model
    tied = lm.args.tie_word_embeddings
    return lm.model, (lm.model.embed_tokens if tied else lm.lm_head), tied


FAMILY = Family(
    name="qwen3_5",
    label="a one-layer Qwen3.5 MTP head",
    experts=None,
    # Qwythos: the MLX-MTP reference validated pre-norm hidden states against MTPLX.
    default_variant="pre_norm",
    default_variant_source="Qwythos default",
    project=separate_projections,
    text_config=text_config,
    head_layer=head_layer,
    parts=parts,
    required=("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads",
              "intermediate_size"),
)


def load(path: Path, config: dict, options: LoadOptions) -> HybridAdapter:
    return load_family(FAMILY, path, config, options)


head_spec = FAMILY.head_spec


__all__ = ["MODEL_TYPES", "FAMILY", "load", "head_spec", "HybridAdapter", "Captured"]
