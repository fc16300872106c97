"""The API's pure parts, without a server: the tool-call parser, reply shaping (stop
sequences, reasoning, tool calls), request validation, the sign-in throttle."""
from __future__ import annotations

import json
import random

import pytest

from core.settings import get_settings
from webapp.api.errors import ApiError
from webapp.api.openai_request import parse_chat, parse_completion
from webapp.api.request import loads
from webapp.api.text import ReplyShaper, StopScanner, join
from webapp.server import LoginThrottle, api_policy
from webapp.api.toolcalls import ToolCallStream, parse_call, split_tool_calls

SETTINGS = get_settings()


# --- tool calls -------------------------------------------------------------------------------
def call(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def test_a_well_formed_call_is_parsed():
    text, calls = split_tool_calls("Let me look.\n" + call("get_weather", {"city": "Oslo"}))
    assert text == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert calls[0].id.startswith("call_")


def test_several_calls_keep_their_order_and_distinct_ids():
    _, calls = split_tool_calls(call("a", {"x": 1}) + "\n" + call("b", {}) + call("c", {"y": [1, 2]}))
    assert [c.name for c in calls] == ["a", "b", "c"]
    assert len({c.id for c in calls}) == 3


@pytest.mark.parametrize("body", [
    "{not json}", "[1, 2]", '"just a string"', '{"arguments": {}}', '{"name": "", "arguments": {}}',
    '{"name": 42}', '{"name": "f", "arguments": [1]}', '{"name": "f", "arguments": "not json"}',
    '{"name": "f", "arguments": "[1]"}', "", "   ", "{" * 5000 + "}" * 5000, "\ud800",
])
def test_a_malformed_call_stays_text(body):
    raw = f"before <tool_call>{body}</tool_call> after"
    text, calls = split_tool_calls(raw)
    assert calls == [] and text == raw


def test_arguments_given_as_a_json_string_or_missing_are_accepted():
    c = parse_call('{"name": "f", "arguments": "{\\"a\\": 1}"}')
    assert json.loads(c.arguments) == {"a": 1}
    assert json.loads(parse_call('{"name": "f"}').arguments) == {}


def test_an_unclosed_call_stays_text():
    raw = 'ok <tool_call>{"name": "f", "arguments": {}}'
    assert split_tool_calls(raw) == (raw, [])


def test_a_good_call_after_a_bad_one_is_still_found():
    text, calls = split_tool_calls("<tool_call>oops</tool_call>" + call("g", {"k": "v"}))
    assert [c.name for c in calls] == ["g"] and text == "<tool_call>oops</tool_call>"


def test_the_parser_never_raises_on_random_input():
    rng = random.Random(0)
    alphabet = ['<tool_call>', '</tool_call>', '{', '}', '"name"', ':', '"f"', ',', '"arguments"', '[', ']',
                ' ', 'x', '\n', '\\', '"', '<', '>', '/']
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        text, calls = split_tool_calls(s)
        assert isinstance(text, str) and all(c.name for c in calls)


@pytest.mark.parametrize("cut", [1, 3, 7, 11])
def test_streamed_calls_match_the_whole_text_however_it_is_cut(cut):
    raw = "Sure. " + call("lookup", {"q": "harbor"}) + "\n"
    s = ToolCallStream()
    shown = "".join(s.feed(raw[i:i + cut]) for i in range(0, len(raw), cut))
    rest, calls = s.finish()
    assert shown == "Sure. " and rest == "" and [c.name for c in calls] == ["lookup"]


def test_a_partial_tag_is_held_back_then_released_when_it_is_not_a_tag():
    s = ToolCallStream()
    assert s.feed("a <tool_") == "a "
    assert s.feed("x>") == "<tool_x>"


# --- reply shaping --------------------------------------------------------------------------------
def shaped(pieces, **kw):
    shaper = ReplyShaper(**kw)
    deltas = []
    for p in pieces:
        deltas += shaper.feed(p)
    more, calls = shaper.finish()
    return join(deltas + more), calls, shaper.stopped


def test_stop_sequence_cuts_the_reply_even_across_pieces():
    (content, _), _, stopped = shaped(["Hello wor", "ld. Bye"], stops=["world"])
    assert content == "Hello " and stopped


def test_no_stop_sequence_shows_everything():
    (content, _), _, stopped = shaped(["Hello wo", "r"], stops=["world"])
    assert content == "Hello wor" and not stopped


def test_stop_scanner_picks_the_earliest_of_several():
    s = StopScanner(["b", "a"])
    assert s.feed("xxabc") == "xx" and s.hit


def test_reasoning_is_split_from_the_answer():
    (content, reasoning), _, _ = shaped(["<th", "ink>\nLet me think.\n</thi", "nk>\n\nThe answer."], reasoning=True)
    assert reasoning == "Let me think." and content == "The answer."


def test_a_prompt_that_opened_the_think_block_starts_in_reasoning():
    (content, reasoning), _, _ = shaped(["Hmm.\n</think>\n\nYes."], reasoning=True, in_reasoning=True)
    assert (reasoning, content) == ("Hmm.", "Yes.")


def test_stop_sequences_apply_to_the_answer_not_the_reasoning():
    (content, reasoning), _, stopped = shaped(["<think>\nI will stop", " here\n</think>\n\nYes, stop now."],
                                              stops=["stop"], reasoning=True)
    assert (reasoning, content, stopped) == ("I will stop here", "Yes, ", True)


def test_tool_calls_after_reasoning():
    raw = "<think>\nI need the weather.\n</think>\n\n" + call("weather", {"city": "Oslo"})
    (content, reasoning), calls, _ = shaped([raw[i:i + 5] for i in range(0, len(raw), 5)], reasoning=True, tools=True)
    assert reasoning == "I need the weather." and content == "" and calls[0].name == "weather"


# --- request validation ---------------------------------------------------------------------------
def chat(**body):
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return parse_chat(body, SETTINGS, 4, 64)


def test_a_plain_request_gets_the_server_defaults():
    req = chat()
    assert req.params.temperature == SETTINGS.temperature and req.params.max_tokens == 64 and req.mode == "mtp"
    assert req.params.depth == SETTINGS.depth and not req.stream


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=10, max_completion_tokens=20).params.max_tokens == 20


def test_extensions_are_read():
    req = chat(mode="ar", depth="auto", top_k=5, min_p=0.1, stop="x", seed=3)
    assert (req.mode, req.params.depth, req.params.top_k, req.params.min_p, req.stops, req.params.seed) == \
        ("ar", "auto", 5, 0.1, ("x",), 3)


@pytest.mark.parametrize("body, param", [
    ({"n": 2}, "n"), ({"temperature": "hot"}, "temperature"), ({"temperature": 9}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 1.5}, "max_tokens"),
    ({"seed": -2}, "seed"), ({"seed": 2**64}, "seed"), ({"depth": 99}, "depth"), ({"mode": "fast"}, "mode"), ({"frobnicate": 1}, "frobnicate"),
    ({"top_logprobs": 5}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}}, "response_format.json_schema.schema"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"stream_options": {"include_usage": True}}, "stream_options"), ({"stop": ["a"] * 20}, "stop"),
    ({"messages": []}, "messages"), ({"messages": [{"role": "banana", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"model": 5}, "model"),
])
def test_bad_fields_are_refused_naming_the_field(body, param):
    with pytest.raises(ApiError) as err:
        chat(**body)
    assert err.value.status == 400 and err.value.param == param, err.value.message
    assert err.value.message.strip()


def test_neutral_values_of_unsupported_fields_are_accepted():
    chat(n=1, presence_penalty=0, frequency_penalty=0.0, logprobs=False, logit_bias={}, user="ann",
         response_format={"type": "text"}, tool_choice="auto", parallel_tool_calls=True)


@pytest.mark.parametrize("raw", [b"", b"nope", b"[1]", b'{"a": NaN}', b'{"a": Infinity}', b"\xff\xfe",
                                 b"[" * 100000 + b"]" * 100000])
def test_bodies_that_are_not_a_json_object_are_400(raw):
    with pytest.raises(ApiError) as err:
        loads(raw)
    assert err.value.status == 400


def test_lone_surrogates_become_replacement_characters():
    req = chat(messages=[{"role": "user", "content": "a\ud800b"}])
    assert req.messages[0]["content"] == "a\ufffdb"


def test_completion_prompts():
    assert parse_completion({"prompt": ["Once"]}, SETTINGS, 4, 16).prompt == "Once"
    assert parse_completion({"prompt": [[1, 2]]}, SETTINGS, 4, 16).prompt_ids == [1, 2]     # token ids
    for bad in ("", ["a", "b"], [1, "b"], [True], None):
        with pytest.raises(ApiError):
            parse_completion({"prompt": bad}, SETTINGS, 4, 16)


def test_seeds_are_exact_to_2_64_and_minus_one_is_random():
    assert chat(seed=2**64 - 1).params.seed == 2**64 - 1 and chat(seed=2**53 + 1).params.seed == 2**53 + 1
    assert chat(seed=-1).params.seed != chat(seed=-1).params.seed
    with pytest.raises(ApiError, match="18446744073709551616"):       # the value received, quoted
        chat(seed=2**64)


# --- the API's on/off rule and the sign-in throttle ----------------------------------------------
def test_api_policy():
    assert api_policy("127.0.0.1", None, None) == (True, "")
    assert api_policy("0.0.0.0", None, None)[0] is False
    assert api_policy("127.0.0.1", ("a", "b"), None)[0] is False
    assert api_policy("0.0.0.0", ("a", "b"), "key") == (True, "")


def test_failed_sign_ins_lock_out_one_address_for_growing_times():
    now = [0.0]
    t = LoginThrottle(None, free=3, max_lock=60, clock=lambda: now[0])
    for _ in range(2):
        t.record("1.2.3.4", ok=False)
    assert t.wait("1.2.3.4") == 0
    t.record("1.2.3.4", ok=False)
    assert t.wait("1.2.3.4") == 1.0 and t.wait("5.6.7.8") == 0       # others unaffected
    now[0] = 1.0
    t.record("1.2.3.4", ok=False)
    assert t.wait("1.2.3.4") == 2.0
    for _ in range(20):
        t.record("1.2.3.4", ok=False)
    assert t.wait("1.2.3.4") == 60.0                                  # capped
    t.record("1.2.3.4", ok=True)
    assert t.wait("1.2.3.4") == 0                                     # a success clears it
