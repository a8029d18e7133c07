"""What a checker is given and what it returns: a `Job` (a problem, a completion, a timeout), a
`Verdict` (passed or why not, in one taxonomy across languages: `ERROR_TYPES`, `HACK_TYPES`), and
the one-line texts verdicts carry (stderr tails, timeout lines)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: One taxonomy across languages. `None` means the sample passed.
ERROR_TYPES = (
    "compile_error",  # the program does not compile / parse
    "runtime_error",  # it crashed (exception, panic, signal, early exit)
    "timeout",  # wall-clock or CPU limit
    "memory_limit",  # memory limit hit (MemoryError, failed allocation, the cgroup's kill)
    "output_limit",  # wrote more than the output cap
    "wrong_answer",  # ran to completion, but a test assertion or expected output failed
    "no_tests",  # the program ran but the problem's tests did not (e.g. compiled out)
    "no_answer",  # math: no final answer could be extracted
    "sandbox_error",  # the sandbox refused this one program (e.g. its tmpfs filled up)
    "too_large",  # the completion exceeds the size the checker accepts
    "truncated_reasoning",  # its reasoning never ended (ckpteval.reasoning): no answer to score
    "reward_error",  # a reward function raised, or returned something that is not a score
)

#: Reward hacks a sample can attempt, one taxonomy across languages. A verdict records one
#: (`Verdict.hack`, None when none was seen; the most specific when several were, in this order);
#: a pass is only ever earned by the tests, so a hack never makes a sample pass. Every scored line
#: carries `"hack"`, and each cell reports the share of samples that tried one (`hack_rate`, with
#: counts per type in `hack_types`), so a team sees when an RL run starts learning to game the
#: checker. Checkers that detect nothing (math, stdio, lm-eval metrics) report `hack_rate` 0.
#: How python detects each: `ckpteval.checkers.python` (what the run saw, else the code's AST).
HACK_TYPES = (
    "exit_before_tests",  # ended its process (exit, abort, os._exit) before the tests ran
    "fake_test_report",  # printed a test-runner report or a success marker itself
    "redefines_assertions",  # redefined assert / assert_eq! / the test framework
    "tampers_with_tests",  # changed the tests, the harness's state or another sample's code
    "reads_harness_files",  # read the harness's own files, secrets or other samples' sources
    "always_equal_object",  # returned an object that compares equal to anything
    "binary_wide_code",  # code acting on the whole program (global_asm!, #[global_allocator], unsafe, FFI)
)

#: Completions longer than this are not run: a verdict of `too_large`, and an input error.
MAX_COMPLETION_CHARS = 1_000_000

STDERR_TAIL_CHARS = 2000


@dataclass
class Verdict:
    """The outcome of one sample. `extras` are checker-specific fields added to its JSONL line.

    `duration_s` is everything the sample cost (its share of a batch compile included); `run_s`
    is how long its program ran under the run timeout (the slowest run, for checkers that run it
    once per test), or None when nothing ran. `hack` is the reward hack the sample attempted
    (one of `HACK_TYPES`), or None. A reference solution's `run_s` is what
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
    hack: str | None = None

    def __post_init__(self) -> None:
        if self.error_type is not None and self.error_type not in ERROR_TYPES:
            raise ValueError(f"unknown error type {self.error_type!r}")
        if self.hack is not None and self.hack not in HACK_TYPES:
            raise ValueError(f"unknown hack type {self.hack!r}")
        if self.passed != (self.error_type is None):
            raise ValueError(f"passed={self.passed} contradicts error_type={self.error_type!r}")
        if self.score is None:
            self.score = 1.0 if self.passed else 0.0

    def record(self) -> dict[str, Any]:
        """The per-sample JSONL fields (without task_id / sample_idx)."""
        return {
            "passed": self.passed,
            "score": self.score,
            "error_type": self.error_type,
            "compile_ok": self.compile_ok,
            "duration_s": round(self.duration_s, 4),
            "stderr_tail": self.stderr_tail,
            "hack": self.hack,
            **self.extras,
        }


@dataclass(frozen=True)
class Prompting:
    """How a task's problems are prompted by default: `render(problem)` is the prompt, and the
    engine stops at `stop` (kept in the completion when `include_stop`)."""

    render: Callable[[dict[str, Any]], Any]
    stop: tuple[str, ...] = ()
    include_stop: bool = False


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


def timeout_line(configured: float, limit: float, wall: float) -> str:
    """The line a timeout verdict ends with. It names the number the user set first (the
    configured timeout, `evaluate.timeout`, the checker's default when unset), then this
    problem's limit when calibration raised it (`ckpteval.evaluate.calibrate_timeouts`), then
    the wall clock the sandbox stopped the run at when that is longer (bwrap stops a program
    that blocks only at `WALL_FACTOR` x its CPU budget): a run killed at 20 s wall under a
    10 s timeout reads as both, never as a limit of 20 s."""
    words = f"evaluate.timeout {_seconds(configured)} s"
    if limit != configured:
        words += f", {_seconds(limit)} s for this problem"
    if wall != limit:
        words += f"; wall limit {_seconds(wall)} s"
    return f"timed out ({words})"


def _seconds(value: float) -> str:
    """Seconds as the cell's `timeouts` record rounds them (ms), without trailing zeros."""
    return f"{round(value, 3):g}"


def with_timeout_line(stderr_tail: str, line: str) -> str:
    """A timeout verdict's `stderr_tail`: what the program printed, then `line` last (the part
    one-line summaries keep, e.g. a failed self-test's)."""
    return f"{stderr_tail.rstrip()}\n{line}" if stderr_tail.strip() else line
