"""OpenAI request bodies -> a validated :class:`ApiRequest`, or an :class:`ApiError` saying why not.

JSON types are checked here; the sampler's ranges are checked in one place for the UI and
the API (``webapp.serving.params.parse_params``). A field this server does not know is refused
rather than silently ignored (it could change what the client expects), except a few that
only label a request (``user``, ``metadata``, ...). Fields that exist in the protocol but
that the engine cannot honour (``n > 1``, penalties, ``logit_bias``) are accepted only at
their neutral value.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Tuple

from .errors import ApiError, bad_request
from ..serving.inputs import clean_text
from ..serving.params import ParamError, RunParams, parse_params

MAX_STOPS = 8
MAX_STOP_CHARS = 512
MAX_TOOLS = 128
MAX_MESSAGES = 4096
MODES = ("mtp", "ar")

# Labels and hints that do not change the reply.
IGNORED = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
           "parallel_tool_calls"}
# Protocol fields accepted only at the value that leaves the reply unchanged.
NEUTRAL = {"n": (None, 1), "best_of": (None, 1), "frequency_penalty": (None, 0), "presence_penalty": (None, 0),
           "logit_bias": (None, {}), "suffix": (None, ""), "reasoning_effort": (None,)}
WHY_NOT = {
    "n": "this server returns one choice per request: send n=1 (or leave it out) and repeat the request",
    "best_of": "best_of is not supported: send best_of=1 (or leave it out)",
    "frequency_penalty": "penalties are not supported (they would change the sampled distribution)",
    "presence_penalty": "penalties are not supported (they would change the sampled distribution)",
    "logit_bias": "logit_bias is not supported",
    "suffix": "suffix (fill-in-the-middle) is not supported",
    "reasoning_effort": "reasoning_effort is not supported; use enable_thinking (true/false)",
}
SAMPLING = {"temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens",
            "mode", "depth", "stop", "stream", "stream_options", "model"}
CHAT_FIELDS = SAMPLING | {"messages", "tools", "tool_choice", "response_format", "enable_thinking",
                          "chat_template_kwargs", "logprobs", "top_logprobs"}
COMPLETION_FIELDS = SAMPLING | {"prompt", "logprobs", "echo"}
MAX_LOGPROBS = 20
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


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


# --- typed field readers --------------------------------------------------------------
def _number(body: dict, key: str) -> Optional[float]:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_request(f"'{key}' must be a number, got {json.dumps(v)[:40]}.", key)
    if isinstance(v, float) and not math.isfinite(v):
        raise bad_request(f"'{key}' must be a finite number.", key)
    return v


def _integer(body: dict, key: str) -> Optional[int]:
    v = _number(body, key)
    if v is None:
        return None
    if v != int(v):
        raise bad_request(f"'{key}' must be a whole number, got {v!r}.", key)
    return int(v)


def _bool(body: dict, key: str) -> Optional[bool]:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise bad_request(f"'{key}' must be true or false.", key)
    return v


def _string(v: Any, what: str, param: str) -> str:
    if not isinstance(v, str):
        raise bad_request(f"{what} must be a string.", param)
    return clean_text(v)


# --- the whole body ----------------------------------------------------------------
def check_fields(body: dict, allowed: set) -> None:
    for key, value in body.items():
        if key in IGNORED:
            continue
        if key in NEUTRAL:
            if value not in NEUTRAL[key]:
                raise bad_request(f"'{key}'={json.dumps(value)[:40]} is not supported: {WHY_NOT[key]}.", key,
                                  code="unsupported_parameter")
            continue
        if key not in allowed:
            raise bad_request(f"Unknown field '{key}': this server does not support it, and ignoring it could "
                              f"change what you expect. Remove it.", key, code="unknown_parameter")


def parse_sampling(body: dict, settings, max_depth: int, max_tokens_default: int) -> Tuple[RunParams, str]:
    temperature = _number(body, "temperature")
    top_p = _number(body, "top_p")
    top_k = _integer(body, "top_k")
    min_p = _number(body, "min_p")
    seed = _integer(body, "seed")
    max_tokens = _integer(body, "max_completion_tokens")      # wins over max_tokens
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens")
    depth = body.get("depth")
    if depth is not None and not (isinstance(depth, str) or (isinstance(depth, int) and not isinstance(depth, bool))):
        raise bad_request(f"'depth' must be 1..{max_depth} or \"auto\".", "depth")
    mode = body.get("mode", "mtp")
    if mode not in MODES:
        raise bad_request("'mode' must be \"mtp\" (speculative) or \"ar\" (plain decoding).", "mode")
    if seed is None or seed == -1:      # -1: "random", as several front-ends send it
        import secrets
        seed = secrets.randbits(64)     # as OpenAI: no seed, no promise of the same reply
    try:
        params = parse_params(settings.temperature if temperature is None else temperature,
                              settings.top_p if top_p is None else top_p,
                              settings.top_k if top_k is None else top_k,
                              settings.min_p if min_p is None else min_p,
                              max_tokens_default if max_tokens is None else max_tokens,
                              seed, settings.depth if depth is None else depth, max_depth=max_depth)
    except ParamError as exc:
        raise bad_request(str(exc), _param_of(str(exc))) from None
    return params, mode


def _param_of(message: str) -> Optional[str]:
    for prefix, name in (("Temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                         ("min_p", "min_p"), ("Max tokens", "max_tokens"), ("Seed", "seed"),
                         ("Draft depth", "depth")):
        if message.startswith(prefix):
            return name
    return None


def parse_stops(body: dict) -> Tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS:
        raise bad_request(f"'stop' must be a string or a list of at most {MAX_STOPS} strings.", "stop")
    out = []
    for s in stops:
        s = _string(s, "Each stop sequence", "stop")
        if not s or len(s) > MAX_STOP_CHARS:
            raise bad_request(f"Each stop sequence must have 1..{MAX_STOP_CHARS} characters.", "stop")
        out.append(s)
    return tuple(out)


def parse_stream(body: dict) -> Tuple[bool, bool]:
    stream = bool(_bool(body, "stream"))
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise bad_request("'stream_options' must be an object.", "stream_options")
    if not stream:
        raise bad_request("'stream_options' is only allowed with \"stream\": true.", "stream_options")
    for key in opts:
        if key not in ("include_usage", "include_obfuscation"):
            raise bad_request(f"Unknown stream option '{key}' (supported: include_usage).", "stream_options")
    return stream, bool(_bool(opts, "include_usage"))


def parse_common(body: dict, allowed: set, settings, max_depth: int, max_tokens_default: int) -> ApiRequest:
    check_fields(body, allowed)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string.", "model")
    params, mode = parse_sampling(body, settings, max_depth, max_tokens_default)
    stream, include_usage = parse_stream(body)
    return ApiRequest(params=params, mode=mode, stream=stream, include_usage=include_usage,
                      stops=parse_stops(body), model=model)


# --- chat completions --------------------------------------------------------------------
def _content(v: Any, i: int, role: str, budget=None):
    """A message's content: its text, or (when it holds pictures) a list of text and image blocks."""
    from core.images import Picture

    from .images import Budget, picture

    where = f"messages[{i}].content"
    if v is None:
        return ""
    if isinstance(v, str):
        return clean_text(v)
    if not isinstance(v, list):
        raise bad_request(f"{where} must be a string or a list of text and image_url parts.", where)
    out = []
    for j, part in enumerate(v):
        if not isinstance(part, dict):
            raise bad_request(f"{where}[{j}] must be an object like {{\"type\": \"text\", \"text\": ...}}.", where)
        kind = part.get("type")
        if kind in ("image_url", "input_image") and role == "user":
            out.append({"type": "image", "picture": picture(part, where, budget or Budget())})
        elif kind == "image" and isinstance(part.get("picture"), Picture):   # parsed before (a stored turn)
            out.append(part)
        elif kind != "text":
            raise bad_request(f"{where}[{j}] has type {json.dumps(kind)[:30]}: a {role} message holds parts of "
                              "type \"text\"" + (" and \"image_url\" (base64 data: URLs)" if role == "user" else "")
                              + ".", where, code="unsupported_content")
        else:
            out.append({"type": "text", "text": _string(part.get("text"), f"{where}[{j}].text", where)})
    if all(b["type"] == "text" for b in out):
        return "".join(b["text"] for b in out)
    return out


def _tool_calls(v: Any, i: int) -> List[dict]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(v, list):
        raise bad_request(f"{where} must be a list.", where)
    out = []
    for call in v:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}: each call needs function.name and function.arguments.", where)
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass                        # the template writes a string as it is
        out.append({"type": "function", "id": str(call.get("id", "")),
                    "function": {"name": clean_text(fn["name"]), "arguments": args}})
    return out


def parse_messages(v: Any, settings=None, pictures: bool = True) -> List[dict]:
    """Chat messages, checked; `pictures` False: the model has no vision tower (pictures refused)."""
    from .images import Budget

    budget = Budget.of(settings, pictures)
    if not isinstance(v, list) or not v:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects.", "messages")
    if len(v) > MAX_MESSAGES:
        raise ApiError(413, f"Too many messages ({len(v)}; at most {MAX_MESSAGES}).", param="messages",
                       code="context_length_exceeded")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object.", "messages")
        role = ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
        if role is None:
            raise bad_request(f"messages[{i}].role must be one of system, developer, user, assistant, tool; "
                              f"got {json.dumps(m.get('role'))[:30]}.", "messages")
        if m.get("content") is None and role != "assistant":   # only an assistant's tool calls stand alone
            raise bad_request(f"messages[{i}].content is missing: a {m['role']} message needs its text in "
                              f"\"content\".", f"messages[{i}].content")
        msg = {"role": role, "content": _content(m.get("content"), i, role, budget)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = clean_text(m["reasoning_content"])
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def parse_tools(body: dict) -> Tuple[Optional[List[dict]], Optional[str]]:
    """(the tools for the template, the grammar of a forced call: tool_choice "required" or a
    named function)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice == "none" or tools is None or tools == []:
        if choice not in (None, "auto", "none"):
            raise bad_request("'tool_choice' asks for a tool call but no tools were given.", "tool_choice")
        return None, None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"'tools' must be a list of at most {MAX_TOOLS} function tools.", "tools")
    out = []
    for i, t in enumerate(tools):
        flat = isinstance(t, dict) and t.get("type") == "function" and "function" not in t   # Responses' shape
        fn = t if flat else (t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                              f"\"parameters\": {{...}}}}}}.", "tools")
        out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters", {}), i))
    return out, forced_tool(choice, out)


def function_tool(name: Any, description: Any, params: Any, i: int) -> dict:
    """One tool as the chat template takes it (OpenAI's chat shape)."""
    if not isinstance(name, str) or not name.strip():
        raise bad_request(f"tools[{i}] needs a non-empty \"name\".", "tools")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise bad_request(f"tools[{i}]: the parameters must be a JSON schema object.", "tools")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"tools[{i}]: the description must be a string.", "tools")
    clean = {"name": clean_text(name), "parameters": params}
    if description:
        clean["description"] = clean_text(description)
    return {"type": "function", "function": clean}


def forced_tool(choice: Any, tools: List[dict], required: str = "required") -> Optional[str]:
    """The grammar for tool_choice (None when the model may answer in text)."""
    from .structured import tool_call_grammar

    if choice in (None, "auto"):
        return None
    if choice == required:
        return tool_call_grammar(tools)
    name = None
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function") if isinstance(choice.get("function"), dict) else choice   # chat or Responses
        name = fn.get("name")
    if not isinstance(name, str):
        raise bad_request(f"'tool_choice' must be \"auto\", \"none\", \"{required}\" or "
                          f"{{\"type\": \"function\", \"name\": ...}}; got {json.dumps(choice)[:60]}.", "tool_choice")
    if name not in [t["function"]["name"] for t in tools]:
        raise bad_request(f"'tool_choice' names the function '{name[:60]}', which is not among the tools.",
                          "tool_choice")
    return tool_call_grammar(tools, name)


def parse_thinking(body: dict) -> Optional[bool]:
    thinking = _bool(body, "enable_thinking")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}:
            raise bad_request("'chat_template_kwargs' may only hold enable_thinking (true/false).",
                              "chat_template_kwargs")
        if thinking is None:
            thinking = _bool(kwargs, "enable_thinking")
    return thinking


def parse_logprobs(body: dict) -> Optional[int]:
    """Chat: ``logprobs`` true/false and ``top_logprobs`` 0..20 -> alternatives, or None (off)."""
    on, top = _bool(body, "logprobs"), _integer(body, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise bad_request(f"'top_logprobs' must be 0..{MAX_LOGPROBS}, got {top}.", "top_logprobs")
    if top is not None and not on:
        raise bad_request("'top_logprobs' needs \"logprobs\": true.", "top_logprobs")
    return (top or 0) if on else None


def parse_chat(body: dict, settings, max_depth: int, max_tokens_default: int, pictures: bool = True) -> ApiRequest:
    from .structured import response_format

    req = parse_common(body, CHAT_FIELDS, settings, max_depth, max_tokens_default)
    req.messages = parse_messages(body.get("messages"), settings, pictures)
    req.tools, forced = parse_tools(body)
    req.grammar = one_grammar(response_format(body.get("response_format")), forced)
    req.enable_thinking = parse_thinking(body)
    req.logprobs = parse_logprobs(body)
    return req


def one_grammar(fmt, forced):
    """A forced tool call wins over a reply format: the reply is then the call (as OpenAI's)."""
    return forced or fmt


# --- legacy completions ---------------------------------------------------------------------
def parse_completion(body: dict, settings, max_depth: int, max_tokens_default: int) -> ApiRequest:
    echo = bool(_bool(body, "echo"))
    if echo and body.get("max_tokens") == 0 and body.get("max_completion_tokens") is None:
        body = {**body, "max_tokens": 1}    # echo alone: the prompt's logprobs, nothing generated
        only_prompt = True
    else:
        only_prompt = False
    req = parse_common(body, COMPLETION_FIELDS, settings, max_depth, max_tokens_default)
    req.echo, req.stops = echo, () if only_prompt else req.stops
    req.params = req.params if not only_prompt else replace(req.params, max_tokens=0)
    top = _integer(body, "logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise bad_request(f"'logprobs' must be 0..{MAX_LOGPROBS} (how many alternatives per token), got {top}.",
                          "logprobs")
    req.logprobs = top
    if echo and req.stream:
        raise bad_request("'echo' is not supported with \"stream\": true; ask for the whole reply.", "echo")
    prompt = body.get("prompt")
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
