"""The waterfall on the engine: timing changes no token (greedy or sampled with a seed, both
lanes), every part a lane has shows up, and the parts add up to the lane's own compute time (the
host's part is the rest of it, so exactly; none is negative)."""
import pytest

from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt
from core.waterfall import PARTS, SAMPLE_EVERY
from tests._engine_helpers import GREEDY

SAMPLED = SamplerConfig(temperature=0.8, top_p=0.95, top_k=20)


def lane(kind, adapter, sampler):
    if kind == "ar":
        return AutoregressiveDecoder(adapter, sampler=sampler, seed=7)
    return SpeculativeDecoder(adapter, sampler=sampler, seed=7, depth=int(kind[-1]))


@pytest.mark.parametrize("kind", ["ar", "mtp1", "mtp3"])
@pytest.mark.parametrize("sampler", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_timing_changes_no_token_and_the_parts_add_up(mixed_adapter, kind, sampler):
    prompt = chat_prompt(mixed_adapter, [{"role": "user", "content": "Tell me about the harbor."}])
    decoder = lane(kind, mixed_adapter, sampler)
    decoder.waterfall_every = 0
    off, off_stats = decoder.generate(prompt, max_tokens=60)
    assert off_stats.waterfall == {}
    decoder.waterfall_every = SAMPLE_EVERY
    on, s = decoder.generate(prompt, max_tokens=60)
    assert on == off
    assert set(s.waterfall) == set(PARTS)
    # exactly, up to rounding: the host's part is the rest of the lane's clock, and no part overlaps
    assert abs(sum(s.waterfall.values()) - s.compute_seconds) <= 1e-6 * len(PARTS) + 1e-9
    assert min(s.waterfall.values()) >= 0
    assert s.waterfall["prefill"] > 0 and s.waterfall["forward"] > 0 and s.waterfall["sampling"] > 0
    if kind == "ar":
        assert s.waterfall["draft"] == s.waterfall["acceptance"] == s.waterfall["commit"] == 0
    else:
        assert min(s.waterfall[k] for k in ("draft", "acceptance", "commit")) > 0
