"""The top-k kernel's fused draw (adapters/kernels/cuda_topk.py row_topk_draw) on a machine without
a GPU: its reference (inverse CDF over the support in the kernel's order, fp32 sequential sums),
SamplerConfig.draw's use of a hook's `.draw` through stand-ins built on the reference, and the
load check's verdicts. The kernel itself runs only on CUDA (scripts/gpu/gpu_draw.py)."""
from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from adapters.kernels import cuda_topk
from core import SamplerConfig, sampling

BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))


def _draws(idx, p, us):
    return [int(cuda_topk.inverse_cdf(np.array([idx], np.uint32), np.array([p], np.float32),
                                      np.array([u], np.float32))[0]) for u in us]


def test_inverse_cdf_on_hand_made_supports():
    """The first column whose running sum exceeds u * mass, in the support's order; a column of p 0
    (cut by top-p / min-p) never; rounding past the end (u = 1): the last column with p > 0."""
    idx, p = [7, 3, 9, 1, 2], [0.5, 0.3, 0.2, 0.0, 0.0]
    assert _draws(idx, p, [0.0, 0.49, 0.5, 0.79, 0.8, 0.85, BELOW_ONE, 1.0]) == [7, 7, 3, 3, 9, 9, 9, 9]
    # ties: equal probabilities split [0, 1) in the support's order, a step going to the next column
    assert _draws([4, 5, 6, 8], [0.25] * 4, [0.0, 0.2499, 0.25, 0.5, 0.74, BELOW_ONE]) == [4, 4, 5, 6, 6, 8]
    # a support that is not quite normalised: u scales the row's own sum
    assert _draws([1, 2], [0.3, 0.3], [0.0, 0.4999, 0.5, BELOW_ONE]) == [1, 1, 2, 2]
    # leading shape kept, uint32
    out = cuda_topk.inverse_cdf(np.array([[[7, 3]], [[9, 1]]], np.uint32), np.full((2, 1, 2), 0.5, np.float32),
                                np.array([[0.0], [0.9]], np.float32))
    assert out.dtype == np.uint32 and out.tolist() == [[7], [1]]


def test_reference_draw_from_logits():
    """reference_draw: reference()'s support (larger value first, ties to the lower index) drawn at u;
    top-p's zeros are never drawn, u = 0 gives the largest, u just below 1 the last kept."""
    V = 64
    row = np.full(V, -4.0, np.float32)
    row[[11, 40, 5, 23, 50]] = [3.0, 2.5, 2.0, 0.0, -1.0]
    x = mx.array(row)[None]
    idx, p = cuda_topk.reference(x, 1.0, 5, 0.8, 0.0)
    assert np.array(idx).tolist() == [[11, 40, 5, 23, 50]]
    kept = [int(c) for c, q in zip(np.array(idx)[0], np.array(p)[0]) if q > 0]
    assert kept == [11, 40, 5]   # 23 and 50 cut by top-p
    us = np.linspace(0, BELOW_ONE, 301, dtype=np.float32)
    got = [int(cuda_topk.reference_draw(x, np.array([u]), 1.0, 5, 0.8, 0.0)[0]) for u in us]
    assert got[0] == 11 and got[-1] == 5 and set(got) == {11, 40, 5}
    # the draw is monotone in u along the support's order
    order = [kept.index(t) for t in got]
    assert order == sorted(order)
    # ties at the maximum: the lower index first, each a third of [0, 1)
    tie = np.zeros(V, np.float32)
    tie[[40, 3, 10]] = 5.0
    t = mx.array(tie)[None]
    assert [int(cuda_topk.reference_draw(t, np.array([u]), 0.1, 3, 1.0, 0.0)[0]) for u in (0.0, 0.5, BELOW_ONE)] \
        == [3, 10, 40]


def _stand_in(calls):
    """A hook as cuda_topk.row_topk_drawing is, built on the reference: support and draw."""
    def support(logits, temperature, top_k, top_p, min_p):
        calls.append("support")
        return cuda_topk.reference(logits, temperature, top_k, top_p, min_p)

    def draw(logits, u, temperature, top_k, top_p, min_p):
        calls.append("draw")
        idx, p = cuda_topk.reference(logits, temperature, top_k, top_p, min_p)
        tok = cuda_topk.reference_draw(logits, np.array(u), temperature, top_k, top_p, min_p)
        return mx.array(tok), idx, p
    support.supports = lambda x, k: 0 < k <= cuda_topk.MAX_K
    support.draw = draw
    return support


@pytest.fixture
def hook(monkeypatch):
    monkeypatch.setattr(sampling, "_row_topk", None)   # restored after the test
    calls = []
    sampling.use_row_topk(_stand_in(calls))
    return calls


def _wilson_hilferty_sf(stat: float, df: int) -> float:
    """P(chi2_df >= stat), to the Wilson-Hilferty approximation."""
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampler_draw_goes_through_the_hooks_draw(hook):
    """With a hook carrying `.draw`, a sampled draw is the hook's: tokens from the support, the
    support reference()'s, the token reference_draw's at u = uniform(key), in the dtype (uint32) and
    shape the support-then-categorical path gives; over 4000 draws the frequencies follow p."""
    V, rows = 64, 100
    row = (mx.random.normal((V,), key=mx.random.key(7)) * 1.5)
    x = mx.broadcast_to(row, (rows, V))
    sampler = SamplerConfig(temperature=0.8, top_k=8, top_p=0.9)
    want_i, want_p = cuda_topk.reference(row[None], 0.8, 8, 0.9, 0.0)
    want_i, want_p = np.array(want_i)[0], np.array(want_p)[0]
    assert (want_p == 0).any()   # top-p cut something: those columns must never be drawn
    counts = dict.fromkeys(want_i.tolist(), 0)
    for n in range(40):
        key = mx.random.key(1000 + n)
        tok, (idx, p) = sampler.draw(x, key)
        assert hook[-1] == "draw" and "support" not in hook
        assert tok.dtype == mx.uint32 and tok.shape == (rows,)
        assert np.array_equal(np.array(idx), np.broadcast_to(want_i, (rows, 8)))
        assert np.allclose(np.array(p), want_p, atol=1e-7)
        u = mx.random.uniform(shape=(rows,), key=key)
        assert np.array(tok).tolist() == cuda_topk.reference_draw(x, np.array(u), 0.8, 8, 0.9, 0.0).tolist()
        for t in np.array(tok).tolist():
            counts[t] += 1
    n = 40 * rows
    kept = [c for c, q in zip(want_i.tolist(), want_p.tolist()) if q > 0]
    assert all(counts[c] == 0 for c in counts if c not in kept)
    expected = {c: n * float(q) for c, q in zip(want_i.tolist(), want_p.tolist()) if q > 0}
    stat = sum((counts[c] - e) ** 2 / e for c, e in expected.items())
    assert _wilson_hilferty_sf(stat, len(expected) - 1) > 1e-3, (counts, expected)
    # sample() is draw()[0]
    assert np.array(sampler.sample(x, mx.random.key(1000))).tolist() == \
        np.array(sampler.draw(x, mx.random.key(1000))[0]).tolist()


def test_a_hook_without_draw_keeps_support_then_categorical(monkeypatch):
    """A hook with `.supports` only (tests/test_gpu_wrappers.py's stand-in, scripts/gpu/gpu_draw.py's
    "top-k kernel" row, the default CUDA hook cuda_topk.row_topk_support): its support, then
    categorical, tokens uint32 as with `.draw`."""
    monkeypatch.setattr(sampling, "_row_topk", None)
    calls = []
    support = _stand_in(calls)
    del support.draw
    sampling.use_row_topk(support)
    x = (mx.random.normal((3, 64), key=mx.random.key(2)) * 2)
    sampler = SamplerConfig(temperature=0.7, top_k=10, top_p=0.95)
    key = mx.random.key(9)
    tok, (idx, p) = sampler.draw(x, key)
    assert calls == ["support"] and tok.dtype == mx.uint32 and tok.shape == (3,)
    j = sampling.categorical(p, key)
    assert np.array(tok).tolist() == np.array(mx.take_along_axis(idx, j[..., None], axis=-1)[..., 0]).tolist()


def test_the_hooks_draw_is_not_used_under_a_mask_greedy_or_rows_it_does_not_take(hook):
    x = (mx.random.normal((2, 64), key=mx.random.key(4)) * 2)
    allowed = mx.arange(64)[None] % 3 == 0
    key = mx.random.key(5)
    tok, (idx, p) = SamplerConfig(temperature=0.7, top_k=10).draw(x, key, mx.broadcast_to(allowed, x.shape))
    assert hook == []   # a grammar's mask: MLX's ops, categorical
    assert all(t % 3 == 0 for t in np.array(tok).tolist())
    tok, support = SamplerConfig(temperature=0.0, top_k=10).draw(x, key)
    assert hook == [] and support is None and np.array(tok).tolist() == np.array(mx.argmax(x, axis=-1)).tolist()
    SamplerConfig(temperature=0.7, top_k=cuda_topk.MAX_K + 1).draw(x, key)   # supports() says no
    SamplerConfig(temperature=0.7, top_k=0).draw(x, key)
    assert hook == []
    SamplerConfig(temperature=0.7, top_k=10).draw(x, key)
    assert hook == ["draw"]


def test_without_a_hook_the_draw_is_categoricals(monkeypatch):
    """MLX's ops (the CPU, Metal, the "topk-mlx" trial): the token a key gives is unchanged."""
    monkeypatch.setattr(sampling, "_row_topk", None)
    x = (mx.random.normal((3, 64), key=mx.random.key(6)) * 2)
    sampler = SamplerConfig(temperature=0.6, top_k=20, top_p=0.95)
    key = mx.random.key(11)
    tok, (idx, p) = sampler.draw(x, key)
    want = mx.take_along_axis(idx, mx.random.categorical(mx.log(p), axis=-1, key=key)[..., None], axis=-1)[..., 0]
    assert np.array(tok).tolist() == np.array(want).tolist()


def test_the_drawing_hook_carries_the_draw_and_the_plain_one_does_not():
    """The default CUDA hook also draws; the "topk-support" trial's leaves the draw to categorical."""
    assert cuda_topk.row_topk_drawing.draw is cuda_topk.row_topk_draw
    assert not hasattr(cuda_topk.row_topk_support, "draw")
    assert cuda_topk.row_topk_support.supports is cuda_topk.supported is cuda_topk.row_topk_drawing.supports


def test_the_load_check_compares_the_drawn_tokens(monkeypatch):
    """cuda_topk.check with the kernels replaced by the reference passes; a draw that takes another
    column than the inverse CDF fails it."""
    def support(x, t, k, tp, mp):
        return cuda_topk.reference(x, t, k, tp, mp)

    def draw(x, u, t, k, tp, mp):
        idx, p = cuda_topk.reference(x, t, k, tp, mp)
        return mx.array(cuda_topk.inverse_cdf(np.array(idx), np.array(p), np.array(u))), idx, p

    def last_column(x, u, t, k, tp, mp):
        tok, idx, p = draw(x, u, t, k, tp, mp)
        return idx[..., -1], idx, p
    monkeypatch.setattr(cuda_topk, "row_topk_support", support)
    monkeypatch.setattr(cuda_topk, "row_topk_draw", draw)
    assert cuda_topk.check() is None
    monkeypatch.setattr(cuda_topk, "row_topk_draw", last_column)
    assert "not the inverse CDF of its support" in cuda_topk.check()
    assert cuda_topk.check(draw=False) is None   # the default hook's check: the support alone


def test_the_check_excuses_only_rounding_at_a_step():
    """A drawn token other than the reference's is let pass only where u lies within 1e-5 of a step
    between kept columns: never at u = 0 or just below 1, which both supports map to their ends."""
    p = np.array([[0.5, 0.3, 0.2, 0.0, 0.0]])
    assert not cuda_topk._near_a_step(p, [0.0]) and not cuda_topk._near_a_step(p, [BELOW_ONE])
    assert cuda_topk._near_a_step(p, [0.5000001]) and cuda_topk._near_a_step(p, [0.7999999])
    assert not cuda_topk._near_a_step(p, [0.6])
