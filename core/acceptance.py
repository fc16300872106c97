"""Exact speculative acceptance (Leviathan et al. 2023; Chen et al. 2023).

Accepting draft x with probability min(1, p(x)/q(x)) and replacing the first rejected
one with a draw from norm(max(p - q, 0)) makes every committed token follow p exactly.
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


def verify_drafts(p: mx.array, q: mx.array, drafts: mx.array, keys: mx.array, greedy: bool = False) -> Tuple[mx.array, mx.array, mx.array]:
    """p [D+1, V] target, q [D, V] draft, drafts [D] -> (accepted [D], corrections [D], bonus [1]).

    When greedy, p may be the target's logits: only its argmax is used.

    Everything stays on the device; the caller reads the three results in one sync and
    keeps corrections[n] (n = accepted prefix length) or the bonus when all D passed.
    """
    D = drafts.shape[0]
    if greedy:
        # p and q are one-hot: accept iff the draft is p's argmax; the residual (or p
        # itself) is then one-hot at that argmax, so the replacement is the argmax too.
        best = mx.argmax(p, axis=-1)
        return drafts == best[:D], best[:D], best[D:]
    rows = mx.arange(D)
    p_x, q_x = p[rows, drafts], q[rows, drafts]
    u = mx.random.uniform(shape=(D,), key=keys[0])
    accepted = u * q_x < p_x  # u < p/q without a division; q_x > 0 since x was drawn from q
    corrections = categorical(residual(p[:D], q), keys[1])
    bonus = categorical(p[D:], keys[2])
    return accepted, corrections, bonus


def accepted_prefix(flags: List[bool]) -> int:
    n = 0
    while n < len(flags) and flags[n]:
        n += 1
    return n
