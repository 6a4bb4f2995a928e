"""Which package may import which: the method knows no runtime, runtimes and the store know no
gateway, and nothing in the product imports the benchmarks or the command line. Read from the
source (every ``import`` and ``from ... import``, at any depth, TYPE_CHECKING blocks included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("heterofold", "engines", "store", "gateway", "dashboard", "bench", "cli")
MAY_NOT_IMPORT = {
    "heterofold": {"engines", "store", "gateway", "dashboard", "bench", "cli"},
    "engines": {"gateway", "dashboard", "bench", "cli"},
    "store": {"engines", "gateway", "dashboard", "bench", "cli"},
    "gateway": {"dashboard", "bench", "cli"},
    "dashboard": {"bench", "cli"},
}
ROOTS = {"gateway/app.py": {"dashboard"}}  # the app is where the dashboard is mounted


def imported_packages(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            tops.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
    return tops & set(PACKAGES)


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
