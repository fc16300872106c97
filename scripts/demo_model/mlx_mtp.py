"""A small, self-contained MLX implementation of the Qwythos MTP head forward.

Used by the demo-model pipeline to verify exports (and by the CPU step-cost bench)
independently of the project's adapter.  Forward (docs/checkpoint-layout.md):

    e = pre_fc_norm_embedding(embed_tokens(t[n+1]))
    h = pre_fc_norm_hidden(H[n])
    x = fc(concat([e, h], -1))
    x = layers[0](x, cache=mtp_kv)          # qwen3_5 full-attention DecoderLayer
    g = norm(x); logits = lm_head(g)        # tied embedding / lm_head
"""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3_5
from mlx_lm.models.cache import KVCache

# The norm tensor names are contract data, shared with the adapter; the forward below is independent.
import sys  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from adapters.qwen3_5.head import NORMS as MTP_NORM_KEYS  # noqa: E402  (moved there with the Qwen3.5 package)


class MTPHead(nn.Module):
    def __init__(self, args: qwen3_5.TextModelArgs):
        super().__init__()
        H = args.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.layers = [qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)]

    def __call__(self, hidden, next_tokens, embed, lm_head, cache=None):
        """hidden [B,T,H] (trunk, variant per config), next_tokens [B,T] -> (logits, g)."""
        e = self.pre_fc_norm_embedding(embed(next_tokens))
        h = self.pre_fc_norm_hidden(hidden)
        x = self.fc(mx.concatenate([e, h], axis=-1))
        mask = None
        if x.shape[1] > 1:
            from mlx_lm.models.base import create_attention_mask
            mask = create_attention_mask(x, cache)
        x = self.layers[0](x, mask=mask, cache=cache)
        g = self.norm(x)
        return lm_head(g), g

    def make_cache(self):
        return KVCache()


def load_mtp_head(model_dir, text_args: qwen3_5.TextModelArgs, dtype=mx.float32) -> MTPHead:
    """Load optiq/mtp.safetensors (29 tensors: quantized linears are dequantized)."""
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    rel = (cfg.get("mlx_lm_extra_tensors") or {}).get("mtp_file") or cfg.get("mtp_file") or "optiq/mtp.safetensors"
    w = mx.load(str(model_dir / rel))
    w = {(k[len("language_model."):] if k.startswith("language_model.") else k): v for k, v in w.items()}
    q = cfg.get("mtplx_mtp_quantization") or {}
    bits, gs = q.get("bits", 4), q.get("group_size", 64)
    out = {}
    for k, v in w.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        base = k[: -len(".weight")]
        if v.dtype == mx.uint32 and base + ".scales" in w:
            v = mx.dequantize(v, w[base + ".scales"], w[base + ".biases"], group_size=gs, bits=bits)
        out[k] = v.astype(dtype)
    zero_centered = cfg.get("mtp_norm_convention", "zero_centered") == "zero_centered"
    if zero_centered:
        for k in MTP_NORM_KEYS:
            out[k] = out[k] + 1.0
    head = MTPHead(text_args)
    head.load_weights([(k[len("mtp."):], v) for k, v in out.items()], strict=True)
    head.eval()
    mx.eval(head.parameters())
    return head
