"""Gemma 4 (E2B, E4B, 26B-A4B, 31B) with its assistant drafter: the model list of the MLX Swift
MTP seed, run with exact acceptance.

The backbone is mlx-lm's gemma4_text trunk (an MLX conversion, `model_type: gemma4` with a
text_config, or the original Hugging Face checkpoint; mlx-lm's sanitize reads both). The
drafter is a second checkpoint (`gemma4_assistant`, `--drafter DIR` or BACKBONE/assistant/):
4 layers with queries only, over the backbone's cached K/V. Unlike Qwen's head it has no
history of its own, so its draft state is empty and rollback is the backbone's.

mlx-vlm runs these pairs but accepts a draft only when it equals the target's sampled token,
so at T > 0 acceptance falls to the chance that two independent draws agree; here the drafts
go through core's p/q test with the residual (core/acceptance.py), as every family's do.

- drafter.py: the drafter's tensors (Hugging Face names), its module and one draft step;
- adapter.py: the contract of core/model.py (plain KV caches, rollback by trimming);
- load.py: finding the drafter, the pair checks, loading both.
"""
from __future__ import annotations

from pathlib import Path

from ..checkpoint import text_config
from ..errors import CheckpointError
from ..options import LoadOptions
from .adapter import Gemma4Adapter
from .load import DRAFTER_DIR, load as _load

MODEL_TYPES = ("gemma4", "gemma4_text")
SEPARATE_DRAFTER = True   # load_adapter accepts --drafter for this family


class FAMILY:
    name = "gemma4"
    label = "a Gemma 4 assistant drafter (a separate checkpoint)"
    text_config = staticmethod(text_config)


def load(path: Path, config: dict, options: LoadOptions) -> Gemma4Adapter:
    return _load(path, config, options)


def head_spec(config: dict):
    """Gemma 4 keeps no MTP head inside the backbone: nothing to attach or inspect there."""
    raise CheckpointError(
        "Gemma 4's drafter is a separate checkpoint (the '-assistant' one), not an MTP head inside the "
        f"backbone: give it with --drafter DIR or put it in BACKBONE/{DRAFTER_DIR}/.")


__all__ = ["MODEL_TYPES", "FAMILY", "load", "head_spec", "Gemma4Adapter", "DRAFTER_DIR"]
