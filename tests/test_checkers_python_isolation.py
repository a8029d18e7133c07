"""The python checker binds the tests to the problem, not to the sample: the modules the tests use
are the real ones, a sample cannot read its batch siblings' programs, and every kind of failure
scored beside correct samples in one batch leaves their verdicts alone."""

from __future__ import annotations

import pytest

from ckpteval.checkers import Job, get_checker
from ckpteval.checkers.python import PythonChecker

#: Tests that use `math` and `re` without importing them (MBPP rows often lean on the solution's
#: imports): the names are the standard library's, whatever the sample binds to them.
USES_MODULES = {
    "task_id": "mbpp/modules",
    "code": "import math, re\n\ndef root(x):\n    return math.sqrt(x)\n\n"
    "def word(s):\n    return re.findall(r'[a-z]+', s)[0]\n",
    "test_list": [
        "assert math.isclose(root(16), 4.0)",
        "assert re.fullmatch(r'[a-z]+', word('12 abc 3')) is not None",
        "assert math.isclose(root(2.25), 1.5)",
    ],
}
HUMANEVAL_MODULES = {
    "task_id": "he/modules",
    "prompt": "def half(x):\n",
    "test": "def check(candidate):\n    assert math.isclose(candidate(3), 1.5)\n",
    "entry_point": "half",
}
ADD = {
    "task_id": "mbpp/add",
    "code": "def add(a, b):\n    return a + b\n",
    "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(20, 22) == 42"],
}


@pytest.fixture(scope="module")
def checker() -> PythonChecker:
    return get_checker("python", sandbox="bwrap", batch_size=64)  # type: ignore[return-value]


def verdicts(checker: PythonChecker, jobs: list[Job], timeout: float = 5.0) -> list:
    return checker.check_batch(jobs, timeout)


@pytest.mark.parametrize(
    "completion",
    [
        # a class standing in for the module: isclose accepts anything
        "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n    sqrt = None\n"
        "class re:\n    fullmatch = staticmethod(lambda *a: 'x')\n"
        "def root(x):\n    return -1\n\ndef word(s):\n    return '1'\n",
        # a real module object named after the one the tests want
        "import types\nmath = types.ModuleType('math')\nmath.isclose = lambda *a, **k: True\n"
        "re = types.ModuleType('re')\nre.fullmatch = lambda *a: 'x'\n"
        "def root(x):\n    return -1\n\ndef word(s):\n    return '1'\n",
        # another module under the name
        "import operator as math, operator as re\nmath.isclose = lambda *a, **k: True\n"
        "re.fullmatch = lambda *a: 'x'\n"
        "def root(x):\n    return -1\n\ndef word(s):\n    return '1'\n",
    ],
    ids=["class", "fake-module", "other-module"],
)
def test_a_sample_cannot_stand_in_for_the_tests_modules(
    checker: PythonChecker, completion: str
) -> None:
    wrong = Job("mbpp/modules", USES_MODULES, completion)
    right = Job("mbpp/modules", USES_MODULES, USES_MODULES["code"])
    bad, good = verdicts(checker, [wrong, right])
    assert not bad.passed, bad
    assert good.passed, good


def test_humaneval_tests_get_the_real_module_too(checker: PythonChecker) -> None:
    cheat = "    return -1\nclass math:\n    isclose = staticmethod(lambda *a, **k: True)\n"
    honest = "    return x / 2\n"
    bad, good = verdicts(
        checker,
        [
            Job("he/modules", HUMANEVAL_MODULES, cheat),
            Job("he/modules", HUMANEVAL_MODULES, honest),
        ],
    )
    assert not bad.passed and good.passed, (bad, good)


def test_a_sample_cannot_read_its_siblings_programs(checker: PythonChecker) -> None:
    """The thief looks for any other sample's main.py in its batch and runs its `add`."""
    thief = (
        "import os, glob\n\ndef _steal():\n"
        "    here = os.path.dirname(os.path.abspath(__file__))\n"
        "    for path in glob.glob(os.path.join(os.path.dirname(here), '*', 'main.py')):\n"
        "        if os.path.dirname(path) != here:\n"
        "            scope = {}\n"
        "            exec(open(path).read(), scope)\n"
        "            return scope['add']\n"
        "    raise RuntimeError('nothing found: ' + repr(os.listdir(os.path.dirname(here))))\n\n"
        "def add(a, b):\n    return _steal()(a, b)\n"
    )
    honest = Job("mbpp/add", ADD, ADD["code"])
    results = verdicts(checker, [honest, Job("mbpp/add", ADD, thief), honest])
    assert results[0].passed and results[2].passed
    assert not results[1].passed
    assert "nothing found: ['s1']" in results[1].stderr_tail, results[1].stderr_tail


#: (completion for ADD, the error type it must get); each sits between two correct samples.
FAILURES = [
    ("def add(a, b):\n    return a - b\n", "wrong_answer"),
    ("def add(a, b:\n", "compile_error"),
    ("def add(a, b):\n    raise ValueError('no')\n", "runtime_error"),
    ("def add(a, b):\n    while True:\n        pass\n", "timeout"),
    ("def add(a, b):\n    import time\n    time.sleep(60)\n", "timeout"),
    ("def add(a, b):\n    x = ' ' * (8 << 30)\n", "memory_limit"),
    ("def add(a, b):\n    while True:\n        print('x' * 65536)\n", "output_limit"),
    ("import os\nos._exit(0)\n", "runtime_error"),
    ("import ctypes\nctypes.string_at(0)\n", "runtime_error"),
    (
        "import os\nos.chdir('/tmp')\nfor _ in range(10000):\n    os.mkdir('d')\n    os.chdir('d')\n"
        "def add(a, b):\n    return a - b\n",
        "wrong_answer",
    ),
    (
        "import os, time\nfor _ in range(10000):\n    try:\n        if os.fork() == 0:\n"
        "            time.sleep(600)\n    except OSError:\n        break\n"
        "def add(a, b):\n    return a - b\n",
        "wrong_answer",
    ),
    (
        "import os, signal\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        "for _ in range(20):\n    if os.fork() == 0:\n        os.setsid()\n"
        "        while True:\n            pass\n"
        "def add(a, b):\n    while True:\n        pass\n",
        "timeout",
    ),
    (
        "import ctypes\nlibc = ctypes.CDLL(None)\nfor key in range(1, 256):\n"
        "    libc.shmget(key, 64 << 20, 0o1666)\n"
        "def add(a, b):\n    return a - b\n",
        "wrong_answer",
    ),
    ("def add(a, b):\n    return '\\udc80'\n", "wrong_answer"),
    # a lone surrogate (a JSON \\udXXX escape) in the source: no UTF-8 file can hold it, and
    # CPython refuses such source too
    ("# \udc80\ndef add(a, b):\n    return a + b\n", "compile_error"),
]


@pytest.mark.slow
def test_every_kind_of_failure_leaves_its_neighbours_verdicts_alone(
    checker: PythonChecker,
) -> None:
    honest = Job("mbpp/add", ADD, ADD["code"])
    jobs = [honest]
    for completion, _ in FAILURES:
        jobs += [Job("mbpp/add", ADD, completion), honest]
    results = verdicts(checker, jobs, timeout=3.0)
    assert all(v.passed for v in results[::2]), [
        (i, v) for i, v in enumerate(results) if i % 2 == 0 and not v.passed
    ]
    got = [(completion, v.error_type) for (completion, _), v in zip(FAILURES, results[1::2])]
    assert got == [(completion, kind) for completion, kind in FAILURES]
