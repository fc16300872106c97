"""OpenAI Responses (``POST /v1/responses``): Codex CLI and the openai-agents SDK speak it.

``input`` (a string or items: ``message``, ``function_call``, ``function_call_output``,
``reasoning``) and ``instructions`` become chat messages for the checkpoint's template, as a
chat completion's are; flat function ``tools``, ``tool_choice``, ``max_output_tokens`` and
``text.format`` (JSON through the grammar) are honoured. The reply's reasoning is a
``reasoning`` item, its text a ``message`` item, its tool calls ``function_call`` items; a
stream sends Responses' events, each with its ``sequence_number``.

``previous_response_id``: each reply with ``store`` (the default) keeps its conversation (input
and output, as chat messages, without the instructions, which OpenAI does not carry over) in a
bounded in-memory LRU (``--response-store``, ``MTP_CHAT_RESPONSE_STORE``); an unknown id is a
404 that says so. ``store: false`` keeps nothing: the client sends the whole conversation.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any, AsyncIterator, List, Optional

from .errors import ApiError, bad_request
from .request import (ApiRequest, _bool, _integer, _string, check_fields, one_grammar, parse_messages,
                          parse_sampling, parse_tools)
from .run import Ending, KeepAlive, Run, Whole
from .structured import response_format
from .text import join
from ..serving.inputs import clean_text

# Labels that change nothing here (Codex sends client_metadata with every turn).
HINTS = {"client_metadata", "prompt_cache_retention"}
FIELDS = HINTS | {"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
                  "text", "stream", "store", "previous_response_id", "reasoning", "include", "truncation",
                  "mode", "depth", "top_k", "min_p", "seed"}     # the last five: this server's extensions
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
# Tools OpenAI's servers run themselves: this server cannot, so the model is not offered them.
HOSTED = {"web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
          "image_generation", "mcp", "local_shell", "tool_search"}
NS = "."        # a namespace's function is shown to the model as "namespace.name"


class ResponseStore:
    """Conversations of recent responses by id, least recently used dropped first."""

    def __init__(self, size: int):
        self.size = size
        self._items: "OrderedDict[str, List[dict]]" = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, messages: List[dict]) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[rid] = messages
            self._items.move_to_end(rid)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, rid: str) -> List[dict]:
        with self._lock:
            if rid not in self._items:
                raise ApiError(404, f"previous_response_id '{rid[:80]}' is not known here: this server keeps the "
                                    f"last {self.size} stored responses in memory (store: true), so it was never "
                                    f"stored, has been dropped, or the server restarted. Send the whole "
                                    f"conversation in 'input' instead.", param="previous_response_id",
                               code="previous_response_not_found")
            self._items.move_to_end(rid)
            return list(self._items[rid])

    def __len__(self) -> int:
        return len(self._items)


# --- requests ----------------------------------------------------------------------------
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
        out.append({"type": "text", "text": _string(part.get("text"), f"{where}[{j}].text", where)})
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


def too_long_refusal(exc: ApiError) -> ApiError:
    """An input over the context's character budget as OpenAI's Responses reports any prompt
    over the context: 400 ``context_length_exceeded`` (Codex stops on that code; a 413 it
    retries five times, then shows raw)."""
    if exc.code != "input_too_large":
        return exc
    return ApiError(400, exc.message, param=exc.param, code="context_length_exceeded")


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


def split_name(name: str, tools: Optional[List[dict]]) -> dict:
    """A called function's ``name`` (and ``namespace``) as the client declared it."""
    ns, _, short = name.partition(NS)
    declared = {t["function"]["name"] for t in tools or []}
    return {"namespace": ns, "name": short} if short and name in declared and ns else {"name": name}


def parse_responses_request(body: dict, settings, max_depth: int, max_tokens_default: int,
                            store: Optional[ResponseStore] = None, pictures: bool = True) -> ApiRequest:
    check_fields(body, FIELDS)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string.", "model")
    sampling = {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "seed", "mode", "depth") if k in body}
    if body.get("max_output_tokens") is not None:
        sampling["max_tokens"] = _integer(body, "max_output_tokens")
    try:
        params, mode = parse_sampling(sampling, settings, max_depth, max_tokens_default)
    except ApiError as exc:
        exc.param = "max_output_tokens" if exc.param == "max_tokens" else exc.param
        raise
    req = ApiRequest(params=params, mode=mode, stream=bool(_bool(body, "stream")), model=model)
    if body.get("input") is None:
        raise bad_request("'input' is missing: give the user's message (a string) or a list of items.", "input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string.", "instructions")
    history: List[dict] = []
    prev = body.get("previous_response_id")
    if prev is not None:
        if not isinstance(prev, str):
            raise bad_request("'previous_response_id' must be a string.", "previous_response_id")
        history = (store or ResponseStore(0)).get(prev)
    new = to_chat(body["input"])
    req.messages = parse_messages(([{"role": "system", "content": instructions}] if instructions else []) + history + new,
                                  settings, pictures)
    keep = _bool(body, "store")
    req.conversation = {"stored": history + new, "store": keep is not False, "previous_response_id": prev,
                        "instructions": instructions}   # history + new: without the instructions, for the store
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in HOSTED:
        raise bad_request(f"'tool_choice' asks for the hosted tool {json.dumps(choice['type'])}, which this server "
                          f"cannot run: only your own function tools are run (by you).", "tool_choice",
                          code="unsupported_tool")
    req.tools, forced = parse_tools({**body, "tools": flat_tools(body.get("tools"))})
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise bad_request("'text' must be an object like {\"format\": {\"type\": \"json_schema\", ...}}.", "text")
    req.grammar = one_grammar(response_format((text or {}).get("format"), "text.format", flat=True), forced)
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if (reasoning is not None and not isinstance(reasoning, dict)) or (effort is not None and not isinstance(effort, str)):
        raise bad_request("'reasoning' must be an object like {\"effort\": \"none\"} (none/minimal turn thinking off).",
                          "reasoning")
    req.enable_thinking = None if effort is None else effort not in ("none", "minimal")
    return req


# --- replies ---------------------------------------------------------------------------------
def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseWriter:
    def __init__(self, model: str, req: ApiRequest, store: ResponseStore):
        self.model, self.req, self.store = model, req, store
        self.id = _item_id("resp")
        self.created = int(time.time())
        self.seq = 0
        self.ids = {"reasoning": _item_id("rs"), "content": _item_id("msg")}
        self.keep = req.conversation["store"]

    def response(self, output: List[dict], status: str, use: Optional[dict] = None, mtp: Optional[dict] = None,
                 incomplete: bool = False) -> dict:
        req = self.req
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "model": self.model, "output": output, "error": None,
               "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
               "instructions": req.conversation["instructions"],
               "max_output_tokens": req.params.max_tokens, "metadata": {}, "parallel_tool_calls": False,
               "previous_response_id": req.conversation["previous_response_id"], "temperature": req.params.temperature, "top_p": req.params.top_p,
               "tool_choice": "required" if req.grammar and req.tools else "auto",
               "tools": [{"type": "function", "name": t["function"]["name"],
                          "description": t["function"].get("description"),
                          "parameters": t["function"]["parameters"], "strict": False} for t in req.tools or []],
               "text": {"format": {"type": "text"}}, "truncation": "disabled", "store": self.keep}
        if use is not None:
            cached = use["prompt_tokens_details"]["cached_tokens"]
            out["usage"] = {"input_tokens": use["prompt_tokens"],
                            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                            "output_tokens": use["completion_tokens"],
                            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": use["total_tokens"]}
        if mtp is not None:
            out["mtp"] = mtp
        return out

    def items(self, deltas, ending: Ending) -> List[dict]:
        content, reasoning = join(deltas)
        out = []
        if reasoning:
            out.append({"type": "reasoning", "id": self.ids["reasoning"], "summary": [],
                        "content": [{"type": "reasoning_text", "text": reasoning}]})
        if content or not (ending.calls or reasoning):      # as a stream: an empty message only when nothing else
            out.append({"type": "message", "id": self.ids["content"], "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}]})
        out += [{"type": "function_call", "id": "fc_" + c.id.split("_", 1)[-1], "call_id": c.id,
                 **split_name(c.name, self.req.tools), "arguments": c.arguments, "status": "completed"}
                for c in ending.calls]
        return out

    def finish(self, run: Run, deltas, ending: Ending) -> dict:
        """The whole response; stored for previous_response_id unless store is false."""
        incomplete = ending.finish == "length"
        done = self.response(self.items(deltas, ending), "incomplete" if incomplete else "completed",
                             ending.usage, ending.mtp, incomplete)
        if self.keep:
            self.store.put(self.id, list(self.req.conversation["stored"]) + [run.said(ending.calls)])
        return done

    def whole(self, run: Run, w: Whole) -> dict:
        return self.finish(run, w.deltas, w.ending)

    def event(self, kind: str, **data) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n".encode("utf-8")

    async def stream(self, run: Run, keepalive: float) -> AsyncIterator[bytes]:
        yield self.event("response.created", response=self.response([], "in_progress"))
        yield self.event("response.in_progress", response=self.response([], "in_progress"))
        parts = _Parts(self)
        keep, ending, deltas = KeepAlive(keepalive), None, []
        try:
            async for ev in run.events():
                if ev is None:
                    if keep.due():
                        yield b": keep-alive\n\n"
                elif isinstance(ev, Ending):
                    ending = ev
                else:
                    keep.sent()
                    deltas.append(ev)
                    for chunk in parts.delta(*ev):
                        yield chunk
        except ApiError as exc:
            yield self.event("error", code=exc.code or "error", message=exc.message, param=exc.param)
            return
        except Exception as exc:   # noqa: BLE001 - the engine failed: say so in the stream
            yield self.event("error", code="decode_failed", message=f"The decode failed: {type(exc).__name__}: {exc}",
                             param=None)
            return
        deltas += ending.deltas
        for d in ending.deltas:
            for chunk in parts.delta(*d):
                yield chunk
        if not parts.index and not ending.calls:
            for chunk in parts.delta("content", ""):
                yield chunk
        for chunk in parts.close():
            yield chunk
        done = self.finish(run, deltas, ending)
        for item in done["output"]:
            if item["type"] != "function_call":
                continue
            i = parts.index
            parts.index += 1
            yield self.event("response.output_item.added", output_index=i, item={**item, "arguments": "",
                                                                                  "status": "in_progress"})
            yield self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                             delta=item["arguments"])
            yield self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                             arguments=item["arguments"], name=item["name"])
            yield self.event("response.output_item.done", output_index=i, item=item)
        # Always response.completed (its status says "incomplete" when max_output_tokens cut it):
        # the SDK's stream helper and the openai-agents runner wait for that event only.
        yield self.event("response.completed", response=done)


class _Parts:
    """Reasoning and text deltas -> output items with their content part, one open at a time."""

    def __init__(self, writer: ResponseWriter):
        self.w, self.index, self.open, self.text = writer, 0, None, ""

    def _item(self, status: str) -> dict:
        iid = self.w.ids[self.open]
        if self.open == "reasoning":
            return {"type": "reasoning", "id": iid, "summary": [],
                    "content": [{"type": "reasoning_text", "text": self.text}] if status == "completed" else []}
        return {"type": "message", "id": iid, "role": "assistant", "status": status,
                "content": [self._part()] if status == "completed" else []}

    def _part(self) -> dict:
        if self.open == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def delta(self, kind: str, text: str) -> List[bytes]:
        out, w = [], self.w
        if kind != self.open:
            out += self.close()
            self.open, self.text = kind, ""
            out.append(w.event("response.output_item.added", output_index=self.index, item=self._item("in_progress")))
            out.append(w.event("response.content_part.added", item_id=w.ids[kind], output_index=self.index,
                               content_index=0, part=self._part()))
        if text:
            self.text += text
            name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            extra = {} if kind == "reasoning" else {"logprobs": []}
            out.append(w.event(name, item_id=w.ids[kind], output_index=self.index, content_index=0, delta=text,
                               **extra))
        return out

    def close(self) -> List[bytes]:
        if self.open is None:
            return []
        w, kind = self.w, self.open
        name = "response.reasoning_text.done" if kind == "reasoning" else "response.output_text.done"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        out = [w.event(name, item_id=w.ids[kind], output_index=self.index, content_index=0, text=self.text, **extra),
               w.event("response.content_part.done", item_id=w.ids[kind], output_index=self.index, content_index=0,
                       part=self._part()),
               w.event("response.output_item.done", output_index=self.index, item=self._item("completed"))]
        self.index += 1
        self.open = None
        return out
