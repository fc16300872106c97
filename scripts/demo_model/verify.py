"""Stage 'verify': the exported checkpoint computes what PyTorch computes.

Checks, on a few chat prompts, all in fp32 on the CPU:
  1. trunk logits: mlx_lm.load(path) vs the PyTorch training model (same weights);
  2. trunk logits + hidden through adapters.load_adapter(path).forward (the engine's path);
  3. MTP depth-1 logits: the adapter's mtp_forward and this folder's own MLX head
     (mlx_mtp.py) vs the PyTorch head (with the sidecar's dequantized weights, so only
     arithmetic differs), and vs the float PyTorch head (the quantization effect, reported);
  4. MTP depth 2 run incrementally in MLX (cache filled from the trunk, then (g, token) fed
     back at the next position) vs the PyTorch training-time chain (its attention mask);
  5. layout: 29 sidecar tensors with the Qwythos names/dtypes, config keys, chat template.
Exit status 1 if a check fails.  Tolerance: max |diff| <= 1e-3 on logits (fp32 vs fp32; the
observed differences are ~1e-5).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
from blas import preload_openblas  # noqa: E402

preload_openblas()
import mlx.core as mx  # noqa: E402

TOL = 1e-3
PROMPTS = ["Hello!", 'What does "harbor" mean?', "Give me a synonym for happy.", "Tell me a quote.",
           "How do I convert between tuples and lists?"]


def torch_model(run_prefix, text_config, variant, sidecar_weights=None):
    import torch
    from model_torch import DemoModel, load_state

    m = DemoModel(text_config, variant, attn_impl="eager")
    load_state(m, run_prefix)
    m = m.float().eval()
    if sidecar_weights is not None:  # use exactly the (dequantized) exported head weights
        with torch.no_grad():
            for n, p in m.mtp.named_parameters():
                p.copy_(torch.from_numpy(np.array(sidecar_weights["mtp." + n], copy=True)))
    return m


def trunk_from_mlx(tm, mlx_model):
    """Load the (dequantized) exported trunk back into the PyTorch model, inverting the
    export rules, so that a quantized trunk is compared with identical weights."""
    import torch
    from mlx.utils import tree_flatten

    from export import TRUNK_ZC_NORMS

    sd = {}
    for k, v in tree_flatten(mlx_model.parameters()):
        v = np.array(v.astype(mx.float32))
        name = k[len("language_model."):]
        if name.endswith("conv1d.weight"):
            v = np.transpose(v, (0, 2, 1))
        elif name == "model.norm.weight" or any(name.endswith(x) for x in TRUNK_ZC_NORMS):
            v = v - 1.0
        sd["lm." + name] = torch.from_numpy(np.ascontiguousarray(v))
    missing, unexpected = tm.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert all(m.startswith("mtp.") or m == "lm.lm_head.weight" for m in missing), missing


def dequantized_sidecar(path) -> dict:
    cfg = json.loads((Path(path) / "config.json").read_text())
    w = mx.load(str(Path(path) / cfg["mtp_file"]))
    q = cfg.get("mtplx_mtp_quantization") or {}
    out = {}
    for k, v in w.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        base = k[: -len(".weight")]
        if v.dtype == mx.uint32:
            v = mx.dequantize(v, w[base + ".scales"], w[base + ".biases"], group_size=q["group_size"], bits=q["bits"])
        out[k] = np.array(v.astype(mx.float32))
    return out


def check_layout(path, problems):
    cfg = json.loads((Path(path) / "config.json").read_text())
    for k in ("model_type", "architectures", "eos_token_id", "tie_word_embeddings", "text_config", "mtp_file",
              "mlx_lm_extra_tensors", "mtplx_mtp_quantization", "mtp_hidden_variant", "mtp_concat_order",
              "mtp_norm_convention"):
        if k not in cfg:
            problems.append(f"config.json lacks {k}")
    tc = cfg["text_config"]
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
              "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval", "vocab_size",
              "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "attention_bias", "rope_parameters",
              "mtp_num_hidden_layers", "eos_token_id"):
        if k not in tc:
            problems.append(f"text_config lacks {k}")
    w = mx.load(str(Path(path) / cfg["mtp_file"]))
    if len(w) != 29:
        problems.append(f"sidecar has {len(w)} tensors, want 29")
    bf16 = [k for k, v in w.items() if v.dtype == mx.bfloat16 and not (k.endswith(".scales") or k.endswith(".biases"))]
    if len(bf16) != 8:
        problems.append(f"{len(bf16)} bf16 base tensors, want 8")
    trunk = mx.load(str(Path(path) / "model.safetensors"))
    if any(k.startswith("mtp.") or ".mtp." in k for k in trunk):
        problems.append("mtp tensor in trunk file")
    conv = [v.shape for k, v in trunk.items() if k.endswith("conv1d.weight")]
    if conv and conv[0][-1] != 1:
        problems.append(f"conv1d not (C,K,1): {conv[0]}")
    tok = json.loads((Path(path) / "tokenizer_config.json").read_text())
    if "<|im_start|>" not in tok.get("chat_template", ""):
        problems.append("chat template lacks ChatML")
    return cfg


def main(path, run_prefix, text_config_path):
    import torch
    from mlx_lm import load as mlx_load

    from mlx_mtp import load_mtp_head

    problems = []
    cfg = check_layout(path, problems)
    variant = cfg["mtp_hidden_variant"]
    tc = json.loads(Path(text_config_path).read_text())
    side = dequantized_sidecar(path)
    tm = torch_model(run_prefix, tc, variant, side)
    tm_float = torch_model(run_prefix, tc, variant)

    model, tokenizer = mlx_load(str(path))
    quantized_trunk = "quantization" in cfg
    if quantized_trunk:
        from mlx_lm.utils import dequantize_model

        model = dequantize_model(model)
    model.set_dtype(mx.float32)
    if quantized_trunk:  # compare with the exact (dequantized) weights; report the quantization effect
        trunk_from_mlx(tm, model)
    from adapters import load_adapter

    adapter = load_adapter(path)
    own_head = load_mtp_head(path, model.language_model.args)
    embed = model.language_model.model.embed_tokens
    report = {"trunk_mlx_lm": 0.0, "trunk_adapter": 0.0, "hidden_adapter": 0.0, "mtp_adapter": 0.0,
              "mtp_own": 0.0, "mtp_depth2_incremental": 0.0, "mtp_quant_effect_vs_float": 0.0,
              "greedy_agree_quant_vs_float": [], "trunk_quant_effect_vs_float": 0.0,
              "trunk_greedy_agree_quant_vs_float": []}
    for prompt in PROMPTS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)
        text += "The"  # a few reply tokens too
        ids = tokenizer.encode(text)
        T = len(ids)
        x = mx.array([ids])
        ti = torch.tensor([ids])
        with torch.no_grad():
            tl, th = tm.trunk(ti)
            tq = tm.mtp_chain(th, ti, 2)
            tqf = tm_float.mtp_chain(th, ti, 1)[0]
            tlf, _ = tm_float.trunk(ti)
        tl, th = tl[0].numpy(), th[0].numpy()
        tlf = tlf[0].numpy()
        report["trunk_quant_effect_vs_float"] = max(report["trunk_quant_effect_vs_float"], float(np.abs(tlf - tl).max()))
        report["trunk_greedy_agree_quant_vs_float"].append(float((tlf.argmax(-1) == tl.argmax(-1)).mean()))
        tq1, tq2, tqf = tq[0][0].numpy(), tq[1][0].numpy(), tqf[0].numpy()
        # 1. mlx_lm
        ml = np.array(model(x)[0])
        report["trunk_mlx_lm"] = max(report["trunk_mlx_lm"], float(np.abs(ml - tl).max()))
        # 2. adapter
        out = adapter.forward(x, adapter.make_cache())
        al, ah = np.array(out[0][0]), np.array(out[1][0])
        report["trunk_adapter"] = max(report["trunk_adapter"], float(np.abs(al - tl).max()))
        report["hidden_adapter"] = max(report["hidden_adapter"], float(np.abs(ah - th).max()))
        # 3. MTP depth 1 over the whole sequence: item i = (H[i], t[i+1])
        hid = out[1][:, : T - 1]
        nxt = x[:, 1:]
        mc = adapter.make_mtp_cache()
        res = adapter.mtp_forward(hid, nxt, mc)
        g = res[1] if isinstance(res, tuple) else res
        aq = np.array(adapter.lm_head(g)[0])
        report["mtp_adapter"] = max(report["mtp_adapter"], float(np.abs(aq - tq1).max()))
        oc = own_head.make_cache()
        oq, og = own_head(mx.array(th[None, : T - 1]), nxt, embed, embed.as_linear, oc)
        report["mtp_own"] = max(report["mtp_own"], float(np.abs(np.array(oq[0]) - tq1).max()))
        report["mtp_quant_effect_vs_float"] = max(report["mtp_quant_effect_vs_float"], float(np.abs(tqf - tq1).max()))
        report["greedy_agree_quant_vs_float"].append(float((tqf.argmax(-1) == tq1.argmax(-1)).mean()))
        # 4. depth 2, incremental: cache holds items 0..i (depth-1 entries), feed (g_i, t[i+2]) at i+1
        i = T - 4
        oc2 = own_head.make_cache()
        _, g1 = own_head(mx.array(th[None, : i + 1]), x[:, 1: i + 2], embed, embed.as_linear, oc2)
        q2, _ = own_head(g1[:, -1:], x[:, i + 2: i + 3], embed, embed.as_linear, oc2)
        report["mtp_depth2_incremental"] = max(report["mtp_depth2_incremental"],
                                               float(np.abs(np.array(q2[0, 0]) - tq2[i]).max()))
    report["greedy_agree_quant_vs_float"] = round(float(np.mean(report["greedy_agree_quant_vs_float"])), 4)
    report["trunk_greedy_agree_quant_vs_float"] = round(float(np.mean(report["trunk_greedy_agree_quant_vs_float"])), 4)
    report["trunk_quantized"] = cfg.get("quantization")
    for k in ("trunk_mlx_lm", "trunk_adapter", "hidden_adapter", "mtp_adapter", "mtp_own", "mtp_depth2_incremental"):
        if not report[k] <= TOL:
            problems.append(f"{k}: max|diff| {report[k]:.2e} > {TOL}")
    report["tolerance"] = TOL
    report["problems"] = problems
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--run", required=True)
    ap.add_argument("--text-config", required=True)
    a = ap.parse_args()
    r = main(a.model, a.run, a.text_config)
    sys.exit(1 if r["problems"] else 0)
