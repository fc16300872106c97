"""The bundled demo model calls a tool through the OpenAI-compatible API (/v1/chat/completions).

The demo was trained on conversations that offer tools in the system turn (the Qwen3.5 tool
format) under names it must copy from there; asked what a word means with a dictionary offered,
it thinks, then answers with a <tool_call> block that the server returns as ``tool_calls``; given
the tool's result (sent back as clients send it: the call without its thought) it thinks, closes
the thought and answers with the result. Greedy decoding, the MTP lane, the official ``openai``
client. "lantern" is in no training conversation and its definition in no training answer.

What the demo does not do (models/demo/README.md, "Known weaknesses"): its training conversations
always offer two to six tools, so offered a dictionary alone it answers from memory instead of
calling it; here the dictionary is offered beside a weather tool, as agents offer several.
"""
from __future__ import annotations

import json

import pytest

from core.settings import DEMO_MODEL_DIR
from tests._webapp_helpers import make_host, served

openai = pytest.importorskip("openai")

DICTIONARY = [{"type": "function", "function": {
    "name": "define_word", "description": "Define an English word.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string", "description": "the word to look up"}},
                   "required": ["word"]}}},
              {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What does lantern mean?"}]   # "lantern" is in no training conversation
GREEDY = dict(model="demo", temperature=0, top_p=1, max_tokens=96, extra_body={"top_k": 0, "min_p": 0, "depth": 2})


@pytest.fixture(scope="module")
def client():
    host = make_host(DEMO_MODEL_DIR)
    with served(host) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, _strict_response_validation=True)


def test_the_demo_answers_a_fitting_request_with_a_tool_call(client):
    r = client.chat.completions.create(messages=ASK, tools=DICTIONARY, **GREEDY)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not msg.content
    assert [c.function.name for c in msg.tool_calls] == ["define_word"]
    assert json.loads(msg.tool_calls[0].function.arguments) == {"word": "lantern"}
    assert "lantern" in msg.model_extra["reasoning_content"].lower()   # it thought about the request, and closed the thought
    assert r.model_extra["mtp"]["proposed"] > 0
    plain = client.chat.completions.create(messages=ASK, **GREEDY).choices[0]   # no tool offered: no call
    assert plain.finish_reason == "stop" and not plain.message.tool_calls and plain.message.content


def test_the_demo_answers_after_the_tool_result(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "define_word", "arguments": '{"word": "lantern"}'}}
    result = json.dumps({"word": "lantern", "part_of_speech": "noun",
                         "definition": "light in a transparent protective case"})
    follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": result}]
    r = client.chat.completions.create(messages=follow, tools=DICTIONARY, **GREEDY)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop" and not msg.tool_calls
    assert msg.model_extra["reasoning_content"] and "think>" not in msg.content   # the thought closed before the answer
    assert "lantern" in msg.content.lower()
    # the answer copies the tool's result (v2's never did); greedy here it garbles one word of it
    # ("light in a transparent solid case"): how often the copy is whole is eval_v3.py's measure
    assert "light in a transparent" in msg.content
