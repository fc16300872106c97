"""Pictures in the Chat and Race tabs: the files Gradio received -> core.images.Picture.

The chat's multimodal box and the race's image box hand us paths of files Gradio itself stored
when the browser uploaded them. A history comes back from the browser on every turn (and from
localStorage after a reload), so a path in it is the client's word: a picture is read only from
Gradio's upload folder, as a file (no link), within the bytes a picture may have, and decoded by
core.images like any other. Anything else is dropped from the history or refused in words.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional

from core.images import ImageError, Picture, check_count, decode

MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp", ".gif": "image/gif",
        ".bmp": "image/bmp"}


def upload_folder() -> Path:
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()).resolve()


def uploaded(path: Any) -> Optional[Path]:
    """`path` when it is a regular file inside Gradio's upload folder (links not followed), else None."""
    if not isinstance(path, str) or not path:
        return None
    p = Path(os.path.abspath(path))
    try:
        p.relative_to(upload_folder())
    except ValueError:
        return None
    return p if p.is_file() and not p.is_symlink() else None


def read(path: Any, max_bytes: int) -> Picture:
    p = uploaded(path)
    if p is None:
        raise ImageError("the picture is not a file this page uploaded")
    size = p.stat().st_size
    if size > max_bytes:
        raise ImageError(f"the picture is {size / 1e6:.1f} MB; at most {max_bytes / 1e6:.1f} MB a picture is allowed")
    return decode(p.read_bytes(), max_bytes=max_bytes)


def file_block(path: str) -> dict:
    """A chat message's picture as Gradio's Chatbot shows it."""
    return {"type": "file", "file": {"path": path, "mime_type": MIME.get(Path(path).suffix.lower(), "image/png")}}


def picture_paths(content: Any) -> List[str]:
    """The uploaded pictures of a message's content blocks (others are not ours and are dropped)."""
    out = []
    for b in content if isinstance(content, (list, tuple)) else []:
        f = b.get("file") if isinstance(b, dict) and b.get("type") == "file" else None
        path = f.get("path") if isinstance(f, dict) else None
        if uploaded(path) is not None:
            out.append(path)
    return out


def checked(paths: List[str], settings) -> List[Picture]:
    """The pictures of one message, decoded, within the settings' count and bytes (ImageError otherwise)."""
    check_count(len(paths), settings.image_max_count)
    return [read(p, settings.image_max_bytes) for p in paths]


def limits_text(host) -> str:
    """What the page says a picture may be (the tower's budget and the settings')."""
    vision = host.adapter.vision
    s = host.settings
    return (f"up to {s.image_max_count} pictures a message, {s.image_max_bytes / 1e6:.0f} MB each, resized to at most "
            f"{vision.max_pixels:,} pixels ({vision.max_tokens:,} image tokens)")
