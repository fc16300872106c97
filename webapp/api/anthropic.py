"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``): Claude Code and the
``anthropic`` SDK speak it.

A request becomes the same :class:`ApiRequest` as a chat completion (the checkpoint's chat
template renders it; the same sampler, model thread and prefix cache serve it): ``system``
(a string or text blocks), ``text`` / ``tool_use`` / ``tool_result`` / ``thinking`` blocks,
``tools`` with ``input_schema``, ``tool_choice`` (``auto``, ``any`` and ``tool`` force a call
through the grammar, ``none`` drops the tools), ``stop_sequences``, ``max_tokens``,
``temperature``, ``top_p``, ``top_k`` (older clients send them), ``thinking`` (on/off: the
template's switch; the budget is not enforced), ``output_config.format`` (JSON through the
grammar). The reply is written as Anthropic's message or its event stream
(``message_start``, ``content_block_*`` with ``thinking_delta``, ``text_delta`` and
``input_json_delta``, ``message_delta`` with ``stop_reason`` and ``usage``, ``message_stop``,
``ping`` while waiting). Errors come in Anthropic's shape, ``{"type": "error", "error": {...}}``.
"""
from __future__ import annotations

import json
import secrets
from typing import Any, AsyncIterator, List, Optional

from .errors import ApiError, bad_request
from .images import anthropic_part
from .request import (ApiRequest, _string, check_fields, forced_tool, function_tool, parse_messages,
                          parse_sampling, parse_stops, _bool)
from .run import Ending, KeepAlive, Run, Whole
from .text import join
from ..serving.inputs import clean_text

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
         503: "overloaded_error"}
# Hints that change nothing here (prompt caching is automatic; effort, speed, region and
# diagnostics have no meaning for one local model).
HINTS = {"metadata", "service_tier", "cache_control", "context_management", "inference_geo", "speed", "diagnostics",
         "user_profile_id", "workspace_id"}
FIELDS = HINTS | {"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p",
                  "top_k", "tools", "tool_choice", "thinking", "output_config",
                  "mode", "depth", "min_p", "seed"}                 # the last four: this server's extensions
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


# --- requests -----------------------------------------------------------------------------
def _blocks(content: Any, where: str) -> List[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content blocks.", where)
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise bad_request(f"{where}[{j}] must be a content block like {{\"type\": \"text\", \"text\": ...}}.",
                              where)
    return content


def _text(content: Any, where: str) -> str:
    """Text blocks (or a string) -> their text; anything else is refused."""
    out = []
    for j, b in enumerate(_blocks(content, where)):
        if b["type"] != "text":
            raise bad_request(f"{where}[{j}] has type {json.dumps(b['type'])[:30]}: this model reads text only.",
                              where, code="unsupported_content")
        out.append(_string(b.get("text"), f"{where}[{j}].text", where))
    return "".join(out)


def _billing(block: Any) -> bool:
    """Claude Code's first system block, ``x-anthropic-billing-header: cc_version=...;``: a
    header for Anthropic's billing that its API strips. Its version suffix changes with the
    conversation's first message, so rendered into the prompt it would keep the prefix cache
    from reusing the system prompt and tools across sessions; it tells the model nothing."""
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str) \
        and block["text"].startswith("x-anthropic-billing-header:")


def to_chat(messages: Any, system: Any, settings=None, pictures: bool = True) -> List[dict]:
    """Anthropic's messages -> the OpenAI-shaped messages the chat template renders."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects.", "messages")
    if isinstance(system, list):
        system = [b for b in system if not _billing(b)]
    out = [{"role": "system", "content": _text(system, "system")}] if system not in (None, "", []) else []
    for i, m in enumerate(messages):
        where = f"messages[{i}].content"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise bad_request(f"messages[{i}].role must be \"user\", \"assistant\" or \"system\".",
                              f"messages[{i}].role")
        if m.get("content") is None:
            raise bad_request(f"{where} is missing: each message needs its content.", where)
        if m["role"] == "system":        # Claude Code's mid-conversation system (beta mid-conversation-system)
            out.append({"role": "system", "content": _text(m["content"], where)})
            continue
        if m["role"] == "user":
            parts = []
            for j, b in enumerate(_blocks(m["content"], where)):
                if b["type"] == "tool_result":
                    result = b.get("content", "")
                    result = _text(result, f"{where}[{j}].content") if result else ""
                    out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
                                "content": ("Error: " + result) if b.get("is_error") is True else result})
                elif b["type"] == "image":   # base64 only, decoded by parse_messages below
                    parts.append(anthropic_part(b, f"{where}[{j}]"))
                else:
                    parts.append({"type": "text", "text": _text([b], where)})
            if parts or not out or out[-1]["role"] != "tool":
                out.append({"role": "user", "content": parts})
            continue
        msg = {"role": "assistant", "content": ""}
        for j, b in enumerate(_blocks(m["content"], where)):
            if b["type"] == "text":
                msg["content"] += _string(b.get("text"), f"{where}[{j}].text", where)
            elif b["type"] == "thinking":
                msg["reasoning_content"] = msg.get("reasoning_content", "") + _string(
                    b.get("thinking"), f"{where}[{j}].thinking", where)
            elif b["type"] == "redacted_thinking":
                continue
            elif b["type"] == "tool_use":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                    raise bad_request(f"{where}[{j}]: a tool_use block needs a \"name\" and an \"input\" object.",
                                      where)
                msg.setdefault("tool_calls", []).append(
                    {"type": "function", "id": str(b.get("id", "")),
                     "function": {"name": clean_text(b["name"]), "arguments": b.get("input", {})}})
            else:
                raise bad_request(f"{where}[{j}] has type {json.dumps(b['type'])[:30]}: an assistant message holds "
                                  f"text, thinking and tool_use blocks.", where, code="unsupported_content")
        out.append(msg)
    return parse_messages(out, settings, pictures)   # the chat completions checks, once more, on the result


def parse_tools(body: dict) -> tuple:
    tools, choice = body.get("tools"), body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is not None and kind not in ("auto", "any", "tool", "none"):
        raise bad_request("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}.", "tool_choice")
    if tools in (None, []) or kind == "none":
        if kind in ("any", "tool"):
            raise bad_request("'tool_choice' asks for a tool call but no tools were given.", "tool_choice")
        return None, None
    if not isinstance(tools, list) or len(tools) > 128:
        raise bad_request("'tools' must be a list of at most 128 tools.", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            kind_of = t.get("type") if isinstance(t, dict) else t
            raise bad_request(f"tools[{i}] has type {json.dumps(kind_of)[:40]}: only your own tools (name, "
                              f"description, input_schema) are supported, not server tools.", "tools",
                              code="unsupported_tool")
        out.append(function_tool(t.get("name"), t.get("description"), t.get("input_schema", {}), i))
    if kind == "tool":
        return out, forced_tool({"type": "function", "name": choice.get("name")}, out)
    return out, forced_tool("required" if kind == "any" else None, out)


def parse_thinking(v: Any) -> Optional[bool]:
    if v is None:
        return None
    kind = v.get("type") if isinstance(v, dict) else None
    if kind not in ("enabled", "disabled", "adaptive", "between_tools"):
        raise bad_request("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or "
                          "{\"type\": \"disabled\"}.", "thinking")
    return kind != "disabled"


def output_format(config: Any) -> Optional[str]:
    """``output_config.format`` ``{"type": "json_schema", "schema": {...}}``: structured output."""
    from .structured import response_format

    if config is None:
        return None
    if not isinstance(config, dict):
        raise bad_request("'output_config' must be an object like {\"format\": {\"type\": \"json_schema\", "
                          "\"schema\": {...}}}.", "output_config")
    fmt = config.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"):
        raise bad_request("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}.",
                          "output_config.format")
    return response_format(fmt, "output_config.format", flat=True)


def parse_messages_request(body: dict, settings, max_depth: int, max_tokens_default: int,
                           count_only: bool = False, pictures: bool = True) -> ApiRequest:
    from .request import one_grammar

    check_fields(body, FIELDS)           # count_tokens takes (and checks) what a message takes
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("'model' is required: the id from GET /v1/models.", "model")
    if body.get("max_tokens") is None and not count_only:
        raise bad_request("'max_tokens' is required: the most tokens the reply may have.", "max_tokens")
    params, mode = parse_sampling(body, settings, max_depth, max_tokens_default)
    req = ApiRequest(params=params, mode=mode, stream=bool(_bool(body, "stream")), model=model,
                     stops=parse_stops({"stop": body.get("stop_sequences")}))
    req.messages = to_chat(body.get("messages"), body.get("system"), settings, pictures)
    req.tools, forced = parse_tools(body)
    req.grammar = one_grammar(output_format(body.get("output_config")), forced)
    req.enable_thinking = parse_thinking(body.get("thinking"))
    return req


# --- replies -------------------------------------------------------------------------------
def _usage(use: dict) -> dict:
    cached = use["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": use["prompt_tokens"] - cached, "output_tokens": use["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode("utf-8")


class MessageWriter:
    def __init__(self, model: str, prompt_tokens: int, clamped: bool = False):
        self.model, self.prompt_tokens = model, prompt_tokens
        self.clamped = clamped          # max_tokens was lowered to the context's room (api.prompt)
        self.id = "msg_" + secrets.token_hex(12)

    def _message(self, content: list, stop_reason, stop_sequence, use: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": use}

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
        return {**self._message(blocks, self.stop_reason(e), e.stop_sequence if not e.calls else None,
                                _usage(e.usage)), "mtp": e.mtp}

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
