"""Preload OpenBLAS before mlx.core is imported (MLX's Linux CPU wheel bundles the slow reference BLAS)."""
import ctypes
import os
import sys

CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
]


def preload_openblas(verbose: bool = False) -> str | None:
    if sys.platform != "linux":
        return None
    if "mlx.core" in sys.modules and verbose:
        print("warning: mlx.core already imported; OpenBLAS preload may have no effect")
    for p in CANDIDATES:
        if os.path.exists(p):
            try:
                ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                if verbose:
                    print("OpenBLAS preloaded:", p)
                return p
            except OSError:
                continue
    if verbose:
        print("OpenBLAS not found: MLX uses its bundled reference BLAS (slow). apt-get install libopenblas0-pthread")
    return None
