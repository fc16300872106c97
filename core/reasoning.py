"""Reasoning ("thinking") text: where it starts and ends in a streamed reply.

Qwen3.5-style templates open a `<think>` block in the generation prompt, so the reply begins
inside it and the model closes it with `</think>` before the answer; other templates let the
model open the block itself. The splitter turns streamed text into ("reasoning", text) and
("content", text) pieces, holding back a partial tag until it is complete.
"""
from __future__ import annotations

from typing import List, Tuple

OPEN, CLOSE = "<think>", "</think>"


def opens_thinking(prompt_text: str) -> bool:
    """True when the prompt ends inside an open think block (the generation prompt opened it)."""
    return prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE)


class ThinkSplitter:
    def __init__(self, inside: bool = False):
        self.inside = inside
        self._held = ""
        self._at_start = True   # strip the newlines a section starts with

    def _emit(self, out, text):
        if self._at_start:
            text = text.lstrip("\n")
        if text:
            self._at_start = False
            kind = "reasoning" if self.inside else "content"
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + text)
            else:
                out.append((kind, text))

    def feed(self, text: str) -> List[Tuple[str, str]]:
        out: List[Tuple[str, str]] = []
        text = self._held + text
        self._held = ""
        while text:
            tag = CLOSE if self.inside else OPEN
            i = text.find(tag)
            if i >= 0:
                self._emit(out, text[:i])
                text = text[i + len(tag):]
                self.inside = not self.inside
                self._at_start = True
                continue
            # Hold back a tail that could be the start of the tag.
            keep = next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if tag.startswith(text[-k:])), 0)
            self._emit(out, text[: len(text) - keep])
            self._held = text[len(text) - keep:]
            break
        return out

    def flush(self) -> List[Tuple[str, str]]:
        out: List[Tuple[str, str]] = []
        held, self._held = self._held, ""
        self._emit(out, held)
        return out


def split_reply(text: str, inside: bool = False) -> Tuple[str, str]:
    """A whole reply -> (reasoning, answer)."""
    s = ThinkSplitter(inside)
    parts = s.feed(text) + s.flush()
    return ("".join(t for k, t in parts if k == "reasoning").strip(),
            "".join(t for k, t in parts if k == "content").strip())
