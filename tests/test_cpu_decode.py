"""The CPU-compiled backend (adapters/qwen3_5/cpu_runner.py) against the MLX-ops one (= mlx-lm's modules)."""
import mlx.core as mx
import pytest

from adapters import load_adapter
from adapters.qwen3_5 import backends
from tests._engine_helpers import load_modules_path


def _tokens(n, vocab, seed=0):
    return mx.random.randint(0, vocab, (1, n), key=mx.random.key(seed)).astype(mx.int32)


def _pair(path, **kw):
    fast, ref = load_adapter(path, **kw), load_modules_path(path, **kw)
    assert fast.backend.name == "cpu-compiled", "the CPU float32 load should use the compiled path"
    return fast, ref


def _close(a, b, what):
    # float32 rounding differs (fused kernels, RMSNorm written out); a wrong op is off by O(1).
    err = mx.abs(a - b).max().item()
    scale = max(mx.abs(b).max().item(), 1.0)
    assert err <= 5e-5 * scale, f"{what}: max |diff| {err:g} (scale {scale:g})"


@pytest.mark.parametrize("opts", [
    dict(bits=None),
    dict(bits=4, hidden_variant="post_norm"),
    dict(bits=None, linear_num_key_heads=4, num_kv_heads=4, full_attention_interval=4, num_layers=8),
    dict(bits=8, tie_word_embeddings=False, partial_rotary_factor=0.5, rope_theta=10000.0),
])
def test_trunk_and_head_match_mlx_lm_modules(tiny_checkpoint, opts):
    fast, ref = _pair(tiny_checkpoint(**opts))
    V = fast.contract.vocab_size
    x = _tokens(24, V)
    c_fast, c_ref = fast.make_cache(), ref.make_cache()
    m_fast, m_ref = fast.make_mtp_cache(), ref.make_mtp_cache()
    # A long prompt goes through mlx-lm in both (wider than the compiled path serves).
    assert 12 > backends.FEW_TOKENS
    _, h_fast, _ = fast.forward(x[:, :12], c_fast)
    _, h_ref, _ = ref.forward(x[:, :12], c_ref)
    fast.mtp_forward(h_fast[:, :-1], x[:, 1:12], m_fast)
    ref.mtp_forward(h_ref[:, :-1], x[:, 1:12], m_ref)
    pos = 12
    for width in (1, 2, 3, 4, 1):
        block = x[:, pos : pos + width]
        l_fast, h_fast, cap_fast = fast.forward(block, c_fast, capture=width > 1)
        l_ref, h_ref, cap_ref = ref.forward(block, c_ref, capture=width > 1)
        _close(l_fast, l_ref, f"logits, width {width}")
        _close(h_fast, h_ref, f"hidden, width {width}")
        if width > 1:
            for i in cap_ref.gdn:
                _close(cap_fast.gdn[i][0], cap_ref.gdn[i][0], "captured conv input")
                _close(mx.stack(list(cap_fast.gdn[i][1])), mx.stack(list(cap_ref.gdn[i][1])), "captured states")
        g_fast = fast.mtp_forward(h_fast, block, m_fast)
        g_ref = ref.mtp_forward(h_ref, block, m_ref)
        _close(g_fast, g_ref, f"MTP head, width {width}")
        _close(fast.lm_head(g_fast), ref.lm_head(g_ref), f"MTP logits, width {width}")
        pos += width
    for a, b in zip(c_fast, c_ref):
        if hasattr(a, "offset"):
            assert a.offset == b.offset
            for u, v in zip(a.state[:2], b.state[:2]):
                _close(u[..., : a.offset, :], v[..., : b.offset, :], "KV cache")
        else:
            _close(a[0], b[0], "conv window")
            _close(a[1], b[1], "recurrent state")


def test_other_layouts_keep_mlx_lm_path(tiny_checkpoint):
    path = tiny_checkpoint(bits=None)
    assert load_adapter(path, compute_dtype="native").backend.name == "mlx"
