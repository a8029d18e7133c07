"""The python checker: HumanEval-style (`prompt`, `test`, `entry_point`) and MBPP-style
(`test_list`) problems, each sample run in its own sandbox with its own interpreter.

Samples are checked in batches (one per worker), each batch in one sandbox whose driver runs every
sample as its own process with its own limits and cleans up in between (`Sandbox.run_many`).

A sample passes only if the interpreter exits 0 *and* prints a per-run random token written after
the last test: a completion that calls `exit(0)` / `os._exit(0)` from inside the function under
test ends the process "successfully" before the tests finish, and must not pass.

The interpreter is the base interpreter of the Python running ckpteval (not its virtualenv), run
with `-I -S -B`: standard library only, no user site, no bytecode writes.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpteval.checkers import Checker, Job, Verdict, register, tail
from ckpteval.checkers.extract import python_program
from ckpteval.errors import UserError
from ckpteval.sandbox import Command, Limits, RunResult, Sandbox

#: Standard-library modules test programs commonly import, imported once per batch.
PRELOAD = ("typing", "collections", "math", "re", "itertools", "functools", "heapq", "string")

_EXCEPTION_LINE = re.compile(rb"^(\w+(?:\.\w+)*)(?::|$)", re.M)


def python_interpreter() -> tuple[str, Path]:
    """The base interpreter of this Python and the directory tree it needs (bound read-only)."""
    return os.path.realpath(sys._base_executable), Path(sys.base_prefix).resolve()  # type: ignore[attr-defined]


class PythonChecker(Checker):
    name = "python"
    version = "1"
    default_timeout = 10.0
    compiles = True

    def __init__(self, *, sandbox: str = "bwrap", memory_bytes: int = 2 << 30,
                 batch_size: int = 32) -> None:
        self.sandbox = Sandbox(sandbox)
        self.batch_size = batch_size
        self.memory_bytes = memory_bytes
        self.interpreter, self.prefix = python_interpreter()

    def validate_problem(self, task_id: str, problem: Mapping[str, Any]) -> None:
        if "test_list" in problem:
            if not isinstance(problem["test_list"], list):
                raise UserError(f"problem {task_id}: test_list must be a list of assert statements")
            return
        missing = [k for k in ("prompt", "test", "entry_point") if not problem.get(k)]
        if missing:
            raise UserError(f"problem {task_id}: python problems need prompt, test and entry_point "
                            f"(HumanEval) or test_list (MBPP); missing {', '.join(missing)}")

    def batch_size_for(self, n_jobs: int, workers: int) -> int:
        """Up to `batch_size`, and several batches per worker, so that a batch of slow samples
        does not idle the others."""
        return max(1, min(self.batch_size, -(-n_jobs // (4 * max(1, workers)))))

    def check_batch(self, jobs: Sequence[Job], timeout: float) -> list[Verdict]:
        """Samples sharing one sandbox, each in its own process under its job's timeout, or else
        `timeout`."""
        verdicts: list[Verdict | None] = [None] * len(jobs)
        with tempfile.TemporaryDirectory(prefix="ckpteval-py-") as tmp:
            workdir = Path(tmp)
            os.chmod(workdir, 0o755)
            tokens: dict[int, str] = {}
            commands: list[Command] = []
            for i, job in enumerate(jobs):
                token = secrets.token_hex(16)
                source = python_program(job.problem, job.completion) + "\n" + _tests(job.problem, token)
                try:
                    compile(source, "main.py", "exec", dont_inherit=True)
                except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
                    verdicts[i] = Verdict(False, "compile_error", compile_ok=False,
                                          stderr_tail=tail(f"{type(exc).__name__}: {exc}"))
                    continue
                sample_dir = workdir / f"s{i}"
                sample_dir.mkdir(mode=0o755)
                (sample_dir / "main.py").write_text(source, encoding="utf-8")
                tokens[i] = token
                commands.append(Command([self.interpreter, "-I", "-S", "-B", "main.py"],
                                        Limits(wall_s=job.timeout or timeout,
                                               memory_bytes=self.memory_bytes),
                                        cwd=sample_dir, python_file=sample_dir / "main.py"))
            results = self.sandbox.run_many(commands, workdir=workdir, readable=[self.prefix],
                                            preload=PRELOAD)
            for i, result in zip(tokens, results):
                verdict = classify(result, tokens[i])
                verdict.stderr_tail = verdict.stderr_tail.replace(f"{workdir}/s{i}/", "")
                verdict.duration_s = verdict.run_s = result.duration_s
                verdicts[i] = verdict
        return verdicts  # type: ignore[return-value]

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        jobs = []
        for task_id, problem in problems.items():
            solution = problem.get("canonical_solution") or problem.get("code")
            if solution:
                jobs.append(Job(task_id, problem, solution))
        return jobs

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        task_id, problem = next(iter(problems.items()))
        entry = problem.get("entry_point")
        if entry:
            early_exit = f"def {entry}(*args, **kwargs):\n    import os\n    os._exit(0)\n"
            wrong = f"def {entry}(*args, **kwargs):\n    return object()\n"
        else:
            early_exit = "import os\nos._exit(0)\n"
            wrong = "raise SystemExit(0)\n"
        return [Job(task_id, problem, early_exit), Job(task_id, problem, wrong)]


def _tests(problem: Mapping[str, Any], token: str) -> str:
    """The test code appended to the program, ending with the success token."""
    if "test_list" in problem:
        setup = str(problem.get("test_setup_code") or "")
        imports = "\n".join(problem.get("test_imports") or [])
        body = "\n".join([imports, setup, *problem["test_list"]])
    else:
        body = f"{problem['test']}\n\ncheck({problem['entry_point']})"
    return f"{body}\n\nimport sys as _ckpteval_sys\n_ckpteval_sys.stdout.write('\\n{token}\\n')\n"


def classify(result: RunResult, token: str) -> Verdict:
    """Map a finished run to a verdict (compile errors were caught before running)."""
    stderr = tail(result.stderr)
    if result.timed_out or result.signal == signal.SIGXCPU:
        return Verdict(False, "timeout", compile_ok=True, stderr_tail=stderr)
    if result.output_limit:
        return Verdict(False, "output_limit", compile_ok=True, stderr_tail=stderr)
    if result.exit_code == 0 and result.stdout.rstrip().endswith(token.encode()):
        return Verdict(True, None, compile_ok=True, stderr_tail=stderr)
    exceptions = _EXCEPTION_LINE.findall(result.stderr[-4096:])
    last = exceptions[-1].decode() if exceptions else ""
    if last.endswith("MemoryError"):
        kind = "memory_limit"
    elif last.endswith("AssertionError"):
        kind = "wrong_answer"
    else:
        kind = "runtime_error"
    if result.exit_code == 0 and not stderr:
        stderr = "exited with status 0 before the tests finished"
    return Verdict(False, kind, compile_ok=True, stderr_tail=stderr)


register("python", PythonChecker)
