"""The JSON objects of OpenAI replies (chat and legacy completions, whole and streamed), as
pydantic models.

One reply keeps one ``id`` and ``created`` on every chunk. Extension: ``mtp`` carries the
engine's figures (tokens/s, acceptance, accepted / proposed, depth, time to first token, and
the waterfall: seconds per part of the reply's own compute time); Responses and Anthropic
replies carry the same object. A model is dumped with only the fields it was given
(``exclude_unset``): a chat message has ``tool_calls`` only when it calls tools, as OpenAI's.
"""
from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict

from .text import Delta, join
from .toolcalls import ToolCall

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


def finish_reason(engine_reason: Optional[str], stop_sequence: bool, calls: Sequence[ToolCall]) -> str:
    if calls:
        return "tool_calls"
    if engine_reason == "max_tokens" and not stop_sequence:
        return "length"
    return "stop"          # end of turn, a stop sequence, or a decode cut short


class Shape(BaseModel):
    """A reply object: dumped with the fields it was given (set or assigned), nothing else."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def out(self) -> dict:
        return self.model_dump(exclude_unset=True)


class CachedTokens(Shape):
    cached_tokens: int


class Usage(Shape):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[CachedTokens] = None


class Mtp(Shape):
    """The ``mtp`` extension: what the engine did for this reply. Every field has a default:
    an echo-only completion decodes nothing and carries an empty one."""
    mode: str = "mtp"                             # "mtp" (speculative) or "ar"
    depth: Union[int, str] = "auto"               # asked for: 1..max_depth or "auto"
    depth_used: Optional[int] = None              # what auto chose last
    tokens_per_second: Optional[float] = None
    acceptance: Optional[float] = None            # accepted / proposed (None for AR)
    accepted: int = 0
    proposed: int = 0
    acceptance_per_depth: List[float] = []
    tokens_per_cycle: Optional[float] = None
    cycles: int = 0
    ttft: Optional[float] = None                  # seconds to the first token
    prefill_seconds: Optional[float] = None
    cached_tokens: int = 0                        # prompt tokens the prefix cache served
    prefilled_tokens: Optional[int] = None
    waterfall: Dict[str, float] = {}              # where the time went (core/waterfall.py), in seconds
    compute_seconds: Optional[float] = None       # the lane's own time the waterfall adds up to
    prefill_parts: Dict[str, float] = {}          # the prefill's lookup_s, chunks_s, build_s, snapshots_s, chunks, last_chunk_*, full_chunk_*


def usage(prompt_tokens: int, stats: Optional[dict]) -> dict:
    s = stats or {}
    completion = int(s.get("generated_tokens", 0))
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion, total_tokens=prompt_tokens + completion,
                 prompt_tokens_details=CachedTokens(cached_tokens=int(s.get("cached_tokens") or 0))).out()


def figures(mode: str, depth, stats: Optional[dict]) -> dict:
    """The ``mtp`` extension object."""
    s = stats or {}
    speculative = mode == "mtp" and bool(s.get("proposed"))

    def r(key, nd=4):
        v = s.get(key)
        return round(float(v), nd) if isinstance(v, (int, float)) else None

    return Mtp(mode=mode, depth=depth, depth_used=s.get("depth"), tokens_per_second=r("tokens_per_second", 2),
               acceptance=r("acceptance_rate") if speculative else None,
               accepted=int(s.get("accepted", 0)), proposed=int(s.get("proposed", 0)),
               acceptance_per_depth=[round(a, 4) for a in s.get("acceptance_per_depth") or []],
               tokens_per_cycle=r("tokens_per_cycle", 3), cycles=int(s.get("cycles", 0)),
               ttft=r("time_to_first_token"), prefill_seconds=r("prefill_seconds"),
               cached_tokens=int(s.get("cached_tokens") or 0), prefilled_tokens=s.get("prefilled_tokens"),
               waterfall={k: round(float(v), 6) for k, v in (s.get("waterfall") or {}).items()},
               compute_seconds=r("compute_seconds", 6),
               prefill_parts={k: round(float(v), 6) for k, v in (s.get("prefill_parts") or {}).items()}).out()


class ChatMessage(Shape):
    role: str = "assistant"
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[List[dict]] = None


class Choice(Shape):
    """A choice of a whole reply (``message`` for chat, ``text`` for legacy completions) or of a
    chunk (``delta`` for chat, ``text``)."""
    index: int = 0
    message: Optional[ChatMessage] = None
    delta: Optional[dict] = None
    text: Optional[str] = None
    logprobs: Optional[dict] = None
    finish_reason: Optional[str] = None


class Completion(Shape):
    """A whole reply or one chunk of a streamed one."""
    id: str
    object: str
    created: int
    model: str
    choices: List[Choice]
    usage: Optional[Usage] = None
    mtp: Optional[Mtp] = None


@dataclass
class Reply:
    """The fixed parts of one reply; ``kind`` is "chat" or "text" (legacy completions)."""

    kind: str
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        if not self.id:
            self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + secrets.token_hex(12)

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    # --- streamed ---------------------------------------------------------------------
    def chunk(self, choice_part: dict, finish: Optional[str] = None, logprobs: Optional[dict] = None,
              **extra) -> dict:
        head = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        choice = Choice(index=0, **choice_part, logprobs=logprobs, finish_reason=finish)
        return Completion(**head, choices=[choice], **extra).out()

    def role_chunk(self) -> dict:
        return self.chunk({"delta": {"role": "assistant"}})

    def delta_chunk(self, delta: Delta, logprobs: Optional[dict] = None) -> dict:
        kind, text = delta
        if self.kind == "text":
            return self.chunk({"text": text}, logprobs=logprobs)
        return self.chunk({"delta": {"reasoning_content" if kind == "reasoning" else "content": text}},
                          logprobs=logprobs)

    def calls_chunk(self, calls: Sequence[ToolCall]) -> dict:
        return self.chunk({"delta": {"tool_calls": [c.as_openai(i) for i, c in enumerate(calls)]}})

    def finish_chunk(self, finish: str, mtp: dict, logprobs: Optional[dict] = None) -> dict:
        return self.chunk({"delta": {}} if self.kind == "chat" else {"text": ""}, finish, logprobs, mtp=mtp)

    def usage_chunk(self, use: dict, mtp: dict) -> dict:
        head = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        return Completion(**head, choices=[], usage=use, mtp=mtp).out()

    # --- whole --------------------------------------------------------------------------
    def whole(self, deltas: List[Delta], calls: Sequence[ToolCall], finish: str, use: dict, mtp: dict,
              logprobs: Optional[dict] = None, echo: str = "") -> dict:
        content, reasoning = join(deltas)
        if self.kind == "text":
            choice = Choice(index=0, text=echo + content, logprobs=logprobs, finish_reason=finish)
        else:
            message = ChatMessage(role="assistant", content=content if (content or not calls) else None)
            if reasoning:
                message.reasoning_content = reasoning
            if calls:
                message.tool_calls = [c.as_openai() for c in calls]
            choice = Choice(index=0, message=message, logprobs=logprobs, finish_reason=finish)
        return Completion(**self._head(self.object), choices=[choice], usage=use, mtp=mtp).out()


# --- logprobs (core.TokenLogprob lists -> OpenAI's two shapes) -----------------------------
def _entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(lps: Sequence, token_text) -> Optional[dict]:
    """Chat's ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}``."""
    if not lps:
        return None
    return {"content": [{**_entry(token_text(lp.token), lp.logprob),
                         "top_logprobs": [_entry(token_text(t), v) for t, v in lp.top]} for lp in lps],
            "refusal": None}


def completion_logprobs(lps: Sequence, token_text, offset: int = 0) -> Optional[dict]:
    """Legacy completions' ``{tokens, token_logprobs, top_logprobs, text_offset}``; an entry
    may be None (the first prompt token of an echo has no logprob)."""
    if not lps:
        return None
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp, tok in lps:
        text = token_text(tok)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        out["token_logprobs"].append(None if lp is None else lp.logprob)
        out["top_logprobs"].append(None if lp is None else {token_text(t): v for t, v in lp.top})
    return out
