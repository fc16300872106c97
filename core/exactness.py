"""Which exactness this machine delivers: measured once at load, said at start-up.

Greedy MTP equals greedy AR, and a batched reply equals the same reply decoded alone, token for
token, when the target's logits come out the same: when every row of a k-row forward (a verify of
k positions, a batch of k sequences) is computed as the 1-row decode step computes it. On a GPU
our few-token runner makes that so (adapters/qwen3_5/gpu_runner.py: a quantized-matmul kernel that
computes each row as alone, and row-invariant attention). On the CPU the float32 matmuls go to
the BLAS, which picks its kernel by the product's shape and by the processor: OpenBLAS 0.3.21 on an AMD EPYC (AVX-512)
sums a 12-row product in another order than a 3-row one, and the rows of a batched verify came
out up to 6.7e-6 from the lone verify's; on other hosts they agree bit for bit. Where rows
differ, they differ by float32 rounding, so greedy tokens are still equal unless two logits tie
within it. Neither outcome is ours to promise on a machine we have not seen: `probe` measures
both comparisons with the loaded model, and the app prints which one holds (webapp/cli.py and the
page's banner).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx

from .batch import forward_batch
from .stream import Prompt, prefill


@dataclass(frozen=True)
class Agreement:
    """How far apart two computations of the same rows came out: 0.0 is bit for bit."""

    max_diff: float

    @property
    def exact(self) -> bool:
        return self.max_diff == 0.0

    def describe(self) -> str:
        return "bit for bit" if self.exact else f"to rounding (max |diff| {self.max_diff:.1e})"


def agreement(a: mx.array, b: mx.array) -> Agreement:
    """Compare two arrays of the same shape (logits of the same positions, computed two ways)."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    diff = mx.where(a == b, 0.0, mx.abs(a - b))        # equal infinities are equal
    diff = mx.where(mx.isnan(diff), mx.inf, diff)      # a NaN is never "to rounding"
    return Agreement(float(mx.max(diff).item()) if diff.size else 0.0)


@dataclass(frozen=True)
class Exactness:
    verify_vs_steps: Agreement   # a verify of k positions vs k one-token steps: MTP vs AR
    batched_verify: Agreement    # several sequences' verify in one forward vs each verified alone
    batched_step: Agreement      # several sequences' one-token step in one forward vs each alone

    @property
    def batched(self) -> Agreement:
        return Agreement(max(self.batched_verify.max_diff, self.batched_step.max_diff))

    def describe(self) -> str:
        """One line for the start-up banner."""
        return (f"greedy MTP = AR {_verdict(self.verify_vs_steps, 'a verify', 'the decode steps')}; "
                f"batched replies = alone {_verdict(self.batched, 'a batch', 'each sequence alone')}")


def _verdict(a: Agreement, rows: str, other: str) -> str:
    if a.exact:
        return f"bit for bit on this machine ({rows} rounds as {other})"
    return f"up to ties on this machine ({rows} {a.max_diff:.1e} from {other}: tokens equal unless two logits tie within that)"


def probe(adapter, widths: Sequence[int] = (2, 3, 4), sequences: int = 3) -> Exactness:
    """Measure the three agreements on the loaded model: short made-up prompts of different
    lengths (so the sequences sit at different positions), each prefilled once and restored
    into fresh caches for every comparison. Logits only: they pick the tokens (the head's drafts
    only change how many are accepted). ~20 forwards: 0.3-0.7 s for the demo on 2 CPU cores."""
    V = adapter.vocab_size
    prompts = [Prompt(tuple((11 + 7 * b + 3 * i) % V for i in range(5 + 2 * b))) for b in range(sequences)]
    states = []
    for p in prompts:
        cache = adapter.make_cache()
        draft = adapter.make_draft(cache)
        prefill(adapter, p, cache, draft)
        states.append(adapter.snapshot(cache, draft))

    def fresh(b):
        cache = adapter.make_cache()
        adapter.restore(states[b], cache, adapter.make_draft(cache))
        return cache

    W = max(widths)
    tokens = mx.array([[(5 + b + 2 * t) % V for t in range(W)] for b in range(sequences)], dtype=mx.int32)
    # Sequence 0 one token at a time (the AR lane), against its verify of each width (the MTP lane).
    c = fresh(0)
    steps = mx.concatenate([adapter.forward(tokens[:1, t:t + 1], c)[0] for t in range(W)], axis=1)
    verify = max((agreement(adapter.forward(tokens[:1, :w], fresh(0), capture=True)[0], steps[:, :w])
                  for w in widths), key=lambda a: a.max_diff)
    # Every sequence alone, against all of them in one forward: a verify of W, and one step.
    alone_verify = mx.concatenate([adapter.forward(tokens[b:b + 1], fresh(b), capture=True)[0]
                                   for b in range(sequences)])
    alone_step = mx.concatenate([adapter.forward(tokens[b:b + 1, :1], fresh(b))[0] for b in range(sequences)])
    together_verify = forward_batch(adapter, tokens, [fresh(b) for b in range(sequences)], capture=True)[0]
    together_step = forward_batch(adapter, tokens[:, :1], [fresh(b) for b in range(sequences)])[0]
    return Exactness(verify, agreement(together_verify, alone_verify), agreement(together_step, alone_step))
