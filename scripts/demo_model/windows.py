"""Training windows for the demo model, in NumPy only (tests check them where torch is not
installed): whole documents packed into windows, and the loss weight of each token's kind."""
from __future__ import annotations

from pathlib import Path

import numpy as np

PAD = 0  # <|endoftext|>


def pack_windows(starts, n_tokens, size, rng, open_windows=16):
    """One epoch of windows of `size` tokens made of whole documents (a document longer than a
    window is cut at its end): documents in a random order, each into the fullest open window it
    fits (best fit among `open_windows`), so that conversations start at a window's start or right
    after another one's end, as they do at inference. Returns a list of windows, each a list of
    (start, length) pieces of the stream."""
    ends = np.append(starts[1:], n_tokens)
    order = rng.permutation(len(starts))
    wins, room, out = [], [], []
    for j in order:
        ln = int(min(ends[j] - starts[j], size))
        fit = [i for i, r in enumerate(room) if r >= ln]
        if fit:
            i = min(fit, key=lambda i: room[i])
        else:
            if len(wins) >= open_windows:
                i = int(np.argmin(room))
                out.append(wins.pop(i))
                room.pop(i)
            wins.append([])
            room.append(size)
            i = len(wins) - 1
        wins[i].append((int(starts[j]), ln))
        room[i] -= ln
    return out + wins


def packed_windows(data_dir, batch, seq, rng):
    """Batches of (ids [B, seq], loss weights [B, seq]) from whole documents packed into windows of
    seq tokens; weight 1 on what the model writes (replies, prose), `other_w` elsewhere (set by the
    caller through the mask), 0 on the padding of a window that documents did not fill and on what
    the mask marks read only (2)."""
    tokens = np.load(Path(data_dir) / "tokens.npy")
    mask = np.load(Path(data_dir) / "mask.npy")
    starts = np.load(Path(data_dir) / "docs.npy")
    epoch = 0
    while True:
        wins = pack_windows(starts, len(tokens), seq, rng)
        order = rng.permutation(len(wins))
        for b in range(0, len(order) - batch + 1, batch):
            ids = np.full((batch, seq), PAD, dtype=np.int64)
            w = np.zeros((batch, seq), dtype=np.uint8)   # 0 pad, 1 context, 2 written, 3 read only (mask 2)
            for r, k in enumerate(order[b: b + batch]):
                at = 0
                for s, ln in wins[k]:
                    ids[r, at: at + ln] = tokens[s: s + ln]
                    w[r, at: at + ln] = 1 + mask[s: s + ln]
                    at += ln
            yield ids, w, epoch
        epoch += 1


def loss_weights(other_w):
    """The loss weight of each index packed_windows yields: pad, context, written, read only."""
    return [0.0, float(other_w), 1.0, 0.0]
