"""A rendered prompt encoded a piece at a time, the pieces kept for the next turn.

Why: an agent sends its whole conversation again every turn, and encoding it again took ~90 ms a
turn at 49k tokens on a 2-core CPU (the demo's tokenizer), twice a turn: the request's prompt, then
the reply's history snapshot (core.chat.history_prompt, on the server's event loop). A fast
tokenizer splits its text at added tokens before anything else, so a text cut just before an added
token encodes as its pieces do, one after the other: only the pieces not seen before are encoded
(core.chat._encodes_once checks that on each tokenizer once, on a conversation it renders).
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict

import numpy as np

MAX_TOKENS = 2_000_000   # kept per tokenizer (~24 bytes a token), least recently used pieces out first
_lock = threading.Lock()


def _cuts(tok) -> re.Pattern:
    """Where a piece ends: just before an added token that opens a line (a turn's opener, a tool
    call's tag), never inside one."""
    cut = getattr(tok, "_mtp_piece_cuts", None)
    if cut is None:
        added = sorted(tok._tokenizer.get_added_vocab(), key=len, reverse=True)
        cut = re.compile(r"(?<=\n)(?=" + "|".join(map(re.escape, added)) + ")") if added else re.compile(r"(?!)")
        tok._mtp_piece_cuts = cut
    return cut


class _Kept:
    """One tokenizer's pieces: text -> [3, n] int64 (ids, span starts, span ends), at most
    MAX_TOKENS tokens."""

    def __init__(self):
        self.pieces: "OrderedDict[str, np.ndarray]" = OrderedDict()
        self.tokens = 0

    def get(self, piece: str):
        got = self.pieces.get(piece)
        if got is not None:
            self.pieces.move_to_end(piece)
        return got

    def put(self, piece: str, got) -> None:
        if piece not in self.pieces:
            self.pieces[piece] = got
            self.tokens += got.shape[1]
        while self.tokens > MAX_TOKENS and len(self.pieces) > 1:
            self.tokens -= self.pieces.popitem(last=False)[1].shape[1]


def whole(tok, text: str) -> np.ndarray:
    """[3, n] int64: the ids, span starts and span ends of `text` encoded in one call."""
    enc = tok._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = enc["offset_mapping"]
    return np.array([enc["input_ids"], [a for a, _ in spans], [b for _, b in spans]], dtype=np.int64).reshape(3, -1)


def encode(tok, text: str) -> np.ndarray:
    """[3, n] int64: the ids, span starts and span ends of `text`, as `tok._tokenizer(text,
    add_special_tokens=False, return_offsets_mapping=True)` gives them, from the pieces between _cuts."""
    with _lock:
        kept = getattr(tok, "_mtp_pieces", None)
        if kept is None:
            kept = tok._mtp_pieces = _Kept()
    parts = []
    start = 0
    for end in [m.start() for m in _cuts(tok).finditer(text)] + [len(text)]:
        if end <= start:
            continue
        piece = text[start:end]
        with _lock:
            got = kept.get(piece)
        if got is None:
            got = whole(tok, piece)
            with _lock:
                kept.put(piece, got)
        parts.append(got + np.array([[0], [start], [start]], dtype=np.int64))
        start = end
    return np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)
