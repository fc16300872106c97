"""The Qwen MTP head: one full-attention decoder layer drafting token n+2 from (H[n], t[n+1]).

The same head serves Qwen3.5, Qwen3.5/3.6-MoE and Qwen3-Next (KNOWLEDGE sections 1, 2, 14):
`mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`, `mtp.norm`.
Only the layer's MLP differs: dense (`mlp.{gate,up,down}_proj`), or routed experts with a
router (`mlp.gate`), a shared expert and its gate, the experts stored either fused
(`mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj` [E, H, I]: Qwen3.5-MoE,
split at the middle here) or one tensor each (`mlp.experts.{e}.{gate,up,down}_proj.weight`:
Qwen3-Next, stacked here). Tensor names are Hugging Face's; this module maps them onto the
mlx-lm layer the head runs as (its experts as one SwitchGLU).
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from ..sidecar import base_name, params_for

NORMS = (
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.norm.weight",
    "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.post_attention_layernorm.weight",
    "mtp.layers.0.self_attn.q_norm.weight",
    "mtp.layers.0.self_attn.k_norm.weight",
)
EXPERTS = ("fused", "per_expert")  # how a family stores the head's experts


class MTPHead(nn.Module):
    def __init__(self, hidden_size: int, eps: float, layer: nn.Module, concat_order: str):
        super().__init__()
        H = hidden_size
        self.embedding_first = concat_order == "embedding_hidden"
        self.pre_fc_norm_embedding = nn.RMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(H, eps=eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = [layer]  # the trunk's full-attention layer kind: gated q, q/k norms, partial RoPE
        self.norm = nn.RMSNorm(H, eps=eps)


def num_experts(tc: dict) -> int:
    return int(tc.get("num_experts") or 0)


def head_shapes(tc: dict, experts: Optional[str] = None) -> Dict[str, Tuple[int, ...]]:
    """Expected (dequantized) shape of every tensor of a one-layer head, by Hugging Face name.
    `experts`: None (dense MLP), "fused" or "per_expert"."""
    H = tc["hidden_size"]
    n_heads = tc["num_attention_heads"]
    head_dim = tc.get("head_dim") or H // n_heads
    n_kv = tc["num_key_value_heads"]
    shapes = {name: (H,) for name in NORMS}
    shapes["mtp.layers.0.self_attn.q_norm.weight"] = (head_dim,)
    shapes["mtp.layers.0.self_attn.k_norm.weight"] = (head_dim,)
    shapes["mtp.fc.weight"] = (H, 2 * H)
    attn = "mtp.layers.0.self_attn."
    shapes[attn + "q_proj.weight"] = (2 * n_heads * head_dim, H)
    shapes[attn + "k_proj.weight"] = (n_kv * head_dim, H)
    shapes[attn + "v_proj.weight"] = (n_kv * head_dim, H)
    shapes[attn + "o_proj.weight"] = (H, n_heads * head_dim)
    mlp = "mtp.layers.0.mlp."

    def swiglu(prefix: str, inter: int):
        shapes[prefix + "gate_proj.weight"] = (inter, H)
        shapes[prefix + "up_proj.weight"] = (inter, H)
        shapes[prefix + "down_proj.weight"] = (H, inter)

    if experts is None:
        swiglu(mlp, tc["intermediate_size"])
        return shapes
    E, inter = num_experts(tc), tc["moe_intermediate_size"]
    shapes[mlp + "gate.weight"] = (E, H)
    swiglu(mlp + "shared_expert.", tc["shared_expert_intermediate_size"])
    shapes[mlp + "shared_expert_gate.weight"] = (1, H)
    if experts == "fused":
        shapes[mlp + "experts.gate_up_proj"] = (E, 2 * inter, H)
        shapes[mlp + "experts.down_proj"] = (E, H, inter)
    else:
        for e in range(E):
            swiglu(f"{mlp}experts.{e}.", inter)
    return shapes


_FUSED = re.compile(r"^(layers\.0\.mlp)\.experts\.(gate_up_proj|down_proj)(\.scales|\.biases)?$")
_ONE = re.compile(r"^(layers\.0\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|scales|biases)$")


def module_paths(name: str) -> Tuple[str, ...]:
    """The head module's path(s) for a Hugging Face head tensor (fused gate|up feeds two)."""
    rel = base_name(name)[len("mtp."):]
    m = _FUSED.match(rel) or _ONE.match(rel + ".weight")
    if m is None:
        return (rel,)
    proj = m.group(2) if m.re is _FUSED else m.group(3)
    projs = ("gate_proj", "up_proj") if proj == "gate_up_proj" else (proj,)
    return tuple(f"{m.group(1)}.switch_mlp.{p}" for p in projs)


def module_weights(tensors: Dict[str, mx.array]) -> Dict[str, mx.array]:
    """Head tensors by Hugging Face name -> the head module's parameters: fused experts split at
    the middle into gate and up, per-expert tensors stacked, everything else renamed."""
    out, stacks = {}, defaultdict(dict)
    for name, value in tensors.items():
        rel = name[len("mtp."):]
        m = _FUSED.match(rel)
        if m:
            prefix, proj, leaf = m.group(1), m.group(2), m.group(3) or ".weight"
            if proj == "gate_up_proj":
                mid = value.shape[-2] // 2
                out[f"{prefix}.switch_mlp.gate_proj{leaf}"] = value[..., :mid, :]
                out[f"{prefix}.switch_mlp.up_proj{leaf}"] = value[..., mid:, :]
            else:
                out[f"{prefix}.switch_mlp.down_proj{leaf}"] = value
            continue
        m = _ONE.match(rel)
        if m:
            stacks[f"{m.group(1)}.switch_mlp.{m.group(3)}.{m.group(4)}"][int(m.group(2))] = value
            continue
        out[rel] = value
    for key, by_expert in stacks.items():
        out[key] = mx.stack([by_expert[e] for e in sorted(by_expert)])
    return out


def build_mtp_head(head: MTPHead, tensors: Dict[str, mx.array], quantized: set, qparams: Optional[dict],
                   quant: Optional[dict], zero_centered: bool) -> MTPHead:
    """Load checked head tensors (Hugging Face names) into `head`, quantizing its modules as stored."""
    if quantized:
        wanted = {path: params_for(n, qparams, quant) for n in quantized for path in module_paths(n)}
        nn.quantize(head, class_predicate=lambda path, m: wanted.get(path, False) and {**wanted[path], "mode": "affine"})
    weights = {}
    for name, value in module_weights(tensors).items():
        if "mtp." + name in NORMS:
            # Zero-centred norms are applied as (1 + w): fold the 1 in once, in fp32.
            value = value.astype(mx.float32) + 1.0 if zero_centered else value
        weights[name] = value
    head.load_weights(list(weights.items()), strict=True)
    mx.eval(head.parameters())
    return head
