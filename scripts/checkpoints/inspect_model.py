#!/usr/bin/env python3
"""Load a checkpoint the way the app does and print the adapter's contract.

    python scripts/checkpoints/inspect_model.py --model DIR [--hidden-variant pre_norm|post_norm]

Prints what the engine will rely on: hidden size, vocabulary, the trunk's layers and their
kinds (L = Gated-DeltaNet, A = full attention), the MTP layer count, the hidden-state
variant and where it came from (config, override or the Qwythos default), the concat order,
the norm convention of the head (declared or detected), and the quantization of trunk and
head. Then it cross-checks config.json against what was loaded and prints a ``FLAG`` line for
each disagreement. When the checkpoint does not load, it says why (the adapter's own
message), prints what config.json alone tells, and points at ``inspect_mtp_weights.py``.

The trunk is loaded as stored (``compute_dtype="native"``), so a 4-bit 9B stays 4-bit.

``--measure`` then measures the head's acceptance (greedy, depth 2, a few chat prompts) for each
wiring (pre- or post-norm trunk hidden, embedding or hidden first in the concat) and says which
one the checkpoint needs, as MTPLX Forge calibrates a head: a wrong wiring runs without any error
at ~0 % acceptance. It loads the model once per wiring, in the compute dtype the app uses.
Exit status: 0 when nothing is flagged, 1 otherwise (2 for bad arguments).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

import adapters  # noqa: E402  (first: fast BLAS before mlx.core is imported)
from adapters import sidecar  # noqa: E402
from adapters.checkpoint import open_checkpoint, text_config  # noqa: E402
from adapters.errors import CheckpointError  # noqa: E402


def _kinds_string(kinds) -> str:
    return "".join("L" if k == "linear" else "A" for k in kinds)


def _quant(q) -> str:
    if not q:
        return "none (float)"
    text = f"{q.get('bits')}-bit, group_size {q.get('group_size')}"
    if q.get("mode"):
        text += f", {q['mode']}"
    per_module = [k for k, v in q.items() if isinstance(v, dict)]
    if per_module:
        text += f"; {len(per_module)} module(s) with their own settings: " + ", ".join(
            f"{k} {q[k].get('bits')}-bit" for k in per_module)
    return text


def _config_kinds(tc: dict):
    """Layer kinds as config.json states them (layer_types, else full_attention_interval)."""
    types = tc.get("layer_types")
    if isinstance(types, list) and types:
        return tuple("full" if t == "full_attention" else "linear" for t in types)
    n, fai = tc.get("num_hidden_layers"), tc.get("full_attention_interval")
    if isinstance(n, int) and isinstance(fai, int) and fai > 0:
        return tuple("full" if (i + 1) % fai == 0 else "linear" for i in range(n))
    return None


def _from_config(config: dict, out) -> None:
    """What config.json alone says, for a checkpoint that does not load."""
    tc = text_config(config)
    out("from config.json alone (the adapter did not load):")
    out(f"  model_type: {config.get('model_type')}")
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        out(f"  {key}: {tc.get(key, '(absent)')}")
    kinds = _config_kinds(tc)
    if kinds:
        out(f"  layer kinds: {_kinds_string(kinds)} ({kinds.count('linear')} Gated-DeltaNet + "
            f"{kinds.count('full')} attention)")
    out(f"  mtp_num_hidden_layers: {tc.get('mtp_num_hidden_layers', config.get('mtp_num_hidden_layers', '(absent)'))}")
    for key in ("mtp_hidden_variant", "mtp_concat_order", "mtp_norm_convention", "mtp_file",
                "mtplx_mtp_quantization", "mtp_tensor_count"):
        if key in config:
            out(f"  {key}: {config[key]}")
    out(f"  trunk quantization: {_quant(config.get('quantization'))}")


WIRINGS = [(v, o) for v in ("pre_norm", "post_norm") for o in ("embedding_hidden", "hidden_embedding")]
# A wiring must beat the checkpoint's own by this much acceptance (at depth 1) to be recommended.
MARGIN = 0.05


def measure_wirings(ckpt, current, out) -> list:
    """Acceptance per wiring; a FLAG when another wiring beats the checkpoint's own."""
    from core.probe import measure_acceptance

    rows = []
    for variant, order in WIRINGS:
        ad = adapters.load_adapter(ckpt, hidden_variant=variant, concat_order=order, log=lambda m: None)
        a = measure_acceptance(ad)
        rows.append(((variant, order), a))
        mark = "  <- the checkpoint's" if (variant, order) == current else ""
        out(f"  hidden {variant:9} concat {order:16}: acceptance " + " / ".join(f"{x:.0%}" for x in a.per_depth)
            + f" per depth{mark}")
    best, best_a = max(rows, key=lambda r: r[1].first)
    mine = dict(rows)[current]
    if best != current and best_a.first > mine.first + MARGIN:
        return [f"the head accepts more with hidden variant {best[0]} and concat order {best[1]} "
                f"({best_a.first:.0%} against {mine.first:.0%}): write \"mtp_hidden_variant\": \"{best[0]}\", "
                f"\"mtp_concat_order\": \"{best[1]}\" into config.json (or run with --hidden-variant)."]
    out(f"wiring: the checkpoint's own ({current[0]}, {current[1]}) is the best measured.")
    return []


def inspect_pair(adapter, out, measure: bool) -> int:
    """A family whose drafter is its own checkpoint (Gemma 4): its report, then acceptance."""
    for line in adapter.report():
        out(line)
    tok = adapter.tokenizer
    out(f"tokenizer: eos {tok.eos_token!r} (id {tok.eos_token_id}), chat template: "
        f"{'yes' if getattr(tok, 'chat_template', None) else 'no'}")
    if measure:
        from core.probe import measure_acceptance

        a = measure_acceptance(adapter)
        out("measured acceptance (greedy, depth 2): " + " / ".join(f"{x:.0%}" for x in a.per_depth) + " per depth")
    out("OK: the pair loaded and passed its checks.")
    return 0


def inspect(model: str, hidden_variant=None, out=print, measure: bool = False, drafter=None) -> int:
    flags, notes = [], []
    try:
        ckpt, config = open_checkpoint(model)
    except CheckpointError as exc:
        out(f"FLAG: {exc}")
        return 1
    out(f"checkpoint: {ckpt}")
    try:
        adapter = adapters.load_adapter(ckpt, hidden_variant=hidden_variant, compute_dtype="native", drafter=drafter)
    except CheckpointError as exc:
        out(f"FLAG: {exc}")
        if getattr(adapters.FAMILIES.get(config.get("model_type")), "SEPARATE_DRAFTER", False):
            return 1
        _from_config(config, out)
        out(f"run scripts/checkpoints/inspect_mtp_weights.py --model {model} for the sidecar's tensors.")
        return 1

    if not hasattr(adapter, "contract"):
        return inspect_pair(adapter, out, measure)
    c = adapter.contract
    family = adapters.family_of(config, ckpt)
    tc = family.FAMILY.text_config(config)
    out(f"family: {adapter.family} ({type(adapter).__name__})" + (f", {c.num_experts} routed experts" if c.num_experts else ""))
    out(f"layout: {c.layout}; head from {c.sidecar}")
    out(f"backend: {adapter.backend.name}")
    out(f"hidden size: {c.hidden_size}")
    out(f"vocab size: {c.vocab_size}")
    out(f"trunk layers: {c.num_layers} = {c.layer_kinds.count('linear')} Gated-DeltaNet (L) + "
        f"{c.layer_kinds.count('full')} full attention (A): {_kinds_string(c.layer_kinds)}")
    out(f"MTP layers: {c.mtp_num_layers}")
    out(f"hidden variant: {c.hidden_variant} ({c.hidden_variant_source})")
    concat_source = "config" if "mtp_concat_order" in config else (
        "Qwythos default" if adapter.family == "qwen3_5" else "default: embedding first")
    out(f"concat order: {c.concat_order} ({concat_source})")
    out(f"norm convention: {c.norm_convention} ({c.norm_convention_source})")
    out(f"trunk quantization: {_quant(c.trunk_quantization)}")
    out(f"MTP head quantization: {_quant(c.mtp_quantization)}; {c.mtp_tensor_count} tensors in {c.sidecar}")
    tied = adapter.tied
    out(f"lm_head: {'tied to embed_tokens' if tied else 'own weights (untied)'}")
    tok = adapter.tokenizer
    out(f"tokenizer: eos {tok.eos_token!r} (id {tok.eos_token_id}), chat template: "
        f"{'yes' if getattr(tok, 'chat_template', None) else 'no'}")
    vision = getattr(adapter, "vision", None)
    out(vision.describe() if vision is not None else
        "vision tower: none (text only)" + ("; config.json has a vision_config but the shards hold no tower"
                                            if config.get("vision_config") else ""))
    out(f"contract: {c.summary()}")

    # --- config.json against what was loaded -------------------------------------------
    declared_kinds = _config_kinds(tc)
    if declared_kinds and declared_kinds != c.layer_kinds:
        flags.append(f"config.json layer kinds {_kinds_string(declared_kinds)} differ from the "
                     f"loaded trunk's {_kinds_string(c.layer_kinds)}.")
    count = config.get("mtp_tensor_count")
    if count is not None and count != c.mtp_tensor_count:
        flags.append(f"config.json says mtp_tensor_count {count}, the sidecar holds {c.mtp_tensor_count} tensors.")
    reg = config.get("mtplx_mtp_quantization") or {}
    if reg and c.mtp_quantization is None:
        notes.append("config.json has mtplx_mtp_quantization but the head's linears are stored as floats.")
    if c.mtp_quantization and not (reg.get("bits") and reg.get("group_size")):
        notes.append("the head's bits/group_size are inferred from the tensor shapes "
                     "(config.json has no mtplx_mtp_quantization).")
    if c.norm_convention_source == "config":
        tensors = sidecar.find(adapter.path, config).tensors
        guess, how = sidecar.detect_norm_convention(tensors, {}, family.head_spec(config)[1])
        if guess != c.norm_convention:
            flags.append(f"config.json says mtp_norm_convention '{c.norm_convention}' but the norm weights "
                         f"look {guess} ({how}): check which is right, a wrong convention drops "
                         "acceptance to ~0%.")
    else:
        notes.append("config.json has no mtp_norm_convention: the convention was detected from the "
                     "weights' magnitude; record it in config.json to be sure.")
    if c.hidden_variant_source not in ("config", "override"):
        notes.append(f"config.json has no mtp_hidden_variant: using the {c.hidden_variant_source}; measure "
                     "acceptance with both variants (--hidden-variant).")
    if concat_source != "config":
        notes.append(f"config.json has no mtp_concat_order: using the {concat_source}.")
    if c.layout != "Hugging Face" and c.sidecar not in sidecar.registered(config):
        notes.append(f"the sidecar was found at a default location ({c.sidecar}), not through "
                     "mtp_file / mlx_lm_extra_tensors.mtp_file.")

    if measure:
        out("measured acceptance per wiring:")
        flags += measure_wirings(ckpt, (c.hidden_variant, c.concat_order), out)
    for n in notes:
        out(f"note: {n}")
    for f in flags:
        out(f"FLAG: {f}")
    if flags:
        out(f"{len(flags)} problem(s) flagged.")
        return 1
    out("OK: nothing flagged.")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory (the one with config.json)")
    p.add_argument("--hidden-variant", choices=["pre_norm", "post_norm"], default=None,
                   help="override the checkpoint's hidden-state variant")
    p.add_argument("--measure", action="store_true",
                   help="measure acceptance for each head wiring and say which one the checkpoint needs")
    p.add_argument("--drafter", default=None, help="the drafter's checkpoint when it is kept apart (Gemma 4)")
    args = p.parse_args(argv)
    return inspect(args.model, hidden_variant=args.hidden_variant, measure=args.measure, drafter=args.drafter)


if __name__ == "__main__":
    sys.exit(main())
