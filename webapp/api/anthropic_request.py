"""Anthropic's Messages request (``POST /v1/messages``, ``/v1/messages/count_tokens``) as a
pydantic model -> the same :class:`ApiRequest` as a chat completion.

The model checks the fields' JSON types (fields.py); ``system`` and the content blocks
(``text``, ``image``, ``tool_use``, ``tool_result``, ``thinking``) become OpenAI-shaped chat
messages here and then pass the chat completions' checks (messages.py). ``tools`` take
``input_schema``; ``tool_choice`` ``any`` and ``tool`` force a call through the grammar, ``none``
drops the tools; ``thinking`` is the template's switch (the budget is not enforced);
``output_config.format`` asks for JSON through the grammar.
"""
from __future__ import annotations

import json
from typing import Any, List, Optional

from pydantic import ValidationInfo, model_validator

from core.limits import MAX_TOOLS

from ..serving.inputs import clean_text
from .errors import bad_request
from .fields import Flag, Sampled, Stops, Whole, fail, text, validate
from .images import anthropic_part
from .messages import forced_tool, function_tool, parse_messages
from .request import ApiRequest, set_grammars, run_params
from .structured import response_format


class MessagesRequest(Sampled):
    model: Any = None                          # required here (the id from GET /v1/models)
    messages: Any = None                       # content blocks, checked below and in messages.py
    system: Any = None
    max_tokens: Whole = None                   # required, but for count_tokens
    stop_sequences: Stops = ()
    stream: Flag = None
    tools: Any = None
    tool_choice: Any = None
    thinking: Any = None
    output_config: Any = None
    # Hints that change nothing here (prompt caching is automatic; effort, speed, region and
    # diagnostics have no meaning for one local model).
    cache_control: Any = None
    context_management: Any = None
    inference_geo: Any = None
    speed: Any = None
    diagnostics: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    @model_validator(mode="after")
    def _required(self, info: ValidationInfo):
        if not isinstance(self.model, str):
            raise fail("'model' is required: the id from GET /v1/models.", "model")
        if self.max_tokens is None and not (info.context or {}).get("count_only"):
            raise fail("'max_tokens' is required: the most tokens the reply may have.", "max_tokens")
        return self


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
        out.append(text(b.get("text"), f"{where}[{j}].text", where))
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
                msg["content"] += text(b.get("text"), f"{where}[{j}].text", where)
            elif b["type"] == "thinking":
                msg["reasoning_content"] = msg.get("reasoning_content", "") + text(
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


def parse_tools(tools: Any, choice: Any) -> tuple:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is not None and kind not in ("auto", "any", "tool", "none"):
        raise bad_request("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}.", "tool_choice")
    if tools in (None, []) or kind == "none":
        if kind in ("any", "tool"):
            raise bad_request("'tool_choice' asks for a tool call but no tools were given.", "tool_choice")
        return None, None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"'tools' must be a list of at most {MAX_TOOLS} tools.", "tools")
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
    m = validate(MessagesRequest, body, max_depth=max_depth, count_only=count_only)   # count_tokens checks the same
    req = ApiRequest(params=run_params(m, settings, max_depth, max_tokens_default, m.max_tokens), mode=m.mode,
                     stream=bool(m.stream), model=m.model, stops=m.stop_sequences)
    req.messages = to_chat(m.messages, m.system, settings, pictures)
    req.tools, forced = parse_tools(m.tools, m.tool_choice)
    set_grammars(req, output_format(m.output_config), forced)
    req.enable_thinking = parse_thinking(m.thinking)
    return req
