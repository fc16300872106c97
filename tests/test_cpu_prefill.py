"""The CPU prefill attention (adapters/kernels/cpu_attention.py) matches MLX's and mlx-lm's to fp32 rounding."""
import mlx.core as mx
import pytest

from adapters import load_adapter
from adapters.kernels import cpu_attention


@pytest.mark.parametrize("L,S,H,KV", [(7, 7, 4, 2), (5, 40, 4, 2), (1, 33, 4, 4), (64, 300, 8, 2)])
def test_attention_equals_mlx_causal_sdpa(L, S, H, KV):
    q = mx.random.normal((1, H, L, 16), key=mx.random.key(1))
    k = mx.random.normal((1, KV, S, 16), key=mx.random.key(2))
    v = mx.random.normal((1, KV, S, 16), key=mx.random.key(3))
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal" if L > 1 else None)
    assert mx.allclose(cpu_attention.attention(q, k, v, 0.25), ref, atol=1e-5).item()


def test_a_long_forward_matches_mlx_lm_with_and_without_it(tiny_checkpoint, monkeypatch):
    adapter = load_adapter(tiny_checkpoint(bits=None))
    tokens = mx.array([[(i * 13) % 400 + 5 for i in range(90)]])
    ref_cache = adapter.make_cache()
    ref = adapter.model(tokens[:, :50], cache=ref_cache)
    ref = mx.concatenate([ref, adapter.model(tokens[:, 50:], cache=ref_cache)], axis=1)  # mlx-lm's own layers
    cache = adapter.make_cache()
    a, _, _ = adapter.forward(tokens[:, :50], cache, fast=False)
    b, _, _ = adapter.forward(tokens[:, 50:], cache, fast=False)   # over 50 cached positions
    assert adapter.backend.long.cpu_attention  # the CPU path that uses it
    assert mx.allclose(mx.concatenate([a, b], axis=1), ref, atol=1e-4).item()
