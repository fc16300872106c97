"""The web app's packages import downwards only (webapp/__init__.py and each package's docstring
say the rules): cli/server -> {ui, api} -> serving -> {core, adapters}. Every import counts,
those inside functions too: a lazy import is still an arrow."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WEBAPP = REPO / "webapp"
TOP = {"webapp.cli", "webapp.server", "webapp.__main__", "webapp.attach_head"}
# importer's package -> what it must not import
FORBIDDEN = {
    "webapp.serving": ("webapp.ui", "webapp.api", "webapp.netinfo", *TOP),
    "webapp.ui": ("webapp.api", *TOP),
    "webapp.api": ("webapp.ui", *TOP),
    "webapp.netinfo": ("webapp.ui", "webapp.api", "webapp.serving", *TOP),
}


def _imports(path: Path, module: str):
    """Absolute names of everything `path` (module `module`) imports, anywhere in it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            head = ".".join(base + ([node.module] if node.module else []))
            yield from (f"{head}.{a.name}" for a in node.names)


def _modules():
    for path in sorted(WEBAPP.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_modules_are_where_the_docstrings_say():
    assert len([p for p in WEBAPP.glob("*.py")]) <= 8
    for package in ("ui", "api", "serving"):
        assert (WEBAPP / package / "__init__.py").read_text().strip().startswith('"""'), package


def test_webapp_imports_point_down_only():
    wrong = []
    for path, module in _modules():
        rules = next((bad for pkg, bad in FORBIDDEN.items() if module == pkg or module.startswith(pkg + ".")), ())
        for name in _imports(path, module):
            if any(name == b or name.startswith(b + ".") for b in rules):
                wrong.append(f"{module} imports {name}")
    assert not wrong, wrong


def test_the_layering_check_sees_a_lazy_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from ..ui.page import build_app\n")
    assert "webapp.ui.page.build_app" in set(_imports(bad, "webapp.serving.m"))
