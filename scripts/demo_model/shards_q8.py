"""Pack training shards (bf16 safetensors) into int8 with a per-row scale, and back.

Why: a GPU call carries at most 64 MiB with the repository; two full models (the one to
train and the trunk that anchors it) plus the training prompts do not fit in bf16. Per-row
int8 changes a weight by at most half a step of its row's scale (the 8-bit export is lossless
in held-out loss and acceptance on this model); norms and other vectors stay bf16.

    python scripts/demo_model/shards_q8.py pack artifacts/demo/sd6/U3 artifacts/demo/carry7/U3.q8.safetensors
    python scripts/demo_model/shards_q8.py unpack artifacts/demo/carry7/U3.q8.safetensors artifacts/demo/sd7/U3
"""
from __future__ import annotations

import glob
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def pack(prefix: str, out: str) -> None:
    sd = {}
    for fn in sorted(glob.glob(f"{prefix}-*.safetensors")):
        sd.update(load_file(fn))
    packed = {}
    for k, v in sd.items():
        if v.dim() == 2:
            w = v.float()
            scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
            packed[k + ".q8"] = torch.round(w / scale).to(torch.int8).contiguous()
            packed[k + ".scale"] = scale.to(torch.float32).contiguous()
        else:
            packed[k] = v.contiguous()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_file(packed, out)


def unpack(path: str, prefix: str) -> None:
    packed = load_file(path)
    sd = {}
    for k, v in packed.items():
        if k.endswith(".q8"):
            name = k[: -len(".q8")]
            sd[name] = (v.float() * packed[name + ".scale"]).to(torch.bfloat16)
        elif not k.endswith(".scale"):
            sd[k] = v
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, f"{prefix}-00.safetensors")


if __name__ == "__main__":
    {"pack": pack, "unpack": unpack}[sys.argv[1]](sys.argv[2], sys.argv[3])
