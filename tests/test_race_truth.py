"""The race tells the truth: its lanes decode exactly what each lane decodes alone, and its
figures are what the lanes cost (timings themselves live in scripts/bench_race.py)."""
from __future__ import annotations

import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, PrefixCache, SamplerConfig, SpeculativeDecoder, chat_prompt
from core.stream import cache_prompt
from tests._engine_helpers import make_mixed_head

SAMPLED = SamplerConfig(temperature=0.8, top_p=0.95, top_k=20)
MIXED = dict(bits=None, frequent_tokens=0, logit_std=2.0, residual_gain=0.7, norm_std=0.05, seed=0)


@pytest.fixture(scope="module")
def adapter(tiny_checkpoint):
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


def lanes(adapter, cache, seed):
    return [AutoregressiveDecoder(adapter, sampler=SAMPLED, seed=seed, prefix_cache=cache),
            SpeculativeDecoder(adapter, sampler=SAMPLED, seed=seed, depth=2, prefix_cache=cache)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_lanes_restored_from_one_snapshot_do_not_write_into_each_other(adapter, seed):
    """The race starts both lanes from one prefix-cache snapshot and steps them in turn. KVCache
    writes rebind its arrays in place, so lanes sharing the snapshot's array objects saw each
    other's keys: the interleaved lanes then decoded other tokens than each alone."""
    cache = PrefixCache(2**30)
    prompt = chat_prompt(adapter, [{"role": "user", "content": "Tell me about the sea and the moon."}])
    assert cache_prompt(adapter, prompt, cache) == len(prompt.ids) - 1
    alone = [[t for ev in lane.stream(prompt, max_tokens=40) for t in ev.tokens] for lane in lanes(adapter, cache, seed)]
    assert alone[0] != alone[1], "the lanes should differ (sampled), or sharing could not show"
    streams = [lane.stream(prompt, max_tokens=40) for lane in lanes(adapter, cache, seed)]
    raced, done = [[], []], [False, False]
    while not all(done):
        for i, s in enumerate(streams):
            if not done[i]:
                ev = next(s)
                raced[i] += ev.tokens
                done[i] = ev.finished
    assert raced == alone
