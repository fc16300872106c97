"""The layering the style guide asks for, checked on the source: no import cycle inside a
package, core imports no model family, and a family's package imports no other layer above it."""
import ast
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def parse(f: Path) -> ast.AST:
    with warnings.catch_warnings():  # a regex's "\\<" in some file is not this test's business
        warnings.simplefilter("ignore")
        return ast.parse(f.read_text())


def imports(package: str):
    """module -> the modules of the same package it imports (at any depth of the file)."""
    graph = {}
    for f in sorted((REPO / package).rglob("*.py")):
        rel = f.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        pkg = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(parse(f)):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from . import x` imports the submodule x, not the package that holds it
                targets = ([target] if node.module else []) + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t.split(".")[0] == package.split("/")[0]}
        graph[name] = found
    return graph


def cycles(graph):
    """Strongly connected groups of more than one module (or a module importing itself)."""
    modules = set(graph)
    edges = {m: {t for t in graph[m] if t in modules and t != m} for m in modules}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("package", ["core", "webapp", "adapters"])
def test_no_import_cycle(package):
    graph = imports(package)
    # a package's __init__ importing its own modules is how it exports them, not a cycle of logic
    for name in graph:
        graph[name] = {t for t in graph[name] if t != package and not (name == package)}
    assert cycles(graph) == []


def test_core_imports_no_family_and_nothing_above_it():
    for f in (REPO / "core").rglob("*.py"):
        for node in ast.walk(parse(f)):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for n in names:
                assert n.split(".")[0] not in ("adapters", "webapp", "scripts"), f"{f.name} imports {n}"


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
