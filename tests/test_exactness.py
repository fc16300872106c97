"""The exactness probe (core/exactness.py) reports both outcomes, and the shared comparison of
greedy outputs (tests/_ties.py) tells a near-tie from a real difference."""
import mlx.core as mx
import numpy as np
import pytest

from core.exactness import Agreement, Exactness, agreement, probe
from tests._ties import ROUNDING, assert_greedy_equal, first_difference, tie_free_length


def _ulp_apart(x: mx.array) -> mx.array:
    """x with its first element moved to the next float32 up: the smallest difference there is."""
    a = np.array(x, dtype=np.float32)
    a.flat[0] = np.nextafter(a.flat[0], np.float32(np.inf))
    return mx.array(a)


def test_agreement_reports_bit_for_bit_and_rounding():
    x = mx.random.normal((2, 3, 50), key=mx.random.key(0))
    same = agreement(x, mx.array(np.array(x)))
    assert same.exact and same.max_diff == 0.0 and same.describe() == "bit for bit"
    near = agreement(_ulp_apart(x), x)
    assert not near.exact and 0.0 < near.max_diff < 1e-6 and "to rounding" in near.describe()
    assert agreement(mx.array([mx.inf, 1.0]), mx.array([mx.inf, 1.0])).exact
    assert agreement(mx.array([mx.nan]), mx.array([mx.nan])).max_diff == float("inf")
    with pytest.raises(ValueError):
        agreement(x, x[:1])


def test_the_banner_line_names_each_outcome():
    exact, off = Agreement(0.0), Agreement(6.7e-6)
    both = Exactness(exact, exact, exact).describe()
    assert both.count("bit for bit on this machine") == 2 and "ties" not in both
    batch_off = Exactness(exact, off, exact).describe()
    assert batch_off.startswith("greedy MTP = AR bit for bit") and "batched replies = alone up to ties" in batch_off
    assert "6.7e-06 from each sequence alone" in batch_off
    assert "greedy MTP = AR up to ties" in Exactness(off, exact, exact).describe()


def test_the_probe_measures_the_loaded_model(mixed_adapter, monkeypatch):
    """On every machine the three agreements are within float32 rounding; a batched forward that
    rounds differently (emulated: each row moved by an ulp, what another BLAS kernel does) is
    reported as such, and the lone comparison is untouched."""
    found = probe(mixed_adapter)
    for a in (found.verify_vs_steps, found.batched_verify, found.batched_step):
        assert a.max_diff < ROUNDING

    real = type(mixed_adapter).forward_batch

    def rounding_differently(self, tokens, caches, *, capture=False):
        logits, hidden, cap = real(self, tokens, caches, capture=capture)
        return _ulp_apart(logits), hidden, cap

    monkeypatch.setattr(type(mixed_adapter), "forward_batch", rounding_differently)
    off = probe(mixed_adapter)
    assert not off.batched.exact and 0.0 < off.batched.max_diff < ROUNDING
    assert off.verify_vs_steps == found.verify_vs_steps
    assert "batched replies = alone up to ties" in off.describe()


class _Fixed:
    """An adapter whose every forward gives the same logits row (tokens 3 and 4 within 1e-6)."""

    class tokenizer:
        eos_token_ids = [0]

    def __init__(self, gap: float):
        self.row = mx.array([[[-5.0, -1.0, 0.0, 2.0, 2.0 - gap, 1.0]]])

    def make_cache(self):
        return None

    def forward(self, tokens, cache, *, all_logits=True, fast=True):
        rows = mx.broadcast_to(self.row, (1, tokens.shape[1] if all_logits else 1, 6))
        return rows, None, None


def test_greedy_outputs_may_part_only_at_a_near_tie():
    assert first_difference([1, 2], [1, 2]) is None and first_difference([1], [1, 2]) == 1
    assert_greedy_equal(_Fixed(1e-6), [5], [3, 3, 4], [3, 3, 3])       # 4 ties with 3 there
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_greedy_equal(_Fixed(1e-6), [5], [3, 5], [3, 3])          # 5 is 1.0 behind
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_greedy_equal(_Fixed(0.1), [5], [4], [3])                 # 0.1 is no tie
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_greedy_equal(_Fixed(1e-6), [5], [3], [3, 3])             # stopped where EOS is far behind
    assert tie_free_length(_Fixed(1e-6), [5], [3, 3]) == 0
    assert tie_free_length(_Fixed(0.1), [5], [3, 3]) == 3
