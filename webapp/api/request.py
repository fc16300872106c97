"""What every protocol's request becomes: an :class:`ApiRequest` (the decode's parameters, the
template-ready messages or prompt, the grammar), and the steps all protocols share on the way.

Each protocol's body is a pydantic model (openai_request.py, responses_request.py,
anthropic_request.py; the field types in fields.py) that checks the JSON types; the sampler's
ranges are checked in one place for the page and the API (``webapp.serving.params.parse_params``,
the limits in ``core/limits.py``), here turned into the same 400s.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..serving.params import ParamError, RunParams, parse_params
from .errors import bad_request


@dataclass
class ApiRequest:
    params: RunParams
    mode: str = "mtp"
    stream: bool = False
    include_usage: bool = False
    stops: Tuple[str, ...] = ()
    model: Optional[str] = None
    messages: Optional[List[dict]] = None        # chat: template-ready messages
    tools: Optional[List[dict]] = None
    enable_thinking: Optional[bool] = None
    prompt: Optional[str] = None                 # completions: the text to continue
    prompt_ids: Optional[List[int]] = None       # completions: or its token ids
    grammar: object = None                       # structured output: a grammar, or a function of the tokenizer (api.structured)
    call_grammar: object = None                  # tool_choice "auto": what a call is held to once the model opens one
    logprobs: Optional[int] = None               # log-probabilities with this many alternatives
    echo: bool = False                           # completions: the prompt's own logprobs too
    conversation: Optional[dict] = None          # Responses: store, previous_response_id, instructions
    clamped: bool = False                        # Anthropic: max_tokens lowered to the context's room


def loads(raw: bytes) -> dict:
    """The body as a JSON object; NaN/Infinity, bad UTF-8 and absurd nesting are 400s."""
    def no_constants(name):
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except UnicodeDecodeError:
        raise bad_request("The body is not valid UTF-8.", code="invalid_json") from None
    except RecursionError:
        raise bad_request("The body is nested too deeply.", code="invalid_json") from None
    except ValueError as exc:
        raise bad_request(f"The body is not valid JSON: {exc}.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.", code="invalid_json")
    return body


def run_params(body, settings, max_depth: int, max_tokens_default: int,
               max_tokens: Optional[int] = None) -> RunParams:
    """A validated body's sampler fields (`body`: a fields.Sampled) and the server's defaults ->
    RunParams, with the ranges checked once for the page and the API."""
    seed = body.seed
    if seed is None or seed == -1:      # -1: "random", as several front-ends send it
        seed = secrets.randbits(64)     # as OpenAI: no seed, no promise of the same reply
    try:
        return parse_params(settings.temperature if body.temperature is None else body.temperature,
                            settings.top_p if body.top_p is None else body.top_p,
                            settings.top_k if body.top_k is None else body.top_k,
                            settings.min_p if body.min_p is None else body.min_p,
                            max_tokens_default if max_tokens is None else max_tokens,
                            seed, settings.depth if body.depth is None else body.depth, max_depth=max_depth)
    except ParamError as exc:
        raise bad_request(str(exc), _param_of(str(exc))) from None


def _param_of(message: str) -> Optional[str]:
    for prefix, name in (("Temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                         ("min_p", "min_p"), ("Max tokens", "max_tokens"), ("Seed", "seed"),
                         ("Draft depth", "depth")):
        if message.startswith(prefix):
            return name
    return None


def set_grammars(req: "ApiRequest", fmt, forced) -> None:
    """A forced tool call wins over a reply format: the reply is then the call (as OpenAI's).
    With neither, offered tools' calls are held to their names and parameter schemas once the
    model opens one (``call_grammar``); the rest of the reply stays free."""
    req.grammar = forced or fmt
    if req.grammar is None and req.tools:
        from .structured import tool_call_grammar

        req.call_grammar = tool_call_grammar(req.tools, lazy=True)
