"""The AR speed the chat compares an MTP reply with, like with like.

A decode's tok/s depends on the sampler (top-k / top-p sort work; greedy skips it), on the
context (attention over it) and on the reply's length (the first cycles cost more, and a short
reply is mostly them; a long one attends over more of itself). One running average of every AR
decode compared replies with whatever came before: under the first chat reply the stats line said
"≈0.55× vs AR" against the warm-up's short greeting. So references are kept per sampler, prompt
length bucket (core.costs' 64 * 4^k tokens) and reply length bucket (32-63, 64-127, ... tokens),
only from AR decodes of at least SHORT_REPLY_TOKENS tokens (chat AR replies, race AR lanes, the
warm-up), and a reply is compared only with the reference of its own sampler and buckets, and
only when it is that long itself.
"""
from __future__ import annotations

import statistics
import threading
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Optional, Tuple

# Under this many tokens a reply's speed is mostly its first cycle and which few drafts happened
# to be accepted: single races on the demo's 14-40-token replies ranged 0.77-1.41x on prompts
# whose paired benchmark said 1.13x. The race and the chat say so instead of showing a result.
SHORT_REPLY_TOKENS = 32

KEEP = 5   # the reference is the median of the last KEEP AR decodes of its sampler and bucket


@dataclass(frozen=True)
class Reference:
    tokens_per_second: float   # median of the recent AR decodes
    decodes: int               # how many
    context: str               # the prompt lengths of its bucket, for the label ("up to ~128 tokens")
    reply: str = ""            # the reply lengths of its bucket, for the label ("64-127 tokens")


def bucket(prompt_tokens: int) -> int:
    from core.costs import context_bucket   # core imports mlx: not at import time

    return context_bucket(prompt_tokens)


def bucket_label(b: int) -> str:
    return "up to ~128 tokens" if b <= 64 else f"~{b // 2:,}-{2 * b:,} tokens"


def reply_bucket(tokens: int) -> int:
    """The reply length's bucket: SHORT_REPLY_TOKENS * 2^k up to twice that (32-63, 64-127, ...)."""
    b = SHORT_REPLY_TOKENS
    while tokens >= 2 * b:
        b *= 2
    return b


def reply_label(b: int) -> str:
    return f"{b:,}-{2 * b - 1:,} tokens"


class ArReferences:
    def __init__(self):
        self._runs: Dict[Tuple, Deque[float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(params, prompt_tokens: int, reply_tokens: int) -> Tuple:
        return (float(params.temperature), float(params.top_p), int(params.top_k), float(params.min_p),
                bucket(prompt_tokens), reply_bucket(reply_tokens))

    def note(self, params, prompt_tokens: int, tokens_per_second: float, tokens: int) -> None:
        """Keep an AR decode's speed if it is long enough to mean something."""
        if tokens < SHORT_REPLY_TOKENS or not tokens_per_second or tokens_per_second <= 0:
            return
        with self._lock:
            self._runs.setdefault(self.key(params, prompt_tokens, tokens),
                                  deque(maxlen=KEEP)).append(float(tokens_per_second))

    def get(self, params, prompt_tokens: int, reply_tokens: int) -> Optional[Reference]:
        """The reference for a reply of `reply_tokens` tokens to a prompt of `prompt_tokens`."""
        k = self.key(params, prompt_tokens, reply_tokens)
        with self._lock:
            runs = list(self._runs.get(k, ()))
        if not runs:
            return None
        return Reference(statistics.median(runs), len(runs), bucket_label(k[-2]), reply_label(k[-1]))
