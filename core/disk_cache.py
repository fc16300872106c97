"""Prefix-cache snapshots on disk, so that a restart does not cost the next turn a full prefill.

An entry is one safetensors file: the snapshot's arrays (only the part that holds data) plus,
in the file's metadata, the prompt token ids it covers, the family's small facts, the model's
identity and a checksum over all of it. Files live in one folder per model identity (a hash of
the checkpoint's config, its weight files' headers, the tokenizer and the compute dtype), so a
different checkpoint never reads another's entries, and each file says whose it is as well.

A write has two halves: on the model's thread the snapshot's valid data is copied out of the
live caches into host memory (`prepare`: one MLX copy; the caches keep decoding on their own
buffers), and on the cache's writer thread (`store_soon`) that copy is checksummed and written,
so a multi-GB snapshot of a long agent prompt never holds up the next request (ninth session, H200:
the idle-time writes of 20k-token snapshots, hashed and written on the model thread, made the
next turn wait 6-15 s). The checksum is a CRC-32 per 32 MiB piece of each array (zlib, the GIL
released, pieces in parallel) hashed in order with the names, dtypes, shapes, ids and meta: it
finds a truncated or damaged file (what it is for; the folder is the user's own, not a forger's),
at several GB/s instead of BLAKE2b's one.

On CUDA, MLX moves any buffer the host reads into unified memory for good, and recycles freed
buffers for later GPU arrays whatever memory they are in; GPU work on such a buffer then faults
its pages over from the host. So nothing here reads the caches' own buffers: a write reads a copy
of its own (`own_copy`), dropped on the model's thread and freed rather than recycled
(`return_host_copies`); a load checksums the file's bytes and leaves the arrays, which mx.load
puts in device memory, untouched by the host. At start-up the app loads the newest entries that
fit its memory budget (`PrefixCache.preload`), so the turn after a restart reads nothing from disk.

Writes are atomic (a temporary file in the same folder, fsync, rename): a process killed
mid-write leaves a stray `.tmp` file that the next start removes, never a half entry under a
real name. A truncated or corrupted entry (a failed checksum, an unreadable header) is skipped
with one log line and deleted — never loaded. A read-only folder or a full disk turns writing
off with one log line; the in-memory cache keeps serving.

The folder is kept within a size budget (least recently used entries go first) and a TTL. What
is on disk is the conversations' decoding state: docs/usage.md's privacy note says so, and
`mtp-chat --clear-cache` removes it.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import mmap
import os
import struct
import threading
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

log = logging.getLogger("mtp_chat.disk_cache")

FORMAT = "mtp-chat-prefix-v2"   # v2: the per-piece CRC-32 checksum (v1 entries are refused and removed)
SUFFIX = ".safetensors"
TMP = ".tmp.safetensors"  # a write in progress (or killed): never read, removed at start


class Refused(Exception):
    """An entry that reads but is not ours or not intact."""


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mtp-chat" / "prefix"


SAMPLES, SAMPLE_BYTES = 16, 4096   # per weight file: 64 KiB read, spread over its data


def model_identity(path: Path, extra: Sequence[str] = ()) -> str:
    """A hash of what decides a snapshot's numbers: config.json, every safetensors file's header
    (names, shapes, dtypes, offsets) and SAMPLES blocks of its data spread over the file, the
    tokenizer, and `extra` (the compute dtype, the engine's state format). Headers alone are not
    enough: a fine-tune of the same base (or another seed of a test checkpoint) has the same
    headers and sizes and different weights; a fine-tune changes nearly every block."""
    h = hashlib.sha256(FORMAT.encode())
    path = Path(path)
    for rel in sorted(p.relative_to(path).as_posix() for p in path.rglob("*")
                      if p.is_file() and (p.suffix == ".safetensors" or p.name in
                                          ("config.json", "tokenizer.json", "tokenizer_config.json"))):
        f = path / rel
        h.update(rel.encode() + b"\0" + str(f.stat().st_size).encode() + b"\0")
        if f.suffix == ".safetensors":
            h.update(_header_bytes(f))
            h.update(_sampled_bytes(f))
        else:
            h.update(f.read_bytes())
    for e in extra:
        h.update(b"\0" + str(e).encode())
    return h.hexdigest()[:24]


def _header_bytes(f: Path) -> bytes:
    with open(f, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            return raw
        (n,) = struct.unpack("<Q", raw)
        return fh.read(min(n, 100 * 2**20))


def _sampled_bytes(f: Path) -> bytes:
    size = f.stat().st_size
    out = []
    with open(f, "rb") as fh:
        for i in range(SAMPLES):
            fh.seek(max(0, (size - SAMPLE_BYTES) * i // max(1, SAMPLES - 1)))
            out.append(fh.read(SAMPLE_BYTES))
    return b"".join(out)


def _read_metadata(f: Path) -> Dict[str, str]:
    header = json.loads(_header_bytes(f).decode("utf-8"))
    return header.get("__metadata__", {}) or {}


def _ids_text(ids: Sequence[int]) -> str:
    return base64.b64encode(np.asarray(ids, dtype=np.int32).tobytes()).decode("ascii")


def _ids_from(text: str) -> Tuple[int, ...]:
    return tuple(int(t) for t in np.frombuffer(base64.b64decode(text), dtype=np.int32))


PIECE = 32 << 20   # bytes a CRC-32 covers (pieces are checksummed in parallel)
# safetensors' dtype names of what snapshots hold
_DTYPES = {mx.bfloat16: "BF16", mx.float16: "F16", mx.float32: "F32", mx.int32: "I32", mx.uint32: "U32",
           mx.int64: "I64", mx.uint64: "U64", mx.int16: "I16", mx.uint16: "U16", mx.int8: "I8",
           mx.uint8: "U8", mx.bool_: "BOOL"}
_pool: Optional[ThreadPoolExecutor] = None


def _crc_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="mtp-chat-crc")
    return _pool


Host = Dict[str, Tuple[str, Tuple[int, ...], memoryview]]   # name -> (dtype, shape, contiguous bytes)


_UINT = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


def own_copy(a: mx.array) -> mx.array:
    """`a`, bit for bit, in a buffer of its own. mx.contiguous (and mx.array(a), copy.copy) hand
    back the same buffer when `a` is already contiguous, and on CUDA MLX moves a buffer that the
    host reads into unified memory for good: the caches' own recurrent states and KV would then
    live there, and every step after would fault their pages back to the GPU. An OR with 0 on
    the bits is a real copy whatever the dtype (NaNs and -0.0 included)."""
    bits = a.view(_UINT[a.itemsize])
    return (bits | mx.array(0, dtype=bits.dtype)).view(a.dtype)


def on_cuda() -> bool:
    """MLX computes on an NVIDIA GPU here (its buffers then live in device memory, not unified)."""
    cuda = getattr(mx, "cuda", None)
    return cuda is not None and cuda.is_available() and mx.default_device() == mx.gpu


def prepare(arrays: Dict[str, mx.array]) -> Host:
    """Arrays as contiguous host bytes: what checksumming and writing read, without MLX. Runs
    MLX, so on the model's thread; the bytes may then go to any thread. On CUDA each is a copy
    of its own (`own_copy`): only the copy moves to host memory, never the caches' buffers.
    Elsewhere memory is one (CPU, Metal) and a contiguous array is read where it is."""
    for a in arrays.values():
        if a.dtype not in _DTYPES:
            raise TypeError(f"a snapshot array of dtype {a.dtype} cannot be stored")
    copy = own_copy if on_cuda() else mx.contiguous
    own = {name: copy(a) for name, a in arrays.items()}
    mx.eval(list(own.values()))
    return {name: (_DTYPES[a.dtype], tuple(a.shape), memoryview(a).cast("B")) for name, a in own.items()}


def return_host_copies(spent: list) -> None:
    """Drop the host copies in `spent` (on the model's thread). On CUDA their buffers, now unified
    memory whose pages sit on the host, would go back to MLX's buffer cache and be handed to the
    next GPU arrays of their size (the next prefill's KV, a snapshot), which would then run on
    page faults: they are freed instead, with the cache's limit at 0 while they go. The rest of
    the cache stays: emptying it all (mx.clear_cache, before 2026-12-03) gave the next turn's
    chunks only fresh allocations to run on. Elsewhere (CPU, Metal's unified memory) nothing is
    wrong with the cache and the copies go back to it."""
    if not on_cuda():
        spent.clear()
        return
    limit = mx.set_cache_limit(0)
    try:
        spent.clear()   # the last references: MLX frees their buffers, as the cache is "full"
    finally:
        mx.set_cache_limit(limit)


def _file_checksum(path: Path) -> Tuple[str, Dict[str, str]]:
    """(checksum, metadata) of an entry from its file's bytes (mapped, not copied), never through
    MLX arrays: on CUDA a host read of a loaded array moves it to unified memory for good."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        metadata = header.pop("__metadata__", None) or {}
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
            host: Host = {}
            try:
                for name, h in header.items():
                    lo, hi = (8 + n + int(o) for o in h["data_offsets"])
                    host[name] = (h["dtype"], tuple(h["shape"]), view[lo:hi])
                checksum = _checksum(metadata["ids"], metadata["meta"], host)
            finally:
                for _, _, part in host.values():
                    part.release()   # the map closes only once no view of it is left
    return checksum, metadata


def _checksum(ids_text: str, meta_text: str, host: Host) -> str:
    pieces = [(name, i) for name in sorted(host) for i in range(0, max(1, host[name][2].nbytes), PIECE)]
    crcs = list(_crc_pool().map(lambda p: zlib.crc32(host[p[0]][2][p[1]:p[1] + PIECE]), pieces))
    h = hashlib.blake2b(digest_size=20)
    h.update(ids_text.encode() + b"\0" + meta_text.encode())
    for name in sorted(host):
        dtype, shape, _ = host[name]
        h.update(b"\0" + name.encode() + b"\0" + dtype.encode() + str(shape).encode())
    for crc in crcs:
        h.update(crc.to_bytes(4, "little"))
    return h.hexdigest()


def _write_safetensors(path: Path, host: Host, metadata: Dict[str, str]) -> None:
    """The safetensors layout (8-byte header length, JSON header, the arrays' bytes), written
    straight from host memory and fsynced: file writes release the GIL, mx.save does the same
    from MLX arrays but belongs on the model's thread."""
    header: dict = {"__metadata__": metadata}
    at = 0
    for name, (dtype, shape, data) in host.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + data.nbytes]}
        at += data.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for _, _, data in host.values():
            f.write(data)
        f.flush()
        os.fsync(f.fileno())


@dataclass
class Entry:
    ids: Tuple[int, ...]
    path: Path
    nbytes: int
    used: float  # last use (file mtime), for LRU and the TTL


class DiskCache:
    """Snapshots of one model on disk: store, find the longest stored prefix, load, evict.

    Thread-safe. `store` writes on the caller's thread, `store_soon` on the cache's writer
    thread (both prepare the arrays on the caller's, which must own the model); `load`
    returns the arrays as MLX arrays read from the file."""

    def __init__(self, root: Path, identity: str, budget_bytes: int, ttl_seconds: float,
                 say: Callable[[str], None] = log.warning):
        self.root = Path(root)
        self.dir = self.root / identity
        self.identity = identity
        self.budget_bytes = int(budget_bytes)
        self.ttl = float(ttl_seconds)
        self.say = say
        self.writable = True
        self._said_too_big = False
        self._lock = threading.Lock()
        self._entries: Dict[Tuple[int, ...], Entry] = {}
        self._writer: Optional[ThreadPoolExecutor] = None   # store_soon's thread, made on first use
        self._future: Optional[Future] = None
        self._spent: list = []   # host copies written, waiting for `release` on the model's thread
        self.hits = self.misses = self.writes = self.dropped = 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._off(f"cannot create {self.dir} ({exc.strerror or exc})")
        self._scan()

    # --- index ----------------------------------------------------------------------------
    def _off(self, why: str) -> None:
        if self.writable:
            self.say(f"prefix cache on disk: writing off: {why}; the in-memory cache keeps serving")
        self.writable = False

    def _drop(self, path: Path, why: str) -> None:
        self.dropped += 1
        self.say(f"prefix cache on disk: skipped {path.name}: {why}; removed it")
        try:
            path.unlink()
        except OSError:
            pass

    def _scan(self) -> None:
        if not self.dir.is_dir():
            return
        now = time.time()
        for f in self.dir.iterdir():
            if f.name.endswith(TMP):
                try:
                    f.unlink()  # a write that never finished (killed mid-write)
                except OSError:
                    pass
                continue
            if f.suffix != ".safetensors":
                continue
            try:
                meta = _read_metadata(f)
                if meta.get("format") != FORMAT or meta.get("model") != self.identity:
                    raise Refused("written for another model or format")
                ids = _ids_from(meta["ids"])
                st = f.stat()
            except Exception as exc:  # noqa: BLE001 - any unreadable header is a bad entry
                self._drop(f, str(exc) if isinstance(exc, Refused) else f"unreadable ({type(exc).__name__})")
                continue
            if self.ttl and now - st.st_mtime > self.ttl:
                try:
                    f.unlink()
                except OSError:
                    pass
                continue
            self._entries[ids] = Entry(ids, f, st.st_size, st.st_mtime)
        self._evict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def longest(self, prompt: Sequence[int], shorter_than: Optional[int] = None) -> Optional[Entry]:
        """The longest entry whose ids are a prefix of `prompt` and leave >= 1 token to run."""
        prompt = tuple(prompt)
        best = None
        limit = len(prompt) if shorter_than is None else min(len(prompt), shorter_than)
        with self._lock:
            for ids, e in self._entries.items():
                n = len(ids)
                if n < limit and (best is None or n > len(best.ids)) and prompt[:n] == ids:
                    best = e
        return best

    # --- write ----------------------------------------------------------------------------
    def store(self, ids: Sequence[int], arrays: Dict[str, mx.array], meta: dict) -> bool:
        """Write one snapshot (its valid data) on this thread; False if not written."""
        ids = tuple(int(t) for t in ids)
        host = self._prepared(ids, arrays)
        if host is None:
            return False
        try:
            return self._write(ids, host, meta)
        finally:
            with self._lock:
                self._spent.append(host)
            del host
            self.release()

    def store_soon(self, ids: Sequence[int], arrays: Dict[str, mx.array], meta: dict,
                   done: Optional[Callable[[], None]] = None) -> bool:
        """`store` with the checksum and the file on the writer thread: this thread (the model's)
        only copies the arrays to host memory. One write at a time: False, and nothing started,
        while one is under way (or when this snapshot is not to be written). `done()` runs on
        the writer thread when the write ends, whatever its outcome; the host copy then waits for
        `release` on the model's thread."""
        if self.writing:
            return False
        ids = tuple(int(t) for t in ids)
        box = [self._prepared(ids, arrays)]   # the writer takes it out: no other reference stays behind
        if box[0] is None:
            return False
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtp-chat-disk-cache")

        def write() -> bool:
            host = box.pop()
            try:
                return self._write(ids, host, meta)
            except Exception as exc:  # noqa: BLE001 - a failed write loses that entry, never the server
                self._off(f"{type(exc).__name__}: {exc}")
                return False
            finally:
                with self._lock:
                    self._spent.append(host)   # freed by `release`, on the model's thread
                del host
        self._future = self._writer.submit(write)
        if done is not None:   # called once `writing` is False again
            self._future.add_done_callback(lambda _: done())
        return True

    def release(self) -> None:
        """On the model's thread: drop the host copies written (`return_host_copies`)."""
        with self._lock:
            spent, self._spent = self._spent, []
        if spent:
            return_host_copies(spent)

    @property
    def writing(self) -> bool:
        return self._future is not None and not self._future.done()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Until the write under way (if any) has ended."""
        if self._future is not None:
            self._future.exception(timeout)

    def _prepared(self, ids: Tuple[int, ...], arrays: Dict[str, mx.array]) -> Optional[Host]:
        if not self.writable or ids in self._entries:
            return None
        size = sum(a.nbytes for a in arrays.values())
        if size > self.budget_bytes:
            if not self._said_too_big:
                self._said_too_big = True
                self.say(f"prefix cache on disk: a snapshot of {size / 2**20:.1f} MiB is larger than the whole "
                         f"budget ({self.budget_bytes / 2**20:.1f} MiB); such snapshots stay in memory only")
            return None
        return prepare(arrays)

    def _write(self, ids: Tuple[int, ...], host: Optional[Host], meta: dict) -> bool:
        if host is None or not self.writable:
            return False
        ids_text, meta_text = _ids_text(ids), json.dumps(meta, sort_keys=True)
        checksum = _checksum(ids_text, meta_text, host)
        stem = hashlib.sha256(ids_text.encode()).hexdigest()[:32]
        final = self.dir / (stem + SUFFIX)
        tmp = self.dir / f"{stem}.{os.getpid()}.{threading.get_ident()}{TMP}"
        metadata = {"format": FORMAT, "model": self.identity, "ids": ids_text, "meta": meta_text,
                    "checksum": checksum, "created": str(time.time())}
        try:
            _write_safetensors(tmp, host, metadata)
            os.replace(tmp, final)
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            self._off(f"{exc.strerror or exc} while writing to {self.dir}")
            return False
        st = final.stat()
        with self._lock:
            self._entries[ids] = Entry(ids, final, st.st_size, st.st_mtime)
            self.writes += 1
        self._evict()
        return True

    def _evict(self) -> None:
        now = time.time()
        with self._lock:
            doomed = [e for e in self._entries.values() if self.ttl and now - e.used > self.ttl]
            live = sorted((e for e in self._entries.values() if e not in doomed), key=lambda e: e.used)
            total = sum(e.nbytes for e in live)
            while live and total > self.budget_bytes:
                e = live.pop(0)
                doomed.append(e)
                total -= e.nbytes
            for e in doomed:
                self._entries.pop(e.ids, None)
        for e in doomed:
            try:
                e.path.unlink()
            except OSError:
                pass

    # --- read -----------------------------------------------------------------------------
    def load(self, entry: Entry, count: bool = True) -> Optional[Tuple[Tuple[int, ...], Dict[str, mx.array], dict]]:
        """(ids, arrays, meta) of an entry, or None (and the entry removed) if it fails its checks.
        The checksum reads the file itself; the arrays come from mx.load and are evaluated here
        (on CUDA straight into device memory, untouched by the host). `count`: a lookup's hit."""
        try:
            checksum, metadata = _file_checksum(entry.path)
            if metadata.get("format") != FORMAT or metadata.get("model") != self.identity:
                raise Refused("written for another model or format")
            if _ids_from(metadata["ids"]) != entry.ids:
                raise Refused("its ids do not match its index entry")
            if checksum != metadata.get("checksum"):
                raise Refused("checksum mismatch (corrupted)")
            meta = json.loads(metadata["meta"])
            arrays = mx.load(str(entry.path))
            mx.eval(list(arrays.values()))
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with a file, it is not loaded
            with self._lock:
                self._entries.pop(entry.ids, None)
            self._drop(entry.path, str(exc) if isinstance(exc, Refused) else f"unreadable ({type(exc).__name__}: {exc})")
            self.misses += 1
            return None
        now = time.time()
        try:
            os.utime(entry.path, (now, now))
        except OSError:
            pass
        entry.used = now
        self.hits += count
        return entry.ids, arrays, meta

    def newest(self) -> list:
        """The entries, most recently used first."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.used, reverse=True)

    def clear(self) -> None:
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for e in entries:
            try:
                e.path.unlink()
            except OSError:
                pass

    def describe(self) -> dict:
        with self._lock:
            return {"dir": str(self.dir), "entries": len(self._entries),
                    "bytes": sum(e.nbytes for e in self._entries.values()), "budget_bytes": self.budget_bytes,
                    "ttl_seconds": self.ttl, "writable": self.writable, "hits": self.hits, "misses": self.misses,
                    "writes": self.writes, "dropped": self.dropped}


def clear_all(root: Path) -> Tuple[int, int]:
    """Remove every model's entries under `root` (mtp-chat --clear-cache): (files, bytes) removed."""
    files = nbytes = 0
    root = Path(root)
    if not root.is_dir():
        return 0, 0
    for sub in list(root.iterdir()):
        if not sub.is_dir():
            continue
        for f in list(sub.iterdir()):
            if f.suffix == ".safetensors":
                try:
                    size = f.stat().st_size
                    f.unlink()
                    files, nbytes = files + 1, nbytes + size
                except OSError:
                    pass
        try:
            sub.rmdir()
        except OSError:
            pass
    return files, nbytes


__all__ = ["DiskCache", "Entry", "model_identity", "clear_all", "default_dir"]
