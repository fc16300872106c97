"""The adapter's trunk forward and rollback against mlx-lm's own model."""
import mlx.core as mx
import mlx_lm
import pytest

from adapters import load_adapter
from tests._engine_helpers import load_modules_path
from tests._ties import ROUNDING


def _tokens(n, vocab, seed=0):
    return mx.random.randint(0, vocab, (1, n), key=mx.random.key(seed)).astype(mx.int32)


@pytest.mark.parametrize("opts", [dict(bits=None), dict(bits=4), dict(bits=8, tie_word_embeddings=False)])
def test_forward_matches_mlx_lm_bit_for_bit(tiny_checkpoint, opts):
    path = tiny_checkpoint(**opts)
    adapter = load_adapter(path, compute_dtype="native")  # exactly what mlx_lm.load gives
    reference, _ = mlx_lm.load(str(path))
    x = _tokens(12, adapter.contract.vocab_size)
    ours, _, _ = adapter.forward(x, adapter.make_cache())
    theirs = reference(x, cache=reference.make_cache())
    assert ours.shape == theirs.shape
    assert mx.array_equal(ours, theirs).item()
    # incremental decoding with a cache too
    c1, c2 = adapter.make_cache(), reference.make_cache()
    adapter.forward(x[:, :8], c1)
    reference(x[:, :8], cache=c2)
    a, _, _ = adapter.forward(x[:, 8:9], c1)
    b = reference(x[:, 8:9], cache=c2)
    assert mx.array_equal(a, b).item()


def test_hidden_variants(tiny_checkpoint):
    path = tiny_checkpoint(bits=None)
    pre = load_adapter(path, hidden_variant="pre_norm")
    post = load_adapter(path, hidden_variant="post_norm")
    x = _tokens(6, pre.contract.vocab_size)
    logits, h_pre, _ = pre.forward(x, pre.make_cache())
    _, h_post, _ = post.forward(x, post.make_cache())
    # post-norm hidden is what lm_head consumes; pre-norm is the input of the final norm
    assert mx.allclose(post.lm_head(h_post), logits, atol=1e-5).item()
    assert mx.allclose(pre.inner.norm(h_pre), h_post, atol=1e-6).item()
    assert not mx.allclose(h_pre, h_post).item()


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-cpu", "mlx-lm-modules"])
def test_rollback_equals_a_run_that_never_speculated(tiny_checkpoint, width, compiled):
    """Verify `width` tokens with capture, keep any prefix: caches equal one-token-at-a-time decoding."""
    path = tiny_checkpoint(bits=None, num_layers=4, full_attention_interval=2)
    adapter = load_adapter(path) if compiled else load_modules_path(path)
    V = adapter.contract.vocab_size
    context, block = _tokens(10, V, 1), _tokens(width, V, 2)
    for keep in range(1, width + 1):
        spec = _fresh(adapter, context)
        _, _, cap = adapter.forward(block, spec, capture=True)
        adapter.rollback(spec, cap, keep=keep)

        ref = _fresh(adapter, context)
        for i in range(keep):
            adapter.forward(block[:, i : i + 1], ref)
        _assert_caches_equal(spec, ref)
        # and decoding continues identically from both
        nxt = _tokens(1, V, 3)
        a, _, _ = adapter.forward(nxt, spec)
        b, _, _ = adapter.forward(nxt, ref)
        assert mx.allclose(a, b, rtol=1e-4, atol=1e-4).item()  # rounding grows through the layers


def _fresh(adapter, context):
    cache = adapter.make_cache()
    adapter.forward(context, cache)
    return cache


def _assert_caches_equal(a, b):
    """Equal to float32 rounding: a verify's k rows come out of k-row matmuls, the reference's
    out of 1-row ones, and OpenBLAS on some hosts (AVX-512, measured) rounds those differently
    in the last bit. A rollback that keeps a wrong position differs by far more (order 1)."""
    def same(x, y, what):
        assert x.shape == y.shape and mx.allclose(x, y, rtol=ROUNDING, atol=ROUNDING).item(), what

    for ca, cb in zip(a, b):
        if hasattr(ca, "offset"):  # attention KV cache
            assert ca.offset == cb.offset
            same(ca.keys[..., : ca.offset, :], cb.keys[..., : cb.offset, :], "keys differ")
            same(ca.values[..., : ca.offset, :], cb.values[..., : cb.offset, :], "values differ")
        else:  # Gated-DeltaNet: conv window and recurrent state
            same(ca[0], cb[0], "conv window differs")
            same(ca[1], cb[1], "recurrent state differs")


def test_a_rollback_keeps_its_conv_window_as_a_view_of_the_verify(tiny_model_dir):
    """The kept window is whole rows of the verify's conv input, left where they lie: mx.contiguous
    copied them (MLX copies a slice more than 16 KB smaller than its buffer, every 9B verify's 24
    Gated-DeltaNet layers on the GPU). At a 9B layer's width here, so that a copy would show."""
    import numpy as np

    from adapters.qwen3_5.adapter import Captured

    adapter = load_adapter(tiny_model_dir)
    cache = adapter.make_cache()
    gdn = [j for j, c in enumerate(cache) if not hasattr(c, "offset")]   # the Gated-DeltaNet layers
    width, C = 4, 8192
    conv_input = mx.arange((3 + width) * C, dtype=mx.float32).reshape(1, 3 + width, C)
    states = [mx.full((1, 2), float(t)) for t in range(width)]
    mx.eval(conv_input, *states)
    adapter.rollback(cache, Captured(width=width, gdn={j: (conv_input, states) for j in gdn}), keep=2)
    i = gdn[0]
    window = cache[i][0]
    assert window.shape == (1, 3, C) and mx.array_equal(window, conv_input[:, 2:5]).item()
    address = lambda a: np.array(a, copy=False).__array_interface__["data"][0]  # noqa: E731
    assert address(window) == address(conv_input) + 2 * C * 4
    assert mx.array_equal(cache[i][1], states[1]).item()
