"""Batched decoding throughput (issue 22): 1, 2, 4, 8 concurrent requests, AR and MTP.

For each lane and batch size B: B different chat prompts join one core.batch.Batch at once and
decode to the end; aggregate tokens/s = all tokens / wall time from the first join to the last
finish; each request's tokens/s = its tokens / (its finish - its join), and its ratio to the same
request decoded alone through its lane (decoder.generate, prefill included, as in the batch).
The row B = 1 against `alone` is what the batcher costs one request by itself.

Also, per lane: a newcomer's first token while 4 others decode (a short prompt: one prefill
chunk plus one step); the others' longest wait between two tokens while a long prompt joins,
with its whole prefill at once (before chunking) and a chunk per step (core/batch.py
Batch.admit); 20 requests at once, batched 8 at a time against one after another; and with
--costs the batched cost model that 'auto' prices batch sizes with (core/calibrate.py).

Imports only core, adapters, mlx, mlx_lm (and pydantic-settings through core.settings): it
runs where the web app's packages are not installed, e.g. a GPU machine:
    python scripts/bench/bench_batch.py --model /tmp/q9b --requests 1 2 4 8 --tokens 64 --json out.json

On the shared CPU, timings run under `flock -x /work/locks/cpu.lock`:
    python scripts/bench/bench_batch.py --costs --json docs/bench/cpu-batch-demo.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from adapters.runtime import preload_blas  # noqa: E402

preload_blas()

import mlx.core as mx  # noqa: E402

from adapters import load_adapter  # noqa: E402
from adapters.runtime import describe_runtime  # noqa: E402
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder  # noqa: E402
from core.batch import Batch, Sequence  # noqa: E402
from core.chat import padded_chat_prompt  # noqa: E402
from core.limits import context_window  # noqa: E402
from core.settings import DEMO_MODEL_DIR  # noqa: E402

QUESTIONS = ["Tell me about Python lists.", "Why is the sky blue?", "Define harbor.", "What is a noun?",
             "Explain recursion.", "Describe a cat.", "What is rain?", "How do birds fly?"]
GREEDY = SamplerConfig(temperature=0)


def prompts(adapter, n):
    tok = adapter.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                    add_generation_prompt=True) for i in range(n)]


def decoder(adapter, mode, depth):
    if mode == "ar":
        return AutoregressiveDecoder(adapter, sampler=GREEDY)
    if mode == "auto":   # the cost model picks each cycle's depth (up to depth + 1), pricing the batch size
        return SpeculativeDecoder(adapter, sampler=GREEDY, depth="auto", max_depth=depth + 1)
    return SpeculativeDecoder(adapter, sampler=GREEDY, depth=depth)


def alone(adapter, mode, depth, p, max_tokens):
    """tokens/s of one request decoded by its lane alone (prefill included), its token count and
    its tokens."""
    t0 = time.perf_counter()
    ids, _ = decoder(adapter, mode, depth).generate(p, max_tokens=max_tokens)
    mx.synchronize()
    return len(ids) / (time.perf_counter() - t0), len(ids), list(ids)


def one_vs_lane(adapter, mode, depth, p, max_tokens, repeats):
    """One request through the batcher (a batch of one) against its lane alone, alternated
    `repeats` times: median tokens/s of each and their ratio."""
    lane, batched = [], []
    for _ in range(repeats):
        lane.append(alone(adapter, mode, depth, p, max_tokens)[0])
        batched.append(run(adapter, mode, depth, [p], max_tokens)["per_request_tok_s"][0])
    a, b = statistics.median(lane), statistics.median(batched)
    return {"lane_tok_s": round(a, 2), "batch_of_one_tok_s": round(b, 2), "ratio": round(b / a, 3),
            "runs_lane": [round(x, 1) for x in lane], "runs_batch_of_one": [round(x, 1) for x in batched]}


def run(adapter, mode, depth, ps, max_tokens, max_batch=None):
    """Decode prompts `ps` together (at most max_batch at once, the rest join as others leave)."""
    batch, waiting, done = Batch(adapter), list(range(len(ps))), {}
    joined, tokens, steps, ids = {}, {}, 0, {}
    all_in = None   # (time, tokens so far) once every request has joined: the decode phase from there
    t0 = time.perf_counter()
    while waiting or batch.running:
        steps += 1
        while waiting and len(batch.running) < (max_batch or len(ps)):
            i = waiting.pop(0)
            joined[i] = time.perf_counter()
            s = Sequence(decoder(adapter, mode, depth), ps[i], max_tokens)
            s.i = i
            ev = batch.join(s)
            tokens[i], ids[i] = len(ev.tokens), list(ev.tokens)
            if ev.finished:
                done[i] = time.perf_counter()
        if all_in is None and not waiting:
            all_in = (time.perf_counter(), sum(tokens.values()))
        for s, ev in batch.step().items():
            tokens[s.i] += len(ev.tokens)
            ids[s.i] += list(ev.tokens)
            if ev.finished:
                done[s.i] = time.perf_counter()
    wall = time.perf_counter() - t0
    per = [tokens[i] / (done[i] - joined[i]) for i in range(len(ps))]
    return {"requests": len(ps), "tokens": sum(tokens.values()), "wall_s": round(wall, 3), "steps": steps,
            "ms_per_step": round(wall / steps * 1e3, 2),
            "aggregate_tok_s": round(sum(tokens.values()) / wall, 2),
            # without the joins (each newcomer's prefill and first token, one after another): the batch decoding
            "decode_tok_s": round((sum(tokens.values()) - all_in[1]) / max(1e-9, t0 + wall - all_in[0]), 2),
            "per_request_tok_s": [round(x, 2) for x in per],
            "per_request_tokens": [tokens[i] for i in range(len(ps))], "ids": [ids[i] for i in range(len(ps))]}


def two_tiles_switch(adapter):
    """A function turning two tiles a launch (9-16 rows, the default since this pairing) on and off in this
    process, for runs paired in time; None where its load check fails or there is no row kernel.
    A layer's graph is traced with the rows a launch of its time, so each setting keeps its own
    traced graphs (the runners' caches swapped with the setting; bench-only reach into them)."""
    from adapters import kernels
    from adapters.kernels import cuda_qmm

    backend = getattr(adapter, "backend", None)
    runners = {id(r): r for r in (getattr(backend, k, None) for k in ("few", "long", "batch"))
               if isinstance(getattr(r, "_compiled", None), dict)}
    traced = cuda_qmm.TWO_TILES["on"]   # what the graphs traced so far used
    kernels.two_tiles(True)
    if not runners or not cuda_qmm.TWO_TILES["on"]:
        return None
    caches = {traced: {k: r._compiled for k, r in runners.items()}, not traced: {k: {} for k in runners}}

    def use(on: bool) -> None:
        cuda_qmm.TWO_TILES["on"] = on
        for k, r in runners.items():
            r._compiled = caches[on][k]
    return use


def paired(adapter, mode, depth, ps, max_tokens, requests, repeats, switch):
    """Aggregate tok/s at each batch size, 8 rows a launch and two tiles a launch
    alternated `repeats` times in one process: medians, their ratio, every run, replies equal."""
    for on in (False, True):   # warm-up: each setting's graphs traced at every batch size
        switch(on)
        for B in requests:
            run(adapter, mode, depth, ps[:B], 8)
    rows = {}
    for B in requests:
        runs = {False: [], True: []}
        ids = {False: [], True: []}
        for _ in range(repeats):
            for on in (False, True):
                switch(on)
                r = run(adapter, mode, depth, ps[:B], max_tokens)
                runs[on].append(r["aggregate_tok_s"])
                ids[on].append(r["ids"])
        a, b = statistics.median(runs[False]), statistics.median(runs[True])
        rows[B] = {"eight_a_launch_tok_s": a, "two_tiles_tok_s": b, "two_tiles_over_eight": round(b / a, 3),
                   "runs_eight": runs[False], "runs_two_tiles": runs[True],
                   "replies_equal": all(x == ids[False][0] for x in ids[False] + ids[True])}
        print(f"{mode} B={B}: 8 rows a launch {a} tok/s, two tiles {b} tok/s ({b / a:.3f}x), "
              f"replies equal {rows[B]['replies_equal']}", flush=True)
    switch(False)
    return rows


def newcomer(adapter, mode, depth, ps, max_tokens, chunk):
    """4 decode; a 5th (a short prompt) is admitted after a few steps: its first token's delay."""
    batch = Batch(adapter, prefill_chunk=chunk)
    for p in ps[:4]:
        batch.join(Sequence(decoder(adapter, mode, depth), p, max_tokens))
    steps = []
    for _ in range(4):
        t = time.perf_counter()
        batch.step()
        steps.append(time.perf_counter() - t)
    new = Sequence(decoder(adapter, mode, depth), ps[4], max_tokens)
    t = time.perf_counter()
    batch.admit(new)
    while new in batch.joining:
        batch.step()
    first = time.perf_counter() - t
    t = time.perf_counter()
    Batch(adapter).join(Sequence(decoder(adapter, mode, depth), ps[4], max_tokens))
    prefill_alone = time.perf_counter() - t
    step = statistics.median(steps)
    return {"prompt_tokens": len(ps[4]), "first_token_s": round(first, 4), "prefill_alone_s": round(prefill_alone, 4),
            "step_s_before": round(step, 4), "prefill_chunk": chunk,
            "first_token_over_one_prefill_plus_one_step": round(first / (prefill_alone + step), 3),
            "note": "admitted between two steps, it prefills after the others' cycle (one chunk: the prompt is "
                    "shorter than it) and its first token comes out of that step: by construction one step plus "
                    "its prefill plus its first sample, so the ratio is ~1"}


def stall(adapter, mode, depth, ps, long_prompt, chunk, max_tokens):
    """The others' longest wait between two tokens while a long prompt joins 4 decoding ones:
    its whole prefill between two steps (chunk 0: Batch.join, as before chunking) or a chunk
    per step (Batch.admit). Wait = time between the ends of two steps that gave the others a
    token, from the newcomer's arrival to its first token."""
    batch = Batch(adapter, prefill_chunk=chunk or 64)
    others = [Sequence(decoder(adapter, mode, depth), p, max_tokens) for p in ps[:4]]
    for s in others:
        batch.join(s)
    ends = []
    for _ in range(3):
        batch.step()
        ends.append(time.perf_counter())
    steady = statistics.median(b - a for a, b in zip(ends, ends[1:]))
    new = Sequence(decoder(adapter, mode, depth), long_prompt, 8)
    arrived = time.perf_counter()
    if chunk == 0:
        batch.join(new)
        first = time.perf_counter() - arrived
        batch.step()
        ends.append(time.perf_counter())
        n_steps = 1
    else:
        batch.admit(new)
        n_steps = 0
        while new in batch.joining:
            batch.step()
            ends.append(time.perf_counter())
            n_steps += 1
        first = ends[-1] - arrived
    gaps = [b - a for a, b in zip(ends[2:], ends[3:])]
    running = sum(1 for s in others if s in batch.running)
    for s in list(batch.running):
        batch.leave(s)
    return {"prefill_chunk": chunk or "whole", "others_longest_wait_s": round(max(gaps), 4),
            "steady_step_s": round(steady, 4), "newcomer_first_token_s": round(first, 4),
            "steps_while_it_prefilled": n_steps, "others_still_decoding_at_its_first_token": running}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEMO_MODEL_DIR), help="checkpoint folder (default: the demo model)")
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 2, 4, 8], help="concurrent requests to measure")
    ap.add_argument("--tokens", "--max-tokens", dest="tokens", type=int, default=64, help="max tokens per request")
    ap.add_argument("--depth", type=int, default=2, help="MTP draft depth")
    ap.add_argument("--lanes", nargs="+", default=["ar", "mtp"], choices=["ar", "mtp", "auto"],
                    help="auto: depth 'auto' (1..depth+1) priced at each batch size; measures the costs first")
    ap.add_argument("--prefill-chunk", type=int, nargs="+", default=[64, 128, 256],
                    help="a newcomer's prefill tokens per step (the first: the newcomer case; each: the long prompt)")
    ap.add_argument("--long-prompt", type=int, default=1024, help="tokens of the long prompt that joins (0: skip)")
    ap.add_argument("--streams", type=int, default=20, help="requests of the many-streams case (0: skip)")
    ap.add_argument("--stream-tokens", type=int, default=27, help="max tokens per request of the many-streams case")
    ap.add_argument("--one-vs-lane", type=int, default=0, metavar="REPEATS",
                    help="only this: one request through the batcher against its lane alone, alternated REPEATS times")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each batch size (aggregate tok/s: their median; a GPU's runs vary by 30%%)")
    ap.add_argument("--pair-two-tiles", action="store_true",
                    help="also: 8 rows a launch against two tiles a launch, alternated --repeats times in one process")
    ap.add_argument("--costs", action="store_true", help="also measure the batched cost model ('auto' at batch sizes)")
    ap.add_argument("--json", "--out", dest="json", default="docs/bench/cpu-batch-demo.json", help="where to write")
    a = ap.parse_args()
    if min(a.requests) < 1 or a.tokens < 2 or a.depth < 1:
        ap.error("--requests >= 1, --tokens >= 2 and --depth >= 1")
    t_start, load_before = time.perf_counter(), os.getloadavg()
    adapter = load_adapter(a.model)
    widest = max(a.requests + [5])
    ps = prompts(adapter, widest)
    for mode in a.lanes:   # warm-up: every width and batch size compiled once (a compiled CPU step is per shape)
        for B in range(1, max(a.requests) + 1):
            run(adapter, mode, a.depth, ps[:B], 8)
        alone(adapter, mode, a.depth, ps[0], 8)
    out = {"model": a.model, "describe": adapter.describe(), "runtime": describe_runtime(),
           "machine": platform.processor() or platform.machine(), "max_tokens": a.tokens, "depth": a.depth,
           "sampler": "greedy", "prefill_chunks": a.prefill_chunk, "lanes": {}}
    if a.costs or "auto" in a.lanes:
        from core.calibrate import measure_costs

        sizes = sorted(b for b in set(a.requests) if b > 1)
        out["costs"] = measure_costs(adapter, max_width=a.depth + 2, batch_sizes=sizes).as_dict()
    if a.one_vs_lane:
        out["one_vs_lane"] = {mode: one_vs_lane(adapter, mode, a.depth, ps[0], 2 * a.tokens, a.one_vs_lane)
                              for mode in a.lanes}
        print(json.dumps(out["one_vs_lane"]))
        Path(a.json).write_text(json.dumps(out, indent=1))
        return
    long_prompt = None
    if a.long_prompt:
        n = min(a.long_prompt, context_window(adapter) - 4 * a.tokens - 64)
        long_prompt = padded_chat_prompt(adapter, "Summarise the text above.", n)
        for chunk in (0, *a.prefill_chunk):   # warm-up: the prefill's shapes
            stall(adapter, a.lanes[0], a.depth, ps, long_prompt, chunk, 4 * a.tokens)
    for mode in a.lanes:
        solo = [alone(adapter, mode, a.depth, p, a.tokens) for p in ps[:max(a.requests)]]
        rows, runs = {}, {B: [] for B in a.requests}
        for _ in range(a.repeats):   # the sizes take turns: a GPU host's speed drifts 10-30 % in minutes
            for B in a.requests:
                runs[B].append(run(adapter, mode, a.depth, ps[:B], a.tokens))
        for B in a.requests:
            reps = runs[B]
            r = sorted(reps, key=lambda x: x["aggregate_tok_s"])[len(reps) // 2]   # the median run
            if a.repeats > 1:
                r["runs_aggregate_tok_s"] = [x["aggregate_tok_s"] for x in reps]
                r["replies_equal_across_runs"] = all(x["ids"] == reps[0]["ids"] for x in reps)
            r["per_request_vs_alone"] = [round(x / y[0], 3) for x, y in zip(r["per_request_tok_s"], solo)]
            # Greedy: each reply in the batch must be its reply alone, token for token.
            r["per_request_equals_alone"] = [got == y[2] for got, y in zip(r.pop("ids"), solo)]
            rows[B] = r
            print(f"{mode} B={B}: {r['aggregate_tok_s']} tok/s aggregate ({r['decode_tok_s']} decoding), lowest ratio to alone "
                  f"{min(r['per_request_vs_alone'])}, replies equal alone {sum(r['per_request_equals_alone'])}/{B}",
                  flush=True)
        if 1 in rows:
            for B in rows:
                rows[B]["aggregate_vs_1"] = round(rows[B]["aggregate_tok_s"] / rows[1]["aggregate_tok_s"], 3)
                rows[B]["decode_vs_1"] = round(rows[B]["decode_tok_s"] / rows[1]["decode_tok_s"], 3)
                # each repeat's B against its own one-request run, minutes closer than the medians' runs
                paired = [x["aggregate_tok_s"] / y["aggregate_tok_s"] for x, y in zip(runs[B], runs[1])]
                rows[B]["paired_vs_1"] = [round(x, 3) for x in paired]
                rows[B]["paired_vs_1_median"] = round(statistics.median(paired), 3)
                if B > 1:
                    print(f"{mode} B={B} / B=1, each repeat: {rows[B]['paired_vs_1']} (median "
                          f"{rows[B]['paired_vs_1_median']}x)", flush=True)
        lane = {"alone_tok_s": [round(x[0], 2) for x in solo], "alone_tokens": [x[1] for x in solo],
                "by_batch": rows}
        if 1 in rows:
            lane["batch_of_one_vs_alone"] = rows[1]["per_request_vs_alone"][0]
        if widest >= 5:
            lane["newcomer_while_4_decode"] = newcomer(adapter, mode, a.depth, ps, a.tokens, a.prefill_chunk[0])
        if long_prompt is not None:
            lane["long_prompt_joins_4_decoding"] = {
                "prompt_tokens": len(long_prompt),
                "before_whole_prefill": stall(adapter, mode, a.depth, ps, long_prompt, 0, 4 * a.tokens),
                "after_chunked": [stall(adapter, mode, a.depth, ps, long_prompt, c, 4 * a.tokens)
                                  for c in a.prefill_chunk]}
            print(mode, "long prompt joins:", json.dumps(lane["long_prompt_joins_4_decoding"]), flush=True)
        if a.pair_two_tiles:
            switch = two_tiles_switch(adapter)
            lane["two_tiles_paired"] = (paired(adapter, mode, a.depth, ps, a.tokens, a.requests, max(a.repeats, 3), switch)
                                        if switch else "not available (no row kernel, or its load check failed)")
        out["lanes"][mode] = lane
    if a.streams and "mtp" in a.lanes:
        # Many requests at once: batched (max_batch 8) against one after another (max_batch 1).
        many = prompts(adapter, a.streams)
        one = run(adapter, "mtp", a.depth, many, a.stream_tokens, max_batch=1)
        eight = run(adapter, "mtp", a.depth, many, a.stream_tokens, max_batch=8)
        out["streams_mtp"] = {"requests": a.streams, "max_tokens": a.stream_tokens,
                              "one_at_a_time_s": one["wall_s"], "batched_8_s": eight["wall_s"],
                              "tokens": [one["tokens"], eight["tokens"]],
                              "ratio": round(eight["wall_s"] / one["wall_s"], 3),
                              "replies_equal": one["ids"] == eight["ids"]}
        print(json.dumps(out["streams_mtp"]), flush=True)
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    # Others' work on the machine shows here (a 2-core CPU shared by several people's jobs).
    out["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.json} in {out['seconds']} s")


if __name__ == "__main__":
    main()
