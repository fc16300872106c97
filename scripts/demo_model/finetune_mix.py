"""A data folder for a short fine-tune that leans on some kinds of document (issue 35, V3_PLAN.md
section 19): whole documents of an encoded corpus (tokens.npy, mask.npy, docs.npy, in docs.jsonl's
order, as tokenizer.encode_corpus writes them), drawn by kind until each kind holds its share of
--tokens. A kind's documents are drawn without replacement while they last, so a share larger than
the kind repeats it whole before it repeats a document twice.

    python scripts/demo_model/finetune_mix.py --data artifacts/demo/v3h/data \
        --corpus artifacts/demo/v3h/corpus/docs.jsonl --shares tools=0.5,drill=0.2,rest=0.3 \
        --tokens 1500000 --out artifacts/demo/v3h/ft_data

"rest" is every kind not named. train_torch.py reads the folder as it reads a prepared one.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np


def parse_shares(text: str) -> dict[str, float]:
    shares = {}
    for part in text.split(","):
        kind, _, share = part.partition("=")
        if not share:
            raise SystemExit(f"--shares: '{part}' is not kind=share (e.g. tools=0.5,rest=0.5)")
        shares[kind.strip()] = float(share)
    if abs(sum(shares.values()) - 1) > 1e-6:
        raise SystemExit(f"--shares add up to {sum(shares.values()):.3f}, not 1")
    return shares


def draw(kinds: list[str], lengths: np.ndarray, shares: dict[str, float], total: int, rng) -> list[int]:
    """Document indices, in a random order, whose kinds hold their shares of `total` tokens."""
    chosen = []
    for group, share in shares.items():
        pool = np.array([i for i, k in enumerate(kinds)
                         if (k == group) or (group == "rest" and k not in shares)])
        if not len(pool):
            raise SystemExit(f"--shares names '{group}', which no document has (kinds: {sorted(set(kinds))})")
        want, got = share * total, 0
        while got < want:
            for i in rng.permutation(pool):
                if got >= want:
                    break
                chosen.append(int(i))
                got += int(lengths[i])
    return [chosen[i] for i in rng.permutation(len(chosen))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="an encoded corpus folder (tokens.npy, mask.npy, docs.npy)")
    ap.add_argument("--corpus", required=True, help="the docs.jsonl it was encoded from (each line's kind)")
    ap.add_argument("--shares", required=True, help="kind=share,...; 'rest' for the kinds not named")
    ap.add_argument("--tokens", type=int, required=True, help="tokens in the new folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    src, out = Path(a.data), Path(a.out)
    tokens, mask, starts = (np.load(src / f) for f in ("tokens.npy", "mask.npy", "docs.npy"))
    kinds = [json.loads(line)["kind"] for line in open(a.corpus)]
    if len(kinds) != len(starts):
        raise SystemExit(f"{a.corpus} has {len(kinds)} documents, {src}/docs.npy {len(starts)}: not the same corpus")
    lengths = np.diff(np.append(starts, len(tokens)))
    picked = draw(kinds, lengths, parse_shares(a.shares), a.tokens, np.random.default_rng(a.seed))

    out.mkdir(parents=True, exist_ok=True)
    pieces = [slice(int(starts[i]), int(starts[i] + lengths[i])) for i in picked]
    np.save(out / "tokens.npy", np.concatenate([tokens[p] for p in pieces]))
    np.save(out / "mask.npy", np.concatenate([mask[p] for p in pieces]))
    np.save(out / "docs.npy", np.cumsum([0] + [int(lengths[i]) for i in picked[:-1]]).astype(np.int64))
    for f in src.iterdir():   # the eval sets and tokenizer train_torch's probe reads, unchanged
        if f.suffix == ".json" and f.name not in ("data_info.json", "tokens_by_kind.json"):
            shutil.copy(f, out / f.name)
    by_kind: dict[str, int] = {}
    for i in picked:
        by_kind[kinds[i]] = by_kind.get(kinds[i], 0) + int(lengths[i])
    info = {"from": str(src), "shares": a.shares, "seed": a.seed, "tokens": int(sum(by_kind.values())),
            "docs": len(picked), "reply_tokens": int(sum(int((mask[p] == 1).sum()) for p in pieces)),
            "tokens_by_kind": dict(sorted(by_kind.items()))}
    (out / "data_info.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
