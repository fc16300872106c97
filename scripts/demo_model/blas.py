"""Fast BLAS before mlx.core is imported (MLX's Linux CPU wheel bundles the slow reference BLAS).

Uses the project's own preload (adapters.runtime) when importable, else loads OpenBLAS directly.
"""
import ctypes
import os
import sys
from pathlib import Path

CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
]


def preload_openblas(verbose: bool = False):
    repo = str(Path(__file__).resolve().parent.parent.parent)
    if repo not in sys.path:
        sys.path.insert(0, repo)
    try:
        from adapters.runtime import preload_blas

        return preload_blas()
    except Exception:  # noqa: BLE001
        pass
    if sys.platform != "linux":
        return None
    for p in CANDIDATES:
        if os.path.exists(p):
            try:
                ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                if verbose:
                    print("OpenBLAS preloaded:", p)
                return p
            except OSError:
                continue
    return None
