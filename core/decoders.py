"""The two lanes. Same sampler, same prefill, same stopping rules; only the loop differs."""
from __future__ import annotations

import time
from typing import Iterator, List, Tuple, Union

import mlx.core as mx

from .acceptance import accepted_prefix, verify_drafts
from .constraints import allowed_after, lazy_free
from .costs import DepthPolicy, cached_costs
from .sampling import _DEFAULT, KeyStream, SamplerConfig, all_finite, check_finite, sample_or_flag
from .stats import GenerationStats
from .stream import Lane
from .waterfall import Waterfall


class AutoregressiveDecoder(Lane):
    mode = "ar"
    needs_head = False

    def __init__(self, adapter, sampler: SamplerConfig = SamplerConfig(), seed: int = 0, prefix_cache=None,
                 constraint=None):
        super().__init__(adapter, sampler, seed, prefix_cache, constraint)

    def _steps(self, prompt, max_tokens, stats, stop, wf=None) -> Iterator[Tuple[List[int], List[str], mx.array]]:
        ad, keys, c = self.adapter, KeyStream(self.seed, active=not self.sampler.greedy), self.constraint
        wf = wf or Waterfall(0)

        def sample(logits, allowed):
            return sample_or_flag(self.sampler, logits, keys.next(), allowed)

        cache, _, done = self._prefill(prompt, stats, stop, wf)
        y, row = sample(done.logits, allowed_after(c)), done.logits
        mx.async_eval(y)  # the first token must not wait behind the next step
        stats.target_forwards += 1
        for n in range(1, max_tokens + 1):
            wf.cycle()   # in a timed cycle each mark waits for its arrays; otherwise marks are free
            wf.mark("sampling", y)
            free = lazy_free(c)   # free text of a triggered grammar: no mask, no wait
            if n < max_tokens:
                # Queue the next step before reading this token: the host builds the
                # graph while the device computes (as mlx_lm.generate_step does).
                logits, _, _ = ad.forward(y[None], cache, all_logits=False)
                wf.mark("forward", logits)
                # A grammar's next mask needs this token on the host (the step still overlaps it).
                next_y, next_row = sample(logits[:, -1], None if free else allowed_after(c, y)), logits[:, -1]
                mx.async_eval(next_y)
                wf.mark("sampling", next_y)
            token = y.item()
            check_finite(token >= 0, "target model")
            if free and c.take([token]) and n < max_tokens:
                next_y = sample(next_row, c.allowed())   # `token` opened the grammar: draw its first under it
                mx.async_eval(next_y)
            if n > 1:
                stats.record_cycle(0, 0)
            wf.end()
            yield [token], ["target"], row
            y, row = next_y, next_row


class SpeculativeDecoder(Lane):
    """Native-MTP speculative decoding: one target forward per cycle, exact sampling."""

    mode = "mtp"

    def __init__(self, adapter, sampler: SamplerConfig = SamplerConfig(), seed: int = 0,
                 depth: Union[int, str] = _DEFAULT["depth"], max_depth: int = _DEFAULT["max_depth"],
                 prefix_cache=None, constraint=None):
        super().__init__(adapter, sampler, seed, prefix_cache, constraint)
        if depth != "auto" and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 1):
            raise ValueError(f"depth must be an integer >= 1 or 'auto', got {depth!r}")
        self.depth = depth
        self.max_depth = max_depth if depth == "auto" else depth
        self.costs = None  # set to use these costs instead of measured ones

    def costs_at(self, context: int):
        """The cost model at this context, as measured so far (core/calibrate.py measures it,
        never a request): looked up every cycle, so a measurement that lands mid-reply is used."""
        if self.costs is not None:
            return self.costs
        return lambda: cached_costs(self.adapter, context)

    def _steps(self, prompt, max_tokens, stats, stop, wf=None) -> Iterator[Tuple[List[int], List[str], mx.array]]:
        ad, sampler, keys = self.adapter, self.sampler, KeyStream(self.seed, active=not self.sampler.greedy)
        c = self.constraint  # a grammar: masks p and q alike, advances over drafts, rolls back rejections
        wf = wf or Waterfall(0)
        policy = DepthPolicy(self.depth, self.max_depth, self.costs_at(len(prompt.ids)))
        cache, draft, done = self._prefill(prompt, stats, stop, wf)
        t0 = time.perf_counter()
        first = sampler.sample(done.logits, keys.next(), allowed_after(c))
        check_finite(all_finite(done.logits).item(), "target model")
        stats.target_forwards += 1
        pending = first.item()
        if c is not None:
            c.advance([pending])
        wf.add("sampling", time.perf_counter() - t0)
        yield [pending], ["target"], done.logits
        # What the head has not seen yet: the prompt's last hidden state with the first token.
        feed_h, feed_t = done.hidden, first
        produced = 1

        while True:
            wf.cycle()   # in a timed cycle each mark waits for its arrays; otherwise marks are free
            free = lazy_free(c)   # free text of a triggered grammar: no masks, no waits per draft
            stats.depth = policy.choose(stats)
            depth = min(stats.depth, max_tokens - produced - 1)
            wf.mark("host")
            if depth <= 0:  # plain AR step: priced out, or only one token left to make
                logits, h, _ = ad.forward(mx.array([[pending]]), cache)
                wf.mark("forward", logits, h)
                y = sampler.sample(logits[0], keys.next(), allowed_after(c))
                mx.eval(y)
                wf.mark("sampling")
                check_finite(all_finite(logits).item(), "target model")
                feed_h, feed_t = mx.concatenate([feed_h, h], axis=1), mx.concatenate([feed_t, y])
                stats.record_cycle(0, 0)
                pending = y.item()
                if c is not None:
                    c.advance([pending])
                produced += 1
                wf.end()
                yield [pending], ["target"], logits[0]
                continue

            # 1. Draft: the drafter catches up on the new positions, then runs recursively.
            drafts, qs, draft_logits = [], [], []
            h, t, masks = feed_h, feed_t, [allowed_after(c)]
            for _ in range(depth):
                h, logits = ad.draft_step(draft, cache, h, t[None])
                draft_logits.append(logits)
                t, q = sampler.draw(logits, keys.next(), masks[-1])
                drafts.append(t)
                qs.append(q)
                masks.append(None if free else allowed_after(c, t))  # the next mask depends on this draft (a sync)
            drafts, q = mx.concatenate(drafts), None if sampler.greedy else _stack(qs)
            mx.async_eval(drafts)  # the head computes while the verify graph is built
            wf.mark("draft", drafts, *([] if q is None else [q[1]]))

            # 2. Verify [pending, d1..dD] in one target forward, keeping per-position state.
            logits, vh, captured = ad.forward(mx.concatenate([mx.array([pending]), drafts])[None], cache, capture=True)
            wf.mark("forward", logits, vh)
            allowed = None if c is None or free else mx.stack(masks)  # verify row i: the mask after d1..di
            p = sampler.mask(logits[0], allowed) if sampler.greedy else sampler.support(logits[0], allowed)
            wf.mark("sampling", *([p] if sampler.greedy else [a for a in p if a is not None]))
            accepted, corrections, bonus = verify_drafts(p, q, drafts, keys.next(3), sampler.greedy)

            # 3. Accept: the one host sync of the cycle.
            ok = mx.logical_and(all_finite(logits), all_finite(mx.concatenate(draft_logits)))
            mx.eval(accepted, corrections, bonus, drafts, ok)
            check_finite(ok.item(), "target model or MTP head")
            n = accepted_prefix(accepted.tolist())
            new = bonus if n == depth else corrections[n : n + 1]
            wf.mark("acceptance")

            # 4. Commit: keep the verified prefix; the drafter forgets its own drafts, which it
            #    relearns next cycle from the target's hidden states.
            # Tokens read from the arrays the sync computed, whole: reading a slice of one
            # (new, drafts[:n]) would evaluate it, a wait for the device each.
            tokens = drafts.tolist()[:n] + [bonus.item() if n == depth else corrections.tolist()[n]]
            origins = ["draft"] * n + ["bonus" if n == depth else "correction"]
            kept = c.take(tokens) if free else None
            if kept is not None and kept < len(tokens):   # draft `kept` opened the grammar: end the cycle there
                n, new, tokens, origins = kept - 1, drafts[kept - 1 : kept], tokens[:kept], origins[:kept]
            pending = tokens[-1]
            ad.rollback(cache, captured, keep=n + 1)
            ad.end_cycle(draft, depth)
            feed_h, feed_t = vh[:, : n + 1], mx.concatenate([drafts[:n], new])
            stats.record_cycle(depth, n)
            if c is not None and not free:
                c.rollback(depth - n)
                c.advance([pending])
            produced += len(tokens)
            wf.mark("commit", feed_h, feed_t, *ad.state_arrays(cache, draft))
            policy.observe(depth, wf.end())   # what this depth really costs, for 'auto'
            yield tokens, origins, logits[0, : n + 1]


def _stack(supports):
    """Per-depth draft supports (indices or None, probabilities) -> one [D, ...] support."""
    idx = None if supports[0][0] is None else mx.concatenate([i for i, _ in supports])
    return idx, mx.concatenate([p for _, p in supports])
