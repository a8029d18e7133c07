"""scripts/module_durations.py sums a `--durations=0` report per module (setup, call and
teardown lines; parametrized ids with spaces and `::` in them; other lines ignored), and
scripts/pytest-table.sh (what `make test` runs) prints that table and keeps pytest's status."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

REPORT = """\
============================= slowest durations ==============================
372.68s call     tests/test_slurm.py::test_workflow_runs_through_the_2node_profile
297.73s setup    tests/test_swap_workflow.py::test_the_fresh_sweep_starts_one_engine_per_checkpoint
64.06s call     tests/test_contract.py::test_rerun[infer-cells0]
1.50s teardown tests/test_slurm.py::test_profile_spreads_gpu_jobs_over_both_nodes
0.50s call     tests/test_checkers_python_hacks.py::test_cheat[exit via a name::x]
(8 durations < 0.005s hidden.  Use -vv to show these durations.)
============ 2 failed, 910 passed, 2 skipped in 2501.31s (0:41:41) =============
"""


def test_the_report_is_summed_per_module() -> None:
    spec = importlib.util.spec_from_file_location(
        "durations", REPO / "scripts" / "module_durations.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    totals = module.module_totals(REPORT)
    assert totals.keys() == {
        "tests/test_slurm.py",
        "tests/test_swap_workflow.py",
        "tests/test_contract.py",
        "tests/test_checkers_python_hacks.py",
    }
    assert totals["tests/test_slurm.py"] == pytest.approx(374.18)
    assert totals["tests/test_checkers_python_hacks.py"] == pytest.approx(0.5)


WRAPPER = REPO / "scripts" / "pytest-table.sh"


def run_wrapper(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The wrapper on a scratch project, without the venv's plugins (their imports cost seconds)."""
    return subprocess.run(
        ["bash", str(WRAPPER), sys.executable, *args, "-p", "no:cacheprovider"],
        cwd=cwd,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_test_targets_print_the_slowest_modules_and_keep_pytests_status(tmp_path: Path) -> None:
    """`make test`'s wrapper: a failing test still fails the run (and the table is printed), and
    a selection that collects nothing (pytest's status 5) fails it too, never passes silently."""
    (tmp_path / "test_slowish.py").write_text(
        "import time\n\ndef test_sleeps():\n    time.sleep(0.05)\n\n"
        "def test_fails():\n    assert 1 == 2\n"
    )
    failed = run_wrapper(tmp_path, ".")
    assert failed.returncode == 1, failed.stdout[-2000:]
    table = failed.stdout.split("slowest test modules", 1)[1]
    assert "test_slowish.py" in table and "total over" in table, table
    none = run_wrapper(tmp_path, ".", "-k", "no_such_test")
    assert none.returncode == 5, none.stdout[-2000:]
    assert "slowest test modules" in none.stdout
