"""Chat messages -> prompt ids through the checkpoint's own chat template (the one place)."""
from __future__ import annotations

from typing import List


def _flatten(content) -> str:
    # Gradio 6 sends content as a list of blocks [{"type": "text", "text": ...}].
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return content.get("text", "") if content.get("type", "text") == "text" else ""
    if isinstance(content, (list, tuple)):
        return "".join(_flatten(c) for c in content)
    return "" if content is None else str(content)


def chat_prompt_ids(adapter, messages: List[dict], add_generation_prompt: bool = True) -> List[int]:
    msgs = [{"role": m["role"], "content": _flatten(m.get("content"))} for m in messages]
    if not msgs:
        raise ValueError("no messages: the conversation is empty")
    for m in msgs:
        if m["role"] not in ("system", "user", "assistant"):
            raise ValueError(f"unknown chat role '{m['role']}'")
    tok = adapter.tokenizer
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=True)
        if isinstance(ids, dict):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    # No template: a plain transcript, so base models still get a sensible prompt.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + ("assistant: " if add_generation_prompt else "")
    return tok.encode(text)
