"""Log-probabilities of emitted tokens and of a prompt's own tokens (OpenAI ``logprobs``, ``echo``).

Which distribution: the target model's raw next-token distribution, log_softmax of its logits
at temperature 1, before temperature, top-k/p, min-p and any grammar mask. That is what OpenAI
reports and what lm-eval's log-likelihood tasks score, and it does not depend on the lane: the
MTP lane reads the rows of its verify pass, the AR lane those of its steps (equal to fp32
rounding on this CPU, see the developers' notes on OpenBLAS).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx

MAX_TOP = 20                     # OpenAI's ceiling for top_logprobs


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: List[Tuple[int, float]]     # the `top` most likely tokens at this position, most likely first


def _log_softmax(rows: mx.array) -> mx.array:
    x = rows.astype(mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def token_logprobs(rows: mx.array, tokens: Sequence[int], top: int = 0) -> List[TokenLogprob]:
    """rows [n, V]: the logits each of the n `tokens` was sampled from."""
    if not tokens:
        return []
    lp = _log_softmax(rows.reshape(-1, rows.shape[-1])[: len(tokens)])
    chosen = mx.take_along_axis(lp, mx.array(list(tokens))[:, None], axis=-1)[:, 0]
    if top > 0:
        idx = mx.argsort(-lp, axis=-1)[:, :top]
        vals = mx.take_along_axis(lp, idx, axis=-1)
        mx.eval(chosen, idx, vals)
        tops = [list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())]
    else:
        mx.eval(chosen)
        tops = [[] for _ in tokens]
    return [TokenLogprob(int(t), float(c), top_) for t, c, top_ in zip(tokens, chosen.tolist(), tops)]


def prompt_logprobs(adapter, ids: Sequence[int], top: int = 0, chunk: int = 512) -> List[Optional[TokenLogprob]]:
    """Each prompt token's log-probability given the tokens before it, from one forward over the
    prompt (in chunks of `chunk` positions, so a long prompt never holds [L, V] logits at once).
    The first token has none (None), as in OpenAI's echo."""
    out: List[Optional[TokenLogprob]] = [None]
    cache, tokens = adapter.make_cache(), mx.array(list(ids), dtype=mx.int32)
    for a in range(0, len(ids), chunk):
        b = min(a + chunk, len(ids))
        logits, _, _ = adapter.forward(tokens[None, a:b], cache, all_logits=True, fast=False)
        # row j predicts token j + 1; the last row of the prompt predicts what follows it
        rows, nxt = logits[0], list(ids[a + 1 : b + 1])
        out += token_logprobs(rows[: len(nxt)], nxt, top)
    return out
