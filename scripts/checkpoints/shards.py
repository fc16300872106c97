"""Write a trunk's weights as mlx-lm does (``model.safetensors`` or shards, and the index), for every
family's maker (make_tiny_checkpoint.py, tiny_gemma4.py, scripts/gpu/gpu_make_checkpoint.py).
Imports nothing of the project."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

def save_trunk(out: Path, weights: dict, total_params: int, max_shard_bytes: Optional[int]):
    """``mlx_lm.utils.save_model`` semantics, with an optional small shard limit."""
    import mlx.core as mx

    limit = max_shard_bytes if max_shard_bytes else 5 << 30
    shards, size = [], 0
    for k, v in weights.items():
        if not shards or size + v.nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.nbytes
    fmt = "model-{:05d}-of-{:05d}.safetensors" if len(shards) > 1 else "model.safetensors"
    index = {
        "metadata": {"total_size": sum(v.nbytes for v in weights.values()),
                     "total_parameters": total_params},
        "weight_map": {},
    }
    for i, shard in enumerate(shards):
        name = fmt.format(i + 1, len(shards))
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})
        for k in shard:
            index["weight_map"][k] = name
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=4))
