"""The demo model in PyTorch, as training and the GPU probe both see it: the trunk (Hugging Face
`Qwen3_5ForCausalLM`, tied embeddings) and the MTP head with the Qwythos tensor names, sampling
(`generate`), teacher-forced acceptance per depth (`acceptance`), the shards it is saved in, and the
check of flash-linear-attention's kernels.

train_torch.py trains it and probe.py measures it; both import this module, neither imports the
other's model code (train_torch.py calls probe.py after training, so the model lives here to keep
that one arrow one-way). Run from this folder's sibling imports (the scripts here put the folder on
sys.path), so it imports only torch, transformers and numpy.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformers.models.qwen3_5 import modeling_qwen3_5 as M
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from windows import PAD  # <|endoftext|>, the padding of training windows and of batches

EOS = 2  # <|im_end|>


# ----------------------------------------------------------------------------------- model


class MTPHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = M.Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = M.Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        self.norm = M.Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        li = cfg.layer_types.index("full_attention")
        self.layers = nn.ModuleList([M.Qwen3_5DecoderLayer(cfg, layer_idx=li)])


class DemoModel(nn.Module):
    def __init__(self, text_config: dict, hidden_variant="post_norm", attn_impl="sdpa"):
        super().__init__()
        tc = {k: v for k, v in text_config.items() if k not in ("model_type",)}
        cfg = Qwen3_5TextConfig(**tc)
        cfg._attn_implementation = attn_impl
        self.cfg = cfg
        self.lm = M.Qwen3_5ForCausalLM(cfg)
        self.lm.lm_head.weight = self.lm.model.embed_tokens.weight  # tied
        self.mtp = MTPHead(cfg)
        self.hidden_variant = hidden_variant
        self._pre = None
        if hidden_variant == "pre_norm":
            self.lm.model.norm.register_forward_hook(self._hook)
        self._init_mtp()

    def _hook(self, mod, inp, out):
        self._pre = inp[0]

    def _init_mtp(self):
        std = self.cfg.initializer_range
        for n, p in self.mtp.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=std)
            elif "norm" in n:
                nn.init.zeros_(p)  # zero-centred: applied as 1 + w

    def trunk(self, ids):
        out = self.lm.model(input_ids=ids, use_cache=False)
        post = out.last_hidden_state
        hidden = self._pre if self.hidden_variant == "pre_norm" else post
        logits = self.lm.lm_head(post)
        return logits, hidden

    def mtp_chain(self, hidden, ids, depth):
        """q logits per depth.  hidden [B,T,H], ids [B,T].  Item i (0..N-1, N=T-1) at depth d
        reads token ids[i+d] (padded with PAD past the end) and predicts ids[i+1+d]."""
        B, T, H = hidden.shape
        N = T - 1
        dev = hidden.device
        emb = self.lm.model.embed_tokens
        ids_p = torch.cat([ids, torch.full((B, depth), PAD, dtype=ids.dtype, device=dev)], 1)
        mtp = self.mtp
        layer = mtp.layers[0]
        rot = self.lm.model.rotary_emb
        inputs = []  # per depth: fc output [B,N,H]
        outs = []
        prev_h = hidden[:, :N]
        for d in range(1, depth + 1):
            e = mtp.pre_fc_norm_embedding(emb(ids_p[:, d: d + N]))
            h = mtp.pre_fc_norm_hidden(prev_h)
            x = mtp.fc(torch.cat([e, h], -1))
            inputs.append(x)
            xs = torch.cat(inputs, 1)  # [B, d*N, H]
            pos = torch.cat([torch.arange(N, device=dev) + a for a in range(d)])[None].expand(B, -1)
            pe = rot(xs, pos[None].expand(3, -1, -1))
            # explicit mask (d == 1: plain causal), so eager/sdpa attention agree
            mask = chain_mask(N, d, dev)[None, None]
            # additive float mask: eager adds it, sdpa accepts it too
            mask = torch.zeros(mask.shape, dtype=xs.dtype, device=dev).masked_fill(~mask, float("-inf"))
            y = layer(xs, position_embeddings=pe, attention_mask=mask, position_ids=pos)
            y = y[:, (d - 1) * N:]
            g = mtp.norm(y)
            outs.append(self.lm.lm_head(g))
            prev_h = g
        return outs


_MASKS = {}


def chain_mask(N, d, dev):
    """Bool [d*N, d*N]: entry (a, i) sees (0, j<=i) and (b, i) for 1<=b<=a."""
    key = (N, d, str(dev))
    if key not in _MASKS:
        i = torch.arange(N, device=dev)
        m = torch.zeros(d * N, d * N, dtype=torch.bool, device=dev)
        causal = i[None, :] <= i[:, None]
        for a in range(d):
            m[a * N:(a + 1) * N, :N] = causal
            for b in range(1, a + 1):
                m[a * N + i, b * N + i] = True
        _MASKS[key] = m
    return _MASKS[key]


# ----------------------------------------------------------------------------------- sampling


def filter_probs(logits, temp, top_k, top_p):
    """The sampler's distribution: temperature, then top-k, then top-p (renormalised).
    temp == 0 -> one-hot argmax."""
    logits = logits.float()
    if temp <= 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / temp
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    if top_p < 1.0:
        sp, si = torch.sort(probs, dim=-1, descending=True)
        cum = sp.cumsum(-1)
        drop = (cum - sp) >= top_p
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@torch.no_grad()
def generate(model, prompts, temp, top_k=20, top_p=0.95, max_new=128, batch=128, seed=0):
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    replies = []
    for s in range(0, len(prompts), batch):
        chunk = prompts[s: s + batch]
        seqs = [list(p) for p in chunk]
        done = [False] * len(seqs)
        for _ in range(max_new):
            ids = padded(seqs, dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                logits, _ = model.trunk(ids)
            last = torch.tensor([len(x) - 1 for x in seqs], device=dev)
            lg = logits[torch.arange(len(seqs), device=dev), last]
            probs = filter_probs(lg, temp, top_k, top_p)
            nxt = torch.multinomial(probs, 1, generator=g).squeeze(-1).tolist()
            for j, t in enumerate(nxt):
                if not done[j]:
                    seqs[j].append(t)
                    if t == EOS:
                        done[j] = True
            if all(done):
                break
        replies += [x[len(p):] for x, p in zip(seqs, chunk)]
    return replies


def padded(seqs, dev):
    """Token lists as one [B, longest] batch, PAD after each (the trunk is causal: padding after
    a sequence never reaches its positions)."""
    ids = torch.full((len(seqs), max(len(x) for x in seqs)), PAD, dtype=torch.long, device=dev)
    for j, x in enumerate(seqs):
        ids[j, : len(x)] = torch.tensor(x, device=dev)
    return ids


@torch.no_grad()
def acceptance(model, prompts, replies, temp, depth=3, top_k=20, top_p=0.95, batch=64, kinds=None):
    """Per-depth mean over reply positions of sum_x min(p(x), q(x)) (teacher-forced on the
    model's own replies; depth d is conditional on the earlier drafts being accepted)."""
    dev = next(model.parameters()).device
    tot = np.zeros(depth)
    cnt = np.zeros(depth)
    per_kind = {}
    for s in range(0, len(prompts), batch):
        P, R = prompts[s: s + batch], replies[s: s + batch]
        seqs = [list(p) + list(r) for p, r in zip(P, R)]
        ids = padded(seqs, dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits, hidden = model.trunk(ids)
            qs = model.mtp_chain(hidden, ids, depth)
        for d in range(1, depth + 1):
            # item i predicts token i+1+d; p = trunk logits at i+d
            N = ids.shape[1] - 1
            q = filter_probs(qs[d - 1][:, : N - d], temp, top_k, top_p)
            p = filter_probs(logits[:, d: N], temp, top_k, top_p)
            acc = torch.minimum(p, q).sum(-1)  # [B, N-d]
            tgt = torch.arange(N - d, device=dev) + 1 + d
            for j, (pp, x) in enumerate(zip(P, seqs)):
                # count predicted tokens from the 2nd reply token on (the 1st comes from prefill)
                valid = (tgt >= len(pp) + 1) & (tgt < len(x))
                a = acc[j][valid]
                tot[d - 1] += a.sum().item()
                cnt[d - 1] += valid.sum().item()
                if kinds is not None:
                    k = kinds[s + j]
                    pk = per_kind.setdefault(k, np.zeros((2, depth)))
                    pk[0, d - 1] += a.sum().item()
                    pk[1, d - 1] += valid.sum().item()
    res = {f"d{d + 1}": round(float(tot[d] / max(cnt[d], 1)), 4) for d in range(depth)}
    res["positions"] = int(cnt[0])
    if kinds is not None:
        res["by_kind_d1"] = {k: round(float(v[0, 0] / max(v[1, 0], 1)), 3) for k, v in per_kind.items()}
    return res


def save_state(model, path_prefix, max_shard_bytes=15 * 2**20):
    from safetensors.torch import save_file

    sd = {}
    for k, v in model.state_dict().items():
        if k == "lm.lm_head.weight":
            continue
        k2 = k[len("lm."):] if k.startswith("lm.") else k
        sd[k2] = v.detach().to(torch.bfloat16).contiguous().cpu()
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        b = v.numel() * 2
        if cur and size + b > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += b
    shards.append(cur)
    files = []
    for i, s in enumerate(shards):
        fn = f"{path_prefix}-{i:02d}.safetensors"
        save_file(s, fn)
        files.append(fn)
    return files


def load_state(model, prefix):
    from safetensors.torch import load_file
    import glob

    sd = {}
    for fn in sorted(glob.glob(f"{prefix}-*.safetensors")):
        sd.update(load_file(fn))
    own = model.state_dict()
    new = {}
    for k, v in sd.items():
        k2 = k if k.startswith("mtp.") else "lm." + k
        new[k2] = v.to(own[k2].dtype)
    missing, unexpected = model.load_state_dict(new, strict=False)
    missing = [m for m in missing if m != "lm.lm_head.weight"]
    assert not missing and not unexpected, (missing, unexpected)


def fast_kernels(model, dev, log, chunk: int = 64):
    """transformers uses flash-linear-attention's Gated-DeltaNet kernels when `fla` imports (an
    order of magnitude faster than its reference loop on a GPU). Check them once against the
    reference on a short batch (forward and backward); on any error or mismatch fall back.

    The reference scans its chunks in a Python loop, a few kernels a chunk forward and back, so a
    step's launches fall with fewer, longer chunks (`chunk` positions each; transformers' 64): on
    the H200 a v3 step ran 29,518 kernels in 3.7 s of wall time for 0.59 s of kernel time."""
    ref_chunk = getattr(M.torch_chunk_gated_delta_rule, "__wrapped__", None)
    ref_rec = getattr(M.torch_recurrent_gated_delta_rule, "__wrapped__", None)
    if dev.type != "cuda" or ref_chunk is None:
        return reference_chunks(chunk, log)
    try:
        import fla  # noqa: F401 - transformers picked its kernels if this imports

        ids = torch.randint(3, model.cfg.vocab_size, (2, 256), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fast = model.trunk(ids)[0].float()
            fast.sum().backward()
            fast_kernel = M.torch_chunk_gated_delta_rule
            M.torch_chunk_gated_delta_rule = ref_chunk
            ref = model.trunk(ids)[0].float()
            M.torch_chunk_gated_delta_rule = fast_kernel
        model.zero_grad(set_to_none=True)
        err = ((fast - ref).norm() / ref.norm()).item()
        log(f"fla kernels: relative difference to the reference {err:.2e}")
        if err < 2e-2:
            return "fla"
    except Exception as e:  # noqa: BLE001 - any failure: the reference path
        log(f"fla kernels unusable ({type(e).__name__}: {e}); reference kernels")
    M.torch_chunk_gated_delta_rule = ref_chunk
    if ref_rec is not None:
        M.torch_recurrent_gated_delta_rule = ref_rec
    return reference_chunks(chunk, log)


def reference_chunks(chunk: int, log) -> str:
    """transformers' reference Gated-DeltaNet over chunks of `chunk` positions (it reads the module's
    function at each call). The same sums grouped otherwise: fp32 inside, so the loss and gradients
    move by rounding only (gradients 1e-6 apart at 256 against 64 on the v3 shape: gdn_chunks.py)."""
    ref = getattr(M.torch_chunk_gated_delta_rule, "__wrapped__", M.torch_chunk_gated_delta_rule)
    ref = getattr(ref, "func", ref)   # (a partial of an earlier call)
    if chunk != 64:
        M.torch_chunk_gated_delta_rule = functools.partial(ref, chunk_size=chunk)
        log(f"reference Gated-DeltaNet kernels over chunks of {chunk} positions")
    else:
        M.torch_chunk_gated_delta_rule = ref
    return "reference" if chunk == 64 else f"reference, chunks of {chunk}"
