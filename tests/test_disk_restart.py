"""The prefix cache on disk, end to end: a restarted server's next turn prefills only its new
message and says the rest was cached, with the reply a server that never restarted gives; and
every fault (a write killed by kill -9, a truncated or corrupted entry, a budget too small, a
read-only folder, another checkpoint on the same folder) loses only the bad entry, says so in one
line and serves the same reply as a run without any cache.

(DiskCache on its own, with synthetic arrays, is tested in tests/test_disk_cache.py.)
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import openai
import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, PrefixCache, SpeculativeDecoder, chat_prompt, history_prompt
from core.disk_cache import TMP, DiskCache, model_identity
from core.prefix_cache import Snapshot
from core.stream import SHORT_CHUNK, cache_history, rehearse
from tests._engine_helpers import GREEDY, MIXED, make_mixed_head
from tests._ties import assert_greedy_equal
from tests._webapp_helpers import REPO, App

TURNS = 6      # then turn 7 after the restart (scripts/bench/bench_disk_cache.py measures turn 11 of ~2.5k tokens)
MAX_TOKENS = 8


def questions(lane):
    topics = ["ships", "the moon", "bread", "rivers", "clocks", "owls", "rain", "maps", "bells", "glass", "salt"]
    return [f"{'Briefly' if lane == 'ar' else 'Slowly'}, question {i}: what about {t}?" for i, t in enumerate(topics)]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return make_mixed_head(tiny_checkpoint(fresh=True, **MIXED))


@pytest.fixture(scope="module")
def adapter(checkpoint):
    return load_adapter(checkpoint)


# --- a real server, restarted ---------------------------------------------------------------------
def api_turn(url, messages, lane):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="model", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                       extra_body={"mode": lane, "depth": 2})
    return r.choices[0].message.content, r.usage, r.model_extra["mtp"]


def converse(url, lane, turns, history=None):
    """`turns` more turns of the lane's conversation; returns (messages, [(content, usage, mtp)])."""
    msgs, out = list(history or []), []
    asked = questions(lane)
    for _ in range(turns):
        msgs.append({"role": "user", "content": asked[len(msgs) // 2]})
        content, use, mtp = api_turn(url, msgs, lane)
        msgs.append({"role": "assistant", "content": content})
        out.append((content, use, mtp))
    return msgs, out


def stop(app):
    app.signal(signal.SIGTERM)
    assert app.wait() == 0, "".join(app.lines)


def test_turn_7_after_a_restart_prefills_only_its_new_message(checkpoint, adapter, tmp_path):
    folder = tmp_path / "cache"
    # Both first servers hold each reply's snapshot in its grace (a minute: the next turn comes at once
    # and drops it, the last one is taken at SIGTERM), so that which turn finds what does not hang
    # on a race with the model thread's idle time (tests/test_api_agents.py covers snapshots begun at once)
    never = App(checkpoint, MTP_CHAT_CACHE_DIR="", MTP_CHAT_HISTORY_GRACE_S="60")   # memory only, never restarted
    try:
        reference = {lane: converse(never.url, lane, TURNS + 1) for lane in ("ar", "mtp")}
    finally:
        stop(never)

    first = App(checkpoint, MTP_CHAT_CACHE_DIR=str(folder), MTP_CHAT_HISTORY_GRACE_S="60")
    try:
        for lane in ("ar", "mtp"):
            msgs, out = converse(first.url, lane, TURNS)
            assert [o[0] for o in out] == [o[0] for o in reference[lane][1][:TURNS]]
    finally:
        stop(first)                                              # SIGTERM: the pending writes are flushed
    assert len(list(folder.rglob("*.safetensors"))) >= 2 * TURNS

    second = App(checkpoint, MTP_CHAT_CACHE_DIR=str(folder))
    try:
        said = "".join(second.lines)
        assert "prefix cache on disk: " in said and "skipped" not in said
        assert "snapshot(s) (" in said and "loaded from disk in" in said            # preloaded before serving
        assert f"a next turn after the newest rehearsed, {64 + SHORT_CHUNK} tokens" in said
        for lane in ("ar", "mtp"):
            history = reference[lane][0][: 2 * TURNS]
            _, out = converse(second.url, lane, 1, history)
            content, use, mtp = out[0]
            ref_content, ref_use, ref_mtp = reference[lane][1][TURNS]
            assert content == ref_content, lane
            # everything before the new message came from disk (turn 6's reply snapshotted as the
            # server stopped); only the message and the generation prompt were prefilled
            asked = history + [{"role": "user", "content": questions(lane)[TURNS]}]
            before = len(history_prompt(adapter, history).ids)
            assert use.prompt_tokens == len(chat_prompt(adapter, asked).ids)
            assert use.prompt_tokens_details.cached_tokens == before
            # the server that kept it in memory got turn 7 in turn 6's reply's grace: it dropped that
            # snapshot and prefilled the reply with the message (webapp/serving/history.py)
            assert ref_use.prompt_tokens_details.cached_tokens < before
            assert mtp["prefilled_tokens"] == use.prompt_tokens - before < 40
            if lane == "mtp":
                assert mtp["accepted"] == ref_mtp["accepted"] and mtp["proposed"] == ref_mtp["proposed"]
    finally:
        stop(second)
    assert "skipped" not in "".join(second.lines)


# --- faults, on the engine with real files -----------------------------------------------------------
def decoder(adapter, lane, cache):
    if lane == "ar":
        return AutoregressiveDecoder(adapter, sampler=GREEDY, prefix_cache=cache)
    return SpeculativeDecoder(adapter, sampler=GREEDY, depth=2, prefix_cache=cache)


def turns(adapter, n, cache, lane="mtp", history=()):
    """n more turns (the app's order: reply, then the history snapshot); returns (messages,
    [(reply ids, cached tokens)])."""
    msgs, out = list(history), []
    for _ in range(n):
        msgs.append({"role": "user", "content": questions(lane)[len(msgs) // 2]})
        ids, stats = decoder(adapter, lane, cache).generate(chat_prompt(adapter, msgs), max_tokens=MAX_TOKENS)
        msgs.append({"role": "assistant", "content": adapter.tokenizer.decode(ids)})
        if cache is not None:
            cache_history(adapter, history_prompt(adapter, msgs), cache)
        out.append((ids, stats.cached_tokens))
    return msgs, out


def disk(adapter, checkpoint, root, budget=2**30):
    said = []
    return DiskCache(root, model_identity(checkpoint, [adapter.describe()]), budget, 3600.0, say=said.append), said


@pytest.fixture(scope="module")
def reference(adapter):
    """Four turns without any cache: what every faulty run must still reply."""
    return turns(adapter, 4, None)


def assert_replies(adapter, reference, got):
    """Replies (ids) of turns 1.. are the no-cache reference's. A restore prefills in other chunks
    than a fresh prompt, so up to near-ties (tests/_ties.py); a reply that parts at one ends the
    comparison (the histories differ after it)."""
    msgs, ref = reference
    for k, (ids, (want, _)) in enumerate(zip(got, ref)):
        assert_greedy_equal(adapter, chat_prompt(adapter, msgs[:2 * k + 1]), ids, want, what=f"turn {k + 1}")
        if ids != want:
            return


def entries(dc):
    return sorted(dc._entries.values(), key=lambda e: len(e.ids))


@pytest.mark.parametrize("fault", ["truncated", "flipped byte"])
def test_a_damaged_entry_is_lost_alone(adapter, checkpoint, reference, tmp_path, fault):
    msgs, first = turns(adapter, 3, PrefixCache(2**30, disk=disk(adapter, checkpoint, tmp_path)[0]))
    dc, said = disk(adapter, checkpoint, tmp_path)
    newest, before = entries(dc)[-1], entries(dc)[-2]          # turn 4 would start from the newest
    data = newest.path.read_bytes()
    if fault == "truncated":
        newest.path.write_bytes(data[: len(data) // 2])
    else:
        b = bytearray(data)
        b[len(b) - 200] ^= 0x10                                 # inside the last array's data
        newest.path.write_bytes(bytes(b))
    _, out = turns(adapter, 1, PrefixCache(2**30, disk=dc), history=msgs[:6])
    assert_replies(adapter, reference, [o[0] for o in first + out])   # the same replies as without any cache
    assert out[0][1] == len(before.ids)                         # from the entry before the bad one
    assert len(said) == 1 and newest.path.name in said[0] and "removed" in said[0], said
    assert not newest.path.exists()
    again, said_again = disk(adapter, checkpoint, tmp_path)
    assert all(again.load(e) is not None for e in entries(again)) and said_again == []


def test_a_budget_smaller_than_a_snapshot_keeps_them_in_memory(adapter, checkpoint, reference, tmp_path):
    dc, said = disk(adapter, checkpoint, tmp_path, budget=1024)
    msgs, first = turns(adapter, 3, PrefixCache(2**30, disk=dc))
    assert first[2][1] > 0                                               # memory still serves
    assert len(dc) == 0 and len(said) == 1 and "larger than the whole budget" in said[0]
    dc, said = disk(adapter, checkpoint, tmp_path, budget=1024)
    _, out = turns(adapter, 1, PrefixCache(2**30, disk=dc), history=msgs)
    assert_replies(adapter, reference, [o[0] for o in first + out])
    assert out[0][1] == 0 and len(said) == 1                             # one line per start


def test_a_budget_for_a_few_entries_keeps_the_newest(adapter, checkpoint, reference, tmp_path):
    dc, said = disk(adapter, checkpoint, tmp_path)
    msgs, first = turns(adapter, 3, PrefixCache(2**30, disk=dc))
    one = max(e.nbytes for e in entries(dc))
    dc, said = disk(adapter, checkpoint, tmp_path, budget=int(2.5 * one))   # the next start: a smaller budget
    assert 1 <= len(dc) <= 2 and dc.nbytes <= 2.5 * one
    _, out = turns(adapter, 1, PrefixCache(2**30, disk=dc), history=msgs)
    assert_replies(adapter, reference, [o[0] for o in first + out])
    assert out[0][1] == len(history_prompt(adapter, msgs).ids) and said == []


def test_a_start_preloads_the_newest_entries_that_fit_memory(adapter, checkpoint, reference, tmp_path, monkeypatch):
    """After a restart the app loads the most recently used entries that fit the in-memory
    budget before it serves (PrefixCache.preload), and rehearses a turn after the newest: the
    next turn then restores from memory, reads nothing from disk, and replies as the run that
    never restarted."""
    msgs, first = turns(adapter, 3, PrefixCache(2**30, disk=disk(adapter, checkpoint, tmp_path)[0]))
    dc, said = disk(adapter, checkpoint, tmp_path)
    by_use = dc.newest()
    assert len(by_use) >= 3 and by_use[0].ids == entries(dc)[-1].ids      # the history snapshot: newest
    budget = by_use[0].nbytes + by_use[1].nbytes + by_use[2].nbytes // 2  # room for two of them
    pc = PrefixCache(budget, disk=dc)
    n, nbytes = pc.preload()
    assert n == 2 and 0 < nbytes <= budget and set(pc._snaps) == {by_use[0].ids, by_use[1].ids}
    assert list(pc._snaps)[-1] == by_use[0].ids                           # the newest is kept last
    assert (dc.hits, pc.disk_hits) == (0, 0)                              # preloading is not a hit
    # The start-up's rehearsal of a next turn (core.stream.rehearse) runs the engine's prefill
    # after the newest and leaves nothing behind: the cache's snapshots, their values, its counts.
    newest = pc.newest()
    before = {k: np.array(v) for k, v in newest.state.arrays.items()}
    assert newest.ids == by_use[0].ids and rehearse(adapter, newest) == 64 + SHORT_CHUNK
    assert set(pc._snaps) == {by_use[0].ids, by_use[1].ids} and (pc.hits, pc.misses) == (0, 0)
    assert all(np.array_equal(before[k], np.array(v)) for k, v in newest.state.arrays.items())
    n = min(len(newest.ids) - 1, 200)
    keyed = Snapshot(newest.ids[:-n] + tuple(-5 - i for i in range(n)), newest.state, newest.hidden)  # a picture's key ids
    seen, forward = [], adapter.forward
    monkeypatch.setattr(adapter, "forward", lambda tokens, cache, **kw: seen.extend(tokens.reshape(-1).tolist())
                        or forward(tokens, cache, **kw))
    assert rehearse(adapter, keyed) == 64 + SHORT_CHUNK and len(seen) == 64 + SHORT_CHUNK
    assert min(seen) >= 0                                                        # which never go in as tokens
    monkeypatch.undo()
    asked = msgs + [{"role": "user", "content": questions("mtp")[3]}]
    ids, stats = decoder(adapter, "mtp", pc).generate(chat_prompt(adapter, asked), max_tokens=MAX_TOKENS)
    assert_replies(adapter, reference, [o[0] for o in first] + [ids])
    assert stats.cached_tokens == len(history_prompt(adapter, msgs).ids)  # from the newest entry ...
    assert (dc.hits, pc.disk_hits) == (0, 0) and said == []               # ... in memory already
    assert PrefixCache(budget).preload() == (0, 0)                        # no disk: nothing to load


def test_a_read_only_folder_serves_from_memory(adapter, checkpoint, reference, tmp_path):
    identity = model_identity(checkpoint, [adapter.describe()])
    if os.geteuid() == 0:
        (tmp_path / identity).write_text("not a folder")       # root ignores permissions (test_disk_cache.py)
    else:
        (tmp_path / identity).mkdir()
        (tmp_path / identity).chmod(0o500)
    dc, said = disk(adapter, checkpoint, tmp_path)
    _, out = turns(adapter, 4, PrefixCache(2**30, disk=dc))
    assert_replies(adapter, reference, [o[0] for o in out])
    assert out[3][1] > 0
    assert len(said) == 1 and "writing off" in said[0], said


def test_another_checkpoint_on_the_same_folder_reads_none_of_its_entries(adapter, checkpoint, tiny_checkpoint,
                                                                         tmp_path):
    msgs, _ = turns(adapter, 3, PrefixCache(2**30, disk=disk(adapter, checkpoint, tmp_path)[0]))
    other_dir = make_mixed_head(tiny_checkpoint(fresh=True, **{**MIXED, "seed": 3}))
    other = load_adapter(other_dir)
    expected = turns(other, 1, None, history=msgs[:6])[1][0][0]
    dc, said = disk(other, other_dir, tmp_path)
    assert len(dc) == 0
    _, out = turns(other, 1, PrefixCache(2**30, disk=dc), history=msgs[:6])
    assert out[0] == (expected, 0) and said == []
    mine, said = disk(adapter, checkpoint, tmp_path)              # the first model's entries are intact
    assert len(mine) >= 6 and all(mine.load(e) is not None for e in entries(mine)) and said == []


def test_a_server_killed_while_writing_loses_nothing_it_had_written(adapter, checkpoint, reference, tmp_path):
    """kill -9 of a process that writes snapshots all the time: the next start finds only whole
    entries (a write goes to a temporary name first), removes the leftover and serves correctly."""
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        import adapters
        from adapters import load_adapter
        from core import PrefixCache
        from core.disk_cache import DiskCache, model_identity
        from tests.test_disk_restart import turns
        ad = load_adapter({str(checkpoint)!r})
        dc = DiskCache({str(tmp_path)!r}, model_identity({str(checkpoint)!r}, [ad.describe()]), 2**30, 3600.0)
        print("ready", flush=True)
        while True:
            turns(ad, 4, PrefixCache(2**30, disk=dc), lane="ar")
            dc.clear()
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(2.0)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    dc, said = disk(adapter, checkpoint, tmp_path)
    assert all(dc.load(e) is not None for e in entries(dc)) and said == []
    assert not [f for f in dc.dir.iterdir() if f.name.endswith(TMP)]
    _, out = turns(adapter, 4, PrefixCache(2**30, disk=dc))
    assert_replies(adapter, reference, [o[0] for o in out])


def test_clear_cache_empties_the_folder_and_exits(adapter, checkpoint, tmp_path):
    turns(adapter, 2, PrefixCache(2**30, disk=disk(adapter, checkpoint, tmp_path)[0]))
    assert list(tmp_path.rglob("*.safetensors"))
    done = subprocess.run([sys.executable, "-m", "webapp", "--clear-cache"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, MTP_CHAT_CACHE_DIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "removed" in done.stdout and str(tmp_path) in done.stdout
    assert not list(tmp_path.rglob("*.safetensors"))
