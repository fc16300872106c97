"""The shipped demo checkpoint (models/demo): its contract and greedy MTP == greedy AR.

Layout as docs/checkpoint-layout.md says (config keys, 29-tensor sidecar with the Qwythos names
and storage, mlx-lm trunk keys, no mtp.* in the trunk), the Qwen3.5 chat template (ChatML turns,
tools in the system turn, a <think> block opened by the generation prompt unless thinking is
off), that it loads through adapters.load_adapter with the declared conventions, that its MTP
head actually predicts (acceptance well above chance), and that greedy speculative output is
token-identical to greedy autoregressive output at depths 1-3, up to near-ties (the demo's
verify rows and decode rows are float32 matmuls of different row counts: tests/_ties.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo"

pytestmark = pytest.mark.skipif(not (DEMO / "config.json").exists(), reason="models/demo not present")

MTP_BF16 = {
    "mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
    "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight",
    "mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.self_attn.k_norm.weight",
}
MTP_QUANT = [f"mtp.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
    [f"mtp.layers.0.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]

PROMPTS = ['What does "harbor" mean?', "Give me a synonym for happy.", "Hello!", "Tell me a quote.",
           "What kind of thing is a violin?"]


@pytest.fixture(scope="module")
def config():
    return json.loads((DEMO / "config.json").read_text())


@pytest.fixture(scope="module")
def adapter():
    from adapters import load_adapter

    return load_adapter(DEMO)


def test_size_and_files():
    files = {p.relative_to(DEMO).as_posix() for p in DEMO.rglob("*") if p.is_file()}
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "optiq/mtp.safetensors", "README.md"):
        assert f in files, f
    size = sum(p.stat().st_size for p in DEMO.rglob("*") if p.is_file())
    assert size <= 32 * 2**20, size


def test_config_contract(config):
    assert config["model_type"] == "qwen3_5"
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    tc = config["text_config"]
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
              "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval", "vocab_size",
              "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "attention_bias", "rope_parameters",
              "mtp_num_hidden_layers", "eos_token_id"):
        assert k in tc, k
    assert tc["mtp_num_hidden_layers"] == 1
    assert "partial_rotary_factor" in tc["rope_parameters"]
    assert config["mtp_file"] == "optiq/mtp.safetensors"
    assert config["mlx_lm_extra_tensors"] == {"mtp_file": "optiq/mtp.safetensors"}
    q = config["mtplx_mtp_quantization"]
    assert q["mode"] == "affine" and q["prequantized"] is True and q["bits"] in (4, 8)
    assert config["mtp_hidden_variant"] in ("pre_norm", "post_norm")
    assert config["mtp_concat_order"] == "embedding_hidden"
    assert config["mtp_norm_convention"] == "zero_centered"
    assert config["eos_token_id"] == tc["eos_token_id"]


def test_sidecar_tensors(config):
    import mlx.core as mx

    w = mx.load(str(DEMO / "optiq" / "mtp.safetensors"))
    assert len(w) == 29 == config.get("mtp_tensor_count", 29)
    expected = set(MTP_BF16) | {f"{b}.{s}" for b in MTP_QUANT for s in ("weight", "scales", "biases")}
    assert set(w) == expected
    H = config["text_config"]["hidden_size"]
    for k in MTP_BF16:
        assert w[k].dtype == mx.bfloat16, k
    assert w["mtp.fc.weight"].shape == (H, 2 * H)
    for b in MTP_QUANT:
        assert w[b + ".weight"].dtype == mx.uint32
    # zero-centred storage: the 1-D norms are near 0, not near 1
    norms = [k for k in MTP_BF16 if w[k].ndim == 1]
    assert float(mx.mean(mx.stack([mx.mean(w[k].astype(mx.float32)) for k in norms]))) < 0.5


def test_trunk_keys():
    import mlx.core as mx

    t = mx.load(str(DEMO / "model.safetensors"))
    assert "language_model.model.embed_tokens.weight" in t
    assert not any("mtp." in k for k in t)
    conv = [v for k, v in t.items() if k.endswith("linear_attn.conv1d.weight")]
    assert conv and all(v.shape[-1] == 1 for v in conv)
    # trunk RMSNorms are stored as applied (near 1)
    assert float(mx.mean(t["language_model.model.norm.weight"].astype(mx.float32))) > 0.5


def test_chat_template_and_eos(adapter, config):
    from core import chat_prompt_ids

    tok = adapter.tokenizer
    ids = chat_prompt_ids(adapter, [{"role": "user", "content": "Hello!"}])
    # mlx-lm passes enable_thinking=true to a tokenizer with <think> tags: the demo thinks by
    # default, as Qwythos does
    assert tok.decode(ids) == "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert tok.eos_token == "<|im_end|>"
    assert set(config["eos_token_id"]) == set(tok.eos_token_ids) == {2, 0}  # <|im_end|>, <|endoftext|>
    for tag in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag   # one token each, kept in decoded text


def test_template_advertises_tools_and_thinking(adapter):
    from core.chat import render

    tok = adapter.tokenizer
    ask = [{"role": "user", "content": "What does lantern mean?"}]
    off = tok.decode(render(adapter, ask, enable_thinking=False))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tool = {"type": "function", "function": {"name": "define_word", "description": "Define an English word.",
                                             "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}
    text = tok.decode(render(adapter, ask, tools=[tool]))
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "define_word"' in text
    assert "<tool_call>" in text and text.endswith("<|im_start|>assistant\n<think>\n")
    call = {"type": "function", "function": {"name": "define_word", "arguments": '{"word": "lantern"}'}}
    follow = tok.decode(render(adapter, ask + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                               {"role": "tool", "content": "a light in a case"}], tools=[tool]))
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "define_word", "arguments": {"word": "lantern"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\na light in a case\n</tool_response>') in follow


def test_adapter_contract(adapter):
    c = adapter.contract
    assert c.hidden_variant_source == "config" and c.norm_convention == "zero_centered"
    assert c.mtp_tensor_count == 29


def test_greedy_mtp_equals_ar_and_head_predicts(adapter):
    from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt_ids
    from tests._ties import assert_greedy_equal

    greedy = SamplerConfig(temperature=0)
    acc = prop = 0
    for depth in (1, 2, 3):
        for p in PROMPTS[: 2 if depth > 1 else len(PROMPTS)]:
            ids = chat_prompt_ids(adapter, [{"role": "user", "content": p}])
            ar, _ = AutoregressiveDecoder(adapter, sampler=greedy).generate(ids, max_tokens=48)
            mtp, stats = SpeculativeDecoder(adapter, sampler=greedy, depth=depth).generate(ids, max_tokens=48)
            assert_greedy_equal(adapter, ids, mtp, ar, what=f"{p!r} depth {depth}")
            if depth == 1:
                acc += stats.accepted
                prop += stats.proposed
    assert acc / prop > 0.5, acc / prop  # a trained head, not a random one
