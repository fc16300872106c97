"""`mtp-chat attach-head --from HF_DIR --to MLX_DIR [--bits B]`: give your own MLX conversion its
MTP head (adapters/attach.py), then check it by measured acceptance.

The check loads the conversion as the app will and measures how often the head's greedy drafts
pass (core/probe.py); with the Hugging Face checkpoint loaded too (the default), it compares
against the head running on the original weights. A head wired wrongly accepts ~0 % with no error
anywhere, so a result far below the original's fails the command.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

# The attached head must keep at least this share of the original's depth-1 acceptance (a wrongly
# wired head keeps ~0 %; a 4-bit trunk or head costs a few points, a quantized MoE head much more).
KEEP = 0.5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtp-chat attach-head", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="source", required=True, metavar="HF_DIR",
                   help="the original Hugging Face checkpoint (sharded safetensors with mtp.* inside)")
    p.add_argument("--to", dest="target", required=True, metavar="MLX_DIR",
                   help="your MLX conversion of it (as mlx_lm convert writes it, head stripped)")
    p.add_argument("--bits", type=int, choices=(4, 8), default=None,
                   help="quantize the head's matrices (fc and norms stay float; default: keep it float)")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--no-compare", action="store_true",
                   help="measure the conversion alone (do not also load the Hugging Face checkpoint)")
    p.add_argument("--tokens", type=int, default=48, help="tokens per measured reply")
    return p


def main(argv: Optional[List[str]] = None, out=print) -> int:
    import adapters  # noqa: F401  (first: the BLAS preload)
    from adapters import CheckpointError, load_adapter
    from adapters.attach import attach_head
    from core.probe import measure_acceptance

    args = build_parser().parse_args(argv)
    try:
        done = attach_head(args.source, args.target, bits=args.bits, group_size=args.group_size)
    except CheckpointError as exc:
        print(f"mtp-chat attach-head: {exc}", file=sys.stderr)
        return 1
    q = done.quantization
    out(f"wrote {done.sidecar} ({done.tensors} tensors, "
        + (f"{q['bits']}-bit, group size {q['group_size']})" if q else "float)") + " and registered it in config.json")
    for note in done.notes:
        out(f"note: {note}")
    quiet = lambda m: None  # noqa: E731
    try:
        attached = load_adapter(args.target, log=quiet)
    except CheckpointError as exc:
        print(f"mtp-chat attach-head: the conversion does not load with its head: {exc}", file=sys.stderr)
        return 1
    mine = measure_acceptance(attached, max_tokens=args.tokens)
    out(f"{attached.describe()}")
    out(f"acceptance of the attached head (greedy, depth 2): {_fmt(mine)}")
    if args.no_compare:
        return 0
    original = measure_acceptance(load_adapter(args.source, log=quiet,
                                               hidden_variant=attached.contract.hidden_variant),
                                  max_tokens=args.tokens)
    out(f"acceptance on the Hugging Face checkpoint:               {_fmt(original)}")
    if mine.first < KEEP * original.first:
        print(f"mtp-chat attach-head: the attached head accepts {mine.first:.0%} of drafts where the original "
              f"accepts {original.first:.0%}: check the wiring with scripts/checkpoints/inspect_model.py --measure.",
              file=sys.stderr)
        return 1
    out("OK: the attached head accepts drafts as the original does.")
    return 0


def _fmt(a) -> str:
    return " / ".join(f"{x:.0%}" for x in a.per_depth) + f" per depth ({a.proposed} drafts, {a.tokens} tokens)"
