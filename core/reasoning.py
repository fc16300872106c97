"""Reasoning ("thinking") text: where it starts and ends in a streamed reply.

Qwen3.5-style templates open a `<think>` block in the generation prompt, so the reply begins
inside it and the model closes it with `</think>` before the answer; other templates let the
model open the block itself. Gemma 4 writes its reasoning in a thought channel,
`<|channel>thought\n ... <channel|>`: with thinking on the model opens it itself; with thinking
off its template closes an empty one in the generation prompt. The markers come from the chat
template (`markers_for`). The splitter turns streamed text into ("reasoning", text) and
("content", text) pieces, holding back a partial marker until it is complete.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class Markers:
    open: str
    close: str


THINK = Markers("<think>", "</think>")                      # Qwen, DeepSeek and most others
THOUGHT_CHANNEL = Markers("<|channel>thought", "<channel|>")  # Gemma 4


def markers_for(chat_template: Optional[str]) -> Markers:
    """The reasoning markers a chat template writes (Gemma 4's thought channel, else <think>)."""
    return THOUGHT_CHANNEL if chat_template and THOUGHT_CHANNEL.close in chat_template else THINK


def opens_thinking(prompt_text: str, markers: Markers = THINK) -> bool:
    """True when the prompt ends inside an open think block (the generation prompt opened it)."""
    return prompt_text.rfind(markers.open) > prompt_text.rfind(markers.close)


class ThinkSplitter:
    def __init__(self, inside: bool = False, markers: Markers = THINK):
        self.inside = inside
        self.markers = markers
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
            tag = self.markers.close if self.inside else self.markers.open
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


def split_reply(text: str, inside: bool = False, markers: Markers = THINK) -> Tuple[str, str]:
    """A whole reply -> (reasoning, answer)."""
    s = ThinkSplitter(inside, markers)
    parts = s.feed(text) + s.flush()
    return ("".join(t for k, t in parts if k == "reasoning").strip(),
            "".join(t for k, t in parts if k == "content").strip())
