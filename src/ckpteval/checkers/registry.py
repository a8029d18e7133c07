"""Checkers by name: the built-in ones, imported on first use, and files named in
`CKPTEVAL_CHECKERS`; building one from a task's options."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from ckpteval.checkers.base import Checker
from ckpteval.errors import UserError

#: Environment variable naming checker files (or directories of them) to load besides the
#: built-in ones.
PLUGIN_ENV = "CKPTEVAL_CHECKERS"

CheckerFactory = Callable[..., Checker]
_REGISTRY: dict[str, CheckerFactory] = {}


def register(name: str, factory: CheckerFactory) -> None:
    """Make `factory(**options)` available as checker `name`."""
    if name in _REGISTRY:
        raise ValueError(f"checker {name!r} registered twice")
    _REGISTRY[name] = factory


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def checker_class(name: str) -> type[Checker]:
    """The class of checker `name` (what it declares: languages, prompt, settings it reads),
    or a `UserError` naming the known ones."""
    _load_builtins()
    factory = _REGISTRY.get(name)
    if not isinstance(factory, type) or not issubclass(factory, Checker):
        raise UserError(f"unknown checker {name!r}; known checkers: {', '.join(sorted(_REGISTRY))}")
    return factory


def checker_named_by(key: str) -> str | None:
    """The checker a key of a task's `checker:` mapping names: its name, or another spelling
    it declares (`Checker.mapping_keys`: verl's `custom_reward_function`); None for an option."""
    _load_builtins()
    if key in _REGISTRY:
        return key
    for name, factory in _REGISTRY.items():
        if key in getattr(factory, "mapping_keys", ()):
            return name
    return None


def problem_file_checkers() -> list[str]:
    """The checkers a task from a problem file may name."""
    _load_builtins()
    return sorted(n for n in _REGISTRY if getattr(_REGISTRY[n], "for_problem_files", False))


def readers_of(key: str) -> tuple[str, ...]:
    """The checkers whose verdicts depend on the `evaluate.*` config key `key`."""
    _load_builtins()
    return tuple(sorted(n for n, f in _REGISTRY.items() if key in getattr(f, "reads", ())))


def get_checker(name: str, /, **options: Any) -> Checker:
    """Build checker `name`. Options a checker does not take (e.g. a Piston `endpoint` for the
    python checker) are ignored, so one options dict serves every task of a run; an option no
    checker knows is a `UserError`. `name` is positional-only: a checker's own option may be
    called `name` too (a reward function's, as verl names it)."""
    _load_builtins()
    if name not in _REGISTRY:
        raise UserError(f"unknown checker {name!r}; known checkers: {', '.join(sorted(_REGISTRY))}")
    known = set().union(*(_parameters(f) for f in _REGISTRY.values()))
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(
            f"checker {name}: unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    factory = _REGISTRY[name]
    missing = sorted(_required(factory) - set(options))
    if missing:
        raise UserError(f"checker {name}: needs option(s) {', '.join(missing)}")
    return factory(**{k: v for k, v in options.items() if k in _parameters(factory)})


def checker_version(name: str) -> str:
    """Checker `name`'s version (part of every cell's scoring identity: a new version rescores);
    "harness" for lm-eval's own metrics."""
    _load_builtins()
    factory = _REGISTRY.get(name)
    return str(getattr(factory, "version", "1")) if factory is not None else "harness"


def _parameters(factory: CheckerFactory) -> set[str]:
    return {
        p.name
        for p in inspect.signature(factory).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }


def _required(factory: CheckerFactory) -> set[str]:
    return {
        p.name
        for p in inspect.signature(factory).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    }


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


_loaded = False


def _load_builtins() -> None:
    """Import the built-in checker modules once, then the files `CKPTEVAL_CHECKERS` names;
    each registers itself."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from ckpteval.checkers import math, python, reward, stdio  # noqa: F401
    from ckpteval.checkers.rust import checker  # noqa: F401

    for entry in filter(None, os.environ.get(PLUGIN_ENV, "").split(os.pathsep)):
        _load_plugin(entry)


def _load_plugin(entry: str) -> None:
    """Import a checker file (or every `*.py` of a directory) named in `CKPTEVAL_CHECKERS`."""
    import importlib.util
    from pathlib import Path

    path = Path(entry).expanduser()
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    for file in files:
        if not file.is_file():
            raise UserError(f"{PLUGIN_ENV}: no checker file {file}")
        name = f"ckpteval_checker_{file.stem}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
