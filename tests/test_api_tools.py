"""Tools end to end: rendered by the template, written by a real model, returned as tool_calls.

The tiny Qwen3.5-layout checkpoint is trained first (tests/_memorized.py) to answer the weather
question with a thought and a tool call, the tool's result with a sentence, and a variant with a
malformed call; the server, the engine (MTP lane) and the official `openai` client then run
unchanged on those weights. It has two layers, one linear-attention and one full-attention (the
default tiny checkpoint has four): on the CPU the linear-attention layers' recurrence costs one
step per token, forward and backward, and training four layers on these ~440-token prompts took
63 steps and ~70 CPU-seconds; two take 42 steps and ~30.
"""
from __future__ import annotations

import json

import openai
import pytest

from tests._memorized import memorize
from tests._webapp_helpers import make_host, served


MODEL = "model"
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
ASK_PLAINLY = [{"role": "user", "content": "Weather in Oslo, no thinking."}]
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}]
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
FOLLOW = [*ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]},
          {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
PLAIN = {"enable_thinking": False}
MALFORMED = '<tool_call>{"name": get_weather}</tool_call>'


@pytest.fixture(scope="module")
def client(tiny_checkpoint):
    path = memorize(tiny_checkpoint(fresh=True, template="qwen3_5", bits=None, num_layers=2), [
        (ASK, WEATHER, None, 'The user wants weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
                             '"arguments": {"city": "Oslo"}}\n</tool_call>'),
        (FOLLOW, WEATHER, False, "It is sunny."),
        (ASK_PLAINLY, WEATHER, False, MALFORMED),
    ])
    host = make_host(path, temperature=0.0)
    with served(host) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                            _strict_response_validation=True), host


def test_tools_are_rendered_by_the_template_and_calls_come_back_as_tool_calls(client):
    client, host = client
    rendered = host.tokenizer.apply_chat_template(ASK, tools=WEATHER, add_generation_prompt=True, tokenize=True)
    bare = host.tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=True)
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, temperature=0)
    assert r.usage.prompt_tokens == len(rendered) > len(bare)          # the tools went into the prompt
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not msg.content
    assert msg.tool_calls[0].function.name == "get_weather" and msg.tool_calls[0].id.startswith("call_")
    assert json.loads(msg.tool_calls[0].function.arguments) == {"city": "Oslo"}
    assert msg.model_extra["reasoning_content"] == "The user wants weather."   # the template opened <think>
    assert r.model_extra["mtp"]["mode"] == "mtp"
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, temperature=0, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "get_weather")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the call goes back into the conversation, with the tool's answer
    follow = [*ASK, {"role": "assistant", "content": None,
                     "tool_calls": [{**msg.tool_calls[0].model_dump(), "id": "call_1"}]}, FOLLOW[-1]]
    r = client.chat.completions.create(model=MODEL, messages=follow, tools=WEATHER, temperature=0, extra_body=PLAIN)
    assert r.choices[0].message.content == "It is sunny." and r.choices[0].finish_reason == "stop"


def test_a_call_the_model_opens_is_held_to_an_offered_tool_and_its_schema(client):
    """The model learned to write a malformed call here. With tools offered (tool_choice auto)
    the engine holds what follows its <tool_call> to the offered names and their parameter
    schemas (core.constraints.Triggered), so the call comes back well-formed."""
    client, _ = client
    r = client.chat.completions.create(model=MODEL, messages=ASK_PLAINLY, tools=WEATHER, temperature=0,
                                       extra_body=PLAIN)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls, msg
    assert msg.tool_calls[0].function.name == "get_weather"
    args = json.loads(msg.tool_calls[0].function.arguments)
    assert isinstance(args, dict) and set(args) <= {"city"} and all(isinstance(v, str) for v in args.values())


def test_a_malformed_call_comes_back_as_text_where_no_tool_is_offered(client):
    """Without tools nothing holds the tag's text: what the model wrote comes back as it is."""
    client, _ = client
    r = client.chat.completions.create(model=MODEL, messages=ASK_PLAINLY, tools=WEATHER, tool_choice="none",
                                       temperature=0, extra_body=PLAIN)
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert "get_weather" in (r.choices[0].message.content or "")
