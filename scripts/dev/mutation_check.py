"""Do the tests catch a broken engine? Apply deliberate bugs to a copy and run the tests.

Each mutant is one textual change to a temporary copy of the repository (the working tree as it
is, uncommitted changes included) and the tests that should notice it. The script first runs all
those tests on the unmutated copy (a control: they must pass there), then each mutant's tests on
its own copy, and prints a table: mutant, the tests that failed, seconds. Exit status 0 only when
every mutant was caught.

    .venv/bin/python scripts/dev/mutation_check.py                 # every mutant
    .venv/bin/python scripts/dev/mutation_check.py --only residual  # mutants whose name contains it
    .venv/bin/python scripts/dev/mutation_check.py --json docs/bench/mutation-check.json

A mutant whose site is not found (the code moved) is an error, not a pass: update its `old` text.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

REPO = Path(__file__).resolve().parents[2]

EXACT = "tests/test_acceptance_exact.py"
SAMPLED = "tests/test_engine_exactness.py::test_sampled_mtp_follows_the_exact_distribution_inside_the_first_cycle"
GREEDY = "tests/test_engine_exactness.py::test_greedy_mtp_is_token_identical_to_ar"
TEACHER = "tests/test_engine_exactness.py::test_caches_after_speculation_equal_teacher_forced_ones"
ROLLBACK = "tests/test_adapter_forward.py::test_rollback_equals_a_run_that_never_speculated"
STATE = "tests/test_prefix_state.py"
PREFIX = "tests/test_prefix_cache.py::test_greedy_replies_identical_with_and_without_the_cache"
SHARED = "tests/test_race_truth.py::test_two_lanes_restored_from_one_snapshot_do_not_write_into_each_other"
C_GREEDY = "tests/test_constraints.py::test_greedy_constrained_mtp_is_token_identical_to_constrained_ar"
C_SAMPLED = "tests/test_constraints.py::test_sampled_constrained_mtp_follows_the_constrained_distribution"
LOGPROBS = "tests/test_logprobs.py::test_emitted_logprobs_are_the_targets_raw_distribution_in_both_lanes"
G_STEP = "tests/test_gemma4.py::test_the_draft_step_is_the_published_one"
G_ROLLBACK = "tests/test_gemma4.py::test_rollback_keeps_exactly_the_verified_prefix"
G_RESIDUAL = "tests/test_gemma4.py::test_a_token_outside_the_drafters_clusters_is_reached_through_the_residual"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: Tuple[str, ...]


MUTANTS: List[Mutant] = [
    Mutant("one accept decision for every draft of the cycle", "core/acceptance.py",
           "accepted = mx.random.uniform(shape=(D,), key=keys[0]) < acceptance_probability(p, q, drafts)",
           "accepted = mx.broadcast_to((mx.random.uniform(shape=(D,), key=keys[0])"
           " < acceptance_probability(p, q, drafts))[:1], (D,))",
           (SAMPLED,)),
    Mutant("correction drawn from p instead of the residual", "core/acceptance.py",
           "return (None if p_idx is None else p_idx[:D]), residual(p[:D], q_on_p)",
           "return (None if p_idx is None else p_idx[:D]), p[:D]",
           (EXACT, SAMPLED)),
    Mutant("acceptance ratio inverted (q/p)", "core/acceptance.py",
           "return mx.minimum(p_x / q_x, 1.0)", "return mx.minimum(q_x / p_x, 1.0)",
           (EXACT, SAMPLED)),
    Mutant("bonus drawn from the last draft's row", "core/acceptance.py",
           "return (None if p_idx is None else p_idx[D:]), p[D:]",
           "return (None if p_idx is None else p_idx[D - 1 : D]), p[D - 1 : D]",
           (EXACT, SAMPLED)),
    Mutant("off-by-one rollback of the attention KV", "adapters/qwen3_5/adapter.py",
           "c.trim(drop)", "c.trim(drop - 1)",
           (ROLLBACK, GREEDY, TEACHER)),
    Mutant("rollback keeps the wrong recurrent state", "adapters/qwen3_5/adapter.py",
           "c[1] = states[keep - 1]", "c[1] = states[min(keep, len(states) - 1)]",
           (ROLLBACK, GREEDY, TEACHER)),
    Mutant("the head keeps its own drafts' entries", "adapters/qwen3_5/adapter.py",
           "draft.trim(steps - 1)", "draft.trim(max(steps - 2, 0))",
           (TEACHER,)),
    Mutant("head history restored one entry short", "adapters/qwen3_5/adapter.py",
           'draft.keys, draft.values, draft.offset = _own(a.get("draft.keys")), _own(a.get("draft.values")), meta["draft.keys.length"]',
           'draft.keys, draft.values, draft.offset = _own(a.get("draft.keys")), _own(a.get("draft.values")), meta["draft.keys.length"] - 1',
           (STATE, PREFIX)),
    Mutant("head history dropped on restore", "adapters/qwen3_5/adapter.py",
           'draft.keys, draft.values, draft.offset = _own(a.get("draft.keys")), _own(a.get("draft.values")), meta["draft.keys.length"]',
           "pass",
           (STATE, PREFIX)),
    Mutant("snapshot stored under the wrong key", "core/stream.py",
           "prefix_cache.store(Snapshot(tuple(key[:b]), adapter.snapshot(cache, draft), h_last))",
           "prefix_cache.store(Snapshot(tuple(key[:b - 1]), adapter.snapshot(cache, draft), h_last))",
           (STATE, PREFIX)),
    Mutant("restored caches share the snapshot's KV array objects", "adapters/qwen3_5/adapter.py",
           'c.keys, c.values, c.offset = _own(a.get(f"trunk.{i}.keys")), _own(a.get(f"trunk.{i}.values")), meta[f"trunk.{i}.keys.length"]',
           'c.keys, c.values, c.offset = a.get(f"trunk.{i}.keys"), a.get(f"trunk.{i}.values"), meta[f"trunk.{i}.keys.length"]',
           (SHARED,)),
    Mutant("prefill feeds the head the wrong tokens", "core/stream.py",
           "adapter.absorb(draft, cache, hs, tokens[None, b - hs.shape[1] : b])",
           "adapter.absorb(draft, cache, hs, tokens[None, b - hs.shape[1] - 1 : b - 1])",
           (TEACHER, STATE)),
    Mutant("verify row i masked with the grammar before draft i", "core/decoders.py",
           "allowed = None if c is None else mx.stack(masks)",
           "allowed = None if c is None else mx.stack(masks[:1] + masks[:-1])",
           (C_GREEDY, C_SAMPLED)),
    Mutant("the grammar not rolled back past rejected drafts", "core/decoders.py",
           "c.rollback(depth - n)", "c.rollback(0)",
           (C_GREEDY, C_SAMPLED)),
    Mutant("MTP logprobs read from the next verify row", "core/decoders.py",
           'yield tokens, ["draft"] * n + ["bonus" if n == depth else "correction"], logits[0, : n + 1]',
           'yield tokens, ["draft"] * n + ["bonus" if n == depth else "correction"], logits[0, 1 : n + 2]',
           (LOGPROBS,)),
    Mutant("Gemma 4 drafter queries at the last cached position (mlx-vlm's)", "adapters/gemma4/adapter.py",
           "position = cache[0].offset", "position = cache[0].offset - 1", (G_STEP,)),
    Mutant("Gemma 4 drafter sees one key too many on the sliding layer", "adapters/gemma4/sliding.py",
           "first = max(0, query_position - self.window + 1)", "first = max(0, query_position - self.window)",
           (G_STEP,)),
    Mutant("Gemma 4 drafter input embedding unscaled", "adapters/gemma4/adapter.py",
           "emb = self.inner.embed_tokens(tokens[:, -1:]) * self.inner.embed_scale",
           "emb = self.inner.embed_tokens(tokens[:, -1:])", (G_STEP,)),
    Mutant("Gemma 4 rollback keeps one rejected position", "adapters/gemma4/adapter.py",
           "c.trim(drop)", "c.trim(drop - 1)", (G_ROLLBACK,)),
    Mutant("Gemma 4 centroid head leaves unscored tokens a draft probability", "adapters/gemma4/drafter.py",
           "NEG = -1e9", "NEG = -5.0", (G_RESIDUAL, G_STEP)),
    Mutant("AR logprobs read from the next step's row", "core/decoders.py",
           "yield [token], [\"target\"], row", "yield [token], [\"target\"], next_row",
           (LOGPROBS,)),
]


def copy_repo(dst: Path) -> None:
    """The working tree as it is (tracked and untracked files git does not ignore)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def apply(root: Path, m: Mutant) -> None:
    path = root / m.path
    text = path.read_text()
    count = text.count(m.old)
    if count != 1:
        raise SystemExit(f"mutant '{m.name}': expected its site once in {m.path}, found it {count} times "
                         f"(the code moved: update MUTANTS)\n  site: {m.old}")
    path.write_text(text.replace(m.old, m.new))


def run_tests(root: Path, tests, python: str) -> Tuple[List[str], float, str]:
    """(failed test ids, seconds, output tail)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    out = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *tests],
                         cwd=root, env=env, capture_output=True, text=True)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out.stdout, re.M)))
    if out.returncode != 0 and not failed:
        failed = [f"pytest exit {out.returncode}"]
    return failed, time.perf_counter() - t0, out.stdout[-3000:]


def check_imports_from(root: Path, python: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(root)}
    where = subprocess.run([python, "-c", "import core.acceptance as a; print(a.__file__)"], cwd=root, env=env,
                           capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(root)):
        raise SystemExit(f"the copy's tests would import the engine from {where}, not from the copy {root}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="run the mutants whose name contains this text")
    ap.add_argument("--no-control", action="store_true", help="skip the run on the unmutated copy")
    ap.add_argument("--json", help="also write the table as JSON here")
    args = ap.parse_args()
    python = sys.executable
    mutants = [m for m in MUTANTS if not args.only or args.only in m.name]
    if not mutants:
        raise SystemExit(f"no mutant's name contains {args.only!r}")
    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        base = Path(tmp) / "base"
        copy_repo(base)
        check_imports_from(base, python)
        for m in mutants:  # every site must exist before anything runs
            apply_to = Path(tmp) / "probe"
            shutil.copytree(base, apply_to, dirs_exist_ok=True)
            apply(apply_to, m)
            shutil.rmtree(apply_to)
        if not args.no_control:
            tests = sorted({t for m in mutants for t in m.tests})
            failed, secs, tail = run_tests(base, tests, python)
            print(f"control (no mutation): {len(tests)} test targets, {secs:.0f} s, "
                  f"{'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}", flush=True)
            if failed:
                print(tail)
                return 2
        for m in mutants:
            root = Path(tmp) / "mutant"
            if root.exists():
                shutil.rmtree(root)
            shutil.copytree(base, root)
            apply(root, m)
            failed, secs, _ = run_tests(root, m.tests, python)
            caught = bool(failed)
            ok &= caught
            rows.append({"mutant": m.name, "file": m.path, "caught": caught, "failed": failed, "seconds": round(secs, 1)})
            print(f"{'caught ' if caught else 'MISSED '} {m.name}: {len(failed)} failed in {secs:.0f} s", flush=True)
    print("\n| mutant | caught | tests that failed | seconds |\n|---|---|---|---|")
    for r in rows:
        names = "<br>".join(f.split("tests/")[-1] for f in r["failed"]) or "—"
        print(f"| {r['mutant']} (`{r['file']}`) | {'yes' if r['caught'] else '**no**'} | {names} | {r['seconds']:.0f} |")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        Path(args.json).write_text(json.dumps({"commit": commit, "mutants": rows}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
