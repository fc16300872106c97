"""Pictures for the vision tests: random pixels as PNG bytes, and a tiny Qwen3.5 vision-language
checkpoint (scripts/checkpoints/tiny_vision.py: tower + trunk + MTP head in the published layout)."""
import base64
import io

import numpy as np

from core.images import decode

VL = dict(bits=None, frequent_tokens=0, logit_std=2.0, residual_gain=0.7, norm_std=0.05, seed=0, layout="hf",
          vision={})


def png(seed: int, width: int = 80, height: int = 96) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def picture(seed: int, **size):
    return decode(png(seed, **size), max_bytes=10**7)


def data_url(seed: int, **size) -> str:
    return "data:image/png;base64," + base64.b64encode(png(seed, **size)).decode()


def image_message(pic, text: str = "What is in the picture?") -> dict:
    return {"role": "user", "content": [{"type": "image", "picture": pic}, {"type": "text", "text": text}]}
