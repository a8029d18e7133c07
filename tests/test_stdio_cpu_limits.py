"""Time limits of stdin/stdout problems are CPU time: a program within the limit passes and one
over it fails whatever the machine's load; the wall clock only catches programs that sleep.

The programs burn a calibrated amount of CPU (`time.process_time()` in Python, `clock()` in C++:
the process's own CPU time, interpreter start-up included) at 0.7x and 1.3x a 0.5 s limit; Python
start-up costs ~15 ms of CPU here, far from either margin. The load is twice as many busy
processes as cores, each ending itself after two minutes if the test process dies first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import pytest

from ckpteval.checkers import Job, get_checker
from ckpteval.checkers.python import python_interpreter
from ckpteval.checkers.stdio import cpu_backstop, wall_limit
from ckpteval.sandbox import Limits, Sandbox

CORES = len(os.sched_getaffinity(0))
LIMIT = 0.5
PROBLEM = {"task_id": "cpu", "tests": [{"input": "1 2\n", "output": "3\n"}], "time_limit": LIMIT}


def python_burner(cpu_s: float) -> str:
    return (
        f"```python\nimport time\nwhile time.process_time() < {cpu_s}:\n    pass\n"
        "a, b = map(int, input().split())\nprint(a + b)\n```"
    )


def cpp_burner(cpu_s: float) -> str:
    return (
        "```cpp\n#include <ctime>\n#include <iostream>\nint main() {\n"
        f"    while ((double)std::clock() / CLOCKS_PER_SEC < {cpu_s}) {{}}\n"
        "    long long a, b; std::cin >> a >> b; std::cout << a + b << std::endl;\n}\n```"
    )


class Hogs:
    """`n` processes that keep a core busy each, killed on exit (and by their own alarm after
    `max_s`, should this process die without cleaning up)."""

    def __init__(self, n: int, max_s: int = 120) -> None:
        self.n, self.max_s = n, max_s

    def __enter__(self) -> Self:
        code = f"import signal\nsignal.alarm({self.max_s})\nwhile True:\n    pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


def test_cpu_of_every_process_a_program_starts_is_measured(tmp_path: Path) -> None:
    """Work handed to a child the program never reaps still counts: the sandbox driver is the
    subreaper of each command's orphans and measures its whole process tree."""
    program = tmp_path / "orphan.py"
    program.write_text(
        "import os, time\nr, w = os.pipe()\nif os.fork() == 0:\n"
        "    if os.fork() == 0:\n        while time.process_time() < 0.4:\n"
        "            pass\n        os.write(w, b'x')\n    os._exit(0)\n"
        "while time.process_time() < 0.2:\n    pass\nos.read(r, 1)\nprint('done')\n"
    )
    os.chmod(tmp_path, 0o755)
    interpreter, root = python_interpreter()
    result = Sandbox("bwrap").run(
        [interpreter, "-I", "-S", "-B", str(program)],
        limits=Limits(wall_s=10, cpu_s=3),
        workdir=tmp_path,
        readable=[root],
    )
    assert result.exit_code == 0 and result.stdout == b"done\n", result
    assert 0.6 <= result.cpu_s < 0.75, result.cpu_s  # 0.2 + 0.4 s, plus two start-ups


def test_limits_of_a_run() -> None:
    assert cpu_backstop(0.5) == 1 and cpu_backstop(1) == 2 and cpu_backstop(2.5) == 3
    assert wall_limit(1.0) == 4.0 and wall_limit(1.0, scale=3) == 10.0


@pytest.mark.slow
@pytest.mark.needs("g++")
@pytest.mark.parametrize("hogs", [0, 2 * CORES], ids=["no-added-load", "2x-cores-busy"])
def test_cpu_time_decides_the_verdict_under_load(hogs: int) -> None:
    """Python and C++ programs at 0.7x and 1.3x the limit, several runs each, and a sleeper, with
    and without 2 x cores busy processes: 0 wrong verdicts. (The wall-clock limits this replaces
    failed both ways: 1.3x passed on a quiet machine, 0.7x was killed on a busy one.)"""
    reps_py, reps_cpp = 6, 2
    cases = (
        [(python_burner(0.7 * LIMIT), None)] * reps_py
        + [(python_burner(1.3 * LIMIT), "timeout")] * reps_py
        + [(cpp_burner(0.7 * LIMIT), None)] * reps_cpp
        + [(cpp_burner(1.3 * LIMIT), "timeout")] * reps_cpp
        + [("```python\nimport time\ntime.sleep(60)\n```", "timeout")]
    )
    checker = get_checker("stdio", sandbox="bwrap")
    start = time.monotonic()
    try:
        with Hogs(hogs):
            time.sleep(1 if hogs else 0)  # let the load show in /proc/loadavg's instant count
            verdicts = checker.check([Job("cpu", PROBLEM, c) for c, _ in cases], workers=CORES)
    finally:
        checker.close()
    wrong = [
        (i, expected, v.error_type, v.stderr_tail[-200:])
        for i, ((_, expected), v) in enumerate(zip(cases, verdicts))
        if v.error_type != expected
    ]
    print(
        f"\n{len(cases)} runs beside {hogs} busy processes on {CORES} cores in "
        f"{time.monotonic() - start:.1f} s: {len(wrong)} wrong verdicts"
    )
    assert wrong == []
