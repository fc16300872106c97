"""Anthropic Messages on the launched server, driven by the official `anthropic` package (sync,
async, streaming, count_tokens, errors mapped to its exception types, both key headers) with
strict response validation, on a tiny checkpoint with a Qwen3.5-style template."""
from __future__ import annotations

import asyncio

import pytest

from tests._webapp_helpers import make_host, served

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

MODEL = "model"
HI = [{"role": "user", "content": "Hi"}]
GREEDY = {"extra_body": {"temperature": 0}}
OFF = {"type": "disabled"}


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    return make_host(tiny_checkpoint(template="qwen3_5"))


@pytest.fixture(scope="module")
def url(host):
    with served(host, keepalive=0.2) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(url):
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, _strict_response_validation=True)


def test_a_whole_message_has_its_blocks_stop_reason_and_usage(client, url):
    m = client.messages.create(model=MODEL, max_tokens=12, messages=HI, **GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == MODEL
    assert [b.type for b in m.content][0] == "thinking"            # the template opened <think>
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens <= 12
    plain = client.messages.create(model=MODEL, max_tokens=12, messages=HI, thinking=OFF, **GREEDY)
    assert [b.type for b in plain.content] == ["text"]
    # the same prompt and sampler as a chat completion: the same reply
    chat = openai.OpenAI(base_url=url + "/v1", api_key="x").chat.completions.create(
        model=MODEL, messages=HI, max_tokens=12, temperature=0, extra_body={"enable_thinking": False})
    assert plain.content[0].text == chat.choices[0].message.content
    total = plain.usage.input_tokens + plain.usage.cache_read_input_tokens
    assert total == chat.usage.prompt_tokens == client.messages.count_tokens(model=MODEL, messages=HI,
                                                                             thinking=OFF).input_tokens


def test_system_blocks_stop_sequences_and_max_tokens(client):
    full = client.messages.create(model=MODEL, max_tokens=30, messages=HI, thinking=OFF, **GREEDY).content[0].text
    assert len(full) > 8, full
    stop = full[4:8]
    m = client.messages.create(model=MODEL, max_tokens=30, messages=HI, thinking=OFF, stop_sequences=[stop], **GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop and m.content[0].text == full[:full.index(stop)]
    short = client.messages.create(model=MODEL, max_tokens=2, messages=HI, thinking=OFF,
                                   system=[{"type": "text", "text": "Be brief."}], **GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
    assert client.messages.count_tokens(model=MODEL, messages=HI, system="Be brief.").input_tokens > \
        client.messages.count_tokens(model=MODEL, messages=HI).input_tokens


def test_streaming_sends_the_full_event_sequence(client):
    with client.messages.stream(model=MODEL, max_tokens=16, messages=HI, **GREEDY) as s:
        events = list(s)
        final = s.get_final_message()
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop" and "message_delta" in types
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "thinking_delta" in deltas and "signature_delta" in deltas
    whole = client.messages.create(model=MODEL, max_tokens=16, messages=HI, **GREEDY)
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_the_async_client(url):
    async def run():
        async with anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0,
                                            _strict_response_validation=True) as c:
            whole = await c.messages.create(model=MODEL, max_tokens=8, messages=HI, thinking=OFF, **GREEDY)
            async with c.messages.stream(model=MODEL, max_tokens=8, messages=HI, thinking=OFF, **GREEDY) as s:
                text = await s.get_final_text()
            return whole, text

    whole, text = asyncio.run(run())
    assert whole.content[0].text == text


def test_a_cached_prefix_is_reported_as_cache_read(client):
    first = client.messages.create(model=MODEL, max_tokens=4, messages=HI, thinking=OFF, **GREEDY)
    follow = HI + [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "More"}]
    again = client.messages.create(model=MODEL, max_tokens=4, messages=follow, thinking=OFF, **GREEDY)
    assert again.usage.cache_read_input_tokens > 0 and again.model_extra["mtp"]["cached_tokens"] > 0
    # where its time to first token went: the snapshot found, then the new tokens' chunks
    parts, ttft = again.model_extra["mtp"]["prefill_parts"], again.model_extra["mtp"]["ttft"]
    assert {"lookup_s", "chunks_s", "build_s", "snapshots_s", "chunks", "last_chunk_tokens", "last_chunk_s"} <= set(parts)
    assert set(parts) <= {"lookup_s", "chunks_s", "build_s", "snapshots_s", "chunks", "last_chunk_tokens",
                          "last_chunk_s", "full_chunk_tokens", "full_chunk_s"}   # a whole chunk's, where the prompt had one
    assert parts["chunks"] >= 1 and 0 < parts["last_chunk_s"] <= parts["chunks_s"]
    assert 0 < parts["build_s"] <= parts["chunks_s"]   # the host's graph building, inside the chunks' time
    assert 1 <= parts["last_chunk_tokens"] <= again.model_extra["mtp"]["prefilled_tokens"]
    assert 0 < parts["lookup_s"] + parts["chunks_s"] + parts["snapshots_s"] <= ttft + 1e-3


def test_errors_map_to_the_clients_exception_types(client, url):
    with pytest.raises(anthropic.NotFoundError, match=f"serves '{MODEL}'"):
        client.messages.create(model="claude-opus-4-5", max_tokens=4, messages=HI)
    with pytest.raises(anthropic.BadRequestError, match="(?i)max.tokens"):
        client.messages.create(model=MODEL, max_tokens=0, messages=HI)
    with pytest.raises(anthropic.BadRequestError, match="text only"):
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="server tools"):
        client.messages.create(model=MODEL, max_tokens=4, messages=HI,
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.BadRequestError, match="cannot be enforced"):
        client.messages.create(model=MODEL, max_tokens=4, messages=HI,
                               output_config={"format": {"type": "json_schema", "schema": {"type": "objekt"}}})
    r = httpx.post(url + "/v1/messages", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_both_key_headers_are_accepted(host):
    with served(host, api_key="sekret") as (url, _):
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
                model=MODEL, max_tokens=2, messages=HI)
        for c in (anthropic.Anthropic(base_url=url, api_key="sekret", max_retries=0),            # x-api-key
                  anthropic.Anthropic(base_url=url, auth_token="sekret", max_retries=0)):       # Bearer (Claude Code)
            assert c.messages.create(model=MODEL, max_tokens=2, messages=HI).usage.output_tokens <= 2


def test_structured_output_through_output_config(client):
    import json

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    m = client.messages.create(model=MODEL, max_tokens=24, messages=HI, **GREEDY,
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    assert set(json.loads(m.content[-1].text)) == {"n"}


def test_warm_up_builds_the_grammars_view_of_the_vocabulary(tiny_checkpoint, tmp_path):
    """llguidance's tokenizer (1.3 s for a 248k vocabulary) is built at start-up, not in the
    first request holding a tool call or reply format (the GPU's first agent turn after a restart
    waited 1.6-2.2 s outside its compute, later turns 0.4 s)."""
    from core import constraints
    from webapp.serving.params import parse_params

    h = make_host(tiny_checkpoint(template="qwen3_5"), costs_dir=str(tmp_path))
    constraints._TOKENIZERS.pop(id(h.tokenizer), None)
    h.warmup(parse_params(0, 1, 0, 0, 4, 0, 1, max_depth=h.max_depth), tokens=2)
    assert id(h.tokenizer) in constraints._TOKENIZERS
