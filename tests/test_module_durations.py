"""scripts/module_durations.py sums a `--durations=0` report per module (setup, call and
teardown lines; parametrized ids with spaces and `::` in them; other lines ignored)."""

from __future__ import annotations

import importlib.util
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
