"""Stage 'train': PyTorch training of the demo trunk + MTP head (GPU, or slowly on CPU).

The model (model_torch.py): the trunk is Hugging Face `Qwen3_5ForCausalLM` (tied embeddings).  The MTP head uses the
Qwythos tensor names (mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm,
mtp.layers.0 = a full-attention Qwen3_5DecoderLayer) and HF's zero-centred RMSNorm (1 + w),
so the stored norms are zero-centred exactly like Qwythos' sidecar.

Data: whole documents (conversations, prose) packed into windows of --seq tokens (4,096; v1's
512-token windows left its head right 0.65-0.69 of the time at 2-3.5k tokens of context, against
0.92 at 64), each token weighted 1 when the model writes it (replies, prose) and --other-w
elsewhere (prompts, system turns, tool results).

Losses (per batch):
  main   CE(trunk logits[t], x[t+1])
  mtp d  CE(q_d[t], x[t+1+d]), depth d = 1..K, head applied recursively: depth 1 reads the
         trunk hidden at t and embed(x[t+1]); depth d>1 reads g = norm(x) of depth d-1 and
         embed(x[t+d]), and its attention sees the depth-1 entries at positions <= t (the
         trunk-filled MTP cache at inference) plus its own chain -- exactly the inference cache.
  distill KL(p_trunk || q_d) (p detached), half of each MTP term.
  accept 1 - sum_x min(p', q') through the sampler's filter, differentiable in p and q, on the
         written tokens, from --accept-start of the schedule (ramped to --accept-w): the trunk
         learns to say what its head can foresee, held by the data's own CE in the same step.
         Measured (models/demo/README.md): 0.4 from half-way lifts everyday acceptance; 1.5 on a
         weak trunk collapses it onto one reply whatever the question.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# The model, its shards and its kernels live in model_torch.py, which probe.py imports too: this
# file calls probe.py after training, so probe.py must not need anything from here.
from model_torch import DemoModel, fast_kernels, load_state, save_state
from windows import loss_weights, packed_windows

# ----------------------------------------------------------------------------------- training


def weighted_mean(x, w):
    return (x * w).sum() / w.sum().clamp_min(1e-6)


def accept_term(p_logits, q_logits, tau=0.6, top_k=20, top_p=0.95):
    """1 - sum_x min(p'(x), q'(x)) per position, p' and q' through the sampler's filter (T=0.6,
    top_k 20, top_p 0.95): one minus the acceptance itself. Differentiable in both p and q: with
    it the trunk learns to say what its head can foresee (v1's co-training, here from the start
    of training, held by the data's own cross-entropy instead of a KL anchor to an older trunk)."""
    vp, pi = p_logits.float().topk(top_k, -1)
    vq, qi = q_logits.float().topk(top_k, -1)
    with torch.no_grad():
        keep_p = (torch.softmax(vp / tau, -1).cumsum(-1) - torch.softmax(vp / tau, -1)) < top_p
        keep_q = (torch.softmax(vq / tau, -1).cumsum(-1) - torch.softmax(vq / tau, -1)) < top_p
    pp = torch.softmax((vp / tau).masked_fill(~keep_p, float("-inf")), -1)
    qq = torch.softmax((vq / tau).masked_fill(~keep_q, float("-inf")), -1)
    q_at_p = ((pi[..., :, None] == qi[..., None, :]).float() * qq[..., None, :]).sum(-1)
    return 1 - torch.minimum(pp, q_at_p).sum(-1)


def losses(model, ids, depth, mtp_w, distill, depth_w, distill_temp=1.0, weights=None, reply=None, accept_w=0.0):
    """weights [B, T] (None: all 1): the loss weight of predicting each token; reply [B, T] bool:
    the tokens the model writes (where the acceptance term applies)."""
    logits, hidden = model.trunk(ids)
    V = logits.shape[-1]
    w = torch.ones_like(ids, dtype=torch.float32) if weights is None else weights.float()
    main = weighted_mean(F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), ids[:, 1:].reshape(-1),
                                         reduction="none"), w[:, 1:].reshape(-1))
    qs = model.mtp_chain(hidden, ids, depth)
    T = ids.shape[1]
    N = T - 1
    out = {"main": main}
    total = main
    for d in range(1, depth + 1):
        q = qs[d - 1][:, : N - d].float()  # predicts ids[i+1+d]
        tgt = ids[:, 1 + d:]
        wd = w[:, 1 + d:].reshape(-1)
        ce = weighted_mean(F.cross_entropy(q.reshape(-1, V), tgt.reshape(-1), reduction="none"), wd)
        lt = ce
        if distill > 0:
            p = logits[:, d:N].detach().float()
            kl = F.kl_div(F.log_softmax(q / distill_temp, -1), F.log_softmax(p / distill_temp, -1), log_target=True,
                          reduction="none").sum(-1)
            kl = weighted_mean(kl.reshape(-1), wd)
            lt = (1 - distill) * ce + distill * kl
            out[f"kl{d}"] = kl
        wt = mtp_w if d == 1 else mtp_w * depth_w
        total = total + wt * lt
        out[f"mtp{d}"] = ce
        if accept_w > 0:  # on what the model writes only (weight > the context's)
            sel = reply[:, 1 + d:].reshape(-1)
            acc = accept_term(logits[:, d:N].reshape(-1, V)[sel], q.reshape(-1, V)[sel]).mean()
            total = total + accept_w * (1.0 if d == 1 else depth_w) * acc
            out[f"rej{d}"] = acc
    out["total"] = total
    return out


def run_logger(out: Path, name: str):
    """print(...) that also appends to <out>/<name>.log."""
    log = open(out / f"{name}.log", "a")

    def P(*x):
        s = " ".join(str(y) for y in x)
        print(f"[{name}] {s}", flush=True)
        log.write(s + "\n")
        log.flush()

    return P


def make_optimizer(params, a, dev):
    """AdamW (0.9, 0.95), weight decay on matrices only."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=a.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")


def progress(a, step: int, elapsed: float) -> float:
    """How far training is through its schedule: by steps (--schedule-steps, else --max-steps) or,
    with neither, by the time budget."""
    total = getattr(a, "schedule_steps", 0) or (a.max_steps if a.max_steps < 10**9 else 0)
    return min(1.0, step / total) if total else min(1.0, elapsed / a.seconds)


def set_lr(opt, a, step: int, elapsed: float) -> float:
    """Linear warm-up, then cosine to min_lr_frac over the step budget, or the time budget."""
    frac = progress(a, step, elapsed)
    lr = a.lr * min(1.0, (step + 1) / a.warmup) * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    return lr


def accept_weight(a, frac: float) -> float:
    """The acceptance term's weight: 0 until --accept-start of training, then a linear ramp over
    --accept-ramp to --accept-w (the head must be worth following before the trunk follows it)."""
    if a.accept_w <= 0:
        return 0.0
    return a.accept_w * min(1.0, max(0.0, (frac - a.accept_start) / max(a.accept_ramp, 1e-9)))


def profiled(step: int, at: int):
    """A torch profiler around training step `at` (0: none). Why: a step of the demo took ~0.75 s on
    the H200 where its matrix work is ~0.04 s; this says which kernels and how many take the rest."""
    if not at or step != at:
        return None
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(activities=acts)


def report_profile(prof, seconds: float, P) -> None:
    """The profiled step's wall time, its kernels' count and summed device time, the top ops by it."""
    from torch.autograd import DeviceType

    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    P(f"profile: step {seconds * 1e3:.0f} ms wall, {len(kernels)} kernels, {busy_ms:.0f} ms of kernel time")
    device_us = lambda e: e.self_device_time_total  # noqa: E731
    for e in sorted(prof.key_averages(), key=device_us, reverse=True)[:12]:
        P(f"profile: {device_us(e) / 1e3:8.1f} ms device  {e.count:6d} calls  {e.key[:80]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="artifacts/demo/data")
    ap.add_argument("--out", default="artifacts/demo/run")
    ap.add_argument("--name", default="run")
    ap.add_argument("--text-config", required=True, help="JSON file with the text_config")
    ap.add_argument("--variant", default="post_norm", choices=["post_norm", "pre_norm"])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--max-steps", type=int, default=10**9)
    ap.add_argument("--schedule-steps", type=int, default=0,
                    help="length of the lr / acceptance-term schedule in steps (default --max-steps)")
    ap.add_argument("--batch", type=int, default=16, help="windows per step")
    ap.add_argument("--micro-batch", type=int, default=0, help="split each batch (gradient accumulation; 0 = no)")
    ap.add_argument("--profile-step", type=int, default=0, help="profile this training step and log its kernels (0 = no)")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--gdn-chunk", type=int, default=64,
                    help="positions a chunk of the reference Gated-DeltaNet scan (fewer, longer chunks: fewer launches)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.05)
    ap.add_argument("--depth", type=int, default=2, help="MTP depths trained (1 = plain MTP)")
    ap.add_argument("--mtp-w", type=float, default=1.0)
    ap.add_argument("--depth-w", type=float, default=0.5, help="weight of depth>1 relative to depth 1")
    ap.add_argument("--distill", type=float, default=0.5, help="fraction of the MTP loss that is KL to the trunk")
    ap.add_argument("--distill-temp", type=float, default=1.0)
    ap.add_argument("--other-w", type=float, default=0.3,
                    help="loss weight of the tokens the model does not write (prompts, tool results)")
    ap.add_argument("--accept-w", type=float, default=0.0, help="weight of the acceptance term (reaches the trunk)")
    ap.add_argument("--accept-start", type=float, default=0.4)
    ap.add_argument("--accept-ramp", type=float, default=0.3)
    ap.add_argument("--resume", default=None, help="prefix of saved shards to start from")
    ap.add_argument("--probe", action="store_true", help="run probe.py on the trained model")
    ap.add_argument("--quick-probe", action="store_true", help="the probe without the context and tool parts")
    ap.add_argument("--stop-at", type=float, default=None,
                    help="wall-clock time (time.time()) by which training stops whatever --seconds says (a GPU call's limit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--head-only", action="store_true",
                    help="train the MTP head alone, the trunk frozen: what the model says stays bit for bit, "
                         "only its drafts change")
    ap.add_argument("--cpu-bf16", action="store_true",
                    help="bf16 autocast on the CPU too (about 1.3x faster on a CPU with AVX-512 BF16)")
    a = ap.parse_args()

    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tc = json.loads(Path(a.text_config).read_text())
    model = DemoModel(tc, a.variant).to(dev)
    if a.resume:
        load_state(model, a.resume)
    n_par = sum(p.numel() for p in model.parameters())
    P = run_logger(out, a.name)
    P("params", n_par, "device", dev, vars(a))
    kernels = fast_kernels(model, dev, P, a.gdn_chunk)
    rng = np.random.default_rng(a.seed)
    if a.head_only:  # the tied embedding is the trunk's: the head's lm_head stays frozen with it
        model.lm.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, a, dev)
    it = ((torch.from_numpy(ids), torch.from_numpy(w), ep) for ids, w, ep in packed_windows(a.data, a.batch, a.seq, rng))
    weight_of = torch.tensor(loss_weights(a.other_w), device=dev)
    t0 = time.time()
    step = seen = 0
    model.train()
    while True:
        el = time.time() - t0
        if el > a.seconds or step >= a.max_steps or (a.stop_at and time.time() > a.stop_at):
            break
        lr = set_lr(opt, a, step, el)
        aw = accept_weight(a, progress(a, step, el))
        ids, w, epoch = next(it)
        ids, w = ids.to(dev, non_blocking=True), w.to(dev, non_blocking=True).long()
        prof, t_step = profiled(step, a.profile_step), time.time()
        if prof is not None:
            prof.__enter__()
        opt.zero_grad(set_to_none=True)
        for mb, mw in zip(ids.split(a.micro_batch or a.batch), w.split(a.micro_batch or a.batch)):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda" or a.cpu_bf16):
                L = losses(model, mb, a.depth, a.mtp_w, a.distill, a.depth_w, a.distill_temp,
                           weights=weight_of[mw], reply=mw == 2, accept_w=aw)
            (L["total"] * mb.shape[0] / ids.shape[0]).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if prof is not None:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            report_profile(prof, time.time() - t_step, P)
        step += 1
        seen += ids.numel()
        if step % 50 == 0 or step == 1:
            P(f"step {step} ep {epoch} t={el:.0f}s tok={seen / 1e6:.1f}M tok/s={seen / max(el, 1e-9):.0f} lr={lr:.2e} "
              f"accept_w={aw:.2f} " + " ".join(f"{k}={v.item():.3f}" for k, v in L.items()))
    peak = f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if dev.type == "cuda" else ""
    P(f"trained {step} steps, {seen / 1e6:.1f}M tokens in {time.time() - t0:.0f}s ({kernels} kernels{peak})")
    model.eval()
    files = save_state(model, str(out / a.name))
    P("saved", files)
    res = {"name": a.name, "steps": step, "tokens_M": round(seen / 1e6, 1), "params": n_par, "kernels": kernels,
           "train_seconds": round(time.time() - t0), "args": vars(a)}
    (out / f"{a.name}.json").write_text(json.dumps(res))
    if a.probe:
        from probe import probe

        res["probe"] = probe(model, a.data, log=P, quick=a.quick_probe)
        (out / f"{a.name}.json").write_text(json.dumps(res))
    P("done", json.dumps({k: v for k, v in res.items() if k not in ("args", "probe")}))


if __name__ == "__main__":
    main()
