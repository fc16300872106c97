"""The speculative cycle is exact, computed rather than sampled.

Small hand-made target and draft "models" (a few tokens, logits that depend on the whole
context) go through the engine's own sampler (`SamplerConfig.support` / `probs`) and its own
acceptance functions (`acceptance_probability`, `correction_distribution`, `bonus_distribution`,
`accepted_prefix`).
For every draft sequence and every accept/reject outcome of a cycle at depth D, the test
multiplies out the probability of what the cycle emits, lets the target continue to D + 1
tokens, and asserts the result equals the target's own distribution of D + 1 tokens, to float
tolerance. Nothing is sampled, so a wrong ratio, a wrong residual or a wrong support handling
shows as a difference of the order of the probabilities themselves, never as noise.
"""
import itertools
import zlib

import mlx.core as mx
import numpy as np
import pytest

from core import SamplerConfig
from core.acceptance import (acceptance_probability, accepted_prefix, bonus_distribution, correction_distribution,
                             verify_drafts)

V = 6


def _logits(ctx, salt):
    rng = np.random.default_rng(zlib.crc32(repr((salt, list(ctx))).encode()))  # stable across runs
    return rng.normal(0.0, 1.6, size=V).astype(np.float32)


def target_logits(ctx):
    return _logits(ctx, "target")


def draft_logits(ctx):
    # close to the target, not equal: most drafts pass, some fail
    return target_logits(ctx) + 0.9 * _logits(ctx, "draft")


def dense(sampler, logits):
    """The sampler's filtered distribution over all V tokens, as a numpy row."""
    return np.array(sampler.probs(mx.array(logits)[None]))[0].astype(np.float64)


def ar_distribution(sampler, ctx, n):
    """{tokens: probability} of n tokens decoded by the target alone."""
    out = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in out.items():
            p = dense(sampler, target_logits(ctx + list(seq)))
            for t in np.nonzero(p)[0]:
                nxt[seq + (int(t),)] = nxt.get(seq + (int(t),), 0.0) + pr * p[t]
        out = nxt
    return out


def as_engine_input(sampler, rows):
    """Rows of logits -> what the decoders pass to the acceptance functions (a support)."""
    return sampler.support(mx.array(np.stack(rows)))


def as_dense(idx, probs, rows):
    """An engine distribution (indices or None, probabilities) as dense numpy rows over V."""
    out, probs = np.zeros((rows, V)), np.array(probs).astype(np.float64)
    if idx is None:
        out[:, : probs.shape[1]] = probs
    else:
        np.put_along_axis(out, np.array(idx), probs, axis=1)
    return out


def cycle_distribution(sampler, ctx, depth):
    """{tokens: probability} of D + 1 tokens: one speculative cycle, then the target alone."""
    out = {}

    def add(seq, pr):
        for tail, pt in ar_distribution(sampler, ctx + list(seq), depth + 1 - len(seq)).items():
            out[seq + tail] = out.get(seq + tail, 0.0) + pr * pt

    # every draft sequence, with the probability the head draws it
    for drafts in itertools.product(range(V), repeat=depth):
        q_prob, q_rows = 1.0, []
        for i, d in enumerate(drafts):
            q_rows.append(draft_logits(ctx + list(drafts[:i])))
            q_prob *= dense(sampler, q_rows[-1])[d]
        if q_prob == 0.0:
            continue
        p_rows = [target_logits(ctx + list(drafts[:i])) for i in range(depth + 1)]
        P, Q = as_engine_input(sampler, p_rows), as_engine_input(sampler, q_rows)
        d_arr = mx.array(drafts, dtype=mx.int32)
        acc = np.array(acceptance_probability(P, Q, d_arr)).astype(np.float64)
        corr = as_dense(*correction_distribution(P, Q), rows=depth)
        bonus = as_dense(*bonus_distribution(P, d_arr), rows=1)[0]
        # every pattern of per-draft decisions (each drawn independently, as verify_drafts does)
        for flags in itertools.product([True, False], repeat=depth):
            pr = q_prob * np.prod([a if f else 1 - a for a, f in zip(acc, flags)])
            if pr == 0.0:
                continue
            n = accepted_prefix(list(flags))
            nxt = bonus if n == depth else corr[n]
            for t in np.nonzero(nxt)[0]:
                add(tuple(drafts[:n]) + (int(t),), pr * nxt[t])
    return out


SAMPLERS = {
    "plain": SamplerConfig(temperature=1.0, top_p=1.0, top_k=0),
    "top_k": SamplerConfig(temperature=0.8, top_p=1.0, top_k=3),
    "top_p": SamplerConfig(temperature=1.2, top_p=0.8, top_k=0),
    "min_p": SamplerConfig(temperature=1.0, top_p=1.0, top_k=0, min_p=0.15),
    "all": SamplerConfig(temperature=0.7, top_p=0.9, top_k=4, min_p=0.05),
}


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_a_cycle_emits_exactly_the_target_distribution(name, depth):
    sampler = SAMPLERS[name]
    ctx = [1, 4, 2]
    want = ar_distribution(sampler, ctx, depth + 1)
    got = cycle_distribution(sampler, ctx, depth)
    assert abs(sum(got.values()) - 1.0) < 1e-5
    keys = set(want) | set(got)
    worst = max(abs(want.get(k, 0.0) - got.get(k, 0.0)) for k in keys)
    assert worst < 2e-5, (name, depth, worst)


def test_the_drafts_are_rejected_often_enough_for_the_test_to_matter():
    """The hand-made draft disagrees with the target in a good share of cycles, so the
    correction and the bonus both carry real probability in the enumeration above."""
    sampler = SAMPLERS["plain"]
    rejected = []
    for ctx in ([1, 4, 2], [0], [5, 5]):
        p, q = dense(sampler, target_logits(ctx)), dense(sampler, draft_logits(ctx))
        rejected.append(1 - np.minimum(p, q).sum())  # P(reject the first draft)
    assert 0.1 < float(np.mean(rejected)) < 0.6, rejected


def test_greedy_cycle_is_the_argmax_chain():
    """Temperature 0: whatever the draft, a cycle emits the target's greedy continuation."""
    ctx = [3, 1]
    chain = []
    for _ in range(4):
        chain.append(int(np.argmax(target_logits(ctx + chain))))
    for drafts in itertools.product(range(V), repeat=3):
        rows = np.stack([target_logits(ctx + list(drafts[:i])) for i in range(4)])
        accepted, corrections, bonus = verify_drafts(mx.array(rows), None, mx.array(drafts, dtype=mx.int32),
                                                     None, greedy=True)
        n = accepted_prefix(accepted.tolist())
        new = bonus.tolist() if n == 3 else corrections[n: n + 1].tolist()
        assert list(drafts[:n]) + new == chain[: n + 1]
