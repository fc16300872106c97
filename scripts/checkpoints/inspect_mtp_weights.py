#!/usr/bin/env python3
"""List a checkpoint's MTP head and flag whatever the adapter would refuse.

    python scripts/checkpoints/inspect_mtp_weights.py --model DIR

Prints where the head was found (a sidecar and how it is registered in config.json, or the
`mtp.*` tensors inside an original Hugging Face checkpoint's shards), its key prefix, the
head's quantization and norm convention, then every tensor: name (as the adapter sees it,
``mtp.*``), dtype, stored shape and logical (dequantized) shape. Anything that does not match
the family's one-layer MTP head (missing, unexpected or wrongly shaped tensors, a missing expert,
a quantized weight that is not uint32, a tensor count or norm convention that disagrees with
config.json) is listed as a ``FLAG`` line. Works on broken checkpoints: only config.json and the
head's tensors are read, never the trunk.

Exit status: 0 when nothing is flagged, 1 otherwise (2 for bad arguments).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

import adapters  # noqa: E402  (first: fast BLAS before mlx.core is imported)
from adapters import sidecar  # noqa: E402
from adapters.checkpoint import open_checkpoint  # noqa: E402
from adapters.errors import CheckpointError  # noqa: E402

import mlx.core as mx  # noqa: E402



def _dtype(a: mx.array) -> str:
    return str(a.dtype).rsplit(".", 1)[-1]


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _quant_source(config: dict, params) -> str:
    reg = config.get("mtplx_mtp_quantization") or {}
    if params is None:
        return ""
    if reg.get("bits") is not None and reg.get("group_size") is not None:
        return "config.json mtplx_mtp_quantization"
    return "inferred from the shapes: config.json has no mtplx_mtp_quantization"


def inspect(model: str, out=print) -> int:
    flags = []

    def flag(msg: str) -> None:
        flags.append(msg)

    try:
        ckpt, config = open_checkpoint(model)
    except CheckpointError as exc:
        out(f"FLAG: {exc}")
        return 1
    try:
        family = adapters.family_of(config, ckpt)
    except CheckpointError as exc:
        out(f"FLAG: {exc}")
        return 1
    tc = family.FAMILY.text_config(config)
    out(f"checkpoint: {ckpt}")

    # --- where is it --------------------------------------------------------------------
    registered = sidecar.registered(config)
    try:
        side = sidecar.locate(ckpt, config)
    except CheckpointError as exc:
        out(f"FLAG: {exc}")
        return 1
    shards = sidecar.head_shards(ckpt) if side is None else []
    if side is None and not shards:
        where = (f"config.json registers {', '.join(map(repr, registered))} but no such file exists"
                 if registered else "config.json registers none")
        out(f"FLAG: no MTP sidecar: nothing at {' or '.join(sidecar.candidates(config))}; {where}; and no "
            "mtp.* tensors in its model*.safetensors. The adapter refuses a checkpoint without its MTP head.")
        return 1
    if side is None:
        return _report(out, flags, flag, config, tc, family, f"mtp.* in {', '.join(f.name for f in shards)} "
                       "(an original Hugging Face checkpoint)", shards)
    rel = Path(os.path.relpath(side, os.path.abspath(ckpt))).as_posix()
    extra = config.get("mlx_lm_extra_tensors")
    keys = [k for k, v in (("mlx_lm_extra_tensors.mtp_file", extra.get("mtp_file") if isinstance(extra, dict) else None),
                           ("mtp_file", config.get("mtp_file"))) if v == rel]
    if keys:
        how = "registered in config.json as " + ", ".join(keys)
    elif registered:
        how = f"default location; config.json registers {', '.join(map(repr, registered))}, which does not exist"
    else:
        how = "default location, not registered in config.json"
    return _report(out, flags, flag, config, tc, family, f"sidecar: {rel} ({how})", [side])


def _report(out, flags, flag, config, tc, family, where: str, files) -> int:
    out(where)
    # --- read ---------------------------------------------------------------------------
    try:
        tensors = sidecar.read(files[0]) if where.startswith("sidecar") else sidecar.read_shards(files)
    except CheckpointError as exc:
        out(f"FLAG: {exc}")
        return 1
    raw = [k for f in files for k in mx.load(str(f))]  # readable: only the stored names, for the prefix
    prefixes = sorted({k[: k.index("mtp.")] for k in raw if sidecar.head_name(k) and not k.startswith("mtp.")})
    out("key prefix: " + (", ".join(f"'{p}'" for p in prefixes) + " (normalised to 'mtp.')" if prefixes else "none"))

    count = config.get("mtp_tensor_count")
    out(f"tensors: {len(tensors)}" + (f" (config.json mtp_tensor_count: {count})" if count is not None else ""))
    if count is not None and count != len(tensors):
        flag(f"config.json says mtp_tensor_count {count}, the sidecar holds {len(tensors)} tensors.")
    n_mtp = tc.get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers", 1))
    if n_mtp != 1:
        flag(f"config.json says mtp_num_hidden_layers {n_mtp!r}; the adapter supports exactly one MTP layer.")

    absent = [k for k in family.FAMILY.required if k not in tc]
    shapes, norms, label = {}, (), family.FAMILY.label
    if absent:
        flag(f"config.json lacks {', '.join(absent)}: cannot tell the expected shapes.")
        quantized, params, found = set(), None, []
    else:
        shapes, norms, label = family.head_spec(config)
        quantized, params, found = sidecar.problems(tensors, shapes, config.get("mtplx_mtp_quantization"))
        if params:
            out(f"head quantization: bits={params['bits']}, group_size={params['group_size']} "
                f"({_quant_source(config, params)}); {len(quantized)} quantized linears: "
                + ", ".join(n[len("mtp."):].replace(".weight", "") for n in shapes if n in quantized))
        else:
            out("head quantization: none (float linears)"
                + (" although config.json has mtplx_mtp_quantization" if config.get("mtplx_mtp_quantization") else ""))
        out(f"expected for hidden_size={tc['hidden_size']}: {len(shapes)} base tensors"
            f" -> {len(shapes) + 2 * len(quantized)} stored")

    # --- norm convention ----------------------------------------------------------------
    try:
        heuristic, how = sidecar.detect_norm_convention(tensors, {}, norms or [n for n, a in tensors.items() if a.ndim == 1])
        declared = config.get("mtp_norm_convention")
        if declared is None:
            out(f"norm convention: {heuristic} ({how}; config.json has no mtp_norm_convention)")
        else:
            out(f"norm convention: {declared} (config); magnitude heuristic: {heuristic} ({how})")
            if declared != heuristic:
                flag(f"config.json says mtp_norm_convention '{declared}' but the norm weights look "
                     f"{heuristic} ({how}): check which is right, a wrong convention drops acceptance to ~0%.")
    except CheckpointError as exc:
        flag(str(exc))

    # --- the table ----------------------------------------------------------------------
    status = {}
    for p in found:
        status.setdefault(p.tensor, p.kind)
    rows = []
    for name in sorted(tensors):
        a = tensors[name]
        logical = ""
        if name in quantized and params:  # what the stored packing means, right or wrong
            bits = sidecar.params_for(name, params, config.get("mtplx_mtp_quantization"))["bits"]
            logical = _shape((*a.shape[:-1], a.shape[-1] * 32 // bits))
        elif name in shapes and a.dtype != mx.uint32:
            logical = _shape(a.shape)
        rows.append((name, _dtype(a), _shape(a.shape), logical, status.get(name, "ok")))
    for p in found:
        if p.kind == "missing":
            rows.append((p.tensor, "-", "-", "", "MISSING"))
    w = max(len(r[0]) for r in rows) if rows else 4
    out("")
    out(f"{'name':<{w}}  {'dtype':<8}  {'stored':<10}  {'logical':<10}  status")
    for name, dt, stored, logical, st in rows:
        out(f"{name:<{w}}  {dt:<8}  {stored:<10}  {logical:<10}  {st}")
    out("")

    flags = [p.message for p in found] + flags
    for msg in flags:
        out(f"FLAG: {msg}")
    if flags:
        out(f"{len(flags)} problem(s) flagged: the adapter would refuse or misread this sidecar."
            if found else f"{len(flags)} problem(s) flagged.")
        return 1
    out(f"OK: {len(tensors)} tensors match {label}.")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory (the one with config.json)")
    args = p.parse_args(argv)
    return inspect(args.model)


if __name__ == "__main__":
    sys.exit(main())
