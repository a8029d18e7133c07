"""The stdio checker: competitive-programming problems judged on standard input and output.

Problem record::

    {"task_id": str,
     "tests": [{"input": str, "output": str}, ...],           # all must pass, in order
     "generated_tests": [{"input", "output"}, ...],           # optional, judged after `tests`
     "checker": str | {"language": "python" | "cpp", "source": str},  # optional special judge
     "time_limit": float,                                     # seconds per test (default 2)
     "tolerance": float,                                      # optional: outputs are floats
     "memory_limit": int,                                     # MB (default 256)
     "canonical_solution": str, "language": str,              # optional reference for the self-test
     "solution_language": str}                                # optional: the language asked for

A verdict's extras say which test failed first (`first_failed_test`, its index within
`first_failed_set`: "official" or "generated") and whether the official and the generated tests
all passed (`official_passed`, `generated_passed`; `first_failure`).

Solutions are Python, C++ or Rust, told apart by the completion's fence language (```cpp) or, for
bare code, by its look (`#include`, `fn main`); a problem's `solution_language` (a task's
`language`) fixes it instead, and the code block of that language is taken. Without a checker
program, output is compared token by token, exactly, tokens separated by testlib's blanks
(space, tab, CR, LF; not NBSP, vertical tab or other Unicode spaces). Only a problem that
declares a float comparison, by its `tolerance` (say 1e-6), lets two tokens that are both
numbers differ by that much (absolute or relative); `1.5` against `1.4999` is wrong for a problem without one, whatever
the decimal point suggests. A checker program is run as `checker <input> <output> <answer>` and
accepts with exit status 0 (testlib's convention), in the local sandbox; it decides tolerance
itself.

Encoding: a completion (and a problem's text) is written as UTF-8, with every code point UTF-8
cannot encode (a lone surrogate, as a JSON escape of one produces) replaced by U+FFFD; the
verdict then carries `unencodable_chars`, how many were replaced (`extract.utf8_safe`).

A time limit is CPU time, as on a judge: a test's run fails as `timeout` when the CPU time of
its whole process tree exceeds the limit, whatever the machine's load. Two backends run solutions.
`local` (default): compile once in the sandbox, then run each test in its own sandbox with the
memory limit (address space, plus 64 MB for the runtime); the sandbox measures the CPU time
exactly (`ckpteval.sandbox_driver`), RLIMIT_CPU at the next whole second above the limit stops
endless loops, and a wall clock of 3 x the limit x the machine's load + 1 s (`wall_limit`) only
catches programs that sleep or block.

`piston`: a Piston endpoint (`endpoint="http://host:2000"`), `POST /api/v2/execute` per test,
every request inside the server's limits (`piston_limits`, i.e. `evaluate.piston_limits`; Piston's
own defaults unless configured: `PISTON_DEFAULT_LIMITS`): `run_cpu_time` is the time limit and the
verdict compares the reply's `cpu_time` with it, `run_timeout` is the configured one (the longest
wall clock the server allows: only sleepers should meet it), the compile stage gets the
configured limits.
`GET /api/v2/runtimes` is asked once; concurrency is bounded, connection errors, 429 and 5xx are
retried. Whatever would make a verdict wrong is one line instead: a problem whose own
`time_limit` or `memory_limit` is over the server's, or whose expected output is longer than
`output_max_size` (Piston cuts stdout there; it is a server setting, not a request field) is a
`UserError` before anything runs; a request Piston refuses (HTTP 400: "run_timeout cannot exceed
the configured limit of 3000", a body over its 100 kB), a language it lacks, or an endpoint that
stays down raises `PistonError`, which fails the run. A program that writes more than
`output_max_size` characters to stdout or stderr is killed by Piston: `output_limit`. A limit that
is not the problem's own (a configured or calibrated timeout) is capped at the server's, with a
warning. Piston compiles C++ without -O2 and Rust without -O (its packages' scripts), so a
compiled solution near its limit can pass locally and time out there.

A problem's own `time_limit` is what it asks and is never calibrated; for problems without one,
a job's `timeout` (a calibrated limit) replaces the call's; a verdict's `run_s` is its slowest
test run on the wall clock (Piston's `wall_time`, when the endpoint reports it).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.checkers import Checker, Job, Prompting, Verdict, register, tail, with_timeout_line
from ckpteval.checkers.extract import code_block, utf8_safe
from ckpteval.checkers.python import python_interpreter
from ckpteval.checkers.rust.checker import rust_sysroot
from ckpteval.errors import UserError
from ckpteval.sandbox import Limits, RunResult, Sandbox
from ckpteval.scratch import scratch_dir

log = logging.getLogger(__name__)

LANGUAGES = ("python", "cpp", "rust")
_FENCE_NAMES = {
    "python": "python",
    "py": "python",
    "python3": "python",
    "cpp": "cpp",
    "c++": "cpp",
    "cc": "cpp",
    "cxx": "cpp",
    "rust": "rust",
    "rs": "rust",
}
_SOURCE_NAME = {"python": "main.py", "cpp": "main.cpp", "rust": "main.rs"}
DEFAULT_TIME_LIMIT = 2.0
DEFAULT_MEMORY_MB = 256
RUNTIME_MEMORY_SLACK = 64 << 20
#: The wall clock of a run is WALL_FACTOR x the CPU time limit x the load, plus WALL_SLACK_S.
WALL_FACTOR = 3.0
WALL_SLACK_S = 1.0


#: Piston's own limits (api/src/config.js defaults): timeouts and CPU times in ms, memory in bytes
#: (-1: none), output_max_size in characters per stream. `evaluate.piston_limits` overrides them
#: to match a server configured otherwise (PISTON_RUN_TIMEOUT=..., limit_overrides).
PISTON_DEFAULT_LIMITS = {
    "compile_timeout": 10000,
    "run_timeout": 3000,
    "compile_cpu_time": 10000,
    "run_cpu_time": 3000,
    "compile_memory_limit": -1,
    "run_memory_limit": -1,
    "output_max_size": 1024,
}


class PistonError(RuntimeError):
    """The Piston endpoint could not be used (down, refusing, internal error): the run fails."""


@dataclass(frozen=True)
class Program:
    language: str
    source: str


def detect_program(completion: str, language: str | None = None) -> Program:
    """The solution in a completion and its language (fence tag, else the code's look)."""
    fence = re.search(r"```[ \t]*([\w+#]+)", completion)
    tagged = _FENCE_NAMES.get(fence.group(1).lower()) if fence else None
    lang = language or tagged
    code = code_block(
        completion, tuple(k for k, v in _FENCE_NAMES.items() if v == lang) if lang else ()
    )
    if lang is None:
        if re.search(r"^[ \t]*#[ \t]*include\b", code, re.M):  # one line: never a run of them
            lang = "cpp"
        elif re.search(r"\bfn\s+main\s*\(", code):
            lang = "rust"
        else:
            lang = "python"
    return Program(lang, code)


def first_failure(verdict: Verdict, n_official: int, n_generated: int) -> dict[str, Any]:
    """Which test failed first and how each test set fared, from a verdict's `tests_passed`
    (tests run official first, then generated, and stop at the first failure):
    `first_failed_test` (index within its set, None if none failed or nothing ran),
    `first_failed_set` ("official" | "generated" | None), `official_passed` (every official
    test passed: False for a program that did not compile) and `generated_passed` (every
    generated test passed; None without generated tests, or when no generated test ran)."""
    if verdict.passed:
        return {
            "first_failed_test": None,
            "first_failed_set": None,
            "official_passed": True,
            "generated_passed": True if n_generated else None,
        }
    ran = verdict.compile_ok and "tests_passed" in verdict.extras
    if not ran:
        return {
            "first_failed_test": None,
            "first_failed_set": None,
            "official_passed": False,
            "generated_passed": None,
        }
    index = int(verdict.extras["tests_passed"])
    if index < n_official:
        return {
            "first_failed_test": index,
            "first_failed_set": "official",
            "official_passed": False,
            "generated_passed": None,
        }
    return {
        "first_failed_test": index - n_official,
        "first_failed_set": "generated",
        "official_passed": True,
        "generated_passed": False,
    }


def outputs_match(expected: str, actual: str, tolerance: float | None = None) -> bool:
    """Token-wise equality, tokens separated by testlib's blanks (`_TOKEN`). With a `tolerance`
    (a problem that declares a float comparison), two tokens that are both plain decimal numbers
    may differ by it, absolute or relative; without one every token must be equal: an exact
    decimal answer accepts no other value."""
    want, got = _TOKEN.findall(expected), _TOKEN.findall(actual)
    if len(want) != len(got):
        return False
    for a, b in zip(want, got):
        if a == b:
            continue
        if tolerance is not None and _is_number(a) and _is_number(b):
            x, y = float(a), float(b)
            if abs(x - y) <= tolerance or abs(x - y) <= tolerance * abs(x):
                continue
        return False
    return True


#: A token as testlib's `wcmp` reads one: what lies between its blanks (`isBlanks`: space, tab,
#: CR, LF). `str.split()` also splits at NBSP, vertical tab, form feed, U+3000, U+2028 and other
#: Unicode spaces, which would accept `1\u00a02` for `1 2`.
_TOKEN = re.compile(r"[^ \t\r\n]+")
#: A number as a judge prints one (no `inf`, `nan`, `0x10` or `1_000`, which `float` reads).
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _is_number(token: str) -> bool:
    return _NUMBER.fullmatch(token) is not None and math.isfinite(float(token))


class StdioChecker(Checker):
    name = "stdio"
    #: 2: per-sample first_failed_test, official_passed, generated_passed; 3: tolerance only
    #: where the problem declares it, unencodable text replaced; 4: tokens split at testlib's
    #: blanks only (NBSP, vertical tab, U+3000 no longer separate tokens)
    version = "4"
    default_timeout = DEFAULT_TIME_LIMIT
    compiles = True
    languages = LANGUAGES
    reads = (
        "evaluate.timeout",
        "evaluate.timeout_factor",
        "evaluate.sandbox",
        "evaluate.piston_url",
        *(f"evaluate.piston_limits.{name}" for name in PISTON_DEFAULT_LIMITS),
    )

    def __init__(
        self,
        *,
        sandbox: str = "bwrap",
        endpoint: str | None = None,
        piston_concurrency: int = 4,
        piston_retries: int = 3,
        piston_limits: Mapping[str, int] | None = None,
    ) -> None:
        self.sandbox = Sandbox(sandbox)
        limits = _piston_limits(piston_limits)
        self.backend: _Backend = (
            _Piston(endpoint, piston_concurrency, piston_retries, limits)
            if endpoint
            else _Local(self.sandbox)
        )
        self._checkers: dict[str, tuple[Path, list[str]]] = {}
        self._checker_lock = threading.Lock()
        self._checker_dirs: list[tempfile.TemporaryDirectory[str]] = []

    @classmethod
    def programs(cls, language: str | None, evaluate: Mapping[str, Any]) -> tuple[str, ...]:
        """A task asked in C++ or Rust compiles with g++ or rustc on this machine, unless a
        Piston server (`evaluate.piston_url`) runs it; one told from each completion may need
        either or neither."""
        if evaluate.get("piston_url"):
            return ()
        return {"cpp": ("g++",), "rust": ("rustc",)}.get(language or "", ())

    @classmethod
    def normalise_problem(cls, row: Mapping[str, Any]) -> dict[str, Any]:
        from ckpteval.problems import normalise_stdio

        return normalise_stdio(row)

    @classmethod
    def default_prompt(
        cls, problems: Sequence[Mapping[str, Any]], language: str | None, task: str
    ) -> Prompting:
        """The statement, then an open code block of the task's language (ckpteval.tasks
        `STDIO_PROMPT`), stopped at the closing fence."""
        from ckpteval.prompts import STDIO_PROMPT, render_template

        def render(problem: dict[str, Any]) -> str:
            return render_template(STDIO_PROMPT, problem, language or "python", where=task)

        return Prompting(render, ("```",))

    @classmethod
    def check_run_config(cls, tasks: Mapping[str, Any], evaluate: Mapping[str, Any]) -> None:
        """With `evaluate.piston_url`, a problem the server cannot judge as it asks (its own
        time or memory limit over the server's, an expected output longer than Piston keeps) is
        one line naming the task now, rather than in its evaluate job."""
        if not evaluate.get("piston_url"):
            return
        limits = _piston_limits(evaluate.get("piston_limits"))
        piston = _Piston(evaluate["piston_url"], 1, 0, limits)
        for name, task in tasks.items():
            for tid, problem in task.problems().items():
                tests = [*(problem.get("tests") or []), *(problem.get("generated_tests") or [])]
                try:
                    piston.check_problem(tid, problem, tests)
                except UserError as exc:
                    raise UserError(f"config: tasks.{name}: {exc}") from None

    @classmethod
    def check_problem(cls, task_id: str, problem: Mapping[str, Any]) -> None:
        tests = [*(problem.get("tests") or []), *(problem.get("generated_tests") or [])]
        if not tests or not all(
            isinstance(t, Mapping) and "input" in t and "output" in t for t in tests
        ):
            raise UserError(
                f"problem {task_id}: stdio problems need `tests`: a non-empty list of "
                "{input, output} objects"
            )
        tolerance = problem.get("tolerance")
        if tolerance is not None and (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, (int, float))
            or not 0 <= tolerance < 1
        ):
            raise UserError(
                f"problem {task_id}: tolerance must be a number in [0, 1), not {tolerance!r}"
            )

    def validate_problem(self, task_id: str, problem: Mapping[str, Any]) -> None:
        self.check_problem(task_id, problem)
        tests = [*(problem.get("tests") or []), *(problem.get("generated_tests") or [])]
        self.backend.check_problem(task_id, problem, tests)

    def run_timeout(self, problem: Mapping[str, Any], timeout: float | None) -> float:
        """The time limit per test: the problem's own `time_limit`, else the call's `timeout`."""
        return float(problem.get("time_limit") or timeout or self.default_timeout)

    def own_time_limit(self, problem: Mapping[str, Any]) -> bool:
        return bool(problem.get("time_limit"))

    def check_one(self, job: Job, timeout: float) -> Verdict:
        """The time limit per test is the problem's own `time_limit` if it has one (too slow is
        wrong, as on a judge; its CPU-time limit keeps that verdict steady on a busy machine),
        else the job's `timeout` if set (a calibrated limit), else the call's `timeout`."""
        start = time.monotonic()
        problem = job.problem
        completion, replaced = utf8_safe(job.completion)
        program = detect_program(completion, problem.get("solution_language"))
        own = self.own_time_limit(problem)
        time_limit = (
            self.run_timeout(problem, timeout)
            if own
            else self.backend.time_limit_for(job.timeout or self.run_timeout(problem, timeout))
        )
        memory = int(problem.get("memory_limit") or DEFAULT_MEMORY_MB) << 20
        tests = [*(problem.get("tests") or []), *(problem.get("generated_tests") or [])]
        judge = self._judge(job.task_id, problem)
        verdict = self.backend.judge(program, tests, time_limit, memory, judge)
        if verdict.error_type == "timeout" and verdict.compile_ok:
            verdict.stderr_tail = with_timeout_line(
                verdict.stderr_tail, _timeout_words(time_limit, own=own, raised=bool(job.timeout))
            )
        verdict.duration_s = time.monotonic() - start
        verdict.extras.setdefault("language", program.language)
        if replaced:
            verdict.extras["unencodable_chars"] = replaced
        verdict.extras.update(
            first_failure(
                verdict, len(problem.get("tests") or []), len(problem.get("generated_tests") or [])
            )
        )
        return verdict

    def _judge(self, task_id: str, problem: Mapping[str, Any]) -> _Judge:
        spec = problem.get("checker")
        if not spec:
            return _Judge(None, self.sandbox, _tolerance(problem))
        with self._checker_lock:
            if task_id not in self._checkers:
                self._checkers[task_id] = self._build_checker(task_id, spec)
        return _Judge(self._checkers[task_id], self.sandbox)

    def _build_checker(self, task_id: str, spec: Any) -> tuple[Path, list[str]]:
        language, source = (
            ("python", spec)
            if isinstance(spec, str)
            else (spec.get("language", "python"), spec["source"])
        )
        program = Program(_FENCE_NAMES.get(str(language).lower(), str(language)), source)
        holder = tempfile.TemporaryDirectory(prefix="ckpteval-judge-")
        self._checker_dirs.append(holder)
        workdir = Path(holder.name)
        compiled = _compile(self.sandbox, program, workdir)
        if isinstance(compiled, Verdict):
            raise UserError(
                f"problem {task_id}: its checker program does not compile: "
                f"{compiled.stderr_tail[-300:]}"
            )
        return workdir, compiled

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        jobs = []
        for task_id, p in problems.items():
            if p.get("canonical_solution"):
                language = p.get("language")
                code = str(p["canonical_solution"])
                # judged in its own language, whatever the task asks solutions in
                own = {k: v for k, v in p.items() if k != "solution_language"}
                jobs.append(Job(task_id, own, f"```{language}\n{code}\n```" if language else code))
        return jobs

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        return [
            Job(task_id, problem, "```python\nprint('ckpteval-known-wrong')\n```"),
            Job(task_id, problem, "```python\nimport os\nos._exit(0)\n```"),
        ]

    def close(self) -> None:
        for holder in self._checker_dirs:
            holder.cleanup()
        self._checker_dirs.clear()


def _tolerance(problem: Mapping[str, Any]) -> float | None:
    """The problem's declared float tolerance, or None: its outputs are compared exactly."""
    value = problem.get("tolerance")
    return None if value is None else float(value)


def _write_text(path: Path, text: Any) -> None:
    """Write problem or program text as UTF-8, code points UTF-8 cannot encode replaced."""
    path.write_text(utf8_safe(str(text))[0], encoding="utf-8")


class _Judge:
    """Decides whether one test's output is accepted: a token comparison or a checker program."""

    def __init__(
        self,
        checker: tuple[Path, list[str]] | None,
        sandbox: Sandbox,
        tolerance: float | None = None,
    ) -> None:
        self.checker = checker
        self.sandbox = sandbox
        self.tolerance = tolerance

    def accepts(self, test: Mapping[str, Any], output: bytes) -> bool:
        """Token comparison, or the checker program's exit status 0 (a crash or hang rejects)."""
        actual = output.decode("utf-8", "replace")
        if self.checker is None:
            return outputs_match(str(test["output"]), actual, self.tolerance)
        workdir, argv = self.checker
        with scratch_dir("judge-io") as io_dir:
            os.chmod(io_dir, 0o755)
            for name, text in (
                ("input.txt", test["input"]),
                ("output.txt", actual),
                ("answer.txt", test["output"]),
            ):
                _write_text(Path(io_dir, name), text)
            result = self.sandbox.run(
                [*argv, *(f"{io_dir}/{n}" for n in ("input.txt", "output.txt", "answer.txt"))],
                limits=Limits(wall_s=30),
                workdir=workdir,
                readable=[Path(io_dir), *_toolchains()],
            )
        return result.exit_code == 0


class _Backend:
    def check_problem(
        self, task_id: str, problem: Mapping[str, Any], tests: Sequence[Mapping[str, Any]]
    ) -> None:
        """Raise `UserError` if this backend cannot judge `problem` as it asks."""

    def time_limit_for(self, time_limit: float) -> float:
        """The limit a run gets for a configured or calibrated (not the problem's own) limit."""
        return time_limit

    def judge(
        self,
        program: Program,
        tests: Sequence[Mapping[str, Any]],
        time_limit: float,
        memory: int,
        judge: _Judge,
    ) -> Verdict:
        raise NotImplementedError


def _toolchains() -> list[Path]:
    return [python_interpreter()[1]]


def _compile(sandbox: Sandbox, program: Program, workdir: Path) -> list[str] | Verdict:
    """Write and (for C++ and Rust) compile `program` in `workdir`; the argv that runs it, or a
    compile_error verdict."""
    os.chmod(workdir, 0o755)
    source = workdir / _SOURCE_NAME[program.language] if program.language in _SOURCE_NAME else None
    if source is None:
        return Verdict(
            False,
            "compile_error",
            compile_ok=False,
            stderr_tail=f"unsupported language {program.language!r}",
        )
    _write_text(source, program.source)
    if program.language == "python":
        interpreter, _ = python_interpreter()
        syntax = _python_syntax_error(program)
        if syntax is not None:
            return syntax
        return [interpreter, "-I", "-S", "-B", str(source)]
    if program.language == "cpp":
        argv, readable = ["g++", "-O2", "-std=c++17", "-pipe", "main.cpp", "-o", "main"], []
    else:
        sysroot = rust_sysroot()
        argv = [str(sysroot / "bin" / "rustc"), "-O", "--edition=2021", "main.rs", "-o", "main"]
        readable = [sysroot]
    result = sandbox.run(
        argv,
        limits=Limits(
            wall_s=60, memory_bytes=4 << 30, nproc=256, file_bytes=256 << 20, tmp_bytes=1 << 30
        ),
        workdir=workdir,
        writable=True,
        readable=readable,
    )
    if result.exit_code != 0 or not (workdir / "main").exists():
        kind = "timeout" if result.timed_out else "compile_error"
        return Verdict(False, kind, compile_ok=False, stderr_tail=tail(result.stderr))
    return [str(workdir / "main")]


def _python_syntax_error(program: Program) -> Verdict | None:
    """A Python program that does not parse is a compile error, on every backend alike (Piston
    would run it and report the SyntaxError as a crash)."""
    try:
        compile(program.source, "main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        return Verdict(
            False,
            "compile_error",
            compile_ok=False,
            stderr_tail=tail(f"{type(exc).__name__}: {exc}"),
        )
    return None


class _Local(_Backend):
    """Compile once, run every test in its own sandbox; the verdict's time is CPU time."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def judge(
        self,
        program: Program,
        tests: Sequence[Mapping[str, Any]],
        time_limit: float,
        memory: int,
        judge: _Judge,
    ) -> Verdict:
        with (
            scratch_dir("stdio") as work,
            scratch_dir("stdin") as stdin_dir,
        ):
            compiled = _compile(self.sandbox, program, Path(work))
            if isinstance(compiled, Verdict):
                return compiled
            limits = Limits(
                wall_s=wall_limit(time_limit, load_scale()),
                cpu_s=cpu_backstop(time_limit),
                memory_bytes=memory + RUNTIME_MEMORY_SLACK,
            )
            slowest = 0.0
            for number, test in enumerate(tests, start=1):
                stdin = Path(stdin_dir) / f"{number}.in"
                _write_text(stdin, test["input"])
                result = self.sandbox.run(
                    compiled, limits=limits, workdir=Path(work), stdin=stdin, readable=_toolchains()
                )
                slowest = max(slowest, result.duration_s)
                failure = _run_failure(result, time_limit)
                if failure is None and not judge.accepts(test, result.stdout):
                    failure = "wrong_answer"
                if failure:
                    return Verdict(
                        False,
                        failure,
                        compile_ok=True,
                        stderr_tail=tail(result.stderr).replace(f"{work}/", ""),
                        extras={"tests_passed": number - 1, "tests_total": len(tests)},
                        run_s=slowest,
                    )
        return Verdict(
            True,
            compile_ok=True,
            extras={"tests_passed": len(tests), "tests_total": len(tests)},
            run_s=slowest,
        )


def _timeout_words(time_limit: float, *, own: bool, raised: bool) -> str:
    """A timeout verdict's line: which limit the run exceeded, named by where it came from (the
    problem's own `time_limit`, the configured `evaluate.timeout`, or that raised by
    calibration). The wall clock that stops a program that blocks is not named: it stretches
    with the machine's load (`wall_limit`), and the verdict is judged on CPU time."""
    if own:
        return f"timed out (the problem's time_limit {time_limit:g} s per test)"
    if raised:
        return f"timed out ({time_limit:g} s per test: evaluate.timeout, raised for this problem)"
    return f"timed out (evaluate.timeout {time_limit:g} s per test)"


def cpu_backstop(time_limit: float) -> int:
    """RLIMIT_CPU for a run: the first whole second above the limit. It only stops endless loops
    (the kernel counts whole seconds); the verdict compares the measured CPU time with the limit."""
    return math.floor(time_limit) + 1


def wall_limit(time_limit: float, scale: float = 1.0) -> float:
    """The wall clock a run gets: `WALL_FACTOR` times the limit, stretched by the machine's load
    (`load_scale`), plus `WALL_SLACK_S`. It only catches programs that sleep or block: a program
    within its CPU limit ends well before it, even on a machine busier than measured."""
    return WALL_FACTOR * time_limit * scale + WALL_SLACK_S


def load_scale() -> float:
    """How many times slower than idle a CPU-bound program runs now: runnable tasks (the larger of
    the 1-minute load average and the instant count) per core this process may use, 1 to 8."""
    cores = len(os.sched_getaffinity(0))
    try:
        fields = Path("/proc/loadavg").read_text().split()
        busy = max(float(fields[0]), float(fields[3].split("/")[0]))
    except (OSError, ValueError, IndexError):
        return 1.0
    return min(8.0, max(1.0, busy / cores))


def _run_failure(result: RunResult, time_limit: float) -> str | None:
    """The error type of a finished run, before looking at its output (None: it ran cleanly).
    More CPU time than the limit is a timeout whatever else happened, as on a judge."""
    if result.timed_out or result.signal == signal.SIGXCPU or result.cpu_s > time_limit:
        return "timeout"
    if result.output_limit or result.signal == signal.SIGXFSZ:
        return "output_limit"
    if result.exit_code == 0:
        return None
    stderr = result.stderr[-4096:]
    if result.memory_limit:  # the kernel killed a process of it at the command's memory limit
        return "memory_limit"
    if b"MemoryError" in stderr or b"bad_alloc" in stderr or b"memory allocation of" in stderr:
        return "memory_limit"
    return "runtime_error"


class _Piston(_Backend):
    """A Piston endpoint: one `POST /api/v2/execute` per test, bounded and retried, every request
    inside the server's limits (`limits`: what `evaluate.piston_limits` says they are)."""

    PISTON_LANGUAGE = {"python": "python", "cpp": "c++", "rust": "rust"}

    def __init__(
        self, endpoint: str, concurrency: int, retries: int, limits: Mapping[str, int]
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.retries = retries
        self.limits = dict(limits)
        self.slots = threading.BoundedSemaphore(max(1, concurrency))
        self._versions: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._capped = False

    @property
    def max_time_limit(self) -> float:
        """The largest time limit (s) Piston can enforce as CPU time with a wall clock at least as
        long (`run_cpu_time`, `run_timeout`; a limit of 0 or less is none)."""
        caps = [self.limits[k] for k in ("run_cpu_time", "run_timeout") if self.limits[k] > 0]
        return min(caps) / 1000 if caps else math.inf

    def check_problem(
        self, task_id: str, problem: Mapping[str, Any], tests: Sequence[Mapping[str, Any]]
    ) -> None:
        """A problem whose own limits or expected outputs this Piston cannot honour is a
        `UserError`: capping its limit, or comparing an output Piston cut short, would change
        verdicts silently."""
        own = problem.get("time_limit")
        if own and float(own) > self.max_time_limit:
            key = min(
                ("run_cpu_time", "run_timeout"),
                key=lambda k: self.limits[k] if self.limits[k] > 0 else math.inf,
            )
            raise UserError(
                f"problem {task_id}: time_limit {own} s is over what Piston at {self.endpoint} "
                f"allows ({key} {self.limits[key]} ms); raise it on the server (PISTON_"
                f"{key.upper()}) and in evaluate.piston_limits.{key}, or use the local sandbox"
            )
        memory_cap = self.limits["run_memory_limit"]
        own_memory = problem.get("memory_limit")
        if own_memory and memory_cap > 0 and int(own_memory) << 20 > memory_cap:
            raise UserError(
                f"problem {task_id}: memory_limit {own_memory} MB is over what Piston at "
                f"{self.endpoint} allows (run_memory_limit {memory_cap} bytes); raise it on the "
                "server and in evaluate.piston_limits.run_memory_limit, or use the local sandbox"
            )
        size = self.limits["output_max_size"]
        for number, test in enumerate(tests, start=1):
            length = len(str(test["output"]).encode())
            if size > 0 and length > size:
                raise UserError(
                    f"problem {task_id}: test {number} expects {length} characters of output, "
                    f"over Piston's output_max_size of {size} (Piston cuts stdout there, so a "
                    "right answer would fail); raise PISTON_OUTPUT_MAX_SIZE on the server and "
                    "evaluate.piston_limits.output_max_size, or use the local sandbox"
                )

    def time_limit_for(self, time_limit: float) -> float:
        """A limit that is not the problem's own (a configured or calibrated timeout), capped at
        what Piston allows; said once in the log."""
        if time_limit <= self.max_time_limit:
            return time_limit
        if not self._capped:
            self._capped = True
            log.warning(
                "piston at %s: timeouts above %g s (evaluate.piston_limits) are capped "
                "there for problems without their own time_limit",
                self.endpoint,
                self.max_time_limit,
            )
        return self.max_time_limit

    def versions(self) -> dict[str, str]:
        """Language (and alias) -> newest installed version, from `GET /api/v2/runtimes`, asked
        once per checker."""
        with self._lock:
            if self._versions is None:
                runtimes = self._request("GET", "/api/v2/runtimes", None)
                versions: dict[str, str] = {}
                for rt in sorted(runtimes, key=lambda r: _version_key(r["version"])):
                    for name in [rt["language"], *rt.get("aliases", [])]:
                        versions[name] = rt["version"]
                self._versions = versions
            return self._versions

    def request_body(
        self,
        program: Program,
        language: str,
        version: str,
        stdin: str,
        time_limit: float,
        memory: int,
    ) -> dict[str, Any]:
        """One execute request: the time limit as CPU time (`run_cpu_time`), the longest wall
        clock the server allows (`run_timeout`: how busy it is cannot be seen from here, and the
        wall clock only catches sleepers), the compile stage's limits as configured; a limit
        configured as 0 or less is left to the server (the wall clock is then `wall_limit`)."""
        limits = self.limits
        body: dict[str, Any] = {
            "language": language,
            "version": version,
            "files": [{"name": _SOURCE_NAME[program.language], "content": program.source}],
            "stdin": stdin,
            "args": [],
            "run_cpu_time": math.ceil(time_limit * 1000),
            "run_timeout": (
                limits["run_timeout"]
                if limits["run_timeout"] > 0
                else math.ceil(wall_limit(time_limit) * 1000)
            ),
            "run_memory_limit": memory,
        }
        if limits["run_memory_limit"] > 0:
            body["run_memory_limit"] = min(memory, limits["run_memory_limit"])
        for key in ("compile_timeout", "compile_cpu_time", "compile_memory_limit"):
            if limits[key] > 0:
                body[key] = limits[key]
        return body

    def judge(
        self,
        program: Program,
        tests: Sequence[Mapping[str, Any]],
        time_limit: float,
        memory: int,
        judge: _Judge,
    ) -> Verdict:
        language = self.PISTON_LANGUAGE.get(program.language, program.language)
        version = self.versions().get(language)
        if version is None:
            raise PistonError(
                f"piston at {self.endpoint}: no {language} runtime installed "
                f"(installed: {', '.join(sorted(self.versions())) or 'none'}); "
                f"install it (piston ppman install {language}) or use the local "
                "sandbox"
            )
        if program.language == "python" and (syntax := _python_syntax_error(program)):
            return syntax
        slowest: float | None = None
        for number, test in enumerate(tests, start=1):
            body = self.request_body(
                program, language, version, str(test["input"]), time_limit, memory
            )
            reply = self._request("POST", "/api/v2/execute", body)
            extras = {"tests_passed": number - 1, "tests_total": len(tests)}
            compiled = reply.get("compile")
            if compiled is not None and compiled.get("code") != 0:  # Piston's own rule
                return Verdict(
                    False,
                    "timeout" if compiled.get("status") == "TO" else "compile_error",
                    compile_ok=False,
                    extras=extras,
                    stderr_tail=tail(
                        compiled.get("stderr")
                        or compiled.get("output")
                        or compiled.get("message")
                        or ""
                    ),
                )
            run = reply.get("run") or {}
            wall_ms = run.get("wall_time")  # Piston >= 3.1 reports it; older ones do not
            if _is_ms(wall_ms):
                slowest = max(slowest or 0.0, wall_ms / 1000)
            failure = _piston_failure(run, body["run_cpu_time"], body["run_memory_limit"])
            if failure is None and not judge.accepts(test, str(run.get("stdout", "")).encode()):
                failure = "wrong_answer"
            if failure:
                return Verdict(
                    False,
                    failure,
                    compile_ok=True,
                    stderr_tail=tail(str(run.get("stderr") or run.get("message") or "")),
                    extras=extras,
                    run_s=slowest,
                )
        return Verdict(
            True,
            compile_ok=True,
            extras={"tests_passed": len(tests), "tests_total": len(tests)},
            run_s=slowest,
        )

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """One call with retries on connection errors, 429, 5xx and replies that are not Piston's
        shape (a proxy's error page, a half-written body); `PistonError` when exhausted, or at
        once, in one line, when Piston refuses the request (4xx)."""
        data = json.dumps(body).encode() if body is not None else None
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.25 * 2**attempt))
            request = urllib.request.Request(
                self.endpoint + path,
                data=data,
                method=method,
                headers={"Content-Type": "application/json"},
            )
            try:
                with self.slots, urllib.request.urlopen(request, timeout=120) as response:
                    reply = json.loads(response.read())
            except urllib.error.HTTPError as exc:
                text = exc.read()[:2000].decode("utf-8", "replace")
                last = f"HTTP {exc.code}: {text[:300]}"
                if exc.code == 429 or exc.code >= 500:
                    continue
                raise PistonError(
                    self._refusal(path, exc.code, text, body, len(data or b""))
                ) from None
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = str(getattr(exc, "reason", exc))
                continue
            problem = _malformed(path, reply)
            if problem:
                last = f"malformed reply: {problem}: {json.dumps(reply)[:200]}"
                continue
            return reply
        raise PistonError(
            f"piston at {self.endpoint}{path} failed after {self.retries + 1} attempts: {last}"
        )

    def _refusal(
        self, path: str, code: int, text: str, body: dict[str, Any] | None, size: int
    ) -> str:
        """One line for a request Piston refused: the limit and the config key to set when it is
        one of Piston's limits (v2.js: `<name> cannot exceed the configured limit of N`)."""
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
        message = text.strip()
        if isinstance(payload, dict):  # v2.js replies {message}; Express's body parser {stack}
            message = str(
                payload.get("message") or str(payload.get("stack") or "").split("\n")[0] or message
            )
        message = " ".join(message.split())[:300]
        limit = re.fullmatch(r"(\w+) cannot exceed the configured limit of (-?\d+)", message)
        if limit and body is not None:
            name, value = limit.groups()
            return (
                f"piston at {self.endpoint} refused {name}={body.get(name)}: cannot exceed the "
                f"configured limit of {value}; set evaluate.piston_limits.{name} to at most "
                f"{value} (or raise PISTON_{name.upper()} on the server)"
            )
        if "too large" in message:
            message += (
                f" (a {size}-byte request: Piston reads JSON bodies up to 100 kB, so a "
                "test input this large cannot go to it)"
            )
        return f"piston at {self.endpoint}{path} refused the request (HTTP {code}): {message}"


def _piston_limits(configured: Mapping[str, Any] | None) -> dict[str, int]:
    """Piston's limits as `evaluate.piston_limits` gives them (ms, bytes, characters; 0 or less:
    none), Piston's own defaults for the rest. An unknown key or a non-integer is a `UserError`."""
    configured = dict(configured or {})
    unknown = sorted(set(configured) - set(PISTON_DEFAULT_LIMITS))
    if unknown:
        raise UserError(
            f"evaluate.piston_limits: unknown key(s) {', '.join(unknown)}; known: "
            f"{', '.join(PISTON_DEFAULT_LIMITS)}"
        )
    for key, value in configured.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"evaluate.piston_limits.{key}: {value!r} is not an integer")
    return {**PISTON_DEFAULT_LIMITS, **configured}


def _is_ms(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _malformed(path: str, reply: Any) -> str | None:
    """What is wrong with a reply's shape, or None: a reply that is not Piston's must never turn
    into verdicts (an empty `run` would read as a crash of every sample)."""
    if path.endswith("/runtimes"):
        if not isinstance(reply, list) or not all(
            isinstance(r, dict)
            and isinstance(r.get("language"), str)
            and isinstance(r.get("version"), str)
            for r in reply
        ):
            return "runtimes is not a list of {language, version}"
        return None
    if not isinstance(reply, dict):
        return "not an object"
    for stage in ("compile", "run"):
        part = reply.get(stage)
        if stage == "compile" and part is None:
            continue
        if not isinstance(part, dict) or not ({"code", "signal"} & part.keys()):
            return f"`{stage}` is not an object with `code` or `signal`"
    return None


def _piston_failure(run: Mapping[str, Any], cpu_limit_ms: int, memory: int) -> str | None:
    """The error type of a Piston run before looking at its output. More CPU time than the limit
    (`cpu_time`, ms) is a timeout, as locally; so is Piston's `TO` (its CPU or wall clock)."""
    status = run.get("status")
    if status == "XX":
        raise PistonError(f"piston internal error: {run.get('message')}")
    cpu_ms = run.get("cpu_time")
    if (
        status == "TO"
        or (_is_ms(cpu_ms) and cpu_ms > cpu_limit_ms)
        or (run.get("signal") == "SIGKILL" and status is None)
    ):
        return "timeout"
    if status in ("OL", "EL"):  # more than output_max_size on stdout or stderr: killed
        return "output_limit"
    if run.get("code") == 0 and not run.get("signal"):
        return None
    text = f"{run.get('stderr', '')}{run.get('message', '')}"
    if "MemoryError" in text or "bad_alloc" in text or "memory allocation of" in text:
        return "memory_limit"
    used = run.get("memory")
    if run.get("signal") == "SIGKILL" and memory > 0 and _is_ms(used) and used >= 0.95 * memory:
        return "memory_limit"  # the cgroup's OOM kill
    return "runtime_error"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


register("stdio", StdioChecker)
