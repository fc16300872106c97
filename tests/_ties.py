"""Greedy outputs of two computations that agree to float32 rounding, compared as far as that
makes them equal.

A verify's rows and a decode step's, or a batch's rows and a lone sequence's, are the same
arithmetic in matmuls of different row counts; on the CPU the BLAS may sum those in different
orders (core/exactness.py: 6.7e-6 apart on an AMD EPYC, bit for bit elsewhere). Two greedy decodes
whose logits differ by that pick the same token at every step except where the reference's
chosen token and another are within that rounding of each other (a near-tie); from there on they
may part. So what holds on every machine: equal up to the first difference, and there the two
tokens tie within ROUNDING in the reference's logits. A real bug (a wrong row, a position lost in
a rollback) differs by order 1 and fails. Where the code makes two computations the same
arithmetic on the same shapes (a prefix-cache restore and a fresh prefill of the same chunks),
tests compare with == instead."""
from __future__ import annotations

import mlx.core as mx

# Logits of the tiny and demo models computed in matmuls of different row counts: measured up to
# 9e-6 apart (AVX-512 OpenBLAS, core/exactness.py); 1e-4 leaves room for deeper or wider shapes.
ROUNDING = 1e-4
END = "<end>"   # what a reply that stopped at an EOS token has where the other goes on


def reference_logits(adapter, prompt, tokens, n: int) -> mx.array:
    """The logits row that picks tokens[n] (or the EOS after them), the prompt and tokens[:n]
    teacher-forced in one forward."""
    ids = list(getattr(prompt, "ids", prompt)) + list(tokens[:n])
    logits, _, _ = adapter.forward(mx.array([ids]), adapter.make_cache(), all_logits=False, fast=False)
    return logits[0, -1].astype(mx.float32)


def first_difference(got, want):
    """The first position where two outputs differ (a length counts), or None."""
    n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return None if n == len(got) == len(want) else n


def assert_greedy_equal(adapter, prompt, got, want, tol: float = ROUNDING, what="") -> None:
    """`got` equals the reference greedy output `want` (both from `prompt`, with the same limits),
    or parts from it where the two tokens tie within `tol` in the reference's logits. The tie is
    judged between the two tokens themselves, so a grammar's mask needs no replaying."""
    n = first_difference(got, want)
    if n is None:
        return
    row = reference_logits(adapter, prompt, want, n)
    eos = list(adapter.tokenizer.eos_token_ids)

    def logit(seq):
        return float(row[seq[n]].item()) if n < len(seq) else float(mx.max(row[mx.array(eos)]).item())

    gap = logit(want) - logit(got)
    shown = [seq[n] if n < len(seq) else END for seq in (got, want)]
    assert gap <= tol, (f"{what}: greedy outputs part at token {n} ({shown[0]} vs the reference's {shown[1]}) "
                        f"where the reference prefers its own by {gap:.3g} > {tol:g}: not a near-tie")


def tie_free_length(adapter, prompt, tokens, tol: float = ROUNDING) -> int:
    """How many of `tokens` (a greedy reply to `prompt`) come before the first position whose two
    best logits are within `tol`; len(tokens) + 1 when none is, the stop after them included. For
    replies compared as text (through the app), where only the reference's tokens are known:
    the other reply equals it in that many tokens on every machine."""
    ids = list(getattr(prompt, "ids", prompt)) + list(tokens)
    logits, _, _ = adapter.forward(mx.array([ids]), adapter.make_cache(), fast=False)
    rows = logits[0, len(ids) - len(tokens) - 1:].astype(mx.float32)   # the rows that picked each token, and the stop
    top2 = mx.topk(rows, 2, axis=-1)
    gaps = (mx.max(top2, axis=-1) - mx.min(top2, axis=-1)).tolist()
    return next((i for i, g in enumerate(gaps) if g <= tol), len(tokens) + 1)


def tie_free(adapter, prompt, max_tokens: int, tol: float = ROUNDING) -> bool:
    """Whether the greedy AR reply to `prompt` meets no near-tie: then every computation within
    rounding of it (the MTP lane, a batch) gives that reply on every machine. For replies compared
    as text through the app, which asserts their equality where this holds."""
    from core import AutoregressiveDecoder, SamplerConfig

    ref, _ = AutoregressiveDecoder(adapter, sampler=SamplerConfig(temperature=0)).generate(prompt, max_tokens=max_tokens)
    return tie_free_length(adapter, prompt, ref, tol) > len(ref)
