"""An independent, minimal reference of the MTP head forward (KNOWLEDGE.md section 2).

Used by the generator's tests to check that a tiny checkpoint's sidecar is consistent and
that its random trunk and head agree on greedy tokens some of the time (not never, not
always). It is deliberately separate from ``adapters`` so it can cross-check the adapter.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.models import qwen3_5


def load_sidecar(ckpt: Path) -> dict:
    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    rel = (cfg.get("mlx_lm_extra_tensors") or {}).get("mtp_file") or cfg.get("mtp_file")
    cands = [rel] if rel else ["optiq/mtp.safetensors", "mtp.safetensors"]
    for c in cands:
        if (Path(ckpt) / c).exists():
            raw = mx.load(str(Path(ckpt) / c))
            return {k.removeprefix("language_model."): v for k, v in raw.items()}
    raise FileNotFoundError("no sidecar")


def dequantized_head(ckpt: Path) -> dict:
    """Float32 applied weights of the head (norms +1 when zero-centred)."""
    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    t = load_sidecar(ckpt)
    q = cfg.get("mtplx_mtp_quantization") or {}
    out = {}
    for k, v in t.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        if v.dtype == mx.uint32:
            base = k[: -len(".weight")]
            v = mx.dequantize(v, t[base + ".scales"], t[base + ".biases"],
                              group_size=q["group_size"], bits=q["bits"])
        v = v.astype(mx.float32)
        out[k] = v
    norm_keys = [k for k, v in out.items() if v.ndim == 1]
    zc = cfg.get("mtp_norm_convention")
    if zc is None:
        zc = "zero_centered" if float(mx.mean(mx.stack([mx.mean(out[k]) for k in norm_keys]))) < 0.5 else "standard"
    if zc == "zero_centered":
        for k in norm_keys:
            out[k] = out[k] + 1.0
    return out


class RefHead:
    def __init__(self, model, ckpt: Path):
        cfg = json.loads((Path(ckpt) / "config.json").read_text())
        self.cfg = cfg
        tc = cfg["text_config"]
        args = qwen3_5.TextModelArgs.from_dict(json.loads(json.dumps(tc)))
        w = dequantized_head(ckpt)
        H = args.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_e = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.pre_h = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.layer = qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)
        self.fc.weight = w["mtp.fc.weight"]
        self.pre_e.weight = w["mtp.pre_fc_norm_embedding.weight"]
        self.pre_h.weight = w["mtp.pre_fc_norm_hidden.weight"]
        self.norm.weight = w["mtp.norm.weight"]
        self.layer.update(tree_unflatten([(k[len("mtp.layers.0."):], v) for k, v in w.items()
                                          if k.startswith("mtp.layers.0.")]))
        self.model = model
        self.variant = cfg.get("mtp_hidden_variant", "pre_norm")
        self.order = cfg.get("mtp_concat_order", "embedding_hidden")

    def trunk(self, tokens: mx.array):
        """(logits, hidden) for a [1, T] token array; hidden per the checkpoint's variant."""
        inner = self.model.language_model.model
        captured = {}
        orig = inner.norm

        class Cap(nn.Module):
            def __call__(s, x):
                captured["pre"] = x
                return orig(x)

        inner.norm = Cap()
        try:
            logits = self.model(tokens)
        finally:
            inner.norm = orig
        pre = captured["pre"]
        hidden = pre if self.variant == "pre_norm" else orig(pre)
        return logits.astype(mx.float32), hidden

    def logits(self, hidden: mx.array, next_tokens: mx.array) -> mx.array:
        """MTP logits over a whole sequence at once (causal), position n predicts t[n+2]."""
        inner = self.model.language_model.model
        e = self.pre_e(inner.embed_tokens(next_tokens).astype(mx.float32))
        h = self.pre_h(hidden.astype(mx.float32))
        x = self.fc(mx.concatenate([e, h] if self.order == "embedding_hidden" else [h, e], -1))
        x = self.layer(x, mask="causal")
        g = self.norm(x)
        lm = self.model.language_model
        if lm.args.tie_word_embeddings:
            return inner.embed_tokens.as_linear(g).astype(mx.float32)
        return lm.lm_head(g).astype(mx.float32)


def greedy_agreement(model, tokenizer, ckpt: Path, prompts, n_new: int = 24) -> float:
    """Fraction of positions where argmax MTP(H[n], t[n+1]) == the trunk's greedy t[n+2]."""
    head = RefHead(model, ckpt)
    hits = total = 0
    for p in prompts:
        ids = tokenizer.encode(p)
        for _ in range(n_new):
            lg, _ = head.trunk(mx.array([ids]))
            ids.append(int(mx.argmax(lg[0, -1])))
        toks = mx.array([ids])
        _, hid = head.trunk(toks)
        ml = head.logits(hid[:, :-1], toks[:, 1:])  # position n uses H[n], t[n+1]
        pred = mx.argmax(ml[0], -1)  # predicts t[n+2]
        start = len(ids) - n_new - 2
        target = toks[0, 2:]
        sel = slice(max(start, 0), None)
        hits += int(mx.sum(pred[:-1][sel] == target[sel]))
        total += int(target[sel].size)
    return hits / total
