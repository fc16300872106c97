"""Prefix-cache snapshots on disk, so that a restart does not cost the next turn a full prefill.

An entry is one safetensors file: the snapshot's arrays (only the part that holds data) plus,
in the file's metadata, the prompt token ids it covers, the family's small facts, the model's
identity and a checksum over all of it. Files live in one folder per model identity (a hash of
the checkpoint's config, its weight files' headers, the tokenizer and the compute dtype), so a
different checkpoint never reads another's entries, and each file says whose it is as well.

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
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

log = logging.getLogger("mtp_chat.disk_cache")

FORMAT = "mtp-chat-prefix-v1"
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


def _checksum(ids_text: str, meta_text: str, arrays: Dict[str, np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=20)
    h.update(ids_text.encode() + b"\0" + meta_text.encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(b"\0" + name.encode() + b"\0" + str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.view(np.uint8).reshape(-1).data)
    return h.hexdigest()


def _as_numpy(a: mx.array) -> np.ndarray:
    # numpy has no bfloat16: hash such arrays through their raw 16-bit pattern
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16))
    return np.array(a)


@dataclass
class Entry:
    ids: Tuple[int, ...]
    path: Path
    nbytes: int
    used: float  # last use (file mtime), for LRU and the TTL


class DiskCache:
    """Snapshots of one model on disk: store, find the longest stored prefix, load, evict.

    Thread-safe. `store` may run on a background thread (the arrays it gets must be evaluated);
    `load` returns the arrays as MLX arrays read from the file."""

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
        """Write one snapshot (arrays evaluated, holding only valid data); False if not written."""
        ids = tuple(int(t) for t in ids)
        if not self.writable or ids in self._entries:
            return False
        size = sum(a.nbytes for a in arrays.values())
        if size > self.budget_bytes:
            if not self._said_too_big:
                self._said_too_big = True
                self.say(f"prefix cache on disk: a snapshot of {size / 2**20:.1f} MiB is larger than the whole "
                         f"budget ({self.budget_bytes / 2**20:.1f} MiB); such snapshots stay in memory only")
            return False
        ids_text, meta_text = _ids_text(ids), json.dumps(meta, sort_keys=True)
        checksum = _checksum(ids_text, meta_text, {k: _as_numpy(v) for k, v in arrays.items()})
        stem = hashlib.sha256(ids_text.encode()).hexdigest()[:32]
        final = self.dir / (stem + SUFFIX)
        tmp = self.dir / f"{stem}.{os.getpid()}.{threading.get_ident()}{TMP}"
        metadata = {"format": FORMAT, "model": self.identity, "ids": ids_text, "meta": meta_text,
                    "checksum": checksum, "created": str(time.time())}
        try:
            mx.save_safetensors(str(tmp), arrays, metadata=metadata)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
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
    def load(self, entry: Entry) -> Optional[Tuple[Tuple[int, ...], Dict[str, mx.array], dict]]:
        """(ids, arrays, meta) of an entry, or None (and the entry removed) if it fails its checks."""
        try:
            arrays, metadata = mx.load(str(entry.path), return_metadata=True)
            if metadata.get("format") != FORMAT or metadata.get("model") != self.identity:
                raise Refused("written for another model or format")
            if _ids_from(metadata["ids"]) != entry.ids:
                raise Refused("its ids do not match its index entry")
            mx.eval(arrays)
            if _checksum(metadata["ids"], metadata["meta"], {k: _as_numpy(v) for k, v in arrays.items()}) \
                    != metadata.get("checksum"):
                raise Refused("checksum mismatch (corrupted)")
            meta = json.loads(metadata["meta"])
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
        self.hits += 1
        return entry.ids, arrays, meta

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
