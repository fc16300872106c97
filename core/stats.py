"""Running statistics of one generation, shared by both lanes."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional


@dataclass
class GenerationStats:
    mode: str = "ar"  # "ar" or "mtp"
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache
    prefilled_tokens: int = 0  # prompt tokens actually run through the model
    proposed: int = 0
    accepted: int = 0
    proposed_per_depth: List[int] = field(default_factory=list)  # drafts that reached depth i
    accepted_per_depth: List[int] = field(default_factory=list)
    cycles: int = 0
    target_forwards: int = 0
    depth: Optional[int] = None  # draft depth the policy chose last (0 = plain AR: priced out)
    mtp_active: bool = False  # False when depth 'auto' priced speculation out
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    compute_seconds: float = 0.0  # the lane's own clock: time inside the generator only
    time_to_first_token: float = 0.0
    predicted_speedup: Optional[float] = None  # cost model: tokens/cycle over cycle cost, vs AR
    observed_cycle_costs: Dict[int, float] = field(default_factory=dict)  # depth -> AR steps, from this reply's cycles ('auto')
    finish_reason: Optional[str] = None
    waterfall: Dict[str, float] = field(default_factory=dict)  # seconds per part (core/waterfall.py)
    prefill_parts: Dict[str, float] = field(default_factory=dict)  # where the prefill went (core.stream.Prefilled.parts)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_per_depth(self) -> List[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_per_depth, self.proposed_per_depth)]

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first over the time after the first (mlx-lm's definition)."""
        return (self.generated_tokens - 1) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def tokens_per_cycle(self) -> float:
        return (self.generated_tokens - 1) / self.cycles if self.cycles else 0.0

    def record_cycle(self, depth: int, n_accepted: int) -> None:
        self.cycles += 1
        self.target_forwards += 1
        if depth == 0:
            return
        while len(self.proposed_per_depth) < depth:
            self.proposed_per_depth.append(0)
            self.accepted_per_depth.append(0)
        self.proposed += depth
        self.accepted += n_accepted
        for i in range(min(n_accepted + 1, depth)):
            self.proposed_per_depth[i] += 1
        for i in range(n_accepted):
            self.accepted_per_depth[i] += 1

    def as_dict(self) -> dict:
        d = asdict(self)
        for name in ("acceptance_rate", "acceptance_per_depth", "tokens_per_second", "tokens_per_cycle"):
            d[name] = getattr(self, name)
        return d


class OwnClock:
    """Counts only the time the lane itself computes: paused while its generator is suspended."""

    def __init__(self):
        self.total = 0.0
        self._since: Optional[float] = None

    def resume(self) -> None:
        self._since = time.perf_counter()

    def pause(self) -> None:
        if self._since is not None:
            self.total += time.perf_counter() - self._since
            self._since = None

    def now(self) -> float:
        running = time.perf_counter() - self._since if self._since is not None else 0.0
        return self.total + running


class WallClock(OwnClock):
    """Counts all the time since the first resume: a batched sequence's reply takes the steps
    it shares with others and the time between them (core/batch.py), not only its own work."""

    def resume(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def pause(self) -> None:
        pass
