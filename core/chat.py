"""Chat messages -> prompt ids through the checkpoint's own chat template (the one place).

`chat_prompt` also marks the positions a prefix-cache snapshot pays at: the end of the system
prompt and the end of the history just before the generation prompt, which is what the next
turn shares (reasoning templates drop earlier turns' thinking when the history is re-rendered,
so the state after a reply is of no use to the next turn).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from . import pieces
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
        kwargs = _template_kwargs(tools, enable_thinking)
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
    parts = ([msgs[:1]] if msgs[0]["role"] == "system" and len(msgs) > 1 else []) + [msgs]
    kw = {"tools": tools, "enable_thinking": enable_thinking}
    once = _marked_once(adapter, msgs, parts, kw) if _one_encoding(adapter, msgs) else None
    return _with_pictures(adapter, msgs, *(once or _marked_each(adapter, msgs, parts, kw)))


def _marked_each(adapter, msgs: List[dict], parts: list, kw: dict):
    """(ids, marks) with each mark's prefix rendered and encoded on its own."""
    ids = render(adapter, msgs, **kw)
    marks = []
    for part in parts:
        head = render(adapter, part, add_generation_prompt=False, **kw)
        if 0 < len(head) < len(ids) and ids[: len(head)] == head:
            marks.append(len(head))
    return ids, sorted(set(marks))


def _marked_once(adapter, msgs: List[dict], parts: list, kw: dict):
    """(ids, marks) from one encoding of the prompt's text, or None where a mark's prefix cannot
    be read off it. Why: an agent's prompt is re-sent whole every turn, and encoding it once per
    mark (the system prompt, the history) tripled the tokenizer's time (~15 ms per 20k tokens).
    A mark's prefix ends where an added token (<|im_start|>) begins, and a fast tokenizer splits
    its text at added tokens before anything else, so the prefix encodes alone as the whole text's first
    tokens (checked on this tokenizer once: _encodes_once). The text is encoded a piece at a time,
    the pieces sent before kept (core/pieces.py): an agent's turn encodes its new messages only."""
    tok = adapter.tokenizer
    text = _template_text(tok, msgs, True, kw)
    ids, starts, ends = pieces.encode(tok, text)
    specials = tuple(tok._tokenizer.get_added_vocab())   # split out before anything else, special or not
    marks = []
    for part in parts:
        head = _template_text(tok, part, False, kw)
        at = len(head)
        if not (0 < at < len(text) and text.startswith(head) and text.startswith(specials, at)):
            return None
        n = int((ends <= at).sum())
        if not (0 < n < len(ids)) or (n < len(ends) and starts[n] < at):
            return None
        marks.append(n)
    return ids.tolist(), sorted(set(marks))


def _template_kwargs(tools, enable_thinking) -> dict:
    kwargs = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
    if tools:
        kwargs["tools"] = tools
    return kwargs


def _template_text(tok, msgs: List[dict], add_generation_prompt: bool, kw: dict) -> str:
    return tok.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=False,
                                   **_template_kwargs(**kw))


_ONCE_PROBE = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is a harbor?"},
               {"role": "assistant", "content": "A sheltered port."}, {"role": "user", "content": "And a river? é 12"}]


def _encodes_once(adapter) -> bool:
    """Does _marked_once give what rendering each part gives, on this tokenizer? Asked once."""
    tok = adapter.tokenizer
    known = getattr(tok, "_mtp_encodes_once", None)
    if known is None:
        known = False
        hf = getattr(tok, "_tokenizer", None)
        if getattr(tok, "chat_template", None) and getattr(hf, "is_fast", False):
            try:
                msgs = normalize_messages(_ONCE_PROBE, image_text(adapter))
                parts, kw = [msgs[:1], msgs], {"tools": None, "enable_thinking": None}
                each = _marked_each(adapter, msgs, parts, kw)
                text = _template_text(tok, msgs, True, kw)
                known = len(each[1]) == len(parts) and _marked_once(adapter, msgs, parts, kw) == each \
                    and np.array_equal(pieces.encode(tok, text), pieces.whole(tok, text))   # pieces as the whole
            except Exception:   # noqa: BLE001 - any surprise: the per-part path, as before
                known = False
        try:
            tok._mtp_encodes_once = known
        except AttributeError:
            pass
    return known


def _one_encoding(adapter, msgs: List[dict]) -> bool:
    """Can `msgs`' rendered text be encoded once, a piece at a time (no picture to expand, a
    tokenizer that encodes as its parts do)?"""
    return not any(m.get("images") for m in msgs) and _encodes_once(adapter)


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
    kw = {"tools": tools, "enable_thinking": enable_thinking}
    if _one_encoding(adapter, msgs):   # the pieces sent before, kept
        ids = pieces.encode(adapter.tokenizer, _template_text(adapter.tokenizer, msgs, False, kw))[0].tolist()
    else:
        ids = render(adapter, msgs, add_generation_prompt=False, **kw)
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
