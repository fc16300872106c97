#!/usr/bin/env python3
"""An agent's session through `/v1/messages`: does each turn prefill only its new tokens?

    python scripts/bench/agent_session.py --model models/demo --json out/agent_demo.json
    python scripts/bench/agent_session.py --model /tmp/q9b --system-tokens 20000 --json out/agent_9b.json

A coding agent (Claude Code, Codex) sends a long system prompt with its tools, then turn after
turn the whole conversation again: its own tool calls as the model made them, and the tools'
results (a file, a command's output) of a few hundred to a few thousand tokens. Each turn
should cost the prefill of what is new in it, never the conversation again. This drives a real
server (`python -m webapp`, started here) with the official `anthropic` client:

- turn 1: the system prompt (about --system-tokens), Claude-Code-like tools and a task; the
  model must call a tool (`tool_choice: any`), so random weights give a session too;
- turns 2..N: the previous reply sent back as its content blocks, plus a `tool_result` of a
  size from --result-tokens (real source text from this repository); the last turn may answer.

Per turn: prompt tokens, tokens read from the prefix cache, tokens prefilled, the new tokens
(this prompt less the previous prompt and reply), time to first token (the first content
delta, client side) and the ratio prefilled / new. It runs the session twice:
- `warm`: one server, the prefix cache in memory (and written to disk);
- `restart`: a fresh cache folder, the server restarted (SIGTERM, which writes the cache out)
  before every turn, so each turn finds the conversation only on disk.
Greedy (T=0), so both runs see the same conversation. The time to prefill only the new tokens
is estimated from turn 1's prefill rate (a lower bound at long contexts: attention over a longer
prefix costs more per token); the token ratio is the exact measure.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TOOLS = [
    {"name": "Read", "description": "Read a file from the local filesystem. Returns its lines, numbered.",
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
    {"name": "Bash", "description": "Run a shell command in the project's folder and return its output.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "Grep", "description": "Search file contents with a regular expression.",
     "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                      "required": ["pattern"]}},
    {"name": "Edit", "description": "Replace one exact string in a file with another.",
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}, "old_string": {"type": "string"},
                                                       "new_string": {"type": "string"}},
                      "required": ["file_path", "old_string", "new_string"]}},
]
RULES = ("You are an interactive coding agent working in a Python repository. Use the tools to read "
         "files, search and run commands before you change anything. Keep answers short. Never guess "
         "a file's contents: read it. Run the tests after each change and report what they say. ")
TASK = "The test tests/test_api.py::test_a_client_that_disconnects fails on CI. Find out why and fix it."


def source_text(chars: int, start: int) -> str:
    """`chars` characters of this repository's Python source, from a fixed place (a tool's output)."""
    text = "".join(p.read_text() for p in sorted((ROOT / "core").glob("*.py")))
    start %= max(1, len(text) - chars)
    return text[start:start + chars]


def system_prompt(chars: int) -> str:
    out, n = [RULES], len(RULES)
    while n < chars:
        piece = source_text(2000, n)
        out.append("\n<reference>\n" + piece + "\n</reference>\n")
        n += len(piece) + 26
    return "".join(out)


def answered(resp, key: str):
    """`key` of an API call's JSON answer; an error (or an answer without it) ends the run with the
    call, its HTTP status and its body (a context the prompt does not fit: 400 "prompt is too long")."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.is_success and isinstance(body, dict) and key in body:
        return body[key]
    raise SystemExit(f"{resp.request.method} {resp.request.url.path} answered HTTP {resp.status_code} "
                     f"without {key!r}: {resp.text[:4000]}")


def count_tokens(url: str, model_id: str, system: str) -> int:
    """The prompt's tokens for `system` and one short user message (`/v1/messages/count_tokens`)."""
    import httpx

    body = {"model": model_id, "system": system, "messages": [{"role": "user", "content": "hi"}]}
    return answered(httpx.post(url + "/v1/messages/count_tokens", json=body, timeout=600), "input_tokens")


def chars_per_token(url: str, model_id: str) -> float:
    """Of this repository's source under the served model's tokenizer (sizes the prompt's parts):
    8,000 characters counted in two halves, each within a 4,096-token context (whole, they were
    4,520 tokens under the random checkpoints' byte-level BPE)."""
    sample, empty = source_text(8000, 0), count_tokens(url, model_id, "")
    return len(sample) / sum(count_tokens(url, model_id, sample[i:i + 4000]) - empty for i in (0, 4000))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m webapp` on a free port with its own prefix-cache folder."""

    def __init__(self, model: str, cache_dir: str, log, warmup: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONUNBUFFERED="1", MTP_CHAT_CACHE_DIR=cache_dir)
        self.log = open(log, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "webapp", "--model", model, "--port", str(self.port)]
                                     + ([] if warmup else ["--no-warmup"]),
                                     cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self.model_id = self._ready(log)
        except BaseException:
            self.kill()
            raise

    def _ready(self, log) -> str:
        import httpx

        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with {self.proc.returncode}: see {log}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return answered(httpx.get(self.url + "/v1/models"), "data")[0]["id"]
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"the server did not start within 600 s: see {log}")

    def chars_per_token(self) -> float:
        return chars_per_token(self.url, self.model_id)

    def stop(self) -> None:
        time.sleep(1.0)   # the reply's conversation is snapshotted in idle time, as between an agent's turns
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        self.log.close()

    def kill(self) -> None:
        """After a failure: the server must not outlive the run (it would hold the CPU or GPU)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(60)
        self.log.close()


def one_turn(client, model_id: str, system: str, messages: list, choice: dict, max_tokens: int) -> dict:
    import anthropic

    t0, mtp = time.perf_counter(), {}
    try:
        with client.messages.stream(model=model_id, system=system, messages=messages, tools=TOOLS,
                                    tool_choice=choice, max_tokens=max_tokens,
                                    extra_body={"temperature": 0}) as stream:
            for event in stream:
                if event.type == "message_delta":
                    mtp = (event.model_extra or {}).get("mtp") or {}
            reply = stream.get_final_message()
    except anthropic.APIStatusError as exc:   # a refusal, or an error event in the stream
        body = json.dumps(exc.body) if exc.body is not None else exc.response.text
        raise SystemExit(f"POST /v1/messages answered HTTP {exc.status_code}: {body[:4000]}") from None
    use = reply.usage
    cached = use.cache_read_input_tokens or 0
    # A tool call reaches the client whole, after its last token: the server's own time to first
    # token (our `mtp` extension) is the measure, the client's wall time is kept beside it.
    return {"prompt_tokens": use.input_tokens + cached, "cached_tokens": cached, "prefilled_tokens": use.input_tokens,
            "output_tokens": use.output_tokens, "ttft_s": mtp.get("ttft"), "prefill_s": mtp.get("prefill_seconds"),
            "wall_s": time.perf_counter() - t0, "stop_reason": reply.stop_reason,
            "content": [block.model_dump(exclude_none=True) for block in reply.content]}


def next_messages(messages: list, reply: dict, result_chars: int, turn: int) -> list:
    """The conversation as the agent sends it next: its reply's blocks, then the tools' results."""
    blocks = [b for b in reply["content"] if b["type"] in ("text", "tool_use")]
    calls = [b for b in blocks if b["type"] == "tool_use"]
    out = messages + [{"role": "assistant", "content": blocks or [{"type": "text", "text": "(no reply)"}]}]
    if calls:
        results = [{"type": "tool_result", "tool_use_id": c["id"], "content": source_text(result_chars, 7919 * turn)}
                   for c in calls]
        return out + [{"role": "user", "content": results}]
    return out + [{"role": "user", "content": source_text(result_chars, 7919 * turn)}]


def session(model: str, args, restart: bool, cache_dir: str, log: str) -> list:
    import anthropic

    messages, rows, server, system = [{"role": "user", "content": TASK}], [], None, None
    try:
        for turn in range(1, args.turns + 1):
            if server is None or restart:
                if server is not None:
                    server.stop()
                server = Server(model, cache_dir, log, warmup=not args.no_warmup)
            if system is None:
                cpt = server.chars_per_token()
                system = system_prompt(int(args.system_tokens * cpt))
            client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=3600)
            choice = {"type": "any"} if turn < args.turns else {"type": "auto"}
            row = one_turn(client, server.model_id, system, messages, choice, args.max_tokens)
            if rows:
                before = rows[-1]
                row["new_tokens"] = row["prompt_tokens"] - before["prompt_tokens"] - before["output_tokens"]
            else:
                row["new_tokens"] = row["prompt_tokens"]
            row["prefilled_over_new"] = row["prefilled_tokens"] / max(1, row["new_tokens"])
            row["turn"] = turn
            rows.append(row)
            print(f"{'restart' if restart else 'warm'} turn {turn}: prompt {row['prompt_tokens']}, cached "
                  f"{row['cached_tokens']}, prefilled {row['prefilled_tokens']}, new {row['new_tokens']} "
                  f"(x{row['prefilled_over_new']:.2f}), ttft {row['ttft_s']:.3f} s (prefill {row['prefill_s']:.3f} s), "
                  f"{row['stop_reason']}", flush=True)
            sizes = args.result_tokens
            messages = next_messages(messages, row, int(cpt * sizes[(turn - 1) % len(sizes)]), turn)
    except BaseException:
        if server is not None:
            server.kill()
        raise
    server.stop()
    rate = rows[0]["prefilled_tokens"] / rows[0]["prefill_s"]
    for row in rows:
        row["ttft_over_new_prefill"] = row["ttft_s"] / (row["new_tokens"] / rate)
        row.pop("content")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "demo"))
    # The defaults fit the demo's 4,096-token window (its tools' JSON alone is ~1,100 tokens);
    # an agent's are --system-tokens 20000 --result-tokens 200 2000 800 1500 400.
    ap.add_argument("--system-tokens", type=int, default=300, help="the system prompt's size, about")
    ap.add_argument("--result-tokens", type=int, nargs="+", default=[150, 300, 200, 250, 150],
                    help="the tools' results' sizes, turn after turn")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--no-warmup", action="store_true",
                    help="start the server without its warm-up (minutes on a CPU); the first turn after each "
                         "start then also compiles")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="agent-session-"))
    report = {"model": a.model, "system_tokens_asked": a.system_tokens, "result_tokens": a.result_tokens,
              "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip()}
    report["warm"] = session(a.model, a, False, str(work / "cache-warm"), str(work / "server.log"))
    report["restart"] = session(a.model, a, True, str(work / "cache-restart"), str(work / "server.log"))
    for name in ("warm", "restart"):
        later = report[name][1:]
        report[f"{name}_worst_prefilled_over_new"] = max(r["prefilled_over_new"] for r in later)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k.endswith("over_new")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
