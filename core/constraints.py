"""Structured output: a grammar's token mask, advanced and rolled back with the decode.

Both lanes take an optional :class:`Constraint`. Before a position is sampled, ``allowed()``
gives the tokens the grammar permits there; the sampler (``SamplerConfig``, the one definition
for p, q and the AR lane) sets every other logit to -inf. The MTP lane masks each draft's q
with the mask after the drafts before it, and each verified row of p with the same masks; the
grammar advances over the drafts as they are drawn and rolls back past the rejected ones. With
p and q both masked, min(1, p/q) acceptance keeps MTP exact for the constrained distribution.

Why llguidance (scripts/bench/bench_constrained.py --libs, docs/bench/cpu-constrained-demo.json, the
demo tokenizer of 8,192 tokens; median / p95 per-token mask, compile): on a nested schema with
bounds llguidance 26 / 75 us, 1 ms; outlines-core 20 / 27 us but 380 ms to build its index
up front (it grows with vocabulary and schema); on a simpler schema, in a one-off install,
xgrammar 3.2 / 12 us, 16 ms. All three roll back, and every mask is far below a decode step
(~10 ms here), so the deciding facts are elsewhere: xgrammar needs torch (4.4 GB of CUDA
wheels from PyPI on Linux) for an MLX app; outlines-core takes regular expressions only and
pays its index for every new schema; llguidance compiles lazily, takes JSON schema and Lark
(a tool call's wrapper around its arguments' schema is one rule), and is what llama.cpp, vLLM
and SGLang use. In a decode the grammar's host work (mask, its conversion, advance, rollback)
is 250-360 us per token; greedy MTP/AR goes 1.65x -> 1.33x with a schema, because each draft
waits for its mask (one sync per draft instead of one per cycle).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

import mlx.core as mx
import numpy as np

# Separators as json.dumps writes them; bounded whitespace (no runs of newlines to loop on).
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """The grammar or schema cannot be compiled (the message says why)."""


_TOKENIZERS: Dict[int, object] = {}


def prepare_tokenizer(tokenizer) -> None:
    """Build llguidance's view of `tokenizer` now (at start-up), not in the first request that
    holds a grammar (a tool call, a reply format): 1.3 s for a 248k-token vocabulary on a 2-core
    CPU, 0.1 s for 8k."""
    _ll_tokenizer(tokenizer)


def _ll_tokenizer(tokenizer):
    """llguidance's view of the tokenizer (built once per tokenizer: prepare_tokenizer)."""
    import llguidance.hf

    key = id(tokenizer)
    if key not in _TOKENIZERS:
        hf = getattr(tokenizer, "_tokenizer", tokenizer)   # mlx-lm's TokenizerWrapper holds the HF one
        _TOKENIZERS[key] = (tokenizer, llguidance.hf.from_tokenizer(hf))
    return _TOKENIZERS[key][1]


def lark_text(tokenizer, text: str) -> str:
    """`text` as a Lark terminal. A tag the tokenizer holds as one added token (Qwen's
    ``<tool_call>``) is that token (``<[id]>``): llguidance treats added tokens as special, so
    the quoted text would make the model spell the tag out in pieces it never writes."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if len(ids) == 1 and _ll_tokenizer(tokenizer).is_special_token(ids[0]):
        return f"<[{ids[0]}]>"
    return json.dumps(text)


def closed(schema):
    """`schema` with objects that list their properties closed to others unless they say so
    (``additionalProperties: false``), as xgrammar's strict mode does. An open object lets a
    weak model invent keys with endless strings (on the demo model 35 of 50 LangChain function
    calls ran to max_tokens that way); a client's schema that wants extra keys says so."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: closed(sub) for name, sub in value.items()}
        elif key in ("enum", "const", "default", "examples", "required"):
            out[key] = value
        else:
            out[key] = closed(value)
    if "properties" in out and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_schema_grammar(schema: dict) -> str:
    """A grammar for one JSON value matching `schema` (raises GrammarError if it cannot)."""
    import llguidance

    try:
        return llguidance.LLMatcher.grammar_from_json_schema(closed(schema), defaults=JSON_STYLE)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GrammarError(f"the JSON schema cannot be used: {exc}") from None


def lark_grammar(lark: str) -> str:
    import llguidance

    try:
        return llguidance.LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GrammarError(f"the grammar cannot be used: {exc}") from None


def lark_json(schema: dict) -> str:
    """`schema` as an inline JSON rule of a Lark grammar (``%json {...}``), written in JSON_STYLE."""
    return "%json " + json.dumps({**closed(schema), "x-guidance": JSON_STYLE}, ensure_ascii=False)


class Constraint:
    """One request's grammar state over the tokens decoded so far.

    ``allowed()`` -> bool [vocab] for the next position; ``advance(tokens)`` after tokens are
    drawn; ``rollback(n)`` forgets the last n. An end-of-sequence token ends the grammar: after
    it only end-of-sequence tokens are allowed (the stream stops at the first anyway).
    """

    def __init__(self, tokenizer, grammar: str, vocab_size: int):
        import llguidance

        self._tok = _ll_tokenizer(tokenizer)
        self.matcher = llguidance.LLMatcher(self._tok, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar cannot be used: {self.matcher.get_error()}")
        self.vocab_size = int(vocab_size)
        self.eos = sorted(set(int(t) for t in getattr(tokenizer, "eos_token_ids", ())) | {self._tok.eos_token})
        self._ended = 0                      # tokens advanced from an end-of-sequence token on
        self._bits = np.zeros((self._tok.vocab_size + 31) // 32, dtype=np.int32)
        self._only_eos = self._mask_of(self.eos)

    @classmethod
    def for_json(cls, tokenizer, schema: dict, vocab_size: int) -> "Constraint":
        return cls(tokenizer, json_schema_grammar(schema), vocab_size)

    def _mask_of(self, tokens: Iterable[int]) -> mx.array:
        m = np.zeros(self.vocab_size, dtype=bool)
        m[[t for t in tokens if t < self.vocab_size]] = True
        return mx.array(m)

    def allowed(self) -> mx.array:
        if self._ended or self.matcher.is_stopped():
            return self._only_eos
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar failed: {self.matcher.get_error()}")
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab_size].astype(bool)
        if bits[self._tok.eos_token]:
            bits[[t for t in self.eos if t < self.vocab_size]] = True
        if len(bits) < self.vocab_size:              # the model's head may be wider than the tokenizer
            bits = np.concatenate([bits, np.zeros(self.vocab_size - len(bits), dtype=bool)])
        return mx.array(bits)

    def advance(self, tokens: List[int]) -> None:
        for t in tokens:
            if t < 0:            # a lane's mark for a non-finite logit row: the lane raises for it
                continue
            if self._ended or t in self.eos:
                self._ended += 1
            elif not self.matcher.consume_token(int(t)):
                raise GrammarError(f"token {t} is not allowed by the grammar: {self.matcher.get_error()}")

    def rollback(self, n: int) -> None:
        undo = min(n, self._ended)
        self._ended -= undo
        if n - undo and not self.matcher.rollback(n - undo):
            raise GrammarError(f"the grammar could not roll back {n - undo} tokens: {self.matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """The text so far is a whole sentence of the grammar."""
        return bool(self._ended) or self.matcher.is_accepting()


def allowed_after(constraint: Optional[Constraint], token: Optional[mx.array] = None) -> Optional[mx.array]:
    """Advance over `token` (a one-token array, read only here: without a constraint nothing
    waits for the device), then the mask for the next position; None without a constraint."""
    if constraint is None:
        return None
    if token is not None:
        constraint.advance([int(token.item())])
    return constraint.allowed()


@dataclass(frozen=True)
class Lazy:
    """A grammar that holds only after its trigger (the text of one special token): what a
    function-of-the-tokenizer grammar returns for a tool call the model may or may not make."""
    trigger: str
    grammar: str      # what follows the trigger, up to and including its closing tag


class Triggered:
    """Free text, and after each trigger token one sentence of a grammar (a tool call that must
    name an offered tool, with arguments of its schema), then free text again.

    In free text there is no mask and nothing to wait for: the lanes draw as without a grammar
    and hand each cycle's tokens to ``take``, which opens the grammar at the first trigger and
    says how many of them to keep. Tokens after that trigger were drawn free, so the lane drops
    them, as if its cycle had ended at the trigger: a decision on the tokens up to the trigger
    alone, so what is kept follows the model exactly, and from there on p and q are masked as
    with any grammar (``allowed``, ``advance``, ``rollback``). ``free`` is asked once per cycle;
    a grammar closed inside a cycle answers all-True masks to its end, and the next ``free``
    lets it go."""

    def __init__(self, tokenizer, trigger: int, grammar: str, vocab_size: int):
        self._args = (tokenizer, grammar, vocab_size)
        Constraint(*self._args)                  # a grammar that cannot be used fails here, not mid-reply
        self.trigger = int(trigger)
        self.inner: Optional[Constraint] = None  # the open grammar (or closed, until the next `free`)
        self._log: list = []                     # per token advanced while open: "in", "out" or the grammar before
        self._everything = None

    @property
    def free(self) -> bool:
        """Outside the grammar (asked at the start of a cycle: a closed grammar is let go here)."""
        if self.inner is not None and self.inner.complete:
            self.inner, self._log = None, []
        return self.inner is None

    def allowed(self) -> Optional[mx.array]:
        if self.inner is None:
            return None
        if self.inner.complete:
            if self._everything is None:
                self._everything = mx.ones((self._args[2],), dtype=mx.bool_)
            return self._everything
        return self.inner.allowed()

    def _open(self) -> None:
        self._log.append(self.inner)
        self.inner = Constraint(*self._args)

    def take(self, tokens: List[int]) -> Optional[int]:
        """Free text: read `tokens` up to the first trigger; how many to keep (through the
        trigger) if one opened the grammar, else None."""
        for i, t in enumerate(tokens):
            if t == self.trigger:                # nothing before a free cycle's trigger rolls back
                self.inner, self._log = Constraint(*self._args), []
                return i + 1
        return None

    def advance(self, tokens: List[int]) -> None:
        for t in tokens:
            if self.inner is None:
                self.take([t])
            elif not self.inner.complete:
                self.inner.advance([t])
                self._log.append("in")
            elif t == self.trigger:              # the next call, in the cycle that closed the last
                self._open()
            else:
                self._log.append("out")

    def rollback(self, n: int) -> None:
        for _ in range(n):
            op = self._log.pop()
            if op == "in":
                self.inner.rollback(1)
            elif op != "out":
                self.inner = op

    @property
    def complete(self) -> bool:
        return self.inner is None or self.inner.complete


def held(tokenizer, lazy: Lazy, vocab_size: int) -> Optional[Triggered]:
    """The Triggered grammar for `lazy`, or None where it cannot be held: its trigger is not one
    token of this tokenizer (free text cannot watch for it), or the grammar library refuses it."""
    ids = list(tokenizer.encode(lazy.trigger, add_special_tokens=False))
    if len(ids) != 1:
        return None
    try:
        return Triggered(tokenizer, ids[0], lazy.grammar, vocab_size)
    except GrammarError:
        return None


def lazy_free(constraint) -> bool:
    """Is this cycle free text of a Triggered grammar (no masks, no waits)? Ask once per cycle."""
    return isinstance(constraint, Triggered) and constraint.free
