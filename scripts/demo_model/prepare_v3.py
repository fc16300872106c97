"""Prepare demo v3's GPU call here, on the CPU (issue 35; V3_PLAN.md): corpus -> tokens -> the
carried folder that gpu_v3.sh reads.

    python scripts/demo_model/prepare_v3.py                       # all three steps
    python scripts/demo_model/prepare_v3.py --steps carry         # only re-pack the carried folder
    python scripts/demo_model/prepare_v3.py --init artifacts/demo/v3/V3.q8.safetensors   # v3b: resume from V3
    python scripts/demo_model/prepare_v3.py --variant v3d         # v3d: the focused notes -> artifacts/demo/v3d
    python scripts/demo_model/prepare_v3.py --variant v3e         # v3e: + binding drills, tools back -> artifacts/demo/v3e
    python scripts/demo_model/prepare_v3.py --variant v3g         # v3g: v3f + explained answers, real-word tool names
    python scripts/demo_model/prepare_v3.py --variant v3h         # v3h: v3g + other senses in tool results, span drills

  corpus   conversations_v3.build -> artifacts/demo/v3/corpus (seed 35; ~2 min on 2 cores)
  data     the corpus tokenised with models/demo's tokenizer (v2's 8,192 ids, its chat template: the
           export then ships the same tokenizer files, and v2 and v3 compare token for token) ->
           artifacts/demo/v3/data (tokenizer.encode_corpus: tokens, mask, doc starts, eval prompts)
  check    after the corpus or data step: check_v3.py's checks of the variant; any problem stops here
  carry    artifacts/demo/v3/carry/ (git-ignored; the device run names it in `carry`): scripts/ (this folder's *.py and
           configs/, gpu_v3.sh), data.tar.xz, tokenizer/, and with --init the weights to resume from
           (init.q8.safetensors: a run's shards packed int8 per row, as a call brings them back);
           prints the sizes (a call carries at most 64 MiB with the repository)
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
WORK = REPO / "artifacts" / "demo" / "v3"
CARRY = WORK / "carry"  # under artifacts/ (git-ignored): a run carries it by name
# each variant's own folder (v3c keeps V3's: artifacts/demo/v3), so preparing one leaves the other
WORKS = {"v3c": WORK, **{v: REPO / "artifacts" / "demo" / v for v in
                         ("v3d", "v3e", "v3f", "v3g", "v3h", "v3i", "v3j", "v3k", "v3l", "v3m", "v3n")}}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def size_mib(p: Path) -> float:
    return round(sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file()) / 2**20, 2) if p.is_dir() \
        else round(p.stat().st_size / 2**20, 2)


def tokens_by_kind(corpus_dir, data_dir):
    """Tokens (each document's end token included) by document kind, from docs.jsonl's order and
    docs.npy's starts: {kind: tokens}, "notes" (all note_* kinds) and "notes_share"."""
    import numpy as np

    kinds = [json.loads(l)["kind"] for l in open(Path(corpus_dir) / "docs.jsonl")]
    starts = np.load(Path(data_dir) / "docs.npy")
    n = len(np.load(Path(data_dir) / "tokens.npy", mmap_mode="r"))
    lens = np.diff(np.append(starts, n))
    out = {}
    for k, l in zip(kinds, lens):
        out[k] = out.get(k, 0) + int(l)
    out = dict(sorted(out.items()))
    out["total"] = int(n)
    out["notes"] = sum(v for k, v in out.items() if k.startswith("note_"))
    out["notes_share"] = round(out["notes"] / n, 4)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", nargs="+", default=["corpus", "data", "carry"], choices=["corpus", "data", "carry"])
    ap.add_argument("--work", default=str(WORK))
    ap.add_argument("--carry", default=str(CARRY))
    ap.add_argument("--init", default=None, help="a packed run (shards_q8.py pack) to resume training from")
    ap.add_argument("--variant", default="v3c", choices=sorted(WORKS),
                    help="v3c: V3's corpus with notes of ~15k facts (artifacts/demo/v3); v3d: the focused notes "
                         "(artifacts/demo/v3d, carried as artifacts/demo/v3d/carry); v3e: v3d's notes (fewer statements), "
                         "binding and copying drills, the tool conversations back (artifacts/demo/v3e); v3f: v3e with more tool "
                         "conversations whose thoughts list the offered tools (artifacts/demo/v3f); v3g: v3f with explained "
                         "answers of 3-5 sentences and tool names of real words to copy (artifacts/demo/v3g); v3h: v3g with "
                         "other senses as dictionary results and whole glosses to copy back (artifacts/demo/v3h)")
    a = ap.parse_args()
    if a.variant != "v3c":  # the variant's own folders unless named
        a.work = str(WORKS[a.variant]) if a.work == str(WORK) else a.work
        a.carry = str(Path(a.work) / "carry") if a.carry == str(CARRY) else a.carry
    work, carry = Path(a.work), Path(a.carry)
    tok_dir = work / "tokenizer"
    if "corpus" in a.steps:
        import conversations_v3
        import corpus

        if corpus.missing_sources():
            sys.exit(f"the corpus's sources are not all here; install them first: {corpus.missing_sources()}")

        conversations_v3.build(work / "corpus", variant=a.variant)
    if "data" in a.steps:
        import tokenizer

        tok_dir.mkdir(parents=True, exist_ok=True)
        for fn in TOKENIZER_FILES:
            shutil.copy(REPO / "models" / "demo" / fn, tok_dir / fn)
        tokenizer.as_the_app_tokenizes(tok_dir)   # v2's ids, encoded as the app encodes them
        tokenizer.encode_corpus(work / "corpus", tok_dir, work / "data")
        by_kind = tokens_by_kind(work / "corpus", work / "data")
        (work / "data" / "tokens_by_kind.json").write_text(json.dumps(by_kind, indent=1))
        print("tokens by kind:", json.dumps(by_kind))
    if {"corpus", "data"} & set(a.steps):
        import check_v3

        problems = check_v3.CHECKS[a.variant](work)
        print("checks:", "\n".join(problems[:50]) or "the corpus is fit to train")
        if problems:
            raise SystemExit(f"{len(problems)} problems in the prepared {a.variant} (scripts/demo_model/check_v3.py)")
    if "carry" in a.steps:
        if carry.exists():
            shutil.rmtree(carry)
        (carry / "scripts" / "configs").mkdir(parents=True)
        for f in list(HERE.glob("*.py")) + [HERE / "gpu_v3.sh"]:
            shutil.copy(f, carry / "scripts" / f.name)
        for f in (HERE / "configs").glob("*.json"):
            shutil.copy(f, carry / "scripts" / "configs" / f.name)
        shutil.copytree(tok_dir, carry / "tokenizer")
        if a.init:
            shutil.copy(a.init, carry / "init.q8.safetensors")
        subprocess.run(["tar", "cJf", str(carry / "data.tar.xz"), "-C", str(work / "data"), "."], check=True,
                       env={"XZ_OPT": "-6 -T2", "PATH": "/usr/bin:/bin"})
        sizes = {p.name: size_mib(p) for p in sorted(carry.iterdir())}
        sizes["total"] = size_mib(carry)
        print(json.dumps({"carry": str(carry), "MiB": sizes,
                          "data": json.loads((work / "data" / "data_info.json").read_text())}, indent=1))


if __name__ == "__main__":
    main()
