"""Start one rank of a pipeline: check the ranks agree, load, split, then serve or return.

Every rank first sends the others a fingerprint of its code (the engine's sources) and of its
checkpoint (config.json and the names and sizes of its weight files), and how much memory it
has. A rank with another checkpoint or another version of the code is refused by every rank,
naming it, before anything is loaded: a pipeline of mismatched layers would answer wrongly
without ever failing.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, List, Optional, Union

import mlx.core as mx

from ..errors import CheckpointError
from .adapter import PipelineAdapter
from .split import split_layers
from .stage import Stage
from .wire import Link
from .worker import serve

_REPO = Path(__file__).resolve().parents[2]


class PipelineError(RuntimeError):
    pass


def _digest(parts) -> List[int]:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    d = h.digest()
    return [int.from_bytes(d[i:i + 4], "little") & 0x7FFFFFFF for i in (0, 4)]


def code_fingerprint() -> List[int]:
    files = sorted(f for pkg in ("core", "adapters") for f in (_REPO / pkg).rglob("*.py"))
    return _digest([f.relative_to(_REPO).as_posix().encode() + b"\0" + f.read_bytes() for f in files])


def _ends(f: Path, n: int = 1 << 16) -> bytes:
    """A weight file's first and last n bytes: its safetensors header (names, shapes, offsets) and
    some of its data, so that two conversions of one shape differ, without reading 200 GB."""
    with open(f, "rb") as fh:
        head = fh.read(n)
        fh.seek(max(0, f.stat().st_size - n))
        return head + fh.read(n)


def checkpoint_fingerprint(path: Path) -> List[int]:
    weights = sorted(p for p in path.rglob("*.safetensors"))
    return _digest([(path / "config.json").read_bytes()]
                   + [f"{p.relative_to(path).as_posix()}:{p.stat().st_size}".encode() + _ends(p) for p in weights])


def memory_mb() -> int:
    """This machine's memory in MiB (the split's weight; on one host every rank reports the same)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20)
    except (ValueError, OSError, AttributeError):
        return 1


def check_ranks(everyone: List[List[int]], path: Path) -> None:
    """everyone[r] = code (2 ints), checkpoint (2 ints), memory: refuse a rank that differs from rank 0."""
    bad = []
    for r, v in enumerate(everyone[1:], 1):
        if v[0:2] != everyone[0][0:2]:
            bad.append(f"rank {r} runs another version of the code (core/ and adapters/ differ from rank 0's)")
        if v[2:4] != everyone[0][2:4]:
            bad.append(f"rank {r} was started with another checkpoint (config.json or weight files differ from "
                       f"rank 0's {path.name})")
    if bad:
        raise PipelineError("refusing to start the pipeline: " + "; ".join(bad) + ". Start every rank with the "
                            "same checkout and the same checkpoint.")


def init(backend: str = "ring"):
    """The distributed group (MLX_RANK / MLX_HOSTFILE or mlx.launch's environment); strict: a
    process started without one is refused rather than run as a pipeline of one."""
    return mx.distributed.init(backend=backend, strict=True)


def start(path: Union[str, Path], group=None, *, backend: str = "ring", log: Callable[[str], None] = print,
          timeout: float = 60.0, log_load: Optional[Callable[[str], None]] = None,
          **load_kwargs) -> Optional[PipelineAdapter]:
    """Rank 0: the PipelineAdapter. Any other rank: serves until rank 0 says stop, returns None;
    a lost neighbour raises PipelineError (the rank's process should exit: its neighbours then see
    it go, and so does rank 0). `timeout`: rank 0's longest wait for one exchange (a prefill chunk
    through every rank included)."""
    from .. import load_adapter
    from ..checkpoint import open_checkpoint

    group = group or init(backend)
    link = Link(group)
    ckpt, config = open_checkpoint(path)
    try:
        everyone = link.gather(code_fingerprint() + checkpoint_fingerprint(Path(ckpt)) + [memory_mb()])
    except RuntimeError as exc:   # a rank that refused to start (its own output says why) or died
        raise PipelineError(f"rank {link.rank}: a rank left before the ranks compared checkpoints ({exc}); "
                            f"its output says why; exiting") from None
    check_ranks(everyone, Path(ckpt))
    if config.get("model_type") not in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        raise CheckpointError(f"{ckpt}: the pipeline runs the Qwen hybrid families (qwen3_5, qwen3_5_moe, "
                              f"qwen3_next); model_type '{config.get('model_type')}' is not one")
    split: List[range] = []

    def held_layers(sizes, extra):   # called by the loader before it reads any layer
        split.extend(split_layers(sizes, link.size, extra, capacity=[v[4] for v in everyone]))
        return split[link.rank]

    adapter = load_adapter(ckpt, log=log_load, held_layers=held_layers, **load_kwargs)
    stage = Stage(adapter, split[link.rank])
    if link.rank == 0:
        return PipelineAdapter(adapter, stage, link, split, [v[4] for v in everyone], backend, timeout, log)
    log(f"rank {link.rank}: layers {stage.held.start}-{stage.held.stop - 1}, following rank 0")
    try:
        serve(stage, link)
    except RuntimeError as exc:
        raise PipelineError(f"rank {link.rank}: lost a neighbour ({exc}); exiting") from None
    return None
