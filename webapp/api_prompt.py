"""A validated API request -> prompt token ids, with the engine's context limits as 400/413.

Chat messages (and tools) go through the checkpoint's chat template in the engine
(``host.prompt_ids``); a legacy completion prompt is tokenised as it is.
"""
from __future__ import annotations

from typing import List, Tuple

from .api_errors import ApiError, bad_request
from .api_request import ApiRequest

THINK_OPEN = "<think>"


class _ContextError(ValueError):
    """Stand-in until the engine has ``core.ContextError``."""


class _InputTooLarge(_ContextError):
    """Stand-in until the engine has ``core.InputTooLarge``."""


def _context_errors():
    """(ContextError, InputTooLarge) of the engine."""
    import core

    return getattr(core, "ContextError", _ContextError), getattr(core, "InputTooLarge", _InputTooLarge)


def _refusal(exc: Exception, param: str) -> ApiError:
    context_error, too_large = _context_errors()
    if isinstance(exc, too_large):
        return ApiError(413, str(exc), param=param, code="input_too_large")
    if isinstance(exc, context_error):
        return ApiError(400, str(exc), param=param, code="context_length_exceeded")
    return bad_request(f"The chat template could not render these messages: {exc}", param, code="invalid_messages")


def chat_prompt(host, req: ApiRequest) -> Tuple[List[int], bool]:
    """(prompt ids, whether the prompt leaves a <think> block open for the reply)."""
    try:
        ids = _prompt_ids(host, req.messages, max_tokens=req.params.max_tokens, tools=req.tools,
                          enable_thinking=req.enable_thinking)
    except Exception as exc:   # noqa: BLE001 - what the template or the limits refuse is the request's fault
        raise _refusal(exc, "messages") from None
    return ids, opens_thinking(host.tokenizer, ids)


def _prompt_ids(host, messages, *, max_tokens, tools, enable_thinking) -> List[int]:
    try:
        return list(host.prompt_ids(messages, max_tokens=max_tokens, tools=tools, enable_thinking=enable_thinking))
    except TypeError as exc:   # FALLBACK until host.prompt_ids takes these keywords
        if "unexpected keyword" not in str(exc):
            raise
    kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    ids = host.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, **kw)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def completion_prompt(host, req: ApiRequest) -> List[int]:
    """A legacy completion's text, tokenised as it is, within the same limits as a chat."""
    context_error, too_large = _context_errors()
    budget = getattr(host, "max_input_chars", None)
    try:
        if budget and len(req.prompt) > budget:
            raise too_large(f"The prompt has {len(req.prompt)} characters; at most {budget} are accepted.")
        ids = list(host.tokenizer.encode(req.prompt))
        context = context_length(host)
        if context and len(ids) + req.params.max_tokens > context:
            raise context_error(f"The prompt ({len(ids)} tokens) plus max_tokens ({req.params.max_tokens}) "
                                f"exceeds the model's context of {context} tokens: shorten the prompt or "
                                f"lower max_tokens.")
    except Exception as exc:   # noqa: BLE001
        raise _refusal(exc, "prompt") from None
    if not ids:
        raise bad_request("The prompt is empty once tokenised.", "prompt")
    return ids


def context_length(host):
    n = getattr(host, "context_length", None) or getattr(host.tokenizer, "model_max_length", None)
    return int(n) if isinstance(n, int) and 0 < n < 10**8 else None


def opens_thinking(tokenizer, ids: List[int]) -> bool:
    """True when the generation prompt ends inside an open ``<think>`` (Qwen3.5 templates
    open it for the model), so the reply starts as reasoning."""
    try:
        tail = tokenizer.decode(ids[-6:])
    except Exception:   # noqa: BLE001
        return False
    tail = tail.rstrip()
    return tail.endswith(THINK_OPEN)
