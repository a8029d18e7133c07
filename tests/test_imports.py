"""Imports go one way: `ckpteval.aggregate` computes the tables, `ckpteval.report` draws them,
`ckpteval.summary` joins the two. A cycle between them is what made aggregate.py import the
report lazily inside a function; these tests keep it from coming back."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"


def imported_modules(path: Path) -> set[str]:
    """Every module a file of the package imports, at the top or inside a function."""
    name = ".".join(path.relative_to(SRC).with_suffix("").parts)
    package = (
        name.removesuffix(".__init__") if path.name == "__init__.py" else name.rpartition(".")[0]
    )
    return imports_of(path.read_text(encoding="utf-8"), package)


def imports_of(source: str, package: str) -> set[str]:
    """The modules `source` (a module of `package`) imports, relative imports resolved."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(filter(None, [base, node.module or ""]))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def reaches(modules: set[str], target: str) -> set[str]:
    return {m for m in modules if m == target or m.startswith(target + ".")}


def package_files(name: str) -> list[Path]:
    return sorted((SRC / "ckpteval" / name).rglob("*.py"))


def test_relative_imports_and_imports_inside_functions_count() -> None:
    source = "def f():\n    from ..report import plots\n    from . import tables\n"
    found = imports_of(source, "ckpteval.aggregate")
    assert reaches(found, "ckpteval.report") and "ckpteval.aggregate.tables" in found


def test_the_aggregate_never_imports_the_report_or_the_summary() -> None:
    files = package_files("aggregate")
    assert len(files) >= 4, files
    for path in files:
        modules = imported_modules(path)
        assert not reaches(modules, "ckpteval.report"), path
        assert not reaches(modules, "ckpteval.summary"), path


def test_the_report_never_imports_the_summary() -> None:
    files = package_files("report")
    assert files
    for path in files:
        assert not reaches(imported_modules(path), "ckpteval.summary"), path


def test_importing_the_aggregate_loads_neither_the_report_nor_plotting() -> None:
    """In a fresh interpreter: what `ckpteval compare` and `ckpteval publish` import stays light."""
    code = (
        "import sys\n"
        "import ckpteval.aggregate, ckpteval.aggregate.cells, ckpteval.aggregate.tables\n"
        "import ckpteval.aggregate.deltas, ckpteval.aggregate.markdown\n"
        "print(sorted(m for m in sys.modules if m.startswith(('ckpteval.report', "
        "'ckpteval.summary', 'matplotlib'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]", out.stdout
