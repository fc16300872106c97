"""Exact speculative acceptance (Leviathan et al. 2023; Chen et al. 2023).

Accepting draft x with probability min(1, p(x)/q(x)) and replacing the first rejected
one with a draw from norm(max(p - q, 0)) makes every committed token follow p exactly.

The distributions that make this true, `acceptance_probability`, `correction_distribution`
and `bonus_distribution`, are functions of their own so that tests can enumerate a cycle's
every outcome with them (tests/test_acceptance_exact.py) instead of sampling it.
"""
from __future__ import annotations

from typing import List, Tuple

import mlx.core as mx

from .sampling import categorical


def residual(p: mx.array, q: mx.array) -> mx.array:
    """norm(max(p - q, 0)) row-wise; p itself where p and q coincide (nothing left over)."""
    r = mx.maximum(p - q, 0.0)
    mass = r.sum(axis=-1, keepdims=True)
    return mx.where(mass > 0, r / mx.maximum(mass, 1e-30), p)


def acceptance_probability(p, q, drafts: mx.array) -> mx.array:
    """min(1, p(x)/q(x)) for each draft x: p holds the target's rows for the D drafts (a row
    more is allowed: the bonus row), q the draft's D rows; either may be a support."""
    D = drafts.shape[0]
    (p_idx, p), (q_idx, q) = _as_support(p), _as_support(q)
    p_x = _at(None if p_idx is None else p_idx[:D], p[:D], drafts)
    q_x = _at(q_idx, q, drafts)  # > 0: x was drawn from q
    return mx.minimum(p_x / q_x, 1.0)


def correction_distribution(p, q) -> Tuple[object, mx.array]:
    """(indices or None, probabilities): what replaces a rejected draft at each of the D rows,
    norm(max(p - q, 0)) on p's columns (the residual lives where p does)."""
    (p_idx, p), (q_idx, q) = _as_support(p), _as_support(q)
    D = q.shape[0]
    if p_idx is None:
        q_on_p = q if q_idx is None else mx.put_along_axis(mx.zeros(p[:D].shape, p.dtype), q_idx, q, axis=-1)
    elif q_idx is None:
        q_on_p = mx.take_along_axis(q, p_idx[:D], axis=-1)
    else:
        q_on_p = (q[:, None, :] * (q_idx[:, None, :] == p_idx[:D, :, None])).sum(axis=-1)
    return (None if p_idx is None else p_idx[:D]), residual(p[:D], q_on_p)


def bonus_distribution(p, drafts: mx.array) -> Tuple[object, mx.array]:
    """(indices or None, probabilities): the target's row after the last draft, which the bonus
    token is drawn from when every draft passed."""
    D = drafts.shape[0]
    p_idx, p = _as_support(p)
    return (None if p_idx is None else p_idx[D:]), p[D:]


def verify_drafts(p, q, drafts: mx.array, keys: mx.array, greedy: bool = False) -> Tuple[mx.array, mx.array, mx.array]:
    """p: target [D+1, V] probabilities, q: draft [D, V], drafts [D] -> (accepted [D], corrections [D], bonus [1]).

    p and q may also be supports (indices [.., k], probabilities [.., k]) as SamplerConfig.support
    gives them with top_k on: the target is zero off its k columns, so are the residual and the
    bonus, and the test runs on k columns instead of the vocabulary. When greedy, p may be the
    target's logits: only its argmax is used.

    Everything stays on the device; the caller reads the three results in one sync and
    keeps corrections[n] (n = accepted prefix length) or the bonus when all D passed.
    Greedy, the test also takes a batch's rows at once: p [B, D+1, V], drafts [B, D].
    """
    D = drafts.shape[-1]
    if greedy:
        # p and q are one-hot: accept iff the draft is p's argmax; the residual (or p
        # itself) is then one-hot at that argmax, so the replacement is the argmax too.
        best = mx.argmax(p, axis=-1)
        return drafts == best[..., :D], best[..., :D], best[..., D:]
    accepted = mx.random.uniform(shape=(D,), key=keys[0]) < acceptance_probability(p, q, drafts)
    c_idx, c = correction_distribution(p, q)
    corrections = _token(c_idx, categorical(c, keys[1]))
    b_idx, b = bonus_distribution(p, drafts)
    bonus = _token(b_idx, categorical(b, keys[2]))
    return accepted, corrections, bonus


def _as_support(dist):
    return dist if isinstance(dist, tuple) else (None, dist)


def _at(idx, probs, tokens):
    """probs of `tokens` (one per row), from a dense row or a support."""
    if idx is None:
        return probs[mx.arange(tokens.shape[0]), tokens]
    return (probs * (idx == tokens[:, None])).sum(axis=-1)


def _token(idx, cols):
    return cols if idx is None else mx.take_along_axis(idx, cols[:, None], axis=-1)[:, 0]


def accepted_prefix(flags: List[bool]) -> int:
    n = 0
    while n < len(flags) and flags[n]:
        n += 1
    return n
