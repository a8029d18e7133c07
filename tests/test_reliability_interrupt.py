"""Interrupt Snakemake for real while a job runs, then run plain `snakemake` again: that run must
finish the sweep in one go (every cell scored, exit 0), and a dry run after it plans nothing.

Two sweeps. The first is a replay run (existing solutions: no engine, no model) of one checkpoint
and a reward task of one problem, whose function sleeps on the self-test's inputs only, so that
the self-test job is still running when the signal comes: the regression of a self-test
interrupted by SIGINT or SIGTERM (sent to the Snakemake process alone, as `kill` or a batch
scheduler sends it). The second is the smallest demo sweep with a job of every rule of `all`
(consolidate, the engine job, the self-test, evaluate, aggregate, summary), interrupted at each
with SIGINT, SIGTERM and SIGKILL (the whole process group: a crashed node); its final run's
tidy table must equal an uninterrupted run's. The `publish` target, never part of `all`, is
interrupted the same way on the uninterrupted run's finished sweep.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
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
from test_publish import tensorboard_points

from ckpteval.publish import table_points

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


def _start(work: Path, stdout: Any, stderr: Any, *targets: str) -> subprocess.Popen[str]:
    """Plain `snakemake` (or with `targets`) on `work` in a session of its own, with SIGINT's default action: a test
    run from a background job of a non-interactive shell inherits SIGINT ignored, and Python
    keeps ignoring a signal ignored when it starts, so Snakemake would never see the Ctrl-C."""
    return subprocess.Popen(
        snakemake_cmd(work, *targets),
        cwd=REPO,
        env={**os.environ, **WORKFLOW_ENV},
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _interrupt_selftest(work: Path, signum: signal.Signals) -> subprocess.CompletedProcess[str]:
    """Start the sweep, send `signum` to Snakemake once the self-test job has started, and wait
    for Snakemake to end."""
    logs = work / "logs" / "selftest"
    proc = _start(work, subprocess.PIPE, subprocess.PIPE)
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


# ------------------------------------------------------------ every rule of a demo sweep, for real

#: The rules of `all` in the order their jobs first run on the demo (consolidate, the engine job,
#: the self-test, scoring, the summary's build and its publication). `publish` is not here: it is
#: never part of `all` (only asked for by name; its own test is the last of this module).
RULES = ("consolidate", "infer", "selftest", "evaluate", "aggregate", "summary")
#: Rules whose jobs run inside Snakemake's own process (`run:`) and write a log only on failure:
#: Snakemake's announcement of the job is the sign that it runs.
IN_PROCESS = {"summary"}
ANNOUNCED = re.compile(r"^(?:local)?rule (\w+):\n((?:[ \t]+.*\n)*)", re.M)


def _demo_sweep(root: Path, demo_dir: Path) -> Path:
    """The smallest demo sweep that has a job of every rule: the demo's last checkpoint, a math
    task and the demo's verl reward task (its self-test), four problems each."""
    run = root / "run"
    run.mkdir(parents=True)
    last = max((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    (run / last.name).symlink_to(last)
    verl = REPO / "config" / "examples" / "verl"
    tasks = {
        "arith": {"limit": 4},
        "arith_verl": {
            "problems": str(verl / "arith_val.jsonl"),
            "limit": 4,
            "checker": {
                "reward_function": str(verl / "arith_reward.py"),
                "self_test": "ground_truth",
            },
        },
    }
    sampling = {"greedy": {"temperature": 0.0, "max_new_tokens": 32}}
    write_config(root, small_config(run, tasks=tasks, sampling=sampling))
    return root


def _tree(pid: int) -> set[int]:
    """`pid` and its descendants (children of every thread: Snakemake starts jobs from threads)."""
    pids, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        pids.add(parent)
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                todo += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
    return pids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _crash(proc: subprocess.Popen[str]) -> None:
    """SIGKILL Snakemake's process group, and any process of its tree outside the group, as a
    crashed node ends them all; wait until none is left."""
    pids = _tree(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes outlived the crash: {left}"


def _running(work: Path, text: str, remaining: list[str], since: float) -> str | None:
    """The first rule of `remaining` whose job this start announced and that runs: its log is
    written by this start (a log of an earlier start is older than `since`)."""
    for match in ANNOUNCED.finditer(text):
        rule = match.group(1)
        if rule not in remaining:
            continue
        if rule in IN_PROCESS:
            return rule
        log = re.search(r"^\s+log: (\S+)", match.group(2), re.M)
        if log is None:
            continue
        path = work / log.group(1).rstrip(",")
        with contextlib.suppress(OSError):
            if path.stat().st_mtime >= since:
                return rule
    return None


def _interrupt_next(
    work: Path, remaining: list[str], signum: signal.Signals, start: int, *targets: str
) -> tuple[str | None, int, str]:
    """Start plain `snakemake` (or with `targets`); once a job of a rule in `remaining` runs, send `signum` to
    Snakemake (SIGKILL: `_crash`) and wait for its end. Returns that rule (None if Snakemake
    ended before one ran), Snakemake's exit status and its output."""
    out = work / f"start-{start}.out"
    since = time.time() - 1
    with out.open("wb") as sink:
        proc = _start(work, sink, subprocess.STDOUT, *targets)
    rule = None
    try:
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            rule = _running(work, out.read_text(errors="replace"), remaining, since)
            if rule is not None:
                break
            time.sleep(0.05)
        if rule is not None and signum == signal.SIGKILL:
            _crash(proc)
        elif rule is not None:
            proc.send_signal(signum)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            _crash(proc)
    return rule, proc.returncode, out.read_text(errors="replace")


def _tidy(work: Path) -> pd.DataFrame:
    """The tidy table's values per cell and metric (no timings in it), in one order."""
    table = pd.read_parquet(work / "results" / "summary" / "metrics.parquet")
    keys = ["run", "ckpt", "task", "variant", "metric"]
    return table[[*keys, "value", "n", "errored"]].sort_values(keys).reset_index(drop=True)


@pytest.fixture(scope="module")
def clean_sweep(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Path:
    """The demo sweep, finished by one uninterrupted run."""
    work = _demo_sweep(tmp_path_factory.mktemp("clean"), demo_dir)
    proc = run_snakemake(work)
    assert proc.returncode == 0, why_failed(proc, work)
    return work


@pytest.fixture(scope="module")
def clean_run(clean_sweep: Path) -> pd.DataFrame:
    """The demo sweep's tidy table from one uninterrupted run (taken before any test publishes
    from that sweep)."""
    return _tidy(clean_sweep)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_an_interrupt_at_any_rule_is_finished_by_the_next_plain_run(
    tmp_path: Path, demo_dir: Path, clean_run: pd.DataFrame, signum: signal.Signals
) -> None:
    """One sweep per signal, started again and again with plain `snakemake`: each start is
    interrupted while a job of the next rule not yet interrupted runs (its log written by this
    start), until every rule of RULES was; each of those starts must have gone on to that rule
    (a start that ends before, with exit 0 or not, is the false "done" this test is for) and
    must not exit 0. One more plain start must then exit 0 with every cell scored, the summary
    whole, the tidy table's values those of the clean run, and a dry run must plan nothing.

    Cost, measured on a 2-core box at load ~7 (about half that on a quiet one): the clean run,
    module-scoped and shared by the three signals, 270 s (100 s quiet), most of it the engine
    job's CPU vLLM start; each signal's sweep 290-430 s: seven Snakemake starts (~5-15 s of
    parse each), consolidation twice, and the engine job three times (the one interrupted, then
    once per later start that finds the generations not yet moved into place: ~40 s each, every
    request served from the cache); SIGKILL's was the cheapest (its starts end at once). A sweep
    per rule and signal, eighteen, would each pay a run up to its rule and a final run, the
    engine start in most: several times this. The chain proves the same for each rule (the start
    after its interrupt must plan and run the rest, or it fails here).
    SIGINT and SIGTERM go to Snakemake alone, as `kill` or a batch scheduler sends them; SIGKILL
    goes to the whole process group and every job, as a crashed node ends them."""
    work = _demo_sweep(tmp_path, demo_dir)
    remaining, starts = list(RULES), []
    while remaining:
        rule, status, output = _interrupt_next(work, remaining, signum, len(starts))
        assert rule is not None, (
            f"start {len(starts)} (after interrupts at {starts}) ended with exit {status} "
            f"before a job of {remaining} ran:\n{output[-4000:]}"
        )
        assert status != 0, f"interrupted at {rule}, Snakemake exited 0:\n{output[-3000:]}"
        starts.append(rule)
        remaining.remove(rule)

    proc = run_snakemake(work)
    assert proc.returncode == 0, why_failed(proc, work)
    scores = work / "results" / "scores"
    cells = sorted(c.relative_to(scores).as_posix() for c in scores.glob("*/*/*/*.json"))
    ckpt = next((work / "run").iterdir()).name
    assert cells == [f"demo/{ckpt}/{task}/greedy-s42.json" for task in ("arith", "arith_verl")]
    summary = work / "results" / "summary"
    assert pd.read_csv(summary / "missing.csv").empty
    assert all((summary / name).stat().st_size > 0 for name in ("metrics.md", "report.html"))
    got = _tidy(work)
    assert got[["run", "ckpt", "task", "variant", "metric", "n", "errored"]].equals(
        clean_run[["run", "ckpt", "task", "variant", "metric", "n", "errored"]]
    )
    assert got["value"].tolist() == pytest.approx(clean_run["value"].tolist(), nan_ok=True)
    dry = dry_snakemake(work)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_an_interrupted_publish_is_finished_by_the_next_run_of_its_target(
    tmp_path: Path, clean_sweep: Path, signum: signal.Signals
) -> None:
    """`snakemake publish` on a finished sweep, interrupted while the publish job runs (its log
    written by this start), must not exit 0; the next `snakemake publish` must exit 0 with every
    point of the tidy table in TensorBoard exactly once, and a dry run of the target must plan
    nothing. Each signal publishes to a TensorBoard logdir of its own, from no ledger.

    Cost: no sweep of its own (the module's clean run, finished; a publish section changes only
    the publish job's identity): per signal two Snakemake starts, a publish job of a few
    seconds and a dry run; measured 55-220 s per signal on a 2-core box at load ~13 (most of it
    the starts' parse and interpreter start under that load)."""
    work = clean_sweep
    config = yaml.safe_load((work / "config" / "config.yaml").read_text())
    logdir = tmp_path / "tb"
    config["publish"] = {"tensorboard": {"logdir": str(logdir)}}
    write_config(work, config)
    summary = work / "results" / "summary"
    shutil.rmtree(summary / "published", ignore_errors=True)
    shutil.rmtree(work / "logs" / "publish", ignore_errors=True)

    rule, status, output = _interrupt_next(work, ["publish"], signum, int(signum), "publish")
    assert rule == "publish", f"Snakemake ended with exit {status} before publishing:\n{output}"
    assert status != 0, f"interrupted at publish, Snakemake exited 0:\n{output[-3000:]}"

    proc = run_snakemake(work, "publish")
    assert proc.returncode == 0, why_failed(proc, work)
    points, _ = table_points(pd.read_parquet(summary / "metrics.parquet"))
    assert points, "the demo's checkpoint has a step: it has points to publish"
    sent = tensorboard_points(logdir)
    assert sorted(sent) == sorted((p.run, p.key, p.step) for p in points)
    assert all(len(values) == 1 for values in sent.values()), "a point sent twice"
    for p in points:
        assert sent[(p.run, p.key, p.step)][0] == pytest.approx(p.value, nan_ok=True)
    record = json.loads((summary / "published" / "tensorboard.json").read_text())
    assert record["new"] + record["changed"] + record["unchanged"] == len(points)
    dry = dry_snakemake(work, "publish")
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stderr
