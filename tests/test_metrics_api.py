"""GET /metrics on a real server: Prometheus text that prometheus_client parses back, counters
that rise by exactly what a scripted set of requests decoded (the official openai client for
the API, gradio_client for a chat reply and a race), accepted-token counters equal to the sum
of the API's reported accepted counts, and the same key and password rules as /v1."""
from __future__ import annotations

from collections import defaultdict

import gradio_client
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._engine_helpers import MIXED, make_mixed_head
from tests._webapp_helpers import make_host, served

GREEDY = (0.0, 1.0, 0, 0.0)     # the UI's temperature, top_p, top_k, min_p


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    # a head that accepts some drafts: the speculative counters then have something to count
    return make_host(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


@pytest.fixture(scope="module")
def url(host):
    with served(host) as (url, _):
        yield url


def scrape(url, **kw) -> dict:
    """{(sample name, sorted labels): value} of one GET /metrics."""
    r = httpx.get(url + "/metrics", **kw)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: dict, name: str, **match) -> float:
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(dict(labels).get(k) == str(w) for k, w in match.items()))


def test_counters_rise_by_what_the_requests_decoded(url):
    before = scrape(url)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    seen = defaultdict(lambda: defaultdict(int))     # (lane, depth) -> what the API reported
    script = [("mtp", 2, "Tell me about ships.", False), ("mtp", 2, "And the sea?", True),
              ("mtp", 1, "Count to five.", False), ("ar", 2, "Name a colour.", False),
              ("mtp", 2, "Write one line.", True)]
    for lane, depth, text, stream in script:
        body = dict(model="model", messages=[{"role": "user", "content": text}], max_tokens=20, temperature=0,
                    extra_body={"mode": lane, "depth": depth})
        if stream:
            chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body))
            use, mtp = chunks[-1].usage, chunks[-1].model_extra["mtp"]
        else:
            r = client.chat.completions.create(**body)
            use, mtp = r.usage, r.model_extra["mtp"]
        key = (lane, depth if lane == "mtp" else 0)
        seen[key]["requests"] += 1
        seen[key]["prompt"] += use.prompt_tokens
        seen[key]["cached"] += use.prompt_tokens_details.cached_tokens
        seen[key]["generated"] += use.completion_tokens
        seen[key]["accepted"] += mtp["accepted"]
        seen[key]["proposed"] += mtp["proposed"]
    r = client.completions.create(model="model", prompt="Once upon a time", max_tokens=12, temperature=0,
                                  extra_body={"mode": "mtp", "depth": 2})
    seen[("mtp", 2)]["requests"] += 1
    seen[("mtp", 2)]["prompt"] += r.usage.prompt_tokens
    seen[("mtp", 2)]["cached"] += r.usage.prompt_tokens_details.cached_tokens
    seen[("mtp", 2)]["generated"] += r.usage.completion_tokens
    seen[("mtp", 2)]["accepted"] += r.model_extra["mtp"]["accepted"]
    seen[("mtp", 2)]["proposed"] += r.model_extra["mtp"]["proposed"]

    after = scrape(url)

    def rise(name, **labels):
        return total(after, name, source="api", **labels) - total(before, name, source="api", **labels)

    assert sum(v["accepted"] for v in seen.values()) > 0, "the test needs accepted drafts to mean anything"
    for (lane, depth), want in seen.items():
        labels = {"lane": lane, "depth": depth}
        assert rise("mtp_chat_requests_total", **labels) == want["requests"]
        assert rise("mtp_chat_prompt_tokens_total", **labels) == want["prompt"]
        assert rise("mtp_chat_cached_prompt_tokens_total", **labels) == want["cached"]
        assert rise("mtp_chat_generation_tokens_total", **labels) == want["generated"]
        assert rise("mtp_chat_time_to_first_token_seconds_count", **labels) == want["requests"]
        assert rise("vllm:spec_decode_num_accepted_tokens_total", **labels) == want["accepted"]
        assert rise("vllm:spec_decode_num_draft_tokens_total", **labels) == want["proposed"]
        assert rise("vllm:spec_decode_num_accepted_tokens_per_pos_total", **labels) == want["accepted"]
        if lane == "mtp":
            assert 0 < rise("vllm:spec_decode_num_drafts_total", **labels) * depth <= want["proposed"] + depth
    assert rise("vllm:spec_decode_num_drafts_total", lane="ar") == 0


def test_chat_and_race_are_counted_under_their_source(url):
    before = scrape(url)
    c = gradio_client.Client(url, verbose=False, download_files=False)
    c.predict([{"role": "user", "content": [{"type": "text", "text": "Hello"}]}], "mtp", "", *GREEDY, 16, 0, "2",
              api_name="/respond")
    *_, summary = c.predict("What is a verb?", 1, *GREEDY, 16, 0, "2", api_name="/race")
    after = scrape(url)

    def rise(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    assert rise("mtp_chat_requests_total", source="chat", lane="mtp", depth=2) == 1
    assert rise("mtp_chat_requests_total", source="race", lane="ar", depth=0) == 1
    assert rise("mtp_chat_requests_total", source="race", lane="mtp", depth=2) == 1
    assert rise("mtp_chat_generation_tokens_total", source="race", lane="ar") == summary["ar"]["tokens"]
    assert rise("mtp_chat_generation_tokens_total", source="race", lane="mtp") == summary["mtp"]["tokens"]
    assert rise("mtp_chat_requests_total", source="api") == 0


def test_metrics_follow_the_api_key_and_password_rules(host):
    with served(host, api_key="sesame") as (url, _):
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert "mtp_chat_requests" in httpx.get(url + "/metrics", headers={"Authorization": "Bearer sesame"}).text
    with served(host, auth=("ann", "pw")) as (url, _):          # a password and no key: the API is off
        r = httpx.get(url + "/metrics")
        assert r.status_code == 403 and "--api-key" in r.json()["error"]["message"]
        r = httpx.get(url + "/metrics", auth=("ann", "pw"))
        assert r.status_code == 403
    with served(host, auth=("ann", "pw"), api_key="sesame") as (url, _):
        assert httpx.get(url + "/metrics", headers={"Authorization": "Bearer sesame"}).status_code == 200
    with served(host) as (url, _):                               # no key: this machine only
        r = httpx.get(url + "/metrics", headers={"Host": "evil.example:80"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "local_only"
        r = httpx.get(url + "/metrics", headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        assert scrape(url)
