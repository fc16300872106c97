r"""The user's own messages shown literally; the model's replies stay markdown.

Gradio's Chatbot renders every message as markdown and then HTML (sanitised: no scripts or
event handlers, but ``<b>`` is bold and ``<div>`` vanishes), and 6.31 has no per-message
switch: even ``render_markdown=False`` still parses the text as HTML. So the user's text
is escaped for markdown on its way to the browser (:func:`shown`) and unescaped on its way
back (:func:`typed`), in the component's own pre/postprocess: the handlers, the prompt and
the saved history hold the text as typed.

What leaves the component is the escaped form: the browser's copy button and /respond's
output show a user's ``<b>`` as ``\<b>`` (text without markdown characters is the same
either way). An API client sends the text as typed; :func:`typed` takes a text back only
when it is exactly what :func:`shown` makes of its unescaped form, so typed text is left
alone unless it is already a complete, consistent escape, and output fed back is read right.
"""
from __future__ import annotations

import re
import string

import gradio as gr
from gradio.components.chatbot import TextMessage

PUNCTUATION = frozenset(string.punctuation)     # what a markdown backslash can escape
ALWAYS = frozenset("`*<[~|")                    # code, emphasis, HTML, links, strike, tables
LINE_START = frozenset("#>-+=")                 # headings, quotes, lists, setext underlines
LEAD = {" ": "&nbsp;", "\t": "&#9;"}            # indentation would make a code block
UNESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")   # backslash + ASCII punctuation


def _escaped(body: str, i: int) -> bool:
    ch = body[i]
    prev = body[i - 1] if i else ""
    nxt = body[i + 1] if i + 1 < len(body) else ""
    return (ch in ALWAYS
            or (ch == "\\" and (nxt == "" or nxt in PUNCTUATION))           # escape or hard break
            or (ch == "_" and not (prev.isalnum() and nxt.isalnum()))       # snake_case is safe
            or (ch == "&" and (nxt == "#" or nxt.isalnum()))                # an entity
            or (ch == "$" and "$" in (prev, nxt))                           # $$ LaTeX $$
            or (i == 0 and ch in LINE_START)
            or (ch in ".)" and 1 <= i <= 9 and body[:i].isdigit()))         # "1." ordered list


def _shown_line(line: str) -> str:
    body = line.lstrip(" \t")
    lead = "".join(LEAD[c] for c in line[: len(line) - len(body)])
    return lead + "".join("\\" + c if _escaped(body, i) else c for i, c in enumerate(body))


def _typed_line(line: str) -> str:
    lead, i = [], 0
    while True:
        for raw, entity in LEAD.items():
            if line.startswith(entity, i):
                lead.append(raw)
                i += len(entity)
                break
        else:
            break
    return "".join(lead) + UNESCAPE.sub(r"\1", line[i:])


def shown(text: str) -> str:
    """Markdown that renders as exactly ``text``."""
    return "\n".join(_shown_line(line) for line in text.split("\n"))


def typed(markdown: str) -> str:
    """The text :func:`shown` made ``markdown`` from; any other text is returned unchanged."""
    text = "\n".join(_typed_line(line) for line in markdown.split("\n"))
    return text if shown(text) == markdown else markdown


def literal_user_text(chatbot: gr.Chatbot) -> gr.Chatbot:
    """Make ``chatbot`` show its user messages literally (returns it). Wraps the instance's
    own pre/postprocess: a subclass would make Gradio write a .pyi file beside this one."""
    to_browser, from_browser = chatbot.postprocess, chatbot.preprocess

    def postprocess(value):
        data = to_browser(value)
        for msg in data.root:
            if msg.role == "user":
                for block in msg.content:
                    if isinstance(block, TextMessage):
                        block.text = shown(block.text)
        return data

    def preprocess(payload):
        value = from_browser(payload)
        for msg in value:
            if msg.get("role") == "user":
                for block in msg["content"]:
                    if block.get("type") == "text" and isinstance(block.get("text"), str):
                        block["text"] = typed(block["text"])
        return value

    chatbot.postprocess, chatbot.preprocess = postprocess, preprocess
    return chatbot
