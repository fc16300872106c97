"""Two demo models' answers to the same held-out everyday questions, side by side (issue 35).

Reads two judge.py reports (the same held-out items, each answered greedily with thinking off)
and writes a Markdown page: per question, each model's reply and the judge's verdict with its
reason, so a reader can judge the judge too. The questions are the first `per_category` of each
category in the items' order (heldout_everyday.jsonl is seeded), so the choice is not by result.

    python scripts/demo_model/side_by_side.py docs/bench/2026-12-02/demo-v2-judge.json \
        docs/bench/<date>/demo-v3-judge.json --names v2 v3 --out docs/demo-v2-vs-v3.md
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def pick(rows_a, rows_b, per_category: int = 4):
    """The first `per_category` questions of each category that both reports answered."""
    by_id = {r["id"]: r for r in rows_b}
    seen, out = {}, []
    for r in rows_a:
        if r["id"] in by_id and seen.get(r["category"], 0) < per_category:
            seen[r["category"]] = seen.get(r["category"], 0) + 1
            out.append((r, by_id[r["id"]]))
    return out


def cell(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= limit else text[:limit] + " ..."
    return text.replace("|", "\\|") or "*(empty)*"


def verdict(row) -> str:
    return ("right" if row["right"] else "wrong") + f" ({cell(row['why'], 80)})"


def render(a: dict, b: dict, names=("A", "B"), per_category: int = 4, note: str = "") -> str:
    pairs = pick(a["rows"], b["rows"], per_category)
    right = [sum(x["right"] for x, _ in pairs), sum(y["right"] for _, y in pairs)]
    lines = [f"# {names[0]} and {names[1]} of the demo model on held-out everyday questions", "",
             f"{len(pairs)} questions held out of both models' training (`scripts/demo_model/heldout_everyday.jsonl`, "
             f"the first {per_category} of each category), each asked greedily with thinking off "
             "(`scripts/demo_model/judge.py`; its verdict and reason beside each reply). "
             f"Right here: {names[0]} {right[0]}/{len(pairs)}, {names[1]} {right[1]}/{len(pairs)}; "
             f"on all {a['questions']} held-out questions: {names[0]} {a['right']}/{a['questions']}, "
             f"{names[1]} {b['right']}/{b['questions']}.", "",
             f"Reports: `{a.get('source', '')}`, `{b.get('source', '')}`.", "", *([note, ""] if note else []),
             f"| question | {names[0]} | {names[1]} |", "|---|---|---|"]
    for x, y in pairs:
        lines.append(f"| {cell(x['question'], 120)} | {cell(x['reply'])}<br>**{verdict(x)}** "
                     f"| {cell(y['reply'])}<br>**{verdict(y)}** |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--names", nargs=2, default=["v2", "v3"])
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--note", default="", help="a paragraph under the header (which models these are)")
    ap.add_argument("--out", required=True)
    o = ap.parse_args()
    reports = []
    for p in (o.a, o.b):
        r = json.loads(Path(p).read_text())
        r["source"] = p
        reports.append(r)
    Path(o.out).write_text(render(*reports, names=o.names, per_category=o.per_category, note=o.note))
    print(f"wrote {o.out}")


if __name__ == "__main__":
    main()
