"""OpenAI Responses (``POST /v1/responses``): Codex CLI and the openai-agents SDK speak it.

The request is read in responses_request.py, the conversations kept for
``previous_response_id`` in responses_store.py. Here the reply: its reasoning is a
``reasoning`` item, its text a ``message`` item, its tool calls ``function_call`` items; a
stream sends Responses' events, each with its ``sequence_number``.
"""
from __future__ import annotations

import json
import secrets
import time
from typing import AsyncIterator, List, Optional

from .errors import ApiError
from .format import Mtp, Shape
from .request import ApiRequest
from .responses_request import NS
from .responses_store import ResponseStore
from .run import Ending, KeepAlive, Run, Whole
from .text import join


def too_long_refusal(exc: ApiError) -> ApiError:
    """An input over the context's character budget as OpenAI's Responses reports any prompt
    over the context: 400 ``context_length_exceeded`` (Codex stops on that code; a 413 it
    retries five times, then shows raw)."""
    if exc.code != "input_too_large":
        return exc
    return ApiError(400, exc.message, param=exc.param, code="context_length_exceeded")


def split_name(name: str, tools: Optional[List[dict]]) -> dict:
    """A called function's ``name`` (and ``namespace``) as the client declared it."""
    ns, _, short = name.partition(NS)
    declared = {t["function"]["name"] for t in tools or []}
    return {"namespace": ns, "name": short} if short and name in declared and ns else {"name": name}


# --- replies ---------------------------------------------------------------------------------
class Usage(Shape):
    input_tokens: int
    input_tokens_details: dict             # cached_tokens: read from the prefix cache
    output_tokens: int
    output_tokens_details: dict
    total_tokens: int


class Response(Shape):
    """The response object: whole, or as the stream's created / in_progress / completed events carry it."""
    id: str
    object: str = "response"
    created_at: int
    status: str                            # in_progress | completed | incomplete
    model: str
    output: List[dict]                     # reasoning, message and function_call items
    error: Optional[dict] = None
    incomplete_details: Optional[dict] = None
    instructions: Optional[str] = None
    max_output_tokens: int
    metadata: dict = {}
    parallel_tool_calls: bool = False
    previous_response_id: Optional[str] = None
    temperature: float
    top_p: float
    tool_choice: str
    tools: List[dict]
    text: dict
    truncation: str = "disabled"
    store: bool
    usage: Optional[Usage] = None          # once the reply has ended
    mtp: Optional[Mtp] = None              # this server's extension (format.Mtp)


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
        out = Response(
            id=self.id, object="response", created_at=self.created, status=status, model=self.model, output=output,
            error=None, incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
            instructions=req.conversation["instructions"], max_output_tokens=req.params.max_tokens, metadata={},
            parallel_tool_calls=False, previous_response_id=req.conversation["previous_response_id"],
            temperature=req.params.temperature, top_p=req.params.top_p,
            tool_choice="required" if req.grammar and req.tools else "auto",
            tools=[{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description"),
                    "parameters": t["function"]["parameters"], "strict": False} for t in req.tools or []],
            text={"format": {"type": "text"}}, truncation="disabled", store=self.keep)
        if use is not None:
            cached = use["prompt_tokens_details"]["cached_tokens"]
            out.usage = Usage(input_tokens=use["prompt_tokens"],
                              input_tokens_details={"cached_tokens": cached, "cache_write_tokens": 0},
                              output_tokens=use["completion_tokens"], output_tokens_details={"reasoning_tokens": 0},
                              total_tokens=use["total_tokens"])
        if mtp is not None:
            out.mtp = mtp
        return out.out()

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
