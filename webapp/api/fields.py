"""The JSON types of request fields, as pydantic types, and a validation error as the 400 a
client can act on.

Each protocol's request model (openai_request.py, responses_request.py, anthropic_request.py)
declares its fields with these types and pydantic checks a whole body at the edge. Why not
pydantic's own lax types: they take "0.5" for a number and true for 1, and a client that sends
those has a bug it should hear about; a float with a whole value (10.0) is still a whole number,
as JSON has one number type. Each type's check raises a PydanticCustomError whose type is the
error code and whose context carries the message (and the param, where it is not the field's
own name); `refusal` turns the first error into an ApiError, which each route writes in its
protocol's shape (errors.error_body for OpenAI's, anthropic.anthropic_error for Anthropic's).
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional, Tuple

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError
from typing_extensions import Annotated

from core.limits import MAX_DEPTH, MAX_STOP_CHARS, MAX_STOPS

from ..serving.inputs import clean_text
from .errors import ApiError, bad_request

MODES = ("mtp", "ar")
# Labels and hints that do not change the reply.
IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
           "parallel_tool_calls")
# Protocol fields accepted only at the value that leaves the reply unchanged, and why.
NEUTRAL = {
    "n": ((None, 1), "this server returns one choice per request: send n=1 (or leave it out) and repeat the request"),
    "best_of": ((None, 1), "best_of is not supported: send best_of=1 (or leave it out)"),
    "frequency_penalty": ((None, 0), "penalties are not supported (they would change the sampled distribution)"),
    "presence_penalty": ((None, 0), "penalties are not supported (they would change the sampled distribution)"),
    "logit_bias": ((None, {}), "logit_bias is not supported"),
    "suffix": ((None, ""), "suffix (fill-in-the-middle) is not supported"),
    "reasoning_effort": ((None,), "reasoning_effort is not supported; use enable_thinking (true/false)"),
}


def fail(message: str, param: Optional[str] = None, code: str = "invalid_value") -> PydanticCustomError:
    """The error a check raises: `code` becomes the error's code, `param` (default: the field's
    name) its param."""
    return PydanticCustomError(code, "{message}", {"message": message, "param": param})


def _got(v: Any, n: int = 40) -> str:
    return json.dumps(v)[:n]


def _checked(check: Callable[[Any, str], Any]):
    """`check(value, field name)` as a pydantic type's validator; null is absent."""
    def validate(v: Any, info: ValidationInfo) -> Any:
        return None if v is None else check(v, info.field_name)
    return BeforeValidator(validate)


def number(v: Any, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise fail(f"'{key}' must be a number, got {_got(v)}.", key)
    if isinstance(v, float) and not math.isfinite(v):
        raise fail(f"'{key}' must be a finite number.", key)
    return v


def whole(v: Any, key: str) -> int:
    v = number(v, key)
    if v != int(v):
        raise fail(f"'{key}' must be a whole number, got {v!r}.", key)
    return int(v)


def flag(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise fail(f"'{key}' must be true or false.", key)
    return v


def string(v: Any, key: str) -> str:
    if not isinstance(v, str):
        raise fail(f"'{key}' must be a string.", key)
    return v


def text(v: Any, what: str, param: str) -> str:
    """A string inside a structure (a message's text): cleaned, or an ApiError naming `what`."""
    if not isinstance(v, str):
        raise bad_request(f"{what} must be a string.", param)
    return clean_text(v)


def _mode(v: Any) -> str:
    if v not in MODES:
        raise fail("'mode' must be \"mtp\" (speculative) or \"ar\" (plain decoding).")
    return v


def _depth(v: Any, info: ValidationInfo) -> Any:
    if v is not None and not (isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))):
        raise fail(f"'depth' must be 1..{(info.context or {}).get('max_depth', MAX_DEPTH)} or \"auto\".")
    return v


def stops(v: Any, param: str = "stop") -> Tuple[str, ...]:
    """A stop string or a list of them, each 1..MAX_STOP_CHARS characters (Anthropic's
    stop_sequences too, named "stop" in errors as before)."""
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or len(items) > MAX_STOPS:
        raise fail(f"'stop' must be a string or a list of at most {MAX_STOPS} strings.", param)
    out = []
    for s in items:
        if not isinstance(s, str):
            raise fail("Each stop sequence must be a string.", param)
        s = clean_text(s)
        if not s or len(s) > MAX_STOP_CHARS:
            raise fail(f"Each stop sequence must have 1..{MAX_STOP_CHARS} characters.", param)
        out.append(s)
    return tuple(out)


def _neutral(v: Any, info: ValidationInfo) -> Any:
    values, why = NEUTRAL[info.field_name]
    if v not in values:
        raise fail(f"'{info.field_name}'={_got(v)} is not supported: {why}.", code="unsupported_parameter")
    return v


Number = Annotated[Optional[float], _checked(number)]
Whole = Annotated[Optional[int], _checked(whole)]
Flag = Annotated[Optional[bool], _checked(flag)]
Text = Annotated[Optional[str], _checked(string)]
Mode = Annotated[str, BeforeValidator(_mode)]
Depth = Annotated[Any, BeforeValidator(_depth)]
Stops = Annotated[Tuple[str, ...], BeforeValidator(lambda v: () if v is None else stops(v))]
Neutral = Annotated[Any, BeforeValidator(_neutral)]


class Body(BaseModel):
    """What every protocol's body may hold besides its own fields: labels that change nothing,
    and OpenAI's knobs this engine cannot turn, at the value that leaves the reply unchanged.
    Any other field is refused (extra="forbid"): ignoring it could change what the client expects."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    parallel_tool_calls: Any = None
    n: Neutral = None
    best_of: Neutral = None
    frequency_penalty: Neutral = None
    presence_penalty: Neutral = None
    logit_bias: Neutral = None
    suffix: Neutral = None
    reasoning_effort: Neutral = None


class Sampled(Body):
    """The sampler's fields every protocol takes (the last five are this server's extensions)."""
    model: Text = None
    temperature: Number = None
    top_p: Number = None
    top_k: Whole = None
    min_p: Number = None
    seed: Whole = None
    mode: Mode = "mtp"
    depth: Depth = None


def refusal(exc: ValidationError) -> ApiError:
    """The first error (a refused or unknown field first, as a client fixes those first) as a 400."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] not in ("extra_forbidden", "unsupported_parameter"))
    e = errors[0]
    field = ".".join(str(p) for p in e["loc"]) or None
    ctx = e.get("ctx") or {}
    if e["type"] == "extra_forbidden":
        return ApiError(400, f"Unknown field '{field}': this server does not support it, and ignoring it could "
                             f"change what you expect. Remove it.", param=field, code="unknown_parameter")
    if "message" in ctx:
        return ApiError(400, ctx["message"], param=ctx.get("param") or field, code=e["type"])
    return ApiError(400, f"'{field}': {e['msg']}.", param=field, code="invalid_value")   # pydantic's own words


def validate(model: type, body: dict, **context) -> Any:
    """`body` as `model`, or the ApiError of its first problem."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as exc:
        raise refusal(exc) from None
