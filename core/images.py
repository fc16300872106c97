"""Pictures in a prompt: decoding what a client sends, refusing what it must not, keying by content.

Every way in (the chat's upload, the race, OpenAI `image_url`, Anthropic `image`, Responses
`input_image`) ends here with bytes, so the rules are written once:

- only bytes the client sent: a `data:` URL or base64. Nothing here, or anywhere a client's
  value goes, fetches a URL or opens a path (a server that did would read its own files or its
  network for whoever asks);
- raster formats Pillow decodes (PNG, JPEG, WebP, GIF, BMP); SVG is a program, not a picture,
  and is refused, as is anything Pillow cannot decode to its last byte (a truncated PNG);
- at most `max_bytes` a picture (checked on the base64's length before decoding) and
  MAX_SOURCE_PIXELS before the pixels are decoded (a small file can hold a huge picture).

A picture is kept as RGB pixels and its digest (sha256 of size and pixels): the prefix cache
keys an image's positions by it (`key_ids`), so a follow-up question about the same picture
finds the state after it, and a different picture of the same size does not.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass
from typing import Any, Sequence, Tuple

import numpy as np

# Decoding allocates 3 bytes a pixel before any resize: 40 MP is 120 MB, the most one picture may cost.
MAX_SOURCE_PIXELS = 40_000_000
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
ALLOWED = "a PNG, JPEG, WebP, GIF or BMP picture sent as base64 (a data: URL or a base64 block)"
_DATA_URL = re.compile(r"^data:(image/[a-zA-Z0-9.+-]+)?(;[a-zA-Z0-9=.+-]+)*;base64,", re.ASCII)


class ImageError(ValueError):
    """A picture refused; the message says what is allowed (a 400 / a notice in the chat)."""

    def sentence(self) -> str:
        """The message as a sentence: capitalised, ending in a full stop."""
        text = str(self)
        text = text[:1].upper() + text[1:]
        return text if text.endswith(".") else text + "."


@dataclass(frozen=True, eq=False)
class Picture:
    pixels: np.ndarray   # [H, W, 3] uint8 RGB
    digest: str          # sha256 hex of (width, height, pixels)

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])


@dataclass(frozen=True, eq=False)
class ImageSpan:
    """A picture's place in a prompt: token positions [start, start + length), all image tokens,
    and what the adapter needs to embed and place it (`grid`: opaque to core)."""

    start: int
    length: int
    picture: Picture
    grid: Any = None

    @property
    def end(self) -> int:
        return self.start + self.length


def decode(data: bytes, *, max_bytes: int) -> Picture:
    """Bytes of an image file -> a Picture, or ImageError saying what is allowed."""
    if len(data) > max_bytes:
        raise ImageError(f"the picture is {len(data) / 1e6:.1f} MB; at most {max_bytes / 1e6:.1f} MB a picture is "
                         f"allowed: send {ALLOWED}, smaller.")
    head = data[:512].lstrip().lower()
    if head.startswith((b"<?xml", b"<svg", b"<!doctype svg")) or b"<svg" in head:
        raise ImageError(f"SVG is not accepted: send {ALLOWED}.")
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format not in FORMATS:
                raise ImageError(f"{im.format or 'this'} pictures are not accepted: send {ALLOWED}.")
            if im.width * im.height > MAX_SOURCE_PIXELS:
                raise ImageError(f"the picture is {im.width}x{im.height} pixels; at most {MAX_SOURCE_PIXELS:,} "
                                 f"pixels are decoded: send {ALLOWED}, smaller.")
            im.load()   # decodes all of it: a truncated or corrupt file fails here, not later
            pixels = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except ImageError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageError(f"the picture could not be decoded ({type(exc).__name__}: {exc}): send {ALLOWED}.") from None
    h = hashlib.sha256(f"{pixels.shape[1]}x{pixels.shape[0]}:".encode())
    h.update(pixels.tobytes())
    return Picture(pixels, h.hexdigest())


def from_base64(text: str, *, max_bytes: int) -> Picture:
    """base64 text (an Anthropic block's `data`, a data: URL's payload) -> a Picture."""
    if not isinstance(text, str):
        raise ImageError(f"the picture's data is not a string: send {ALLOWED}.")
    if len(text) > max_bytes * 4 // 3 + 8:   # refused before decoding a byte
        raise ImageError(f"the picture is about {len(text) * 3 / 4e6:.1f} MB; at most {max_bytes / 1e6:.1f} MB a "
                         f"picture is allowed: send {ALLOWED}, smaller.")
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"the picture's base64 is not valid: send {ALLOWED}.") from None
    return decode(data, max_bytes=max_bytes)


def from_url(url: str, *, max_bytes: int) -> Picture:
    """An `image_url`'s url: only a base64 `data:` URL. A web address or a path is refused, never
    fetched or opened."""
    if not isinstance(url, str):
        raise ImageError(f"image_url.url is not a string: send {ALLOWED}.")
    m = _DATA_URL.match(url[:200])
    if m is None:
        what = ("a web address" if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", url)
                else "a data: URL that is not base64" if url.startswith("data:") else "a file path or other text")
        raise ImageError(f"the image URL is {what}; this server never fetches URLs or reads files: send {ALLOWED}.")
    if m.group(1) and m.group(1).lower() == "image/svg+xml":
        raise ImageError(f"SVG is not accepted: send {ALLOWED}.")
    return from_base64(url[m.end():], max_bytes=max_bytes)


def check_count(n: int, limit: int) -> None:
    if n > limit:
        raise ImageError(f"{n} pictures in one request; at most {limit} are allowed.")


def key_ids(ids: Sequence[int], spans: Sequence[ImageSpan]) -> Tuple[int, ...]:
    """The ids the prefix cache matches on: an image's positions hold ids drawn from the picture's
    digest and its grid (negative, so never a token; int32, as the disk cache stores them), so the
    same picture at the same size matches, and another picture, or this one resized to another
    grid (a changed pixel budget), does not."""
    if not spans:
        return tuple(ids)
    out = list(ids)
    for s in spans:
        for k in range(s.length):
            d = hashlib.sha256(f"{s.picture.digest}:{s.grid}:{k}".encode()).digest()
            out[s.start + k] = -1 - (int.from_bytes(d[:4], "little") & 0x7FFFFFFE)
    return tuple(out)
