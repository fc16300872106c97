"""No import cycles and no upward arrows, checked on the source (docs/architecture.md).

The graph is read with `ast` from every .py file under core/, adapters/, webapp/ and scripts/,
found by walking the folders (so it holds for any layout of the packages). An edge is an import
anywhere in a file (module level or inside a function; a function-level import that closes a
circle is a circle that only hides until that function runs). `from pkg import name` points at
the submodule pkg.name when there is one, else at pkg; relative imports are resolved; a file
under scripts/ is run as a script with its own folder on sys.path, so its bare `import corpus`
points at the sibling corpus.py. Imports under `if TYPE_CHECKING:` never run and are left out.

The same functions read a tiny package written to tmp_path with a circle in it, to show that a
circle would be found and named.
"""
import ast
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "adapters", "webapp", "scripts")
SCRIPT_ROOTS = ("scripts",)  # files run as scripts: a bare import may name a sibling file

# Who may not import whom: module-name prefix -> prefixes it must not import.
FORBIDDEN = {
    "core": ("adapters", "webapp", "scripts"),  # core never imports a family, nor anything above it
    "adapters": ("webapp", "scripts"),
    "webapp": ("scripts",),
    # the script packages, as their __init__ docstrings say
    "scripts.checkpoints": ("webapp", "scripts.bench", "scripts.gpu", "scripts.demo_model", "scripts.dev"),
    "scripts.gpu": ("webapp", "scripts.bench", "scripts.demo_model", "scripts.dev"),
    "scripts.bench": ("scripts.gpu", "scripts.demo_model", "scripts.dev"),
    "scripts.demo_model": ("scripts.bench", "scripts.gpu", "scripts.dev"),
    "scripts.dev": ("core", "adapters", "webapp", "scripts.bench", "scripts.gpu", "scripts.checkpoints",
                    "scripts.demo_model"),
}


def discover(root: Path, packages) -> dict:
    """module name -> file, for every .py under each package's folder."""
    modules = {}
    for package in packages:
        for f in sorted((root / package).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = f
    return modules


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom in the tree, at any depth, except under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        # imports are statements: follow only the statement lists (bodies, branches, handlers),
        # not the expressions, which is most of a tree
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                stack.extend(block)


def _known(name: str, modules) -> str | None:
    """The deepest module of `name`'s dotted prefixes that is one of ours."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def imports_of(name: str, path: Path, modules: dict, script_roots=SCRIPT_ROOTS) -> set:
    """The modules of ours that module `name` (file `path`) imports."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    as_script = name.split(".")[0] in script_roots

    def resolve(target: str) -> str | None:
        found = _known(target, modules)
        if found is None and as_script and package:
            found = _known(f"{package}.{target}", modules)  # the script's folder is on sys.path
        return found

    with warnings.catch_warnings():  # a regex's "\<" in some file is not this test's business
        warnings.simplefilter("ignore")
        tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import name` imports the submodule pkg.name when there is one
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules
                       or (as_script and not node.level and f"{package}.{module}.{a.name}" in modules)
                       else module for a in node.names]
        for t in targets:
            found = resolve(t)
            if found is not None and found != name:
                out.add(found)
    return out


def import_graph(root: Path, packages=PACKAGES, script_roots=SCRIPT_ROOTS) -> dict:
    modules = discover(root, packages)
    return {name: imports_of(name, f, modules, script_roots) for name, f in modules.items()}


def cycles(graph: dict) -> list:
    """Each strongly connected group of more than one module, as one circle through it
    (['a', 'b', 'c', 'a']), found with Tarjan's algorithm."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(_circle(graph, group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def _circle(graph: dict, group: set) -> list:
    """A shortest circle through the group's first module, staying inside the group."""
    start = min(group)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & group):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    raise AssertionError(f"no circle through {start} in {sorted(group)}")


def upward_arrows(graph: dict, forbidden=FORBIDDEN) -> list:
    """(importer, imported) for every import that `forbidden` rules out."""
    def under(module, prefix):
        return module == prefix or module.startswith(prefix + ".")

    return sorted((m, t) for m, targets in graph.items() for t in targets
                  for low, highs in forbidden.items() if under(m, low)
                  for high in highs if under(t, high))


def _describe(found) -> str:
    return "\n".join(" -> ".join(c) for c in found)


# --- the repository ----------------------------------------------------------------------------

GRAPH = import_graph(REPO)


def test_the_graph_reads_every_package_and_its_imports():
    # an empty graph would pass every check below: make sure the reader sees real arrows
    for package in PACKAGES:
        assert any(m.split(".")[0] == package for m in GRAPH), package
    arrows = {(m.split(".")[0], t.split(".")[0]) for m, ts in GRAPH.items() for t in ts}
    assert {("webapp", "core"), ("adapters", "core"), ("scripts", "adapters")} <= arrows
    # relative, function-level and bare sibling imports, one each
    assert "core.acceptance" in GRAPH["core.decoders"]
    assert "scripts.checkpoints.tiny_gemma4" in GRAPH["scripts.checkpoints.make_tiny_checkpoint"]
    assert "scripts.demo_model.probe" in GRAPH["scripts.demo_model.train_torch"]


def test_no_import_cycle():
    found = cycles(GRAPH)
    assert not found, "import circles:\n" + _describe(found)


def test_no_upward_arrow():
    """core imports no family and nothing from webapp; adapters nothing from webapp; nothing in
    core, adapters or webapp imports scripts; the script packages keep to their own rules."""
    found = upward_arrows(GRAPH)
    assert not found, "\n".join(f"{m} imports {t}" for m, t in found)


# --- the checks can fail -----------------------------------------------------------------------

def _write(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_circle_is_found_and_named(tmp_path):
    # a -> b by a relative import, b -> c inside a function, c -> a by `from pkg import a`
    root = _write(tmp_path, {
        "pkg/__init__.py": "from . import a\n",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def later():\n    from pkg.c import helper\n    return helper\n",
        "pkg/c.py": "from pkg import a\nhelper = 1\n",
        "pkg/d.py": "import pkg.a\n",  # into the circle, not part of it
        "pkg/sub/__init__.py": "",
        "pkg/sub/e.py": "from .. import d\nfrom ..c import helper\n",
    })
    graph = import_graph(root, ("pkg",), script_roots=())
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.c"] == {"pkg.a"}  # the submodule a, not the package pkg
    assert graph["pkg.sub.e"] == {"pkg.d", "pkg.c"}
    assert graph["pkg"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    # the test above would report it
    assert _describe(cycles(graph)) == "pkg.a -> pkg.b -> pkg.c -> pkg.a"


def test_a_circle_between_sibling_scripts_is_found(tmp_path):
    # scripts run as files import each other by bare name: probe <-> train, as once in demo_model/
    root = _write(tmp_path, {
        "tools/run/probe.py": "from train import EOS\n",
        "tools/run/train.py": "def main():\n    from probe import probe\n",
        "tools/run/loops.py": "import json\nimport probe\n",
    })
    graph = import_graph(root, ("tools",), script_roots=("tools",))
    assert cycles(graph) == [["tools.run.probe", "tools.run.train", "tools.run.probe"]]
    assert graph["tools.run.loops"] == {"tools.run.probe"}  # json is not ours
    # outside the script folders a bare name is a top-level module, never a sibling
    assert cycles(import_graph(root, ("tools",), script_roots=())) == []


def test_type_checking_imports_are_not_arrows(tmp_path):
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\nelse:\n    pass\n",
        "pkg/b.py": "from pkg import a\n",
    })
    assert cycles(import_graph(root, ("pkg",), script_roots=())) == []


def test_an_upward_arrow_is_found(tmp_path):
    root = _write(tmp_path, {
        "core/__init__.py": "",
        "core/engine.py": "def f():\n    from adapters.fam import x\n",
        "adapters/__init__.py": "",
        "adapters/fam.py": "import core.engine\nx = 1\n",
        "webapp/__init__.py": "",
        "webapp/page.py": "import core.engine\nfrom scripts.bench import b\n",
        "scripts/bench/b.py": "",
    })
    graph = import_graph(root)
    assert upward_arrows(graph) == [("core.engine", "adapters.fam"), ("webapp.page", "scripts.bench.b")]
