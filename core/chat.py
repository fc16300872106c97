"""Chat messages -> prompt ids through the checkpoint's own chat template (the one place).

`chat_prompt` also marks the positions a prefix-cache snapshot pays at: the end of the system
prompt and the end of the history just before the generation prompt, which is what the next
turn shares (reasoning templates drop earlier turns' thinking when the history is re-rendered,
so the state after a reply is of no use to the next turn).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from .images import ImageError, Picture
from .stream import Prompt

ROLES = ("system", "user", "assistant", "tool")
PASSED_THROUGH = ("tool_calls", "tool_call_id", "name", "reasoning_content")
# Natural text for padding a prompt to a given context (benchmarks and the cost model).
FILLER = ("The harbor was quiet in the early morning. Boats rocked at their moorings, gulls "
          "circled over the water, and the old lighthouse keeper walked along the pier, counting "
          "the ships that had come in during the night. ")


NO_TOWER = ("this model has no vision tower, so it reads text only: send the message without the "
            "picture, or load a checkpoint with one (a Qwen3.5 vision-language model)")


def _flatten(content, image_text: Optional[str], pictures: list) -> str:
    # Gradio 6 sends content as a list of blocks [{"type": "text", "text": ...}]; a picture is
    # {"type": "image", "picture": core.images.Picture} and becomes the model's placeholder text.
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        if content.get("type") == "image" and isinstance(content.get("picture"), Picture):
            if image_text is None:
                raise ImageError(NO_TOWER)
            pictures.append(content["picture"])
            return image_text
        return content.get("text", "") if content.get("type", "text") == "text" else ""
    if isinstance(content, (list, tuple)):
        return "".join(_flatten(c, image_text, pictures) for c in content)
    return "" if content is None else str(content)


def image_text(adapter) -> Optional[str]:
    """The text a picture stands as in a message (the model's placeholder), None without a tower."""
    vision = getattr(adapter, "vision", None)
    return vision.placeholder if vision is not None else None


def normalize_messages(messages: Sequence[dict], image_text: Optional[str] = None) -> List[dict]:
    """Messages as the template takes them: text content, a picture as `image_text` (refused when
    None: the model has no tower) with the pictures kept in order under "images"."""
    msgs = []
    for m in messages:
        if m.get("role") not in ROLES:
            raise ValueError(f"unknown chat role '{m.get('role')}': use one of {', '.join(ROLES)}")
        pictures = list(m.get("images") or ())
        msg = {"role": m["role"], "content": _flatten(m.get("content"), image_text, pictures)}
        msg.update({k: m[k] for k in PASSED_THROUGH if m.get(k) is not None})
        if pictures:
            msg["images"] = pictures
        msgs.append(msg)
    if not msgs:
        raise ValueError("no messages: the conversation is empty")
    return msgs


def render(adapter, msgs: List[dict], *, add_generation_prompt: bool = True, tools=None,
           enable_thinking: Optional[bool] = None) -> List[int]:
    tok = adapter.tokenizer
    if getattr(tok, "chat_template", None):
        kwargs = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
        if tools:
            kwargs["tools"] = tools
        ids = tok.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=True, **kwargs)
        if isinstance(ids, dict):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    # No template: a plain transcript, so base models still get a sensible prompt.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + ("assistant: " if add_generation_prompt else "")
    return tok.encode(text)


def chat_prompt(adapter, messages: Sequence[dict], *, tools=None, enable_thinking: Optional[bool] = None) -> Prompt:
    """The prompt for the assistant's next reply, with its snapshot marks."""
    msgs = normalize_messages(messages, image_text(adapter))
    ids = render(adapter, msgs, tools=tools, enable_thinking=enable_thinking)
    marks = []
    parts = ([msgs[:1]] if msgs[0]["role"] == "system" and len(msgs) > 1 else []) + [msgs]
    for part in parts:
        head = render(adapter, part, add_generation_prompt=False, tools=tools, enable_thinking=enable_thinking)
        if 0 < len(head) < len(ids) and ids[: len(head)] == head:
            marks.append(len(head))
    return _with_pictures(adapter, msgs, ids, sorted(set(marks)))


def _with_pictures(adapter, msgs: List[dict], ids: List[int], marks: List[int]) -> Prompt:
    """The prompt, each picture's placeholder expanded to its image tokens by the model's tower."""
    pictures = [p for m in msgs for p in m.get("images", ())]
    if not pictures:
        return Prompt(tuple(ids), tuple(marks))
    return adapter.vision.expand(ids, marks, pictures)


def history_prompt(adapter, messages: Sequence[dict], *, tools=None, enable_thinking: Optional[bool] = None) -> Prompt:
    """The conversation as the next turn's prompt will begin (no generation prompt; the
    template drops earlier thinking as it always does), marked at its end."""
    msgs = normalize_messages(messages, image_text(adapter))
    ids = render(adapter, msgs, add_generation_prompt=False, tools=tools, enable_thinking=enable_thinking)
    return _with_pictures(adapter, msgs, ids, [len(ids)])


def chat_prompt_ids(adapter, messages: List[dict], add_generation_prompt: bool = True) -> List[int]:
    if add_generation_prompt:
        return list(chat_prompt(adapter, messages).ids)
    return render(adapter, normalize_messages(messages, image_text(adapter)), add_generation_prompt=False)


def padded_chat_prompt(adapter, message: str, context: int) -> List[int]:
    """A one-message chat prompt of about `context` tokens: `message` after filler text."""
    ids = chat_prompt_ids(adapter, [{"role": "user", "content": message}])
    if context <= len(ids):
        return ids
    filler = adapter.tokenizer.encode(FILLER * (1 + 2 * context // max(1, len(adapter.tokenizer.encode(FILLER)))))
    lo, hi = 0, context
    while lo < hi:  # the longest filler that keeps the prompt within `context` tokens
        mid = (lo + hi + 1) // 2
        text = adapter.tokenizer.decode(filler[:mid]) + "\n\n" + message
        if len(chat_prompt_ids(adapter, [{"role": "user", "content": text}])) <= context:
            lo = mid
        else:
            hi = mid - 1
    return chat_prompt_ids(adapter, [{"role": "user", "content": adapter.tokenizer.decode(filler[:lo]) + "\n\n" + message}])
