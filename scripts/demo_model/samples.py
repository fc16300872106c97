"""Sample conversations for the model card: ten fixed prompts (chosen before looking at any
output), answered by the engine's MTP lane (depth 1) at the default sampler
(T=0.6, top_p 0.95, top_k 20, seed 0) -- the same distribution as the AR lane -- with the
lane's own acceptance per reply.

    python scripts/demo_model/samples.py --model models/demo --json artifacts/demo/samples.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
import adapters  # noqa: E402,F401
from adapters import load_adapter  # noqa: E402
from core import SamplerConfig, SpeculativeDecoder, chat_prompt_ids  # noqa: E402

PROMPTS = [
    "Hello!",
    'What does "harbor" mean?',
    "Define happiness.",
    "Give me a synonym for quick.",
    'Use "garden" in a sentence.',
    'What is the opposite of "ancient"?',
    "What kind of thing is a violin?",
    "Tell me a quote.",
    "How do I convert between tuples and lists?",
    'What does "foo" mean in hacker slang?',
]

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(REPO / "models" / "demo"))
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ad = load_adapter(a.model)
    s = SamplerConfig(temperature=a.temperature, top_p=0.95, top_k=20)
    out = []
    for p in PROMPTS:
        ids = chat_prompt_ids(ad, [{"role": "user", "content": p}])
        toks, st = SpeculativeDecoder(ad, sampler=s, seed=a.seed, depth=1).generate(ids, max_tokens=160)
        text = ad.tokenizer.decode([t for t in toks if t not in ad.tokenizer.eos_token_ids])
        out.append({"prompt": p, "reply": text, "tokens": st.generated_tokens,
                    "acceptance": round(st.acceptance_rate, 3)})
        print(json.dumps(out[-1]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
