"""Checkpoint families: `load_adapter(path)` detects the family and returns its adapter.

A new family (for example DeepSeek-V3-style `eh_proj` heads) is one new module with a
`MODEL_TYPES` tuple and a `load(path, config, **options)` function, registered below.
"""
from __future__ import annotations

# Fast BLAS on Linux: must run before anything imports mlx.core (see adapters/runtime.py).
from .runtime import preload_blas as _preload; _preload()  # noqa: E402,E702,I001

from pathlib import Path
from typing import Optional, Union

from . import qwen3_5
from .checkpoint import open_checkpoint
from .contract import MTPContract
from .errors import CheckpointError

FAMILIES = {t: module for module in (qwen3_5,) for t in module.MODEL_TYPES}


def load_adapter(
    path: Union[str, Path], *, hidden_variant: Optional[str] = None, compute_dtype: str = "auto"
):
    """Load trunk + MTP head. compute_dtype: "auto" (fp32 on the CPU backend), "float32", "native"."""
    ckpt, config = open_checkpoint(path)
    family = FAMILIES.get(config["model_type"])
    if family is None:
        raise CheckpointError(
            f"{ckpt}: model_type '{config['model_type']}' is not supported. Supported: "
            f"{', '.join(sorted(FAMILIES))} (Qwen3.5 / Qwythos with an MTP sidecar)."
        )
    return family.load(ckpt, config, hidden_variant=hidden_variant, compute_dtype=compute_dtype)


__all__ = ["load_adapter", "CheckpointError", "MTPContract", "FAMILIES"]
