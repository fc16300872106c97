"""The Qwen3.5 MTP head: one full-attention decoder layer drafting token n+2 from (H[n], t[n+1])."""
from __future__ import annotations

from typing import Any, Dict, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

from .sidecar import NORMS


class MTPHead(nn.Module):
    def __init__(self, args: TextModelArgs, concat_order: str):
        super().__init__()
        H = args.hidden_size
        self.embedding_first = concat_order == "embedding_hidden"
        self.pre_fc_norm_embedding = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        # The trunk's full-attention layer kind: gated q, q/k norms, partial RoPE, MLP.
        self.layers = [DecoderLayer(args, layer_idx=args.full_attention_interval - 1)]
        self.norm = nn.RMSNorm(H, eps=args.rms_norm_eps)

    def __call__(self, hidden: mx.array, embedding: mx.array, cache: Optional[Any], attend=None) -> mx.array:
        """hidden, embedding: [B, T, H] -> g = norm(layer(fc(...))): [B, T, H], the input of lm_head.
        `attend(layer, x, cache)` runs the layer instead of its own call (adapters.cpu_prefill)."""
        e = self.pre_fc_norm_embedding(embedding)
        h = self.pre_fc_norm_hidden(hidden)
        x = self.fc(mx.concatenate([e, h] if self.embedding_first else [h, e], axis=-1))
        mask = create_attention_mask(x, cache)
        if attend is not None and cache is not None and mask in (None, "causal"):
            x = attend(self.layers[0], x, cache)
        else:
            x = self.layers[0](x, mask=mask, cache=cache)
        return self.norm(x)


def build_mtp_head(
    args: TextModelArgs,
    tensors: Dict[str, mx.array],
    quantized: set,
    qparams: Optional[dict],
    concat_order: str,
    zero_centered: bool,
) -> MTPHead:
    head = MTPHead(args, concat_order)
    if quantized:
        names = {q[len("mtp."):] for q in quantized}
        nn.quantize(
            head,
            group_size=qparams["group_size"],
            bits=qparams["bits"],
            class_predicate=lambda path, m: path in names and isinstance(m, nn.Linear),
        )
    weights = {}
    for name, value in tensors.items():
        if name in NORMS:
            # Zero-centred norms are applied as (1 + w): fold the 1 in once, in fp32.
            value = value.astype(mx.float32) + 1.0 if zero_centered else value
        weights[name[len("mtp."):]] = value
    head.load_weights(list(weights.items()), strict=True)
    mx.eval(head.parameters())
    return head
