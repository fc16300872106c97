"""The decoded text of a reply -> what an OpenAI client receives, piece by piece.

Text inside ``<think>...</think>`` becomes ``reasoning_content``; in the answer, ``stop``
sequences end the reply (the sequence itself is not shown) and, with tools, ``<tool_call>``
blocks become ``tool_calls``. Text is held back only while it could still be the start of a
stop sequence or a tag, so streamed and non-streamed replies are the same text.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .toolcalls import ToolCall, ToolCallStream, partial_suffix

Delta = Tuple[str, str]           # ("reasoning" | "content", text)


class StopScanner:
    """Finds the first stop sequence in streamed text; shows only what precedes it."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.hit = False
        self.which: Optional[str] = None     # the stop sequence found

    def feed(self, text: str) -> str:
        if self.hit or not self.stops:
            return "" if self.hit else text
        self._pending += text
        found = [(i, s) for i, s in ((self._pending.find(s), s) for s in self.stops) if i >= 0]
        if found:
            at, self.which = min(found)
            self.hit = True
            out, self._pending = self._pending[:at], ""
            return out
        keep = max(partial_suffix(self._pending, s) for s in self.stops)
        out = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(out):]
        return out

    def flush(self) -> str:
        out, self._pending = ("" if self.hit else self._pending), ""
        return out


class _ReasoningEnd:
    """Holds reasoning's trailing newlines (a template writes ``\n</think>``) until more
    reasoning follows, so they are never shown at its end."""

    def __init__(self):
        self.newlines = ""

    def __call__(self, text: str) -> str:
        body = text.rstrip("\n")
        if not body:
            self.newlines += text
            return ""
        out, self.newlines = self.newlines + body, text[len(body):]
        return out


class ReplyShaper:
    """Raw decoded text in, OpenAI deltas out; ``finish()`` adds the tool calls.

    Order: ``<think>`` text -> reasoning (``core.reasoning.ThinkSplitter``); in the answer,
    a stop sequence ends the reply (as in the UI, stop sequences apply to the answer, not
    to the reasoning), and with tools ``<tool_call>`` blocks become calls.
    """

    def __init__(self, stops: Sequence[str] = (), *, tools: bool = False, reasoning: bool = False,
                 in_reasoning: bool = False, markers=None):
        from core.reasoning import THINK, ThinkSplitter

        self.stops = StopScanner(stops)
        self.splitter = ThinkSplitter(in_reasoning, markers or THINK) if reasoning else None
        self.calls = ToolCallStream() if tools else None
        self._reasoning_end = _ReasoningEnd()

    @property
    def stopped(self) -> bool:
        """A stop sequence was found: the decode should end."""
        return self.stops.hit

    def feed(self, text: str) -> List[Delta]:
        pieces = [("content", text)] if self.splitter is None else self.splitter.feed(text)
        return self._shape(pieces, final=False)

    def finish(self) -> Tuple[List[Delta], List[ToolCall]]:
        deltas = self._shape(self.splitter.flush() if self.splitter is not None else [], final=True)
        calls: List[ToolCall] = []
        if self.calls is not None:
            rest, calls = self.calls.finish()
            deltas += [("content", rest)] if rest else []
        return deltas, calls

    def _shape(self, pieces: Sequence[Delta], final: bool) -> List[Delta]:
        out: List[Delta] = []
        for kind, text in pieces:
            if kind == "reasoning":
                text = self._reasoning_end(text)
            elif not self.stops.hit:
                text = self.stops.feed(text)
                text = self.calls.feed(text) if self.calls is not None else text
            else:
                text = ""
            if text:
                out.append((kind, text))
        if final:
            rest = self.stops.flush()
            rest = self.calls.feed(rest) if self.calls is not None and rest else rest
            if rest:
                out.append(("content", rest))
        return out


def join(deltas: Sequence[Delta]) -> Tuple[str, str]:
    """(content, reasoning) of a list of deltas."""
    return ("".join(t for k, t in deltas if k == "content"), "".join(t for k, t in deltas if k == "reasoning"))
