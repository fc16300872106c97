"""webapp.serving.metrics on its own: counters from GenerationStats, parsed back by prometheus_client."""
from prometheus_client.parser import text_string_to_metric_families

from core import GenerationStats
from webapp.serving.metrics import Metrics


def samples(m: Metrics) -> dict:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def stats(mode, **kw):
    s = GenerationStats(mode=mode, prompt_tokens=30, cached_tokens=20, generated_tokens=11,
                        time_to_first_token=0.2, decode_seconds=0.1, finish_reason="eos")
    if mode == "mtp":
        for depth, n in [(2, 2), (2, 0), (2, 1), (1, 1)]:
            s.record_cycle(depth, n)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def test_counters_follow_the_stats_of_each_decode():
    m = Metrics()
    m.observe(stats("mtp"), depth=2, source="api")
    m.observe(stats("mtp"), depth=2, source="api")
    m.observe(stats("ar"), depth=2, source="chat")
    got = samples(m)
    api = (("depth", "2"), ("lane", "mtp"), ("source", "api"))
    assert got[("mtp_chat_requests_total", tuple(sorted(api + (("finish_reason", "eos"),))))] == 2
    assert got[("mtp_chat_prompt_tokens_total", api)] == 60
    assert got[("mtp_chat_cached_prompt_tokens_total", api)] == 40
    assert got[("mtp_chat_generation_tokens_total", api)] == 22
    # 4 cycles drafted 7 tokens, 4 accepted: positions 0, 0, 1, 0 -> [3, 1]
    assert got[("vllm:spec_decode_num_drafts_total", api)] == 8
    assert got[("vllm:spec_decode_num_draft_tokens_total", api)] == 14
    assert got[("vllm:spec_decode_num_accepted_tokens_total", api)] == 8
    assert got[("vllm:spec_decode_num_accepted_tokens_per_pos_total", tuple(sorted(api + (("position", "0"),))))] == 6
    assert got[("vllm:spec_decode_num_accepted_tokens_per_pos_total", tuple(sorted(api + (("position", "1"),))))] == 2
    ar = (("depth", "0"), ("lane", "ar"), ("source", "chat"))
    assert got[("mtp_chat_generation_tokens_total", ar)] == 11
    assert ("vllm:spec_decode_num_drafts_total", ar) not in got
    assert got[("mtp_chat_time_to_first_token_seconds_count", api)] == 2
    assert got[("mtp_chat_time_per_output_token_seconds_sum", api)] == 2 * 0.1 / 10
