"""Fast BLAS before mlx.core is imported (MLX's Linux CPU wheel bundles the slow reference BLAS):
the project's own preload, adapters.runtime, for the demo scripts that run outside the package."""
import sys
from pathlib import Path


def preload_openblas() -> dict:
    repo = str(Path(__file__).resolve().parent.parent.parent)
    if repo not in sys.path:
        sys.path.insert(0, repo)
    from adapters.runtime import preload_blas

    return preload_blas()
