#!/usr/bin/env python3
"""Write random checkpoints at real shapes for the GPU benchmarks (4-bit g64, bf16).

    python scripts/gpu/gpu_make_checkpoint.py --out /tmp/q9b            # the 9B shape
    python scripts/gpu/gpu_make_checkpoint.py --out /tmp/h1024 --shape h1024-l16
    python scripts/gpu/gpu_make_checkpoint.py --out /tmp/q35 --shape 35b-a3b        # Qwen3.6-35B-A3B, ~20 GB
    python scripts/gpu/gpu_make_checkpoint.py --out /tmp/n80 --shape next-80b-a3b   # Qwen3-Next-80B-A3B, ~45 GB

make_tiny_checkpoint draws its weights with numpy, one core: 202 s for the 9B shape on the
H200 machine, most of it in standard_normal; with those draws from mx.random but scaled in numpy,
90 s (2026-12-04: 36 GB of float32 through the host). Here the trunk's large tensors are drawn and
scaled on the default device (`mlx_draws`: the same rules, other values); everything else is
make_tiny_checkpoint's own code. The MoE shapes do not fit that path (it holds every weight in
float32 on the host: 140 GB for 35B): `build_moe` makes each weight on the device in bf16,
quantizes the trunk with mlx-lm and writes the head as a bf16 sidecar (Hugging Face names, the
MoE head kept in bf16 as recommended), layer by layer in memory.

Every shape gets the real models' context, 262,144 tokens (`max_position_embeddings` in
config.json, `model_max_length` in tokenizer_config.json; --context sets another):
make_tiny_checkpoint's default of 4,096 made the server refuse the agent stage's 20k-token
system prompt (and agent_session.py's 8,000-character sample, 4,520 tokens with this tokenizer).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401  (BLAS preload before mlx)
import mlx.core as mx  # noqa: E402

from scripts.checkpoints import make_tiny_checkpoint as mtc  # noqa: E402
from scripts.checkpoints.shards import save_trunk  # noqa: E402
from scripts.checkpoints.tokenizer_files import EOS_TOKEN, write_tokenizer  # noqa: E402

# The context of Qwen3.5-9B, Qwen3.6-35B-A3B and Qwen3-Next-80B-A3B (their max_position_embeddings).
CONTEXT = 262144
# KNOWLEDGE section 1 / 10: Qwen3.5-9B / Qwythos text config.
SHAPES = {
    "9b": dict(hidden_size=4096, num_layers=32, full_attention_interval=4, vocab_size=248320,
               num_heads=16, num_kv_heads=4, head_dim=256, intermediate_size=12288,
               linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128,
               linear_value_head_dim=128),
    # The checkpoint whose MTP lane raised NonFiniteLogitsError on the GPU (issue 14).
    "h1024-l16": dict(hidden_size=1024, num_layers=16, full_attention_interval=4, vocab_size=32768,
                      num_heads=8, num_kv_heads=2, head_dim=128, intermediate_size=3072,
                      linear_num_value_heads=16, linear_num_key_heads=8, linear_key_head_dim=64,
                      linear_value_head_dim=64),
    # The same code on a CPU in seconds (tests/test_agent_session.py serves it).
    "small": dict(hidden_size=64, num_layers=4, full_attention_interval=2, vocab_size=512, num_heads=4,
                  num_kv_heads=2, head_dim=16, intermediate_size=128, linear_num_value_heads=4,
                  linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16),
}
# The MoE families (published configs: Qwen/Qwen3.6-35B-A3B, Qwen/Qwen3-Next-80B-A3B-Instruct).
MOE_SHAPES = {
    "35b-a3b": ("qwen3_5_moe", dict(hidden_size=2048, num_layers=40, full_attention_interval=4, vocab_size=248320,
                                    num_heads=16, num_kv_heads=2, head_dim=256, linear_num_value_heads=32,
                                    linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                                    num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                                    shared_expert_intermediate_size=512, intermediate_size=512)),
    "next-80b-a3b": ("qwen3_next", dict(hidden_size=2048, num_layers=48, full_attention_interval=4, vocab_size=151936,
                                        num_heads=16, num_kv_heads=2, head_dim=256, linear_num_value_heads=32,
                                        linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                                        num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
                                        shared_expert_intermediate_size=512, intermediate_size=5120)),
    # The same code on a CPU in seconds (tests/test_gpu_wrappers.py runs it).
    "moe-small": ("qwen3_5_moe", dict(hidden_size=64, num_layers=4, full_attention_interval=2, vocab_size=512,
                                      num_heads=4, num_kv_heads=2, head_dim=16, linear_num_value_heads=4,
                                      linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=32, intermediate_size=32)),
}


def _device_init(name: str, shape, key, dtype):
    """A random value for one parameter, made on the device (make_tiny_checkpoint's rules, roughly)."""
    leaf = name.rsplit(".", 1)[-1]
    owner = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    if leaf == "A_log":
        return mx.log(mx.random.uniform(1.0, 16.0, shape, key=key))
    if leaf == "dt_bias":
        return (1.0 + 0.1 * mx.random.normal(shape, key=key)).astype(dtype)
    if owner.endswith("norm") or owner.endswith("layernorm"):
        return (1.0 + 0.05 * mx.random.normal(shape, key=key)).astype(dtype)
    if owner == "conv1d":
        return (mx.random.normal(shape, key=key) / shape[1] ** 0.5).astype(dtype)
    if len(shape) >= 2:
        gain = 0.7 if owner in ("o_proj", "out_proj", "down_proj") else 1.0
        return (mx.random.normal(shape, key=key, dtype=dtype) * (gain / shape[-1] ** 0.5)).astype(dtype)
    return (0.02 * mx.random.normal(shape, key=key)).astype(dtype)


def build_moe(out: str, shape: str, bits: int = 4, group_size: int = 64, dtype: str = "bfloat16",
              context: int = CONTEXT) -> Path:
    """A MoE-family checkpoint at a real shape: MLX layout, quantized trunk, bf16 head sidecar."""
    import contextlib
    import io
    import json
    import shutil

    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import get_total_parameters, quantize_model, save_config

    family, dims = MOE_SHAPES[shape]
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    small = mtc.make_tiny_checkpoint(out / "_small", family=family, bits=None, mtp_bits=None,
                                     **{k: v for k, v in dims.items() if k in ("num_layers", "full_attention_interval")},
                                     hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=512,
                                     num_experts=4, num_experts_per_tok=2)
    config = json.loads((small / "config.json").read_text())  # the family's keys, to be resized
    tc = config.get("text_config", config)
    keys = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads"}
    for k, v in dims.items():
        tc[keys.get(k, k)] = v
    tc["layer_types"] = ["full_attention" if (i + 1) % dims["full_attention_interval"] == 0 else "linear_attention"
                         for i in range(dims["num_layers"])]
    if family == "qwen3_5_moe":
        tc.pop("intermediate_size", None)
    for k in ("mtp_file", "mlx_lm_extra_tensors", "mtplx_mtp_quantization", "mtp_policy", "mtp_tensor_count",
              "quantization", "quantization_config", "mtp_hidden_variant", "mtp_concat_order"):
        config.pop(k, None)
    shutil.rmtree(small)
    tc["max_position_embeddings"] = context
    special = write_tokenizer(out, dims["vocab_size"], context)
    tc["eos_token_id"] = special[EOS_TOKEN]
    tdt = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}[dtype]

    model, _ = mtc._trunk_model(family, tc)
    key = mx.random.key(0)
    for name, value in tree_flatten(model.parameters()):
        key, sub = mx.random.split(key)
        v = _device_init(name, value.shape, sub, tdt)
        mx.eval(v)  # this tensor only: evaluating model.parameters() here would also make every
        model.update(tree_unflatten([(name, v)]))  # still-lazy fp32 init (140 GB at 35B)
    with contextlib.redirect_stdout(io.StringIO()):
        model, config = quantize_model(model, config, group_size, bits, mode="affine")
    mx.eval(model.parameters())
    save_trunk(out, dict(tree_flatten(model.parameters())), get_total_parameters(model), 5 << 30)
    del model

    layer = mtc._head_layer(family, tc, dims["full_attention_interval"])
    H = dims["hidden_size"]
    head = {"fc.weight": (H, 2 * H), "pre_fc_norm_embedding.weight": (H,), "pre_fc_norm_hidden.weight": (H,),
            "norm.weight": (H,), **{f"layers.0.{k}": v.shape for k, v in tree_flatten(layer.parameters())}}
    tensors = {}
    for name, shp in head.items():
        key, sub = mx.random.split(key)
        v = _device_init(name, shp, sub, mx.bfloat16)
        tensors[name] = v - 1.0 if len(shp) == 1 and "norm" in name else v  # stored zero-centred
    tensors = {"mtp." + k: v.astype(mx.bfloat16) for k, v in mtc.hf_experts(family, tensors).items()}
    (out / "optiq").mkdir()
    mx.save_safetensors(str(out / "optiq" / "mtp.safetensors"), tensors, metadata={"format": "mlx"})
    config.update(mtp_file="optiq/mtp.safetensors", mlx_lm_extra_tensors={"mtp_file": "optiq/mtp.safetensors"},
                  mtp_tensor_count=len(tensors), mtp_norm_convention="zero_centered")
    save_config(config, out / "config.json")
    return out


def build(out: str, shape: str = "9b", bits: int = 4, group_size: int = 64, dtype: str = "bfloat16",
          context: int = CONTEXT, host: bool = False) -> Path:
    return mtc.make_tiny_checkpoint(out, bits=bits, group_size=group_size, mtp_bits=bits, dtype=dtype,
                                    max_position_embeddings=context,
                                    big_draws=None if host else mtc.mlx_draws(0), **SHAPES[shape])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES) + sorted(MOE_SHAPES), default="9b")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--context", type=int, default=CONTEXT,
                    help=f"max_position_embeddings, the server's context in tokens (default {CONTEXT:,})")
    ap.add_argument("--host", action="store_true", help="draw every weight with NumPy on the host (slow; the fallback)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    if a.shape in MOE_SHAPES:
        path = build_moe(a.out, a.shape, a.bits, a.group_size, a.dtype, a.context)
    else:
        path = build(a.out, a.shape, a.bits, a.group_size, a.dtype, a.context, host=a.host)
    print(f"wrote {path} ({a.shape}, {a.bits}-bit g{a.group_size}, {a.dtype}, context {a.context:,}) "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
