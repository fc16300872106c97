"""OpenAI Responses' request (``POST /v1/responses``) as a pydantic model -> an :class:`ApiRequest`.

``input`` (a string or items: ``message``, ``function_call``, ``function_call_output``,
``reasoning``) and ``instructions`` become chat messages for the checkpoint's template and pass
the chat completions' checks (messages.py); flat function ``tools`` (a ``namespace`` tool's
functions one by one), ``tool_choice``, ``max_output_tokens`` and ``text.format`` (JSON through
the grammar) are honoured; ``previous_response_id`` brings back a stored conversation
(responses_store.py).
"""
from __future__ import annotations

import json
from typing import Any, List, Optional

from pydantic import BeforeValidator, field_validator
from typing_extensions import Annotated

from ..serving.inputs import clean_text
from .errors import ApiError, bad_request
from .fields import Flag, Sampled, Text, Whole, fail, text, validate
from .messages import parse_messages, parse_tools
from .request import ApiRequest, set_grammars, run_params
from .responses_store import ResponseStore
from .structured import response_format

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
# Tools OpenAI's servers run themselves: this server cannot, so the model is not offered them.
HOSTED = {"web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
          "image_generation", "mcp", "local_shell", "tool_search"}
NS = "."        # a namespace's function is shown to the model as "namespace.name"


def _text_options(v: Any) -> Optional[dict]:
    if v is not None and not isinstance(v, dict):
        raise fail("'text' must be an object like {\"format\": {\"type\": \"json_schema\", ...}}.", "text")
    return v


def _reasoning(v: Any) -> Optional[dict]:
    effort = v.get("effort") if isinstance(v, dict) else None
    if (v is not None and not isinstance(v, dict)) or (effort is not None and not isinstance(effort, str)):
        raise fail("'reasoning' must be an object like {\"effort\": \"none\"} (none/minimal turn thinking off).",
                   "reasoning")
    return v


class ResponsesRequest(Sampled):
    input: Any = None                          # items, turned into chat messages below
    instructions: Text = None
    previous_response_id: Text = None
    store: Flag = None                         # keep this conversation for previous_response_id (default: yes)
    max_output_tokens: Whole = None
    stream: Flag = None
    tools: Any = None
    tool_choice: Any = None
    text: Annotated[Optional[dict], BeforeValidator(_text_options)] = None
    reasoning: Annotated[Optional[dict], BeforeValidator(_reasoning)] = None
    include: Any = None
    truncation: Any = None
    client_metadata: Any = None                # labels (Codex sends client_metadata with every turn)
    prompt_cache_retention: Any = None

    @field_validator("tool_choice")
    @classmethod
    def _not_hosted(cls, choice: Any) -> Any:
        if isinstance(choice, dict) and choice.get("type") in HOSTED:
            raise fail(f"'tool_choice' asks for the hosted tool {json.dumps(choice['type'])}, which this server "
                       f"cannot run: only your own function tools are run (by you).", "tool_choice",
                       code="unsupported_tool")
        return choice

    def thinking(self) -> Optional[bool]:
        effort = (self.reasoning or {}).get("effort")
        return None if effort is None else effort not in ("none", "minimal")


def _content_text(content: Any, where: str, images: bool = False):
    """Text parts -> their text; with `images` (a user's message) input_image parts stay, as the
    chat parts parse_messages decodes (base64 data: URLs only)."""
    if isinstance(content, str):
        return clean_text(content)
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of input_text parts.", where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and images:
            out.append(part)
            continue
        if kind not in ("input_text", "output_text", "text"):
            raise bad_request(f"{where}[{j}] has type {json.dumps(kind)[:30]}: this message holds input_text parts"
                              + (" and input_image parts (base64 data: URLs)" if images else "") + ".",
                              where, code="unsupported_content")
        out.append({"type": "text", "text": text(part.get("text"), f"{where}[{j}].text", where)})
    if all(p["type"] == "text" for p in out):
        return "".join(p["text"] for p in out)
    return out


def to_chat(items: Any) -> List[dict]:
    """Responses input items -> OpenAI-shaped chat messages (before the chat completions checks)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("'input' must be a non-empty string or a list of input items.", "input")
    out: List[dict] = []
    reasoning = ""

    def assistant() -> dict:
        nonlocal reasoning
        if not out or out[-1]["role"] != "assistant" or out[-1].get("_closed"):
            out.append({"role": "assistant", "content": ""})
        if reasoning:
            out[-1]["reasoning_content"], reasoning = reasoning, ""
        return out[-1]

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object.", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
            if role is None:
                raise bad_request(f"{where}.role must be user, system, developer or assistant.", where)
            if item.get("content") is None:
                raise bad_request(f"{where}.content is missing.", f"{where}.content")
            text = _content_text(item["content"], f"{where}.content", images=role == "user")
            if role == "assistant":
                assistant()["content"] += text
            else:
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments", "{}"), str):
                raise bad_request(f"{where}: a function_call needs \"name\" and \"arguments\" (a JSON string).", where)
            ns = item.get("namespace")
            name = f"{ns}{NS}{item['name']}" if isinstance(ns, str) and ns else item["name"]
            assistant().setdefault("tool_calls", []).append(
                {"type": "function", "id": str(item.get("call_id", "")),
                 "function": {"name": name, "arguments": item.get("arguments", "{}")}})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{where}.output")
            if out and out[-1]["role"] == "assistant":
                out[-1]["_closed"] = True          # what follows a tool's output is a new turn
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
        elif kind == "reasoning":
            parts = (item.get("content") or []) + (item.get("summary") or [])
            reasoning += "".join(p.get("text", "") for p in parts if isinstance(p, dict)
                                 and isinstance(p.get("text"), str))
        else:
            raise bad_request(f"{where} has type {json.dumps(kind)[:40]}: input items may be message, function_call, "
                              f"function_call_output or reasoning.", where, code="unsupported_content")
    for m in out:
        m.pop("_closed", None)
    return out


def flat_tools(tools: Any) -> Any:
    """Responses' tools as the chat template takes them: a ``namespace`` tool's functions one by
    one, named ``namespace.name`` (Codex groups its sub-agent tools so); hosted tools (web
    search, file search, ...), which OpenAI's servers run, are left out: the model is not
    offered what this server cannot run. Anything else is left for parse_tools to judge."""
    if not isinstance(tools, list):
        return tools
    out = []
    for t in tools:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind in HOSTED:
            continue
        if kind == "namespace" and isinstance(t.get("name"), str) and isinstance(t.get("tools"), list):
            out += [{**f, "name": f"{t['name']}{NS}{f['name']}"} if isinstance(f, dict) and isinstance(f.get("name"), str)
                    and f["name"] else f for f in t["tools"]]        # a malformed one: parse_tools says why
        else:
            out.append(t)
    return out


def parse_responses_request(body: dict, settings, max_depth: int, max_tokens_default: int,
                            store: Optional[ResponseStore] = None, pictures: bool = True) -> ApiRequest:
    r = validate(ResponsesRequest, body, max_depth=max_depth)
    try:
        params = run_params(r, settings, max_depth, max_tokens_default, r.max_output_tokens)
    except ApiError as exc:
        exc.param = "max_output_tokens" if exc.param == "max_tokens" else exc.param
        raise
    req = ApiRequest(params=params, mode=r.mode, stream=bool(r.stream), model=r.model)
    if r.input is None:
        raise bad_request("'input' is missing: give the user's message (a string) or a list of items.", "input")
    history: List[dict] = []
    if r.previous_response_id is not None:
        history = (store or ResponseStore(0)).get(r.previous_response_id)
    new = to_chat(r.input)
    system = [{"role": "system", "content": r.instructions}] if r.instructions else []
    req.messages = parse_messages(system + history + new, settings, pictures)
    req.conversation = {"stored": history + new, "store": r.store is not False,
                        "previous_response_id": r.previous_response_id,
                        "instructions": r.instructions}   # history + new: without the instructions, for the store
    req.tools, forced = parse_tools(flat_tools(r.tools), r.tool_choice)
    set_grammars(req, response_format((r.text or {}).get("format"), "text.format", flat=True), forced)
    req.enable_thinking = r.thinking()
    return req
