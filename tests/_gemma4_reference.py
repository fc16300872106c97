"""One Gemma 4 assistant draft step in numpy, written from Hugging Face's modeling code
(Gemma4AssistantForCausalLM, SinglePositionMultiTokenCandidateGenerator), independent of the
adapter and of mlx-lm's layers: what tests compare adapters/gemma4's step against.

It reads the drafter's tensors from its checkpoint, the configs from disk, and the backbone's
cached K/V (keys roped, values v-normed, as the backbone stores them) from the layer the
configs name; it chooses that layer and the window itself.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np


def _rms(x, w=None, eps=1e-6):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w


def _rope(x, pos, base, rotated):
    """x [heads, d]: rotate_half RoPE; only the first rotated/2 frequency pairs turn
    ('proportional' RoPE on full attention, every pair on sliding layers)."""
    d = x.shape[-1]
    i = np.arange(d // 2)
    inv = np.where(i < rotated // 2, base ** (-(2.0 * i) / d), 0.0)
    ang = pos * inv
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


class ReferenceDrafter:
    def __init__(self, backbone: Path, drafter: Path):
        self.bcfg = json.loads((backbone / "config.json").read_text())
        self.btc = self.bcfg.get("text_config", self.bcfg)
        self.cfg = json.loads((drafter / "config.json").read_text())
        self.tc = self.cfg["text_config"]
        self.w = {k: np.array(v.astype(mx.float32)) if v.dtype != mx.int32 else np.array(v)
                  for f in sorted(drafter.glob("model*.safetensors")) for k, v in mx.load(str(f)).items()}

    def source_layer(self, kind: str) -> int:
        n = self.btc["num_hidden_layers"]
        first_shared = n - (self.btc.get("num_kv_shared_layers") or 0)
        return max(i for i, t in enumerate(self.btc["layer_types"][:first_shared]) if t == kind)

    def step(self, backbone_embed, cache, h_prev, token: int, position: int):
        """-> (next h_prev [Hb], logits [V] with -inf off the scored tokens)."""
        w, tc, eps = self.w, self.tc, self.tc.get("rms_norm_eps", 1e-6)
        Hb = self.cfg["backbone_hidden_size"]
        x = np.concatenate([backbone_embed[token] * np.float32(np.sqrt(Hb)), h_prev]) @ w["pre_projection.weight"].T
        for i, kind in enumerate(tc["layer_types"]):
            p = f"model.layers.{i}."
            c = cache[self.source_layer(kind)]
            L = c.offset
            start = max(0, L - self.btc["sliding_window"] + 1) if kind == "sliding_attention" else 0
            k = np.array(c.keys[0, :, start:L, :].astype(mx.float32))
            v = np.array(c.values[0, :, start:L, :].astype(mx.float32))
            d = k.shape[-1]
            rp = tc["rope_parameters"][kind]
            rotated = int(d * rp.get("partial_rotary_factor", 1.0))
            heads = tc["num_attention_heads"]
            h = _rms(x, w[p + "input_layernorm.weight"], eps)
            q = _rms((h @ w[p + "self_attn.q_proj.weight"].T).reshape(heads, d), w[p + "self_attn.q_norm.weight"], eps)
            q = _rope(q, position, rp["rope_theta"], rotated)
            group = heads // k.shape[0]
            out = np.empty((heads, d), np.float32)
            for j in range(heads):
                s = k[j // group] @ q[j]                     # scale 1.0: q_norm and k_norm carry it
                a = np.exp(s - s.max())
                out[j] = (a / a.sum()) @ v[j // group]
            x = x + _rms(out.reshape(-1) @ w[p + "self_attn.o_proj.weight"].T, w[p + "post_attention_layernorm.weight"], eps)
            h = _rms(x, w[p + "pre_feedforward_layernorm.weight"], eps)
            m = (_gelu_tanh(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
            x = (x + _rms(m, w[p + "post_feedforward_layernorm.weight"], eps)) * w[p + "layer_scalar"]
        hn = _rms(x, w["model.norm.weight"], eps)
        E = w["model.embed_tokens.weight"]
        logits = np.full(E.shape[0], -np.inf, np.float32)
        if self.cfg.get("use_ordered_embeddings"):
            C = w["masked_embedding.centroids.weight"]
            top = np.argsort(-(C @ hn))[: self.cfg["centroid_intermediate_top_k"]]
            ids = w["masked_embedding.token_ordering"].reshape(C.shape[0], -1)[top].reshape(-1)
            logits[ids] = E[ids] @ hn
        else:
            logits = E @ hn
        return hn @ w["post_projection.weight"].T, logits
