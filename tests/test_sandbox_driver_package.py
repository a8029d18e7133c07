"""The sandbox driver is a package on the host and one program in the sandbox, whose Python runs
with `-I -S` and cannot import ckpteval (`ckpteval.sandbox_driver`): its modules import only the
standard library and each other, every module is part of the program, and the program runs.

Every test that runs a command under bubblewrap (tests/test_sandbox*.py, the checkers' tests)
runs the assembled program as the sandbox's driver; `sandbox: none` runs it too, unsandboxed (the
last test here: a second or two, the fast check of the whole path).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from ckpteval import sandbox_driver
from ckpteval.checkers import Job, get_checker

PACKAGE = Path(sandbox_driver.__file__).parent


def _modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted(PACKAGE.glob("*.py"))}


def _refused_imports(name: str, tree: ast.Module) -> list[tuple[str, int, str]]:
    """The imports of module `name` the sandbox cannot run: any of a module outside the standard
    library (ckpteval's, a third-party package's), and any relative one but a top-level
    `from .module import ...` of the package's own modules (the one kind the assembly removes)."""
    refused = []
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots = [(node.module or "").split(".")[0]]
        elif isinstance(node, ast.ImportFrom):
            own = node.level == 1 and node.module in sandbox_driver.MODULES
            if not (own and id(node) in top and name != "__init__"):
                refused.append((name, node.lineno, ast.unparse(node)))
            continue
        else:
            continue
        refused += [
            (name, node.lineno, root) for root in roots if root not in sys.stdlib_module_names
        ]
    return refused


def test_the_driver_imports_only_the_standard_library_and_its_own_modules() -> None:
    """Every module of the package, its __init__ (the host's assembly) included."""
    refused = [r for name, tree in _modules().items() for r in _refused_imports(name, tree)]
    assert refused == []


def test_the_check_refuses_each_import_the_sandbox_cannot_run() -> None:
    source = (
        "import os\nfrom ckpteval.sandbox import Sandbox\nimport numpy.linalg\n"
        "from .spawn import _child\nfrom . import spawn\nfrom .nowhere import x\n"
        "def f():\n    from .spawn import _child\n"
    )
    refused = _refused_imports("m", ast.parse(source))
    assert [line for _, line, _ in refused] == [2, 3, 5, 6, 8]


def test_every_module_is_in_the_program_after_those_it_imports_and_no_name_twice() -> None:
    """The sandbox runs `MODULES` in order in one namespace: a module left out would be missing
    there (while the package still imports on the host), a name defined at the top of two modules
    would silently be the later one's everywhere, and a module's top-level code may use names of
    the modules it imports from, so they come first."""
    modules = _modules()
    order = sandbox_driver.MODULES
    assert sorted(order) == sorted(set(modules) - {"__init__"})
    owner: dict[str, str] = {}
    twice = []
    for name in order:
        for node in modules[name].body:
            if isinstance(node, ast.ImportFrom) and node.level:
                assert order.index(node.module) < order.index(name), (name, node.module)
            defined = []
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            for defined_name in defined:
                if owner.setdefault(defined_name, name) != name:
                    twice.append((defined_name, owner[defined_name], name))
    assert twice == []


def test_the_program_is_each_module_compiled_without_the_packages_imports() -> None:
    """What `write_driver` ships: a code object per module, in order, equal to the module's
    parsed tree less its top-level relative imports, compiled (the assembly finds them in the
    text, which must leave every line where it was)."""
    import marshal

    codes = marshal.loads(sandbox_driver.program())
    assert [Path(code.co_filename).stem for code in codes] == list(sandbox_driver.MODULES)
    removed = 0
    for name, code in zip(sandbox_driver.MODULES, codes, strict=True):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        kept = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and n.level)]
        removed += len(tree.body) - len(kept)
        tree.body = kept
        assert code == compile(tree, code.co_filename, "exec", dont_inherit=True), name
        assert "ckpteval" not in code.co_names
    assert removed > 20  # the modules' imports of each other, one-line and parenthesised


def test_the_assembled_program_judges_unsandboxed() -> None:
    """`sandbox: none` runs the marshalled program with `--judge` (the same bootstrap as in the
    sandbox): a right and a wrong sample get their verdicts, so every module's names are found."""
    problem = {
        "task_id": "driver/add",
        "prompt": "def add(a, b):\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
        "entry_point": "add",
    }
    checker = get_checker("python", sandbox="none")
    right, wrong = checker.check_batch(
        [
            Job(problem["task_id"], problem, "    return a + b\n"),
            Job(problem["task_id"], problem, "    return a - b\n"),
        ],
        timeout=5,
    )
    assert right.passed and not wrong.passed
    assert wrong.error_type == "wrong_answer"
