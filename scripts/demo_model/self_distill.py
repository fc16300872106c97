"""Head-only self-distillation of the MTP head on the model's OWN generations (trunk frozen,
so the shipped answers stay bit-identical).

    gen    sample replies of a trained run's trunk to the TRAINING prompts (first user turn of
           every training conversation, deduplicated), at the probe's sampler (T=0.6 / top_p
           0.95 / top_k 20) and greedily, with an incremental KV/recurrent cache (checked
           against a full forward first; falls back to full re-forward).  Also generates the
           probe's own replies to the held-out and "seen" evaluation prompts (train_torch.generate,
           same seed/batch as the probe) once, so that all head variants are scored on the
           same replies.  -> <out>/gen.npz, <out>/eval_replies.json
    train  train ONLY the MTP head on those sequences, loss on reply positions, aligned to the
           acceptance metric: per depth d
             w_kl  * KL(p' || softmax(q / tau))                  p' = trunk's sampler distribution
             w_tv  * (1 - sum_x min(p'(x), q'(x)))               q' = q through the same sampler
                                                                  filter (exactly the probe's metric)
             w_am  * CE(q, argmax p)                             (T=0 acceptance)
             w_ce  * CE(q, actual next token)
           depth 1 weight 1, depth d > 1 weight --depth-w (recursive chain of train_torch).
           Optionally mixes windows of the training corpus (--corpus-frac).  Evaluates the
           probe's acceptance (d1..d3, T=0.6 and T=0, held-out and seen) on the saved replies.

    python scripts/demo_model/self_distill.py gen --run artifacts/demo/carry/M1 --out artifacts/demo/sd
    python scripts/demo_model/self_distill.py train --run artifacts/demo/carry/M1 --gen artifacts/demo/sd \
        --name SD1 --seconds 300
"""
from __future__ import annotations

import argparse
import inspect
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from train_torch import (EOS, PAD, DemoModel, acceptance, batches, filter_probs, generate, load_state, make_optimizer,
                         run_logger, save_state, set_lr)

HERE = Path(__file__).resolve().parent
TOP_K, TOP_P = 20, 0.95


# ----------------------------------------------------------------------------------- prompts


def train_prompts(tokens: np.ndarray) -> list[list[int]]:
    """First user turn of every training conversation: <|im_start|>user\\n ... <|im_end|>\\n
    <|im_start|>assistant\\n (ids 1 288 201 ... 2 201 1 289 201), deduplicated, stream order."""
    starts = np.where(tokens == PAD)[0]
    seen, out = set(), []
    for s in starts:
        if s + 3 >= len(tokens) or tokens[s + 1] != 1 or tokens[s + 2] != 288:
            continue
        seg = tokens[s + 1: s + 120]
        for j in range(len(seg) - 2):
            if seg[j] == 1 and seg[j + 1] == 289 and seg[j + 2] == 201:
                p = tuple(int(x) for x in seg[: j + 3])
                if p not in seen:
                    seen.add(p)
                    out.append(list(p))
                break
    return out


# ----------------------------------------------------------------------------------- sampling


def sparse_sampler(logits, temp, top_k=TOP_K, top_p=TOP_P):
    """The sampler's distribution in sparse form: (probs [.., k], ids [.., k]); temperature,
    top-k, top-p (renormalised).  Same as train_torch.filter_probs up to ties."""
    v, i = logits.float().topk(top_k, dim=-1)  # sorted descending
    pr = torch.softmax(v / temp, -1)
    drop = (pr.cumsum(-1) - pr) >= top_p
    pr = pr.masked_fill(drop, 0.0)
    return pr / pr.sum(-1, keepdim=True), i


def _cache_kw(model):
    params = inspect.signature(model.lm.model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.no_grad()
def gen_cached(model, prompts, temp, max_new=128, batch=1024, seed=0, log=print, seconds=None):
    """Batched sampling with the HF cache; prompts grouped by exact length (no padding, so
    the recurrent GDN state is exact).  Returns replies (lists, ending with EOS if it came)."""
    dev = next(model.parameters()).device
    kw = _cache_kw(model)
    g = torch.Generator(device=dev).manual_seed(seed)
    by_len = {}
    for j, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(j)
    replies = [None] * len(prompts)
    t0 = time.time()
    done_n = 0
    # largest length groups first (fewest, fullest batches); with `seconds`, stop starting new
    # batches after that long (prompts left out get reply None)
    for L, idx in sorted(by_len.items(), key=lambda kv: -len(kv[1])):
        for s in range(0, len(idx), batch):
            if seconds is not None and time.time() - t0 > seconds:
                break
            ch = idx[s: s + batch]
            ids = torch.tensor([prompts[j] for j in ch], device=dev)
            B = len(ch)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                out = model.lm.model(input_ids=ids, use_cache=True, **{kw: None})
                cache = getattr(out, kw, None)
                if cache is None:
                    cache = out.get("past_key_values") or out.get("cache")
                lg = model.lm.lm_head(out.last_hidden_state[:, -1])
            toks = []
            finished = torch.zeros(B, dtype=torch.bool, device=dev)
            for t in range(max_new):
                if temp <= 0:
                    nxt = lg.float().argmax(-1)
                else:
                    pr, ii = sparse_sampler(lg, temp)
                    nxt = ii.gather(-1, torch.multinomial(pr, 1, generator=g)).squeeze(-1)
                nxt = torch.where(finished, torch.full_like(nxt, PAD), nxt)
                toks.append(nxt)
                finished |= nxt == EOS
                if bool(finished.all()) or t == max_new - 1:
                    break
                pos = torch.full((B, 1), L + t, dtype=torch.long, device=dev)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                    out = model.lm.model(input_ids=nxt[:, None], use_cache=True, position_ids=pos, **{kw: cache})
                    lg = model.lm.lm_head(out.last_hidden_state[:, -1])
            T = torch.stack(toks, 1).cpu().numpy()
            for r, j in enumerate(ch):
                row = T[r].tolist()
                if EOS in row:
                    row = row[: row.index(EOS) + 1]
                replies[j] = row
            done_n += B
        log(f"gen T={temp}: len {L} done, {done_n}/{len(prompts)} prompts, {time.time() - t0:.0f}s")
    return replies


@torch.no_grad()
def check_cache(model, prompts, log=print):
    """Greedy with the cache == greedy with full re-forward (train_torch.generate) on a few prompts."""
    by = {}
    for p in prompts:
        by.setdefault(len(p), []).append(p)
    L = max(by, key=lambda k: len(by[k]))
    ps = by[L][:8]
    a = gen_cached(model, ps, 0.0, max_new=24, log=lambda *x: None)
    b = generate(model, ps, 0.0, max_new=24)
    b = [r[: r.index(EOS) + 1] if EOS in r else r for r in b]
    same = sum(x == y for x, y in zip(a, b))
    log(f"cache check: {same}/{len(ps)} greedy replies identical")
    return same >= len(ps) - 1  # bf16 near-ties may flip one


def cmd_gen(a):
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "gen.log", "a")

    def P(*x):
        s = " ".join(str(y) for y in x)
        print("[gen]", s, flush=True)
        log.write(s + "\n")
        log.flush()

    tc = json.loads(Path(a.text_config).read_text())
    model = DemoModel(tc, "post_norm").to(dev)
    load_state(model, a.run)
    model.eval()
    tokens = np.load(Path(a.data) / "train_tokens.npy")
    prompts = train_prompts(tokens)
    if a.max_prompts:
        prompts = prompts[: a.max_prompts]
    P(f"{len(prompts)} training prompts")
    t0 = time.time()
    # 1. evaluation replies, exactly as the probe makes them
    if not a.skip_eval:
        ev = {}
        sets = [("", "eval_prompts.json"), ("seen_", "eval_prompts_seen.json")]
        for tag, fn in sets:
            e = json.loads((Path(a.data) / fn).read_text())[: a.eval_prompts]
            ps = [x["ids"] for x in e]
            for temp in (0.6, 0.0):
                ev[f"{tag}T{temp}"] = {"prompts": ps, "kinds": [x["kind"] for x in e],
                                       "replies": generate(model, ps, temp, max_new=a.eval_max_new, seed=0)}
        (out / "eval_replies.json").write_text(json.dumps(ev))
        P(f"eval replies in {time.time() - t0:.0f}s")
    ok = check_cache(model, prompts, P)
    if not ok:  # full re-forward per token is ~50x slower: a subset, sampled replies only
        prompts = prompts[: a.fallback_prompts]
        a.temps = a.temps[:1]
        P(f"cache mismatch: full re-forward on {len(prompts)} prompts, T={a.temps}")
    seqs, plens, tags = [], [], []
    for k, temp in enumerate(a.temps):
        if ok:
            secs = a.gen_seconds[k] if a.gen_seconds else None
            reps = gen_cached(model, prompts, temp, max_new=a.max_new, batch=a.gen_batch, seed=100 + k, log=P,
                              seconds=secs)
        else:
            reps = generate(model, prompts, temp, max_new=a.max_new, batch=a.gen_batch, seed=100 + k)
            reps = [r[: r.index(EOS) + 1] if EOS in r else r for r in reps]
        for p, r in zip(prompts, reps):
            if r is None:
                r = []  # not generated (time limit): an empty reply has no loss positions
            seqs.append(np.array(p + r, dtype=np.uint16))
            plens.append(len(p))
            tags.append(k)
        P(f"T={temp}: {sum(r is not None for r in reps)} replies, mean {np.mean([len(r) for r in reps if r is not None]):.1f} tokens, {time.time() - t0:.0f}s")
        lens = np.array([len(s) for s in seqs])
        np.savez_compressed(out / "gen.npz", tokens=np.concatenate(seqs), lens=lens, plens=np.array(plens), tags=np.array(tags),
                 temps=np.array(a.temps[: k + 1]))
    P("done", time.time() - t0)


# ----------------------------------------------------------------------------------- training


class GenData:
    def __init__(self, path, rng, temps_keep=None, val_prompts=2000):
        z = dict(np.load(Path(path) / "gen.npz"))  # decompress each array once
        off = np.concatenate([[0], np.cumsum(z["lens"])])
        toks = z["tokens"].astype(np.int64)
        self.seqs = [toks[off[i]: off[i + 1]] for i in range(len(z["lens"]))]
        self.plens = z["plens"]
        keep = np.arange(len(self.seqs))
        # validation: the replies to the last `val` distinct training prompts (for choosing
        # between variants without looking at the evaluation prompts)
        n_prompts = int((z["tags"] == 0).sum())
        pid = keep % n_prompts
        val = pid >= n_prompts - val_prompts
        self.val = {int(t): keep[val & (z["tags"] == t)] for t in np.unique(z["tags"])}
        self.temps = [float(x) for x in z["temps"]]
        keep = keep[~val & (z["lens"] > self.plens + 1)]
        self.val = {t: v[z["lens"][v] > self.plens[v] + 1] for t, v in self.val.items()}
        if temps_keep is not None:
            keep = keep[np.isin(z["tags"][keep], temps_keep)]
        self.idx = keep
        self.rng = rng

    def batch(self, n, dev, pick=None):
        if pick is None:
            pick = self.rng.choice(self.idx, n, replace=False)
        n = len(pick)
        L = max(len(self.seqs[j]) for j in pick)
        ids = torch.full((n, L), PAD, dtype=torch.long)
        lens = torch.zeros(n, dtype=torch.long)
        pl = torch.zeros(n, dtype=torch.long)
        for r, j in enumerate(pick):
            s = self.seqs[j]
            ids[r, : len(s)] = torch.from_numpy(s)
            lens[r] = len(s)
            pl[r] = self.plens[j]
        return ids.to(dev), lens.to(dev), pl.to(dev)


def head_loss(q, p, tgt, a):
    """q, p: [n, V] logits (head, trunk); tgt [n] actual next tokens.  Returns (loss, stats)."""
    q = q.float()
    st = {}
    loss = q.new_zeros(())
    tau = a.tau
    with torch.no_grad():
        pp, pi = sparse_sampler(p, tau, a.top_k, a.top_p)
    if p.requires_grad:  # --p-grad: the trunk's own filtered distribution moves too
        v = (p.float().gather(-1, pi) / tau).masked_fill(pp == 0, float("-inf"))
        pp = torch.softmax(v, -1)
    if a.w_kl:
        if a.kl_full:  # full-vocabulary KL at temperature tau (no filter on p)
            lp = torch.log_softmax(p.float() / tau, -1)
            lq = torch.log_softmax(q / tau, -1)
            kl = (lp.exp() * (lp - lq)).sum(-1).mean()
        else:
            lq = torch.log_softmax(q / tau, -1).gather(-1, pi)
            kl = (pp * (torch.log(pp.clamp_min(1e-12)) - lq)).sum(-1).mean()
        loss = loss + a.w_kl * kl
        st["kl"] = kl.detach()
    # exact metric: q through the same filter, sum_x min(p'(x), q'(x))
    vq, qi = q.topk(a.top_k, -1)
    with torch.no_grad():
        sm = torch.softmax(vq / tau, -1)
        keep = (sm.cumsum(-1) - sm) < a.top_p
    qq = torch.softmax((vq / tau).masked_fill(~keep, float("-inf")), -1)
    match = (pi[:, :, None] == qi[:, None, :]).float()
    q_at_p = (match * qq[:, None, :]).sum(-1)
    acc = torch.minimum(pp, q_at_p).sum(-1)
    st["acc"] = acc.mean().detach()
    if a.w_tv:
        loss = loss + a.w_tv * (1 - acc).mean()
    am = p.float().argmax(-1)
    st["acc0"] = (q.argmax(-1) == am).float().mean().detach()
    if a.w_am:
        loss = loss + a.w_am * F.cross_entropy(q, am)
    if a.w_ce:
        ce = F.cross_entropy(q, tgt)
        loss = loss + a.w_ce * ce
        st["ce"] = ce.detach()
    return loss, st


def target_mask(N, d, valid_from, lens):
    """[B, N - d]: which targets t[1 + d : N + 1] of a batch count (index >= valid_from, < lens)."""
    tgt_pos = torch.arange(N - d, device=lens.device) + 1 + d
    return (tgt_pos[None] >= valid_from[:, None]) & (tgt_pos[None] < lens[:, None])


def step_loss(model, ids, valid_from, lens, a, teacher=None):
    """valid_from [B]: first target index counted (prompt length + 1, as in the probe);
    lens [B]: sequence lengths.  Corpus windows: valid_from = 1, lens = T.

    With a trainable trunk (--trunk-lr > 0) the head's loss also reaches the trunk through
    its hidden state (as in joint MTP training), through p itself with --p-grad, and the
    trunk is held near the `teacher` (the starting trunk) by KL(teacher || trunk) on every
    reply position, weight --w-anchor."""
    cast = dict(device_type=ids.device.type, dtype=torch.bfloat16, enabled=ids.device.type == "cuda")
    train_trunk = teacher is not None
    with torch.set_grad_enabled(train_trunk), torch.autocast(**cast):
        logits, hidden = model.trunk(ids)
    with torch.autocast(**cast):
        qs = model.mtp_chain(hidden if train_trunk else hidden.detach(), ids, a.depth)
    B, T = ids.shape
    N = T - 1
    total = 0.0
    stats = {}
    if train_trunk:
        with torch.no_grad(), torch.autocast(**cast):
            p0 = teacher.trunk(ids)[0]
        valid = target_mask(N, 0, valid_from, lens)
        lp0 = torch.log_softmax(p0[:, :N][valid].float(), -1)
        anchor = (lp0.exp() * (lp0 - torch.log_softmax(logits[:, :N][valid].float(), -1))).sum(-1).mean()
        total = total + a.w_anchor * anchor
        stats["anchor"] = anchor.detach()
    if not (train_trunk and a.p_grad):
        logits = logits.detach()
    for d in range(1, a.depth + 1):
        valid = target_mask(N, d, valid_from, lens)
        q = qs[d - 1][:, : N - d][valid]
        p = logits[:, d:N][valid]
        tgt = ids[:, 1 + d:][valid]
        l, st = head_loss(q, p, tgt, a)
        w = 1.0 if d == 1 else a.depth_w
        total = total + w * l
        for k, v in st.items():
            stats[f"{k}{d}"] = v
    return total, stats


@torch.no_grad()
def val_acceptance(model, data, a, bs=256):
    """Acceptance on held-back training prompts: d1/d2 at T=0.6 on the T=0.6 replies, and the
    argmax agreement (T=0 acceptance) on the greedy replies; the numbers used to choose."""
    dev = next(model.parameters()).device
    res = {}
    for tag, idx in data.val.items():
        temp = data.temps[tag]
        tot, cnt = np.zeros(a.depth), np.zeros(a.depth)
        for s in range(0, len(idx), bs):
            ids, lens, pl = data.batch(0, dev, idx[s: s + bs])
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                logits, hidden = model.trunk(ids)
                qs = model.mtp_chain(hidden, ids, a.depth)
            N = ids.shape[1] - 1
            for d in range(1, a.depth + 1):
                valid = target_mask(N, d, pl + 1, lens)
                q = filter_probs(qs[d - 1][:, : N - d][valid], temp, TOP_K, TOP_P)
                p = filter_probs(logits[:, d:N][valid], temp, TOP_K, TOP_P)
                tot[d - 1] += torch.minimum(p, q).sum(-1).sum().item()
                cnt[d - 1] += int(valid.sum())
        res[f"T{temp}"] = {f"d{d + 1}": round(float(tot[d] / max(cnt[d], 1)), 4) for d in range(a.depth)}
    return res


def evaluate(model, ev, depth=3, tags=("", "seen_")):
    res = {}
    for tag in tags:
        for temp in (0.6, 0.0):
            e = ev.get(f"{tag}T{temp}")
            if e is None:
                continue
            res[f"{tag}accept_T{temp}"] = acceptance(model, e["prompts"], e["replies"], temp, depth=depth,
                                                     kinds=e["kinds"])
    return res


def cmd_train(a):
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    P = run_logger(out, a.name)

    tc = json.loads(Path(a.text_config).read_text())
    model = DemoModel(tc, "post_norm").to(dev)
    load_state(model, a.run)
    if a.resume:
        load_state(model, a.resume)
    if a.resume_head:
        load_head(model, a.resume_head)
    teacher = None
    if a.trunk_lr > 0:  # a frozen trunk anchors the trained one: the starting one, or --teacher
        teacher = DemoModel(tc, "post_norm").to(dev)
        if a.teacher:
            load_state(teacher, a.teacher)
        else:
            teacher.load_state_dict(model.state_dict())
        teacher.eval().requires_grad_(False)
    else:
        for p in model.lm.parameters():
            p.requires_grad_(False)
    model.eval()  # no dropout anywhere
    P("args", vars(a))
    ev = json.loads((Path(a.gen) / "eval_replies.json").read_text())
    res = {"name": a.name, "args": vars(a)}
    if a.eval_init:
        res["init"] = evaluate(model, ev)
        P("init", json.dumps(res["init"]))
    rng = np.random.default_rng(a.seed)
    data = GenData(a.gen, rng, a.use_tags, a.val_prompts)
    if a.eval_init:
        res["init_val"] = val_acceptance(model, data, a)
        P("init_val", json.dumps(res["init_val"]))
    tokens = np.load(Path(a.data) / "train_tokens.npy") if a.corpus_frac > 0 else None
    cit = batches(tokens, a.corpus_batch, a.corpus_seq, rng) if tokens is not None else None
    params = list(model.mtp.parameters())
    opt = make_optimizer(params, a, dev)
    if teacher is not None:
        trunk_params = list(model.lm.parameters())
        opt.add_param_group({"params": trunk_params, "weight_decay": 0.0, "lr_scale": a.trunk_lr / a.lr})
        params = params + trunk_params
    t0 = time.time()
    step = 0
    while True:
        el = time.time() - t0
        if el > a.seconds or step >= a.max_steps:
            break
        lr = set_lr(opt, a, step, el)
        opt.zero_grad(set_to_none=True)
        ids, lens, pl = data.batch(a.batch, dev)
        loss, st = step_loss(model, ids, pl + 1, lens, a, teacher)
        if cit is not None and rng.random() < a.corpus_frac:
            cids = next(cit).to(dev)
            B, T = cids.shape
            l2, st2 = step_loss(model, cids, torch.ones(B, dtype=torch.long, device=dev),
                                torch.full((B,), T, dtype=torch.long, device=dev), a, teacher)
            loss = loss + l2
            st.update({f"c_{k}": v for k, v in st2.items()})
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 200 == 0 or step == 1:
            P(f"step {step} t={el:.0f}s lr={lr:.2e} loss={loss.item():.4f} " +
              " ".join(f"{k}={v.item():.3f}" for k, v in st.items()))
    P(f"trained {step} steps in {time.time() - t0:.0f}s")
    files = save_state(model, str(out / a.name))
    P("saved", files)
    from safetensors.torch import save_file

    save_file({"mtp." + k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.mtp.state_dict().items()},
              str(out / f"{a.name}.head.safetensors"))
    res["steps"] = step
    res["val"] = val_acceptance(model, data, a)
    P("val", json.dumps(res["val"]))
    res["final"] = evaluate(model, ev)
    for k, v in res["final"].items():
        P(k, json.dumps({x: y for x, y in v.items() if x != "by_kind_d1"}), json.dumps(v.get("by_kind_d1")))
    (out / f"{a.name}.json").write_text(json.dumps(res))
    P("done")


def load_head(model, fn):
    from safetensors.torch import load_file

    sd = {k[len("mtp."):]: v.float() for k, v in load_file(fn).items()}
    model.mtp.load_state_dict(sd, strict=True)


def cmd_merge(a):
    """Full training shards = trunk (and nothing else) of --run + the head file (for export)."""
    tc = json.loads(Path(a.text_config).read_text())
    m = DemoModel(tc, "post_norm")
    load_state(m, a.run)
    load_head(m, a.head)
    print("saved", save_state(m, a.out))


@torch.no_grad()
def cmd_loss(a):
    """Held-out answer loss (mean next-token CE of the trunk on the reference answers of the
    held-out conversations), as scripts/demo_model/measure_cpu.py computes it."""
    from tokenizers import Tokenizer

    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tok = Tokenizer.from_file(str(Path(a.tokenizer) / "tokenizer.json"))
    refs = [json.loads(l) for l in open(Path(a.corpus) / "eval_prompts.jsonl")]
    refs = [r for r in refs if r["reference"]]
    out = {}
    for spec in a.runs:
        run, _, cfg = spec.partition(":")
        tc = json.loads(Path(cfg or a.text_config).read_text())
        m = DemoModel(tc, "post_norm").to(dev)
        load_state(m, run)
        m = m.float().eval()
        tot, n = 0.0, 0
        for r in refs:
            pi = tok.encode(f"<|im_start|>user\n{r['prompt']}<|im_end|>\n<|im_start|>assistant\n").ids
            ai = tok.encode(r["reference"] + "<|im_end|>").ids
            ids = torch.tensor([pi + ai], device=dev)
            logits, _ = m.trunk(ids)
            tot += F.cross_entropy(logits[0, len(pi) - 1: -1].float(), ids[0, len(pi):], reduction="sum").item()
            n += len(ai)
        out[run] = round(tot / n, 4)
        print("heldout_loss", run, out[run], flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("gen", "train"):
        s = sub.add_parser(name)
        s.add_argument("--run", required=True, help="prefix of the trained shards (trunk + head)")
        s.add_argument("--text-config", default=str(HERE / "configs" / "h256_L12_i2.json"))
        s.add_argument("--data", default="artifacts/demo/data")
        s.add_argument("--device", default=None)
        s.add_argument("--seed", type=int, default=0)
    g = sub.choices["gen"]
    g.add_argument("--out", default="artifacts/demo/sd")
    g.add_argument("--temps", type=float, nargs="+", default=[0.6, 0.0])
    g.add_argument("--max-new", type=int, default=128)
    g.add_argument("--gen-batch", type=int, default=2048)
    g.add_argument("--max-prompts", type=int, default=0)
    g.add_argument("--fallback-prompts", type=int, default=8000)
    g.add_argument("--gen-seconds", type=float, nargs="*", default=None, help="time limit per temperature")
    g.add_argument("--eval-prompts", type=int, default=400)
    g.add_argument("--skip-eval", action="store_true")
    g.add_argument("--eval-max-new", type=int, default=128)
    t = sub.choices["train"]
    t.add_argument("--gen", default="artifacts/demo/sd", help="folder with gen.npz and eval_replies.json")
    t.add_argument("--out", default="artifacts/demo/sd")
    t.add_argument("--name", default="SD")
    t.add_argument("--resume", default=None, help="shards to start the head from (default: --run's head)")
    t.add_argument("--resume-head", default=None, help="<name>.head.safetensors to start the head from")
    t.add_argument("--seconds", type=float, default=300)
    t.add_argument("--max-steps", type=int, default=10**9)
    t.add_argument("--batch", type=int, default=256, help="sequences per step")
    t.add_argument("--lr", type=float, default=5e-4)
    t.add_argument("--min-lr-frac", type=float, default=0.05)
    t.add_argument("--warmup", type=int, default=50)
    t.add_argument("--wd", type=float, default=0.0)
    t.add_argument("--depth", type=int, default=2)
    t.add_argument("--depth-w", type=float, default=0.3)
    t.add_argument("--tau", type=float, default=0.6)
    t.add_argument("--top-k", type=int, default=TOP_K)
    t.add_argument("--top-p", type=float, default=TOP_P)
    t.add_argument("--w-kl", type=float, default=1.0)
    t.add_argument("--kl-full", action="store_true", help="KL over the full vocabulary (p unfiltered) at tau")
    t.add_argument("--w-tv", type=float, default=1.0)
    t.add_argument("--w-am", type=float, default=0.1)
    t.add_argument("--w-ce", type=float, default=0.1)
    t.add_argument("--use-tags", type=int, nargs="*", default=None, help="which gen temperatures (indices) to use")
    t.add_argument("--corpus-frac", type=float, default=0.0, help="probability of adding a corpus batch per step")
    t.add_argument("--corpus-batch", type=int, default=32)
    t.add_argument("--corpus-seq", type=int, default=256)
    t.add_argument("--trunk-lr", type=float, default=0.0, help="> 0: train the trunk too, at this peak lr")
    t.add_argument("--p-grad", action="store_true", help="with --trunk-lr: the head's loss moves p as well")
    t.add_argument("--w-anchor", type=float, default=1.0, help="KL(starting trunk || trunk) weight")
    t.add_argument("--teacher", default=None, help="shards of the anchoring trunk (default: the starting one)")
    t.add_argument("--eval-init", action="store_true")
    t.add_argument("--val-prompts", type=int, default=2000, help="training prompts held back for choosing")
    lo = sub.add_parser("loss")
    lo.add_argument("--runs", nargs="+", required=True, help="PREFIX[:TEXT_CONFIG] ...")
    lo.add_argument("--text-config", default=str(HERE / "configs" / "h256_L12_i2.json"))
    lo.add_argument("--corpus", default="artifacts/demo/corpus")
    lo.add_argument("--tokenizer", default="artifacts/demo/tokenizer")
    lo.add_argument("--device", default=None)
    lo.add_argument("--json", default=None)
    me = sub.add_parser("merge")
    me.add_argument("--run", required=True, help="trunk shards prefix")
    me.add_argument("--head", required=True, help="<name>.head.safetensors")
    me.add_argument("--out", required=True, help="output shards prefix")
    me.add_argument("--text-config", default=str(HERE / "configs" / "h256_L12_i2.json"))
    a = ap.parse_args()
    {"gen": cmd_gen, "train": cmd_train, "loss": cmd_loss, "merge": cmd_merge}[a.cmd](a)


if __name__ == "__main__":
    main()
