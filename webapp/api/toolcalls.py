"""``<tool_call>{json}</tool_call>`` blocks in a model's reply -> OpenAI ``tool_calls``.

Qwen-style chat templates ask the model to answer a tool call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``. A model can get that
wrong (bad JSON, no name, a block cut off by max_tokens): such a block stays in the reply
as plain text. Nothing here raises on any input.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import List, Optional, Tuple

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str          # a JSON object, as text (what OpenAI's protocol carries)
    id: str = ""

    def as_openai(self, index: Optional[int] = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def parse_call(body: str) -> Optional[ToolCall]:
    """The JSON inside one block -> a ToolCall, or None when it is not a well-formed call."""
    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):          # some models quote the object; it must still be one
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    try:
        text = json.dumps(args, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return None
    return ToolCall(name.strip(), text, new_call_id())


def split_tool_calls(text: str) -> Tuple[str, List[ToolCall]]:
    """(the text outside well-formed calls, the calls in order). Malformed blocks stay text."""
    try:
        return _split(text)
    except Exception:   # noqa: BLE001 - the parser must never take a reply down
        return text, []


def _split(text: str) -> Tuple[str, List[ToolCall]]:
    content: List[str] = []
    calls: List[ToolCall] = []
    pos = 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            content.append(text[pos:])
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:                     # cut off: keep it as text
            content.append(text[pos:])
            break
        call = parse_call(text[start + len(OPEN):end])
        if call is None:
            content.append(text[pos:end + len(CLOSE)])
        else:
            content.append(text[pos:start])
            calls.append(call)
        pos = end + len(CLOSE)
    rest = "".join(content)
    return (rest.strip() if calls else rest), calls


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a beginning of ``tag`` (a tag may be
    split across two streamed pieces, so that much must be held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallStream:
    """Streams content text until a ``<tool_call>`` opens; from there it keeps the rest and
    parses it at the end (a call is only known to be well-formed once it is complete)."""

    def __init__(self) -> None:
        self._pending = ""
        self._held = False       # a <tool_call> has opened: everything from there is kept

    def feed(self, text: str) -> str:
        """Content that is safe to show now."""
        self._pending += text
        if self._held:
            return ""
        i = self._pending.find(OPEN)
        if i >= 0:
            out, self._pending, self._held = self._pending[:i], self._pending[i:], True
            return out
        keep = partial_suffix(self._pending, OPEN)
        out = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(out):]
        return out

    def finish(self) -> Tuple[str, List[ToolCall]]:
        """(remaining content text, the calls) once the reply is complete."""
        rest, self._pending = self._pending, ""
        if not self._held:
            return rest, []
        return split_tool_calls(rest)
