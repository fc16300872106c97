"""OpenAI's request bodies: chat completions (``POST /v1/chat/completions``) and legacy
completions (``POST /v1/completions``), as pydantic models -> an :class:`ApiRequest`.

The models check every field's JSON type at once (fields.py); what needs the server (the
sampler's defaults and ranges, the picture budget, the tool grammar) is done in `parse_chat` /
`parse_completion` after them. This server's extensions (``mode``, ``depth``, ``top_k``,
``min_p``, ``enable_thinking``) are fields like the others.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from pydantic import AfterValidator, BeforeValidator, ValidationInfo, model_validator
from typing_extensions import Annotated

from core.limits import MAX_LOGPROBS

from ..serving.inputs import clean_text
from .errors import bad_request
from .fields import Flag, Sampled, Stops, Whole, fail, flag, validate
from .messages import parse_messages, parse_tools
from .request import ApiRequest, set_grammars, run_params
from .structured import response_format


def _stream_options(v: Any, info: ValidationInfo) -> Optional[dict]:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise fail("'stream_options' must be an object.", "stream_options")
    if not info.data.get("stream"):          # declared before stream_options: checked already
        raise fail("'stream_options' is only allowed with \"stream\": true.", "stream_options")
    for key in v:
        if key not in ("include_usage", "include_obfuscation"):
            raise fail(f"Unknown stream option '{key}' (supported: include_usage).", "stream_options")
    if v.get("include_usage") is not None:
        flag(v["include_usage"], "include_usage")
    return v


def _template_kwargs(v: Any) -> Optional[dict]:
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) - {"enable_thinking"}:
        raise fail("'chat_template_kwargs' may only hold enable_thinking (true/false).", "chat_template_kwargs")
    if v.get("enable_thinking") is not None:
        flag(v["enable_thinking"], "enable_thinking")
    return v


def _alternatives(key: str, hint: str = "") -> AfterValidator:
    """How many alternatives per token a client may ask for: 0..MAX_LOGPROBS."""
    def check(top: Optional[int]) -> Optional[int]:
        if top is not None and not 0 <= top <= MAX_LOGPROBS:
            raise fail(f"'{key}' must be 0..{MAX_LOGPROBS}{hint}, got {top}.", key)
        return top
    return AfterValidator(check)


class OpenAIBody(Sampled):
    """The fields chat and legacy completions share."""
    max_tokens: Whole = None
    max_completion_tokens: Whole = None        # wins over max_tokens
    stop: Stops = ()
    stream: Flag = None
    stream_options: Annotated[Optional[dict], BeforeValidator(_stream_options)] = None

    def request(self, settings, max_depth: int, max_tokens_default: int) -> ApiRequest:
        max_tokens = self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens
        return ApiRequest(params=run_params(self, settings, max_depth, max_tokens_default, max_tokens),
                          mode=self.mode, stream=bool(self.stream),
                          include_usage=bool((self.stream_options or {}).get("include_usage")),
                          stops=self.stop, model=self.model)


class ChatRequest(OpenAIBody):
    messages: Any = None                       # checked with the picture budget (messages.py)
    tools: Any = None
    tool_choice: Any = None
    response_format: Any = None
    enable_thinking: Flag = None
    chat_template_kwargs: Annotated[Optional[dict], BeforeValidator(_template_kwargs)] = None
    logprobs: Flag = None
    top_logprobs: Annotated[Whole, _alternatives("top_logprobs")] = None

    @model_validator(mode="after")
    def _alternatives_need_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise fail("'top_logprobs' needs \"logprobs\": true.", "top_logprobs")
        return self

    def thinking(self) -> Optional[bool]:
        if self.enable_thinking is not None:
            return self.enable_thinking
        return (self.chat_template_kwargs or {}).get("enable_thinking")


class CompletionRequest(OpenAIBody):
    prompt: Any = None
    logprobs: Annotated[Whole, _alternatives("logprobs", " (how many alternatives per token)")] = None
    echo: Flag = None


def parse_chat(body: dict, settings, max_depth: int, max_tokens_default: int, pictures: bool = True) -> ApiRequest:
    chat = validate(ChatRequest, body, max_depth=max_depth)
    req = chat.request(settings, max_depth, max_tokens_default)
    req.messages = parse_messages(chat.messages, settings, pictures)
    req.tools, forced = parse_tools(chat.tools, chat.tool_choice)
    set_grammars(req, response_format(chat.response_format), forced)
    req.enable_thinking = chat.thinking()
    req.logprobs = (chat.top_logprobs or 0) if chat.logprobs else None
    return req


def parse_completion(body: dict, settings, max_depth: int, max_tokens_default: int) -> ApiRequest:
    echo = body.get("echo") is True
    only_prompt = echo and body.get("max_tokens") == 0 and body.get("max_completion_tokens") is None
    if only_prompt:
        body = {**body, "max_tokens": 1}    # echo alone: the prompt's logprobs, nothing generated
    completion = validate(CompletionRequest, body, max_depth=max_depth)
    req = completion.request(settings, max_depth, max_tokens_default)
    req.echo, req.logprobs = bool(completion.echo), completion.logprobs
    if only_prompt:
        req.stops, req.params = (), replace(req.params, max_tokens=0)
    if req.echo and req.stream:
        raise bad_request("'echo' is not supported with \"stream\": true; ask for the whole reply.", "echo")
    prompt = completion.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                     # one prompt in a list
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        req.prompt_ids = list(prompt)          # token ids (lm-eval sends them)
        return req
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("'prompt' must be a non-empty string or a list of token ids (one prompt per request).",
                          "prompt")
    req.prompt = clean_text(prompt)
    return req
