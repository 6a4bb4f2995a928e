"""Which package may import which: the method knows no runtime, runtimes and the store know
neither each other nor the gateway, the harness (the method run on engines) knows neither the store
nor the gateway, and nothing in the product imports the benchmarks or the command line; and no
module imports itself through others (the import graph of every module is a DAG). Read from the
source (every ``import`` and ``from ... import``, at any depth, TYPE_CHECKING blocks included).
And no test module imports another: shared helpers live in conftest or helper modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("heterofold", "engines", "harness", "store", "gateway", "dashboard", "bench", "cli")
MAY_NOT_IMPORT = {
    "heterofold": {"engines", "harness", "store", "gateway", "dashboard", "bench", "cli"},
    "engines": {"harness", "store", "gateway", "dashboard", "bench", "cli"},  # the store comes in as a PageSink
    "harness": {"store", "gateway", "dashboard", "bench", "cli"},
    "store": {"engines", "harness", "gateway", "dashboard", "bench", "cli"},
    "gateway": {"dashboard", "bench", "cli"},
    "dashboard": {"bench", "cli"},
}
ROOTS = {"gateway/app.py": {"dashboard"}}  # the app is where the dashboard is mounted


def imported_names(path: Path) -> set[str]:
    """Every dotted name ``path`` imports; ``from a import b`` names both ``a`` and ``a.b``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def imported_packages(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_names(path)} & set(PACKAGES)


def module_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports (a package's ``__init__`` is the package)."""
    files = {}
    for package in PACKAGES:
        for f in (ROOT / package).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {}
    for module, f in files.items():
        deps = set()
        for name in imported_names(f):
            while name and name not in files:  # a name inside a module: the module
                name = name.rpartition(".")[0]
            if name and name != module:
                deps.add(name)
        graph[module] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it (the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for dep in sorted(graph[module]):
            cycle = visit(dep)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return None


@pytest.mark.parametrize("package", sorted(MAY_NOT_IMPORT))
def test_package_imports_follow_the_layering(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources under {package}/"
    broken = {}
    for f in files:
        name = str(f.relative_to(ROOT))
        bad = imported_packages(f) & (MAY_NOT_IMPORT[package] - ROOTS.get(name, set()))
        if bad:
            broken[name] = sorted(bad)
    assert not broken, f"{package} imports what it may not: {broken}"


def test_no_module_imports_itself_through_others() -> None:
    graph = module_graph()
    assert "bench.load_server" in graph["bench.load"]  # a function-level import counts too
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or ())}"


def test_no_test_module_imports_another() -> None:
    """Shared test helpers live in conftest or helper modules, never in a ``test_*`` module (whose
    import would also collect its tests twice under another name)."""
    broken = {}
    for f in sorted((ROOT / "tests").rglob("*.py")):
        names = imported_names(f)
        tests = sorted(n for n in names if n.startswith("tests.") and n.split(".")[-1].startswith("test_"))
        tests = [n for n in tests if not any(n.startswith(m + ".") for m in tests)]  # the module, not its names
        if tests:
            broken[str(f.relative_to(ROOT))] = tests
    assert broken == {}, f"test modules imported by others: {broken}"
