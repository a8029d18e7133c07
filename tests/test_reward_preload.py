"""The reward function's imports are paid once per batch, and each sample still runs alone.

In the bwrap sandbox the driver imports the installed packages a reward file imports
(`ckpteval.checkers.reward.preload_modules`) before its first command, and each sample is a fork
of it that drops privileges and only then runs the file (ckpteval.sandbox_driver). These tests
run the real checker in the real sandbox: no state of one sample's reaches another, a sample that
attacks its process, its group or its parent fails alone, and a package is imported once per
batch (counted by the pid that imported it), never the user's own code.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.checkers.reward import WARM_CALLS, RewardFunctionChecker, preload_modules

PROBLEM = {"task_id": "1", "ground_truth": "2", "question": "1 + 1?"}

#: A reward function that imports a heavy package and keeps state between calls.
STATEFUL = """
import sys

SYMPY_PRELOADED = "sympy" in sys.modules
import sympy

CALLS = 0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global CALLS
    CALLS += 1
    sympy.ckpteval_marks = getattr(sympy, "ckpteval_marks", 0) + 1  # a preloaded module's global
    right = sympy.sympify(solution_str) == sympy.sympify(ground_truth)
    return {"score": float(right), "calls": CALLS, "marks": sympy.ckpteval_marks,
            "preloaded": SYMPY_PRELOADED}
"""

#: The same kind of function, with completions that attack the sample's process.
HOSTILE = """
import os
import signal
import time

import sympy


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "exit()":
        exit(5)
    if solution_str == "kill my group":
        os.killpg(0, signal.SIGKILL)
    if solution_str == "kill every process I can":
        os.kill(-1, signal.SIGKILL)
    if solution_str == "kill my parent":
        os.kill(os.getppid(), signal.SIGKILL)
    if solution_str == "hang":
        while True:
            time.sleep(0.01)
    if solution_str == "raise":
        raise ValueError("no")
    if solution_str == "poison":
        sympy.sympify = lambda text: 0  # every later call would be right, if it reached them
        return 0.0
    return float(sympy.sympify(solution_str) == sympy.sympify(ground_truth))
"""

#: Completions whose verdicts a hostile sample must not change: right, wrong, right, wrong ...
HONEST = ["2", "3", "1 + 1", "4 - 1", "2", "0"]


def _reward_checker(tmp_path: Path, source: str, **options: Any) -> RewardFunctionChecker:
    folder = tmp_path / "fn"
    folder.mkdir(exist_ok=True)
    (folder / "reward.py").write_text(source)
    checker = get_checker(
        "reward_function", reward_function=str(folder / "reward.py"), self_test="off: a test"
    )
    assert isinstance(checker, RewardFunctionChecker)
    for name, value in options.items():
        setattr(checker, name, value)
    return checker


def _one_batch(checker: RewardFunctionChecker, completions: list[str], timeout: float = 3.0):
    """Every completion scored in one batch: one sandbox, one driver, one preload."""
    try:
        return checker.check_batch([Job("1", PROBLEM, c) for c in completions], timeout)
    finally:
        checker.close()


def _outcome(verdict: Verdict) -> tuple[Any, ...]:
    return (verdict.passed, verdict.error_type, verdict.score)


def test_the_reward_files_installed_imports_are_preloaded_but_never_its_own_modules(
    tmp_path: Path,
) -> None:
    (tmp_path / "helpers.py").write_text("")
    (tmp_path / "local_pkg").mkdir()
    source = """
import os, json
import sympy as sp
import numpy.linalg
from math_verify import parse
from helpers import x
from local_pkg.sub import y
from . import z
from pip.__main__ import main
from sympy._private import w

def f():
    import pyarrow.parquet
    from scipy import stats
"""
    assert preload_modules(source, tmp_path) == [
        "math_verify",
        "numpy.linalg",
        "pyarrow.parquet",
        "scipy",
        "sympy",
    ]
    assert preload_modules("import sympy\ndef (:", tmp_path) == []


def test_every_sample_is_a_first_call_whatever_the_others_changed(tmp_path: Path) -> None:
    checker = _reward_checker(tmp_path, STATEFUL)
    assert checker.preload == ["sympy"]
    verdicts = _one_batch(checker, ["2", "1 + 1", "3", "2", "x"])
    assert [v.passed for v in verdicts] == [True, True, False, True, False]
    # Each sample is forked from the batch's warm zygote, which made its calls (on fixed inputs)
    # on an import of the file of its own, then imported it again: every sample's call is the
    # first of the module it calls, whatever the others changed; a package's globals keep what
    # the warm-up's calls left there (docs/evaluate.md).
    warm = len(WARM_CALLS)
    for verdict in verdicts:
        assert verdict.extras["reward_info"] == {
            "calls": 1,
            "marks": warm + 1,
            "preloaded": True,
        }


@pytest.mark.parametrize(
    "attack",
    [
        "exit",
        "exit()",
        "kill my group",
        "kill every process I can",
        "kill my parent",
        "hang",
        "raise",
        "poison",
    ],
)
def test_a_sample_that_attacks_its_process_fails_alone(tmp_path: Path, attack: str) -> None:
    alone = [_outcome(v) for v in _one_batch(_reward_checker(tmp_path, HOSTILE), HONEST)]
    assert alone == [
        (True, None, 1.0),
        (False, "wrong_answer", 0.0),
        (True, None, 1.0),
        (False, "wrong_answer", 0.0),
        (True, None, 1.0),
        (False, "wrong_answer", 0.0),
    ]
    mixed = HONEST[:3] + [attack] + HONEST[3:]
    verdicts = _one_batch(_reward_checker(tmp_path, HOSTILE), mixed, timeout=2.0)
    attacked = verdicts.pop(3)
    assert [_outcome(v) for v in verdicts] == alone
    expected = {"hang": "timeout", "poison": "wrong_answer"}.get(attack, "reward_error")
    assert (attacked.passed, attacked.error_type) == (False, expected)
    if attack == "exit()":  # the builtin, as under a plain `python`, though a fork of the driver's
        assert attacked.stderr_tail == "SystemExit: 5"


PROBE = """
import os

IMPORTED_IN = os.getpid()
IMPORTED_AS = os.getuid()
with open("/proc/self/status") as status:
    IMPORTED_CAPS = [line.split()[1] for line in status if line.startswith("CapEff:")][0]
"""

PROBED = """
import os

import {module}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open("/proc/self/status") as status:
        caps = [line.split()[1] for line in status if line.startswith("CapEff:")][0]
    return {{"score": 1.0, "imported_in": {module}.IMPORTED_IN, "imported_as":
             {module}.IMPORTED_AS, "imported_caps": {module}.IMPORTED_CAPS,
             "runs_in": os.getpid(), "runs_as": os.getuid(), "runs_caps": caps}}
"""

#: No capability: a sample's, and the sandbox's root's once a command gave them up. Rootless
#: (ckpteval not root) the driver and the samples share the namespace's one uid, 0, and only
#: the capabilities tell the driver from a sample.
NO_CAPS = "0000000000000000"


def _probe_site(tmp_path: Path, module: str, source: str = PROBE) -> Path:
    """A site directory holding the package `module`: installed code, as a trusted path."""
    site = tmp_path / "site"
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(source)
    return site


def test_an_installed_package_is_imported_once_per_batch(tmp_path: Path) -> None:
    site = _probe_site(tmp_path, "ckpteval_probe")
    checker = _reward_checker(tmp_path, PROBED.format(module="ckpteval_probe"))
    checker.site_dirs.append(site)
    assert checker.preload == ["ckpteval_probe"]
    infos = [v.extras["reward_info"] for v in _one_batch(checker, ["2"] * 6)]
    importers = {info["imported_in"] for info in infos}
    samples = {info["runs_in"] for info in infos}
    assert len(importers) == 1 and len(samples) == 6  # one import, six processes
    assert not importers & samples  # by the driver, before any sample
    assert {info["runs_caps"] for info in infos} == {NO_CAPS}
    if os.geteuid() == 0:
        assert {info["runs_as"] for info in infos} != {0}


def test_a_module_beside_the_reward_file_runs_only_as_the_sandbox_uid(
    tmp_path: Path,
) -> None:
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "beside_probe.py").write_text(PROBE)
    checker = _reward_checker(tmp_path, PROBED.format(module="beside_probe"))
    assert checker.preload == []
    infos = [v.extras["reward_info"] for v in _one_batch(checker, ["2"] * 4)]
    # Imported once, by the batch's warm zygote (which forks each sample), never by the driver.
    assert len({info["imported_in"] for info in infos}) == 1
    assert not {info["imported_in"] for info in infos} & {info["runs_in"] for info in infos}
    for info in infos:  # never as the sandbox's root
        assert info["imported_caps"] == info["runs_caps"] == NO_CAPS
        assert info["imported_as"] == info["runs_as"]
        if os.geteuid() == 0:
            assert info["runs_as"] != 0


def test_a_package_that_fails_to_import_is_skipped_and_fails_only_who_imports_it(
    tmp_path: Path,
) -> None:
    site = _probe_site(tmp_path, "ckpteval_broken", "raise RuntimeError('broken on import')\n")
    (site / "ckpteval_exits").mkdir()
    (site / "ckpteval_exits" / "__init__.py").write_text("raise SystemExit(4)\n")
    source = textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "import":
                import ckpteval_broken
            if solution_str == "exit":
                import ckpteval_exits
            return 1.0
    """)
    checker = _reward_checker(tmp_path, source)
    checker.site_dirs.append(site)
    assert checker.preload == ["ckpteval_broken", "ckpteval_exits"]
    ok, broken, exits = _one_batch(checker, ["2", "import", "exit"])
    assert (ok.passed, ok.score) == (True, 1.0)
    assert (broken.error_type, broken.stderr_tail) == (
        "reward_error",
        "RuntimeError: broken on import",
    )
    assert (exits.error_type, exits.stderr_tail) == ("reward_error", "SystemExit: 4")


#: A reward function drawing from preloaded packages' global random states.
RANDOM = """
import random
import numpy
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.0, "numpy": float(numpy.random.random()), "random": random.random()}
"""


def test_each_forked_sample_draws_its_own_random_numbers(tmp_path: Path) -> None:
    """numpy is preloaded once per batch and every sample is a fork of that process: without a
    reseed in each, every sample of the batch drew the same "random" numbers (as no two fresh
    processes do)."""
    checker = _reward_checker(tmp_path, RANDOM)
    assert "numpy" in preload_modules(RANDOM, tmp_path)
    verdicts = _one_batch(checker, ["a", "b", "c", "d"])
    draws = [
        (v.extras["reward_info"]["numpy"], v.extras["reward_info"]["random"]) for v in verdicts
    ]
    assert len({n for n, _ in draws}) == 4 and len({r for _, r in draws}) == 4, draws


def test_the_runner_reseeds_a_preloaded_generator_in_each_fork() -> None:
    """A package that seeds (or draws from) numpy's global generator when the driver preloads
    it leaves every forked sample the same state: the runner's first step gives each its own."""
    import subprocess
    import sys

    from ckpteval.checkers.reward import RESEED_SOURCE

    script = textwrap.dedent(
        """
        import os, sys
        import numpy
        numpy.random.seed(0)  # what a preloaded package may do at import
        reseeding = sys.argv[1] == "reseed"
        for _ in range(3):
            if os.fork() == 0:
                if reseeding:
                    exec(RESEED, globals())
                    reseed()
                print(numpy.random.random(), flush=True)
                os._exit(0)
            os.wait()
        """
    )
    draws = {}
    for mode in ("reseed", "plain"):
        out = subprocess.run(
            [sys.executable, "-c", f"RESEED = {RESEED_SOURCE!r}\n{script}", mode],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        draws[mode] = set(out)
    assert len(draws["plain"]) == 1  # the failure this guards against, reproduced
    assert len(draws["reseed"]) == 3, draws
