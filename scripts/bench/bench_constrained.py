#!/usr/bin/env python3
"""What structured output costs: AR and MTP lanes with a JSON schema vs without, paired runs on
one model, and the grammar's own cost per token (mask, advance, rollback; core/constraints.py).
`--held-calls`: instead of the schema, the grammar the API holds tool_choice auto's calls to
(core.constraints.Triggered) against none, on a reply that makes no call: what holding calls
costs free text (the same seed gives the same tokens). The tools are held but not rendered
into the prompt: the demo model calls a tool whenever one is offered.

Runs are warm (one untimed run per lane and variant first), interleaved (the four lanes
rotate every repeat), model load excluded; speeds are decode tokens/s as the lanes measure
them. `--libs` also measures the per-token mask cost of the grammar libraries that are
installed (llguidance, xgrammar, outlines-core) on the model's tokenizer.

    python scripts/bench/bench_constrained.py --model models/demo --repeats 5 --json docs/bench/cpu-constrained-demo.json
    python scripts/bench/bench_constrained.py --held-calls --json docs/bench/2026-12-03/cpu-held-calls-demo.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402  (first: the BLAS preload must precede mlx)
from adapters import load_adapter  # noqa: E402
from adapters.runtime import describe_runtime  # noqa: E402
from core import AutoregressiveDecoder, Constraint, SamplerConfig, SpeculativeDecoder, chat_prompt  # noqa: E402
from core.constraints import Triggered  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "harbor": {"type": "string", "maxLength": 30}},
             "required": ["city", "harbor"], "additionalProperties": False},
    "story": {"type": "string", "maxLength": 300},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}},
    "required": ["name", "home", "story", "tags"], "additionalProperties": False}
PROMPT = "Describe a sailor of the old harbor as JSON: name, home, a short story and tags."
TOOLS = [{"type": "function", "function": {"name": name, "description": what, "parameters": {
    "type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}
    for name, what, arg in (("wordbook", "Look up the meaning of an English word.", "term"),
                            ("get_weather", "The weather in a city.", "city"))]
TEXT_PROMPT = "Tell me a short story about an old harbor."


GRAMMAR_SECONDS = [0.0]   # the grammar's host work in the current run


def timed(fn, *args):
    t0 = time.perf_counter()
    try:
        return fn(*args)
    finally:
        GRAMMAR_SECONDS[0] += time.perf_counter() - t0


class Timed:
    """A grammar (core Constraint or Triggered) timing its own host work."""

    def allowed(self):
        return timed(super().allowed)

    def advance(self, tokens):
        return timed(super().advance, tokens)

    def rollback(self, n):
        return timed(super().rollback, n)

    def take(self, tokens):
        return timed(super().take, tokens)


class TimedConstraint(Timed, Constraint):
    pass


class TimedTriggered(Timed, Triggered):
    """A held-calls grammar: what the API holds tool_choice auto's calls to."""

    @classmethod
    def for_tools(cls, adapter, tools):
        from webapp.api.structured import tool_call_grammar

        lazy = tool_call_grammar(tools, lazy=True)(adapter.tokenizer)
        ids = adapter.tokenizer.encode(lazy.trigger, add_special_tokens=False)
        assert len(ids) == 1, "this tokenizer's <tool_call> is not one token: calls cannot be held"
        return cls(adapter.tokenizer, ids[0], lazy.grammar, adapter.contract.vocab_size)


def run(adapter, lane: str, constrained: bool, sampler, seed: int, depth: int, max_tokens: int, prompt,
        held: bool = False) -> dict:
    c = None
    if constrained:
        c = TimedTriggered.for_tools(adapter, TOOLS) if held else TimedConstraint.for_json(
            adapter.tokenizer, SCHEMA, adapter.contract.vocab_size)
    GRAMMAR_SECONDS[0] = 0.0
    if lane == "ar":
        decoder = AutoregressiveDecoder(adapter, sampler=sampler, seed=seed, constraint=c)
    else:
        decoder = SpeculativeDecoder(adapter, sampler=sampler, seed=seed, depth=depth, constraint=c)
    ids, stats = decoder.generate(prompt, max_tokens=max_tokens)
    text = adapter.tokenizer.decode(ids)
    valid = None
    if constrained and not held:
        try:
            json.loads(text)
            valid = True
        except ValueError:
            valid = False
    return {"tokens": stats.generated_tokens, "tokens_per_second": stats.tokens_per_second,
            "acceptance": stats.acceptance_rate if lane == "mtp" else None,
            "grammar_us_per_token": 1e6 * GRAMMAR_SECONDS[0] / max(1, stats.generated_tokens) if constrained else None,
            "valid_json": valid, "ids": ids}


def measure_libs(tokenizer_dir: str) -> dict:
    """Per-token mask cost of each installed grammar library on one JSON document."""
    import numpy as np
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = json.dumps({"name": "Ann Smith of the harbor", "home": {"city": "Oslo", "harbor": "Aker Brygge"},
                       "story": "She kept the old lighthouse for forty years.", "tags": ["sailor", "keeper"]})
    ids = tok.encode(text, add_special_tokens=False)
    out = {"vocab": len(tok), "tokens": len(ids)}

    def stats(ts, compile_s, rollback):
        return {"mask_us_median": round(1e6 * float(np.median(ts)), 2), "mask_us_p95": round(1e6 * float(np.percentile(ts, 95)), 2),
                "compile_ms": round(1e3 * compile_s, 2), "rollback": rollback}

    try:
        import llguidance
        import llguidance.hf
        from core.constraints import JSON_STYLE

        lt = llguidance.hf.from_tokenizer(tok)
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_STYLE))
        compile_s = time.perf_counter() - t0
        bits, ts = np.zeros((lt.vocab_size + 31) // 32, dtype=np.int32), []
        for t in ids:
            t0 = time.perf_counter()
            m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            ts.append(time.perf_counter() - t0)
            m.consume_token(t)
        out["llguidance"] = stats(ts, compile_s, m.rollback(3) and m.consume_tokens(ids[-3:]))
    except ImportError:
        out["llguidance"] = "not installed"
    try:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
        t0 = time.perf_counter()
        g = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
        compile_s = time.perf_counter() - t0
        gm, bm, ts = xgr.GrammarMatcher(g, max_rollback_tokens=16), xgr.allocate_token_bitmask(1, len(tok)), []
        for t in ids:
            t0 = time.perf_counter()
            gm.fill_next_token_bitmask(bm)
            ts.append(time.perf_counter() - t0)
            gm.accept_token(t)
        gm.rollback(3)
        out["xgrammar"] = stats(ts, compile_s, all(gm.accept_token(t) for t in ids[-3:]))
    except ImportError:
        out["xgrammar"] = "not installed (it needs torch)"
    try:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema

        eos = tok.convert_tokens_to_ids("<|im_end|>")
        vocab = {}
        for s, i in tok.get_vocab().items():
            if i != eos:
                vocab.setdefault(tok.convert_tokens_to_string([s]), []).append(i)
        t0 = time.perf_counter()
        index = Index(build_regex_from_schema(json.dumps(SCHEMA), r" ?"), Vocabulary(eos, vocab))
        compile_s = time.perf_counter() - t0
        g, mask, ts = Guide(index), np.zeros((len(tok) + 31) // 32, dtype=np.int32), []
        for t in ids:
            t0 = time.perf_counter()
            g.write_mask_into(mask.ctypes.data, mask.size, 4)
            ts.append(time.perf_counter() - t0)
            g.advance(t)
        g.rollback_state(3)
        out["outlines_core"] = stats(ts, compile_s, True)
    except ImportError:
        out["outlines_core"] = "not installed"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--temperatures", default="0,0.6")
    ap.add_argument("--libs", action="store_true", help="also measure the grammar libraries' mask cost")
    ap.add_argument("--held-calls", action="store_true", help="tools offered and held (tool_choice auto) vs unheld")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    adapter = load_adapter(a.model)
    if a.held_calls:
        prompt = chat_prompt(adapter, [{"role": "user", "content": TEXT_PROMPT}], enable_thinking=False)
    else:
        prompt = chat_prompt(adapter, [{"role": "user", "content": PROMPT}])
    variants = [(lane, c) for c in (False, True) for lane in ("ar", "mtp")]
    tag = "_held" if a.held_calls else "_schema"
    import subprocess

    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    report = {"model": a.model, "commit": commit, "runtime": str(describe_runtime()), "depth": a.depth, "max_tokens": a.max_tokens,
              "repeats": a.repeats, "by_temperature": {}}
    report.update({"tools": TOOLS, "prompt": TEXT_PROMPT} if a.held_calls else {"schema": SCHEMA, "prompt": PROMPT})
    for temperature in (float(t) for t in a.temperatures.split(",")):
        sampler = SamplerConfig(temperature=temperature)
        for lane, c in variants:                                  # warm-up, untimed
            run(adapter, lane, c, sampler, 0, a.depth, a.max_tokens, prompt, a.held_calls)
        rows = {f"{lane}{tag if c else ''}": [] for lane, c in variants}
        for r in range(a.repeats):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for lane, c in order:
                rows[f"{lane}{tag if c else ''}"].append(
                    run(adapter, lane, c, sampler, r, a.depth, a.max_tokens, prompt, a.held_calls))
        med = {k: statistics.median(x["tokens_per_second"] for x in v) for k, v in rows.items()}
        out = report["by_temperature"][str(temperature)] = {
            "tokens_per_second": {k: round(v, 2) for k, v in med.items()},
            "mtp_over_ar": round(med["mtp"] / med["ar"], 3),
            f"mtp_over_ar_with{tag}": round(med["mtp" + tag] / med["ar" + tag], 3),
            f"{tag[1:]}_over_free_ar": round(med["ar" + tag] / med["ar"], 3),
            f"{tag[1:]}_over_free_mtp": round(med["mtp" + tag] / med["mtp"], 3),
            "acceptance": {k: round(statistics.median(x["acceptance"] for x in v), 3)
                           for k, v in rows.items() if k.startswith("mtp")},
            "grammar_us_per_token": {k: round(statistics.median(x["grammar_us_per_token"] for x in v), 1)
                                     for k, v in rows.items() if k.endswith(tag)},
            "tokens": {k: [x["tokens"] for x in v] for k, v in rows.items()},
        }
        if a.held_calls:   # same seed, same tokens: a reply without a call is the model's own
            trigger = TimedTriggered.for_tools(adapter, TOOLS).trigger
            out["replies_opening_a_call"] = sum(trigger in x["ids"] for v in rows.values() for x in v)
            out["held_replies_equal_unheld"] = all(x["ids"] == y["ids"] for lane in ("ar", "mtp")
                                                   for x, y in zip(rows[lane], rows[lane + tag]))
        else:
            out["valid_json"] = {k: all(x["valid_json"] for x in v) for k, v in rows.items() if k.endswith(tag)}
    if a.libs:
        report["libraries"] = measure_libs(a.model)
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
