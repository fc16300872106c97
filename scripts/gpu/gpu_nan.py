#!/usr/bin/env python3
"""Hunt the non-finite logits of issue 14: a 16-layer h1024 4-bit random checkpoint whose MTP
lane raised NonFiniteLogitsError on the GPU while the AR lane ran.

    python scripts/gpu/gpu_nan.py --json out/nan.json [--dtype float32]

Builds the checkpoint (gpu_make_checkpoint --shape h1024-l16), runs both lanes with the GPU
kernels on and off, and where a lane fails, checks the pieces only the MTP lane uses (a
captured verify, the head) for non-finite values.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402,F401
import mlx.core as mx  # noqa: E402

from scripts.gpu.gpu_make_checkpoint import build  # noqa: E402


def finite(a: mx.array) -> bool:
    return bool(mx.all(mx.isfinite(a.astype(mx.float32))))


def probe(ad, ids) -> dict:
    """Finiteness of each piece of one cycle, after a prefill."""
    out = {}
    cache = ad.make_cache()
    prompt = mx.array(ids, dtype=mx.int32)[None]
    logits, hidden, _ = ad.forward(prompt, cache, all_logits=False)
    out["prefill_logits"] = finite(logits)
    out["prefill_hidden_absmax"] = float(mx.abs(hidden.astype(mx.float32)).max())
    mtp_cache = ad.make_mtp_cache()
    g = ad.mtp_forward(hidden[:, :-1], prompt[:, 1:], mtp_cache)
    out["head_catch_up"] = finite(g)
    out["head_logits"] = finite(ad.lm_head(g[:, -1:]))
    for width in (1, 2, 3, 4):
        c = ad.make_cache()
        ad.forward(prompt, c, all_logits=False)
        lg, hd, cap = ad.forward(prompt[:, -width:], c, capture=width > 1)
        out[f"verify_{width}_logits"] = finite(lg)
        if cap is not None:
            out[f"verify_{width}_states"] = all(finite(s) for _, st in cap.gdn.values() for s in st)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--out", default="/tmp/mtp_chat_h1024_l16")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args(argv)
    from adapters import load_adapter
    from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt_ids

    path = build(a.out, "h1024-l16", dtype=a.dtype)
    report = {"checkpoint": f"h1024-l16 4-bit g64 {a.dtype}", "runs": []}
    for kernels in ("1", "0"):
        os.environ["MTP_CHAT_GPU_KERNELS"] = kernels
        ad = load_adapter(path)
        ids = chat_prompt_ids(ad, [{"role": "user", "content": "Define the word harbor."}])
        failed = False
        for temp in (0.0, 0.6):
            sampler = SamplerConfig(temp, 0.95 if temp else 1.0, 20 if temp else 0, 0.0)
            lanes = [("ar", AutoregressiveDecoder(ad, sampler=sampler))]
            lanes += [(f"mtp_d{d}", SpeculativeDecoder(ad, sampler=sampler, depth=d)) for d in (1, 2, 3)]
            for name, dec in lanes:
                try:
                    toks, _ = dec.generate(ids, max_tokens=a.tokens)
                    res = f"ok ({len(toks)} tokens)"
                except Exception as exc:  # noqa: BLE001
                    res, failed = f"{type(exc).__name__}: {exc}", True
                report["runs"].append({"kernels": kernels, "temperature": temp, "lane": name, "result": res})
                print(kernels, temp, name, res, flush=True)
        report[f"probe_kernels_{kernels}"] = probe(ad, ids) if failed else "no lane failed"
        Path(a.json).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
