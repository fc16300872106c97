"""The vision tower of a tiny Qwen3.5 vision-language checkpoint (make_tiny_checkpoint(vision=...)).

Qwen3.5 checkpoints are vision-language models: config.json carries a `vision_config`, the
tower's tensors sit in the shards beside the text model's (KNOWLEDGE section 19), the tokenizer
has `<|vision_start|>`, `<|image_pad|>`, `<|vision_end|>`, and preprocessor_config.json says how
the image processor resizes. This writes all of that for a random tower of mlx-vlm's `qwen3_5`
VisionModel, in either layout:

- ``hf``: Hugging Face names (`model.visual.*`), the patch embedding as PyTorch's
  [out, C, T, P, P];
- ``mlx``: an mlx-vlm conversion (`vision_tower.*`), the patch embedding as MLX's [out, T, P, P, C].

The tower is small (2 blocks of width 32) and its pixel budget too (64x64 .. 128x128 pixels,
so 4 to 16 image tokens), so that a test's prefill stays cheap on a 2-core CPU.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

DEFAULTS = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                temporal_patch_size=2, spatial_merge_size=2, in_channels=3, num_position_embeddings=64,
                min_pixels=64 * 64, max_pixels=128 * 128, weight_scale=1.0)


def vision_config(opts: dict, out_hidden_size: int) -> dict:
    """config.json's `vision_config` (the keys Qwen3.5's published configs carry)."""
    return {
        "model_type": "qwen3_5", "depth": opts["depth"], "hidden_size": opts["hidden_size"],
        "hidden_act": "gelu_pytorch_tanh", "intermediate_size": opts["intermediate_size"],
        "num_heads": opts["num_heads"], "in_channels": opts["in_channels"], "patch_size": opts["patch_size"],
        "spatial_merge_size": opts["spatial_merge_size"], "temporal_patch_size": opts["temporal_patch_size"],
        "out_hidden_size": out_hidden_size, "num_position_embeddings": opts["num_position_embeddings"],
        "deepstack_visual_indexes": [],
    }


def tower_tensors(vc: dict, rng: np.random.Generator, layout: str, weight_scale: float = 1.0) -> dict:
    """Random tower weights under the layout's names, as mlx arrays (float32)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models.qwen3_5.config import VisionConfig
    from mlx_vlm.models.qwen3_5.vision import VisionModel

    fields = VisionConfig.__dataclass_fields__
    model = VisionModel(VisionConfig(**{k: v for k, v in vc.items() if k in fields}))
    out = {}
    for name, p in sorted(tree_flatten(model.parameters())):
        shape, leaf = p.shape, name.rsplit(".", 1)[-1]
        owner = name.rsplit(".", 2)[-2]
        if owner.startswith("norm"):   # LayerNorms: weight near 1, bias near 0
            w = (1.0 if leaf == "weight" else 0.0) + 0.05 * rng.standard_normal(shape)
        elif leaf == "bias":
            w = 0.02 * rng.standard_normal(shape)
        elif owner == "pos_embed":
            w = 0.1 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            w = rng.standard_normal(shape) * (weight_scale / math.sqrt(fan_in))
        w = mx.array(w.astype(np.float32))
        if layout == "hf":
            if name == "patch_embed.proj.weight":   # MLX [out, T, P, P, C] -> PyTorch [out, C, T, P, P]
                w = w.transpose(0, 4, 1, 2, 3)
            out["model.visual." + name] = w
        else:
            out["vision_tower." + name] = w
    return out


def write_processor(out: Path, opts: dict) -> None:
    """preprocessor_config.json as Qwen3.5's (Qwen2VLImageProcessorFast; size in pixels)."""
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "patch_size": opts["patch_size"], "temporal_patch_size": opts["temporal_patch_size"],
        "merge_size": opts["spatial_merge_size"], "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "size": {"shortest_edge": opts["min_pixels"], "longest_edge": opts["max_pixels"]},
    }, indent=2))
