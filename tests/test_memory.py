"""What a conversation's caches cost (core/memory.py): the banner's memory line, measured on the
loaded model's own caches, against the bytes the config says they must hold."""
from __future__ import annotations

import json

import mlx.core as mx
import pytest

from adapters import load_adapter
from core.memory import Footprint, footprint


def expected(path, kv_bytes: int) -> Footprint:
    """From config.json: every attention layer and the head keep K and V per token; every
    Gated-DeltaNet layer keeps an fp32 state and a conv window of K - 1 inputs."""
    tc = json.loads((path / "config.json").read_text())
    tc = tc.get("text_config", tc)
    layers, every = tc["num_hidden_layers"], tc["full_attention_interval"]
    attention = layers // every
    per_token = (attention + 1) * 2 * tc["num_key_value_heads"] * tc["head_dim"] * kv_bytes
    Hv, Hk = tc["linear_num_value_heads"], tc["linear_num_key_heads"]
    Dv, Dk, K = tc["linear_value_head_dim"], tc["linear_key_head_dim"], tc["linear_conv_kernel_dim"]
    conv_dim = 2 * Hk * Dk + Hv * Dv
    state = Hv * Dv * Dk * 4 + (K - 1) * conv_dim * kv_bytes
    return Footprint(per_token, (layers - attention) * state)


@pytest.mark.parametrize("compute, kv_bytes", [("float32", 4), ("native", 2)])
def test_the_footprint_is_what_the_config_says(tiny_checkpoint, compute, kv_bytes):
    path = tiny_checkpoint(dtype="bfloat16")
    got = footprint(load_adapter(path, compute_dtype=compute))
    assert got == expected(path, kv_bytes)
    assert got.at(1000) == got.per_sequence + 1000 * got.per_token


def test_a_sliding_window_is_held_per_conversation(tiny_checkpoint):
    """Gemma 4's sliding-window layers keep at most their window: per conversation, not per token."""
    from tests.test_gemma4 import pair

    path = pair(tiny_checkpoint, "small")
    ad = load_adapter(path)
    got = footprint(ad)
    _, hidden, _ = ad.forward(mx.array([[0]]), cache := ad.make_cache())
    rows = [(getattr(c, "window", None), 2 * c.keys.nbytes // c.keys.shape[-2]) for c in cache]  # K and V
    assert any(w for w, _ in rows) and not all(w for w, _ in rows)
    assert got == Footprint(sum(r for w, r in rows if not w), sum(w * r for w, r in rows if w))


def test_the_description_reads_as_the_banner_shows_it():
    text = Footprint(36 * 2**10, 50 * 2**20).describe(131072)
    assert text.startswith("36.0 KiB per token of context") and "50.0 MiB per conversation" in text
    assert "131,072-token context: 4.5 GiB per conversation" in text
