"""Prefix-cache checks that every family must pass, written once (tests/test_families.py and
tests/test_gemma4.py run them on their own adapters)."""
from __future__ import annotations

import mlx.core as mx

from core import AutoregressiveDecoder, PrefixCache, Prompt, SpeculativeDecoder, chat_prompt, history_prompt
from core.stream import cache_history, prefill
from tests._engine_helpers import GREEDY
from tests._ties import assert_greedy_equal

SYSTEM = {"role": "system", "content": "You are brief."}
TURNS = ["What is the sea?", "And the moon?", "Why?", "Thanks."]


def turns_through_the_cache(ad, depth: int):
    """Greedy turns with and without the prefix cache give the same tokens, in both lanes, up to
    near-ties (a restore from a history snapshot prefills in other chunks than a fresh prompt:
    tests/_ties.py); returns the last turn's stats (how much came from the cache)."""
    pc = PrefixCache(2**30)
    for kind in ("ar", "mtp"):
        msgs = [SYSTEM]
        for turn in TURNS:
            msgs.append({"role": "user", "content": turn})
            prompt = chat_prompt(ad, msgs)
            make = (lambda **kw: AutoregressiveDecoder(ad, sampler=GREEDY, **kw)) if kind == "ar" else \
                   (lambda **kw: SpeculativeDecoder(ad, sampler=GREEDY, depth=depth, **kw))
            cached, stats = make(prefix_cache=pc).generate(prompt, max_tokens=16)
            fresh, _ = make().generate(prompt, max_tokens=16)
            assert_greedy_equal(ad, prompt, cached, fresh, what=f"{kind} {turn}")
            msgs.append({"role": "assistant", "content": ad.tokenizer.decode(fresh)})
            cache_history(ad, history_prompt(ad, msgs), pc)
    return stats


def assert_restore_equals_fresh_prefill(ad) -> None:
    """A state restored from the cache plus the rest of the prefill equals a fresh prefill of the
    same chunks, tensor by tensor, bit for bit (on the CPU)."""
    pc = PrefixCache(2**30)
    first = chat_prompt(ad, [SYSTEM, {"role": "user", "content": TURNS[0]}])
    second = chat_prompt(ad, [SYSTEM, {"role": "user", "content": TURNS[0]},
                              {"role": "assistant", "content": "It is water."}, {"role": "user", "content": TURNS[1]}])

    def state(prompt, cache_=None):
        cache = ad.make_cache()
        draft = ad.make_draft(cache)
        done = prefill(ad, prompt, cache, draft, cache_)
        return ad.snapshot(cache, draft), done

    state(first, pc)
    restored, done = state(second, pc)
    at = done.cached_tokens
    assert 0 < at < len(second)
    fresh, done_fresh = state(Prompt(second.ids, tuple(sorted(set(second.marks) | {at}))))
    assert restored.meta == fresh.meta and sorted(restored.arrays) == sorted(fresh.arrays)
    for name in restored.arrays:
        assert mx.array_equal(restored.valid(name), fresh.valid(name)).item(), name
    assert mx.array_equal(done.logits, done_fresh.logits).item()
