"""The request shapes the real agent CLIs sent (Claude Code 2.1.197 on /v1/messages, Codex CLI
0.171.0 on /v1/responses, recorded against the demo model: docs/agent-clis.md), replayed with
the official `anthropic` and `openai` packages on a launched server whose context is capped
small, as the demo's 4k context is small for those CLIs' prompts."""
from __future__ import annotations

import json
import re

import pytest

from tests._webapp_helpers import make_host, served

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

MODEL = "model"
CONTEXT = 640
BILLING = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.6c2; cc_entrypoint=sdk-cli;"}
REMINDER = ("<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
            "# currentDate\nToday's date is 2026-12-01.\n</system-reminder>\n\n")
# Claude Code's betas (the anthropic-beta header; the SDK adds ?beta=true).
BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27",
         "mid-conversation-system-2026-04-07", "effort-2025-11-24"]
READ = {"name": "Read", "description": "Reads a file from the local filesystem.",
        "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                         "properties": {"file_path": {"type": "string"}}, "required": ["file_path"],
                         "additionalProperties": False}}
# The one turn Claude Code sends: every field below is in its body (values shortened).
CLAUDE_CODE = {
    "system": [BILLING, {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": REMINDER},
                                              {"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}]}],
    "tools": [], "max_tokens": 32000,
    "metadata": {"user_id": json.dumps({"device_id": "ff00", "account_uuid": "", "session_id": "94733df9"})},
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}
WORDS = " ".join(f"w{i}" for i in range(500))      # over the context in tokens, within its character budget
CLAUDE_TOO_LONG = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)")   # Claude Code's own pattern


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    return make_host(tiny_checkpoint(template="qwen3_5"), max_context=CONTEXT)


@pytest.fixture(scope="module")
def url(host):
    with served(host, keepalive=0.2) as (url, _):
        yield url


@pytest.fixture(scope="module")
def claude(url):
    return anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, _strict_response_validation=True)


@pytest.fixture(scope="module")
def codex(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, _strict_response_validation=True)


# --- Claude Code -------------------------------------------------------------------------------
def test_claude_codes_turn_streams_to_the_end(claude):
    """Its body as sent (betas, billing block, cache_control, adaptive thinking, effort,
    context_management, max_tokens 32000 over the context): the stream ends with message_stop,
    and the reply stops where the context ends, as Anthropic's API says it."""
    with claude.beta.messages.stream(model=MODEL, betas=BETAS, extra_body={"temperature": 0}, **CLAUDE_CODE) as s:
        types = [e.type for e in s]
        final = s.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    room = CONTEXT - final.usage.input_tokens
    assert final.usage.output_tokens == room and final.stop_reason == "model_context_window_exceeded"


def test_a_max_tokens_within_the_context_still_ends_as_max_tokens(claude):
    body = {**CLAUDE_CODE, "max_tokens": 3}
    m = claude.beta.messages.create(model=MODEL, betas=BETAS, extra_body={"temperature": 0}, **body)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_the_billing_block_is_not_part_of_the_prompt(claude):
    """Its suffix changes with each conversation's first message: rendered, it would keep the
    prefix cache from sharing Claude Code's system prompt and tools across sessions."""
    msgs = CLAUDE_CODE["messages"]
    count = lambda system: claude.messages.count_tokens(model=MODEL, messages=msgs, system=system).input_tokens
    assert count(CLAUDE_CODE["system"]) == count(CLAUDE_CODE["system"][1:])
    assert count(CLAUDE_CODE["system"][1:]) > count([{"type": "text", "text": "x"}])


def test_a_mid_conversation_system_message_is_rendered(claude):
    """Claude Code's mid-conversation-system beta: a message with role "system" among the turns."""
    turns = [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi"},
             {"role": "system", "content": "Agent types: none."}, {"role": "user", "content": "again"}]
    without = [m for m in turns if m["role"] != "system"]
    count = lambda msgs: claude.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    assert count(turns) > count(without)
    m = claude.messages.create(model=MODEL, max_tokens=2, messages=turns, thinking={"type": "disabled"})
    assert m.usage.output_tokens <= 2
    with pytest.raises(anthropic.BadRequestError, match="user.*assistant.*system"):
        claude.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "tool", "content": "x"}])


def test_a_prompt_over_the_context_is_a_400_claude_code_can_read(claude):
    """Not a 413 (Claude Code reads that as a body over 32 MB): "prompt is too long: N tokens >
    M maximum", the numbers it compacts by."""
    long = {"role": "user", "content": WORDS}                   # fits the character budget, not the context
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=32000, messages=[long], stream=True)
    n, most = map(int, CLAUDE_TOO_LONG.search(str(e.value)).groups())
    assert n > most == CONTEXT - 1 and e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):      # over the character budget
        claude.messages.create(model=MODEL, max_tokens=32000, messages=[{"role": "user", "content": "x" * 8000}],
                               stream=True)
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        claude.messages.count_tokens(model=MODEL, messages=[long])


# --- Codex CLI ---------------------------------------------------------------------------------
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for sub-agents.",
             "tools": [{"type": "function", "name": "close_agent", "description": "Close an agent.", "strict": False,
                        "parameters": {"type": "object", "properties": {"target": {"enum": ["a1", "b2"]}},
                                       "required": ["target"], "additionalProperties": False}}]}
EXEC = {"type": "function", "name": "exec_command", "description": "Runs a command.", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
                       "additionalProperties": False}}
WEB = {"type": "web_search", "external_web_access": False}
CODEX_INPUT = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]}]
CODEX = {"input": CODEX_INPUT, "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
         "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "01a231cd",
         "extra_body": {"client_metadata": {"session_id": "01a231cd", "x-codex-window-id": "01a231cd:0"}},
         "extra_headers": {"originator": "codex_exec", "session-id": "01a231cd"}}


def test_codexs_turn_streams_to_response_completed(codex):
    """Its body as sent: client_metadata, prompt_cache_key, include, store false, function tools
    with strict, a namespace tool and the hosted web_search."""
    with codex.responses.stream(model=MODEL, tools=[EXEC, NAMESPACE, WEB], max_output_tokens=4, temperature=0,
                                **CODEX) as s:
        types = [e.type for e in s]
        final = s.get_final_response()
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert [t.name for t in final.tools] == ["exec_command", "multi_agent_v1.close_agent"]   # web_search: not offered


def test_a_namespaced_call_comes_back_with_its_namespace_and_goes_round(codex):
    r = codex.responses.create(model=MODEL, tools=[NAMESPACE, WEB], tool_choice="required", max_output_tokens=200,
                               temperature=0, input=CODEX_INPUT, store=False)
    call = next(o for o in r.output if o.type == "function_call")
    assert (call.namespace, call.name) == ("multi_agent_v1", "close_agent") and "target" in json.loads(call.arguments)
    back = CODEX_INPUT + [call.model_dump(exclude_none=True),
                          {"type": "function_call_output", "call_id": call.call_id, "output": "closed"}]
    again = codex.responses.create(model=MODEL, tools=[NAMESPACE], max_output_tokens=2, temperature=0, input=back,
                                   store=False)
    assert again.status in ("completed", "incomplete")
    assert again.usage.input_tokens_details.cached_tokens > 0          # the call rendered as it was said


def test_hosted_tools_cannot_be_forced(codex):
    with pytest.raises(openai.BadRequestError, match="hosted tool"):
        codex.responses.create(model=MODEL, tools=[WEB], tool_choice={"type": "web_search"}, input="hi")


def test_an_input_over_the_context_is_context_length_exceeded(codex):
    """Codex stops on this code and says so; a 413 it retried five times and then showed raw."""
    for text in (WORDS, "x" * 8000):                     # over the context; over the character budget
        with pytest.raises(openai.BadRequestError) as e:
            codex.responses.create(model=MODEL, input=text, max_output_tokens=8)
        assert e.value.code == "context_length_exceeded"
