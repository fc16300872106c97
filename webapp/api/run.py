"""One API request's decode, as protocol-neutral events that each protocol writes its own way.

``Run.events()`` waits for the request's turn, decodes on the model thread (``DecodeJob``),
shapes the text (reasoning, stop sequences, tool calls: ``ReplyShaper``) and yields ``None``
while nothing happens (a stream's keep-alive), ``Delta`` pairs as text is ready, and one
:class:`Ending` last. OpenAI chat and completions (api.py), Anthropic Messages
(api/anthropic.py) and OpenAI Responses (api/responses.py) write those events in their shapes.
After a reply, the conversation with it is snapshotted for the next turn's prompt (the
prefix cache, ``ModelHost.remember``) as the client will send it back.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, List, Optional

from .decode import DecodeJob, Piece
from .errors import ApiError
from .format import figures, finish_reason, usage
from .request import ApiRequest
from .text import Delta, ReplyShaper
from .toolcalls import ToolCall

TICK = 0.25                         # how often a waiting request looks at its client
SHUTDOWN = "The server is shutting down: the reply was cut short."


@dataclass
class Ending:
    deltas: List[Delta]               # the last text, flushed
    calls: List[ToolCall]
    finish: str                       # OpenAI's finish_reason: stop | length | tool_calls
    stop_sequence: Optional[str]      # the stop sequence that ended the reply, if one did
    usage: dict                       # OpenAI's usage object
    mtp: dict                         # the engine's figures (api.format.figures)


@dataclass
class Run:
    """One request's decode. `api` is the OpenAIApi (host, stops, turns); `prompt` what
    api.prompt made; `constraint` a core.Constraint for structured output; `keep_reasoning`:
    the client sends the reasoning back next turn (Anthropic thinking blocks, Responses
    reasoning items), so the snapshot for the next turn holds it too."""

    api: object
    req: ApiRequest
    prompt: object
    shaper: ReplyShaper
    thinking: bool = False
    kind: str = "chat"                # "chat" (a conversation goes on) or "text" (legacy completions)
    constraint: object = None
    keep_reasoning: bool = False
    id: str = ""
    engine_reason: Optional[str] = None
    stats: Optional[dict] = None
    content: List[str] = field(default_factory=list)     # the answer as the client sends it back next turn
    reasoning: List[str] = field(default_factory=list)
    logprobs: list = field(default_factory=list)         # core.TokenLogprob of tokens not yet written out

    def shape(self, text: str) -> List[Delta]:
        deltas = self.shaper.feed(text)
        self._keep(deltas)
        return deltas

    def _keep(self, deltas: List[Delta]) -> None:
        self.content += [t for kind, t in deltas if kind == "content"]
        self.reasoning += [t for kind, t in deltas if kind == "reasoning"]

    def take_logprobs(self) -> list:
        out, self.logprobs = self.logprobs, []
        return out

    async def pieces(self) -> AsyncIterator[Optional[Piece]]:
        """The decode's pieces; ``None`` every TICK while waiting (for the turn or a piece)."""
        api, key = self.api, f"api:{self.id or id(self)}"
        async with contextlib.aclosing(api.turns.take(TICK)) as waiting:
            async for _ in waiting:
                yield None
        stop = api.stops.claim(key)
        job = None
        try:
            if api.stops.closing:
                raise ApiError(503, SHUTDOWN, code="server_shutdown")
            job = DecodeJob(api.host, self.req.mode, self.req.params, self.prompt, stop, thinking=self.thinking,
                            on_done=api.turns.give_back, constraint=self.constraint, logprobs=self.req.logprobs)
            async for piece in job.events(TICK):
                if piece is not None and piece.finished:
                    self.engine_reason, self.stats = piece.finish_reason, piece.stats
                yield piece
                if self.shaper.stopped:
                    stop.set()              # a stop sequence: end the decode, show nothing more
        finally:
            stop.set()                      # no-op if it ended; else (client gone) end it within a cycle
            api.stops.release(key, stop)
            if job is None:
                api.turns.give_back()

    def cut_by_shutdown(self) -> bool:
        return self.engine_reason == "stopped" and not self.shaper.stopped and bool(self.api.stops.closing)

    async def events(self, request=None) -> AsyncIterator[object]:
        """``None`` (nothing new: a stream may send a keep-alive), ``Delta``s, then one Ending.
        With `request` (a whole reply), a client that went away ends the decode (499)."""
        looked = time.monotonic()
        async with contextlib.aclosing(self.pieces()) as pieces:
            async for piece in pieces:
                if request is not None and time.monotonic() - looked >= TICK:
                    looked = time.monotonic()
                    if await request.is_disconnected():   # closing pieces() stops the decode
                        raise ApiError(499, "The client went away.", code="client_closed")
                if piece is None:
                    yield None
                    continue
                self.logprobs += piece.logprobs or []
                for delta in self.shape(piece.text):
                    yield delta
        if self.cut_by_shutdown():
            raise ApiError(503, SHUTDOWN, code="server_shutdown")
        yield self.ending()

    def ending(self) -> Ending:
        deltas, calls = self.shaper.finish()
        self._keep(deltas)
        if self.kind == "chat" and self.engine_reason in ("eos", "max_tokens", "stop_string", "stopped"):
            # The next turn's prompt will hold this reply: snapshot the conversation with it now
            # (idle time), so that turn prefills only its new messages.
            self.api.host.remember(list(self.req.messages) + [self.said(calls)], tools=self.req.tools,
                                   enable_thinking=self.req.enable_thinking)
        finish = finish_reason(self.engine_reason, self.shaper.stopped, calls)
        mtp = figures(self.req.mode, self.req.params.depth, self.stats)
        return Ending(deltas, calls, finish, self.shaper.stops.which, usage(len(self.prompt), self.stats), mtp)

    def said(self, calls: List[ToolCall]) -> dict:
        """This reply as the client sends it back in the next request, parsed as that will be."""
        msg = {"role": "assistant", "content": "".join(self.content)}
        if self.keep_reasoning and self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if calls:
            msg["tool_calls"] = [{"type": "function", "id": c.id,
                                  "function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls]
        return msg


async def collect(run: Run, request) -> "Whole":
    """A whole reply: every delta, the logprobs and the ending."""
    whole = Whole()
    async for ev in run.events(request):
        if isinstance(ev, Ending):
            whole.ending = ev
            whole.deltas += ev.deltas
        elif ev is not None:
            whole.deltas.append(ev)
    whole.logprobs = run.take_logprobs()
    return whole


@dataclass
class Whole:
    deltas: List[Delta] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    ending: Optional[Ending] = None


class KeepAlive:
    """Says when a stream that has been quiet for `every` seconds should send a keep-alive."""

    def __init__(self, every: float, clock: Callable[[], float] = time.monotonic):
        self.every, self.clock, self.since = every, clock, clock()

    def due(self) -> bool:
        if self.clock() - self.since >= self.every:
            self.since = self.clock()
            return True
        return False

    def sent(self) -> None:
        self.since = self.clock()
