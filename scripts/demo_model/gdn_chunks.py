#!/usr/bin/env python3
"""How the reference Gated-DeltaNet's chunk length moves a demo training step: ops and gradients.

    python scripts/demo_model/gdn_chunks.py [--chunks 64 256 512] [--seq 4096] [--config configs/v3.json]

Why: on the H200 a v3 training step launched 29,518 kernels, 3.7 s of wall time for 0.59 s of kernel
time (train_torch.py --profile-step): the host, not the GPU, set the pace, and transformers' reference
scan over chunks of 64 positions is a Python loop of a few kernels a chunk, forward and back. For
each chunk length this builds the v3 model once (the same seed), runs one forward and backward of
a random window through the trunk, and prints the ATen ops the step called (the GPU launches them
one for one) with the loss and every gradient's relative difference to the first length's: the same
sums grouped otherwise, in fp32 inside the scan, so they must agree to rounding. Needs torch and
transformers (as export.py; after_v3.sh installs a CPU torch for it).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from model_torch import DemoModel, reference_chunks  # noqa: E402


def one_step(model, ids) -> tuple:
    """(loss, gradients flattened, ATen ops called, seconds) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        logits, _ = model.trunk(ids)
        loss = logits.float().logsumexp(-1).mean()
        loss.backward()
    seconds = time.perf_counter() - t0
    ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return loss.item(), grads, ops, seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--config", default=str(HERE / "configs" / "v3.json"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    model = DemoModel(json.loads(Path(a.config).read_text()))
    ids = torch.randint(3, model.cfg.vocab_size, (1, a.seq))
    rows, first = [], None
    for chunk in a.chunks:
        reference_chunks(chunk, lambda m: None)
        loss, grads, ops, seconds = one_step(model, ids)
        first = first or (loss, grads)
        row = {"chunk": chunk, "aten_ops": ops, "seconds": round(seconds, 2), "loss": loss,
               "loss_rel_diff": abs(loss - first[0]) / abs(first[0]),
               "grad_rel_diff": ((grads - first[1]).norm() / first[1].norm()).item()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    reference_chunks(64, lambda m: None)
    if a.json:
        Path(a.json).write_text(json.dumps({"config": a.config, "seq": a.seq, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
