"""Where MLX CUDA keeps the kernels it compiles (ours included), across processes.

MLX compiles every CUDA kernel variant with NVRTC on first use and keeps the PTX in
`MLX_PTX_CACHE_DIR`, by default /tmp/mlx/<version>/ptx: gone at every reboot or fresh container,
and the first compile of our few-row matmul variants took ~217 s on a fresh H200 machine. So,
before MLX starts, the cache is pointed at ~/.cache/mtp-chat/ptx/<mlx version>/<GPU model and
compute capability> (one folder per GPU architecture: MLX names its entries by kernel and shape
only, and a PTX of one architecture loaded on another aborts). A user's own MLX_PTX_CACHE_DIR
wins. On a machine without MLX CUDA nothing is set. MLX writes only its own kernels there; ours
(mx.fast.cuda_kernel) it compiles in every process and never writes, so kernels/jit_cache.py
writes their entries itself, once per machine.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from pathlib import Path
from typing import Mapping, Optional

ENV = "MLX_PTX_CACHE_DIR"
CUDA_WHEELS = ("mlx-cuda-13", "mlx-cuda-12", "mlx-cuda")
_folder: Optional[str] = None   # what persist() settled on, for the start-up banner


def _installed(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_architecture() -> Optional[str]:
    """e.g. "NVIDIA-H200-sm90" from nvidia-smi, without touching CUDA; None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.strip().splitlines()[0] if out.strip() else ""
    if "," not in line:
        return None
    name, cap = (p.strip() for p in line.split(",", 1))
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") + "-sm" + cap.replace(".", "")


def cache_dir(env: Mapping[str, str], mlx_version: str, arch: str) -> Path:
    base = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache")
    return base / "mtp-chat" / "ptx" / mlx_version / arch


def persist(env=None, cuda: Optional[bool] = None, arch: Optional[str] = None) -> Optional[str]:
    """Point MLX's PTX cache at a folder that outlives the process (before mlx.core starts
    compiling); returns the folder, or None where there is no MLX CUDA or no GPU to name."""
    global _folder
    env = os.environ if env is None else env
    if env.get(ENV):
        _folder = env[ENV]
        return _folder
    if cuda is None:
        cuda = any(_installed(w) for w in CUDA_WHEELS)
    if not cuda:
        return None
    arch = arch or gpu_architecture()
    if arch is None:
        return None
    path = cache_dir(env, _installed("mlx") or "unknown", arch)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None   # MLX keeps its own default
    env[ENV] = _folder = str(path)
    return _folder


def folder() -> Optional[str]:
    """The folder MLX CUDA keeps compiled kernels in, when persist() chose or found one."""
    return _folder


def entries(path: Optional[str]) -> int:
    """How many compiled kernels the cache holds (0 without one): one .ptx file each (beside it
    MLX keeps the symbols, .txt, and for its own kernels the source, .cu)."""
    try:
        return sum(1 for _ in Path(path).rglob("*.ptx")) if path else 0
    except OSError:
        return 0
