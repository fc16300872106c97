"""Checkpoint families: `load_adapter(path)` detects the family and returns its adapter.

An adapter implements core.model.Adapter, the contract core decodes through. A family is a
package (adapters/qwen3_5/, adapters/qwen3_5_moe/, adapters/qwen3_next/, adapters/gemma4/) with a
`MODEL_TYPES` tuple, a `load(path, config, options)` function and, for the head checks of the inspection
scripts, `FAMILY.label` and `head_spec(config)`. To add one:

1. write its package: the layers as reference math (or reuse a family's, as the Qwen MoE and
   Next heads reuse adapters/qwen3_5), an adapter class with the contract's methods, a loader
   that checks its head before it loads the trunk and refuses a bad checkpoint naming the tensor;
2. register the package below;
3. teach scripts/checkpoints/make_tiny_checkpoint.py its config keys and tensor names, so that tests can
   make random checkpoints of it in both layouts (MLX conversion + sidecar, Hugging Face).

Nothing in core/ or webapp/ changes for a new family. Kernels any family can use live in
adapters/kernels/.
"""
from __future__ import annotations

# Fast BLAS on Linux: must run before anything imports mlx.core (see adapters/runtime.py).
from .runtime import preload_blas as _preload; _preload()  # noqa: E402,E702,I001
# MLX CUDA's compiled kernels kept across processes: before mlx.core starts (adapters/kernel_cache.py).
from .kernel_cache import persist as _persist; _persist()  # noqa: E402,E702,I001

from pathlib import Path
from typing import Callable, Optional, Union

from . import gemma4, qwen3_5, qwen3_5_moe, qwen3_next
from .checkpoint import open_checkpoint
from .contract import MTPContract
from .errors import CheckpointError
from .options import LoadOptions

FAMILIES = {t: package for package in (qwen3_5, qwen3_5_moe, qwen3_next, gemma4) for t in package.MODEL_TYPES}


def family_of(config: dict, where: Union[str, Path] = "config.json"):
    """The family package for a config.json's model_type, or a CheckpointError naming the ones there are."""
    family = FAMILIES.get(config.get("model_type"))
    if family is None:
        raise CheckpointError(
            f"{where}: model_type '{config.get('model_type')}' is not supported. Supported: "
            f"{', '.join(sorted(FAMILIES))} (Qwen3.5 / Qwythos, Qwen3.5/3.6-MoE and Qwen3-Next with their MTP head; "
            "Gemma 4 with its assistant drafter)."
        )
    return family


def load_adapter(
    path: Union[str, Path], *, hidden_variant: Optional[str] = None, compute_dtype: str = "auto",
    compiled: Optional[bool] = None, gpu_kernels: Optional[bool] = None, concat_order: Optional[str] = None,
    log: Optional[Callable[[str], None]] = None, settings=None, drafter: Optional[Union[str, Path]] = None,
    held_layers: Optional[Callable] = None,
):
    """Load trunk + MTP head. compute_dtype: "auto" (fp32 on the CPU backend), "float32", "native".

    compiled / gpu_kernels / hidden_variant / drafter: None takes the settings' value (core.settings).
    drafter: the directory of a drafter kept as its own checkpoint (Gemma 4's assistant).
    held_layers: a pipeline rank's choice of trunk layers (adapters/pipeline/; LoadOptions)."""
    ckpt, config = open_checkpoint(path)
    family = family_of(config, ckpt)
    if (drafter is not None or getattr(settings, "drafter", None)) and not getattr(family, "SEPARATE_DRAFTER", False):
        raise CheckpointError(f"{ckpt}: --drafter is for a drafter kept as its own checkpoint (Gemma 4's assistant); "
                              f"a {config.get('model_type')} checkpoint drafts with the MTP head inside it. "
                              "Leave --drafter out.")
    options = LoadOptions.from_settings(settings, hidden_variant=hidden_variant, compute_dtype=compute_dtype,
                                        compiled=compiled, gpu_kernels=gpu_kernels, concat_order=concat_order,
                                        log=log, drafter=None if drafter is None else str(drafter),
                                        held_layers=held_layers)
    return family.load(ckpt, config, options)


__all__ = ["load_adapter", "family_of", "CheckpointError", "MTPContract", "FAMILIES", "LoadOptions"]
