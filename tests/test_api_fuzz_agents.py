"""A fuzz of malformed requests on each new route: every one gets a 4xx in that route's own
error shape (Anthropic's on /v1/messages and /v1/messages/count_tokens, OpenAI's on
/v1/responses), never a 5xx, and the server then answers normally."""
from __future__ import annotations

import pytest

from tests._webapp_helpers import make_host, served
from webapp.api.anthropic import TYPES

httpx = pytest.importorskip("httpx")

MODEL = "model"
USER = [{"role": "user", "content": "Hi"}]
RAW = [b"", b"{", b"[]", b"null", b"42", b'"x"', b"\xff\xfe\xfd", b'{"messages": NaN}', b'{"a":' * 5000,
       b"[" * 50000, b'{"max_tokens": 1e999}', b"x" * (5 * 1024 * 1024)]
WRONG_TYPES = [5, 1.5, True, [], {}, [1], {"a": 1}]           # for fields that take a string or an object
NUMBERS = {"temperature": ["hot", -1, 5.5, 1e308, 10**40, True, [], {}, "0.5"], "top_p": [0, -0.5, 1.5, "1", [], True],
           "top_k": [-1, 1.5, "5", [], True, {}], "min_p": [1, -0.1, 2, "0", {}], "seed": [-2, 1.5, "7", 2**64, [], True],
           "mode": ["fast", 1, [], "MTP "], "depth": [0, 99, -1, "deep", 1.5, [], True]}
UNKNOWN = ["frobnicate", "n", "logprobs", "top_logprobs", "response_format", "presence_penalty", "logit_bias",
           "functions", "prompt", "best_of", "suffix", "echo"]


def messages_cases(count: bool) -> list:
    base = {"model": MODEL, "messages": USER} if count else {"model": MODEL, "messages": USER, "max_tokens": 8}
    block = lambda b: [{"role": "user", "content": [b]}]                             # noqa: E731
    said = lambda b: USER + [{"role": "assistant", "content": [b]}]                  # noqa: E731
    bad = {
        "model": [None, 5, 1.5, [], {}, True, "claude-opus-4-5", "../../etc/passwd", "x" * 10000, "", "demo2"],
        "messages": [None, [], "hi", 5, {}, [{}], [1, 2], [{"role": "system", "content": 5}], [{"role": "user"}],
                     [{"role": "tool", "content": "x"}], [{"role": "user", "content": 5}],
                     [{"role": "user", "content": {"type": "text"}}], [{"role": "user", "content": [5]}],
                     [{"role": "user", "content": "x" * 3_000_000}],
                     block({"type": "image", "source": {}}), block({"type": "document", "source": {}}),
                     block({"type": "text", "text": 5}), block({"type": "text"}), block({"text": "x"}),
                     block({"type": "tool_result", "tool_use_id": "x", "content": [5]}),
                     block({"type": "tool_result", "tool_use_id": "x", "content": [{"type": "image"}]}),
                     said({"type": "tool_use", "name": 5, "input": {}}), said({"type": "tool_use", "name": "f", "input": "x"}),
                     said({"type": "tool_use", "input": {}}), said({"type": "document"}), said({"type": "image"}),
                     said({"type": "text", "text": 5}), said({"type": "thinking", "thinking": 5})],
        "system": [v for v in WRONG_TYPES if v != []] + [[{"type": "image"}], [{"type": "text", "text": 5}], [{"text": "x"}]],
        "tools": ["x", 5, {}, [1], [{"type": "web_search_20250305", "name": "web_search"}], [{"type": "bash_20250124"}],
                  [{"name": ""}], [{"name": 5}], [{"name": "f", "input_schema": "x"}], [{"name": "f", "description": 5}],
                  [{"name": "f"}] * 200],
        "tool_choice": ["auto", "any", 5, [], {"type": "required"}, {"type": "tool"}, {"type": "tool", "name": "nope"},
                        {"type": "any"}, {}],
        "thinking": ["on", 5, True, [], {}, {"type": "maybe"}],
        "output_config": ["x", 5, [], {"format": {"type": "xml"}}, {"format": "json"}, {"format": {"type": "json_schema", "schema": 5}},
                          {"format": {"type": "json_schema", "schema": {"type": "objekt"}}}],
    }
    # count_tokens checks what a message would take (max_tokens is optional there)
    bad.update({"max_tokens": ([] if count else [None]) + [0, -5, 1.5, "10", 10**40, [], True, 32769],
                "stop_sequences": [5, [1], [""], ["a"] * 50, ["x" * 600], {"a": 1}, [None]],
                "stream": ["yes", 1, [], {}, "true"], **NUMBERS})
    odd = [v for v in WRONG_TYPES if v != []]
    bad["messages"] += [[{"role": r, "content": v}] for r in ("user", "assistant") for v in odd]
    bad["messages"] += [block({"type": "text", "text": v}) for v in odd + [None]]
    bad["messages"] += [block({"type": "tool_result", "tool_use_id": "x", "content": v}) for v in (5, True, {"a": 1}, [None])]
    bad["messages"] += [said({"type": "tool_use", "name": v, "input": {}}) for v in odd + [None]]
    bad["messages"] += [said({"type": "tool_use", "name": "f", "input": v}) for v in ("x", 5, [], True)]
    bad["messages"] += [said({"type": "thinking", "thinking": v}) for v in odd]
    bad["messages"] += [block({"type": t}) for t in ("search_result", "server_tool_use", "web_search_tool_result",
                                                      "container_upload", "mcp_tool_use", "x", "")]
    bad["tools"] += [[{"name": v}] for v in odd] + [[{"name": "f", "input_schema": v}] for v in ("x", 5, [], True)]
    bad["tools"] += [[{"name": "f", "description": v}] for v in (5, [], {}, True)]
    bad["tool_choice"] += [{"type": "tool", "name": v} for v in odd]
    bad["thinking"] += [{"type": v} for v in odd]
    bad["system"] += [[{"type": "text", "text": v}] for v in odd] + [[{"type": v, "text": "x"}] for v in odd]
    cases = [{**base, k: v} for k, values in bad.items() for v in values]
    cases += [{**base, k: 2} for k in UNKNOWN]
    cases += [{k: v for k, v in base.items() if k != drop} for drop in base]              # each required field missing
    return cases


def responses_cases() -> list:
    base = {"model": MODEL, "input": "Hi", "max_output_tokens": 8}
    item = lambda i: [i]                                                             # noqa: E731
    bad = {
        "model": [5, [], {}, True, "gpt-4o", "x" * 10000],
        "input": [None, 5, 1.5, True, [], {}, [5], [{}], [{"type": "image"}], [{"role": "robot", "content": "x"}],
                  [{"role": "user"}], [{"role": "user", "content": 5}], [{"role": "user", "content": [5]}],
                  [{"role": "user", "content": [{"type": "input_image"}]}], [{"role": "user", "content": [{"type": "input_file"}]}],
                  [{"role": "user", "content": [{"type": "input_text", "text": 5}]}],
                  item({"type": "function_call", "name": 5}), item({"type": "function_call", "name": "f", "arguments": {}}),
                  item({"type": "function_call_output", "call_id": "x", "output": 5}),
                  item({"type": "function_call_output", "call_id": "x", "output": [{"type": "input_image"}]}),
                  item({"type": "item_reference", "id": "x"}), item({"type": "web_search_call"}), item({"type": 5}),
                  "x" * 3_000_000],
        "instructions": WRONG_TYPES,
        "tools": ["x", 5, {}, [1], [{"type": "computer"}], [{"type": "namespace", "name": "n", "tools": [{"type": "function"}]}],
                  [{"type": "namespace", "name": "n", "tools": [5]}], [{"type": "function"}],
                  [{"type": "function", "name": ""}], [{"type": "function", "name": 5}],
                  [{"type": "function", "name": "f", "parameters": "x"}], [{"type": "function", "name": "f", "description": 5}]],
        "tool_choice": ["required", "sometimes", 5, [], {"type": "function", "name": "f"}, {"type": "function"},
                        {"type": "web_search"}],
        "max_output_tokens": [0, -1, "x", 1.5, 10**40, True, [], 32769],
        "stream": ["yes", 1, [], "true"], "store": ["yes", 1, []],
        "previous_response_id": [5, [], {}, "resp_unknown", "x" * 1000],
        "text": ["x", 5, [], {"format": "json"}, {"format": {"type": "xml"}}, {"format": {"type": "json_schema", "schema": 5}},
                 {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objekt"}}}, {"format": 5}],
        "reasoning": ["high", 5, [], {"effort": 5}, {"effort": []}],
        **NUMBERS,
    }
    odd = [v for v in WRONG_TYPES if v != []]
    bad["input"] += [[{"role": "user", "content": v}] for v in odd]
    bad["input"] += [[{"role": "user", "content": [{"type": "input_text", "text": v}]}] for v in odd]
    bad["input"] += [item({"type": "function_call", "name": v, "arguments": "{}"}) for v in odd + [None]]
    bad["input"] += [item({"type": "function_call", "name": "f", "arguments": v}) for v in (5, {}, [], True)]
    bad["input"] += [item({"type": "function_call_output", "call_id": "x", "output": v}) for v in (5, True, {}, [5])]
    bad["tools"] += [[{"type": "function", "name": v}] for v in odd]
    bad["tools"] += [[{"type": "function", "name": "f", "parameters": v}] for v in ("x", 5, [], True)]
    bad["tools"] += [[{"type": "function", "name": "f", "description": v}] for v in (5, [], {}, True)]
    bad["tool_choice"] += [{"type": "function", "name": v} for v in odd]
    bad["text"] += [{"format": {"type": v}} for v in odd]
    cases = [{**base, k: v} for k, values in bad.items() for v in values]
    cases += [{**base, k: 2} for k in UNKNOWN + ["messages", "max_tokens", "stop"]]
    cases += [{"model": MODEL}, {"model": MODEL, "input": None}]
    return cases


@pytest.fixture(scope="module")
def url(tiny_checkpoint):
    with served(make_host(tiny_checkpoint(template="qwen3_5"))) as (url, _):
        yield url


def _anthropic_shape(r) -> None:
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, r.text[:300]
    assert body["error"]["message"] and body["error"]["type"] in set(TYPES.values()), r.text[:300]


def _openai_shape(r) -> None:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text[:300]


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/messages/count_tokens", "/v1/responses"])
def test_fuzz_every_malformed_request_gets_a_4xx_in_the_routes_shape(url, route):
    cases = responses_cases() if route == "/v1/responses" else messages_cases(route.endswith("count_tokens"))
    cases = [("json", c) for c in cases] + [("raw", r) for r in RAW]
    assert len(cases) >= 200, len(cases)
    shape = _openai_shape if route == "/v1/responses" else _anthropic_shape
    with httpx.Client(base_url=url, timeout=60) as h:
        for kind, payload in cases:
            if kind == "json":
                r = h.post(route, json=payload)
            else:
                r = h.post(route, content=payload, headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (str(payload)[:200], r.status_code, r.text[:300])
            shape(r)
        for method in ("GET", "PUT", "DELETE"):
            r = h.request(method, route)
            assert r.status_code == 405
            shape(r)
        ok = h.post(route, json={"model": MODEL, "messages": USER, "max_tokens": 4} if "messages" in route
                    else {"model": MODEL, "input": "Hi", "max_output_tokens": 4})
        assert ok.status_code == 200, ok.text[:300]
