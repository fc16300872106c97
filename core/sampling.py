"""One sampler definition for both lanes: p (target), q (draft) and the AR lane use `probs`.

Every method takes an optional `allowed` mask (bool [..., V], from core.constraints): tokens
outside it get -inf logits before anything else, so a grammar constrains p, q and the AR lane
through this one path."""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from .limits import SAMPLER_MAX_TEMPERATURE
from .settings import Settings

_DEFAULT = {name: field.default for name, field in Settings.model_fields.items()}


class NonFiniteLogitsError(RuntimeError):
    pass


# The support with top_k on: MLX's ops here, unless a backend set a kernel for it at load
# (use_row_topk; on CUDA adapters/kernels/cuda_topk.py unless the "topk-mlx" trial is on). Both
# lanes go through the same one, so AR and MTP keep sampling from one definition; a kernel's kept
# columns and probabilities are checked against these ops at load.
_row_topk = None


def use_row_topk(fn) -> None:
    """fn(logits, temperature, top_k, top_p, min_p) -> (indices, probabilities), or None for MLX's
    ops; `fn.supports(logits, top_k)` says which rows it takes. An optional
    `fn.draw(logits, u, temperature, top_k, top_p, min_p) -> (tokens, indices, probabilities)`,
    u one uniform in [0, 1) a row, also draws the token (SamplerConfig.draw)."""
    global _row_topk
    _row_topk = fn


@dataclass(frozen=True)
class SamplerConfig:
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off; min_p 0 = off.

    Order: temperature, top_k, top_p, min_p, renormalise.
    """

    temperature: float = _DEFAULT["temperature"]
    top_p: float = _DEFAULT["top_p"]
    top_k: int = _DEFAULT["top_k"]
    min_p: float = _DEFAULT["min_p"]

    def __post_init__(self):
        checks = [
            (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and 0 <= self.temperature <= SAMPLER_MAX_TEMPERATURE,
             f"temperature must be a number in [0, {SAMPLER_MAX_TEMPERATURE:g}] (0 = greedy), got {self.temperature!r}"),
            (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1,
             f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}"),
            (isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0,
             f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}"),
            (isinstance(self.min_p, (int, float)) and 0 <= self.min_p < 1,
             f"min_p must be in [0, 1) (0 = off), got {self.min_p!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @staticmethod
    def mask(logits: mx.array, allowed=None) -> mx.array:
        """logits with the tokens outside `allowed` at -inf (unchanged without a mask)."""
        return logits if allowed is None else mx.where(allowed, logits, -mx.inf)

    def probs(self, logits: mx.array, allowed=None) -> mx.array:
        """logits [..., V] -> fp32 probabilities [..., V] of the filtered distribution."""
        logits = self.mask(logits, allowed)
        if self.greedy:
            top = mx.argmax(logits, axis=-1, keepdims=True)
            return (mx.arange(logits.shape[-1]) == top).astype(mx.float32)
        idx, p = self.support(logits)
        return p if idx is None else _scatter(idx, p, logits.shape)

    def sample(self, logits: mx.array, key: mx.array, allowed=None) -> mx.array:
        """One token per row of logits [..., V], drawn from `probs` (argmax when greedy)."""
        return self.draw(logits, key, allowed)[0]

    def draw(self, logits: mx.array, key: mx.array, allowed=None):
        """(token, support) for a draft: the draw and the distribution it came from, as
        support = (indices or None, probabilities over them); support is None when greedy."""
        if self.greedy:
            return mx.argmax(self.mask(logits, allowed), axis=-1), None
        fn = _row_topk
        if allowed is None and getattr(fn, "draw", None) is not None and fn.supports(logits, self.top_k):
            # The support and the draw in the kernel's launches: inverse CDF at one uniform a row.
            # The same distribution as categorical's Gumbel-max; only the token a key gives differs.
            u = mx.random.uniform(shape=logits.shape[:-1], key=key)
            tok, idx, p = fn.draw(logits, u, self.temperature, self.top_k, self.top_p, self.min_p)
            return tok, (idx, p)
        idx, p = self.support(logits, allowed)
        j = categorical(p, key)
        if idx is None:
            return j, (None, p)
        return mx.take_along_axis(idx, j[..., None], axis=-1)[..., 0], (idx, p)

    def support(self, logits: mx.array, allowed=None):
        """(indices or None, probabilities over them): with top_k on, only k columns are kept,
        so the filter, the draw and the acceptance test work on k values, not the vocabulary."""
        fn = _row_topk
        if fn is not None and allowed is None and fn.supports(logits, self.top_k):
            return fn(logits, self.temperature, self.top_k, self.top_p, self.min_p)
        x = self.mask(logits.astype(mx.float32), allowed) / self.temperature
        idx = None
        if 0 < self.top_k < x.shape[-1]:
            idx = mx.argpartition(-x, self.top_k - 1, axis=-1)[..., : self.top_k]
            x = mx.take_along_axis(x, idx, axis=-1)
        p = mx.softmax(x, axis=-1)
        if self.top_p < 1.0:
            # Keep the smallest head of the sorted distribution whose mass reaches top_p.
            desc = -mx.sort(-p, axis=-1)
            before = mx.cumsum(desc, axis=-1) - desc
            cutoff = mx.min(mx.where(before < self.top_p, desc, mx.inf), axis=-1, keepdims=True)
            p = mx.where(p >= cutoff, p, 0.0)
        if self.min_p > 0:
            p = mx.where(p >= self.min_p * p.max(axis=-1, keepdims=True), p, 0.0)
        return idx, p / p.sum(axis=-1, keepdims=True)


def _scatter(idx: mx.array, p: mx.array, shape) -> mx.array:
    return mx.put_along_axis(mx.zeros(shape, dtype=mx.float32), idx, p, axis=-1)


def categorical(p: mx.array, key: mx.array) -> mx.array:
    """Draw one token per row of p [..., V]."""
    return mx.random.categorical(mx.log(p), axis=-1, key=key)


def all_finite(logits: mx.array) -> mx.array:
    # A NaN or an infinity anywhere makes the sum non-finite: one reduction, no mask pass.
    return mx.isfinite(logits.sum())


def sample_or_flag(sampler, logits: mx.array, key, allowed=None) -> mx.array:
    """The sampled token (int32), or -1 where the logit row is not finite: one value to read per
    step, no second sync (the AR lane, core/decoders.py, and a batch's AR steps, core/batch.py)."""
    return mx.where(all_finite(logits), sampler.sample(logits, key, allowed).astype(mx.int32), -1)


def greedy_rows_or_flag(logits: mx.array) -> mx.array:
    """logits [B, V] of B sequences sampled greedily without a mask -> B tokens (int32), each
    -1 where its own row is not finite: sample_or_flag of each row, in one launch for the batch.
    Exact per row: argmax compares within its row (ties to the lowest index either way), and a
    NaN or infinity makes its row's sum non-finite in any order."""
    ok = mx.isfinite(logits.sum(axis=-1))
    return mx.where(ok, mx.argmax(logits, axis=-1).astype(mx.int32), -1)


def check_finite(ok: bool, where: str) -> None:
    if not ok:
        raise NonFiniteLogitsError(
            f"the {where} produced NaN or infinite logits; no token was sampled. "
            "The weights are likely corrupt or the computation overflowed (try float32)."
        )


class KeyStream:
    """A private PRNG stream per decoder, so interleaved lanes stay reproducible."""

    def __init__(self, seed: int, active: bool = True):
        self.key = mx.random.key(seed) if active else None

    def next(self, n: int = 1):
        if self.key is None:  # greedy decoding draws nothing: no PRNG work on the hot path
            return None
        keys = mx.random.split(self.key, n + 1)
        self.key = keys[0]
        return keys[1] if n == 1 else keys[1:]
