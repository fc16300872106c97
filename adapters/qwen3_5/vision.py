"""Qwen3.5's vision tower, run by mlx-vlm, and where its output enters our trunk.

The tower and the image processor are mlx-vlm's own (`mlx_vlm.models.qwen3_5`: the ViT with its
patch merger, and the torch-free Qwen3-VL image processor), loaded from the tensors that sit beside
the trunk in either layout (KNOWLEDGE section 19): Hugging Face's `model.visual.*` (the patch
embedding as PyTorch keeps it) or an mlx-vlm conversion's `vision_tower.*`; mlx-vlm's sanitize
maps both. The trunk stays mlx-lm's, run by our backends.

What the trunk needs from a picture:
- its embeddings at the image tokens' positions (`embed`), in place of the image pad's;
- Qwen's multimodal RoPE (interleaved mrope_section): an image token sits at the image's start
  position plus (0, row, column) of its merged grid, and the text after the image goes on from
  the image's highest position + 1, so from then on a token's position is its index plus a rope
  delta (-56 after a 64-token 8x8 image). With all three rows equal, multimodal RoPE is the plain
  RoPE mlx-lm runs, so text positions only need the delta (`positions`).

mlx-vlm's `_to_numpy_image` opens a path when given a string: it is only ever given pixels.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from core.images import ImageError, ImageSpan, Picture
from core.stream import Prompt

from .. import sidecar
from ..errors import CheckpointError

PREFIXES = ("model.visual.", "model.language_model.visual.", "vision_tower.")
# Qwen3.5's published preprocessor_config.json: size {shortest_edge: 65536, longest_edge: 16777216}.
DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS = 65536, 16777216
FEATURES_KEPT = 8   # tower outputs kept by digest: a follow-up about the same picture skips the tower


def tower_tensors(path: Path) -> dict:
    """The tower's tensors from the trunk's shards, under mlx-vlm's names without `vision_tower.`."""
    from mlx_vlm.models.qwen3_5.qwen3_5 import sanitize_key

    out = {}
    for f in sidecar.shard_files(path):
        for k, v in mx.load(str(f)).items():
            if k.startswith(PREFIXES):
                out[sanitize_key(k)[len("vision_tower."):]] = v
    return out


def _processor_kwargs(path: Path, vc: dict) -> dict:
    """Image processor settings from preprocessor_config.json (read here, never fetched)."""
    raw = {}
    f = path / "preprocessor_config.json"
    if f.is_file():
        raw = json.loads(f.read_text())
    out = {"patch_size": raw.get("patch_size", vc.get("patch_size", 16)),
           "temporal_patch_size": raw.get("temporal_patch_size", vc.get("temporal_patch_size", 2)),
           "merge_size": raw.get("merge_size", vc.get("spatial_merge_size", 2))}
    for k in ("image_mean", "image_std", "rescale_factor", "do_rescale", "do_normalize"):
        if k in raw:
            out[k] = raw[k]
    size = raw.get("size") or {}
    out["min_pixels"] = raw.get("min_pixels") or size.get("shortest_edge") or DEFAULT_MIN_PIXELS
    out["max_pixels"] = raw.get("max_pixels") or size.get("longest_edge") or DEFAULT_MAX_PIXELS
    return out


class Vision:
    """A loaded tower: the placeholder text, token counts, embeddings and positions of pictures."""

    def __init__(self, tower, processor, config: dict, tokenizer, rope_dims: int, rope_theta: float,
                 mrope_section: Sequence[int], dtype):
        self.tower, self.processor, self.dtype = tower, processor, dtype
        self.image_token_id = int(config["image_token_id"])
        self.start_token_id = int(config["vision_start_token_id"])
        end = int(config["vision_end_token_id"])
        self.placeholder = tokenizer.decode([self.start_token_id, self.image_token_id, end])
        self.merge = processor.merge_size
        from mlx_vlm.models.rope_utils import compute_inv_freq

        self.rope_dims, self.mrope_section = rope_dims, list(mrope_section)
        self.inv_freq = compute_inv_freq(rope_dims, rope_theta)
        self._features: "OrderedDict[str, mx.array]" = OrderedDict()

    # -- for people ---------------------------------------------------------------------
    @property
    def min_pixels(self) -> int:
        return int(self.processor.min_pixels)

    @property
    def max_pixels(self) -> int:
        return int(self.processor.max_pixels)

    @property
    def max_tokens(self) -> int:
        """Image tokens of the largest picture (at max_pixels)."""
        f = self.processor.patch_size * self.merge
        return self.max_pixels // (f * f)

    def describe(self) -> str:
        side = int(self.max_pixels ** 0.5)
        return (f"vision tower (mlx-vlm qwen3_5): pictures resized to {self.min_pixels:,}..{self.max_pixels:,} "
                f"pixels (about {side}x{side} at most), up to {self.max_tokens:,} image tokens each")

    # -- the prompt ---------------------------------------------------------------------
    def grid(self, picture: Picture) -> Tuple[int, int, int]:
        """(t, h, w) in patches, as the processor resizes the picture (multiples of patch x merge).
        `_resolved_size` is the processor's own sizing, shared by its preprocessing and its
        token count (mlx-vlm 0.7.10): the grid without touching the pixels."""
        h, w = self.processor._resolved_size(picture.height, picture.width)
        p = self.processor.patch_size
        return 1, h // p, w // p

    def expand(self, ids: Sequence[int], marks: Sequence[int], pictures: List[Picture]) -> Prompt:
        """Each `<|vision_start|><|image_pad|>` -> the picture's image tokens; marks move with them."""
        at = [i for i in range(1, len(ids)) if ids[i] == self.image_token_id and ids[i - 1] == self.start_token_id]
        if len(at) != len(pictures):
            raise ImageError(f"the prompt has {len(at)} image placeholder(s) for {len(pictures)} picture(s): "
                             "a message's text may not contain the model's image tokens.")
        out, spans, shift, prev = [], [], 0, 0
        new_marks = list(marks)
        for i, picture in zip(at, pictures):
            try:
                grid = self.grid(picture)
            except ValueError as exc:   # an aspect ratio over 200, as the processor refuses
                raise ImageError(f"the picture cannot be resized for the tower: {exc}.") from None
            n = grid[0] * grid[1] * grid[2] // (self.merge * self.merge)
            out.extend(ids[prev:i])
            spans.append(ImageSpan(len(out), n, picture, grid))
            out.extend([self.image_token_id] * n)
            new_marks = [m + n - 1 if m > i + shift else m for m in new_marks]
            shift += n - 1
            prev = i + 1
        out.extend(ids[prev:])
        return Prompt(tuple(out), tuple(new_marks), tuple(spans))

    # -- the trunk's input ----------------------------------------------------------------
    def embed(self, span: ImageSpan) -> mx.array:
        """The tower's output for a picture [n, hidden] (kept by digest for a few pictures)."""
        got = self._features.get(span.picture.digest)
        if got is not None and got.shape[0] == span.length:
            self._features.move_to_end(span.picture.digest)
            return got
        image = np.transpose(span.picture.pixels, (2, 0, 1))   # [3, H, W] uint8: pixels, never a path
        h, w = span.grid[1] * self.processor.patch_size, span.grid[2] * self.processor.patch_size
        out = self.processor([image], resized_height=h, resized_width=w)
        thw = [int(v) for v in out["image_grid_thw"][0]]
        assert tuple(thw) == tuple(span.grid), (thw, span.grid)
        features, _ = self.tower(mx.array(out["pixel_values"]).astype(self.dtype), mx.array([thw], dtype=mx.int32))
        mx.eval(features)
        self._features[span.picture.digest] = features
        while len(self._features) > FEATURES_KEPT:
            self._features.popitem(last=False)
        return features

    def positions(self, start: int, T: int, delta: int, spans: Sequence[ImageSpan]) -> Tuple[mx.array, int]:
        """Positions [3, T] of tokens start .. start+T-1 whose pictures are `spans`, from the
        rope delta before them; returns them and the delta after them."""
        rows, i = [], start
        for s in spans:
            if s.start > i:
                rows.append(np.broadcast_to(np.arange(i, s.start) + delta, (3, s.start - i)))
            _, gh, gw = s.grid[0], s.grid[1] // self.merge, s.grid[2] // self.merge
            base = s.start + delta
            hh, ww = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
            rows.append(np.stack([np.zeros(gh * gw, int), hh.ravel(), ww.ravel()]) + base)
            delta = base + max(gh, gw) - s.end
            i = s.end
        if start + T > i:
            rows.append(np.broadcast_to(np.arange(i, start + T) + delta, (3, start + T - i)))
        return mx.array(np.concatenate(rows, axis=1).astype(np.int32)), delta

    def rope_table(self, pos: mx.array) -> Tuple[mx.array, mx.array]:
        """pos [3, T] -> (cos, sin) [T, rope_dims / 2]: mlx-vlm's interleaved multimodal frequencies."""
        from mlx_vlm.models.rope_utils import compute_mrope_frequencies

        freqs = compute_mrope_frequencies(pos[:, None, :], self.inv_freq, self.mrope_section, style="interleaved")
        return mx.cos(freqs[0]), mx.sin(freqs[0])


def load(path: Path, config: dict, tc: dict, tokenizer, compute_dtype: str, max_pixels: Optional[int]) -> Optional[Vision]:
    """The tower of a checkpoint that has one (a vision_config and its tensors), else None."""
    vc = config.get("vision_config")
    if not vc or "image_token_id" not in config:
        return None
    tensors = tower_tensors(path)
    if not tensors:
        return None   # converted text-only (mlx_lm.convert drops the tower)
    from mlx_vlm.models.qwen3_5.config import VisionConfig
    from mlx_vlm.models.qwen3_5.vision import VisionModel
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor
    import mlx.nn as nn

    fields = VisionConfig.__dataclass_fields__
    try:
        tower = VisionModel(VisionConfig(**{k: v for k, v in vc.items() if k in fields}))
        weights = tower.sanitize(tensors)
        if any(k.endswith(".scales") for k in weights):   # a quantized conversion of the tower
            q = config.get("quantization") or {}
            nn.quantize(tower, group_size=q.get("group_size", 64), bits=q.get("bits", 4),
                        class_predicate=lambda p, m: f"{p}.scales" in weights)
        tower.load_weights(list(weights.items()), strict=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: the vision tower does not load with mlx-vlm's qwen3_5 VisionModel "
                              f"({type(exc).__name__}: {exc}).") from None
    dtype = mx.float32 if compute_dtype == "float32" else tower.patch_embed.proj.weight.dtype
    if compute_dtype == "float32":
        tower.set_dtype(mx.float32)
    tower.eval()
    mx.eval(tower.parameters())
    kwargs = _processor_kwargs(path, vc)
    if max_pixels:
        kwargs["max_pixels"] = min(kwargs["max_pixels"], int(max_pixels))
        kwargs["min_pixels"] = min(kwargs["min_pixels"], kwargs["max_pixels"])
    rope = tc.get("rope_parameters") or {}
    head_dim = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
    dims = int(head_dim * rope.get("partial_rotary_factor", tc.get("partial_rotary_factor", 1.0)))
    section = rope.get("mrope_section") or [dims // 2, 0, 0]
    return Vision(tower, Qwen3VLImageProcessor(**kwargs), config, tokenizer, dims,
                  float(rope.get("rope_theta", tc.get("rope_theta", 10000.0))), section, dtype)
