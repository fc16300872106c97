"""Agents drive the server: 5-call tool loops through chat completions, Anthropic Messages and
OpenAI Responses with the official `openai` and `anthropic` packages, and an openai-agents SDK
run on its default Responses path.

The calls are forced (tool_choice naming the function), so the grammar writes a well-formed
call whatever the tiny checkpoint's weights say (tests/test_api_tools.py has a model trained to
call tools by itself). From the second turn on, each turn prefills exactly what it adds (the
tool's result and the generation prompt): the reply of the turn before was snapshotted as the
client sends it back (api_run.Run.said). These clients pause before each turn until that
snapshot is taken, as a person or a slow tool would; an agent that comes back at once prefills
the reply with its turn instead of waiting for it (the last test)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests._webapp_helpers import make_host, served

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

MODEL = "model"
ASK = "Weather in Oslo, Paris, Rome, Lima and Cairo?"
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
          "additionalProperties": False}
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": PARAMS}}]
TURNS = 5


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    host = make_host(tiny_checkpoint(template="qwen3_5"))
    host.histories.grace = 0.0   # the snapshot as soon as the model is idle: the paced clients wait less
    with served(host) as (url, _):
        yield url, host


class Conversation:
    """The loop as the chat template sees it, whichever protocol carried it: what the server
    must render, and how many tokens each turn adds to the snapshot of the turn before."""

    def __init__(self, host, ask: str, paced: bool = True):
        self.host, self.msgs, self.checked, self.paced = host, [{"role": "user", "content": ask}], 0, paced
        self.marks = ()   # the last turn's prompt marks: where its prefill left snapshots

    def pace(self) -> None:
        """Before a turn: the client pauses until the server has snapshotted the last reply."""
        if self.paced:
            assert self.host.histories.wait(30)

    def call(self, args: dict) -> None:
        self.msgs += [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "x", "function": {"name": "get_weather", "arguments": args}}]}]

    def result(self, text: str) -> None:
        self.msgs.append({"role": "tool", "tool_call_id": "x", "content": text})

    def check(self, prompt_tokens: int, mtp: dict) -> None:
        from core import chat_prompt, history_prompt

        full = chat_prompt(self.host.adapter, self.msgs, tools=WEATHER, enable_thinking=False)
        assert prompt_tokens == len(full.ids)
        if len(self.msgs) > 1 and self.paced:        # the turn adds the tool's result and the generation prompt
            before = history_prompt(self.host.adapter, self.msgs[:-1], tools=WEATHER, enable_thinking=False)
            assert full.ids[:len(before.ids)] == before.ids
            assert mtp["prefilled_tokens"] == len(full.ids) - len(before.ids), (len(self.msgs), mtp)
            assert mtp["cached_tokens"] == len(before.ids)
        elif len(self.msgs) > 1:                     # at once: from the last turn's own snapshot, its reply prefilled
            assert mtp["cached_tokens"] == max(self.marks), (len(self.msgs), mtp, self.marks)
            assert mtp["prefilled_tokens"] == len(full.ids) - max(self.marks)
        self.marks = full.marks
        self.checked += 1


def test_chat_completions_tool_loop_prefills_only_what_each_turn_adds(server):
    url, host = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, _strict_response_validation=True)
    ask = ASK + " (chat)"          # each test its own conversation: no snapshot of another one helps
    conv, messages = Conversation(host, ask), [{"role": "user", "content": ask}]
    force = {"type": "function", "function": {"name": "get_weather"}}
    for k in range(TURNS):
        conv.pace()
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER, tool_choice=force,
                                           temperature=0, max_tokens=64, extra_body={"enable_thinking": False})
        conv.check(r.usage.prompt_tokens, r.model_extra["mtp"])
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        assert set(args) == {"city"} and len(args["city"]) <= 8
        conv.call(args)
        conv.result(f"sunny {k}")
        messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": f"sunny {k}"}]
    conv.pace()
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER, temperature=0, max_tokens=4,
                                       extra_body={"enable_thinking": False})
    conv.check(r.usage.prompt_tokens, r.model_extra["mtp"])
    assert conv.checked == TURNS + 1


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_use_loop_with_tool_result(server, stream):
    url, host = server
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, _strict_response_validation=True)
    tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": PARAMS}]
    ask = ASK + f" (messages, stream={stream})"
    conv, messages = Conversation(host, ask), [{"role": "user", "content": ask}]
    for k in range(TURNS + 1):
        kw = dict(model=MODEL, max_tokens=64, messages=messages, tools=tools, thinking={"type": "disabled"},
                  tool_choice={"type": "tool", "name": "get_weather"} if k < TURNS else {"type": "auto"},
                  extra_body={"temperature": 0})
        conv.pace()
        if stream:
            with client.messages.stream(**kw) as s:
                events = list(s)
                m = s.get_final_message()
            assert events[0].type == "message_start" and events[-1].type == "message_stop"
            mtp = next(e for e in events if e.type == "message_delta").model_extra["mtp"]   # the figures ride on it
        else:
            m = client.messages.create(**kw)
            mtp = m.model_extra["mtp"]
        conv.check(m.usage.input_tokens + m.usage.cache_read_input_tokens, mtp)
        assert m.usage.cache_read_input_tokens == mtp["cached_tokens"]
        if k == TURNS:
            break
        use = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and len(use) == 1 and use[0].name == "get_weather"
        assert use[0].id.startswith("toolu_") and set(use[0].input) == {"city"}
        if stream:
            assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
        conv.call(use[0].input)
        conv.result(f"sunny {k}")
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                                   "content": f"sunny {k}"}]}]
    assert conv.checked == TURNS + 1


@pytest.mark.parametrize("chained", [False, True])
def test_responses_function_call_loop(server, chained):
    """Stateless (the whole conversation each turn, store: false) and chained (previous_response_id)."""
    url, host = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, _strict_response_validation=True)
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": PARAMS,
              "strict": True}]
    ask = ASK + f" (responses, chained={chained})"
    conv, items, prev = Conversation(host, ask), [{"role": "user", "content": ask}], None
    for k in range(TURNS + 1):
        conv.pace()
        r = client.responses.create(model=MODEL, input=items if prev is None else items[-1:], previous_response_id=prev,
                                    tools=tools, temperature=0, max_output_tokens=64, reasoning={"effort": "none"},
                                    tool_choice={"type": "function", "name": "get_weather"} if k < TURNS else "auto",
                                    store=chained)
        conv.check(r.usage.input_tokens, r.model_extra["mtp"])
        assert r.usage.input_tokens_details.cached_tokens == r.model_extra["mtp"]["cached_tokens"]
        if k == TURNS:
            break
        calls = [o for o in r.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
        conv.call(json.loads(calls[0].arguments))
        conv.result(f"sunny {k}")
        items += [calls[0].model_dump(exclude_none=True),
                  {"type": "function_call_output", "call_id": calls[0].call_id, "output": f"sunny {k}"}]
        prev = r.id if chained else None
    assert conv.checked == TURNS + 1
    if not chained:
        with pytest.raises(openai.NotFoundError, match="not known"):      # store: false kept nothing
            client.responses.create(model=MODEL, input="x", previous_response_id=r.id)


def test_an_openai_agents_run_on_its_default_responses_path(server):
    """The SDK's runner: a forced call it executes (the SDK then resets tool_choice), the
    tool's result back through function_call_output, then a structured final output
    (text.format json_schema) that the SDK validates."""
    agents = pytest.importorskip("agents")
    pydantic = pytest.importorskip("pydantic")
    from openai.types.shared import Reasoning

    class Report(pydantic.BaseModel):
        summary: str = pydantic.Field(max_length=20)

    url, _ = server
    agents.set_tracing_disabled(True)
    seen = []

    async def get_weather(ctx, args: str) -> str:
        seen.append(json.loads(args))
        return "sunny"

    tool = agents.FunctionTool(name="get_weather", description="Weather in a city", params_json_schema=PARAMS,
                               on_invoke_tool=get_weather)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)      # the SDK's default API
    agent = agents.Agent(name="weather", instructions="Use the tool.", tools=[tool], model=model, output_type=Report,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=64, tool_choice="get_weather",
                                                             reasoning=Reasoning(effort="none")))
    result = asyncio.run(agents.Runner.run(agent, ASK, max_turns=4))
    assert len(seen) == 1 and set(seen[0]) == {"city"}
    assert isinstance(result.final_output, Report)
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]


def test_an_agent_that_comes_back_at_once_prefills_the_reply_instead_of_waiting(server):
    """The next call comes before the last reply's snapshot was taken (here: its grace is a
    minute): the waiting snapshot is dropped, nobody waits for it, and the turn starts from the
    last turn's own snapshot (its prompt's last mark) and prefills the reply with its new
    message. The calls are the ones a paced client gets (the state is the same either way)."""
    url, host = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, _strict_response_validation=True)
    force = {"type": "function", "function": {"name": "get_weather"}}
    said = {}
    for paced in (True, False):
        assert host.histories.wait(30)   # the snapshots of the test before, at its grace (0)
        host.histories.grace = 0.0 if paced else 60.0
        host.prefix_cache.clear()          # one conversation, asked twice: the second starts afresh
        ask = ASK + " (at once)"
        conv, messages, calls = Conversation(host, ask, paced=paced), [{"role": "user", "content": ask}], []
        for k in range(3):
            conv.pace()
            r = client.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER, tool_choice=force,
                                               temperature=0, max_tokens=64, extra_body={"enable_thinking": False})
            if not paced or k == 0:
                conv.check(r.usage.prompt_tokens, r.model_extra["mtp"])
            call = r.choices[0].message.tool_calls[0]
            calls.append(call.function.arguments)
            conv.call(json.loads(call.function.arguments))
            conv.result(f"sunny {k}")
            messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                         {"role": "tool", "tool_call_id": call.id, "content": f"sunny {k}"}]
        said[paced] = calls
    assert said[True] == said[False]
    with host.histories.lock:   # the first two replies' snapshots were dropped; the last one's waits
        assert [p.stop.is_set() for p in host.histories.pending] in ([True, True, False], [True, False], [False])
    host.histories.grace = 0.0
    host.histories.now()
    assert host.histories.wait(30)


def test_an_agent_that_comes_back_while_the_reply_is_snapshotted_starts_from_the_snapshot(server, monkeypatch):
    """The next call comes while the last reply's snapshot is under way (held here on the model
    thread until the call has come): the snapshot is not stopped, the call waits for it on
    the model thread, and it prefills only what it adds (the tool's result and the generation
    prompt), as a paced client's call does. Stopping it lost the chunks already run (the agent
    session on the H200, docs/bench/2026-12-03/GPU.md section 14)."""
    import threading

    import core.stream

    url, host = server
    assert host.histories.wait(30)
    host.histories.grace = 0.0
    host.prefix_cache.clear()
    started, go, real = threading.Event(), threading.Event(), core.stream.history_steps

    def held(*args, **kwargs):
        started.set()
        assert go.wait(30)
        return (yield from real(*args, **kwargs))

    monkeypatch.setattr(core.stream, "history_steps", held)
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, _strict_response_validation=True)
    force = {"type": "function", "function": {"name": "get_weather"}}
    ask = ASK + " (while it snapshots)"
    conv, messages = Conversation(host, ask, paced=True), [{"role": "user", "content": ask}]
    for k in range(2):
        if k:
            assert started.wait(30)           # the first reply's snapshot is under way, and held
            answer = {}
            ask_next = threading.Thread(target=lambda: answer.setdefault("r", client.chat.completions.create(
                model=MODEL, messages=messages, tools=WEATHER, tool_choice=force, temperature=0, max_tokens=64,
                extra_body={"enable_thinking": False})))
            ask_next.start()
            deadline = time.monotonic() + 30
            while not host.histories.pending[0].running or not _has_asked(host, deadline):
                time.sleep(0.01)
            with host.histories.lock:
                assert [p.stop.is_set() for p in host.histories.pending] == [False]   # not dropped
            go.set()
            ask_next.join(60)
            r = answer["r"]
        else:
            r = client.chat.completions.create(model=MODEL, messages=messages, tools=WEATHER, tool_choice=force,
                                               temperature=0, max_tokens=64, extra_body={"enable_thinking": False})
        _answer(conv, messages, r, k)   # turn 2: only the result and the prompt's end
    assert conv.checked == 2
    go.set()
    assert host.histories.wait(30)


def _has_asked(host, deadline: float) -> bool:
    """Has a request passed drop_within (the pending snapshot was looked at)? The worker has a
    call queued behind the held snapshot then."""
    assert time.monotonic() < deadline, "the second call never reached the model thread"
    return not host.worker._jobs.empty()


def _answer(conv, messages: list, r, k: int) -> None:
    """A forced call's reply checked against the conversation (Conversation.check), then the call
    and its result added to both, as the client sends them next."""
    conv.check(r.usage.prompt_tokens, r.model_extra["mtp"])
    call = r.choices[0].message.tool_calls[0]
    conv.call(json.loads(call.function.arguments))
    conv.result(f"sunny {k}")
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": f"sunny {k}"}]


def test_a_replys_snapshot_goes_before_the_background_work_waiting(server, monkeypatch):
    """The cost model's measures and the disk's writes wait for idle time too. A reply's snapshot
    goes before them: an agent's next call comes ~0.1 s after the reply, and behind them the
    snapshot had not started by then, so that call prefilled the reply again (the agent session
    on the H200 and on the CPU, docs/bench/2026-12-03/GPU.md section 16)."""
    import threading

    import core.stream

    url, host = server
    assert host.histories.wait(30)
    host.histories.grace = 0.0
    order, real = [], core.stream.history_steps

    def recorded(*args, **kwargs):
        order.append("snapshot")
        return (yield from real(*args, **kwargs))

    def background():
        for i in range(3):
            order.append(f"background {i}")
            time.sleep(0.02)
            yield

    monkeypatch.setattr(core.stream, "history_steps", recorded)
    gate = threading.Event()
    host.worker.later(gate.wait, 30)         # the model busy: both wait for its idle time
    host.worker.in_idle_time(background())   # queued first
    host.remember([{"role": "user", "content": ASK}, {"role": "assistant", "content": "Sunny everywhere."}],
                  tools=WEATHER, enable_thinking=False)
    gate.set()
    assert host.histories.wait(30)
    deadline = time.monotonic() + 30
    while len(order) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert order == ["snapshot", "background 0", "background 1", "background 2"]
