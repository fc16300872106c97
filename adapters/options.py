"""How to load a checkpoint: the settings a family's loader reads, in one place.

Every value has its default in core/settings.py (so MTP_CHAT_COMPILED=0, MTP_CHAT_GPU_KERNELS=0
and the like work from the environment or a .env file, as every other setting); a caller may
override any of them. Nothing under adapters/ reads the environment itself, except the BLAS
preload (adapters/runtime.py) and the kernel cache's folder (adapters/kernel_cache.py: MLX's
own MLX_PTX_CACHE_DIR), which must run before mlx is imported and so before the settings
model can be (core imports mlx).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Optional


def _say(message: str) -> None:
    print(f"mtp-chat: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class LoadOptions:
    hidden_variant: Optional[str] = None  # None: the checkpoint's (config) or the family's default
    concat_order: Optional[str] = None    # None: the checkpoint's or embedding first
    compute_dtype: str = "auto"           # "auto" (fp32 on the CPU backend), "float32", "native"
    compiled: bool = True                 # the CPU-compiled backend for few-token forwards
    gpu_kernels: bool = True              # the adapter's own CUDA / Metal kernels
    gpu_fused: Optional[bool] = None      # the fused CUDA kernels; None: the backend's default
    gpu_trials: frozenset = frozenset()   # kernel changes not yet measured to pay (settings.gpu_trials)
    drafter: Optional[str] = None         # a drafter kept in its own checkpoint (Gemma 4's assistant)
    image_max_pixels: Optional[int] = None  # bounds the vision tower's resize (None: the checkpoint's own)
    # A pipeline's rank (adapters/pipeline/): (bytes of each trunk layer, bytes of the head and output
    # projection) -> the range of layers this rank holds; the others are never read from disk.
    held_layers: Optional[Callable] = field(default=None, compare=False)
    log: Callable[[str], None] = field(default=_say, compare=False)

    @classmethod
    def from_settings(cls, settings=None, **overrides) -> "LoadOptions":
        """The settings' values (core.settings: environment, .env), then any override not None."""
        if settings is None:
            from core.settings import get_settings

            settings = get_settings()
        base = cls(hidden_variant=settings.hidden_variant, compiled=settings.compiled,
                   gpu_kernels=settings.gpu_kernels,
                   gpu_fused=getattr(settings, "gpu_fused", None),
                   gpu_trials=frozenset(filter(None, getattr(settings, "gpu_trials", "").split(","))),
                   drafter=getattr(settings, "drafter", None),
                   image_max_pixels=getattr(settings, "image_max_pixels", None))
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})
