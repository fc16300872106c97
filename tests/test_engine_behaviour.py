"""How the lanes start, stop and report: both lanes share these rules."""
import threading

import mlx.core as mx
import pytest

import core.stream
from adapters import load_adapter
from core import (AutoregressiveDecoder, Costs, DepthPolicy, NonFiniteLogitsError, SamplerConfig,
                  SpeculativeDecoder, chat_prompt_ids, measure_costs)
from tests._engine_helpers import GREEDY, MIXED, make_mixed_head
from tests._ties import assert_greedy_equal

TYPICAL_COSTS = Costs(ar_step_seconds=0.01, verify={1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 5: 1.8}, mtp_step=0.2)
LANES = {
    "ar": lambda ad, **kw: AutoregressiveDecoder(ad, **kw),
    "mtp": lambda ad, **kw: SpeculativeDecoder(ad, depth=2, **kw),
}


@pytest.fixture(scope="module")
def adapter(tiny_checkpoint):
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


@pytest.mark.parametrize("lane", LANES)
def test_stream_events_and_stats(adapter, lane):
    decoder = LANES[lane](adapter, sampler=SamplerConfig(temperature=0.8, top_k=10), seed=3)
    events = list(decoder.stream([5, 6, 7, 8], max_tokens=40))
    ids = [t for e in events for t in e.tokens]
    assert events[-1].finished and events[-1].finish_reason in ("eos", "max_tokens")
    assert all(not e.finished for e in events[:-1])
    assert all(len(e.tokens) == len(e.origins) for e in events)
    origins = {o for e in events for o in e.origins}
    assert origins <= {"target", "draft", "correction", "bonus"}
    if lane == "ar":
        assert origins == {"target"}
    else:
        assert events[0].origins == ["target"] and "draft" in origins
    s = events[-1].stats
    assert s.generated_tokens == len(ids)
    assert s.time_to_first_token > 0 and s.decode_seconds > 0 and s.tokens_per_second > 0
    assert s.compute_seconds == pytest.approx(s.prefill_seconds + s.decode_seconds)
    text = "".join(e.text for e in events)
    decoded = adapter.tokenizer.decode(ids)
    if "\ufffd" not in decoded:  # random byte tokens can split UTF-8 sequences differently
        assert text == decoded
    d = s.as_dict()
    for key in ("generated_tokens", "proposed", "accepted", "acceptance_rate", "acceptance_per_depth", "cycles",
                "target_forwards", "prefill_seconds", "decode_seconds", "tokens_per_second", "time_to_first_token",
                "tokens_per_cycle", "mtp_active", "compute_seconds"):
        assert key in d
    # generate() is the same run without the events
    ids2, stats2 = LANES[lane](adapter, sampler=SamplerConfig(temperature=0.8, top_k=10), seed=3).generate(
        mx.array([5, 6, 7, 8]), max_tokens=40)
    assert ids2 == ids and stats2.generated_tokens == len(ids)


@pytest.mark.parametrize("lane", LANES)
def test_own_clock_excludes_time_suspended_at_yield(adapter, lane):
    import time
    start, slept, last = time.perf_counter(), 0.0, None
    for event in LANES[lane](adapter, sampler=GREEDY).stream([5, 6, 7], max_tokens=6):
        time.sleep(0.05)  # a slow consumer: the lane must not be charged for it
        slept += 0.05
        last = event
    wall = time.perf_counter() - start
    assert 0 < last.stats.compute_seconds <= wall - slept


@pytest.mark.parametrize("lane", LANES)
def test_max_tokens_including_one(adapter, lane):
    for n in (1, 2, 3, 7):
        ids, stats = LANES[lane](adapter, sampler=GREEDY).generate([9, 10, 11], max_tokens=n)
        assert len(ids) <= n and stats.generated_tokens == len(ids)
        if stats.finish_reason == "max_tokens":
            assert len(ids) == n
    with pytest.raises(ValueError):
        LANES[lane](adapter, sampler=GREEDY).generate([1], max_tokens=0)


@pytest.mark.parametrize("lane", LANES)
def test_stop_event_ends_within_one_cycle(adapter, lane):
    stop = threading.Event()
    events = []
    for event in LANES[lane](adapter, sampler=SamplerConfig(temperature=1.0, top_k=0, top_p=1.0)).stream(
            [5, 6], max_tokens=500, stop=stop):
        events.append(event)
        if len(events) == 3:
            stop.set()
    assert len(events) == 4  # the three, then the stop acknowledgement with no new tokens
    assert events[-1].finish_reason == "stopped" and events[-1].tokens == []


@pytest.mark.parametrize("lane", LANES)
def test_closing_the_stream_stops_the_decode(adapter, lane):
    gen = LANES[lane](adapter, sampler=GREEDY).stream([5, 6], max_tokens=500)
    next(gen)
    next(gen)
    gen.close()  # what Gradio does when a user presses Stop or closes the tab
    with pytest.raises(StopIteration):
        next(gen)


@pytest.mark.parametrize("lane", LANES)
def test_eos_ends_generation_and_is_not_output(adapter, lane):
    eos = next(iter(adapter.tokenizer.eos_token_ids))
    # find a prompt whose greedy continuation hits EOS by making EOS the only choice
    ids, stats = LANES[lane](adapter, sampler=GREEDY).generate([5, 6, 7], max_tokens=60)
    adapter.tokenizer.eos_token_ids = {ids[4]}  # pretend the 5th token is the EOS
    try:
        ids2, stats2 = LANES[lane](adapter, sampler=GREEDY).generate([5, 6, 7], max_tokens=60)
    finally:
        adapter.tokenizer.eos_token_ids = {eos}
    assert ids2 == ids[: ids.index(ids[4])]
    assert stats2.finish_reason == "eos"


@pytest.mark.parametrize("lane", LANES)
def test_stop_strings(adapter, lane):
    text = "".join(e.text for e in LANES[lane](adapter, sampler=GREEDY).stream([5, 6, 7], max_tokens=30))
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop and stop in text
    events = list(LANES[lane](adapter, sampler=GREEDY).stream([5, 6, 7], max_tokens=30, stop_strings=[stop]))
    out = "".join(e.text for e in events)
    assert events[-1].finish_reason == "stop_string"
    assert out == text[: text.index(stop)]


@pytest.mark.parametrize("lane", LANES)
def test_chunked_prefill_of_a_long_prompt(adapter, lane, monkeypatch):
    prompt = [(i * 7) % 500 + 3 for i in range(700)]
    full, _ = LANES[lane](adapter, sampler=GREEDY).generate(prompt, max_tokens=12)
    monkeypatch.setattr(core.stream, "PREFILL_CHUNK", 128)
    chunked, stats = LANES[lane](adapter, sampler=GREEDY).generate(prompt, max_tokens=12)
    assert stats.prompt_tokens == 700
    assert chunked[:4] == full[:4]  # chunked attention differs in the last bits only


@pytest.mark.parametrize("lane", LANES)
def test_non_finite_logits_raise_instead_of_producing_a_token(tiny_checkpoint, lane):
    bad = load_adapter(tiny_checkpoint(bits=None))
    w = bad.inner.norm.weight
    bad.inner.norm.weight = mx.where(mx.arange(w.size) == 0, mx.nan, w)
    with pytest.raises(NonFiniteLogitsError, match="NaN or infinite"):
        LANES[lane](bad, sampler=SamplerConfig(temperature=0.7)).generate([5, 6, 7], max_tokens=5)


def test_empty_prompt_is_refused(adapter):
    with pytest.raises(ValueError, match="empty"):
        AutoregressiveDecoder(adapter).generate([], max_tokens=3)


def test_depth_validation(adapter):
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(ValueError):
            SpeculativeDecoder(adapter, depth=bad)


def test_auto_depth_prices_out_a_useless_head_and_stays_exact(tiny_checkpoint, adapter, monkeypatch):
    useless = load_adapter(tiny_checkpoint(bits=None, seed=5))  # random head: ~0% acceptance
    ar, _ = AutoregressiveDecoder(useless, sampler=GREEDY).generate([5, 6, 7], max_tokens=80)
    decoder = SpeculativeDecoder(useless, sampler=GREEDY, depth="auto")
    decoder.costs = TYPICAL_COSTS  # measured costs vary with machine load; the policy is what is tested
    # ... on these costs alone: the reply's own cycles would be priced against TYPICAL_COSTS' AR step
    # (tests/test_engine_behaviour.py::test_auto_prices_depths_by_the_cycles_the_reply_runs tests that)
    monkeypatch.setattr(DepthPolicy, "OBSERVED_AFTER", 10**9)
    ids, stats = decoder.generate([5, 6, 7], max_tokens=80)
    assert_greedy_equal(useless, [5, 6, 7], ids, ar)
    assert stats.mtp_active is False
    assert stats.proposed < 20  # it stopped drafting (only probes)
    costs = measure_costs(useless)
    assert costs.verify[1] == 1.0 and costs.mtp_step > 0 and set(costs.verify) >= {1, 2, 3, 4}
    # whole cycles, timed through the lanes' loops, for every depth the verify widths cover
    assert set(costs.cycles) == {1, 2, 3, 4} and all(c > 0 for c in costs.cycles.values())
    assert costs.cycle(2) == costs.cycles[2] and TYPICAL_COSTS.cycle(2) == TYPICAL_COSTS.parts(2) == 1.4 + 2 * 0.2
    # the cost model's prediction is reported
    assert stats.predicted_speedup is not None


def test_auto_depth_keeps_speculating_when_it_pays(tiny_checkpoint):
    sure = load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **{**MIXED, "residual_gain": 0.3})))
    decoder = SpeculativeDecoder(sure, sampler=GREEDY, depth="auto")
    decoder.costs = TYPICAL_COSTS
    ids, stats = decoder.generate([5, 6, 7], max_tokens=80)
    ar, _ = AutoregressiveDecoder(sure, sampler=GREEDY).generate([5, 6, 7], max_tokens=80)
    assert_greedy_equal(sure, [5, 6, 7], ids, ar)
    assert stats.acceptance_rate > 0.9 and stats.mtp_active and stats.depth >= 1
    # its own cycles priced the depths it ran (in AR steps of the given costs)
    assert stats.observed_cycle_costs and all(c > 0 for c in stats.observed_cycle_costs.values())


def test_auto_prices_depths_by_the_cycles_the_reply_runs():
    """A calibration that prices cycles wrong is corrected by the reply's own: a depth run
    OBSERVED_AFTER times is priced by its latest cycles' median over the AR step (one slow first
    cycle changes nothing), the others by the calibration times the same bias; cycles timed phase
    by phase, batches and fixed depths are left as they were."""
    from core.stats import GenerationStats

    stats = GenerationStats(mode="mtp", proposed_per_depth=[100, 100, 100], accepted_per_depth=[90, 90, 90])
    # acceptance (90 + 4) / (100 + 5) a depth; calibrated cycles from the parts: 1.4 / 1.8 / 2.2
    tokens = {1: 1 + 94 / 105, 2: 1 + 94 / 105 + (94 / 105) ** 2, 3: 1 + 94 / 105 + (94 / 105) ** 2 + (94 / 105) ** 3}
    policy = DepthPolicy("auto", 3, TYPICAL_COSTS)
    assert policy.best(stats) == (3, pytest.approx(tokens[3] / 2.2))
    for _ in range(DepthPolicy.OBSERVED_AFTER - 1):
        policy.observe(3, 2 * 2.2 * TYPICAL_COSTS.ar_step_seconds)   # twice what the calibration says
        policy.observe(3, None)                                        # a cycle timed phase by phase
    assert policy.best(stats) == (3, pytest.approx(tokens[3] / 2.2)) and stats.observed_cycle_costs == {}
    policy.observe(3, 2 * 2.2 * TYPICAL_COSTS.ar_step_seconds)
    assert policy.best(stats) == (0, 1.0)                              # every depth now costs twice: AR pays
    assert stats.observed_cycle_costs == {3: pytest.approx(4.4)}
    assert policy.best(stats, batch=2)[0] == 3                          # a batch keeps its measured prices

    cheap = DepthPolicy("auto", 3, TYPICAL_COSTS)
    cheap.observe(1, 100 * 1.4 * TYPICAL_COSTS.ar_step_seconds)       # a first cycle that compiled its shapes
    for _ in range(DepthPolicy.OBSERVED_AFTER):
        cheap.observe(1, 0.7 * 1.4 * TYPICAL_COSTS.ar_step_seconds)
    assert cheap.best(stats) == (3, pytest.approx(tokens[3] / (0.7 * 2.2)))   # the bias carried to depth 3
    fixed = DepthPolicy(2, 3, TYPICAL_COSTS)
    fixed.observe(2, 1.0)
    assert fixed.seen == {}


def test_chat_prompt_ids_uses_the_template_and_flattens_gradio_blocks(adapter):
    plain = chat_prompt_ids(adapter, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}])
    blocks = chat_prompt_ids(adapter, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}])
    assert plain == blocks
    text = adapter.tokenizer.decode(plain)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    with pytest.raises(ValueError):
        chat_prompt_ids(adapter, [])
    with pytest.raises(ValueError):
        chat_prompt_ids(adapter, [{"role": "robot", "content": "x"}])


def test_the_prefill_chunk_is_a_setting(adapter, monkeypatch):
    """MTP_CHAT_PREFILL_CHUNK sets the chunks every prefill runs (ModelHost at start-up):
    a 700-token prompt then goes through the trunk in ceil(700 / chunk) long forwards; out of
    16-8192 it is refused, by the settings and by core.stream.set_prefill_chunk, saying so."""
    from pydantic import ValidationError

    from core.settings import Settings
    from core.stream import Prompt, prefill, set_prefill_chunk

    monkeypatch.setattr(core.stream, "PREFILL_CHUNK", core.stream.PREFILL_CHUNK)   # restored after
    monkeypatch.setenv("MTP_CHAT_PREFILL_CHUNK", "300")
    set_prefill_chunk(Settings().prefill_chunk)
    sizes, real = [], adapter.forward
    monkeypatch.setattr(adapter, "forward", lambda tokens, cache, **kw: sizes.append(tokens.shape[1]) or real(tokens, cache, **kw))
    cache = adapter.make_cache()
    prefill(adapter, Prompt(tuple((i * 7) % 500 + 3 for i in range(700))), cache, None)
    assert sizes == [300, 300, 100]
    with pytest.raises(ValueError, match="16-8192"):
        set_prefill_chunk(8)
    monkeypatch.setenv("MTP_CHAT_PREFILL_CHUNK", "9000")
    with pytest.raises(ValidationError):
        Settings()
