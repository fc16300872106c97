"""A restored prefix-cache snapshot is the state a fresh prefill builds, tensor by tensor.

After a restore plus the remaining prefill, the trunk's attention KV (and offsets), the
Gated-DeltaNet conv windows and recurrent states, the MTP head's KV history and offset, and the
trunk's last hidden state equal those of a fresh prefill, bit for bit on the CPU; sampled replies
with the same seed are then identical with and without the cache.

Why the fresh prefill is chunked at the restore point too: a chunk's rows come out of one
matmul, and on some BLAS builds (OpenBLAS on an AVX-512 host, measured) a k-row product differs
from k one-row products in the last bit. A restore is exact only if it changes nothing, so it
is compared with the same computation without the cache, not with a differently chunked one.
"""
import mlx.core as mx
import pytest

from core import PrefixCache, Prompt, SamplerConfig, SpeculativeDecoder, chat_prompt, history_prompt
from core.stream import cache_history, prefill

SYSTEM = {"role": "system", "content": "You are brief and kind."}
TURN1 = [SYSTEM, {"role": "user", "content": "What is the sea? Tell me about waves and tides."}]
REPLY = {"role": "assistant", "content": "The sea is a large body of salt water."}
TURN2 = TURN1 + [REPLY, {"role": "user", "content": "And the moon, what does it do to it?"}]


def state(adapter, prompt: Prompt, prefix_cache=None):
    cache = adapter.make_cache()
    draft = adapter.make_draft(cache)
    done = prefill(adapter, prompt, cache, draft, prefix_cache)
    return cache, draft, done


def with_mark(prompt: Prompt, at: int) -> Prompt:
    return Prompt(prompt.ids, tuple(sorted(set(prompt.marks) | {at})))


def assert_same_state(adapter, a, b):
    """Tensor by tensor, through the adapter's own snapshot (every array it would store):
    the trunk's attention KV and offsets, the Gated-DeltaNet conv windows and recurrent
    states, the head's KV history and offset; then the last hidden state and logits."""
    (cache_a, head_a, done_a), (cache_b, head_b, done_b) = a, b
    sa, sb = adapter.snapshot(cache_a, head_a), adapter.snapshot(cache_b, head_b)
    assert sa.meta == sb.meta, "lengths differ"
    assert sorted(sa.arrays) == sorted(sb.arrays)
    names = sorted(sa.arrays)
    assert any(n.startswith("draft.") for n in names) and any(n.endswith(".state") for n in names), names
    for name in names:
        x, y = sa.valid(name), sb.valid(name)
        assert x.shape == y.shape and mx.array_equal(x, y).item(), f"{name} differs"
    assert mx.array_equal(done_a.hidden, done_b.hidden).item(), "last hidden state differs"
    assert mx.array_equal(done_a.logits, done_b.logits).item(), "last logits differ"


def test_a_restored_turn_equals_a_fresh_prefill_bit_for_bit(mixed_adapter):
    ad, pc = mixed_adapter, PrefixCache(2**30)
    first = chat_prompt(ad, TURN1)
    state(ad, first, pc)                                     # snapshots at turn 1's marks
    second = chat_prompt(ad, TURN2)
    cached = state(ad, second, pc)
    restored_at = cached[2].cached_tokens
    assert restored_at == first.marks[-1] and 0 < restored_at < len(second)
    fresh = state(ad, with_mark(second, restored_at))
    assert fresh[2].cached_tokens == 0
    assert_same_state(ad, cached, fresh)
    # the head holds every prompt position but the last: (hidden n, token n+1) for n < L - 1
    assert ad.snapshot(cached[0], cached[1]).meta["draft.keys.length"] == len(second) - 1


def test_a_snapshot_taken_after_a_reply_restores_exactly(mixed_adapter):
    """The app snapshots the conversation after each reply (cache_history); the next turn
    restores it and prefills only its new message."""
    ad, pc = mixed_adapter, PrefixCache(2**30)
    history = history_prompt(ad, TURN1 + [REPLY])
    cache_history(ad, history, pc)
    second = chat_prompt(ad, TURN2)
    cached = state(ad, second, pc)
    assert cached[2].cached_tokens == len(history)
    # cache_history prefilled the history as one chunk: so does the reference
    same_chunks = Prompt(second.ids, tuple(m for m in with_mark(second, len(history)).marks if m >= len(history)))
    assert_same_state(ad, cached, state(ad, same_chunks))


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_sampled_replies_are_identical_with_and_without_the_cache(sure_adapter, depth):
    ad = sure_adapter
    sampler = SamplerConfig(temperature=0.9, top_k=8)
    first, second = chat_prompt(ad, TURN1), chat_prompt(ad, TURN2)
    total_accepted = 0
    for seed in range(8):
        pc = PrefixCache(2**30)
        state(ad, first, pc)          # turn 1 was answered: its snapshots are there
        lane = SpeculativeDecoder(ad, sampler=sampler, seed=seed, depth=depth, prefix_cache=pc)
        ids, stats = lane.generate(second, max_tokens=24)
        assert stats.cached_tokens == first.marks[-1]
        ref, ref_stats = SpeculativeDecoder(ad, sampler=sampler, seed=seed, depth=depth).generate(
            with_mark(second, first.marks[-1]), max_tokens=24)
        assert ids == ref, f"seed {seed}"
        assert (stats.accepted, stats.proposed) == (ref_stats.accepted, ref_stats.proposed)
        total_accepted += stats.accepted
    assert total_accepted > 0
