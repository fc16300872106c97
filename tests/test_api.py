"""The OpenAI-compatible API of a real launched server, driven by the official ``openai``
package (sync and async, strict response validation) and raw HTTP (httpx), on a tiny
checkpoint with a Qwen3.5-style template (tools, thinking). One server for the module;
a second and third only for the key and password rules."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from tests._webapp_helpers import make_host, served


MODEL = "model"                     # the tiny checkpoint's directory name is the served id
HI = [{"role": "user", "content": "Hi"}]
PLAIN = {"enable_thinking": False}  # the template then closes the think block: the reply is content


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    return make_host(tiny_checkpoint(template="qwen3_5"))


@pytest.fixture(scope="module")
def server(host):
    with served(host, keepalive=0.2) as (url, demo):
        yield url, demo


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, _strict_response_validation=True)


def greedy(client, max_tokens=24, **kw):
    return client.chat.completions.create(model=MODEL, messages=kw.pop("messages", HI), max_tokens=max_tokens,
                                          temperature=0, extra_body={**PLAIN, **kw.pop("extra_body", {})}, **kw)


# --- models, health, plain chat -------------------------------------------------------------
def test_models_list_names_the_served_model(client, url):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL] and models.data[0].owned_by == "mtp-chat"
    assert httpx.get(url + "/health").json() == {"status": "ok"}


def test_chat_completion_non_streaming(client):
    r = greedy(client, max_tokens=16)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    mtp = r.model_extra["mtp"]
    assert mtp["mode"] == "mtp" and mtp["proposed"] >= mtp["accepted"] >= 0 and mtp["ttft"] > 0
    assert {"tokens_per_second", "acceptance", "depth", "tokens_per_cycle"} <= set(mtp)


def test_ar_mode_and_legacy_completions(client):
    r = greedy(client, max_tokens=8, extra_body={"mode": "ar"})
    assert r.model_extra["mtp"]["mode"] == "ar" and r.model_extra["mtp"]["acceptance"] is None
    c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0)
    assert c.object == "text_completion" and c.choices[0].finish_reason in ("stop", "length")
    assert c.usage.completion_tokens <= 6 and isinstance(c.choices[0].text, str)
    # The SDK's Completion type requires a finish_reason on every chunk, which OpenAI's own
    # legacy stream does not send (null until the last chunk): this one call is not strict.
    lax = openai.OpenAI(base_url=client.base_url, api_key="unused", max_retries=0)
    chunks = list(lax.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                                         stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == c.choices[0].text
    assert chunks[-1].choices[0].finish_reason == c.choices[0].finish_reason


def test_streaming_chat_with_the_async_client(url):
    async def run():
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               _strict_response_validation=True)
        try:
            stream = await c.chat.completions.create(
                model=MODEL, messages=HI, max_tokens=12, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body=PLAIN)
            return [chunk async for chunk in stream]
        finally:
            await c.close()

    chunks = asyncio.run(run())
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    with_choices = [c for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in with_choices]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1]), finishes
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 12
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 0
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == greedy(openai.OpenAI(base_url=url + "/v1", api_key="x"), max_tokens=12).choices[0].message.content


def sse_lines(url, body, headers=None):
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


def test_the_raw_event_stream(url):
    lines = sse_lines(url, {"model": MODEL, "messages": HI, "max_tokens": 10, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}, **PLAIN})
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert all(line.startswith(("data: ", ":")) for line in lines)
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    events = [json.loads(d) for d in data[:-1]]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert len({e["id"] for e in events}) == 1 and len({e["created"] for e in events}) == 1
    finish_at = [i for i, e in enumerate(events) if e["choices"] and e["choices"][0]["finish_reason"]]
    assert finish_at == [len(events) - 2]
    usage = events[-1]
    assert usage["choices"] == [] and set(usage["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens",
                                                              "prompt_tokens_details"}
    assert "cached_tokens" in usage["usage"]["prompt_tokens_details"] and "mtp" in usage
    without = sse_lines(url, {"model": MODEL, "messages": HI, "max_tokens": 4, "stream": True, **PLAIN})
    assert not any('"usage"' in line for line in without)           # usage only when asked


# --- sampling controls --------------------------------------------------------------------
def test_max_tokens_gives_length(client):
    r = greedy(client, max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    r = client.chat.completions.create(model=MODEL, messages=HI, max_completion_tokens=2, max_tokens=50,
                                       temperature=0, extra_body=PLAIN)
    assert r.usage.completion_tokens == 2


def test_stop_sequences_end_the_reply_before_them(client):
    full = greedy(client, max_tokens=40).choices[0].message.content
    assert len(full) > 12, full
    stop = full[8:12]
    cut = full[:full.index(stop)]
    r = greedy(client, max_tokens=40, stop=[stop])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    streamed = greedy(client, max_tokens=40, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == cut


def test_seeds_are_reproducible_at_positive_temperature(client):
    def sample(seed):
        return client.chat.completions.create(model=MODEL, messages=HI, max_tokens=16, temperature=0.9, top_p=1,
                                              seed=seed, extra_body={**PLAIN, "top_k": 0}).choices[0].message.content

    a = sample(7)
    assert sample(7) == a
    assert any(sample(s) != a for s in (8, 9, 10))


def test_extreme_but_legal_values_work(client):
    for kw in ({"temperature": 5.0, "top_k": 10**9}, {"temperature": 1e-6}, {"min_p": 0.999}, {"top_p": 1e-9},
               {"seed": 2**62, "temperature": 1.0}, {"depth": "auto"}, {"depth": 4}, {"stop": ["\u00e9", "x" * 512]}):
        extra = {k: kw.pop(k) for k in ("top_k", "min_p", "depth") if k in kw}
        r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, extra_body={**PLAIN, **extra},
                                           **kw)
        assert r.choices[0].finish_reason in ("stop", "length"), kw


# --- errors --------------------------------------------------------------------------------------
def test_errors_map_to_the_clients_exception_types(client, url):
    with pytest.raises(openai.BadRequestError, match="one choice"):
        client.chat.completions.create(model=MODEL, messages=HI, n=2)
    with pytest.raises(openai.BadRequestError, match="Temperature"):
        client.chat.completions.create(model=MODEL, messages=HI, temperature=9)
    with pytest.raises(openai.NotFoundError, match=f"serves '{MODEL}'"):
        client.chat.completions.create(model="gpt-4o", messages=HI)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=10_000)
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 5_000_000}])
    assert err.value.status_code == 413
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 100_000}])
    assert err.value.status_code == 413 and err.value.code == "input_too_large"
    r = httpx.post(url + "/v1/chat/completions", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(url + "/v1/chat/completions")
    assert r.status_code == 405 and "POST" in r.json()["error"]["message"]


def test_without_a_key_only_programs_on_this_machine_are_answered(url):
    ok = httpx.get(url + "/v1/models", headers={"Origin": "http://localhost:3000"})
    assert ok.status_code == 200
    for headers in ({"Host": "evil.example"}, {"Origin": "https://evil.example"}, {"Origin": "null"}):
        r = httpx.post(url + "/v1/chat/completions", json={"messages": HI}, headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "local_only", headers


def test_api_key_rules(host):
    with served(host, api_key="s3cret-key") as (url, _):
        for key in ("", "wrong", "s3cret-key-and-more"):
            c = openai.OpenAI(base_url=url + "/v1", api_key=key or "none", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                c.models.list()
        r = httpx.get(url + "/v1/models")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"]["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=url + "/v1", api_key="s3cret-key", max_retries=0)
        assert ok.models.list().data[0].id == MODEL


def test_a_password_without_a_key_turns_the_api_off_and_is_not_bypassed(host):
    with served(host, auth=("ann", "pw")) as (url, _):
        r = httpx.post(url + "/v1/chat/completions", json={"messages": HI})
        assert r.status_code == 403 and "--api-key" in r.json()["error"]["message"]
        assert httpx.get(url + "/config").status_code in (401, 403)        # Gradio still wants the password


# --- concurrency, cancel, keep-alive --------------------------------------------------------
# A random tiny model's greedy reply may meet EOS on one machine and not on another (BLAS rounding
# differs by CPU), so the long prompt is the first candidate that, here, runs to 400 tokens.
LONG_CANDIDATES = ["Hello there", "Tell me a story", "Count to a thousand", "abc", "Why?", "Go on"]


@pytest.fixture(scope="module")
def long_messages(client):
    for text in LONG_CANDIDATES:
        messages = [{"role": "user", "content": text}]
        if greedy(client, max_tokens=400, messages=messages, extra_body={"mode": "ar"}).choices[0].finish_reason == "length":
            return messages
    pytest.fail(f"no candidate prompt ran to 400 tokens on this machine: {LONG_CANDIDATES}")


def long_stream(messages, max_tokens):
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "mode": "ar", **PLAIN}


def stopped_api_decodes(host) -> float:
    labels = {"lane": "ar", "depth": "0", "source": "api", "finish_reason": "stopped"}
    return host.metrics.registry.get_sample_value("mtp_chat_requests_total", labels) or 0.0


def test_a_client_that_disconnects_frees_the_model_within_a_cycle(url, server, host, long_messages):
    demo = server[1]
    stopped_before = stopped_api_decodes(host)
    with httpx.stream("POST", url + "/v1/chat/completions", json=long_stream(long_messages, 3000), timeout=60) as r:
        # Leave at the first words, with the decode running. Look before leaving: breaking out of
        # iter_lines closes its generator and with it the connection, so the server may already
        # have stopped the decode by the line after the loop.
        running = None
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                running = demo.stops.active()
                break
        assert running == 1
    t0 = time.perf_counter()
    while demo.stops.active() and time.perf_counter() - t0 < 5:
        time.sleep(0.01)
    assert demo.stops.active() == 0, "the decode did not stop"
    host.worker.call(lambda: None)                                    # the model thread is free
    # Ended by the client's leaving: counted 'stopped' once the engine's last event is read (on
    # the model thread, a moment after the request let go of its stop event).
    while stopped_api_decodes(host) == stopped_before and time.perf_counter() - t0 < 10:
        time.sleep(0.01)
    assert stopped_api_decodes(host) == stopped_before + 1
    # a hang guard, not a speed limit: the 3000-token decode left to run would take ~30 s more
    assert time.perf_counter() - t0 < 10, time.perf_counter() - t0


def test_a_client_that_gives_up_on_a_whole_reply_frees_the_model_too(url, server, long_messages):
    demo = server[1]
    body = {**long_stream(long_messages, 3000), "stream": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", json=body, timeout=1.0)   # closes the connection
    t0 = time.perf_counter()
    while demo.stops.active() and time.perf_counter() - t0 < 10:
        time.sleep(0.01)
    assert demo.stops.active() == 0, "the decode did not stop (a hang guard: it had ~30 s of tokens left)"


def test_a_waiting_stream_is_kept_alive_and_served_in_turn(url, server, long_messages):
    demo = server[1]
    first: list = []
    t = threading.Thread(target=lambda: first.extend(sse_lines(url, long_stream(long_messages, 600))), daemon=True)
    t.start()
    t0 = time.perf_counter()
    while not demo.stops.active() and time.perf_counter() - t0 < 10:
        time.sleep(0.01)
    second = sse_lines(url, {**long_stream(HI, 5)})
    t.join(60)
    assert first[-1] == "data: [DONE]" and second[-1] == "data: [DONE]"
    content_at = next(i for i, line in enumerate(second) if '"content"' in line)
    assert ": keep-alive" in second[:content_at]


# --- fuzz -------------------------------------------------------------------------------------
def fuzz_cases():
    base = {"model": MODEL, "messages": HI, "max_tokens": 4}
    bad_values = {
        "temperature": ["hot", -1, 5.5, 1e308, 10**40, True, [], {}, "NaN"],
        "top_p": [0, -0.5, 1.5, "1", [], True, 10**40],
        "top_k": [-1, 1.5, "5", [], True, -10**40],
        "min_p": [1, -0.1, 2, "0", {}],
        "seed": [-2, 1.5, "7", 2**64, [], True],
        "max_tokens": [0, -5, 1.5, "10", 10**40, [], True, 32769],
        "max_completion_tokens": [0, -1, "x", 2.5],
        "n": [2, 0, 100, "1", -1],
        "stop": [5, [1], [""], ["a"] * 50, {"a": 1}, "", ["x" * 600]],
        "stream": ["yes", 1, [], {}],
        "stream_options": [{"include_usage": True}, "x", [1]],
        "mode": ["fast", 1, [], "MTP "],
        "depth": [0, 99, -1, "deep", 1.5, [], True],
        "model": [1, [], {}, "gpt-4", "../../etc/passwd", "x" * 10000],
        "messages": [[], "hi", [{}], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 5}],
                     [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
                     [{"role": "user", "content": [{"type": "text", "text": 5}]}], [1, 2], None,
                     [{"role": "user", "content": "x" * 3_000_000}], [{"role": "user"}] * 5000,
                     [{"role": "assistant", "content": None, "tool_calls": "x"}]],
        "tools": ["x", [{"type": "function"}], [{"type": "retrieval"}], [1], [{"type": "function", "function": {}}],
                  [{"type": "function", "function": {"name": "f", "parameters": "x"}}]],
        "tool_choice": ["required", {"type": "function", "function": {"name": "f"}}, 5],
        "logprobs": ["yes", 3], "top_logprobs": [5, 21, -1], "logit_bias": [{"1": 100}], "frequency_penalty": [1.0],
        "presence_penalty": [-2], "response_format": [{"type": "xml"}, "json", {"type": "json_schema"},
                                                      {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}],
        "echo": [True],
        "functions": [[{"name": "f"}]], "enable_thinking": ["yes", 1], "chat_template_kwargs": [{"x": 1}, "y"],
        "reasoning_effort": ["high"], "unknown_field": [1], "best_of": [3],
    }
    cases = []
    for key, values in bad_values.items():
        for v in values:
            cases.append(("json", {**base, key: v}))
    raw = [b"", b"{", b"[]", b"null", b"42", b'"x"', b"\xff\xfe\xfd", b'{"messages": NaN}',
           b'{"temperature": Infinity, "messages": []}', b'{"a":' * 5000, b"[" * 50000,
           b'{"model": "model", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
           b'{"model": "model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 5000 + b"}",
           b"x" * (5 * 1024 * 1024)]
    cases += [("raw", r) for r in raw]
    cases += [("path", p) for p in ("/v1/engines", "/v1/chat", "/v1/embeddings", "/v1/models/x/y", "/v1")]
    sampling = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "n", "stop", "stream", "mode",
                "depth", "model", "unknown_field")
    legacy = {"model": MODEL, "prompt": "Once", "max_tokens": 4}
    cases += [("legacy", {**legacy, k: v}) for k in sampling for v in bad_values[k]]
    cases += [("legacy", {**base, "prompt": p}) for p in ("", [], ["a", "b"], 5, None, [1, -2, 3], [10**9])]
    cases += [("legacy", {**legacy, "logprobs": v}) for v in (True, 21, -1, "1", 1.5)]
    cases += [("legacy", {**legacy, "echo": v}) for v in ("yes", 1)]
    cases += [("legacy", {"prompt": "x", "messages": HI}), ("legacy", {"prompt": "x", "suffix": "y"}),
              ("legacy", {"prompt": "x", "echo": True, "stream": True}), ("legacy", {"prompt": "x", "max_tokens": 0})]
    return cases


def test_fuzz_every_malformed_request_gets_a_4xx_in_the_openai_shape(url, client):
    cases = fuzz_cases()
    assert len(cases) >= 200, len(cases)
    with httpx.Client(base_url=url, timeout=30) as h:
        for kind, payload in cases:
            if kind == "json":
                r = h.post("/v1/chat/completions", json=payload)
            elif kind == "legacy":
                r = h.post("/v1/completions", json=payload)
            elif kind == "raw":
                r = h.post("/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
            else:
                r = h.post(payload, json={})
            assert 400 <= r.status_code < 500, (kind, str(payload)[:200], r.status_code, r.text[:300])
            err = r.json()["error"]
            assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), r.text
            assert set(err) == {"message", "type", "param", "code"}
    assert greedy(client, max_tokens=4).choices[0].finish_reason in ("stop", "length")
