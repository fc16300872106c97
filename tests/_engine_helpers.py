"""Checkpoints for engine tests: random heads reject nearly everything; a 'mixed' head accepts some."""
import os
from pathlib import Path

import mlx.core as mx

from adapters import load_adapter


def load_modules_path(path, **kwargs):
    """The adapter with the compiled CPU decode path off: every forward through mlx-lm's own
    modules, the path GPUs (Metal, CUDA) run."""
    old = os.environ.get("MTP_CHAT_COMPILED")
    os.environ["MTP_CHAT_COMPILED"] = "0"
    try:
        adapter = load_adapter(path, **kwargs)
    finally:
        if old is None:
            del os.environ["MTP_CHAT_COMPILED"]
        else:
            os.environ["MTP_CHAT_COMPILED"] = old
    assert adapter._fast is None
    return adapter


def make_mixed_head(path: Path) -> Path:
    """Rewrite the sidecar's fc so the head copies the embedding path of the trunk.

    With a random trunk this makes the head's draft match the target's next-next token
    part of the time (about 15-35% at T=0), so cycles see both acceptances and rejections.
    """
    side = path / "optiq" / "mtp.safetensors"
    tensors = mx.load(str(side))
    H = tensors["mtp.fc.weight"].shape[0]
    fc = mx.concatenate([mx.eye(H), mx.zeros((H, H))], axis=1).astype(tensors["mtp.fc.weight"].dtype)
    tensors["mtp.fc.weight"] = fc
    mx.save_safetensors(str(side), tensors)
    return path
