"""A tiny checkpoint trained to give set replies to set conversations.

For tests whose point is what a model writes (a tool call, a malformed one): random weights
never write them, so the tiny Qwen3.5-layout checkpoint's last layer is trained on the CPU
(Adam, a few seconds) until greedy decoding reproduces each reply, and saved back in place. The engine,
the template and the server then run on real weights, unchanged.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence, Tuple

Example = Tuple[list, Optional[list], Optional[bool], str]   # messages, tools, enable_thinking, reply


def memorize(path: Path, examples: Sequence[Example], max_steps: int = 400, target_loss: float = 0.02) -> Path:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm import load

    from core import chat_prompt

    model, tok = load(str(path))
    rendering = type("Tokenizer", (), {"tokenizer": tok})()   # chat_prompt reads only .tokenizer
    seqs = []
    for messages, tools, thinking, reply in examples:  # rendered as the server renders them
        prompt = list(chat_prompt(rendering, messages, tools=tools, enable_thinking=thinking).ids)
        seqs.append((prompt + tok.encode(reply) + [tok.eos_token_id], len(prompt)))
    # One batch, padded at the end (a causal model never sees what follows), the loss on the
    # replies' tokens only.
    width = max(len(ids) for ids, _ in seqs)
    batch = mx.array([ids + [tok.eos_token_id] * (width - len(ids)) for ids, _ in seqs])
    learn = mx.array([[n <= i + 1 < len(ids) for i in range(width - 1)] for ids, n in seqs])

    def loss_fn(m):
        losses = nn.losses.cross_entropy(m(batch[:, :-1]), batch[:, 1:], reduction="none")
        return (losses * learn).sum() / learn.sum()

    # Only the last layer and the final norm learn: no gradient then runs back through the
    # Gated-DeltaNet layer's token-by-token recurrence or the embedding (training everything took
    # ~45 Adam steps of ~1 s on a 2-core CPU; this, ~15 steps of ~0.3 s).
    model.freeze()
    inner = model.language_model.model
    inner.layers[-1].unfreeze()
    inner.norm.unfreeze()
    model.train()
    opt, step = optim.Adam(learning_rate=1e-2), nn.value_and_grad(model, loss_fn)
    for _ in range(max_steps):
        loss, grads = step(model)
        if loss.item() < target_loss:  # these weights gave that loss: keep them, not the next step's
            break
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(weights), "the trained weights must keep the checkpoint's names"
    return path
