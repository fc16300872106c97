"""The decoded text of a reply -> what an OpenAI client receives, piece by piece.

In order: ``stop`` sequences end the reply (the sequence itself is not shown); text inside
``<think>...</think>`` becomes ``reasoning_content``; with tools, ``<tool_call>`` blocks
become ``tool_calls``. Text is held back only while it could still be the start of a stop
sequence or a tag, so streamed and non-streamed replies are the same text.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .toolcalls import ToolCall, ToolCallStream, partial_suffix

Delta = Tuple[str, str]           # ("reasoning" | "content", text)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class StopScanner:
    """Finds the first stop sequence in streamed text; shows only what precedes it."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if self.hit or not self.stops:
            return "" if self.hit else text
        self._pending += text
        found = [i for i in (self._pending.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            out, self._pending = self._pending[:min(found)], ""
            return out
        keep = max(partial_suffix(self._pending, s) for s in self.stops)
        out = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(out):]
        return out

    def flush(self) -> str:
        out, self._pending = ("" if self.hit else self._pending), ""
        return out


class _ThinkSplitter:
    """Minimal stand-in for ``core.reasoning.ThinkSplitter``: ``feed`` -> [(kind, text)]."""

    def __init__(self, in_reasoning: bool = False):
        self.in_reasoning = in_reasoning
        self._pending = ""

    def feed(self, text: str) -> List[Delta]:
        self._pending += text
        out: List[Delta] = []
        while self._pending:
            tag = THINK_CLOSE if self.in_reasoning else THINK_OPEN
            kind = "reasoning" if self.in_reasoning else "content"
            i = self._pending.find(tag)
            if i >= 0:
                if i:
                    out.append((kind, self._pending[:i]))
                self._pending = self._pending[i + len(tag):]
                self.in_reasoning = not self.in_reasoning
                continue
            keep = partial_suffix(self._pending, tag)
            if len(self._pending) > keep:
                out.append((kind, self._pending[:len(self._pending) - keep]))
                self._pending = self._pending[len(self._pending) - keep:]
            break
        return out

    def flush(self) -> List[Delta]:
        out, self._pending = self._pending, ""
        return [("reasoning" if self.in_reasoning else "content", out)] if out else []


def think_splitter(in_reasoning: bool):
    """The engine's splitter when it has one, else the stand-in above."""
    try:
        from core.reasoning import ThinkSplitter
    except ImportError:
        return _ThinkSplitter(in_reasoning)
    try:
        return ThinkSplitter(in_reasoning)
    except TypeError:
        return ThinkSplitter()


class _Trim:
    """Drops the newlines a template writes around a think block (``<think>\\n``,
    ``\\n</think>\\n\\n``): leading ones of each section, trailing ones of reasoning."""

    def __init__(self):
        self.kind: Optional[str] = None
        self.started = False
        self.newlines = ""

    def __call__(self, kind: str, text: str) -> str:
        if kind != self.kind:
            self.kind, self.started, self.newlines = kind, False, ""
        if not self.started:
            text = text.lstrip("\n")
            if not text:
                return ""
            self.started = True
        if kind == "reasoning":       # hold trailing newlines until more text follows
            body = text.rstrip("\n")
            text, self.newlines = self.newlines + body, text[len(body):]
        return text


class ReplyShaper:
    """Raw decoded text in, OpenAI deltas out; ``finish()`` adds the tool calls."""

    def __init__(self, stops: Sequence[str] = (), *, tools: bool = False, reasoning: bool = False,
                 in_reasoning: bool = False):
        self.stops = StopScanner(stops)
        self.splitter = think_splitter(in_reasoning) if reasoning else None
        self.calls = ToolCallStream() if tools else None
        self._trim = _Trim()

    @property
    def stopped(self) -> bool:
        """A stop sequence was found: the decode should end."""
        return self.stops.hit

    def feed(self, text: str) -> List[Delta]:
        return self._shape(self.stops.feed(text), final=False)

    def finish(self) -> Tuple[List[Delta], List[ToolCall]]:
        deltas = self._shape(self.stops.flush(), final=True)
        calls: List[ToolCall] = []
        if self.calls is not None:
            rest, calls = self.calls.finish()
            deltas += self._content(rest)
        return deltas, calls

    def _shape(self, text: str, final: bool) -> List[Delta]:
        pieces: List[Delta] = [("content", text)] if self.splitter is None else list(self.splitter.feed(text))
        if final and self.splitter is not None:
            pieces += list(self.splitter.flush())
        out: List[Delta] = []
        for kind, piece in pieces:
            if kind == "content" and self.calls is not None:
                piece = self.calls.feed(piece)
            out += self._content(piece) if kind == "content" else self._reasoning(piece)
        return out

    def _content(self, text: str) -> List[Delta]:
        text = self._trim("content", text) if self.splitter is not None else text
        return [("content", text)] if text else []

    def _reasoning(self, text: str) -> List[Delta]:
        text = self._trim("reasoning", text)
        return [("reasoning", text)] if text else []


def join(deltas: Sequence[Delta]) -> Tuple[str, str]:
    """(content, reasoning) of a list of deltas."""
    return ("".join(t for k, t in deltas if k == "content"), "".join(t for k, t in deltas if k == "reasoning"))
