"""scripts/gpu/gpu_oracle.py's steered head on a tiny checkpoint: each depth's drafts are right as
often as asked (given the drafts before them were), the head's own step still runs, and greedy
MTP's tokens stay AR's, so the timed cycle is the engine's real one at a chosen acceptance."""
from __future__ import annotations

import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder
from scripts.gpu.gpu_oracle import OracleHead

GREEDY = SamplerConfig(0.0, 1.0, 0, 0.0)


@pytest.mark.parametrize("accept, seen", [((1.0, 1.0, 1.0), [1.0, 1.0, 1.0]), ((0.0, 0.0, 0.0), [0.0])])
def test_the_drafts_are_right_as_often_as_asked_and_the_tokens_stay_ars(tiny_model_dir, accept, seen, monkeypatch):
    ad = load_adapter(tiny_model_dir)
    ids = [5, 6, 7, 8]
    truth, _ = AutoregressiveDecoder(ad, sampler=GREEDY).generate(ids, max_tokens=40)
    calls, real = [], ad.draft_step
    monkeypatch.setattr(ad, "draft_step", lambda *a: calls.append(1) or real(*a))   # the head's own step
    mtp, st = SpeculativeDecoder(OracleHead(ad, list(ids) + list(truth), accept), sampler=GREEDY,
                                 depth=3).generate(ids, max_tokens=40)
    assert list(mtp) == list(truth)
    assert st.acceptance_per_depth[:len(seen)] == seen and len(calls) == st.proposed
    assert st.proposed > 0


def test_the_asked_rates_are_what_the_cycles_see(tiny_model_dir):
    ad = load_adapter(tiny_model_dir)
    ids = [5, 6, 7, 8]
    truth, _ = AutoregressiveDecoder(ad, sampler=GREEDY).generate(ids, max_tokens=400)
    mtp, st = SpeculativeDecoder(OracleHead(ad, list(ids) + list(truth), (0.8, 0.5)), sampler=GREEDY,
                                 depth=2).generate(ids, max_tokens=400)
    assert list(mtp) == list(truth)
    a1, a2 = st.acceptance_per_depth
    assert abs(a1 - 0.8) < 0.08 and abs(a2 - 0.5) < 0.12, (a1, a2)
