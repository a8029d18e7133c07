"""The python checker on real samples: passing, failing, broken, slow, crashing and hostile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.checkers.extract import code_block, python_program
from ckpteval.io import iter_jsonl

REPO = Path(__file__).resolve().parents[1]
PYFUNC = REPO / "src" / "ckpteval" / "data" / "tasks" / "pyfunc.jsonl"
PROBLEMS = {row["task_id"]: row for row in iter_jsonl(PYFUNC)}
SUM_SQ = PROBLEMS["pyfunc/0"]  # sum_of_squares(nums)
GOOD_BODY = "    return sum(n * n for n in nums)\n"
MBPP = {
    "task_id": "mbpp/1",
    "text": "Add two numbers.",
    "code": "def add(a, b):\n    return a + b\n",
    "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
    "test_setup_code": "",
}

# (name, problem, completion, expected error_type); None means the sample must pass.
CASES = [
    ("body", SUM_SQ, GOOD_BODY, None),
    (
        "full function in a fence with prose",
        SUM_SQ,
        "Here you go:\n```python\ndef sum_of_squares(nums):\n    return sum(x * x for x in nums)\n```\n"
        "This sums squares.",
        None,
    ),
    (
        "full function, no fence",
        SUM_SQ,
        "from typing import List\n\ndef sum_of_squares(nums: List[int]) -> int:\n"
        "    total = 0\n    for n in nums:\n        total += n * n\n    return total\n",
        None,
    ),
    ("body then [DONE]", SUM_SQ, GOOD_BODY + "[DONE]\nmore text that is not code", None),
    ("wrong answer", SUM_SQ, "    return 0\n", "wrong_answer"),
    ("syntax error", SUM_SQ, "    return (\n", "compile_error"),
    ("exception", SUM_SQ, "    raise ValueError('boom')\n", "runtime_error"),
    ("infinite loop", SUM_SQ, "    while True:\n        pass\n", "timeout"),
    ("exit(0) inside the function", SUM_SQ, "    import os\n    os._exit(0)\n", "runtime_error"),
    ("SystemExit(0)", SUM_SQ, "    raise SystemExit(0)\n", "runtime_error"),
    (
        "fork bomb",
        SUM_SQ,
        "    import os\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
        "timeout",
    ),
    ("memory bomb", SUM_SQ, "    x = bytearray(1 << 40)\n    return 0\n", "memory_limit"),
    (
        "printing gigabytes",
        SUM_SQ,
        "    import sys\n    while True:\n        sys.stdout.write('x' * 1000000)\n",
        "output_limit",
    ),
    (
        "reading the home directory",
        SUM_SQ,
        "    import os\n    return len(os.listdir('/root/.ssh')) + len(open('/root/.bashrc').read())\n",
        "runtime_error",
    ),
    (
        "writing outside the temp dir",
        SUM_SQ,
        "    open('/usr/lib/ckpteval-evil', 'w').write('x')\n" + GOOD_BODY,
        "runtime_error",
    ),
    (
        "opening a socket",
        SUM_SQ,
        "    import socket\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\n" + GOOD_BODY,
        "runtime_error",
    ),
    (
        "killing the parent (no effect) then answering",
        SUM_SQ,
        "    import os, signal\n    try:\n        os.kill(os.getppid(), signal.SIGKILL)\n"
        "    except OSError:\n        pass\n" + GOOD_BODY,
        None,
    ),
    ("mbpp reference", MBPP, MBPP["code"], None),
    ("mbpp [BEGIN]/[DONE]", MBPP, "[BEGIN]\ndef add(a, b):\n    return a + b\n[DONE]", None),
    ("mbpp wrong", MBPP, "def add(a, b):\n    return a - b\n", "wrong_answer"),
]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, Verdict]:
    """All cases checked in one call, two workers, a 3 s timeout."""
    checker = get_checker("python", sandbox="bwrap")
    jobs = [Job(p["task_id"], p, completion) for _, p, completion, _ in CASES]
    results = checker.check(jobs, workers=2, timeout=3)
    return {name: v for (name, *_), v in zip(CASES, results, strict=True)}


@pytest.mark.parametrize("name,expected", [(c[0], c[3]) for c in CASES])
def test_case_verdict(verdicts: dict[str, Verdict], name: str, expected: str | None) -> None:
    verdict = verdicts[name]
    assert verdict.error_type == expected, verdict
    assert verdict.passed == (expected is None)
    assert verdict.compile_ok == (expected != "compile_error")


def test_failure_keeps_the_useful_stderr(verdicts: dict[str, Verdict]) -> None:
    assert "AssertionError" in verdicts["wrong answer"].stderr_tail
    assert "ValueError: boom" in verdicts["exception"].stderr_tail
    assert "/tmp/ckpteval-py-" not in verdicts["exception"].stderr_tail  # stable paths
    for verdict in (verdicts["wrong answer"], verdicts["exception"]):  # no harness frames
        assert "sandbox_driver/" not in verdict.stderr_tail, verdict.stderr_tail


def test_code_block_prefers_the_language_block() -> None:
    text = "```text\nnot code\n```\nand\n```python\nx = 1\n```"
    assert code_block(text, ("python",)) == "x = 1\n"
    assert code_block("```python\ny = 2\n", ("python",)) == "y = 2\n"  # unterminated fence
    assert code_block("plain", ("python",)) == "plain"


def test_full_function_keeps_the_prompt_imports_and_helpers() -> None:
    problem = {
        "prompt": 'import math\n\ndef helper(x):\n    return x\n\ndef f(x):\n    """doc"""\n',
        "entry_point": "f",
    }
    program = python_program(problem, "def f(x):\n    return helper(math.floor(x))\n")
    namespace: dict[str, object] = {}
    exec(compile(program, "p", "exec"), namespace)  # noqa: S102 - our own fixed program
    assert namespace["f"](2.5) == 2  # type: ignore[operator]


def test_self_test_jobs_pass_and_fail_as_they_should() -> None:
    checker = get_checker("python")
    references = checker.reference_jobs(PROBLEMS)
    wrong = checker.known_wrong_jobs(PROBLEMS)
    results = checker.check([*references, *wrong], workers=2, timeout=5)
    assert len(references) == len(PROBLEMS) == 8
    assert all(v.passed for v in results[: len(references)])
    assert not any(v.passed for v in results[len(references) :])


_NONE_AS_A_USER = """
import json, subprocess, sys
from ckpteval.checkers import Job, get_checker

problem, good = json.loads(open(sys.argv[1]).read())
busy = [subprocess.Popen(["sleep", "120"]) for _ in range(80)]  # the user's own processes
try:
    checker = get_checker("python", sandbox="none")
    jobs = [Job("pyfunc/0", problem, good), Job("pyfunc/0", problem, "    return 0\\n")]
    verdicts = checker.check(jobs, workers=1, timeout=5)
finally:
    for process in busy:
        process.kill()
print(json.dumps([[v.error_type, v.stderr_tail[-300:]] for v in verdicts]))
"""


def test_sandbox_none_judges_a_user_who_runs_more_processes_than_a_sample_may() -> None:
    """`sandbox: none` as a user who is not root, with 80 processes of that user running (a
    trainer's, vLLM's): RLIMIT_NPROC counts every thread of the uid, and the sample's limit of
    64 left it none to fork, so every sample was a runtime_error. Now the sample's `nproc` comes
    on top of what the user runs, and the verdicts are the sandbox's."""
    import json
    import os
    import tempfile

    from conftest import as_nobody_json

    with tempfile.TemporaryDirectory(prefix="ckpteval-none-") as tmp:  # not root's tmp_path
        work = Path(tmp)
        os.chmod(work, 0o777)
        (work / "run.py").write_text(_NONE_AS_A_USER)
        (work / "data.json").write_text(json.dumps([SUM_SQ, GOOD_BODY]))
        rows = as_nobody_json(work / "run.py", str(work / "data.json"), cwd=work, tmpdir=tmp)
    assert [error for error, _ in rows] == [None, "wrong_answer"], rows


def test_sandbox_none_gives_the_same_verdicts(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        checker = get_checker("python", sandbox="none")
    assert "WITHOUT isolation" in caplog.text
    jobs = [
        Job("pyfunc/0", SUM_SQ, GOOD_BODY),
        Job("pyfunc/0", SUM_SQ, "    return 0\n"),
        Job("pyfunc/0", SUM_SQ, "    import os\n    os._exit(0)\n"),
    ]
    assert [v.error_type for v in checker.check(jobs, workers=1, timeout=5)] == [
        None,
        "wrong_answer",
        "runtime_error",
    ]


# The tests run in a process of their own and see the sample's values as plain data (see
# ckpteval/sandbox_driver/channel.py): what an in-process test would see must come across unchanged.
VALUES = {
    "task_id": "values/1",
    "test_list": [
        "from collections import Counter, namedtuple, OrderedDict",
        "import math, fractions",
        "assert counts('abca') == {'a': 2, 'b': 1, 'c': 1} and counts('') == Counter()",
        "assert point() == (1, 2) and point().x == 1",
        "assert sorted(gen(3)) == [0, 1, 2] and list(gen(0)) == []",
        "assert big() == 7 ** 20000 and math.isnan(special()[0]) and special()[1] == -math.inf",
        "assert half() == 0.5 and half() == fractions.Fraction(1, 2)",
        "assert mixed() == [{1: (2.5, None)}, {'x', 'y'}, b'\\x00', 3 + 4j, True, range(3)]",
        "l = [3, 1, 2]",
        "sort_in_place(l)",
        "assert l == [1, 2, 3]",
        "try:\n    fails()\n    raise RuntimeError('no ValueError')\nexcept ValueError as exc:\n    assert 'bad' in str(exc)",
        "box = make_box(5)",
        "assert box.value == 5 and take(box) == 5 and len(box) == 1 and box",
        "assert OrderedDict(pairs()) == {'k': 1}",
    ],
}
VALUES_CODE = """
from collections import Counter, namedtuple, OrderedDict
import fractions
P = namedtuple("P", "x y")
def counts(s): return Counter(s)
def point(): return P(1, 2)
def gen(n): return (i for i in range(n))
def big(): return 7 ** 20000
def special(): return [float("nan"), float("-inf")]
def half(): return fractions.Fraction(1, 2)
def mixed(): return [{1: (2.5, None)}, {"x", "y"}, b"\\x00", 3 + 4j, True, range(3)]
def sort_in_place(x): x.sort()
def fails(): raise ValueError("bad input")
class Box:
    def __init__(self, v): self.value = v
    def __len__(self): return 1
def make_box(v): return Box(v)
def take(box): return box.value
def pairs(): return OrderedDict(k=1).items()
"""


def test_values_reach_the_tests_as_they_would_in_process() -> None:
    checker = get_checker("python")
    (verdict,) = checker.check_batch([Job("values/1", VALUES, VALUES_CODE)], timeout=5)
    assert verdict.passed, verdict.stderr_tail


RACE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ckpteval.checkers import Job, get_checker
problem = {
    "task_id": "t/0",
    "prompt": "import not_installed\\n\\n\\ndef f(x):\\n",
    "test": "import not_installed\\n\\n\\ndef check(candidate):\\n    assert candidate(1) == 1\\n",
    "entry_point": "f",
}
checker = get_checker("python")
for _ in range(2):
    verdicts = checker.check_batch([Job("t/0", problem, "    return x\\n")] * 40, timeout=5)
    print(json.dumps(sorted({(v.passed, v.error_type) for v in verdicts})))
"""


def test_a_sample_killed_while_it_starts_neither_hangs_nor_fails_its_batch(
    tmp_path: Path,
) -> None:
    """When a judged run's tests end at once (they import what is not installed), the driver
    kills the sample's process, which may still be starting: killed before its `setsid`, its
    group did not exist yet, so the kill missed it, it started, waited for a kill that had come
    and gone, and the batch hung; killed before it opened its output files, the host's read of
    them raised FileNotFoundError and failed the batch. Under two busy loops the old code did
    one or the other in 5 of 6 such batches of 40 (12-03); each batch must now end, every
    sample with its own verdict."""
    load = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2)]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", RACE, str(REPO / "src")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for busy in load:
            busy.kill()
            busy.wait()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ['[[false, "runtime_error"]]'] * 2
