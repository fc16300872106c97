"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``): Claude Code and the
``anthropic`` SDK speak it.

A request (anthropic_request.py) becomes the same :class:`ApiRequest` as a chat completion:
the checkpoint's chat template renders it; the same sampler, model thread and prefix cache
serve it. The reply is written as Anthropic's message or its event stream
(``message_start``, ``content_block_*`` with ``thinking_delta``, ``text_delta`` and
``input_json_delta``, ``message_delta`` with ``stop_reason`` and ``usage``, ``message_stop``,
``ping`` while waiting). Errors come in Anthropic's shape, ``{"type": "error", "error": {...}}``.
"""
from __future__ import annotations

import json
import secrets
from typing import AsyncIterator, List, Optional

from .errors import ApiError
from .format import Mtp, Shape
from .run import Ending, KeepAlive, Run, Whole
from .text import join

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
         503: "overloaded_error"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_error(exc: ApiError) -> dict:
    return {"type": "error", "error": {"type": TYPES.get(exc.status, "invalid_request_error"),
                                       "message": exc.message}}


def context_refusal(exc: ApiError) -> ApiError:
    """A prompt over the context in Anthropic's words: a 400 whose message starts "prompt is
    too long: N tokens > M maximum" (Claude Code reads those numbers to compact the
    conversation; a 413 would tell it the body is over 32 MB)."""
    if exc.code not in ("context_length_exceeded", "input_too_large"):
        return exc
    tokens = getattr(exc, "tokens", None)
    head = f"prompt is too long: {tokens[0]} tokens > {tokens[1] - 1} maximum" if tokens else "prompt is too long"
    return ApiError(400, f"{head}. {exc.message}", param=exc.param, code=exc.code)


def count_body(tokens: int) -> dict:
    return {"input_tokens": tokens}


# --- replies -------------------------------------------------------------------------------
class Usage(Shape):
    input_tokens: int                  # not read from the prefix cache
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int = 0


class Message(Shape):
    """A whole reply (and, empty, the start of a streamed one)."""
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: List[dict]                # thinking, text and tool_use blocks
    stop_reason: Optional[str]
    stop_sequence: Optional[str]
    usage: Usage
    mtp: Optional[Mtp] = None          # this server's extension (format.Mtp)


def _usage(use: dict) -> dict:
    cached = use["prompt_tokens_details"]["cached_tokens"]
    return Usage(input_tokens=use["prompt_tokens"] - cached, output_tokens=use["completion_tokens"],
                 cache_read_input_tokens=cached, cache_creation_input_tokens=0).out()


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode("utf-8")


class MessageWriter:
    def __init__(self, model: str, prompt_tokens: int, clamped: bool = False):
        self.model, self.prompt_tokens = model, prompt_tokens
        self.clamped = clamped          # max_tokens was lowered to the context's room (api.prompt)
        self.id = "msg_" + secrets.token_hex(12)

    def _message(self, content: list, stop_reason, stop_sequence, use: dict, **mtp) -> dict:
        return Message(id=self.id, type="message", role="assistant", model=self.model, content=content,
                       stop_reason=stop_reason, stop_sequence=stop_sequence, usage=use, **mtp).out()

    def stop_reason(self, e: Ending) -> str:
        if e.stop_sequence and not e.calls:
            return "stop_sequence"
        if e.finish == "length" and self.clamped:
            return "model_context_window_exceeded"
        return STOP_REASONS.get(e.finish, "end_turn")

    @staticmethod
    def tool_uses(e: Ending) -> List[dict]:
        return [{"type": "tool_use", "id": "toolu_" + c.id.split("_", 1)[-1], "name": c.name,
                 "input": json.loads(c.arguments)} for c in e.calls]

    def whole(self, w: Whole) -> dict:
        e = w.ending
        content, reasoning = join(w.deltas)
        blocks = ([{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []) \
            + ([{"type": "text", "text": content}] if content or not (e.calls or reasoning) else []) + self.tool_uses(e)
        return self._message(blocks, self.stop_reason(e), e.stop_sequence if not e.calls else None,
                             _usage(e.usage), mtp=e.mtp)

    async def stream(self, run: Run, keepalive: float) -> AsyncIterator[bytes]:
        start_use = {"input_tokens": self.prompt_tokens, "output_tokens": 0, "cache_read_input_tokens": 0,
                     "cache_creation_input_tokens": 0}
        yield _event("message_start", {"type": "message_start", "message": self._message([], None, None, start_use)})
        yield _event("ping", {"type": "ping"})
        blocks = _Blocks()
        keep, ending = KeepAlive(keepalive), None
        try:
            async for ev in run.events():
                if ev is None:
                    if keep.due():
                        yield _event("ping", {"type": "ping"})
                elif isinstance(ev, Ending):
                    ending = ev
                else:
                    keep.sent()
                    for chunk in blocks.delta(*ev):
                        yield chunk
        except ApiError as exc:
            yield _event("error", anthropic_error(exc))
            return
        except Exception as exc:   # noqa: BLE001 - the engine failed: say so in the stream
            yield _event("error", anthropic_error(ApiError(500, f"The decode failed: {type(exc).__name__}: {exc}")))
            return
        for delta in ending.deltas:
            for chunk in blocks.delta(*delta):
                yield chunk
        if not blocks.count and not ending.calls:
            for chunk in blocks.delta("content", ""):       # an empty reply still has its text block
                yield chunk
        for chunk in blocks.close():
            yield chunk
        for use in self.tool_uses(ending):
            i = blocks.count
            blocks.count += 1
            yield _event("content_block_start", {"type": "content_block_start", "index": i,
                                                 "content_block": {**use, "input": {}}})
            yield _event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(use["input"], ensure_ascii=False)}})
            yield _event("content_block_stop", {"type": "content_block_stop", "index": i})
        yield _event("message_delta", {"type": "message_delta", "delta": {
            "stop_reason": self.stop_reason(ending), "stop_sequence": ending.stop_sequence if not ending.calls else None},
            "usage": _usage(ending.usage), "mtp": ending.mtp})
        yield _event("message_stop", {"type": "message_stop"})


class _Blocks:
    """Thinking and text deltas -> content blocks, one open at a time."""

    def __init__(self):
        self.count, self.open = 0, None        # blocks started; the kind of the open one

    def delta(self, kind: str, text: str) -> List[bytes]:
        out = []
        if kind != self.open:
            out += self.close()
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "reasoning" else \
                {"type": "text", "text": ""}
            out.append(_event("content_block_start", {"type": "content_block_start", "index": self.count,
                                                      "content_block": block}))
            self.open = kind
            self.count += 1
        if text:
            delta = {"type": "thinking_delta", "thinking": text} if kind == "reasoning" else \
                {"type": "text_delta", "text": text}
            out.append(_event("content_block_delta", {"type": "content_block_delta", "index": self.count - 1,
                                                      "delta": delta}))
        return out

    def close(self) -> List[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "reasoning":
            out.append(_event("content_block_delta", {"type": "content_block_delta", "index": self.count - 1,
                                                      "delta": {"type": "signature_delta", "signature": ""}}))
        out.append(_event("content_block_stop", {"type": "content_block_stop", "index": self.count - 1}))
        self.open = None
        return out
