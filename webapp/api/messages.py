"""Chat messages and tools as a client sends them -> as the checkpoint's chat template takes them.

OpenAI's chat shape is the common one: Responses' input items and Anthropic's messages are
turned into it (responses_request.py, anthropic_request.py) and pass these same checks. A
message's text is cleaned (lone surrogates and NULs replaced), its pictures decoded here, at
the edge, against the request's budget (images.py): base64 only, never a URL or a path.
Messages are checked here rather than as nested pydantic models because each refusal names
the message and part it is about (messages[2].content[1]) in words a client can act on.
"""
from __future__ import annotations

import json
from typing import Any, List, Optional, Tuple

from core.images import Picture
from core.limits import MAX_MESSAGES, MAX_TOOLS

from ..serving.inputs import clean_text
from .errors import ApiError, bad_request
from .fields import text
from .images import Budget, picture
from .structured import tool_call_grammar

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _content(v: Any, i: int, role: str, budget=None):
    """A message's content: its text, or (when it holds pictures) a list of text and image blocks."""
    where = f"messages[{i}].content"
    if v is None:
        return ""
    if isinstance(v, str):
        return clean_text(v)
    if not isinstance(v, list):
        raise bad_request(f"{where} must be a string or a list of text and image_url parts.", where)
    out = []
    for j, part in enumerate(v):
        if not isinstance(part, dict):
            raise bad_request(f"{where}[{j}] must be an object like {{\"type\": \"text\", \"text\": ...}}.", where)
        kind = part.get("type")
        if kind in ("image_url", "input_image") and role == "user":
            out.append({"type": "image", "picture": picture(part, where, budget or Budget())})
        elif kind == "image" and isinstance(part.get("picture"), Picture):   # parsed before (a stored turn)
            out.append(part)
        elif kind != "text":
            raise bad_request(f"{where}[{j}] has type {json.dumps(kind)[:30]}: a {role} message holds parts of "
                              "type \"text\"" + (" and \"image_url\" (base64 data: URLs)" if role == "user" else "")
                              + ".", where, code="unsupported_content")
        else:
            out.append({"type": "text", "text": text(part.get("text"), f"{where}[{j}].text", where)})
    if all(b["type"] == "text" for b in out):
        return "".join(b["text"] for b in out)
    return out


def _tool_calls(v: Any, i: int) -> List[dict]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(v, list):
        raise bad_request(f"{where} must be a list.", where)
    out = []
    for call in v:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}: each call needs function.name and function.arguments.", where)
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass                        # the template writes a string as it is
        out.append({"type": "function", "id": str(call.get("id", "")),
                    "function": {"name": clean_text(fn["name"]), "arguments": args}})
    return out


def parse_messages(v: Any, settings=None, pictures: bool = True) -> List[dict]:
    """Chat messages, checked; `pictures` False: the model has no vision tower (pictures refused)."""
    budget = Budget.of(settings, pictures)
    if not isinstance(v, list) or not v:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects.", "messages")
    if len(v) > MAX_MESSAGES:
        raise ApiError(413, f"Too many messages ({len(v)}; at most {MAX_MESSAGES}).", param="messages",
                       code="context_length_exceeded")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object.", "messages")
        role = ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
        if role is None:
            raise bad_request(f"messages[{i}].role must be one of system, developer, user, assistant, tool; "
                              f"got {json.dumps(m.get('role'))[:30]}.", "messages")
        if m.get("content") is None and role != "assistant":   # only an assistant's tool calls stand alone
            raise bad_request(f"messages[{i}].content is missing: a {m['role']} message needs its text in "
                              f"\"content\".", f"messages[{i}].content")
        msg = {"role": role, "content": _content(m.get("content"), i, role, budget)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = clean_text(m["reasoning_content"])
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def parse_tools(tools: Any, choice: Any) -> Tuple[Optional[List[dict]], Optional[str]]:
    """(the tools for the template, the grammar of a forced call: tool_choice "required" or a
    named function)."""
    if choice == "none" or tools is None or tools == []:
        if choice not in (None, "auto", "none"):
            raise bad_request("'tool_choice' asks for a tool call but no tools were given.", "tool_choice")
        return None, None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"'tools' must be a list of at most {MAX_TOOLS} function tools.", "tools")
    out = []
    for i, t in enumerate(tools):
        flat = isinstance(t, dict) and t.get("type") == "function" and "function" not in t   # Responses' shape
        fn = t if flat else (t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                              f"\"parameters\": {{...}}}}}}.", "tools")
        out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters", {}), i))
    return out, forced_tool(choice, out)


def function_tool(name: Any, description: Any, params: Any, i: int) -> dict:
    """One tool as the chat template takes it (OpenAI's chat shape)."""
    if not isinstance(name, str) or not name.strip():
        raise bad_request(f"tools[{i}] needs a non-empty \"name\".", "tools")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise bad_request(f"tools[{i}]: the parameters must be a JSON schema object.", "tools")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"tools[{i}]: the description must be a string.", "tools")
    clean = {"name": clean_text(name), "parameters": params}
    if description:
        clean["description"] = clean_text(description)
    return {"type": "function", "function": clean}


def forced_tool(choice: Any, tools: List[dict], required: str = "required") -> Optional[str]:
    """The grammar for tool_choice (None when the model may answer in text)."""
    if choice in (None, "auto"):
        return None
    if choice == required:
        return tool_call_grammar(tools)
    name = None
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function") if isinstance(choice.get("function"), dict) else choice   # chat or Responses
        name = fn.get("name")
    if not isinstance(name, str):
        raise bad_request(f"'tool_choice' must be \"auto\", \"none\", \"{required}\" or "
                          f"{{\"type\": \"function\", \"name\": ...}}; got {json.dumps(choice)[:60]}.", "tool_choice")
    if name not in [t["function"]["name"] for t in tools]:
        raise bad_request(f"'tool_choice' names the function '{name[:60]}', which is not among the tools.",
                          "tool_choice")
    return tool_call_grammar(tools, name)
