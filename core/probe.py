"""Measured acceptance of a loaded model's drafter: how often its drafts pass, per depth.

What tells a correctly wired head from a wrongly wired one with no error anywhere: a wrong
hidden-state variant, concat order or norm convention leaves everything running and acceptance
near zero (KNOWLEDGE section 1). Used to verify an attached head and to find the wiring a
checkpoint needs (mtp-chat attach-head, scripts/checkpoints/inspect_model.py --measure).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from .chat import chat_prompt_ids
from .decoders import SpeculativeDecoder
from .sampling import SamplerConfig

PROMPTS = ("Define the word harbor.", "What is the sea?", "Tell me a fact about the moon.",
           "How do I make a cup of tea?")


@dataclass(frozen=True)
class Acceptance:
    per_depth: List[float]      # accepted / proposed at depth 1, 2, ...
    proposed: int
    tokens: int

    @property
    def first(self) -> float:
        return self.per_depth[0] if self.per_depth else 0.0


def measure_acceptance(adapter, prompts: Sequence[str] = PROMPTS, depth: int = 2, max_tokens: int = 48) -> Acceptance:
    """Greedy replies to `prompts` at a fixed depth; acceptance pooled over them."""
    acc, prop, tokens = [0] * depth, [0] * depth, 0
    for text in prompts:
        ids = chat_prompt_ids(adapter, [{"role": "user", "content": text}])
        out, stats = SpeculativeDecoder(adapter, sampler=SamplerConfig(temperature=0), depth=depth).generate(
            ids, max_tokens=max_tokens)
        tokens += len(out)
        for i, (a, p) in enumerate(zip(stats.accepted_per_depth, stats.proposed_per_depth)):
            acc[i] += a
            prop[i] += p
    return Acceptance([a / p if p else 0.0 for a, p in zip(acc, prop)], prop[0], tokens)
