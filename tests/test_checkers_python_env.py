"""`evaluate.python_env`: tests written for an environment with packages (BigCodeBench's `import
requests`, patched with `unittest.mock`) judge honest samples as their own harness does once the
sandbox's Python is given that environment, read-only; without it, the standard library only.

Two environments: a tiny one made here (a `netlib` package whose `fetch` would reach the network,
as `requests.get` would: the tests patch it), and the real `requests` installed beside ckpteval
(this interpreter's `sys.prefix`), patched as BigCodeBench's tests patch it (no network)."""

from __future__ import annotations

import sys
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
