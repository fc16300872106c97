"""A multi-turn conversation through the OpenAI-compatible API with the official `openai` client.

Start the app first (`mtp-chat`, or `bash scripts/start.sh`), then:

    python scripts/bench/api_conversation.py                          # 5 turns, MTP, the server's sampler defaults
    python scripts/bench/api_conversation.py --mode ar --temperature 0 --url http://127.0.0.1:7860

Per turn it prints the prompt tokens, how many of them came from the prefix cache, the reply's
tokens, the engine's decode speed, MTP acceptance (accepted / proposed), time to first token
and the wall time the client saw. Each turn streams, with usage at the end.
"""
from __future__ import annotations

import argparse
import sys
import time

QUESTIONS = ["Define harbor.", "Use it in a sentence.", "What is a synonym for it?", "And an opposite?",
             "What kind of thing is a harbor?"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:7860")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--turns", type=int, default=len(QUESTIONS))
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--mode", choices=("mtp", "ar"), default="mtp")
    p.add_argument("--depth", default=None, help="1..N or auto (default: the server's)")
    p.add_argument("--temperature", type=float, default=None, help="default: the server's")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import openai

    client = openai.OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0)
    model = client.models.list().data[0].id
    extra = {"mode": args.mode, **({"depth": args.depth if args.depth == "auto" else int(args.depth)}
                                   if args.depth else {})}
    messages = []
    print(f"model {model}, mode {args.mode}, {args.turns} turns, max_tokens {args.max_tokens}")
    print("turn  prompt  cached  reply  tok/s  acceptance (acc/prop)  ttft s  wall s")
    for turn in range(args.turns):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        kw = {} if args.temperature is None else {"temperature": args.temperature}
        t0 = time.perf_counter()
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                                seed=args.seed, stream=True, stream_options={"include_usage": True},
                                                extra_body=extra, **kw)
        text, usage, mtp = "", None, {}
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage, mtp = chunk.usage, chunk.model_extra.get("mtp", {})
        wall = time.perf_counter() - t0
        messages.append({"role": "assistant", "content": text})
        acc = (f"{mtp['acceptance']:.3f} ({mtp['accepted']}/{mtp['proposed']})" if mtp.get("acceptance") is not None
               else "-")
        print(f"{turn + 1:>4}  {usage.prompt_tokens:>6}  {usage.prompt_tokens_details.cached_tokens:>6}  "
              f"{usage.completion_tokens:>5}  {mtp.get('tokens_per_second') or 0:>5.1f}  {acc:>21}  "
              f"{mtp.get('ttft') or 0:>6.3f}  {wall:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
