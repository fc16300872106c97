"""Checkpoints for engine tests: random heads reject nearly everything; a 'mixed' head accepts some."""
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np
from scipy.stats import chi2

from adapters import load_adapter
from core import SamplerConfig

GREEDY = SamplerConfig(temperature=0)
# Tiny checkpoints for engine tests (scripts/make_tiny_checkpoint options). With make_mixed_head:
# MIXED's head agrees with the target on ~15-35 % of greedy drafts, SURE's on ~70-90 % of sampled
# ones (both accept and reject often: what a test of the acceptance rule needs); REJECTING's
# random head almost never agrees.
MIXED = dict(bits=None, frequent_tokens=0, logit_std=2.0, residual_gain=0.7, norm_std=0.05, seed=0)
SURE = {**MIXED, "residual_gain": 0.3}
REJECTING = dict(bits=4, seed=1, frequent_tokens=0, logit_std=2.0, residual_gain=1.0)


def load_modules_path(path, **kwargs):
    """The adapter with the compiled CPU decode path off: every forward through MLX's own ops
    (the "mlx" backend, bit-identical to mlx-lm's modules), the path GPUs (Metal, CUDA) run."""
    adapter = load_adapter(path, compiled=False, log=lambda m: None, **kwargs)
    assert adapter.backend.name == "mlx"
    return adapter


def make_mixed_head(path: Path) -> Path:
    """Rewrite the head's fc so the head copies the embedding path of the trunk.

    With a random trunk this makes the head's draft match the target's next-next token
    part of the time (about 15-35% at T=0), so cycles see both acceptances and rejections.
    Works on either layout: the sidecar, or the shard of an original checkpoint holding mtp.fc.
    """
    import json

    from adapters import sidecar

    found = sidecar.find(path, json.loads((path / "config.json").read_text()))
    for f in found.files:
        tensors = mx.load(str(f))
        key = next((k for k in tensors if sidecar.head_name(k) == "mtp.fc.weight"), None)
        if key is None:
            continue
        H = tensors[key].shape[0]
        tensors[key] = mx.concatenate([mx.eye(H), mx.zeros((H, H))], axis=1).astype(tensors[key].dtype)
        mx.save_safetensors(str(f), tensors)
        return path
    raise AssertionError(f"{path}: no mtp.fc.weight")


def exact_joint(adapter, sampler, prompt, n):
    """Exact distribution of the first n tokens under `sampler`, by enumeration."""
    out = {}
    eos = set(adapter.tokenizer.eos_token_ids)

    def walk(prefix, prob):
        if len(prefix) == n:
            out[tuple(prefix)] = prob
            return
        # the decoders' own path: prefill the prompt, then one token at a time
        cache = adapter.make_cache()
        pictures = getattr(prompt, "images", ())   # a core.stream.Prompt with pictures
        logits, _, _ = adapter.forward(mx.array([list(prompt)]), cache, all_logits=False,
                                       **({"images": pictures} if pictures else {}))
        for t in prefix:
            logits, _, _ = adapter.forward(mx.array([[t]]), cache)
        p = np.array(sampler.probs(logits[0, -1]))
        for t in np.nonzero(p)[0]:
            if int(t) in eos:  # generation ends; the EOS itself is not output
                out[tuple(prefix)] = out.get(tuple(prefix), 0.0) + prob * float(p[t])
            else:
                walk(prefix + [int(t)], prob * float(p[t]))

    walk([], 1.0)
    return out


def exact_constrained(adapter, sampler, prompt, n, make):
    """The exact joint distribution of the first n tokens under `sampler` and the grammar
    `make()` gives (a fresh core Constraint or Triggered, advanced over each prefix)."""
    out, eos = {}, set(adapter.tokenizer.eos_token_ids)

    def walk(prefix, prob):
        if len(prefix) == n:
            out[tuple(prefix)] = prob
            return
        c = make()
        c.advance(prefix)
        logits, _, _ = adapter.forward(mx.array([prompt + prefix]), adapter.make_cache(), all_logits=False)
        p = np.array(sampler.probs(logits[0, -1], c.allowed()))
        for t in np.nonzero(p)[0]:
            if int(t) in eos:
                out[tuple(prefix)] = out.get(tuple(prefix), 0.0) + prob * float(p[t])
            else:
                walk(prefix + [int(t)], prob * float(p[t]))

    walk([], 1.0)
    return out


def chi_square_pvalue(counts: Counter, expected: dict, n: int) -> float:
    cells = sorted(expected)
    exp = np.array([expected[c] * n for c in cells])
    obs = np.array([counts.get(c, 0) for c in cells])
    assert sum(counts.values()) == obs.sum(), "a sample fell outside the exact support"
    # pool cells with tiny expectations so the chi-square approximation holds
    small = exp < 5
    if small.any():
        exp = np.append(exp[~small], exp[small].sum())
        obs = np.append(obs[~small], obs[small].sum())
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(chi2.sf(stat, len(exp) - 1))


def marginal(joint: dict, positions) -> dict:
    out = {}
    for seq, pr in joint.items():
        if len(seq) > max(positions):
            key = tuple(seq[i] for i in positions)
            out[key] = out.get(key, 0.0) + pr
    total = sum(out.values())
    return {k: v / total for k, v in out.items()}


# The first seed that does so on tiny_checkpoint(template="qwen3_5"), tried first: the search from
# 0 took ~10-20 CPU-seconds per module; it runs again only if the tiny checkpoint's weights change.
FIRST_THINKING_SEED = 46


def seed_that_closes_thinking(adapter):
    """(seed, reply text): a seed whose sampled reply to "Hello" (T=1, depth 2, 40 tokens) ends
    its thinking once and then answers (the weights are random: the model closes the block by
    chance; a seed makes the draw reproducible)."""
    import pytest
    from core import SpeculativeDecoder, chat_prompt, split_reply

    prompt = chat_prompt(adapter, [{"role": "user", "content": "Hello"}])
    sampler = SamplerConfig(temperature=1.0, top_p=1.0, top_k=0)
    for seed in [FIRST_THINKING_SEED, *range(400)]:
        ids, _ = SpeculativeDecoder(adapter, sampler=sampler, seed=seed, depth=2).generate(prompt, max_tokens=40)
        text = adapter.tokenizer.decode(ids)
        reasoning, answer = split_reply(text, inside=True)
        if text.count("</think>") == 1 and "<think>" not in text and len(reasoning) > 5 and len(answer.strip()) > 6:
            return seed, text
    pytest.fail("no seed closes the thinking block")
