"""A validated API request -> the prompt, with the engine's context limits as 400 / 413.

Chat messages (and tools) go through the checkpoint's chat template in the engine
(``host.prompt_ids``: refused, never trimmed, when they do not fit); a legacy completion
prompt is tokenised as it is, within the same limits.
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Tuple

from .errors import ApiError, bad_request
from .request import ApiRequest


def _refusal(exc: Exception, param: str) -> ApiError:
    from core import ContextError, InputTooLarge
    from core.images import ImageError

    if isinstance(exc, ImageError):
        return bad_request(exc.sentence(), param, code="invalid_image")
    if isinstance(exc, InputTooLarge):
        return ApiError(413, str(exc), param=param, code="input_too_large")
    if isinstance(exc, ContextError):
        out = ApiError(400, str(exc), param=param, code="context_length_exceeded")
        out.tokens = (exc.prompt_tokens, exc.window) if exc.prompt_tokens is not None else None
        return out
    return bad_request(f"The chat template could not render these messages: {exc}", param, code="invalid_messages")


def chat_prompt(host, req: ApiRequest, clamp: bool = False) -> Tuple[object, bool]:
    """(the prompt: a ``core.Prompt`` whose marks feed the prefix cache, whether the reply
    starts inside a ``<think>`` block the template opened). A structured reply (a grammar)
    is the answer itself: thinking is switched off for it.

    With `clamp` (Anthropic's rule), a max_tokens past what the context has left after the
    prompt is lowered to that room and ``req.clamped`` set, so the reply may end with
    ``model_context_window_exceeded``; the prompt itself must still fit. Claude Code asks for
    32,000 tokens whatever the model's context."""
    if req.grammar and host.has_thinking:
        req.enable_thinking = False
    try:
        prompt = host.prompt_ids(req.messages, max_tokens=1 if clamp else req.params.max_tokens, tools=req.tools,
                                 enable_thinking=req.enable_thinking)
    except Exception as exc:   # noqa: BLE001 - what the template or the limits refuse is the request's fault
        raise _refusal(exc, "messages") from None
    room = host.context_length - len(prompt.ids)
    if clamp and req.params.max_tokens > room:
        req.params, req.clamped = replace(req.params, max_tokens=room), True
    return prompt, host.opens_thinking(prompt)


def completion_prompt(host, req: ApiRequest) -> List[int]:
    """A legacy completion's text, tokenised as it is, within the same limits as a chat."""
    from core import ContextError, InputTooLarge

    try:
        if req.prompt_ids is not None:
            vocab = host.adapter.vocab_size
            bad = next((t for t in req.prompt_ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise bad_request(f"The prompt's token id {bad} is outside the vocabulary (0..{vocab - 1}).", "prompt")
            ids = list(req.prompt_ids)
        else:
            too_long = host.too_long(req.prompt)          # before tokenising: cheap
            if too_long:
                raise InputTooLarge(too_long)
            ids = list(host.tokenizer.encode(req.prompt))
        context, n = host.context_length, req.params.max_tokens
        if len(ids) + n > context:
            raise ContextError(f"The prompt is {len(ids):,} tokens; with max_tokens {n:,} that is more than the "
                               f"model's context of {context:,} tokens: shorten the prompt or lower max_tokens.")
    except ContextError as exc:
        raise _refusal(exc, "prompt") from None
    if not ids:
        raise bad_request("The prompt is empty once tokenised.", "prompt")
    return ids
