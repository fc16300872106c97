"""Context limits: the one place every caller (chat, race, API, bench) fits a conversation.

Oversized input is refused cheaply: a character budget before anything is tokenised, then a
token budget (prompt + max_tokens <= the context). A conversation over the budget either
loses its oldest turns (the system prompt and the last user message are kept, and the caller
is told how many messages went) or is refused with a message that says how to fix it.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import List, Optional, Sequence

from .chat import chat_prompt, image_text, normalize_messages
from .stream import Prompt

# Text runs at ~3-5 characters a token; 8 leaves room for dense text and still refuses a 1 MB
# message to a 4k-token model before tokenising it.
CHARS_PER_TOKEN = 8

# --- what one request may ask for -------------------------------------------------------------
# Defined here once: the settings' bounds (core/settings.py), the sampler's own check
# (core/sampling.py), the page's panel (webapp/serving/params.py, webapp/ui/) and the API's
# request models (webapp/api/) read them.
MAX_TEMPERATURE = 5.0           # the app's; past it replies are noise
SAMPLER_MAX_TEMPERATURE = 100.0  # the engine's own sanity bound (benchmarks may go past the app's)
MAX_TOKENS = 32768              # one reply
MAX_SEED = 2**64 - 1            # the PRNG key takes any unsigned 64-bit seed (mx.random.key)
MAX_DEPTH = 8                   # draft depth a server may be started with (--max-depth)
MAX_STOPS = 8                   # stop sequences in one request
MAX_STOP_CHARS = 512            # characters of one stop sequence
MAX_TOOLS = 128                 # tools offered in one request
MAX_MESSAGES = 4096             # messages in one request (a 413 past it)
MAX_BODY_BYTES = 4 * 1024 * 1024  # an API request's body, pictures aside (a chat's text limit is the context's)
MAX_LOGPROBS = 20               # alternatives per token (OpenAI's top_logprobs bound)
IMAGE_MAX_BYTES = 20_000_000    # default bytes of one picture (--image-max-bytes)
IMAGE_MAX_COUNT = 4             # default pictures in one request (--image-max-count)


class ContextError(ValueError):
    """The request does not fit the model's context; the message says how to fix it.
    `prompt_tokens` and `window` when the prompt was counted (protocols that report them)."""

    def __init__(self, message: str, prompt_tokens: Optional[int] = None, window: Optional[int] = None):
        super().__init__(message)
        self.prompt_tokens, self.window = prompt_tokens, window


class InputTooLarge(ContextError):
    """Over the character budget: refused before tokenising."""


@dataclass
class FittedPrompt:
    prompt: Prompt
    dropped: int = 0               # oldest messages left out to fit
    notice: Optional[str] = None   # what the user should be told about it

    @property
    def ids(self) -> List[int]:
        return list(self.prompt.ids)


def context_window(adapter, cap: Optional[int] = None) -> int:
    """The model's context in tokens (the adapter's context_length), or `cap` if smaller."""
    n = int(adapter.context_length)
    return min(n, int(cap)) if cap else n


def _chars(m: dict) -> int:
    return len(m["content"]) + (len(json.dumps(m["tool_calls"])) if m.get("tool_calls") else 0)


def _turn_starts(msgs: List[dict], first: int) -> List[int]:
    """Where the history may start after dropping: at a user message, never past the last one."""
    users = [i for i in range(first, len(msgs)) if msgs[i]["role"] == "user"]
    return users[:-1] if users else []


def fit_chat(adapter, messages: Sequence[dict], max_tokens: int, *, trim: bool = True, tools=None,
             enable_thinking: Optional[bool] = None, cap: Optional[int] = None) -> FittedPrompt:
    """Render `messages` for the next reply so that prompt + max_tokens fits the context."""
    window = context_window(adapter, cap)
    if max_tokens >= window:
        raise ContextError(f"max tokens is {max_tokens:,}, but the model's context holds {window:,} tokens "
                           "in all: lower max tokens.")
    msgs = normalize_messages(messages, image_text(adapter))
    budget = (window - max_tokens) * CHARS_PER_TOKEN
    first = 1 if msgs[0]["role"] == "system" else 0
    fixed = sum(_chars(m) for m in msgs[:first]) + (len(json.dumps(tools)) if tools else 0)
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=len(msgs) - 1)
    tail = sum(_chars(m) for m in msgs[last_user:])
    if fixed + tail > budget:
        what = "system prompt and tools" if fixed > budget / 2 else "message"
        raise InputTooLarge(
            f"The {what} is too long: {fixed + tail:,} characters, while this model's context of "
            f"{window:,} tokens holds about {budget:,} characters with max tokens {max_tokens:,}. "
            "Shorten it or split it into several messages"
            + (" or lower max tokens." if fixed + tail <= window * CHARS_PER_TOKEN else "."))

    starts = _turn_starts(msgs, first)

    def render(cut: int) -> Prompt:  # cut: index of the first history message kept
        return chat_prompt(adapter, msgs[:first] + msgs[cut:], tools=tools, enable_thinking=enable_thinking)

    # Characters first: drop whole turns until the text could fit, without tokenising.
    suffix = list(itertools.accumulate(reversed([_chars(m) for m in msgs])))[::-1] + [0]  # chars from i on
    options = [first] + starts
    lo = 0
    while lo < len(options) - 1 and fixed + suffix[options[lo]] > budget:
        lo += 1
    if lo and not trim:
        raise InputTooLarge(f"The conversation is too long for this model's context of {window:,} tokens "
                            f"with max tokens {max_tokens:,}: start a new conversation or shorten it.")
    prompt = render(options[lo])
    if len(prompt.ids) + max_tokens > window:
        if not trim:
            raise ContextError(_too_long(len(prompt.ids), max_tokens, window), len(prompt.ids), window)
        hi = len(options) - 1  # binary search the fewest dropped turns that fit
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            p = render(options[mid])
            if len(p.ids) + max_tokens <= window:
                best, hi = (mid, p), mid - 1
            else:
                lo = mid + 1
        if best is None:
            n = len(render(options[-1]).ids)
            raise ContextError(_too_long(n, max_tokens, window), n, window)
        lo, prompt = best
    dropped = options[lo] - first
    notice = (f"The {dropped} oldest message{'s' if dropped != 1 else ''} did not fit the model's context "
              f"of {window:,} tokens and {'were' if dropped != 1 else 'was'} left out of this reply's prompt."
              if dropped else None)
    return FittedPrompt(prompt, dropped, notice)


def _too_long(prompt_tokens: int, max_tokens: int, window: int) -> str:
    room = window - prompt_tokens
    fix = (f"lower max tokens to {room:,} or shorten the message" if room > 0
           else "shorten the message or the system prompt")
    return (f"The prompt is {prompt_tokens:,} tokens; with max tokens {max_tokens:,} that is more than the "
            f"model's context of {window:,} tokens: {fix}.")
