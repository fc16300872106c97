"""What clients send, made safe before use: text as valid UTF-8, a history checked.

JSON can carry a lone surrogate (``"\\ud800"``): Python decodes it into a ``str`` that
cannot be encoded as UTF-8, so the tokenizer and Gradio's JSON writer fail on it mid-stream.
Every text that enters (message, history, system prompt, race prompt) goes through
:func:`clean_text`. :func:`history_problem` refuses, in words, a ``/respond`` history the
page itself could never send.
"""
from __future__ import annotations

from typing import Any, Optional

ROLES = ("user", "assistant")


def clean_text(text: Any) -> str:
    """``text`` as valid UTF-8: each lone surrogate becomes U+FFFD; a surrogate pair that
    arrived as two code units is joined back into its character."""
    text = "" if text is None else str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def history_problem(history: Any, text_of) -> Optional[str]:
    """Why ``history`` cannot be answered (None if it can). The page sends only 'user' and
    'assistant' messages, ending with the user's non-empty message; ``text_of`` flattens a
    message's content to its text."""
    if not isinstance(history, (list, tuple)):
        return "The history must be a list of messages."
    if not history:
        return "The history is empty: it must end with the user's message."
    for i, msg in enumerate(history, 1):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role == "system":
            return (f"Message {i} has the role 'system': give the system prompt in its own input; "
                    f"the history holds only 'user' and 'assistant' messages.")
        if role not in ROLES:
            return f"Message {i} has an unknown role {clean_text(role)!r}: use 'user' or 'assistant'."
    if history[-1]["role"] != "user":
        return "The last message must be the user's: there is nothing to answer."
    if not text_of(history[-1].get("content")).strip():
        return "The user's message is empty: type something first."
    return None
