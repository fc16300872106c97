"""Logprobs from the engine: the target's raw distribution (log_softmax of its logits at T=1) at
each emitted token, from the verify pass in the MTP lane and the step in the AR lane; a prompt's
own logprobs from one forward over it (core/logprobs.py)."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, prompt_logprobs
from tests._engine_helpers import make_mixed_head
from tests._engine_helpers import MIXED

PROMPT = [100, 7, 300, 42, 9, 18]


@pytest.fixture(scope="module")
def mixed(tiny_checkpoint):
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


def reference(adapter, ids):
    """log_softmax of the target's logits over prompt + ids, token by token (no speculation)."""
    logits, _, _ = adapter.forward(mx.array([ids]), adapter.make_cache(), all_logits=True, fast=False)
    x = logits[0].astype(mx.float32)
    return np.array(x - mx.logsumexp(x, axis=-1, keepdims=True))


def run(lane, prompt, n, top):
    tokens, lps = [], []
    for ev in lane.stream(prompt, max_tokens=n, logprobs=top):
        tokens += ev.tokens
        lps += ev.logprobs
        assert len(ev.logprobs) == len(ev.tokens)
    return tokens, lps


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_emitted_logprobs_are_the_targets_raw_distribution_in_both_lanes(mixed, temperature):
    sampler = SamplerConfig(temperature=temperature, top_k=8)
    for lane in (AutoregressiveDecoder(mixed, sampler=sampler, seed=3),
                 SpeculativeDecoder(mixed, sampler=sampler, seed=3, depth=3)):
        tokens, lps = run(lane, PROMPT, 40, 5)
        ref = reference(mixed, PROMPT + tokens)[len(PROMPT) - 1:]
        assert [lp.token for lp in lps] == tokens
        for i, lp in enumerate(lps):
            assert abs(lp.logprob - ref[i, tokens[i]]) < 1e-3
            assert np.allclose([v for _, v in lp.top], np.sort(ref[i])[::-1][:5], atol=1e-3)
            assert all(abs(v - ref[i, t]) < 1e-3 for t, v in lp.top)


def test_without_logprobs_events_carry_none(mixed):
    ev = next(iter(AutoregressiveDecoder(mixed, sampler=SamplerConfig(temperature=0)).stream(PROMPT, max_tokens=2)))
    assert ev.logprobs is None


def test_prompt_logprobs_from_one_forward_in_chunks(mixed):
    ids = list(range(5, 45))
    ref = reference(mixed, ids)
    for chunk in (512, 7):
        lps = prompt_logprobs(mixed, ids, top=2, chunk=chunk)
        assert lps[0] is None and len(lps) == len(ids)
        got = np.array([lp.logprob for lp in lps[1:]])
        assert np.allclose(got, ref[np.arange(len(ids) - 1), ids[1:]], atol=1e-4)
        assert all(len(lp.top) == 2 and lp.top[0][1] >= lp.top[1][1] for lp in lps[1:])
