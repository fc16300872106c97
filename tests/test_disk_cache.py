"""The prefix cache's disk store on its own: round trips, and every fault loses only the bad entry.

(The restart of a real server, turn 11 after 10 turns, is in tests/test_disk_restart.py.)
"""
import os
import threading
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import pytest

from core.disk_cache import TMP, DiskCache, clear_all, model_identity

REPO = Path(__file__).resolve().parent.parent


def arrays(seed=0, n=64):
    mx.random.seed(seed)
    return {"trunk.0.keys": mx.random.normal((1, 2, n, 8)), "trunk.1.state": mx.random.normal((1, 4, 8, 8)),
            "trunk.2.conv": mx.random.normal((1, 3, 16)).astype(mx.bfloat16), "draft.values": mx.random.normal((1, 2, n - 1, 8))}


def cache(tmp_path, identity="model-a", budget=2**30, ttl=3600.0):
    said = []
    return DiskCache(tmp_path, identity, budget, ttl, say=said.append), said


def entry_file(dc):
    files = [f for f in dc.dir.iterdir() if f.suffix == ".safetensors"]
    assert len(files) == 1
    return files[0]


def test_a_snapshot_round_trips_bit_for_bit_and_is_found_by_prefix(tmp_path):
    dc, said = cache(tmp_path)
    ids = tuple(range(10, 74))
    a = arrays()
    assert dc.store(ids, a, {"trunk.0.keys.length": 64, "kind": "qwen3_5"})
    again, _ = cache(tmp_path)                        # a new process: the index is read back from the folder
    e = again.longest(ids + (5, 6))
    assert e is not None and e.ids == ids
    assert again.longest(ids) is None                 # a prompt must leave a token to run
    assert again.longest((10, 11, 99)) is None
    got_ids, got, meta = again.load(e)
    assert got_ids == ids and meta == {"trunk.0.keys.length": 64, "kind": "qwen3_5"}
    assert set(got) == set(a)
    for k in a:
        assert got[k].dtype == a[k].dtype and mx.array_equal(got[k], a[k]).item(), k
    assert said == []


def test_another_model_never_reads_the_entries(tmp_path):
    dc, _ = cache(tmp_path, "model-a")
    dc.store((1, 2, 3), arrays(), {})
    other, said = cache(tmp_path, "model-b")
    assert other.longest((1, 2, 3, 4)) is None and len(other) == 0
    # and a file copied into the wrong model's folder is refused by what it says inside
    f = entry_file(dc)
    os.rename(f, other.dir / f.name)
    third, said = cache(tmp_path, "model-b")
    assert len(third) == 0 and len(said) == 1 and "another model" in said[0]
    assert not (other.dir / f.name).exists()


@pytest.mark.parametrize("fault", ["truncated", "flipped byte", "empty file", "garbage"])
def test_a_damaged_entry_is_skipped_with_one_line_and_removed(tmp_path, fault):
    dc, _ = cache(tmp_path)
    ids = tuple(range(40))
    dc.store(ids, arrays(), {})
    dc.store(tuple(range(100, 140)), arrays(1), {})   # a good neighbour that must survive
    bad = dc.dir / [f.name for f in dc.dir.iterdir() if f.suffix == ".safetensors"][0]
    good_ids = tuple(range(100, 140)) if dc.longest(ids + (1,)).path == bad else ids
    bad = dc.longest(ids + (1,)).path
    data = bad.read_bytes()
    if fault == "truncated":
        bad.write_bytes(data[: len(data) * 2 // 3])
    elif fault == "flipped byte":
        b = bytearray(data)
        b[-100] ^= 0x40                               # inside the last array's data
        bad.write_bytes(bytes(b))
    elif fault == "empty file":
        bad.write_bytes(b"")
    else:
        bad.write_bytes(os.urandom(len(data)))
    again, said = cache(tmp_path)
    e = again.longest(ids + (1,))
    if e is not None:                                 # the header still read: the load must refuse it
        assert again.load(e) is None
    assert again.longest(ids + (1,)) is None
    assert len(said) == 1 and bad.name in said[0], said
    assert not bad.exists()
    neighbour = again.longest(good_ids + (1,))
    assert neighbour is not None and again.load(neighbour) is not None


def test_a_write_killed_midway_leaves_no_entry(tmp_path):
    """kill -9 while a large entry is being written: the next start finds no half entry (the
    write goes to a temporary name, renamed only when complete) and cleans up the leftover."""
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        import adapters  # the BLAS preload, as the app does
        import mlx.core as mx
        from core.disk_cache import DiskCache
        dc = DiskCache({str(tmp_path)!r}, "model-a", 2**34, 3600.0)
        big = {{"x": mx.random.normal((64, 1024, 1024))}}   # 256 MiB: seconds to hash and write
        mx.eval(big)
        print("ready", flush=True)
        i = 0
        while True:
            dc.store(tuple(range(i, i + 8)), big, {{}})
            i += 1
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.5)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    dc, said = cache(tmp_path, budget=2**34)
    for e in list(dc._entries.values()):             # whatever was complete loads
        assert dc.load(e) is not None
    assert not [f for f in dc.dir.iterdir() if f.name.endswith(TMP)]
    assert said == []


def test_a_read_only_folder_turns_writing_off_with_one_line(tmp_path):
    if os.geteuid() == 0:
        # root ignores permissions: a folder on a full or read-only device is the real case;
        # a file where the folder should be fails the same way (ENOTDIR) for every user.
        (tmp_path / "model-a").write_text("not a folder")
    else:
        (tmp_path / "model-a").mkdir()
        (tmp_path / "model-a").chmod(0o500)
    dc, said = cache(tmp_path)
    assert not dc.store((1, 2, 3), arrays(), {}) and not dc.store((4, 5, 6), arrays(), {})
    assert len(said) == 1 and "writing off" in said[0]
    assert dc.longest((1, 2, 3, 4)) is None


def test_the_budget_keeps_the_most_recently_used(tmp_path):
    one = sum(a.nbytes for a in arrays().values())
    dc, _ = cache(tmp_path, budget=int(2.5 * one))
    for i in range(3):
        assert dc.store((i,) * 5, arrays(i), {})
        time.sleep(0.02)
        if i == 1:
            assert dc.load(dc.longest((0,) * 6)) is not None   # entry 0 used again: entry 1 is the oldest now
    assert dc.longest((1,) * 6) is None and dc.longest((0,) * 6) and dc.longest((2,) * 6)
    assert dc.nbytes <= 2.5 * one + 4096 * 3
    assert not dc.store((9,) * 5, {"big": mx.zeros((int(3 * one) // 4,))}, {})   # larger than the budget


def test_entries_older_than_the_ttl_are_removed(tmp_path):
    dc, _ = cache(tmp_path, ttl=60.0)
    dc.store((1, 2, 3), arrays(), {})
    old = time.time() - 120
    os.utime(entry_file(dc), (old, old))
    again, _ = cache(tmp_path, ttl=60.0)
    assert len(again) == 0 and not list(again.dir.glob("*.safetensors"))


def test_clear_all_and_model_identity(tmp_path, tiny_model_dir):
    dc, _ = cache(tmp_path)
    dc.store((1, 2, 3), arrays(), {})
    files, nbytes = clear_all(tmp_path)
    assert files == 1 and nbytes > 0 and not any(tmp_path.iterdir())
    a = model_identity(tiny_model_dir, ["float32"])
    assert a == model_identity(tiny_model_dir, ["float32"]) != model_identity(tiny_model_dir, ["bfloat16"])


def test_the_writer_thread_writes_while_the_model_thread_goes_on(tmp_path, monkeypatch):
    """store_soon: the caller (the model's thread) only prepares the snapshot; the checksum and the
    file happen on the writer thread, one write at a time. While a write is held mid-file, the
    caller reads entries and spills nothing more; when it ends, `done` defers the next spill; a
    flush at shutdown writes the rest; every entry then loads bit for bit."""
    from core import disk_cache
    from core.model import State
    from core.prefix_cache import PrefixCache, Snapshot

    dc, said = cache(tmp_path)
    dc.store(tuple(range(500, 520)), arrays(9), {})    # an entry already there, read mid-write
    entered, release, writers = threading.Event(), threading.Event(), []
    real = disk_cache._write_safetensors

    def held_write(path, host, metadata):
        writers.append(threading.current_thread().name)
        entered.set()
        assert release.wait(30)
        real(path, host, metadata)
    monkeypatch.setattr(disk_cache, "_write_safetensors", held_write)
    deferred = []
    pc = PrefixCache(2**30, disk=dc, defer=deferred.append)
    # snapshots whose arrays are views into longer buffers, as a KV cache's valid part is
    snaps = []
    for k in range(3):
        a = arrays(k, n=96)
        state = State({name: v for name, v in a.items()}, {"trunk.0.keys.length": 64, "draft.values.length": 63})
        snaps.append(Snapshot(tuple(range(k * 100, k * 100 + 64)), state, mx.ones((1, 1, 8))))
    for s in snaps:
        pc.store(s)
    assert len(deferred) == 3 and len(pc._pending) == 3
    assert pc.spill() == 1 and entered.wait(30)        # the first write is under way, held inside its file
    assert writers == ["mtp-chat-disk-cache_0"] and dc.writing
    assert pc.spill() == 0 and len(pc._pending) == 2   # one write at a time: the others wait
    e = dc.longest(tuple(range(500, 521)))             # the model's thread keeps reading
    assert e is not None and dc.load(e) is not None
    release.set()
    dc.wait(30)
    assert not dc.writing and len(deferred) == 4       # the ended write deferred the next spill
    assert deferred[-1]() == 1                         # ... which hands over the second
    assert pc.flush(30) == 1 and not pc._pending       # shutdown: the second ends, the third is written here
    assert writers == ["mtp-chat-disk-cache_0"] * 2 + [threading.current_thread().name]
    for s in snaps:
        e = dc.longest(s.ids + (1,))
        got_ids, got, meta = dc.load(e)
        assert got_ids == s.ids and meta == dict(s.state.meta)
        for name in s.state.arrays:
            assert mx.array_equal(got[name], s.state.valid(name)).item(), name
    assert said == []


def _address(a):
    import numpy as np
    return np.frombuffer(memoryview(a), dtype=np.uint8).ctypes.data


def test_own_copy_is_a_copy_bit_for_bit(monkeypatch):
    """prepare's copies: bit for bit (NaN, -0.0 and infinities too, every width), and in a buffer
    of their own where mx.contiguous hands back the array's own buffer: on CUDA the host's read
    of that buffer would move the live cache's arrays to unified memory for good."""
    from core.disk_cache import own_copy, prepare

    special = mx.array([float("nan"), -0.0, float("inf"), -float("inf"), 1.5, -2.25])
    cases = [special.astype(t) for t in (mx.float32, mx.bfloat16, mx.float16)]
    cases += [mx.array([-7, 0, 2**31 - 1], dtype=mx.int32), mx.array([True, False, True]),
              mx.array([0, 255, 9], dtype=mx.uint8), mx.arange(24, dtype=mx.int64).reshape(2, 3, 4)[:, 1:, ::2]]
    for a in cases:
        mx.eval(a)
        c = own_copy(a)
        mx.eval(c)
        assert c.dtype == a.dtype and c.shape == a.shape
        assert bytes(memoryview(c)) == bytes(memoryview(mx.contiguous(a))), a.dtype
    whole = mx.random.normal((4, 64))
    mx.eval(whole)
    shared = mx.contiguous(whole)
    mx.eval(shared)
    assert _address(shared) == _address(whole)            # what prepare must not hand to the host on CUDA
    from core import disk_cache
    monkeypatch.setattr(disk_cache, "on_cuda", lambda: True)
    host = prepare({"w": whole})
    assert host["w"][2].nbytes == whole.nbytes
    assert bytes(host["w"][2]) == bytes(memoryview(whole))
    assert _address(host["w"][2]) != _address(whole)


def test_written_copies_are_dropped_on_the_model_thread(tmp_path, monkeypatch):
    """store_soon's host copy outlives its write until `release` on the caller's thread (the
    model's), which then gives its memory back (return_host_copies: on CUDA, out of MLX's buffer
    cache, its buffers freed rather than cached); store does both on its own thread."""
    from core import disk_cache

    returned = []
    monkeypatch.setattr(disk_cache, "return_host_copies",
                        lambda spent: (spent.clear(), returned.append(threading.current_thread().name)))
    dc, said = cache(tmp_path)
    done = threading.Event()
    assert dc.store_soon(tuple(range(5, 69)), arrays(1), {}, done=done.set)
    assert done.wait(30) and not dc.writing
    assert len(dc._spent) == 1 and returned == []          # written, the copy still held
    dc.release()
    assert dc._spent == [] and returned == [threading.current_thread().name]
    dc.release()
    assert len(returned) == 1                              # nothing left: nothing to give back
    assert dc.store(tuple(range(7, 71)), arrays(2), {}) and len(returned) == 2
    assert len(dc) == 2 and said == []
