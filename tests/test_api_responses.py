"""OpenAI Responses on the launched server, driven by the official `openai` package's
`responses` (whole and streamed, strict validation, previous_response_id from the bounded
store, text.format), on a tiny checkpoint with a Qwen3.5-style template."""
from __future__ import annotations

import json

import pytest

from tests._webapp_helpers import make_host, served

openai = pytest.importorskip("openai")

MODEL = "model"
OFF = {"effort": "none"}


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    return make_host(tiny_checkpoint(template="qwen3_5"), response_store=3)


@pytest.fixture(scope="module")
def client(host):
    with served(host) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, _strict_response_validation=True)


def test_a_whole_response_with_reasoning_and_message_items(client):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=16, temperature=0,
                                instructions="Be brief.")
    assert r.object == "response" and r.id.startswith("resp_") and r.instructions == "Be brief."
    assert r.output[0].type == "reasoning" and {o.type for o in r.output} <= {"reasoning", "message"}
    assert r.status in ("completed", "incomplete") and r.usage.output_tokens <= 16
    assert (r.status == "incomplete") == (r.incomplete_details is not None)
    plain = client.responses.create(model=MODEL, input=[{"role": "user", "content": "Hi"}], max_output_tokens=16,
                                    temperature=0, reasoning=OFF)
    assert [o.type for o in plain.output] == ["message"] and isinstance(plain.output_text, str)


def test_streaming_events_are_numbered_and_end_completed(client):
    with client.responses.stream(model=MODEL, input="Hi", max_output_tokens=16, temperature=0) as s:
        events = list(s)
        final = s.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.reasoning_text.delta" in types and "response.output_item.done" in types
    whole = client.responses.create(model=MODEL, input="Hi", max_output_tokens=16, temperature=0)
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens


def test_previous_response_id_continues_from_the_store_and_unknown_ids_say_so(client):
    first = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, temperature=0, reasoning=OFF)
    second = client.responses.create(model=MODEL, input="More", previous_response_id=first.id, max_output_tokens=4,
                                     temperature=0, reasoning=OFF)
    assert second.previous_response_id == first.id
    explicit = client.responses.create(model=MODEL, max_output_tokens=4, temperature=0, reasoning=OFF, store=False,
                                       input=[{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": first.output_text},
                                              {"role": "user", "content": "More"}])
    assert second.usage.input_tokens == explicit.usage.input_tokens and second.output_text == explicit.output_text
    assert explicit.usage.input_tokens_details.cached_tokens > 0
    with pytest.raises(openai.NotFoundError, match="not known"):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_unknown")
    with pytest.raises(openai.NotFoundError):                     # store: false kept nothing
        client.responses.create(model=MODEL, input="x", previous_response_id=explicit.id)
    for _ in range(3):                                            # a store of 3: the oldest is dropped
        client.responses.create(model=MODEL, input="x", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id=first.id)


def test_text_format_json_schema_and_forced_function_calls(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=24, temperature=0,
                                text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}})
    assert set(json.loads(r.output_text)) == {"n"}
    tools = [{"type": "function", "name": "f", "parameters": schema, "strict": True}]
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=40, temperature=0.8, tools=tools,
                                tool_choice="required")
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "f" and set(json.loads(calls[0].arguments)) == {"n"}
    with pytest.raises(openai.BadRequestError, match="cannot be enforced"):
        client.responses.create(model=MODEL, input="Hi", text={"format": {"type": "json_schema", "name": "x",
                                                                          "schema": {"type": "objekt"}}})
