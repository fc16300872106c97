"""Random-weight Gemma 4 pairs: a backbone and its assistant drafter, published config keys and
tensor names, small shapes. `make_tiny_checkpoint(out, family="gemma4", ...)` calls this.

Two kinds, as published:

- size="small" (E2B/E4B): per-layer inputs (`embed_tokens_per_layer`, `per_layer_*`), the last
  `num_kv_shared_layers` layers reusing earlier K/V, double-wide MLPs there, and a drafter with
  the centroid head (`use_ordered_embeddings`, `masked_embedding.centroids`, `token_ordering`);
- size="large" (31B, or 26B-A4B with moe=True): keys equal values on full-attention layers
  (`attention_k_eq_v`, `num_global_key_value_heads`), no KV sharing, a drafter with the full tied
  head.

layout="hf" writes the original checkpoint's names (`model.language_model.*`, k/v projections of
KV-shared layers included, which mlx-lm drops); layout="mlx" writes an `mlx_lm convert`
conversion (`language_model.model.*`, quantized with `bits`). The drafter, in BACKBONE/assistant/
(found without --drafter) or `drafter_dir`, has Hugging Face names in both (mlx-vlm keeps them).

drafter="aligned" (default) makes a drafter that agrees with the backbone part of the time, as a
trained one does: the backbone is mostly a function of the current token through its MLPs
(post-norm gains: MLP 24 in the first 4 layers, 1 after; attention 0.5), and the drafter's layers copy the first backbone
layers' attention queries and MLPs, its pre_projection passes the token's embedding through and
its head is the backbone's embedding table; the centroids are the mean embedding of their
cluster. drafter="random" draws everything.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Optional, Union

import numpy as np

from scripts.checkpoints.shards import save_trunk
from scripts.checkpoints.tokenizer_files import EOS_TOKEN, PAD_TOKEN, write_tokenizer

NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def backbone_text_config(size: str, *, hidden_size: int, num_layers: int, vocab_size: int, sliding_window: int,
                         moe: bool, max_position_embeddings: int) -> dict:
    full = {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"}
    sliding = {"rope_theta": 10000.0, "rope_type": "default"}
    small = size == "small"
    period = 3
    types = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(num_layers)]
    types[-1] = "full_attention"
    tc = {
        "model_type": "gemma4_text", "attention_bias": False, "attention_dropout": 0.0,
        "attention_k_eq_v": not small, "bos_token_id": 2, "eos_token_id": 1, "dtype": "bfloat16",
        "enable_moe_block": moe, "final_logit_softcapping": 30.0, "global_head_dim": 32, "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": hidden_size,
        "hidden_size_per_layer_input": 8 if small else 0, "initializer_range": 0.02,
        "intermediate_size": 2 * hidden_size, "layer_types": types,
        "max_position_embeddings": max_position_embeddings, "moe_intermediate_size": 32 if moe else None,
        "num_attention_heads": 4, "num_experts": 4 if moe else None,
        "num_global_key_value_heads": None if small else 1, "num_hidden_layers": num_layers,
        "num_key_value_heads": 1 if small else 2, "num_kv_shared_layers": 2 if small else 0,
        "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
        "sliding_window": sliding_window, "tie_word_embeddings": True, "top_k_experts": 2 if moe else None,
        "use_bidirectional_attention": None, "use_cache": True, "use_double_wide_mlp": small,
        "vocab_size": vocab_size, "vocab_size_per_layer_input": vocab_size if small else 0,
    }
    return tc


def drafter_config(btc: dict, *, head: str, num_centroids: int, top_k: int) -> dict:
    tc = {k: btc[k] for k in ("attention_bias", "attention_dropout", "attention_k_eq_v", "bos_token_id",
                              "eos_token_id", "global_head_dim", "head_dim", "hidden_activation",
                              "max_position_embeddings", "num_global_key_value_heads", "num_key_value_heads",
                              "pad_token_id", "rms_norm_eps", "rope_parameters", "sliding_window", "vocab_size")}
    tc.update({"model_type": "gemma4_text", "dtype": "bfloat16", "enable_moe_block": False,
               "final_logit_softcapping": None, "hidden_size": btc["hidden_size"], "hidden_size_per_layer_input": 0,
               "intermediate_size": btc["intermediate_size"],
               "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "moe_intermediate_size": None,
               "num_attention_heads": btc["num_attention_heads"], "num_experts": None, "num_hidden_layers": 4,
               "num_kv_shared_layers": 4, "tie_word_embeddings": True, "top_k_experts": None,
               "use_bidirectional_attention": None, "use_cache": True, "use_double_wide_mlp": False,
               "vocab_size_per_layer_input": 0})
    return {"architectures": ["Gemma4AssistantForCausalLM"], "backbone_hidden_size": btc["hidden_size"],
            "centroid_intermediate_top_k": top_k, "dtype": "bfloat16", "model_type": "gemma4_assistant",
            "num_centroids": num_centroids, "text_config": tc, "tie_word_embeddings": True,
            "use_ordered_embeddings": head == "centroid"}


def _gauss(rng, shape, std):
    return (std * rng.standard_normal(shape)).astype(np.float32)


def _backbone_weights(model, tc: dict, rng, *, logit_std: float, mlp_gain: float, attn_gain: float) -> dict:
    """mlx-lm parameter name -> values: a backbone that is mostly a random function of the token."""
    from mlx.utils import tree_flatten

    H, V = tc["hidden_size"], tc["vocab_size"]
    out = {}
    for name, p in tree_flatten(model.parameters()):
        shape, leaf = p.shape, name.rsplit(".", 1)[-1]
        owner = name.rsplit(".", 2)[-2]
        if name.endswith("model.embed_tokens.weight"):
            w = _gauss(rng, shape, logit_std / math.sqrt(H))   # x sqrt(H) at the input: unit-ish RMS x logit_std
        elif "embed_tokens_per_layer" in name:
            w = _gauss(rng, shape, 0.02)
        elif leaf in ("layer_scalar", "per_expert_scale") or (owner == "router" and leaf == "scale"):
            w = np.ones(shape, np.float32)
        elif owner == "post_attention_layernorm":
            w = np.full(shape, attn_gain, np.float32)
        elif owner == "post_per_layer_input_norm":
            w = np.full(shape, 0.3, np.float32)
        elif owner.startswith("post_feedforward_layernorm"):
            # The first 4 layers (the ones an aligned drafter copies) carry the function of the token.
            w = np.full(shape, mlp_gain if int(name.split("layers.")[1].split(".")[0]) < 4 else 1.0, np.float32)
        elif owner.endswith("norm"):
            w = (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
        else:
            w = _gauss(rng, shape, 1.0 / math.sqrt(shape[-1]))
        out[name] = w
    return out


def _cluster_embeddings(bw: dict, prefix: str, rng, num_centroids: int) -> np.ndarray:
    """Give the backbone's embedding table clusters, as a trained one has (so that a token's cluster
    is predictable from the hidden state); returns the token ordering, cluster by cluster."""
    E = bw[prefix + "embed_tokens.weight"]
    V, H = E.shape
    order = rng.permutation(V).astype(np.int32)
    centers = _gauss(rng, (num_centroids, H), float(E.std()))
    cluster = np.empty(V, np.int64)
    cluster[order] = np.arange(V) // (V // num_centroids)
    bw[prefix + "embed_tokens.weight"] = (0.6 * E + 0.8 * centers[cluster]).astype(np.float32)
    return order


def _drafter_weights(dcfg: dict, btc: dict, bw: dict, prefix: str, rng, *, aligned: bool,
                     ordering: Optional[np.ndarray] = None) -> dict:
    """Hugging Face name -> values for the drafter (bw: the backbone's, by mlx-lm name)."""
    from adapters.gemma4.drafter import expected_tensors

    shapes = expected_tensors(dcfg)
    tc = dcfg["text_config"]
    out = {}
    for name, shape in shapes.items():
        if name == "masked_embedding.token_ordering":
            out[name] = ordering if ordering is not None else rng.permutation(tc["vocab_size"]).astype(np.int32)
        elif name.endswith("layer_scalar"):
            out[name] = np.ones(shape, np.float32)
        elif name.endswith("norm.weight"):
            out[name] = (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = _gauss(rng, shape, 1.0 / math.sqrt(shape[-1]) if len(shape) == 2 else 0.02)
    if not aligned:
        return out
    H = tc["hidden_size"]
    out["model.embed_tokens.weight"] = bw[prefix + "embed_tokens.weight"].copy()
    out["model.norm.weight"] = bw[prefix + "norm.weight"].copy()
    pre = _gauss(rng, (H, 2 * H), 0.05 / math.sqrt(H))
    pre[:, :H] += np.eye(H, dtype=np.float32)          # the token's embedding passes through
    out["pre_projection.weight"] = pre
    kinds = btc["layer_types"]
    for i, kind in enumerate(tc["layer_types"]):
        # MLP and norms from backbone layer i; queries from the first backbone layer of the same kind.
        attn = next(j for j, k in enumerate(kinds) if k == kind)
        parts = [(i, p) for p in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj") + NORMS]
        parts += [(attn, p) for p in ("self_attn.q_proj", "self_attn.o_proj", "self_attn.q_norm")]
        for j, part in parts:
            want = out[f"model.layers.{i}.{part}.weight"].shape
            w = bw[f"{prefix}layers.{j}.{part}.weight"]
            out[f"model.layers.{i}.{part}.weight"] = w[tuple(slice(0, n) for n in want)].copy()
        # The drafter's own attention stays small: it cannot redo the backbone's layer-i attention.
        out[f"model.layers.{i}.post_attention_layernorm.weight"] *= 0.1
    if "masked_embedding.centroids.weight" in out:
        E, order = out["model.embed_tokens.weight"], out["masked_embedding.token_ordering"]
        C = shapes["masked_embedding.centroids.weight"][0]
        out["masked_embedding.centroids.weight"] = E[order].reshape(C, -1, H).mean(axis=1) * 4.0
    return out


def make_tiny_gemma4(out_dir: Union[str, Path], *, size: str = "small", layout: str = "hf", hidden_size: int = 64,
                     num_layers: int = 6, vocab_size: int = 512, sliding_window: int = 16, moe: bool = False,
                     head: Optional[str] = None, num_centroids: int = 16, centroid_top_k: int = 4,
                     drafter: str = "aligned", drafter_dir: Optional[Union[str, Path]] = None,
                     bits: Optional[int] = None, group_size: int = 32, logit_std: float = 3.0, mlp_gain: float = 24.0,
                     attn_gain: float = 0.5, seed: int = 0,
                     max_position_embeddings: int = 4096, template: str = "chatml", overwrite: bool = True,
                     **_ignored) -> Path:
    """Write the backbone into out_dir and the drafter into out_dir/assistant (or drafter_dir)."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    from mlx_lm.models import gemma4
    from mlx_lm.utils import get_total_parameters, quantize_model, save_config


    if size not in ("small", "large") or layout not in ("hf", "mlx") or drafter not in ("aligned", "random"):
        raise ValueError("size: small|large, layout: hf|mlx, drafter: aligned|random")
    head = head or ("centroid" if size == "small" else "full")
    out = Path(out_dir)
    if out.exists() and overwrite:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    tc = backbone_text_config(size, hidden_size=hidden_size, num_layers=num_layers, vocab_size=vocab_size,
                              sliding_window=sliding_window, moe=moe, max_position_embeddings=max_position_embeddings)
    ids = write_tokenizer(out, vocab_size, max_position_embeddings, template)
    eos = [ids[EOS_TOKEN]]
    if template == "gemma4":  # its turns end with <turn|>, as Gemma 4's do
        from tokenizers import Tokenizer

        eos.append(Tokenizer.from_file(str(out / "tokenizer.json")).token_to_id("<turn|>"))
    tc.update(eos_token_id=ids[EOS_TOKEN], pad_token_id=ids[PAD_TOKEN], bos_token_id=ids[PAD_TOKEN])
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": tc,
              "tie_word_embeddings": True, "eos_token_id": eos, "dtype": "bfloat16",
              "vocab_size": vocab_size}   # mlx-lm copies it into text_config (default 262144)
    model = gemma4.Model(gemma4.ModelArgs.from_dict(json.loads(json.dumps(config))))
    bw = _backbone_weights(model, tc, rng, logit_std=logit_std, mlp_gain=mlp_gain, attn_gain=attn_gain)
    prefix = "language_model.model."
    ordering = (_cluster_embeddings(bw, prefix, rng, num_centroids)
                if head == "centroid" and drafter == "aligned" else None)
    model.update(tree_unflatten([(k, mx.array(v)) for k, v in bw.items()]))

    dcfg = drafter_config(tc, head=head, num_centroids=num_centroids, top_k=centroid_top_k)
    dw = _drafter_weights(dcfg, tc, bw, prefix, rng, aligned=drafter == "aligned", ordering=ordering)

    if layout == "mlx" and bits:
        model, config = quantize_model(model, config, group_size, bits, mode="affine")
    from mlx.utils import tree_flatten

    weights = dict(tree_flatten(model.parameters()))
    if layout == "hf":
        weights = {("model.language_model." + k[len(prefix):]) if k.startswith(prefix) else k: v
                   for k, v in weights.items()}
        first_shared = tc["num_hidden_layers"] - tc["num_kv_shared_layers"]
        for i in range(first_shared, tc["num_hidden_layers"]):   # stored in the original, dropped by mlx-lm
            d = tc["global_head_dim"] if tc["layer_types"][i] == "full_attention" else tc["head_dim"]
            p = f"model.language_model.layers.{i}.self_attn."
            kv = tc["num_key_value_heads"] * d
            weights[p + "k_proj.weight"] = mx.array(_gauss(rng, (kv, hidden_size), 0.1))
            weights[p + "v_proj.weight"] = mx.array(_gauss(rng, (kv, hidden_size), 0.1))
            weights[p + "k_norm.weight"] = mx.ones((d,))
    save_trunk(out, weights, get_total_parameters(model), None)
    save_config(config, out / "config.json")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}, indent=2))

    ddir = Path(drafter_dir) if drafter_dir else out / "assistant"
    ddir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(ddir / "model.safetensors"), {k: mx.array(v) for k, v in dw.items()},
                        metadata={"format": "pt"})
    (ddir / "config.json").write_text(json.dumps(dcfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(out / f, ddir / f)
    return out
