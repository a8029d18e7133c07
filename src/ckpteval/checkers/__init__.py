"""The checker registry: what a verdict is, what a checker must do, and how to get one by name.

A checker turns (problem, completion) pairs into `Verdict`s. Every language shares one error
taxonomy (`ERROR_TYPES`) so cells are comparable across checkers. A checker also knows how to test
itself: `reference_jobs` (solutions shipped with the problems, which must pass) and
`known_wrong_jobs` (samples built to fail, which must fail); `ckpteval.evaluate` runs both before
scoring and stops the run if either misbehaves.

A checker is one file: a `Checker` subclass that declares everything the rest of the project
asks of it (its languages, problem normaliser and validation, default prompt, the `evaluate.*`
settings it reads, the options a task's `checker:` mapping gives it, its self-test) and one
`register()` call at its end. `ckpteval.tasks`, `ckpteval.problems`, `ckpteval.contract` and
`ckpteval.config` ask this registry (`checker_class`) and never import a checker's private names.
The built-in checkers are imported on first use; files or directories named in the
`CKPTEVAL_CHECKERS` environment variable (`os.pathsep`-separated) are imported after them, so a
checker of your own needs no change to ckpteval.

The parts, by concern: `records` (jobs, verdicts and their texts), `base` (the `Checker` class),
`streaming` (how jobs are spread over workers), `registry` (checkers by name). This module is their
public face: callers import from `ckpteval.checkers`.
"""

from ckpteval.checkers.base import Checker
from ckpteval.checkers.records import (
    ERROR_TYPES,
    HACK_TYPES,
    MAX_COMPLETION_CHARS,
    STDERR_TAIL_CHARS,
    Job,
    OnVerdicts,
    Prompting,
    Verdict,
    tail,
    timeout_line,
    with_timeout_line,
)
from ckpteval.checkers.registry import (
    PLUGIN_ENV,
    CheckerFactory,
    available,
    checker_class,
    checker_named_by,
    checker_version,
    default_workers,
    get_checker,
    problem_file_checkers,
    readers_of,
    register,
)
from ckpteval.checkers.streaming import cancel_on_error

__all__ = [
    "ERROR_TYPES",
    "HACK_TYPES",
    "MAX_COMPLETION_CHARS",
    "PLUGIN_ENV",
    "STDERR_TAIL_CHARS",
    "Checker",
    "CheckerFactory",
    "Job",
    "OnVerdicts",
    "Prompting",
    "Verdict",
    "available",
    "cancel_on_error",
    "checker_class",
    "checker_named_by",
    "checker_version",
    "default_workers",
    "get_checker",
    "problem_file_checkers",
    "readers_of",
    "register",
    "tail",
    "timeout_line",
    "with_timeout_line",
]
