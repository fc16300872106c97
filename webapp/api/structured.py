"""Structured output requests -> a grammar for the engine (core.constraints, llguidance).

What a client asks for and the grammar it gets:
- chat ``response_format`` ``{"type": "json_object"}`` / Responses ``text.format`` the same:
  one JSON object;
- ``json_schema`` (chat: ``{"type": "json_schema", "json_schema": {"name", "schema"}}``,
  Responses: ``{"type": "json_schema", "name", "schema"}``): one JSON value of that schema;
- a forced tool call (chat/Responses ``tool_choice`` ``"required"`` or a named function,
  Anthropic ``any`` / ``tool``): one ``<tool_call>`` block, as the chat template asks the model
  to write it, whose arguments follow the tool's parameter schema.
A schema the grammar library cannot compile is refused with its reason when the request's
constraint is built (``ModelHost.constraint``).
"""
from __future__ import annotations

import json
from typing import Any, Callable, List, Optional

from .errors import bad_request
from .toolcalls import CLOSE, OPEN


def json_grammar(schema: dict) -> str:
    from core.constraints import json_schema_grammar

    return json_schema_grammar(schema)


def _schema(v: Any, param: str) -> dict:
    if not isinstance(v, dict):
        raise bad_request(f"'{param}' must be a JSON schema object.", param)
    return v


def response_format(fmt: Any, param: str = "response_format", flat: bool = False) -> Optional[str]:
    """The grammar for chat's `response_format` (or, `flat`, Responses' `text.format`); None for text."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar({"type": "object"})
    if kind == "json_schema":
        spec = fmt if flat else fmt.get("json_schema")
        where = param if flat else f"{param}.json_schema"
        if not isinstance(spec, dict):
            raise bad_request(f"'{where}' must be an object with \"name\" and \"schema\".", where)
        if "name" in spec and not isinstance(spec["name"], str):
            raise bad_request(f"'{where}.name' must be a string.", where)
        return json_grammar(_schema(spec.get("schema", {"type": "object"}), f"{where}.schema"))
    raise bad_request(f"'{param}' must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or "
                      f"{{\"type\": \"json_schema\", ...}}; got {json.dumps(fmt)[:60]}.", param)


def tool_call_grammar(tools: List[dict], name: Optional[str] = None, lazy: bool = False) -> Callable[[object], object]:
    """One tool call of `tools` (OpenAI-shaped, as parse_tools gives them), or of the one named,
    as the template asks for it: a function of the tokenizer (the tags may be single tokens).
    `lazy`: the call may come or not (tool_choice "auto"): what follows the opening tag, as a
    core.constraints.Lazy, held only once the model opens a call."""
    calls = []
    for t in tools:
        fn = t["function"]
        if name is None or fn["name"] == name:
            params = fn.get("parameters") or {"type": "object"}
            calls.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                          "required": ["name", "arguments"], "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}

    def grammar(tokenizer):
        from core.constraints import Lazy, lark_grammar, lark_json, lark_text

        nl, call = json.dumps("\n"), f"call: {lark_json(schema)}"
        if lazy:
            return Lazy(OPEN, lark_grammar(f"start: {nl} call {nl} {lark_text(tokenizer, CLOSE)}\n{call}"))
        return lark_grammar(f"start: {lark_text(tokenizer, OPEN)} {nl} call {nl} {lark_text(tokenizer, CLOSE)}\n{call}")

    return grammar
