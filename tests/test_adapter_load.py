"""load_adapter on tiny checkpoints of every generator option: the contract and the MTP head.

The MTP head is checked against ``tests/_mtp_reference.py`` (an independent forward that
dequantizes the sidecar itself). Tolerances:

- compute_dtype "auto" (fp32 on the CPU): adapter and reference do the same fp32 arithmetic
  on the same dequantized weights, so the MTP logits must agree to ``ATOL_FP32`` = 1e-4
  (they are bit-identical today; the slack only allows a different matmul kernel order).
- compute_dtype "native" (quantized bf16 head, as on Apple GPUs): within ``RTOL_NATIVE`` = 2%
  of the largest reference logit (measured 0.8%).
- zero-centred vs standard norms from the same seed: bit-identical with fp32 sidecars; with the
  usual bf16 sidecar the stored norm weights round differently (bf16 of w-1 vs of w), so
  within ``ATOL_BF16_NORMS`` = 0.5 on logits of magnitude ~17 (measured 0.13), while a wrong
  convention moves them by more than 10.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import pytest

from adapters import CheckpointError, MTPContract, load_adapter
from tests._mtp_reference import RefHead

ATOL_FP32 = 1e-4
RTOL_NATIVE = 0.02
ATOL_BF16_NORMS = 0.5
WRONG_CONVENTION_MIN_DIFF = 5.0

# id -> generator options. Every one must load, give the right contract, and a head that
# matches the reference.
VARIANTS = {
    "default": {},
    "float_trunk": dict(bits=None),
    "bits8": dict(bits=8),
    "bf16_float_trunk": dict(bits=None, dtype="bfloat16"),
    "untied": dict(tie_word_embeddings=False),
    "untied_float": dict(tie_word_embeddings=False, bits=None),
    "untied_bits8": dict(tie_word_embeddings=False, bits=8),
    "mixed_bits": dict(quant_overrides={"lm_head": 8, "embed_tokens": 8}, tie_word_embeddings=False),
    "sharded": dict(max_shard_bytes=64 * 1024),
    "sharded_float_untied": dict(max_shard_bytes=64 * 1024, bits=None, tie_word_embeddings=False),
    "head_unquantized_15": dict(mtp_bits=None),
    "head_8bit": dict(mtp_bits=8),
    "head_g64": dict(mtp_group_size=64),
    "fc_quantized_31": dict(quantize_fc=True),
    "fc_quantized_8bit_31": dict(quantize_fc=True, mtp_bits=8),
    "head_float32": dict(mtp_dtype="float32"),
    "prefixed": dict(key_prefix="language_model."),
    "prefixed_unquantized": dict(key_prefix="language_model.", mtp_bits=None),
    "keys_extra_only": dict(sidecar_keys="extra"),
    "keys_mtp_file_only": dict(sidecar_keys="mtp_file"),
    "keys_none_default_path": dict(sidecar_keys="none"),
    "toplevel_sidecar": dict(sidecar_keys="none", sidecar_path="mtp.safetensors"),
    "toplevel_sidecar_registered": dict(sidecar_path="mtp.safetensors"),
    "custom_sidecar_path": dict(sidecar_path="heads/draft.safetensors"),
    "custom_sidecar_extra_only": dict(sidecar_path="heads/draft.safetensors", sidecar_keys="extra"),
    "custom_sidecar_mtp_file_only": dict(sidecar_path="heads/draft.safetensors", sidecar_keys="mtp_file"),
    "no_tensor_count": dict(write_tensor_count=False),
    "no_convention_keys": dict(write_convention_keys=False),
    "no_convention_keys_standard": dict(write_convention_keys=False, zero_centered_norms=False),
    "standard_norms": dict(zero_centered_norms=False),
    "post_norm": dict(hidden_variant="post_norm"),
    "hidden_embedding": dict(concat_order="hidden_embedding"),
    "post_norm_hidden_embedding_fc31": dict(hidden_variant="post_norm", concat_order="hidden_embedding",
                                            quantize_fc=True),
    "deeper": dict(num_layers=8, full_attention_interval=4, bits=None),
}


def expected_contract(opts: dict) -> dict:
    bits = opts.get("bits", 4)
    mtp_bits = opts.get("mtp_bits", 4)
    keys = opts.get("write_convention_keys", True)
    zc = opts.get("zero_centered_norms", True)
    n, fai = opts.get("num_layers", 4), opts.get("full_attention_interval", 2)
    return dict(
        hidden_size=opts.get("hidden_size", 64),
        vocab_size=opts.get("vocab_size", 512),
        num_layers=n,
        layer_kinds=tuple("full" if (i + 1) % fai == 0 else "linear" for i in range(n)),
        mtp_num_layers=1,
        hidden_variant=opts.get("hidden_variant", "pre_norm") if keys else "pre_norm",
        hidden_variant_source="config" if keys else "Qwythos default",
        concat_order=opts.get("concat_order", "embedding_hidden") if keys else "embedding_hidden",
        norm_convention="zero_centered" if zc else "standard",
        trunk_bits=bits,
        trunk_group=opts.get("group_size", 32),
        mtp_quantization=None if mtp_bits is None else
        {"bits": mtp_bits, "group_size": opts.get("mtp_group_size") or opts.get("group_size", 32)},
        mtp_tensor_count=15 if mtp_bits is None else (31 if opts.get("quantize_fc") else 29),
        sidecar=opts.get("sidecar_path", "optiq/mtp.safetensors"),
        convention_source="config" if keys else "detected",
    )


def _tokens(n: int, vocab: int, seed: int = 0) -> mx.array:
    # ordinary ids (not the special tokens at the end of the vocabulary)
    return mx.random.randint(0, vocab - 3, (1, n), key=mx.random.key(seed)).astype(mx.int32)


def mtp_logits(adapter, tokens: mx.array) -> mx.array:
    """The adapter's MTP logits for every position n (H[n], t[n+1]) in one call."""
    _, hidden, _ = adapter.forward(tokens, adapter.make_cache())
    g = adapter.mtp_forward(hidden[:, :-1], tokens[:, 1:], adapter.make_mtp_cache())
    return adapter.lm_head(g).astype(mx.float32)


def reference_logits(adapter, path: Path, tokens: mx.array, *, variant=None) -> mx.array:
    ref = RefHead(adapter.model, path)
    if variant:
        ref.variant = variant
    _, hidden = ref.trunk(tokens)
    return ref.logits(hidden[:, :-1], tokens[:, 1:])


def max_diff(a: mx.array, b: mx.array) -> float:
    assert a.shape == b.shape
    return mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()


# --------------------------------------------------------------------------- every option
@pytest.mark.parametrize("opts", list(VARIANTS.values()), ids=list(VARIANTS))
def test_loads_with_the_right_contract_and_head(tiny_checkpoint, opts):
    path = tiny_checkpoint(**opts)
    adapter = load_adapter(path)
    c, want = adapter.contract, expected_contract(opts)
    assert isinstance(c, MTPContract)
    for key in ("hidden_size", "vocab_size", "num_layers", "layer_kinds", "mtp_num_layers",
                "hidden_variant", "hidden_variant_source", "concat_order", "norm_convention",
                "mtp_quantization", "mtp_tensor_count", "sidecar"):
        assert getattr(c, key) == want[key], (key, getattr(c, key), want[key])
    if want["convention_source"] == "config":
        assert c.norm_convention_source == "config"
    else:
        assert c.norm_convention_source.startswith("detected, mean ")
    if want["trunk_bits"] is None:
        assert c.trunk_quantization is None
    else:
        assert (c.trunk_quantization["bits"], c.trunk_quantization["group_size"]) == (
            want["trunk_bits"], want["trunk_group"])
    assert adapter.head.embedding_first == (c.concat_order == "embedding_hidden")
    # the summary and description carry the same facts
    s = c.summary()
    assert f"hidden_variant='{c.hidden_variant}' ({c.hidden_variant_source})" in s
    assert f"mtp_tensors={c.mtp_tensor_count}" in s and f"sidecar='{c.sidecar}'" in s
    assert adapter.describe()

    # the head: adapter vs the independent reference, all positions at once
    x = _tokens(12, c.vocab_size)
    ours = mtp_logits(adapter, x)
    theirs = reference_logits(adapter, path, x)
    assert ours.shape == (1, 11, c.vocab_size)
    assert max_diff(ours, theirs) <= ATOL_FP32
    assert mx.all(mx.isfinite(ours)).item()


@pytest.mark.parametrize("opts", [{}, dict(tie_word_embeddings=False, bits=8, quantize_fc=True)],
                         ids=["default", "untied_bits8_fc31"])
def test_head_in_native_dtype_matches_reference(tiny_checkpoint, opts):
    """Quantized bf16 head (no fp32 upcast), as the GPU path runs it."""
    path = tiny_checkpoint(**opts)
    adapter = load_adapter(path, compute_dtype="native")
    assert adapter.compute_dtype == "native"
    assert adapter.head.layers[0].self_attn.q_proj.__class__.__name__ == "QuantizedLinear"
    x = _tokens(12, adapter.contract.vocab_size)
    ours = mtp_logits(adapter, x)
    theirs = reference_logits(adapter, path, x)
    scale = mx.max(mx.abs(theirs)).item()
    assert max_diff(ours, theirs) <= RTOL_NATIVE * scale


@pytest.mark.parametrize("zero_centered", [True, False])
def test_a_bf16_heads_activations_stay_bf16(tiny_checkpoint, zero_centered):
    """The head computes in the trunk's dtype: a norm folded in fp32 made every activation after it
    fp32, and on a GPU its linears and the lm_head left the bf16 kernels (3.1 ms a draft step)."""
    adapter = load_adapter(tiny_checkpoint(dtype="bfloat16", zero_centered_norms=zero_centered), compute_dtype="native")
    x = _tokens(6, adapter.contract.vocab_size)
    logits, hidden, _ = adapter.forward(x[:, :4], adapter.make_cache())
    g, draft_logits = adapter.draft_step(adapter.make_draft(None), None, hidden[:, -1:], x[:, 4:5])
    assert (hidden.dtype, logits.dtype, g.dtype, draft_logits.dtype) == (mx.bfloat16,) * 4


def test_fp32_compute_dequantizes_head_and_trunk(tiny_checkpoint):
    adapter = load_adapter(tiny_checkpoint(quantize_fc=True), compute_dtype="float32")
    from mlx.utils import tree_flatten

    for module in (adapter.head, adapter.model):
        dtypes = {v.dtype for _, v in tree_flatten(module.parameters())}
        assert dtypes == {mx.float32}, dtypes


def test_mtp_cache_step_by_step_equals_one_call(tiny_checkpoint):
    """The head's own KV cache: prefill then one position at a time == the whole sequence at once."""
    adapter = load_adapter(tiny_checkpoint())
    x = _tokens(10, adapter.contract.vocab_size, seed=5)
    _, hidden, _ = adapter.forward(x, adapter.make_cache())
    full = adapter.mtp_forward(hidden[:, :-1], x[:, 1:], adapter.make_mtp_cache())
    cache = adapter.make_mtp_cache()
    parts = [adapter.mtp_forward(hidden[:, :4], x[:, 1:5], cache)]
    for n in range(4, 9):
        parts.append(adapter.mtp_forward(hidden[:, n : n + 1], x[:, n + 1 : n + 2], cache))
    assert cache.offset == 9
    assert max_diff(mx.concatenate(parts, axis=1), full) <= 1e-5


def test_symlinked_files_load_like_a_hugging_face_cache_snapshot(tiny_checkpoint, tmp_path):
    """HF cache snapshots hold symlinks to blobs outside the snapshot folder: that is not 'outside'."""
    src = tiny_checkpoint()
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc123"
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = f.relative_to(src)
        blob = blobs / rel.as_posix().replace("/", "__")
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, blob)
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(blob, snap / rel)
    adapter = load_adapter(snap)
    assert adapter.contract.sidecar == "optiq/mtp.safetensors"
    x = _tokens(8, adapter.contract.vocab_size)
    assert max_diff(mtp_logits(adapter, x), reference_logits(adapter, snap, x)) <= ATOL_FP32


def test_registered_path_wins_over_default_locations(tiny_checkpoint):
    """Look-up order: mlx_lm_extra_tensors.mtp_file, mtp_file, optiq/mtp.safetensors, mtp.safetensors."""
    path = tiny_checkpoint(fresh=True, sidecar_path="heads/draft.safetensors", sidecar_keys="extra")
    # a decoy at the default location, with a different (8-bit) head: must not be picked
    decoy = tiny_checkpoint(mtp_bits=8, seed=11)
    (path / "optiq").mkdir()
    shutil.copyfile(decoy / "optiq" / "mtp.safetensors", path / "optiq" / "mtp.safetensors")
    assert load_adapter(path).contract.sidecar == "heads/draft.safetensors"
    # mlx_lm_extra_tensors.mtp_file is consulted before mtp_file
    cfg = json.loads((path / "config.json").read_text())
    cfg["mtp_file"] = "optiq/mtp.safetensors"
    (path / "config.json").write_text(json.dumps(cfg))
    assert load_adapter(path).contract.sidecar == "heads/draft.safetensors"
    # unregistered: the default location is used (its bits are not registered either: inferred)
    cfg.pop("mtp_file"), cfg.pop("mlx_lm_extra_tensors"), cfg.pop("mtplx_mtp_quantization")
    (path / "config.json").write_text(json.dumps(cfg))
    c = load_adapter(path).contract
    assert c.sidecar == "optiq/mtp.safetensors" and c.mtp_quantization["bits"] == 8


def test_head_quantization_inferred_without_registration(tiny_checkpoint):
    """No mtplx_mtp_quantization in config.json: bits and group size come from the shapes."""
    for bits, group in ((4, 32), (8, 64)):
        path = tiny_checkpoint(fresh=True, mtp_bits=bits, mtp_group_size=group)
        cfg = json.loads((path / "config.json").read_text())
        cfg.pop("mtplx_mtp_quantization")
        (path / "config.json").write_text(json.dumps(cfg))
        adapter = load_adapter(path)
        assert adapter.contract.mtp_quantization == {"bits": bits, "group_size": group}
        x = _tokens(8, adapter.contract.vocab_size)
        ref = RefHead(adapter.model, tiny_checkpoint(mtp_bits=bits, mtp_group_size=group))
        _, h = ref.trunk(x)
        assert max_diff(mtp_logits(adapter, x), ref.logits(h[:, :-1], x[:, 1:])) <= ATOL_FP32


# --------------------------------------------------------------------------- the norm fix
@pytest.mark.parametrize("keys", [True, False], ids=["convention_keys", "detected"])
@pytest.mark.parametrize("mtp_dtype", ["float32", "bfloat16"])
def test_zero_centred_and_standard_norms_give_the_same_head(tiny_checkpoint, keys, mtp_dtype):
    """Same seed, norms stored as w-1 (zero-centred) or w (standard): same MTP logits."""
    common = dict(seed=7, write_convention_keys=keys, mtp_dtype=mtp_dtype)
    zc = load_adapter(tiny_checkpoint(zero_centered_norms=True, **common))
    st = load_adapter(tiny_checkpoint(zero_centered_norms=False, **common))
    assert (zc.contract.norm_convention, st.contract.norm_convention) == ("zero_centered", "standard")
    for c in (zc.contract, st.contract):
        if keys:
            assert c.norm_convention_source == "config"
        else:
            # how it decided, with the evidence: the mean of the stored norm weights
            assert c.norm_convention_source.startswith("detected, mean ")
            mean = float(c.norm_convention_source.rsplit(" ", 1)[-1])
            assert (mean < 0.5) == (c.norm_convention == "zero_centered")
    # the applied norm weights sit near 1 either way
    for a in (zc, st):
        assert abs(mx.mean(a.head.norm.weight).item() - 1.0) < 0.1
    x = _tokens(12, zc.contract.vocab_size, seed=3)
    a, b = mtp_logits(zc, x), mtp_logits(st, x)
    if mtp_dtype == "float32":
        assert max_diff(a, b) <= 1e-5
    else:
        assert max_diff(a, b) <= ATOL_BF16_NORMS
        assert mx.mean(mx.argmax(a, -1) == mx.argmax(b, -1)).item() >= 0.9


@pytest.mark.parametrize("stored_zc", [True, False])
def test_a_wrong_norm_convention_changes_the_head(tiny_checkpoint, stored_zc):
    """The control for the test above: declaring the wrong convention moves the logits a lot."""
    path = tiny_checkpoint(fresh=True, seed=7, zero_centered_norms=stored_zc)
    good = load_adapter(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["mtp_norm_convention"] = "standard" if stored_zc else "zero_centered"
    (path / "config.json").write_text(json.dumps(cfg))
    bad = load_adapter(path)
    assert bad.contract.norm_convention_source == "config"
    assert bad.contract.norm_convention != good.contract.norm_convention
    x = _tokens(12, good.contract.vocab_size, seed=3)
    assert max_diff(mtp_logits(good, x), mtp_logits(bad, x)) >= WRONG_CONVENTION_MIN_DIFF


# --------------------------------------------------------------------------- hidden variant
def test_hidden_variant_from_config_override_and_default(tiny_checkpoint):
    post = tiny_checkpoint(hidden_variant="post_norm")
    c = load_adapter(post).contract
    assert (c.hidden_variant, c.hidden_variant_source) == ("post_norm", "config")
    c = load_adapter(post, hidden_variant="pre_norm").contract
    assert (c.hidden_variant, c.hidden_variant_source) == ("pre_norm", "override")
    c = load_adapter(tiny_checkpoint(), hidden_variant="post_norm").contract
    assert (c.hidden_variant, c.hidden_variant_source) == ("post_norm", "override")
    c = load_adapter(tiny_checkpoint(write_convention_keys=False)).contract
    assert (c.hidden_variant, c.hidden_variant_source) == ("pre_norm", "Qwythos default")
    c = load_adapter(tiny_checkpoint(write_convention_keys=False), hidden_variant="post_norm").contract
    assert (c.hidden_variant, c.hidden_variant_source) == ("post_norm", "override")


@pytest.mark.parametrize("variant", ["pre_norm", "post_norm"])
def test_hidden_variant_feeds_the_head(tiny_checkpoint, variant):
    """The override decides which trunk hidden the head sees; the reference agrees; they differ."""
    path = tiny_checkpoint(hidden_variant="post_norm")
    adapter = load_adapter(path, hidden_variant=variant)
    x = _tokens(12, adapter.contract.vocab_size, seed=4)
    logits, hidden, _ = adapter.forward(x, adapter.make_cache())
    if variant == "post_norm":
        assert max_diff(adapter.lm_head(hidden), logits) <= 1e-4
    else:
        assert max_diff(adapter.lm_head(adapter.inner.norm(hidden)), logits) <= 1e-4
    ours = mtp_logits(adapter, x)
    assert max_diff(ours, reference_logits(adapter, path, x, variant=variant)) <= ATOL_FP32
    other = "pre_norm" if variant == "post_norm" else "post_norm"
    assert max_diff(ours, reference_logits(adapter, path, x, variant=other)) > 0.1


# --------------------------------------------------------------------------- concat order
@pytest.mark.parametrize("order", ["embedding_hidden", "hidden_embedding"])
def test_concat_order_is_honoured(tiny_checkpoint, order):
    path = tiny_checkpoint(fresh=True, concat_order=order, seed=9)
    adapter = load_adapter(path)
    assert adapter.contract.concat_order == order
    x = _tokens(12, adapter.contract.vocab_size, seed=6)
    right = reference_logits(adapter, path, x)  # reads the order from config.json
    assert max_diff(mtp_logits(adapter, x), right) <= ATOL_FP32
    # the same weights read in the other order: a different head
    cfg = json.loads((path / "config.json").read_text())
    cfg["mtp_concat_order"] = "hidden_embedding" if order == "embedding_hidden" else "embedding_hidden"
    (path / "config.json").write_text(json.dumps(cfg))
    flipped = load_adapter(path)
    assert flipped.contract.concat_order == cfg["mtp_concat_order"]
    assert flipped.head.embedding_first == (cfg["mtp_concat_order"] == "embedding_hidden")
    assert max_diff(mtp_logits(flipped, x), right) > 0.1


def test_concat_order_defaults_to_embedding_first(tiny_checkpoint):
    adapter = load_adapter(tiny_checkpoint(write_convention_keys=False))
    assert adapter.contract.concat_order == "embedding_hidden" and adapter.head.embedding_first


def test_bad_override_is_a_checkpoint_error(tiny_checkpoint):
    with pytest.raises(CheckpointError, match="hidden_variant argument 'middle' is not 'pre_norm' or 'post_norm'"):
        load_adapter(tiny_checkpoint(), hidden_variant="middle")
