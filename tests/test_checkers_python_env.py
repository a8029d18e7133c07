"""`evaluate.python_env`: tests written for an environment with packages (BigCodeBench's `import
requests`, patched with `unittest.mock`) judge honest samples as their own harness does once the
sandbox's Python is given that environment, read-only; without it, the standard library only.

Two environments: a tiny one made here (a `netlib` package whose `fetch` would reach the network,
as `requests.get` would: the tests patch it), and the real `requests` installed beside ckpteval
(this interpreter's `sys.prefix`), patched as BigCodeBench's tests patch it (no network)."""

from __future__ import annotations

import base64
import sys
import warnings
from pathlib import Path

import pytest

from ckpteval.checkers import Job, get_checker
from ckpteval.checkers.python import PythonChecker, python_env_record, python_env_site
from ckpteval.errors import UserError

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
NETLIB = "def fetch(url):\n    raise OSError('no network in a test: ' + url)\n"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv-shaped directory with one package, `netlib`, and its distribution's metadata."""
    root = tmp_path_factory.mktemp("env")
    site = root / SITE
    (site / "netlib").mkdir(parents=True)
    (site / "netlib" / "__init__.py").write_text(NETLIB)
    info = site / "netlib-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: netlib\nVersion: 1.2\n")
    return root


def netlib_problem(env: Path) -> dict:
    """BigCodeBench's shape: the tests patch `netlib.fetch` and assert on the mock."""
    return {
        "task_id": "env/netlib",
        "prompt": "import netlib\n\n\ndef task_func(url):\n"
        '    """The "name" field of the record `netlib.fetch(url)` returns."""\n',
        "test": "import unittest\nfrom unittest.mock import patch\n\n\n"
        "class TestCases(unittest.TestCase):\n"
        "    @patch('netlib.fetch', return_value={'name': 'ckpt'})\n"
        "    def test_name(self, fetch):\n"
        "        self.assertEqual(task_func('http://x/a'), 'ckpt')\n"
        "        fetch.assert_called_once_with('http://x/a')\n",
        "entry_point": "task_func",
    }


HONEST = "    return netlib.fetch(url)['name']\n"
WRONG = "    return netlib.fetch(url + '/')['name']\n"


def hostile(site: Path) -> str:
    """Rewrites the environment's package so that the patch is bypassed, then answers right
    only if the rewrite took."""
    path = site / "netlib" / "__init__.py"
    return (
        "    try:\n"
        f"        with open({str(path)!r}, 'w') as f:\n"
        '            f.write(\'def fetch(url):\\n    return {"name": "ckpt"}\\n\')\n'
        "    except OSError:\n"
        "        return None\n"
        "    return 'ckpt'\n"
    )


def test_a_local_environment_reaches_sample_and_tests_read_only(env: Path) -> None:
    """Honest passes, wrong fails, a sample writing into the environment cannot (the bind is
    read-only: the file is unchanged and the sample fails); without the environment the honest
    one fails on the import, as before (the default is the standard library only)."""
    problem = netlib_problem(env)
    site = python_env_site(env)
    checker = get_checker("python", python_env=str(env))
    jobs = [Job("env/netlib", problem, c) for c in (HONEST, WRONG, hostile(site))]
    verdicts = checker.check_batch(jobs, timeout=10)
    assert [(v.passed, v.error_type) for v in verdicts] == [
        (True, None),
        (False, "wrong_answer"),
        (False, "wrong_answer"),
    ], [v.stderr_tail[-300:] for v in verdicts]
    assert (site / "netlib" / "__init__.py").read_text() == NETLIB
    plain = get_checker("python").check_batch(jobs[:1], timeout=10)[0]
    assert not plain.passed and "netlib" in plain.stderr_tail, plain.stderr_tail[-300:]


def test_sandbox_none_gets_the_environment_too(env: Path) -> None:
    checker = get_checker("python", sandbox="none", python_env=str(env / "bin" / "python"))
    jobs = [Job("env/netlib", netlib_problem(env), c) for c in (HONEST, WRONG)]
    assert [v.passed for v in checker.check_batch(jobs, timeout=10)] == [True, False]


REQUESTS = {
    "task_id": "env/requests",
    "prompt": "import requests\n\n\ndef task_func(url):\n"
    '    """GET `url` (5 s timeout); its JSON\'s "name", or None if the status is not 200 or\n'
    '    the request fails."""\n',
    "test": "import unittest\nfrom unittest.mock import MagicMock, patch\n\nimport requests\n\n\n"
    "class TestCases(unittest.TestCase):\n"
    "    @patch('requests.get')\n"
    "    def test_name(self, get):\n"
    "        get.return_value = MagicMock(status_code=200)\n"
    "        get.return_value.json.return_value = {'name': 'ckpt'}\n"
    "        self.assertEqual(task_func('http://x/a'), 'ckpt')\n"
    "        get.assert_called_once_with('http://x/a', timeout=5)\n\n"
    "    @patch('requests.get', side_effect=requests.exceptions.ConnectionError('down'))\n"
    "    def test_down(self, get):\n"
    "        self.assertIsNone(task_func('http://x/b'))\n",
    "entry_point": "task_func",
}


# A few seconds: the sandbox's driver imports the real `requests` (and its dependencies) once.
def test_a_real_installed_package_patched_as_bigcodebench_does() -> None:
    """`requests` from the environment ckpteval runs in: its exception class crosses from the
    tests' patch to the sample's `except` as in one process."""
    honest = (
        "    try:\n        response = requests.get(url, timeout=5)\n"
        "    except requests.exceptions.RequestException:\n        return None\n"
        "    return response.json()['name'] if response.status_code == 200 else None\n"
    )
    no_timeout = honest.replace(", timeout=5", "")
    uncaught = "    return requests.get(url, timeout=5).json()['name']\n"
    checker = get_checker("python", python_env=sys.prefix)
    jobs = [Job("env/requests", REQUESTS, c) for c in (honest, no_timeout, uncaught)]
    verdicts = checker.check_batch(jobs, timeout=10)
    assert [v.passed for v in verdicts] == [True, False, False], [
        v.stderr_tail[-300:] for v in verdicts
    ]
    record = checker.cell_fields()["python_env"]
    assert any(p.startswith("requests==") for p in record["packages"]), record


def test_not_an_environment_is_one_line(tmp_path: Path) -> None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for bad in (tmp_path, tmp_path / "missing", tmp_path / "bin" / "python"):
        with pytest.raises(UserError) as caught:
            PythonChecker(python_env=str(bad))
        assert "\n" not in str(caught.value)
        assert str(caught.value).startswith(f"evaluate.python_env: {bad} is not a python{version}")
    with pytest.raises(UserError):
        PythonChecker.check_run_config({}, {"python_env": str(tmp_path)})
    PythonChecker.check_run_config({}, {"python_env": None})  # unset: the standard library


def test_the_cell_records_the_environment(env: Path) -> None:
    record = python_env_record(python_env_site(env))
    assert record == {
        "site_packages": str((env / SITE).resolve()),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "packages": ["netlib==1.2"],
    }
    assert get_checker("python").cell_fields() == {}


# A few seconds: the evaluate step's self-test and its scoring are sandbox batches of their own,
# and only that step writes the cell.
def test_ckpteval_score_takes_the_environment_and_the_cell_records_it(
    env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the command line and the evaluate step (self-test included): the honest sample
    passes, the wrong one fails, the cell names the environment; another checker refuses it."""
    import json

    from ckpteval.cli import main

    problems = tmp_path / "problems.jsonl"
    problem = {**netlib_problem(env), "canonical_solution": HONEST}
    problems.write_text(json.dumps(problem) + "\n")
    samples = tmp_path / "samples.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"task_id": "env/netlib", "completion": c}) + "\n" for c in (HONEST, WRONG)
        )
    )
    out = tmp_path / "r.jsonl"
    argv = ["score", "python", "--problems", str(problems), "--samples", str(samples)]
    assert main([*argv, "--out", str(out), "--workers", "1", "--python-env", str(env)]) == 0
    assert [json.loads(line)["passed"] for line in out.read_text().splitlines()] == [True, False]
    cell = json.loads(out.with_suffix(".json").read_text())
    assert cell["python_env"]["packages"] == ["netlib==1.2"]
    refused = ["score", "math", "--problems", str(problems), "--samples", str(samples)]
    assert main([*refused, "--out", str(out), "--python-env", str(env)]) != 0
    assert "--python-env applies to the python checker" in capsys.readouterr().err


NUMPY = {
    "task_id": "env/numpy",
    "prompt": "import numpy as np\n\n\ndef task_func(matrix):\n"
    '    """The column means of `matrix` (an array), its element-wise object labels, and the\n'
    '    index of the largest mean."""\n',
    "test": "import unittest\n\nimport numpy as np\n\n\n"
    "class TestCases(unittest.TestCase):\n"
    "    def test_means(self):\n"
    "        matrix = np.asfortranarray(np.array([[1, 2, 3], [3, 4, 9]], dtype=np.int32))\n"
    "        means, labels, best = task_func(matrix)\n"
    "        self.assertIsInstance(means, np.ndarray)\n"
    "        self.assertEqual(means.dtype, np.float64)\n"
    "        np.testing.assert_array_equal(means, [2.0, 3.0, 6.0])\n"
    "        np.testing.assert_array_equal(labels, np.array(['a', 2, None], dtype=object))\n"
    "        self.assertIsInstance(best, np.int64)\n"
    "        self.assertEqual(best, 2)\n"
    "        self.assertIsInstance(means.max(), np.float64)\n"
    "        self.assertTrue(matrix.flags.f_contiguous)\n",
    "entry_point": "task_func",
}
NUMPY_HONEST = (
    "    assert isinstance(matrix, np.ndarray) and matrix.dtype == np.int32\n"
    "    means = np.asarray(matrix, dtype=float).mean(axis=0)\n"
    "    return means, np.array(['a', 2, None], dtype=object), np.argmax(means)\n"
)
NUMPY_WRONG = (  # the row means, and a list where the tests want an array
    NUMPY_HONEST.replace("axis=0", "axis=1"),
    NUMPY_HONEST.replace("return means,", "return list(means),"),
)

SORT = {
    "task_id": "env/sort",
    "prompt": "import numpy as np\n\n\ndef task_func(values):\n"
    '    """Sort the array `values` in place."""\n',
    "test": "import unittest\n\nimport numpy as np\n\n\n"
    "class TestCases(unittest.TestCase):\n"
    "    def test_sorted(self):\n"
    "        values = np.array([3, 1, 2])\n"
    "        task_func(values)\n"
    "        np.testing.assert_array_equal(values, [1, 2, 3])\n",
    "entry_point": "task_func",
}
SORT_HONEST = "    values.sort()\n"
SORT_WRONG = "    values = np.sort(values)\n"  # a sorted copy: the tests' array stays as it was

PANDAS = {
    "task_id": "env/pandas",
    "prompt": "import pandas as pd\n\n\ndef task_func(df):\n"
    '    """`df` (columns "city", "temp"; a daily index) with a column "hot": temp above 20."""\n',
    "test": "import unittest\n\nimport numpy as np\nimport pandas as pd\n\n\n"
    "class TestCases(unittest.TestCase):\n"
    "    def test_hot(self):\n"
    "        index = pd.date_range('2024-06-01', periods=3, name='day')\n"
    "        df = pd.DataFrame({'city': ['Oslo', 'Rome', None], 'temp': [12.5, 28.0, 21.0]},\n"
    "                          index=index)\n"
    "        want = df.assign(hot=[False, True, True])\n"
    "        pd.testing.assert_frame_equal(task_func(df), want)\n"
    "        pd.testing.assert_series_equal(task_func(df)['hot'], want['hot'])\n"
    "        pd.testing.assert_index_equal(task_func(df).columns, want.columns)\n"
    "        self.assertEqual(task_func(df).index.freqstr, 'D')\n",
    "entry_point": "task_func",
}
PANDAS_HONEST = "    return df.assign(hot=df['temp'] > 20)\n"
PANDAS_WRONG = (  # >= where > is asked: the same here; ints where bools are asked; a copy
    "    return df.assign(hot=(df['temp'] > 20).astype(int))\n",  # without the index's freq
    "    return df.assign(hot=df['temp'] > 20).reset_index(drop=True)\n",
)


# A few seconds: the sandbox's driver imports numpy and pandas once per batch.
def test_numpy_and_pandas_values_cross_by_value_both_ways() -> None:
    """Honest samples that take and return arrays, numpy scalars, object arrays and frames pass
    (`isinstance`, numpy's and pandas's asserts, dtypes, an index's freq, the tests' array's
    memory order and an in-place sort of it hold as in one process); wrong ones fail on what
    differs."""
    checker = get_checker("python", python_env=sys.prefix)
    jobs = [Job("env/numpy", NUMPY, c) for c in (NUMPY_HONEST, *NUMPY_WRONG)]
    jobs += [Job("env/pandas", PANDAS, c) for c in (PANDAS_HONEST, *PANDAS_WRONG)]
    jobs += [Job("env/sort", SORT, c) for c in (SORT_HONEST, SORT_WRONG)]
    verdicts = checker.check_batch(jobs, timeout=20)
    assert [v.passed for v in verdicts] == [True, False, False, True, False, False, True, False], [
        v.stderr_tail[-400:] for v in verdicts
    ]
    assert all(v.error_type == "wrong_answer" for v in verdicts if not v.passed)


def forged_reply(tree: tuple) -> str:
    """A sample that answers the tests' call with `tree` as its value, written to the reply pipe
    as the channel frames it, then exits: the tests read the forgery first."""
    reply = repr(("ok", tree, [], []))
    return (
        "    import os\n"
        f"    data = {reply!r}.encode()\n"
        "    os.write(4, len(data).to_bytes(8, 'big') + data)\n"
        "    os._exit(0)\n"
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


FORGED = (
    ("Na", "|O8", [1], "C", b64(b"\0" * 8)),  # an object pointer as bytes
    ("Ns", "|O8", b"\0" * 8),
    ("Na", "<f8", [4], "C", b64(b"\0" * 8)),  # bytes short of the shape
    ("Na", "<f8", [1 << 30, 1 << 30], "C", ""),
    ("Na", "<f8", [1], "C", "AAAA!AAAAAA="),  # no base64
    ("Na", "<M8[zz]", [1], "C", b64(b"\0" * 8)),  # numpy refuses the unit
    ("No", [3], [1, 2]),
    (
        "Pf",
        [("n", ("Na", "<f8", [1], "C", b64(b"\0" * 8)))],
        ("Pr", 0, 2, 1, None),
        ("Pr", 0, 1, 1, None),
    ),
)


# A few seconds: one batch.
def test_a_forged_array_fails_the_sample_as_a_malformed_reply() -> None:
    """The tests' process checks what the sample sends before numpy reads it: an object dtype,
    bytes that do not fill the shape, a frame whose columns do not fit its index fail the
    sample; the tests' process ends as it should, its report naming the malformed reply."""
    checker = get_checker("python", python_env=sys.prefix)
    jobs = [Job("env/numpy", NUMPY, forged_reply(tree)) for tree in FORGED]
    verdicts = checker.check_batch(jobs, timeout=20)
    assert [v.passed for v in verdicts] == [False] * len(FORGED)
    assert all(
        f"a malformed {tree[0]} value in a reply" in v.stderr_tail
        for tree, v in zip(FORGED, verdicts, strict=True)
    ), [v.stderr_tail[-300:] for v in verdicts]


def _across(value: object) -> object:
    """`value` as the channel carries it: encoded, written as a literal, read, decoded."""
    import ast

    from ckpteval.sandbox_driver.channel import _encode, _load, _PlainOnly

    return _load(ast.literal_eval(repr(_encode(value, _PlainOnly()))), None)


def test_numpy_and_pandas_values_keep_type_dtype_shape_and_names() -> None:
    """In this process (the channel's functions, no sandbox): each kind of value comes back
    equal, of its type and dtype; what its data cannot rebuild (a subclass, a structured dtype,
    a category's categories) is no data, so it stays a reference."""
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    arrays = [
        np.arange(6, dtype=">i2").reshape(2, 3),
        np.asfortranarray(np.arange(6.0).reshape(3, 2)),
        np.array(["a", "bcd"]),
        np.array([b"x", b""]),
        np.array([1 + 2j, np.nan]),
        np.array(["2024-01-01", "NaT"], dtype="datetime64[ns]"),
        np.zeros((0, 3), dtype=bool),
        np.array([1, "x", None, [2]], dtype=object),
    ]
    for array in arrays:
        back = _across(array)
        assert type(back) is np.ndarray and back.dtype == array.dtype, (array, back)
        assert back.flags.f_contiguous == array.flags.f_contiguous
        np.testing.assert_array_equal(back, array)
    for scalar in (
        np.float64(0.1),
        np.int8(-3),
        np.bool_(True),
        np.str_("é"),
        np.uint64(2**64 - 1),
    ):
        back = _across(scalar)
        assert type(back) is type(scalar) and back == scalar
    frame = pd.DataFrame(
        {"n": [1, 2], "s": ["x", None], "i": pd.array([1, None], dtype="Int64")},
        index=pd.Index([10, 20], name="k"),
    )
    pd.testing.assert_frame_equal(_across(frame), frame)
    series = pd.Series([0.5, 1.5], index=pd.timedelta_range("1s", periods=2), name=("a", 1))
    pd.testing.assert_series_equal(_across(series), series)
    pd.testing.assert_index_equal(_across(pd.RangeIndex(2, 9, 3)), pd.RangeIndex(2, 9, 3))
    with warnings.catch_warnings():  # numpy's note that `matrix` is not recommended
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        matrix = np.asmatrix([[1, 2]])  # a subclass numpy defines: `type(x) is np.ndarray` fails
    for opaque in (
        matrix,
        np.zeros(2, dtype=[("a", "<i4")]),
        pd.Series(["a"], dtype="category"),
    ):
        with pytest.raises(TypeError):
            _across(opaque)
