"""The API on the bundled demo model (a trained model, so its greedy replies are real text and
end by themselves): greedy API = greedy UI (gradio_client /respond) = the engine's own
``SpeculativeDecoder.generate``; the prefix cache serves later turns of a conversation."""
from __future__ import annotations

import gradio_client
import openai
import pytest

from core.settings import DEMO_MODEL_DIR
from tests._webapp_helpers import make_host, served


MODEL = "demo"
QUESTION = "Define harbor."
N = 48


@pytest.fixture(scope="module")
def host():
    return make_host(DEMO_MODEL_DIR)


@pytest.fixture(scope="module")
def url(host):
    with served(host) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, _strict_response_validation=True)


def api_greedy(client, messages, mode="mtp", **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0, top_p=1,
                                          extra_body={"top_k": 0, "min_p": 0, "mode": mode, "depth": 2}, **kw)


def ui_greedy(url, question):
    c = gradio_client.Client(url, verbose=False, download_files=False)
    history = [{"role": "user", "content": [{"type": "text", "text": question}]}]
    final = c.predict(history, "mtp", "", 0.0, 1.0, 0, 0.0, N, 0, "2", True, api_name="/respond")
    replies = [m for m in final if m["role"] == "assistant" and not (m.get("metadata") or {}).get("title")]
    return "".join(b["text"] for m in replies for b in m["content"])


def engine_greedy(host, question):
    from core import SamplerConfig, SpeculativeDecoder, split_reply

    prompt = host.prompt_ids([{"role": "user", "content": question}], max_tokens=N)
    decoder = SpeculativeDecoder(host.adapter, sampler=SamplerConfig(temperature=0, top_p=1, top_k=0, min_p=0),
                                 seed=0, depth=2, max_depth=host.max_depth)
    ids, _ = host.worker.call(decoder.generate, prompt, max_tokens=N)
    # the demo thinks first (its template opens <think>): the API's content is the answer after it
    return split_reply(host.tokenizer.decode(ids), inside=host.opens_thinking(prompt))[1]


def test_greedy_api_equals_greedy_ui_equals_the_engine(client, url, host):
    messages = [{"role": "user", "content": QUESTION}]
    api = api_greedy(client, messages)
    text = api.choices[0].message.content
    assert len(text) > 20 and api.model_extra["mtp"]["proposed"] > 0
    assert text == ui_greedy(url, QUESTION)
    assert text == engine_greedy(host, QUESTION)
    assert api_greedy(client, messages, mode="ar").choices[0].message.content == text     # MTP is exact
    streamed = api_greedy(client, messages, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text


def test_later_turns_of_a_conversation_come_from_the_prefix_cache(client):
    messages = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is a noun?"}]
    cached = []
    for question in ("Give an example.", "And a verb?"):
        r = api_greedy(client, messages)
        cached.append((r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens))
        assert r.model_extra["mtp"]["cached_tokens"] == r.usage.prompt_tokens_details.cached_tokens
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": question}]
    stream = api_greedy(client, messages, stream=True, stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage][0]
    cached.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens))
    previous_prompt = cached[1][0]
    assert all(c > 0 for _, c in cached[1:]), cached
    assert previous_prompt - 8 <= cached[2][1] < cached[2][0], cached       # all of the last turn's history
