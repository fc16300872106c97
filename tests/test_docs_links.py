"""Every relative link in README.md and docs/*.md leads somewhere: the file (or folder) exists and,
when the link names an anchor, the page has a heading with that anchor (GitHub's rule: lower case,
punctuation dropped, spaces to hyphens, "-1", "-2" ... for repeats). Links inside code are not
links; web addresses are not checked (the tests run offline)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def pages(root: Path = REPO):
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _prose(text: str):
    """(line number, line) outside fenced code blocks, inline code removed."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`+[^`]*`+", "", line)


def slug(heading: str) -> str:
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    seen, out = {}, set()
    for _, line in _prose(page.read_text()):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path, root: Path = REPO) -> list:
    """'file:line: target (why)' for each relative link of `page` that leads nowhere."""
    out = []
    for n, line in _prose(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}:{n}: {target}"
            if not dest.exists():
                out.append(f"{where} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                out.append(f"{where} (no heading with that anchor)")
    return out


def test_every_relative_link_in_the_readme_and_docs_resolves():
    found = [b for p in pages() for b in broken_links(p)]
    assert not found, "\n".join(found)


def test_the_pages_do_link_to_each_other():
    # a regex that found no links would pass the test above: count what it reads
    links = [t for p in pages() for _, line in _prose(p.read_text()) for t in LINK.findall(line)]
    assert sum("#" in t for t in links) >= 10 and sum(t.endswith(".md") for t in links) >= 10
    readme = {t for _, line in _prose((REPO / "README.md").read_text()) for t in LINK.findall(line)}
    for p in pages()[1:]:
        assert f"docs/{p.name}" in readme, f"README.md does not link to docs/{p.name}"


def test_slugs_follow_githubs_rule():
    assert slug("Use it from Claude Code / Codex / agents") == "use-it-from-claude-code--codex--agents"
    assert slug("Using a real checkpoint (Qwythos, Qwen3.5, Qwen3.6-MoE, Qwen3-Next)") == \
        "using-a-real-checkpoint-qwythos-qwen35-qwen36-moe-qwen3-next"
    assert slug("API (`gradio_client`)") == "api-gradio_client"


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Twice\n\n## Twice\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok too](docs/a.md#twice-1) [ok, here](#top) ![picture](docs/none.png)\n"
        "# Top\n"
        "[gone](docs/b.md) [no anchor](docs/a.md#three) [web](https://example.com/x.md)\n"
        "`[in code](docs/c.md)`\n```\n[in a block](docs/d.md)\n```\n")
    assert broken_links(tmp_path / "README.md", tmp_path) == [
        "README.md:1: docs/none.png (no such file)",
        "README.md:3: docs/b.md (no such file)",
        "README.md:3: docs/a.md#three (no heading with that anchor)",
    ]
