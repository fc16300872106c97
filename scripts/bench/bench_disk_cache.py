#!/usr/bin/env python3
"""The prefix cache on disk: turn 11 of a ~2.5k-token conversation after a restart, against a warm
server, and loading a state from disk against prefilling the same tokens.

    python scripts/bench/bench_disk_cache.py --model models/demo --json docs/bench/cpu-disk-cache-demo.json

Ten turns run as the app runs them (reply, then the history snapshot, written to disk). Then, per
repeat and in rotating order, the eleventh turn's time to first token:
  warm     the in-memory cache as the server holds it after turn 10 (every snapshot, the
           history after reply 10 included);
  restart  an empty memory cache over the folder: the history snapshot is read from disk (the
           file's pages are first dropped from the OS page cache with posix_fadvise, as after a
           reboot; `restart_page_cache` keeps them, as after a quick restart);
  cold     no cache at all: the whole prompt is prefilled.
And the state itself: `load_seconds` (find, read, checksum, restore) against `prefill_seconds` of
the same tokens. The model is loaded and warmed once (model load is never timed); greedy.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402  (first: the BLAS preload must precede mlx)
from adapters import load_adapter  # noqa: E402
from adapters.runtime import runtime_info  # noqa: E402
from core import (PrefixCache, chat_prompt, history_prompt, opens_thinking, split_reply,  # noqa: E402
                  synchronize)
from core.disk_cache import DiskCache, model_identity  # noqa: E402
from core.stream import Prompt, cache_history, prefill  # noqa: E402
from scripts.bench.bench_turns import greedy_lane, user_message  # noqa: E402


def drop_page_cache(folder: Path) -> None:
    for f in folder.rglob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--user-tokens", type=int, default=200, help="tokens of each user message")
    ap.add_argument("--max-tokens", type=int, default=40, help="tokens of each reply in turns 1..10")
    ap.add_argument("--mode", choices=("mtp", "ar"), default="mtp")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    adapter = load_adapter(Path(a.model))

    def lane(cache):
        return greedy_lane(adapter, a.mode, a.depth, cache)

    folder = Path(tempfile.mkdtemp(prefix="mtp-chat-disk-bench-"))
    identity = model_identity(Path(a.model), [adapter.describe()])
    try:
        lane(None).generate(chat_prompt(adapter, [{"role": "user", "content": "Hello!"}]), max_tokens=16)  # warm-up
        disk = DiskCache(folder, identity, 2**34, 0.0)
        memory = PrefixCache(2**34, disk=disk)
        msgs = [{"role": "system", "content": "You are a helpful assistant."}]
        for t in range(a.turns):
            msgs.append({"role": "user", "content": user_message(adapter, t, a.user_tokens)})
            prompt = chat_prompt(adapter, msgs)
            ids, _ = lane(memory).generate(prompt, max_tokens=a.max_tokens)
            # the answer as the app keeps it in the history (the template drops the thinking)
            inside = opens_thinking(adapter.tokenizer.decode(list(prompt.ids[-16:])))
            msgs.append({"role": "assistant", "content": split_reply(adapter.tokenizer.decode(ids), inside)[1]})
            cache_history(adapter, history_prompt(adapter, msgs), memory)
        history = history_prompt(adapter, msgs)
        msgs.append({"role": "user", "content": user_message(adapter, a.turns, a.user_tokens)})
        prompt = chat_prompt(adapter, msgs)
        assert memory.lookup(prompt.ids).length == len(history.ids)   # turn 11 starts after the history
        warm_snaps = list(memory._snaps.values())
        entry = disk.longest(history.ids + (0,))
        assert entry is not None and len(entry.ids) == len(history.ids)

        def turn11(cache):
            ids, s = lane(cache).generate(prompt, max_tokens=2)
            return s, ids

        def warm():   # the memory cache as the server holds it after turn 10 (a copy: references)
            cache = PrefixCache(2**34)
            for snap in warm_snaps:
                cache.store(snap)
            return turn11(cache)

        def restart(dropped=True):
            if dropped:
                drop_page_cache(folder)
            # defer that drops the writes: this turn's own snapshots must not reach the next repeat
            return turn11(PrefixCache(2**34, disk=DiskCache(folder, identity, 2**34, 0.0), defer=lambda fn: None))

        runs = {"warm": warm, "restart": restart, "restart_page_cache": lambda: restart(False),
                "cold": lambda: turn11(None)}
        ttft = {k: [] for k in runs}
        outputs, cached = {}, {}
        for r in range(a.repeats):
            names = list(runs)
            names = names[r % len(names):] + names[: r % len(names)]
            for name in names:
                s, ids = runs[name]()
                ttft[name].append(s.time_to_first_token)
                outputs.setdefault(name, ids)
                cached[name] = s.cached_tokens
        assert len({tuple(v) for v in outputs.values()}) == 1, outputs   # the cache changes no token
        assert cached["warm"] == cached["restart"] == len(history.ids), cached

        load, fill = [], []
        for r in range(a.repeats):
            drop_page_cache(folder)
            dc = DiskCache(folder, identity, 2**34, 0.0)
            t0 = time.perf_counter()
            snap = PrefixCache(2**34, disk=dc).lookup(history.ids + (0,))
            cache = adapter.make_cache()
            draft = adapter.make_draft(cache)
            adapter.restore(snap.state, cache, draft)
            synchronize()
            load.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            cache = adapter.make_cache()
            prefill(adapter, Prompt(history.ids), cache, adapter.make_draft(cache))
            synchronize()
            fill.append(time.perf_counter() - t0)

        med = {k: statistics.median(v) for k, v in ttft.items()}
        out = {
            "platform": runtime_info(),
            "model": adapter.describe(),
            "mode": a.mode, "depth": a.depth if a.mode == "mtp" else None, "repeats": a.repeats,
            "turn_11": {"prompt_tokens": len(prompt.ids), "history_tokens": len(history.ids),
                        "cached_tokens": cached,
                        "ttft_seconds_median": med, "ttft_seconds": ttft,
                        "restart_over_warm": med["restart"] / med["warm"],
                        "restart_page_cache_over_warm": med["restart_page_cache"] / med["warm"],
                        "cold_over_warm": med["cold"] / med["warm"]},
            "state": {"tokens": len(history.ids), "file_bytes": entry.nbytes,
                      "load_seconds_median": statistics.median(load), "prefill_seconds_median": statistics.median(fill),
                      "load_over_prefill": statistics.median(load) / statistics.median(fill),
                      "load_seconds": load, "prefill_seconds": fill},
            "command": "python " + " ".join(sys.argv),
        }
        text = json.dumps(out, indent=2)
        print(text)
        if a.json:
            Path(a.json).write_text(text + "\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
