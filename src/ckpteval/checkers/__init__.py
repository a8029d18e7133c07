"""The checker registry: what a verdict is, what a checker must do, and how to get one by name.

A checker turns (problem, completion) pairs into `Verdict`s. Every language shares one error
taxonomy (`ERROR_TYPES`) so cells are comparable across checkers. A checker also knows how to test
itself: `reference_jobs` (solutions shipped with the problems, which must pass) and
`known_wrong_jobs` (samples built to fail, which must fail); `ckpteval.evaluate` runs both before
scoring and stops the run if either misbehaves.

A new checker is one module with a `Checker` subclass and one `register()` call below.
"""

from __future__ import annotations

import abc
import contextlib
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from ckpteval.errors import UserError

#: One taxonomy across languages. `None` means the sample passed.
ERROR_TYPES = (
    "compile_error",   # the program does not compile / parse
    "runtime_error",   # it crashed (exception, panic, signal, early exit)
    "timeout",         # wall-clock or CPU limit
    "memory_limit",    # address-space limit hit (MemoryError, failed allocation, bad_alloc)
    "output_limit",    # wrote more than the output cap
    "wrong_answer",    # ran to completion, but a test assertion or expected output failed
    "no_tests",        # the program ran but the problem's tests did not (e.g. compiled out)
    "no_answer",       # math: no final answer could be extracted
    "sandbox_error",   # the sandbox refused this one program (e.g. its tmpfs filled up)
    "too_large",       # the completion exceeds the size the checker accepts
)

#: Completions longer than this are not run: a verdict of `too_large`, and an input error.
MAX_COMPLETION_CHARS = 1_000_000

STDERR_TAIL_CHARS = 2000


@dataclass
class Verdict:
    """The outcome of one sample. `extras` are checker-specific fields added to its JSONL line.

    `duration_s` is everything the sample cost (its share of a batch compile included); `run_s`
    is how long its program ran under the run timeout (the slowest run, for checkers that run it
    once per test), or None when nothing ran. A reference solution's `run_s` is what
    `ckpteval.evaluate` calibrates that problem's timeout from; it is not written to the JSONL.
    """

    passed: bool
    error_type: str | None = None
    compile_ok: bool | None = None
    duration_s: float = 0.0
    stderr_tail: str = ""
    score: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    run_s: float | None = None

    def __post_init__(self) -> None:
        if self.error_type is not None and self.error_type not in ERROR_TYPES:
            raise ValueError(f"unknown error type {self.error_type!r}")
        if self.passed != (self.error_type is None):
            raise ValueError(f"passed={self.passed} contradicts error_type={self.error_type!r}")
        if self.score is None:
            self.score = 1.0 if self.passed else 0.0

    def record(self) -> dict[str, Any]:
        """The per-sample JSONL fields (without task_id / sample_idx)."""
        return {"passed": self.passed, "score": self.score, "error_type": self.error_type,
                "compile_ok": self.compile_ok, "duration_s": round(self.duration_s, 4),
                "stderr_tail": self.stderr_tail, **self.extras}


@dataclass(frozen=True)
class Job:
    """One sample to check: its problem record and its raw completion. `timeout`, when set,
    replaces the run timeout the checker would otherwise use for this job (`Checker.run_timeout`):
    it is how `ckpteval.evaluate` gives each problem its calibrated timeout."""

    task_id: str
    problem: Mapping[str, Any]
    completion: str
    timeout: float | None = None


#: Receives (job index, verdict) pairs as a checker reaches them.
OnVerdicts = Callable[[list[tuple[int, "Verdict"]]], None]


def tail(data: bytes | str, limit: int = STDERR_TAIL_CHARS) -> str:
    """The last `limit` characters of a program's output, decoded leniently."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text[-limit:]


class Checker(abc.ABC):
    """Scores completions of one kind of problem. Subclasses set `name` and `version`.

    `check` must return one verdict per job, in order; infrastructure failures raise instead.
    The default `check` runs `check_one` on a thread pool; checkers that batch (rust) override it.
    """

    name: str = ""
    version: str = "1"
    default_timeout: float = 10.0
    #: Whether verdicts carry a meaningful `compile_ok` (code checkers report a compile rate).
    compiles: bool = False

    def validate_problem(self, task_id: str, problem: Mapping[str, Any]) -> None:
        """Raise `UserError` if `problem` lacks what this checker needs."""

    def run_timeout(self, problem: Mapping[str, Any], timeout: float | None) -> float:
        """Seconds a run of a sample of `problem` gets when its job sets no `timeout`, given the
        call's `timeout` (None: the checker's default)."""
        return timeout or self.default_timeout

    def own_time_limit(self, problem: Mapping[str, Any]) -> bool:
        """Whether `problem` sets its own time limit. Such a limit is part of what the problem asks
        (a solution too slow for it is wrong, as on a judge), so it is never calibrated and a job's
        `timeout` does not replace it."""
        return False

    def check(self, jobs: Sequence[Job], *, workers: int, timeout: float | None = None,
              on_verdicts: OnVerdicts | None = None) -> list[Verdict]:
        """One verdict per job, in order, each job run under its own `timeout` if it has one,
        else the call's. `on_verdicts` hears of verdicts as they are reached, as (job index,
        verdict) pairs, from any thread (callers persist progress with it)."""
        timeout = timeout or self.default_timeout
        verdicts: list[Verdict | None] = [None] * len(jobs)
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = {pool.submit(self.check_one, job, job.timeout or timeout): i
                       for i, job in enumerate(jobs)}
            with cancel_on_error(futures):
                for future in as_completed(futures):
                    verdicts[futures[future]] = verdict = future.result()
                    if on_verdicts:
                        on_verdicts([(futures[future], verdict)])
        return verdicts  # type: ignore[return-value]

    def check_one(self, job: Job, timeout: float) -> Verdict:
        raise NotImplementedError(f"{type(self).__name__} checks in batches; call check()")

    @abc.abstractmethod
    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        """Jobs whose completions are the problems' reference solutions (must pass)."""

    @abc.abstractmethod
    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        """Jobs built to fail (must fail): at least one, whatever the problems are."""

    def close(self) -> None:
        """Release helper processes; the checker is not used afterwards."""


@contextlib.contextmanager
def cancel_on_error(futures: Iterable[Future[Any]]) -> Iterator[None]:
    """When a result raises (an infrastructure failure), cancel the work not yet started instead
    of running every remaining sample into the same failure."""
    try:
        yield
    except BaseException:
        for future in futures:
            future.cancel()
        raise


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


def get_checker(name: str, **options: Any) -> Checker:
    """Build checker `name`. Options a checker does not take (e.g. a Piston `endpoint` for the
    python checker) are ignored, so one options dict serves every task of a run; an option no
    checker knows is a `UserError`."""
    _load_builtins()
    if name not in _REGISTRY:
        raise UserError(f"unknown checker {name!r}; known checkers: {', '.join(sorted(_REGISTRY))}")
    known = set().union(*(_parameters(f) for f in _REGISTRY.values()))
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(f"checker {name}: unknown option(s) {', '.join(unknown)}; "
                        f"known: {', '.join(sorted(known))}")
    factory = _REGISTRY[name]
    return factory(**{k: v for k, v in options.items() if k in _parameters(factory)})


def _parameters(factory: CheckerFactory) -> set[str]:
    return {p.name for p in inspect.signature(factory).parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


_loaded = False


def _load_builtins() -> None:
    """Import the built-in checker modules once; each registers itself."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from ckpteval.checkers import math, python, rust, stdio  # noqa: F401
