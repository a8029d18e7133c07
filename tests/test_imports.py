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


# --- import cycles among all of ckpteval's modules (bench/walk.py finds them, statically) ------

sys.path.insert(0, str(REPO / "bench"))
import walk  # noqa: E402 - bench/walk.py: the import graph and the job's walk


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "ckpteval" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_no_import_cycle_between_ckpteval_modules() -> None:
    """Every import counts, top-level or inside a function; only a subpackage's registry loop
    (its __init__ loading its plugins, which import its base classes) may stay, inside it."""
    modules = walk.load(SRC)
    across, inside = walk.all_cycles(modules)
    assert across == []
    for group in inside:
        assert len({walk.unit(m, modules) for m in group}) == 1, group


def test_the_cycle_finder_sees_loops_through_functions_and_registries(tmp_path: Path) -> None:
    """A loop made only of imports inside functions counts; so does one that passes through a
    package's lazy plugin load (the loop prompts.py removed: registry -> plugin -> tasks ->
    registry); a registry's own loop is listed apart."""
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "def f():\n    from ckpteval import b\n",
            "b.py": "def g():\n    from .a import f\n",
            "tasks.py": "def t():\n    from ckpteval.reg import get\n",
            "reg/__init__.py": "class Base: ...\ndef get():\n    from ckpteval.reg import plug\n",
            "reg/plug.py": "from ckpteval.reg import Base\ndef p():\n    from ckpteval.tasks import t\n",
            "reg2/__init__.py": "class Base: ...\ndef get():\n    from . import plug\n",
            "reg2/plug.py": "from ckpteval.reg2 import Base\n",
            "ok.py": "from ckpteval import a\n",
        },
    )
    across, inside = walk.all_cycles(walk.load(src))
    assert sorted(across) == [
        ["ckpteval.a", "ckpteval.b"],
        ["ckpteval.reg", "ckpteval.reg.plug", "ckpteval.tasks"],
    ]
    assert inside == [["ckpteval.reg2", "ckpteval.reg2.plug"]]


def test_the_walk_follows_calls_across_modules(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "steps.py": "from ckpteval.x import a\ndef infer():\n    a()\n    from ckpteval import y\n"
            "    y.b()\n    local()\ndef local():\n    pass\n",
            "x.py": "def a():\n    from ckpteval.y import b\n    b()\n",
            "y.py": "class K:\n    def m(self):\n        self.n()\n    def n(self):\n        pass\n"
            "def b():\n    K.m(None)\n",
        },
    )
    order = walk.walk(walk.load(src), "ckpteval.steps.infer")
    assert order == [
        "ckpteval.steps:infer",
        "ckpteval.x:a",
        "ckpteval.y:b",
        "ckpteval.y:K.m",
        "ckpteval.y:K.n",
        "ckpteval.steps:local",
    ]
    # steps -> x -> y, then back to steps: 3 moves, the last one back to a visited module.
    assert walk.steps(order) == (["ckpteval.steps", "ckpteval.x", "ckpteval.y"], 3, 1)
