"""What both lanes share around their decode loop: prompt handling, prefill, stopping, text, timing."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple

import mlx.core as mx

from .stats import GenerationStats, OwnClock

PREFILL_CHUNK = 512


@dataclass
class StreamEvent:
    tokens: List[int]  # newly committed token ids
    origins: List[str]  # per token: "target" | "draft" | "correction" | "bonus"
    text: str  # decoded text of these tokens (a stop string and what follows are cut)
    stats: GenerationStats
    finished: bool = False
    finish_reason: Optional[str] = None  # "eos" | "stop_string" | "max_tokens" | "stopped"


def synchronize() -> None:
    """Wait until the device has finished all queued work (a lane's clock can then be settled)."""
    mx.synchronize()


def as_prompt(prompt_ids) -> mx.array:
    ids = prompt_ids if isinstance(prompt_ids, mx.array) else mx.array(list(prompt_ids), dtype=mx.int32)
    ids = ids.reshape(-1).astype(mx.int32)
    if ids.size == 0:
        raise ValueError("the prompt is empty: give at least one token")
    return ids


def prefill(adapter, prompt: mx.array, cache: list) -> Tuple[mx.array, mx.array]:
    """Run the prompt through the trunk in chunks -> (logits of the last position [1, V], hidden [1, L, H])."""
    hiddens = []
    for start in range(0, prompt.size, PREFILL_CHUNK):
        logits, hidden, _ = adapter.forward(prompt[None, start : start + PREFILL_CHUNK], cache, all_logits=False)
        mx.eval(hidden, [c.state for c in cache])  # bound the graph per chunk
        hiddens.append(hidden)
    return logits[:, -1], mx.concatenate(hiddens, axis=1) if len(hiddens) > 1 else hiddens[0]


class Lane:
    """Base of both decoders: `stream` wraps the lane's `_steps` generator.

    `_steps(prompt, max_tokens, stats)` yields (tokens, origins) lists; its first yield is
    the token sampled from the prompt's last position.
    """

    mode = "ar"

    def __init__(self, adapter, sampler, seed: int = 0):
        self.adapter = adapter
        self.sampler = sampler
        self.seed = seed

    def _steps(self, prompt: mx.array, max_tokens: int, stats: GenerationStats) -> Iterator[Tuple[List[int], List[str]]]:
        raise NotImplementedError

    def generate(self, prompt_ids, max_tokens: int = 256, stop_strings: Sequence[str] = ()) -> Tuple[List[int], GenerationStats]:
        ids: List[int] = []
        stats = None
        for event in self.stream(prompt_ids, max_tokens=max_tokens, stop_strings=stop_strings):
            ids += event.tokens
            stats = event.stats
        return ids, stats

    def stream(
        self,
        prompt_ids,
        max_tokens: int = 256,
        stop: Optional[threading.Event] = None,
        stop_strings: Sequence[str] = (),
    ) -> Iterator[StreamEvent]:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        prompt = as_prompt(prompt_ids)
        tokenizer = self.adapter.tokenizer
        eos = set(tokenizer.eos_token_ids)
        detok = tokenizer.detokenizer
        detok.reset()
        stats = GenerationStats(mode=self.mode, prompt_tokens=prompt.size)
        clock = OwnClock()
        clock.resume()
        steps = self._steps(prompt, max_tokens, stats)
        text_so_far = ""
        try:
            while True:
                if stop is not None and stop.is_set():
                    reason, tokens, origins = "stopped", [], []
                else:
                    tokens, origins = next(steps)
                    reason = None
                    for i, t in enumerate(tokens):
                        if t in eos:
                            tokens, origins, reason = tokens[:i], origins[:i], "eos"
                            break
                    room = max_tokens - stats.generated_tokens
                    if len(tokens) >= room and reason is None:
                        reason = "max_tokens"
                    tokens, origins = tokens[:room], origins[:room]
                first = stats.generated_tokens == 0
                stats.generated_tokens += len(tokens)
                for t in tokens:
                    detok.add_token(t)
                if reason in ("eos", "max_tokens", "stopped"):
                    detok.finalize()
                new_text = detok.text[len(text_so_far):]
                if stop_strings:
                    full = text_so_far + new_text
                    hits = [full.find(s, max(0, len(text_so_far) - len(s))) for s in stop_strings if s]
                    hits = [h for h in hits if h >= 0]
                    if hits:
                        new_text = full[: min(hits)][len(text_so_far):]
                        reason = "stop_string"
                text_so_far += new_text
                now = clock.now()
                if first:
                    stats.time_to_first_token = stats.prefill_seconds = now
                stats.compute_seconds = now
                stats.decode_seconds = now - stats.prefill_seconds
                stats.finish_reason = reason
                clock.pause()
                yield StreamEvent(tokens, origins, new_text, stats, reason is not None, reason)
                if reason is not None:
                    return
                clock.resume()
        finally:
            steps.close()
