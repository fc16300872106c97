"""The bundled demo model calls a tool through the OpenAI-compatible API (/v1/chat/completions).

The demo was trained on conversations that offer tools in the system turn (the Qwen3.5 tool
format) under names it must copy from there; asked what a word means with a dictionary offered,
it thinks, then answers with a <tool_call> block that the server returns as ``tool_calls``; given
the tool's result (sent back as clients send it: the call without its thought) it thinks, closes
the thought and answers with the result. Greedy decoding, the MTP lane, the official ``openai``
client. "lantern" is in no training conversation and its definition in no training text.

The dictionary is offered alone (a client with one tool: v3's first build answered that from
memory, 0 of 50 calls) and beside a weather tool, as agents offer several. Beside get_weather it is
named lookup_word, one of the natural names the bundled v3 was leaned on (scripts/demo_model/
tool_names.py: 18 of 20 requests; define_word, define, get_definition, dictionary 20; lexicon 0, the
card's "Known weaknesses").
"""
from __future__ import annotations

import json

import pytest

from core.settings import DEMO_MODEL_DIR
from tests._webapp_helpers import make_host, served

openai = pytest.importorskip("openai")

def dictionary(name):
    return {"type": "function", "function": {
        "name": name, "description": "Define an English word.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string", "description": "the word to look up"}},
                       "required": ["word"]}}}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
OFFERS = pytest.mark.parametrize("tools", [[dictionary("define_word")], [dictionary("lookup_word"), WEATHER]],
                                 ids=["alone", "beside_weather"])
ASK = [{"role": "user", "content": "What does lantern mean?"}]   # "lantern" is in no training conversation
GREEDY = dict(model="demo", temperature=0, top_p=1, max_tokens=96, extra_body={"top_k": 0, "min_p": 0, "depth": 2})


@pytest.fixture(scope="module")
def client():
    host = make_host(DEMO_MODEL_DIR)
    with served(host) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, _strict_response_validation=True)


@OFFERS
def test_the_demo_answers_a_fitting_request_with_a_tool_call(client, tools):
    r = client.chat.completions.create(messages=ASK, tools=tools, **GREEDY)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not msg.content
    assert [c.function.name for c in msg.tool_calls] == [tools[0]["function"]["name"]]
    assert json.loads(msg.tool_calls[0].function.arguments) == {"word": "lantern"}
    assert "lantern" in msg.model_extra["reasoning_content"].lower()   # it thought about the request, and closed the thought
    assert r.model_extra["mtp"]["proposed"] > 0
    plain = client.chat.completions.create(messages=ASK, **GREEDY).choices[0]   # no tool offered: no call
    assert plain.finish_reason == "stop" and not plain.message.tool_calls and plain.message.content


@OFFERS
def test_the_demo_answers_after_the_tool_result(client, tools):
    call = {"id": "call_1", "type": "function",
            "function": {"name": tools[0]["function"]["name"], "arguments": '{"word": "lantern"}'}}
    result = json.dumps({"word": "lantern", "part_of_speech": "noun",
                         "definition": "light in a transparent protective case"})
    follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": result}]
    r = client.chat.completions.create(messages=follow, tools=tools, **GREEDY)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop" and not msg.tool_calls
    assert msg.model_extra["reasoning_content"] and "think>" not in msg.content   # the thought closed before the answer
    assert "lantern" in msg.content.lower()
    # the answer copies the tool's result (v2's never did); how often the copy is whole, and how often
    # it slips a word, is eval_v3.py's measure
    assert "light in a transparent" in msg.content
