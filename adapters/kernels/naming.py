"""Kernel names that change with their code.

MLX keeps compiled custom kernels on disk (MLX_PTX_CACHE_DIR, which adapters/kernel_cache.py
points at a folder per MLX version and GPU) under the kernel's name and template arguments, not
its source. A kernel whose source changed under the same name would load the old compiled code
from a warm cache, silently. So each name carries a short hash of the code it compiles.
"""
from __future__ import annotations

import hashlib


def versioned(name: str, source: str, header: str = "") -> str:
    digest = hashlib.sha1(f"{header}\0{source}".encode()).hexdigest()[:10]
    return f"{name}_{digest}"
