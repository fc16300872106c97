"""Gemma 4's assistant drafter (`model_type: gemma4_assistant`): its tensors, its module, its step.

A separate checkpoint of a few decoder layers (4 in every published one) whose attention has
queries only: keys and values are the backbone's, read from the KV cache of its last
full-attention and last sliding-window layer. One draft step, as Hugging Face's
SinglePositionMultiTokenCandidateGenerator and mlx-vlm's gemma4_assistant run it:

    x = pre_projection(concat(backbone_embed(token) * embed_scale, h_prev))   # 2 x H_backbone -> H
    x = layers(x) over the backbone's K/V, the query at the bonus token's position
    h = model.norm(x)
    h_prev' = post_projection(h)                      # H -> H_backbone: the next step's h_prev
    logits = lm_head(h)                               # tied to model.embed_tokens, no softcap

The first h_prev is the backbone's post-final-norm hidden state of the last committed position.
The query position is the bonus token's (the cached length), as Hugging Face's generator sets
it (`input_ids.shape[1] - 1` with the bonus in input_ids); mlx-vlm 0.7.10 uses one less. The
sliding-window layer's keys are those the backbone's own mask gives a token at that position.
E2B/E4B drafters (`use_ordered_embeddings`) score only the tokens of their top-k clusters
(`masked_embedding.centroids` [2048, H] picks 32 clusters; `masked_embedding.token_ordering`
[V] lists each cluster's tokens): 32 x 128 = 4,096 of 262,144 rows of the head. The others get
a logit of NEG, so their draft probability is exactly 0 (mlx-vlm and Hugging Face fill
`min(selected) - 1`, which leaves them a small probability): the exact acceptance rule then
reaches them only through the residual, and the output follows the backbone.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma4_text

# Finite (the engine checks logits for NaN/inf), and exp(NEG / T - max) is exactly 0 in fp32.
NEG = -1e9


def text_args(config: dict) -> gemma4_text.ModelArgs:
    """mlx-lm's args for the drafter's layers: every layer reads shared K/V (no k/v projections),
    no per-layer inputs, no double-wide MLP (Gemma4AssistantConfig.validate_architecture)."""
    tc = dict(config["text_config"])
    tc["num_kv_shared_layers"] = tc["num_hidden_layers"]
    tc.setdefault("hidden_size_per_layer_input", 0)
    tc.setdefault("use_double_wide_mlp", False)
    tc.setdefault("enable_moe_block", False)
    return gemma4_text.ModelArgs.from_dict(tc)


def head_kind(config: dict) -> str:
    return "centroid" if config.get("use_ordered_embeddings") else "full"


def expected_tensors(config: dict) -> Dict[str, Tuple[int, ...]]:
    """Hugging Face tensor name -> shape, for a drafter config (what the checkpoint must hold)."""
    a = text_args(config)
    H, Hb, V = a.hidden_size, int(config["backbone_hidden_size"]), a.vocab_size
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,),
           "pre_projection.weight": (H, 2 * Hb), "post_projection.weight": (Hb, H)}
    for i, kind in enumerate(a.layer_types):
        d = a.global_head_dim if kind == "full_attention" and a.global_head_dim else a.head_dim
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (a.num_attention_heads * d, H),
                    p + "self_attn.o_proj.weight": (H, a.num_attention_heads * d),
                    p + "self_attn.q_norm.weight": (d,),
                    p + "mlp.gate_proj.weight": (a.intermediate_size, H),
                    p + "mlp.up_proj.weight": (a.intermediate_size, H),
                    p + "mlp.down_proj.weight": (H, a.intermediate_size),
                    p + "layer_scalar": (1,)})
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            out[p + norm + ".weight"] = (H,)
    if not config.get("tie_word_embeddings", True):
        out["lm_head.weight"] = (V, H)
    if head_kind(config) == "centroid":
        out["masked_embedding.centroids.weight"] = (int(config.get("num_centroids", 2048)), H)
        out["masked_embedding.token_ordering"] = (V,)
    return out


class _Inner(nn.Module):
    def __init__(self, a: gemma4_text.ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = [gemma4_text.DecoderLayer(a, layer_idx=i) for i in range(a.num_hidden_layers)]
        self.norm = nn.RMSNorm(a.hidden_size, eps=a.rms_norm_eps)


class _MaskedEmbedding(nn.Module):
    def __init__(self, num_centroids: int, hidden: int, vocab: int):
        super().__init__()
        self.centroids = nn.Linear(hidden, num_centroids, bias=False)
        self.token_ordering = mx.zeros((vocab,), dtype=mx.int32)


class Assistant(nn.Module):
    """The drafter as a module whose parameter names are the checkpoint's."""

    def __init__(self, config: dict):
        super().__init__()
        a = text_args(config)
        self.args = a
        self.backbone_hidden = int(config["backbone_hidden_size"])
        self.top_k = int(config.get("centroid_intermediate_top_k", 32))
        self.num_centroids = int(config.get("num_centroids", 2048))
        self.model = _Inner(a)
        self.pre_projection = nn.Linear(2 * self.backbone_hidden, a.hidden_size, bias=False)
        self.post_projection = nn.Linear(a.hidden_size, self.backbone_hidden, bias=False)
        if not config.get("tie_word_embeddings", True):
            self.lm_head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        if head_kind(config) == "centroid":
            self.masked_embedding = _MaskedEmbedding(self.num_centroids, a.hidden_size, a.vocab_size)

    @property
    def centroid(self) -> bool:
        return "masked_embedding" in self

    def step(self, emb: mx.array, h_prev: mx.array, kv: Dict[str, Tuple[mx.array, mx.array]],
             position: int) -> Tuple[mx.array, mx.array]:
        """emb (scaled backbone embedding of the token) and h_prev [B, 1, H_backbone], the
        backbone's K/V per layer type, the query's position -> (next h_prev [B, 1, H_backbone],
        drafter hidden [B, 1, H])."""
        x = self.pre_projection(mx.concatenate([emb, h_prev], axis=-1))
        for layer in self.model.layers:
            x, _, _ = layer(x, None, None, shared_kv=kv[layer.layer_type], offset=position)
        h = self.model.norm(x)
        return self.post_projection(h), h

    def logits(self, h: mx.array, head_t: Optional[mx.array] = None) -> mx.array:
        """h [B, 1, H] -> logits [B, V] (fp32; NEG outside the selected clusters)."""
        if not self.centroid:
            if "lm_head" in self:
                out = self.lm_head(h)
            else:
                out = h @ head_t if head_t is not None else self.model.embed_tokens.as_linear(h)
            return out[:, -1].astype(mx.float32)
        ids, sel = self.selected(h)
        B, V = h.shape[0], self.args.vocab_size
        full = mx.full((B, V), NEG, dtype=mx.float32)
        return mx.put_along_axis(full, ids, sel.astype(mx.float32), axis=-1)

    def selected(self, h: mx.array) -> Tuple[mx.array, mx.array]:
        """The tokens of the top-k clusters and their logits: ([B, k * V/C], [B, k * V/C])."""
        m = self.masked_embedding
        x = h[:, -1]                                                       # [B, H]
        scores = m.centroids(x)                                            # [B, C]
        top = mx.argpartition(-scores, self.top_k - 1, axis=-1)[:, : self.top_k]   # [B, k]
        ids = m.token_ordering.reshape(self.num_centroids, -1)[top].reshape(x.shape[0], -1)  # [B, k * V/C]
        rows = self.model.embed_tokens.weight[ids]                          # [B, k * V/C, H]
        return ids, (rows @ x[:, :, None])[..., 0]
