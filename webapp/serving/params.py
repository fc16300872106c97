"""The sampler panel's values -> validated run parameters (one place for both tabs).

Extremes are legal (temperature 0 = greedy, top_p 1 and top_k 0 = off, max tokens 1);
nonsense raises :class:`ParamError` with a message meant for the user.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Union

from core.limits import MAX_SEED, MAX_TEMPERATURE, MAX_TOKENS

AUTO = "auto"


class ParamError(ValueError):
    """A sampler-panel value the engine must not be given."""


@dataclass(frozen=True)
class RunParams:
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    max_tokens: int
    seed: int
    depth: Union[int, str]

    def sampler(self):
        from core import SamplerConfig  # the engine validates its own semantics too
        try:
            return SamplerConfig(temperature=self.temperature, top_p=self.top_p,
                                 top_k=self.top_k, min_p=self.min_p)
        except (ValueError, TypeError) as exc:
            raise ParamError(str(exc)) from exc

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "min_p": self.min_p, "max_tokens": self.max_tokens, "seed": self.seed,
                "depth": self.depth}


def depth_choices(max_depth: int) -> List[str]:
    return [str(i) for i in range(1, max_depth + 1)] + [AUTO]


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or value is None or value == "":
        raise ParamError(f"{name} is missing: enter a number.")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ParamError(f"{name} must be a number, got {value!r}.") from None
    if not math.isfinite(x):
        raise ParamError(f"{name} must be a finite number, got {value!r}.")
    return x


def _integer(name: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value                   # exact: a float would round seeds above 2^53
    x = _number(name, value)
    if x != int(x):
        raise ParamError(f"{name} must be a whole number, got {value!r}.")
    return int(x)


def parse_params(temperature, top_p, top_k, min_p, max_tokens, seed, depth, *,
                 max_depth: int, max_tokens_limit: int = MAX_TOKENS) -> RunParams:
    """Validate the panel's raw values (as Gradio or an API client sends them)."""
    t = _number("Temperature", temperature)
    if not 0.0 <= t <= MAX_TEMPERATURE:
        raise ParamError(f"Temperature must be between 0 (greedy) and {MAX_TEMPERATURE:g}, got {t:g}.")
    p = _number("top_p", top_p)
    if not 0.0 < p <= 1.0:
        raise ParamError(f"top_p must be in (0, 1] (1 = off), got {p:g}.")
    k = _integer("top_k", top_k)
    if k < 0:
        raise ParamError(f"top_k must be 0 (off) or a positive whole number, got {k}.")
    m = _number("min_p", min_p)
    if not 0.0 <= m < 1.0:
        raise ParamError(f"min_p must be in [0, 1) (0 = off), got {m:g}.")
    n = _integer("Max tokens", max_tokens)
    if not 1 <= n <= max_tokens_limit:
        raise ParamError(f"Max tokens must be between 1 and {max_tokens_limit}, got {n}.")
    s = _integer("Seed", seed)
    if not 0 <= s <= MAX_SEED:
        raise ParamError(f"Seed must be a whole number from 0 to 2^64-1 (18446744073709551615), got {seed!r}.")
    d: Union[int, str]
    if isinstance(depth, str) and depth.strip().lower() == AUTO:
        d = AUTO
    else:
        d = _integer("Draft depth", depth)
        if not 1 <= d <= max_depth:
            raise ParamError(f"Draft depth must be 1..{max_depth} or 'auto', got {d}.")
    params = RunParams(t, p, k, m, n, s, d)
    params.sampler()   # let the engine refuse what it considers nonsense, with its message
    return params
