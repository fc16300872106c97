"""Issue 35's structured-output measures through the real server and the official clients.

eval_v3.py's JSON part drives the engine directly (the same grammar); the done-when asks for what
a client sees. This starts the app's server on the model (`python -m webapp`, as
scripts/bench/agent_session.py starts it, killed with this script) and asks, at T=0.6:
  json_schema  20 requests through the official `openai` client with response_format json_schema
               {"word": string, "letters": integer}: valid = the reply parses and has both keys of
               their types; closed = it ended (finish_reason "stop") within --max-tokens (80)
  json_mode    20 requests through LangChain's ChatOpenAI.with_structured_output(method="json_mode"):
               objects = a dict came back (a reply cut by max_tokens raises LengthFinishReasonError);
               asked = the dict is {"word": <the word asked>, ...} (json_mode sends no schema, so a
               closed object of anything passes the first count)

    python scripts/bench/eval_api.py models/demo --json docs/bench/<date>/demo-v2-eval-api.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from scripts.bench.agent_session import Server  # noqa: E402

SCHEMA = {"type": "object", "properties": {"word": {"type": "string"}, "letters": {"type": "integer"}},
          "required": ["word", "letters"], "additionalProperties": False}
# the words asked about, held out of v3m on (conversations_v3.strict_held_out)
WORDS = (REPO / "scripts" / "demo_model" / "json_words.txt").read_text().split()


def json_schema_requests(url: str, model: str, n: int, max_tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    rows = []
    for i, w in enumerate(WORDS[:n]):
        r = client.chat.completions.create(
            model=model, temperature=0.6, top_p=0.95, max_tokens=max_tokens, seed=i,
            messages=[{"role": "user", "content": f'Give me the word "{w}" and its number of letters as JSON.'}],
            response_format={"type": "json_schema", "json_schema": {"name": "word", "schema": SCHEMA, "strict": True}})
        text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
        try:
            obj = json.loads(text)
            valid = isinstance(obj.get("word"), str) and isinstance(obj.get("letters"), int) \
                and not isinstance(obj.get("letters"), bool)
        except (ValueError, AttributeError):
            obj, valid = None, False
        rows.append({"word": w, "reply": text, "finish": finish, "tokens": r.usage.completion_tokens,
                     "valid": valid, "closed": finish == "stop",
                     "right_letters": bool(valid and obj["letters"] == len(w))})
    return {"requests": len(rows), "valid_and_closed": sum(r["valid"] and r["closed"] for r in rows),
            "right_letters": sum(r["right_letters"] for r in rows), "max_tokens": max_tokens, "rows": rows}


def json_mode_requests(url: str, model: str, n: int, max_tokens: int) -> dict:
    import openai
    from langchain_openai import ChatOpenAI

    schema = {"title": "Word", "type": "object", "properties": {"word": {"type": "string"}}}
    rows = []
    for i, w in enumerate(WORDS[:n]):
        chat = ChatOpenAI(base_url=url + "/v1", api_key="unused", model=model, temperature=0.6, max_retries=0,
                          max_tokens=max_tokens, seed=i)
        try:
            out = chat.with_structured_output(schema, method="json_mode").invoke(
                f'Give me the word "{w}" as JSON, with the key "word".')
            rows.append({"word": w, "object": out, "ok": isinstance(out, dict),
                         "asked": isinstance(out, dict) and str(out.get("word", "")).strip().lower() == w})
        except openai.LengthFinishReasonError:
            rows.append({"word": w, "object": None, "ok": False, "asked": False, "why": "cut by max_tokens"})
    return {"requests": len(rows), "objects": sum(r["ok"] for r in rows), "asked": sum(r["asked"] for r in rows),
            "max_tokens": max_tokens, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=80)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(a.model, tmp, Path(tmp) / "server.log", warmup=False, label="eval_api")
        try:
            res = {"model": a.model, "sampler": "T=0.6, top_p 0.95",
                   "json_schema": json_schema_requests(server.url, server.model_id, a.n, a.max_tokens),
                   "json_mode": json_mode_requests(server.url, server.model_id, a.n, a.max_tokens)}
        finally:
            server.kill()
    res["seconds"] = round(time.time() - t0)
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "rows"} if isinstance(v, dict) else v)
                      for k, v in res.items()}, indent=1))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
