"""What a reader walks through following one job, and the package's import cycles: static.

The walk is read from the source, not traced at run time (no engine needed, the same answer on
every machine). Starting at a step function (`ckpteval.steps.infer` by default), it follows the
calls a reader follows, depth first in source order, each function once: a call by name to a
function or class of the same module or imported from a ckpteval module (at the top or inside a
function), `module.name(...)` through an imported ckpteval module, `self.name(...)` in the same
class, and `Name.method(...)` for an imported class. Calls through values (a backend object
handed in, a callback) are not followed: a reader cannot follow them either without running it.

It prints the modules visited in order, the steps (each move from one module to another when
entering a callee), the steps back (a step into a module the walk has already been in), and
the import cycles between modules: every `import`/`from ... import` of a ckpteval module counts,
at the top or inside a function. A cycle whose modules all belong to one subpackage is listed
apart and not counted: that is a registry (the checkers' registry and the backends' factory
load their plugins inside a function, and the plugins import the base classes from the
package), a loop that stays inside the package. A cycle that reaches any module outside it
(the checkers' registry reading prompt texts back from `tasks`) counts.

    python bench/walk.py                          # the infer job, this checkout's src/
    python bench/walk.py --start ckpteval.steps.evaluate --src /path/to/src
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass
class Module:
    """One module's functions (qualified names -> node) and the names it imports."""

    name: str
    is_package: bool
    functions: dict[str, ast.AST] = field(default_factory=dict)
    #: local name -> (module, attribute or None) for every ckpteval import of the file.
    imported: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    #: (imported module, inside a function?) for every ckpteval import of the file.
    imports: list[tuple[str, bool]] = field(default_factory=list)


def load(src: Path) -> dict[str, Module]:
    """Every module of the ckpteval package under `src`."""
    modules = {}
    for path in sorted((src / "ckpteval").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = Module(name, is_package)
    for path in sorted((src / "ckpteval").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        _read(modules[name], ast.parse(path.read_text(encoding="utf-8")), modules)
    return modules


def _resolve(name: str, modules: dict[str, Module]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _read(module: Module, tree: ast.Module, modules: dict[str, Module]) -> None:
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node, in_function in _imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target:
                    module.imports.append((target, in_function))
                    module.imported[alias.asname or alias.name] = (target, None)
            continue
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
        source = ".".join(filter(None, [base, node.module or ""]))
        for alias in node.names:
            full = f"{source}.{alias.name}"
            target = _resolve(full, modules)
            if not target:
                continue
            module.imports.append((target, in_function))
            local = alias.asname or alias.name
            module.imported[local] = (target, None) if target == full else (target, alias.name)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            module.functions[node.name] = node
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    module.functions[f"{node.name}.{item.name}"] = item


def _imports(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, in_function
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _imports(node, inner)


def unit(name: str, modules: dict[str, Module]) -> str:
    """The module, or for a module of a subpackage (ckpteval.checkers.math) the subpackage."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or modules[name].is_package else name


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Module -> the ckpteval modules it imports, at the top or inside a function."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, module in modules.items():
        graph[name].update(target for target, _ in module.imports if target != name)
    return graph


def all_cycles(modules: dict[str, Module]) -> tuple[list[list[str]], list[list[str]]]:
    """(cycles that cross from one module or package to another, cycles inside one package):
    see the module docstring."""
    found = import_cycles(import_graph(modules))
    inside = [c for c in found if len({unit(m, modules) for m in c}) == 1]
    return [c for c in found if c not in inside], inside


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _callees(module: Module, qualname: str, modules: dict[str, Module]) -> Iterator[str]:
    """`module:function` of every call in `qualname` a reader can follow, in source order."""
    cls = qualname.split(".")[0] if "." in qualname else None
    node = module.functions[qualname]
    body = node.body if isinstance(node, ast.ClassDef) else [node]
    calls = [n for part in body for n in ast.walk(part) if isinstance(n, ast.Call)]
    for call in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        target = _call_target(call.func, module, cls, modules)
        if target is not None:
            yield target


def _call_target(
    func: ast.expr, module: Module, cls: str | None, modules: dict[str, Module]
) -> str | None:
    if isinstance(func, ast.Name):
        if func.id in module.functions:
            return f"{module.name}:{func.id}"
        where = module.imported.get(func.id)
        if where and where[1] and where[1] in modules[where[0]].functions:
            return f"{where[0]}:{where[1]}"
        return None
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
        return None
    owner, attr = func.value.id, func.attr
    if owner == "self" and cls and f"{cls}.{attr}" in module.functions:
        return f"{module.name}:{cls}.{attr}"
    if owner in module.functions and f"{owner}.{attr}" in module.functions:
        return f"{module.name}:{owner}.{attr}"
    where = module.imported.get(owner)
    if where is None:
        return None
    target, name = where
    key = attr if name is None else f"{name}.{attr}"
    return f"{target}:{key}" if key in modules[target].functions else None


def walk(modules: dict[str, Module], start: str) -> list[str]:
    """The functions a reader visits from `start` (`module.function`), depth first, each once."""
    module, _, function = start.rpartition(".")
    seen: set[str] = set()
    order: list[str] = []

    def visit(key: str) -> None:
        if key in seen:
            return
        seen.add(key)
        order.append(key)
        name, _, qualname = key.partition(":")
        for callee in _callees(modules[name], qualname, modules):
            visit(callee)

    visit(f"{module}:{function}")
    return order


def steps(order: list[str]) -> tuple[list[str], int, int]:
    """(modules in first-visit order, steps between modules, steps back to a visited module)."""
    visited: list[str] = []
    moves = back = 0
    current = None
    for key in order:
        module = key.partition(":")[0]
        if module != current:
            if current is not None:
                moves += 1
                back += module in visited
            current = module
        if module not in visited:
            visited.append(module)
    return visited, moves, back


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=SRC, help="the src/ directory to read")
    parser.add_argument("--start", default="ckpteval.steps.infer", help="module.function")
    parser.add_argument("--verbose", action="store_true", help="print every function visited")
    args = parser.parse_args()
    modules = load(args.src)
    order = walk(modules, args.start)
    visited, moves, back = steps(order)
    if args.verbose:
        for key in order:
            print(f"  {key}")
    print(f"walk from {args.start}: {len(order)} functions in {len(visited)} modules")
    print(f"modules: {', '.join(m.removeprefix('ckpteval.') for m in visited)}")
    print(f"steps between modules: {moves}, back to a visited module: {back}")
    units = [f"{unit(k.partition(':')[0], modules)}:" for k in order]
    visited_units, unit_moves, unit_back = steps(units)
    print(
        f"counting a subpackage as one (engine, backends, checkers): {len(visited_units)} units, "
        f"{unit_moves} steps, {unit_back} back to a visited one"
    )
    across, inside = all_cycles(modules)
    print(f"import cycles: {len(across)}")
    for group in across:
        print(f"  {' <-> '.join(group)}")
    print(f"registry loops inside one package (not counted): {len(inside)}")
    for group in inside:
        print(f"  {' <-> '.join(group)}")


if __name__ == "__main__":
    main()
