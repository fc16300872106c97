"""Find, read and check an MTP head before anything else is loaded, for any family.

A head is found in one of two places, in this order:

- a sidecar (`optiq/mtp.safetensors` or where config.json registers it): an MLX conversion
  (as `mlx_lm convert` writes it, which drops the head) plus the head beside it, Hugging Face
  tensor names (`mtp.*`), float or quantized;
- the checkpoint's own `model*.safetensors`: an original Hugging Face checkpoint keeps `mtp.*`
  inside its shards.

The family says which tensors it expects (logical shapes by Hugging Face name) and which are
norms; this module compares, infers the quantization from the stored shapes and names every
tensor that is missing, unexpected or of the wrong shape. A tensor stored quantized keeps its
name for the packed uint32 weight, with `.scales` and `.biases` beside its base name (the name
without `.weight`): `mtp.fc.scales`, `mtp.layers.0.mlp.experts.gate_up_proj.scales`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import mlx.core as mx

from .errors import CheckpointError

DEFAULT_LOCATIONS = ("optiq/mtp.safetensors", "mtp.safetensors")
PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")


def registered(config: dict) -> List[str]:
    """Sidecar paths config.json registers: mlx_lm_extra_tensors.mtp_file, then mtp_file."""
    out = []
    extra = config.get("mlx_lm_extra_tensors")
    if isinstance(extra, dict) and extra.get("mtp_file"):
        out.append(extra["mtp_file"])
    if config.get("mtp_file") and config["mtp_file"] not in out:
        out.append(config["mtp_file"])
    return out


def candidates(config: dict) -> List[str]:
    """Sidecar paths to try, relative to the checkpoint, in the look-up order of the existing loaders."""
    out = registered(config)
    return out + [d for d in DEFAULT_LOCATIONS if d not in out]


def locate(ckpt: Path, config: dict) -> Optional[Path]:
    """The registered sidecar path, in the look-up order of the existing loaders."""
    # Checked lexically, not with resolve(): Hugging Face cache snapshots (and users) keep the
    # files as symlinks to blobs elsewhere, which is fine; a config's `../` is not.
    root = Path(os.path.abspath(ckpt))
    for rel in candidates(config):
        if not isinstance(rel, str):
            raise CheckpointError(
                f"{ckpt / 'config.json'}: mtp_file is {rel!r}; it must be a path relative to the "
                "checkpoint directory, such as \"optiq/mtp.safetensors\"."
            )
        path = Path(os.path.normpath(root / rel))
        # A config must not point the loader outside its own checkpoint.
        if root not in path.parents:
            raise CheckpointError(
                f"{ckpt / 'config.json'}: mtp_file '{rel}' points outside the checkpoint directory. "
                "Put the sidecar inside the checkpoint (optiq/mtp.safetensors) and register it by "
                "its relative path."
            )
        if path.is_file():
            return path
    return None


def head_name(key: str) -> Optional[str]:
    """`mtp.*` for a stored key of the head (whatever its prefix), else None."""
    if key.startswith("mtp."):
        return key
    for prefix in PREFIXES:
        if key.startswith(prefix + "mtp."):
            return key[len(prefix):]
    return None


def _load(path: Path, what: str) -> dict:
    try:
        tensors = mx.load(str(path))
    except Exception as exc:  # mlx raises RuntimeError/ValueError with terse texts
        raise CheckpointError(
            f"{path}: cannot read {what} ({exc}). The file is corrupt or truncated: "
            "copy it again from the original checkpoint."
        ) from None
    if not isinstance(tensors, dict):
        raise CheckpointError(f"{path}: not a safetensors file of named tensors.")
    return tensors


def read(path: Path) -> Dict[str, mx.array]:
    """A sidecar's tensors by head name (prefixes such as `language_model.` normalised)."""
    return {head_name(k) or k: v for k, v in _load(path, "the MTP sidecar").items()}


def shard_files(ckpt: Path) -> List[Path]:
    return sorted(ckpt.glob("model*.safetensors"))


def head_shards(ckpt: Path) -> List[Path]:
    """The checkpoint's own model*.safetensors that hold `mtp.*` tensors (an original Hugging
    Face checkpoint), found from the index's weight map when there is one, else by reading
    headers (mx.load reads data lazily)."""
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (OSError, ValueError):
            weight_map = {}
        if weight_map:
            return sorted({ckpt / f for k, f in weight_map.items() if head_name(k) and (ckpt / f).is_file()})
    out = []
    for f in shard_files(ckpt):
        try:
            if any(head_name(k) for k in mx.load(str(f))):
                out.append(f)
        except Exception:  # noqa: BLE001 - an unreadable shard is the trunk's problem, reported there
            pass
    return out


def read_shards(files: List[Path]) -> Dict[str, mx.array]:
    out = {}
    for f in files:
        for k, v in _load(f, "a weight shard").items():
            name = head_name(k)
            if name is not None:
                out[name] = v
    return out


@dataclass(frozen=True)
class Found:
    """Where a head was found: `kind` "sidecar" (the file) or "checkpoint" (mtp.* in its shards)."""

    kind: str
    files: Tuple[Path, ...]
    tensors: Dict[str, mx.array]

    def where(self, ckpt: Path) -> str:
        if self.kind == "sidecar":
            return os.path.relpath(self.files[0], os.path.abspath(ckpt))
        return "mtp.* in " + ", ".join(f.name for f in self.files)


def find(ckpt: Path, config: dict) -> Optional[Found]:
    """The head: a sidecar first (registered or at a default location), then mtp.* in the
    checkpoint's own shards; None when neither exists."""
    side = locate(ckpt, config)
    if side is not None:
        return Found("sidecar", (side,), read(side))
    files = head_shards(ckpt)
    tensors = read_shards(files) if files else {}
    return Found("checkpoint", tuple(files), tensors) if tensors else None


def no_head_message(ckpt: Path, config: dict) -> str:
    reg = registered(config)
    where = (f"config.json registers {', '.join(repr(r) for r in reg)} but no such file exists"
             if reg else "config.json registers none (mtp_file / mlx_lm_extra_tensors.mtp_file)")
    return (
        f"{ckpt} has no MTP head: no sidecar at {' or '.join(candidates(config))}; {where}; and no mtp.* "
        "tensors in its model*.safetensors. Speculative decoding needs the head; use a checkpoint "
        "converted with its MTP tensors (for example the MTPLX/OptiQ conversion), the original Hugging "
        "Face checkpoint, or attach the head to your conversion with `mtp-chat attach-head`. "
        "Plain autoregressive generation does not need this app."
    )


# --------------------------------------------------------------------------- checking
def base_name(name: str) -> str:
    """A tensor's name without `.weight`: where its `.scales` and `.biases` sit when quantized."""
    return name[: -len(".weight")] if name.endswith(".weight") else name


def matrices(shapes: Dict[str, Tuple[int, ...]]) -> List[str]:
    """The expected tensors that may be stored quantized (2-D linears, 3-D stacked experts)."""
    return [n for n, s in shapes.items() if len(s) >= 2]


def quantized_tensors(tensors: Dict[str, mx.array], shapes: Dict[str, Tuple[int, ...]]) -> set:
    """Names of the expected matrices stored quantized (scales/biases beside them, or uint32)."""
    return {
        n for n in matrices(shapes)
        if base_name(n) + ".scales" in tensors or base_name(n) + ".biases" in tensors
        or (n in tensors and tensors[n].dtype == mx.uint32)
    }


def _infer(tensors, shapes, name) -> Optional[dict]:
    w, s = tensors.get(name), tensors.get(base_name(name) + ".scales")
    if w is None or s is None or w.ndim != len(shapes[name]) or s.shape[-1] == 0:
        return None
    in_f = shapes[name][-1]
    return {"bits": w.shape[-1] * 32 // in_f, "group_size": in_f // s.shape[-1]}


def quant_params(tensors: Dict[str, mx.array], shapes: Dict[str, Tuple[int, ...]], quantized: set,
                 quant: Optional[dict]) -> Optional[dict]:
    """{bits, group_size} of the quantized tensors: as registered, else inferred from the shapes.
    A registration may give single tensors their own ({"mtp.layers.0.mlp.gate": {"bits": 8, ...}},
    as mlx-lm's `quantization` does per module): `params_for` reads those."""
    if not quantized:
        return None
    bits = (quant or {}).get("bits")
    group = (quant or {}).get("group_size")
    if bits is None or group is None:
        for name in sorted(quantized):  # no registration: the first quantized tensor that is complete
            found = _infer(tensors, shapes, name)
            if found is not None:
                return found
        return None
    return {"bits": int(bits), "group_size": int(group)}


def params_for(name: str, params: Optional[dict], quant: Optional[dict]) -> Optional[dict]:
    own = (quant or {}).get(base_name(name))
    if isinstance(own, dict) and own.get("bits") and own.get("group_size"):
        return {"bits": int(own["bits"]), "group_size": int(own["group_size"])}
    return params


def stored_shapes(logical: Tuple[int, ...], params: Optional[dict]) -> Dict[str, Tuple[int, ...]]:
    """Stored shape of a matrix's weight/scales/biases (suffix -> shape); params None = float."""
    if params is None:
        return {"": tuple(logical)}
    *lead, in_f = logical
    groups = tuple(lead) + (in_f // params["group_size"],)
    return {"": tuple(lead) + (in_f * params["bits"] // 32,), ".scales": groups, ".biases": groups}


def _stored_name(name: str, suffix: str) -> str:
    return name if not suffix else base_name(name) + suffix


@dataclass(frozen=True)
class Problem:
    """One way a head differs from what the family expects."""

    kind: str  # "missing" | "unexpected" | "shape" | "dtype"
    tensor: str
    message: str  # names the tensor (and expected vs found); no file path


def problems(tensors: Dict[str, mx.array], shapes: Dict[str, Tuple[int, ...]], quant: Optional[dict],
             about: str = "") -> Tuple[set, Optional[dict], List[Problem]]:
    """Compare a head's tensors with the family's expected (logical) shapes; never raises.

    Returns (names of quantized tensors, {bits, group_size} or None, problems in check order).
    `about` ends a shape message (what the expected shapes came from, e.g. "for hidden_size=64")."""
    quantized = quantized_tensors(tensors, shapes)
    params = quant_params(tensors, shapes, quantized, quant)
    expected = set(shapes) | {base_name(q) + s for q in quantized for s in (".scales", ".biases")}
    found: List[Problem] = []
    for name in sorted(expected - set(tensors)):
        want = shapes.get(name)
        if want is None:  # a scales/biases tensor
            owner = next(q for q in quantized if name.startswith(base_name(q) + "."))
            p = params_for(owner, params, quant)
            want = stored_shapes(shapes[owner], p)["." + name.rsplit(".", 1)[1]] if p else None
        elif name in quantized and params is not None:
            want = stored_shapes(want, params_for(name, params, quant))[""]
        found.append(Problem("missing", name, f"missing tensor '{name}'" + (f" (expected shape {list(want)})" if want else "")))
    for name in sorted(set(tensors) - expected):
        found.append(Problem("unexpected", name, f"unexpected tensor '{name}' {list(tensors[name].shape)}"))

    for name, logical in shapes.items():
        is_q = name in quantized
        p = params_for(name, params, quant) if is_q else None
        if is_q and p is None:
            continue  # nothing to compare with: its scales are missing (reported above)
        for suffix, want in stored_shapes(logical, p).items():
            tname = _stored_name(name, suffix)
            if tname not in tensors:
                continue
            shape = tuple(tensors[tname].shape)
            if shape != want:
                how = f" (quantized with bits={p['bits']}, group_size={p['group_size']})" if is_q else ""
                found.append(Problem(
                    "shape", tname,
                    f"tensor '{tname}' has shape {list(shape)}, expected {list(want)}{how}{about}. The head "
                    "belongs to a different model or its quantization settings in config.json are wrong.",
                ))
        if is_q and name in tensors and tensors[name].dtype != mx.uint32:
            found.append(Problem("dtype", name, f"quantized tensor '{name}' is {tensors[name].dtype}, expected uint32."))
    return quantized, params, found


FIX_SIDECAR = ("Re-export the sidecar (its float tensors, or each quantized one with its .scales and "
               ".biases) or check that it belongs to this model.")
FIX_CHECKPOINT = "Copy the checkpoint again, or check that its mtp.* tensors belong to this model."


def check(where: str, tensors: Dict[str, mx.array], shapes: Dict[str, Tuple[int, ...]], quant: Optional[dict],
          what: str, about: str = "", fix: str = FIX_SIDECAR) -> Tuple[set, Optional[dict]]:
    """Validate names and shapes; return (names of quantized tensors, {bits, group_size}).
    `what` names the head the family expects ("a one-layer Qwen3.5 MTP head")."""
    quantized, params, found = problems(tensors, shapes, quant, about)
    missing = [p.tensor for p in found if p.kind == "missing"]
    extra = [p.tensor for p in found if p.kind == "unexpected"]
    if missing or extra:
        msg = [f"{where}: the MTP head does not match {what}."]
        if missing:
            msg.append(f"Missing tensors: {', '.join(missing)}.")
        if extra:
            msg.append(f"Unexpected tensors: {', '.join(extra)}.")
        msg.append(fix)
        raise CheckpointError(" ".join(msg))
    if found:
        raise CheckpointError(f"{where}: {found[0].message}")
    return quantized, params


def detect_norm_convention(tensors: Dict[str, mx.array], config: dict, norms) -> Tuple[str, str]:
    declared = config.get("mtp_norm_convention")
    if declared is not None:
        if declared not in ("zero_centered", "standard"):
            raise CheckpointError(
                f"config.json: mtp_norm_convention is '{declared}', expected 'zero_centered' or 'standard'."
            )
        return declared, "config"
    # MTPLX/OptiQ heuristic: applied weights sit near 1, zero-centred ones near 0.
    present = [n for n in norms if n in tensors]
    if not present:
        raise CheckpointError("the MTP head has none of its norm tensors: cannot tell their convention.")
    mean = mx.mean(mx.concatenate([tensors[n].astype(mx.float32).reshape(-1) for n in present])).item()
    return ("zero_centered" if mean < 0.5 else "standard"), f"detected, mean {mean:.3f}"
