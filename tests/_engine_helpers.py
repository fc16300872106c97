"""Checkpoints for engine tests: random heads reject nearly everything; a 'mixed' head accepts some."""
from pathlib import Path

import mlx.core as mx


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
