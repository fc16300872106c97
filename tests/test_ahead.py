"""The "ahead" trial (settings.gpu_trials): the MTP lane builds the next cycle while a verify runs,
guessing that every draft passes, and puts the caches back from a snapshot when the guess fails.
What it must keep: greedy MTP == AR token for token, and sampled MTP's exact distribution; both
through hits and misses of the guess."""
from __future__ import annotations

from collections import Counter

import pytest

from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder
from tests._engine_helpers import chi_square_pvalue, exact_joint, marginal

GREEDY = SamplerConfig(0.0, 1.0, 0, 0.0)


def _spied(adapter, monkeypatch) -> Counter:
    """The adapter with the trial on, counting its snapshots (a cycle built ahead) and restores
    (a guess that failed)."""
    seen = Counter()
    snapshot, restore = adapter.snapshot, adapter.restore
    monkeypatch.setattr(adapter, "ahead", True)
    monkeypatch.setattr(adapter, "snapshot", lambda *a: (seen.update(["built"]), snapshot(*a))[1])
    monkeypatch.setattr(adapter, "restore", lambda *a: (seen.update(["missed"]), restore(*a))[1])
    return seen


@pytest.mark.parametrize("which", ["mixed_adapter", "sure_adapter"])
def test_greedy_mtp_built_ahead_equals_ar(which, request, monkeypatch):
    adapter = request.getfixturevalue(which)
    prompts = [[11, 12, 13], [40, 41], [7, 300, 9, 21]]
    want = [AutoregressiveDecoder(adapter, sampler=GREEDY).generate(p, max_tokens=40)[0] for p in prompts]
    seen = _spied(adapter, monkeypatch)
    for depth in (1, 2, 3):
        got = [SpeculativeDecoder(adapter, sampler=GREEDY, depth=depth).generate(p, max_tokens=40)[0] for p in prompts]
        assert got == want, depth
    # both ways of the guess were taken: cycles used as built, and caches put back
    assert seen["built"] > seen["missed"] > 0, seen


def test_sampled_mtp_built_ahead_follows_the_exact_distribution(sure_adapter, monkeypatch):
    """Depth 1, five tokens: the second cycle (tokens 3-4 when the first accepts) is the one built
    ahead; the joint of tokens 3 and 4 against the exact distribution by enumeration."""
    sampler = SamplerConfig(temperature=1.0, top_p=1.0, top_k=4)
    prompt = [11, 12, 13]
    exact = marginal(exact_joint(sure_adapter, sampler, prompt, 5), (3, 4))
    seen = _spied(sure_adapter, monkeypatch)
    counts, runs = Counter(), 200
    for run in range(runs):
        ids, _ = SpeculativeDecoder(sure_adapter, sampler=sampler, depth=1, seed=run).generate(prompt, max_tokens=5)
        if len(ids) >= 5:
            counts[tuple(ids[3:5])] += 1
    assert seen["built"] > seen["missed"] > 0, seen
    assert chi_square_pvalue(counts, exact, sum(counts.values())) > 1e-3
