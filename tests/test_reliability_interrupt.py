"""Interrupt Snakemake for real while a job runs, then run plain `snakemake` again: that run must
finish the sweep in one go (every cell scored, exit 0), and a dry run after it plans nothing.

The signal goes to the Snakemake process alone, as `kill` or a batch scheduler sends it: Snakemake
then waits for the running job, which finishes and writes its output, and marks that output
incomplete. The sweep is a replay run (existing solutions: no engine, no model) of one checkpoint
and a reward task of one problem, whose function sleeps on the self-test's inputs only, so that
the self-test job is still running when the signal comes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    REPO,
    WORKFLOW_ENV,
    dry_snakemake,
    run_snakemake,
    small_config,
    snakemake_cmd,
    why_failed,
    write_config,
)

#: The self-test calls the function on the ground truth as the completion (and on an empty one):
#: those calls sleep, the scoring of the replayed solution does not.
REWARD = """
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.strip() in ("", str(ground_truth)):
        time.sleep(3)
    return float(solution_str.split("####")[-1].strip() == str(ground_truth))
"""
ROW = {
    "data_source": "ckpteval/arith",
    "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
    "reward_model": {"style": "rule", "ground_truth": "4"},
    "extra_info": {"index": 0},
}


def _sweep(root: Path) -> Path:
    """One replayed checkpoint (`step_1`), one reward task, one cell."""
    (root / "val.jsonl").write_text(json.dumps(ROW) + "\n")
    (root / "reward.py").write_text(REWARD)
    solutions = root / "sol" / "step_1" / "sum.jsonl"
    solutions.parent.mkdir(parents=True)
    solutions.write_text(json.dumps({"task_id": "0", "completion": "#### 4"}) + "\n")
    task = {
        "problems": str(root / "val.jsonl"),
        "checker": {"reward_function": str(root / "reward.py"), "self_test": "ground_truth"},
    }
    run = {"backend": "replay", "solutions": str(root / "sol" / "step_{step}" / "{task}.jsonl")}
    write_config(root, small_config(root, runs={"rep": run}, tasks={"sum": task}, seeds=[42]))
    return root / "results" / "scores" / "rep" / "step_1" / "sum" / "greedy-s42.json"


def _interrupt_selftest(work: Path, signum: signal.Signals) -> subprocess.CompletedProcess[str]:
    """Start the sweep, send `signum` to Snakemake once the self-test job has started, and wait
    for Snakemake to end."""
    logs = work / "logs" / "selftest"
    proc = subprocess.Popen(
        snakemake_cmd(work),
        cwd=REPO,
        env={**os.environ, **WORKFLOW_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not any(logs.glob("*.log")) and proc.poll() is None:
            assert time.monotonic() < deadline, "the self-test job never started"
            time.sleep(0.2)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_self_test_is_finished_with_every_cell_by_the_next_run(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Before the fix the next run ran the self-test alone, said `1 of 1 steps (100%) done` and
    exited 0 with the cell unscored: the interrupted self-test's verdict existed, so the cell's
    edge to it was `ancient`, and Snakemake, rerunning the incomplete self-test, skipped the own
    reasons (a missing score) of every job behind it."""
    score = _sweep(tmp_path)
    interrupted = _interrupt_selftest(tmp_path, signum)
    assert interrupted.returncode != 0, interrupted.stderr[-3000:]
    assert not score.exists(), "the signal came after the cell was scored"

    proc = run_snakemake(tmp_path)
    assert proc.returncode == 0, why_failed(proc, tmp_path)
    assert json.loads(score.read_text())["metrics"]["reward_mean"]["value"] == 1.0
    dry = dry_snakemake(tmp_path)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stderr
