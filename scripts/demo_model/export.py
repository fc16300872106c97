"""Stage 'export': PyTorch training shards -> the Qwythos on-disk layout (docs/checkpoint-layout.md).

    config.json                 model_type qwen3_5, nested text_config, sidecar keys, conventions
    model.safetensors (+index)  trunk in mlx-lm's sanitized layout (language_model.model....)
    tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json
    optiq/mtp.safetensors       29 tensors: 8 bf16 (fc + 7 zero-centred norms) + 7 linears
                                affine-quantized with mx.quantize (weight/scales/biases)

Trunk conversion rules (HF -> mlx-lm): conv1d (C,1,K) -> (C,K,1); the zero-centred HF RMSNorms
(input/post_attention layernorm, final norm, q/k norm) are stored as applied (1 + w); the gated
linear_attn.norm is standard and copied; A_log / dt_bias copied.  The trunk is stored float
(bf16 matrices, fp32 1-D tensors) unless --trunk-bits is given (then mlx_lm's quantize_model).
"""
from __future__ import annotations

import glob
import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
from blas import preload_openblas  # noqa: E402

preload_openblas()

import mlx.core as mx  # noqa: E402

TRUNK_ZC_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
                  ".k_norm.weight")
MTP_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")




def load_torch_shards(prefix) -> dict:
    import torch
    from safetensors.torch import load_file

    sd = {}
    files = sorted(glob.glob(f"{prefix}-*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no shards {prefix}-*.safetensors")
    for fn in files:
        sd.update(load_file(fn))
    return {k: v.to(torch.float32).numpy() for k, v in sd.items()}


def convert_trunk(sd: dict) -> dict:
    """HF Qwen3_5ForCausalLM names (model.*) -> mlx-lm sanitized names, values as applied (fp32)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("mtp.") or k == "lm_head.weight":
            continue
        assert k.startswith("model."), k
        name = "language_model." + k
        if k.endswith("conv1d.weight"):
            v = np.transpose(v, (0, 2, 1))  # (C,1,K) -> (C,K,1)
        elif k == "model.norm.weight" or any(k.endswith(s) for s in TRUNK_ZC_NORMS):
            v = v + 1.0
        out[name] = np.ascontiguousarray(v)
    return out


def mtp_tensors(sd: dict, bits: int | None, group_size: int) -> dict:
    out = {}
    for k, v in sorted(sd.items()):
        if not k.startswith("mtp."):
            continue
        base = k[: -len(".weight")]
        if bits and any(base.endswith(l) for l in MTP_LINEARS):
            w = mx.array(v).astype(mx.bfloat16).astype(mx.float32)
            wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
            out[base + ".weight"] = wq
            out[base + ".scales"] = scales.astype(mx.bfloat16)
            out[base + ".biases"] = biases.astype(mx.bfloat16)
        else:
            out[k] = mx.array(v).astype(mx.bfloat16)  # fc and the zero-centred norms
    mx.eval(out)
    return out


def export(run_prefix, text_config_path, tokenizer_dir, out_dir, *, mtp_bits=4, mtp_group_size=64,
           trunk_bits=None, trunk_group_size=64, hidden_variant="post_norm", extra_config=None):
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import qwen3_5
    from mlx_lm.utils import get_total_parameters, quantize_model, save_config

    out = Path(out_dir)
    if out.exists():
        for p in list(out.iterdir()):
            if p.name == "README.md":
                continue
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    tc = json.loads(Path(text_config_path).read_text())
    tc = {k: v for k, v in tc.items() if k not in ("attention_dropout", "initializer_range")}
    tc["attn_output_gate"] = True
    tc["mtp_use_dedicated_embeddings"] = False
    tc["pad_token_id"] = 0
    # <|im_end|> ends a reply; <|endoftext|> (0, the document separator) too: the model
    # sometimes emits it and would otherwise go on to write a user turn.
    eos = [tc["eos_token_id"], 0] if tc["eos_token_id"] != 0 else [0]
    tc["eos_token_id"] = eos
    sd = load_torch_shards(run_prefix)

    # --- trunk through mlx-lm's own model (so that its loader accepts exactly these keys)
    args = qwen3_5.ModelArgs.from_dict({"model_type": "qwen3_5", "text_config": json.loads(json.dumps(tc))})
    model = qwen3_5.Model(args)
    trunk = convert_trunk(sd)
    want = dict(tree_flatten(model.parameters()))
    missing = set(want) - set(trunk)
    extra = set(trunk) - set(want)
    assert not missing and not extra, (sorted(missing)[:5], sorted(extra)[:5])
    for k, v in trunk.items():
        assert tuple(want[k].shape) == v.shape, (k, want[k].shape, v.shape)
    arrays = {}
    for k, v in trunk.items():
        a = mx.array(v)
        arrays[k] = a.astype(mx.bfloat16) if v.ndim >= 2 else a  # 1-D tensors stay fp32 (exact 1 + w)
    model.update(tree_unflatten(list(arrays.items())))
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": tc,
        "tie_word_embeddings": tc["tie_word_embeddings"],
        "eos_token_id": eos,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }
    if trunk_bits:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            model, config = quantize_model(model, config, trunk_group_size, trunk_bits, mode="affine")
    mx.eval(model.parameters())
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    index = {"metadata": {"total_size": sum(v.nbytes for v in weights.values()),
                          "total_parameters": get_total_parameters(model)},
             "weight_map": {k: "model.safetensors" for k in sorted(weights)}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=4))

    # --- MTP sidecar
    tensors = mtp_tensors(sd, mtp_bits, mtp_group_size)
    (out / "optiq").mkdir(exist_ok=True)
    mx.save_safetensors(str(out / "optiq" / "mtp.safetensors"), tensors, metadata={"format": "mlx"})
    config["mtp_file"] = "optiq/mtp.safetensors"
    config["mlx_lm_extra_tensors"] = {"mtp_file": "optiq/mtp.safetensors"}
    if mtp_bits:
        config["mtplx_mtp_quantization"] = {"bits": mtp_bits, "group_size": mtp_group_size, "mode": "affine",
                                            "policy": "cyankiwi", "prequantized": True}
        config["mtp_policy"] = "cyankiwi"
    config["mtp_tensor_count"] = len(tensors)
    config["mtp_hidden_variant"] = hidden_variant
    config["mtp_concat_order"] = "embedding_hidden"
    config["mtp_norm_convention"] = "zero_centered"
    if extra_config:
        config.update(extra_config)
    save_config(config, out / "config.json")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": 0}, indent=2))
    for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(tokenizer_dir) / fn, out / fn)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"exported {out}: {len(weights)} trunk tensors, {len(tensors)} MTP tensors, {size / 2**20:.2f} MiB")
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="prefix of the training shards (…/NAME)")
    ap.add_argument("--text-config", required=True)
    ap.add_argument("--tokenizer", default="artifacts/demo/tokenizer")
    ap.add_argument("--out", default="models/demo")
    ap.add_argument("--mtp-bits", type=int, default=8)
    ap.add_argument("--mtp-group-size", type=int, default=64)
    ap.add_argument("--trunk-bits", type=int, default=0)
    ap.add_argument("--variant", default="post_norm")
    a = ap.parse_args()
    export(a.run, a.text_config, a.tokenizer, a.out, mtp_bits=a.mtp_bits or None, mtp_group_size=a.mtp_group_size,
           trunk_bits=a.trunk_bits or None, hidden_variant=a.variant)
