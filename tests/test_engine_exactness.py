"""Exactness of the speculative lane: greedy identity, distributional identity, the math."""
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, residual, verify_drafts
from tests._engine_helpers import (MIXED, REJECTING, chi_square_pvalue, exact_joint, load_modules_path,
                                   make_mixed_head, marginal)
from tests._ties import assert_greedy_equal

PROMPTS = [list(range(5, 25)), [100, 7, 300, 42], [3], list(range(200, 460, 3))]


@pytest.fixture(scope="module")
def mixed(mixed_adapter):
    return mixed_adapter


@pytest.fixture(scope="module")
def rejecting(tiny_checkpoint):
    return load_adapter(tiny_checkpoint(**REJECTING))


# The same heads through mlx-lm's modules (compiled CPU path off), as on a GPU.
@pytest.fixture(scope="module")
def mixed_modules(tiny_checkpoint):
    return load_modules_path(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


@pytest.fixture(scope="module")
def rejecting_modules(tiny_checkpoint):
    return load_modules_path(tiny_checkpoint(**REJECTING))


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("which", ["mixed", "rejecting", "mixed_modules", "rejecting_modules"])
def test_greedy_mtp_is_token_identical_to_ar(request, which, depth):
    """A verify's rows against the decode steps' rows: the same arithmetic in matmuls of depth + 1
    rows and of one, which the BLAS may round differently (core/exactness.py), so token-identical
    up to near-ties (tests/_ties.py); bit-identical logits where this machine's BLAS agrees."""
    adapter = request.getfixturevalue(which)
    greedy = SamplerConfig(temperature=0)
    total_accepted = total_proposed = 0
    # mlx-lm's modules: the one-token and the longest prompt (the four cost ~25 CPU-seconds more)
    for prompt in (PROMPTS if not which.endswith("_modules") else PROMPTS[2:]):
        ar, ar_stats = AutoregressiveDecoder(adapter, sampler=greedy).generate(prompt, max_tokens=100)
        mtp, stats = SpeculativeDecoder(adapter, sampler=greedy, depth=depth).generate(prompt, max_tokens=100)
        assert_greedy_equal(adapter, prompt, mtp, ar, what=f"{which} depth {depth}")
        assert stats.generated_tokens == len(mtp)
        assert stats.target_forwards == stats.cycles + 1  # exactly one target forward per cycle
        total_accepted += stats.accepted
        total_proposed += stats.proposed
    rate = total_accepted / total_proposed
    if which.startswith("mixed"):
        assert 0.05 < rate < 0.95, rate  # both paths exercised
    else:
        assert rate < 0.1, rate  # most cycles reject


# Depth, sampler and sample count per test. Each names the depth it drafts: max_tokens = D + 2
# leaves room for a whole first cycle (the decoders cap the depth at the tokens left), and the
# test checks the stats that depth D really was drafted. Samples (1,500 each before): at 500,
# each of scripts/dev/mutation_check.py's four acceptance mutants still failed all three tests, by
# the acceptance counts, a sample outside the exact support or a chi-square at p < 1e-13
# (docs/bench/2026-12-01/sampled-tests-power.json); the depth-2 test keeps 750, the sampled test
# that sees the bonus drawn from the last draft's row with the widest margin (p ~1e-15 at 491).
SAMPLED = {
    "d2-topk": (2, SamplerConfig(temperature=1.0, top_p=1.0, top_k=4), 750),
    "d3-topp": (3, SamplerConfig(temperature=0.8, top_p=0.8, top_k=6), 500),
    "d3-minp": (3, SamplerConfig(temperature=1.3, top_p=1.0, top_k=5, min_p=0.1), 500),
}


@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampled_mtp_follows_the_exact_distribution_inside_the_first_cycle(sure_adapter, name):
    """Token 1 is the prompt's own sample; tokens 2 .. D+2 come out of the first cycle (drafts,
    then the correction or, when all passed, the bonus). Two joint distributions, chi-square
    against the exact ones from enumerating the trunk: the first two drafts (tokens 2, 3) and
    the last draft with what follows it (tokens D+1, D+2: the bonus when all passed)."""
    depth, sampler, runs = SAMPLED[name]
    prompt, n_tokens = [11, 12, 13], depth + 2
    joint = exact_joint(sure_adapter, sampler, prompt, n_tokens)
    pairs = [(1, 2), (depth, depth + 1)]
    counts, proposed, accepted = {pair: Counter() for pair in pairs}, [0] * depth, [0] * depth
    for seed in range(runs):
        ids, stats = SpeculativeDecoder(sure_adapter, sampler=sampler, seed=seed, depth=depth).generate(
            prompt, max_tokens=n_tokens)
        for pair in pairs:
            if len(ids) > pair[1]:
                counts[pair][tuple(ids[i] for i in pair)] += 1
        for i, (p, a) in enumerate(zip(stats.proposed_per_depth, stats.accepted_per_depth)):
            proposed[i], accepted[i] = proposed[i] + p, accepted[i] + a
    # the depth named was drafted, and at every depth drafts both passed and failed (at d3-topp
    # depth 2 passes ~98 % of its drafts: a bound on the rate, 0.98, failed by chance)
    assert proposed[depth - 1] > runs * 0.3, proposed
    assert all(a > 0.2 * p and p - a >= 3 for a, p in zip(accepted, proposed)), (accepted, proposed)
    for pair in pairs:
        got = counts[pair]
        assert chi_square_pvalue(got, marginal(joint, pair), sum(got.values())) > 5e-4, pair


def test_sampled_ar_follows_the_exact_distribution(sure_adapter):
    sampler, prompt, runs = SAMPLED["d3-topp"][1], [11, 12, 13], 500
    exact = marginal(exact_joint(sure_adapter, sampler, prompt, 3), (1, 2))
    counts = Counter()
    for seed in range(runs):
        ids, _ = AutoregressiveDecoder(sure_adapter, sampler=sampler, seed=seed).generate(prompt, max_tokens=3)
        if len(ids) >= 3:
            counts[tuple(ids[1:3])] += 1
    assert chi_square_pvalue(counts, exact, sum(counts.values())) > 1e-3


def test_a_wrong_acceptance_rule_is_detected(mixed):
    """The statistical test has teeth: accepting every draft (no p/q check) fails it."""
    sampler = SamplerConfig(temperature=1.0, top_p=1.0, top_k=4)
    prompt, runs = [11, 12, 13], 600
    exact = exact_joint(mixed, sampler, prompt, 2)
    counts = Counter()
    for seed in range(runs):
        # draft with the head and accept blindly: the output follows q, not p
        cache, mtp_cache = mixed.make_cache(), mixed.make_mtp_cache()
        logits, hidden, _ = mixed.forward(mx.array([prompt]), cache)
        key = mx.random.key(seed)
        k1, k2 = mx.random.split(key)
        t1 = mx.random.categorical(mx.log(sampler.probs(logits[0, -1])), key=k1)
        g = mixed.mtp_forward(hidden, mx.concatenate([mx.array(prompt[1:]), t1[None]])[None], mtp_cache)
        t2 = mx.random.categorical(mx.log(sampler.probs(mixed.lm_head(g[:, -1]))), key=k2)
        counts[(t1.item(), t2.item())] += 1
    assert sum(c for k, c in counts.items() if k not in exact) > 0 or chi_square_pvalue(counts, exact, runs) < 1e-3


def test_residual_on_hand_computed_distributions():
    p = mx.array([[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]])
    q = mx.array([[0.2, 0.6, 0.2], [0.5, 0.25, 0.25]])
    assert np.allclose(np.array(residual(p, q)), [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    # p == q: nothing left over, fall back to p itself
    assert np.allclose(np.array(residual(p, p)), np.array(p))
    mixed = residual(mx.array([[0.4, 0.4, 0.2]]), mx.array([[0.1, 0.3, 0.6]]))
    assert np.allclose(np.array(mixed), [[0.75, 0.25, 0.0]])


def test_acceptance_probability_is_min_one_p_over_q():
    # draft token 0 with q=0.8 where p=0.2: accepted with probability 0.25;
    # on rejection the replacement comes from norm(max(p-q,0)) = [0, 0.75/0.8... ] over tokens 1, 2
    p = mx.array([[0.2, 0.5, 0.3], [1 / 3, 1 / 3, 1 / 3]])
    q = mx.array([[0.8, 0.1, 0.1]])
    drafts = mx.array([0])
    n, acc, corr = 4000, 0, Counter()
    for i in range(n):
        keys = mx.random.split(mx.random.key(i), 3)
        accepted, corrections, bonus = verify_drafts(p, q, drafts, keys)
        if accepted.item():
            acc += 1
        else:
            corr[corrections.item()] += 1
    assert abs(acc / n - 0.25) < 0.03
    assert corr[0] == 0
    assert abs(corr[1] / sum(corr.values()) - 0.4 / 0.6) < 0.04
    # p >= q on the draft: always accepted
    accepted, _, _ = verify_drafts(mx.array([[0.9, 0.1], [0.5, 0.5]]), mx.array([[0.5, 0.5]]), mx.array([0]),
                                   mx.random.split(mx.random.key(0), 3))
    assert accepted.item()


def test_sampler_probs_filters():
    logits = mx.log(mx.array([[0.05, 0.1, 0.15, 0.3, 0.4]]))
    p = lambda **kw: np.array(SamplerConfig(**kw).probs(logits))[0]
    assert np.allclose(p(temperature=1, top_p=1, top_k=0), [0.05, 0.1, 0.15, 0.3, 0.4], atol=1e-6)
    assert np.allclose(p(temperature=1, top_p=1, top_k=2), [0, 0, 0, 3 / 7, 4 / 7], atol=1e-6)
    assert np.allclose(p(temperature=1, top_p=0.7, top_k=0), [0, 0, 0, 3 / 7, 4 / 7], atol=1e-6)
    assert np.allclose(p(temperature=1, top_p=0.71, top_k=0), [0, 0, 0.15 / 0.85, 0.3 / 0.85, 0.4 / 0.85], atol=1e-6)
    assert np.allclose(p(temperature=1, top_p=1, top_k=0, min_p=0.5), [0, 0, 0, 3 / 7, 4 / 7], atol=1e-6)
    assert np.allclose(p(temperature=0), [0, 0, 0, 0, 1])
    hot = p(temperature=2, top_p=1, top_k=0)
    assert hot[0] > 0.05 and hot[4] < 0.4


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(temperature=float("nan")), dict(top_p=0),
                                    dict(top_p=1.5), dict(top_k=-1), dict(top_k=2.5), dict(min_p=1.0)])
def test_sampler_refuses_nonsense(kwargs):
    with pytest.raises(ValueError):
        SamplerConfig(**kwargs)


class _KeepsCaches(SpeculativeDecoder):
    """The real decoder; the test keeps a reference to the caches it decodes with."""

    def _make_caches(self):
        self.caches = super()._make_caches()
        return self.caches


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("which", ["mixed", "rejecting"])
def test_caches_after_speculation_equal_teacher_forced_ones(request, which, depth):
    """After many partial rejections, the target cache and the head's KV history hold what
    a run that never speculated would hold: the trunk over prompt + committed tokens, and
    the head over (target hidden[n], token[n+1]) for every committed position."""
    adapter = request.getfixturevalue(which)
    prompt = PROMPTS[1]
    for seed in range(20):  # a run long enough to see acceptances and rejections
        decoder = _KeepsCaches(adapter, sampler=SamplerConfig(temperature=0.9, top_k=8), seed=seed, depth=depth)
        out, stats = decoder.generate(prompt, max_tokens=60)
        if len(out) >= 30 and (stats.accepted > 0 or which == "rejecting"):
            break
    assert len(out) >= 30 and stats.accepted < stats.proposed and (stats.accepted > 0 or which == "rejecting")
    cache, mtp_cache = decoder.caches
    seq = prompt + out
    ref = adapter.make_cache()
    _, hidden, _ = adapter.forward(mx.array([seq[:-1]]), ref)  # the last token is pending: not yet fed
    for ours, theirs in zip(cache, ref):
        if hasattr(ours, "offset"):
            assert ours.offset == theirs.offset == len(seq) - 1
            assert mx.allclose(ours.keys[..., : ours.offset, :], theirs.keys[..., : theirs.offset, :], atol=1e-4).item()
        else:
            assert mx.allclose(ours[1], theirs[1], atol=1e-4).item()
            assert mx.allclose(ours[0], theirs[0], atol=1e-4).item()
    n = mtp_cache.offset
    assert n >= len(seq) - 3 - depth  # the head has seen every committed position but the last few
    head_ref = adapter.make_mtp_cache()
    adapter.mtp_forward(hidden[:, :n], mx.array([seq[1 : n + 1]]), head_ref)
    assert mx.allclose(mtp_cache.keys[..., :n, :], head_ref.keys[..., :n, :], atol=1e-4).item()
    assert mx.allclose(mtp_cache.values[..., :n, :], head_ref.values[..., :n, :], atol=1e-4).item()
