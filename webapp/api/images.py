"""Pictures in API requests: each protocol's image part -> a core.images.Picture, or a 400.

OpenAI chat's `image_url` part, Responses' `input_image` and Anthropic's `image` block all carry
base64 bytes here; a web address, a file id or a path is refused (core/images.py says why), never
fetched or opened. The request's settings bound the bytes of a picture and the pictures of a
request; the pixels are bounded by the tower's resize (adapters/qwen3_5/vision.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.images import ImageError, Picture, check_count, from_url
from core.limits import IMAGE_MAX_BYTES, IMAGE_MAX_COUNT

from .errors import ApiError, bad_request


@dataclass
class Budget:
    max_bytes: int = IMAGE_MAX_BYTES
    max_count: int = IMAGE_MAX_COUNT
    tower: bool = True      # False: the model reads text only, and every picture is refused as such
    seen: int = 0

    @classmethod
    def of(cls, settings, tower: bool = True) -> "Budget":
        if settings is None:
            return cls(tower=tower)
        return cls(settings.image_max_bytes, settings.image_max_count, tower)


def refusal(exc: ImageError, where: str) -> ApiError:
    return bad_request(exc.sentence(), where, code="invalid_image")


def _url(part: dict) -> Any:
    v = part.get("image_url")
    return v.get("url") if isinstance(v, dict) else v   # chat: {"url": ...}; Responses: the string itself


def picture(part: dict, where: str, budget: Budget) -> Picture:
    """An OpenAI `image_url` / Responses `input_image` part -> its Picture (counted against the budget)."""
    from core.chat import NO_TOWER

    budget.seen += 1
    try:
        if not budget.tower:   # said before anything is decoded
            raise ImageError(NO_TOWER)
        check_count(budget.seen, budget.max_count)
        if part.get("type") == "input_image" and part.get("image_url") is None:
            raise ImageError("an input_image needs \"image_url\" with a base64 data: URL; file ids are not "
                             "served here")
        return from_url(_url(part), max_bytes=budget.max_bytes)
    except ImageError as exc:
        raise refusal(exc, where) from None


def anthropic_part(block: dict, where: str) -> dict:
    """An Anthropic `image` block -> the OpenAI part parse_messages decodes (base64 sources only)."""
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64" or not isinstance(source.get("data"), str):
        kind = source.get("type") if isinstance(source, dict) else None
        raise refusal(ImageError(f"an image block's source is {kind!r}: only {{\"type\": \"base64\", \"media_type\", "
                                 "\"data\"}} is accepted; this server never fetches URLs or reads files"), where)
    media = source.get("media_type") if isinstance(source.get("media_type"), str) else "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{source['data']}"}}
