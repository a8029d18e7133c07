"""Planning is read-only (docs/reruns.md#planning-is-read-only): parsing the workflow creates,
moves, rewrites and deletes no file a job reads or writes, on a finished sweep and beside a
running one. Only the cache keyed by content (`results/sources/`) may be written by a parse.

Two sweeps: bench/plan.py's synthetic finished sweep (placeholder checkpoints, every output
written as the jobs would, no model run: seconds to build), on which every verb is planned; and
a copy of the rerun-contract sweep of tests/contract_sweep.py (run for real once per pytest run,
each module on a copy of its own), for the files a real run leaves and for a live sweep with dry
runs beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    REPO,
    WORKFLOW_ENV,
    dry_snakemake,
    forked_main,
    jobs_started_without_restart,
    snakemake_cmd,
)
from contract_sweep import CELLS, Sweep, cell_files, planned, shared_sweep

from ckpteval.backends import cache_namespace
from ckpteval.status import LIVE_SWEEP_LINE

#: Content-keyed caches a parse may write (checkpoint content identities, hashes of big files),
#: and Snakemake's own bookkeeping of an invocation (its IO cache, the logs of --summary/--dag).
CACHES = ("results/sources/", ".snakemake/iocache/", ".snakemake/log/")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import plan as bench_plan  # noqa: E402 - bench/plan.py: the synthetic sweeps


@pytest.fixture(scope="module")
def sweep(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    with shared_sweep(demo_dir, tmp_path_factory, "plan-readonly") as finished:
        yield finished


def tree(work: Path) -> dict[str, tuple[str, int]]:
    """(sha256, mtime in ns) of every file under the working directory (results/, logs/,
    configs, checkpoints, Snakemake's metadata), the content-keyed caches left out."""
    found = {}
    for path in sorted(work.rglob("*")):
        rel = str(path.relative_to(work))
        if path.is_file() and not rel.startswith(CACHES):
            found[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return found


def changed(before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def ckpteval(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`ckpteval ARGS` in `work`, forked from this process (conftest.forked_main: a fresh
    interpreter's import of ckpteval proves nothing more about what the command writes)."""
    from ckpteval.cli import main

    return forked_main(main, list(args), work)


def plan(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`snakemake ARGS` (a planning command: `-n ...`, `--summary`, `--dag`...) as the tests'
    workflow runs invoke it, forked from this process: the child parses the real workflow and
    config from scratch, as `python -m snakemake` would, without paying its imports (~4 s)."""
    import snakemake.cli

    return forked_main(snakemake.cli.main, snakemake_cmd(work, *args)[3:], REPO)


GEN = "results/generations/demo/step_100/arith/greedy-s42.jsonl"
SCORE = "results/scores/ep/step_7/pyfunc/greedy-s42.json"

#: Every planning command: Snakemake's own, and each verb of docs/reruns.md under `-n`.
PLANNING = [
    ("-n",),
    ("--summary",),
    ("--detailed-summary",),
    ("--dag",),
    ("--rulegraph",),
    ("-n", "-f", GEN),
    ("-n", "-R", GEN),
    ("-n", "-f", GEN.replace(".jsonl", ".meta.json")),
    ("-n", "-f", SCORE),
    ("-n", "-f", "results/models/demo/step_400"),
    ("-n", "-R", "infer"),
    ("-n", "-R", "endpoint"),
    ("-n", "-R", "generation"),
    ("-n", "-R", "consolidate"),
    ("-n", "-R", "model_card"),
    ("-n", "-R", "evaluate"),
    ("-n", "-R", "aggregate"),
    ("-n", "-F"),
    ("-n", "-F", "--until", "generation"),
    ("-n", "-F", "--omit-from", "evaluate"),
]


# ----------------------------------------------- every verb planned on a synthetic finished sweep

SYN_GEN = "results/generations/sweep/step_100/arith/greedy-s42.jsonl"
SYN_SCORE = "results/scores/sweep/step_200/pyfunc/hot-s1.json"
SYN_CELLS = 3 * 20
SUMMARY = {"aggregate": 1, "summary": 1}
ALL_CELLS = {"generation": SYN_CELLS, "evaluate": SYN_CELLS, **SUMMARY}
#: The self-tests (rule selftest) of its code tasks, pyfunc, rustfunc and humaneval: forced by
#: `-F`, kept by `--omit-from evaluate` (they come before the evaluate jobs, after no generation).
SELF_TESTS = {"selftest": 3}

#: (arguments, jobs per rule the dry run plans): docs/reruns.md's table, on 3 checkpoints x 20
#: cells; None: a command that plans nothing to count (it prints a graph or a table).
SYNTHETIC_VERBS: list[tuple[tuple[str, ...], dict[str, int] | None]] = [
    (("-n",), {}),
    (("--summary",), None),
    (("--dag",), None),
    (("--rulegraph",), None),
    (("-n", "-f", SYN_GEN), {"infer": 1, "generation": 1}),
    (("-n", "-R", SYN_GEN), {"infer": 1, "generation": 1, "evaluate": 1, **SUMMARY}),
    (("-n", "-f", SYN_GEN.replace(".jsonl", ".meta.json")), {"infer": 1, "generation": 1}),
    (("-n", "-f", SYN_SCORE), {"evaluate": 1}),
    (("-n", "-f", "results/models/sweep/step_300"), {"consolidate": 1}),
    (("-n", "-R", "infer"), {"infer": 3, **ALL_CELLS}),
    (("-n", "-R", "generation"), {"infer": 3, **ALL_CELLS}),
    (("-n", "-R", "consolidate"), {"consolidate": 3, "infer": 3, **ALL_CELLS}),
    (("-n", "-R", "evaluate"), {"evaluate": SYN_CELLS, **SUMMARY}),
    (("-n", "-R", "aggregate"), SUMMARY),
    (("-n", "-F"), {"consolidate": 3, "infer": 3, **ALL_CELLS, **SELF_TESTS}),
    (("-n", "-F", "--until", "generation"), {"consolidate": 3, "infer": 3, "generation": 60}),
    (
        ("-n", "-F", "--omit-from", "evaluate"),
        {"consolidate": 3, "infer": 3, "generation": 60, **SELF_TESTS},
    ),
]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("plan-synthetic")
    bench_plan.make_sweep(work, 3)
    assert bench_plan.finish(work) == SYN_CELLS
    assert jobs_planned(work, "-n") == {}, "the synthetic sweep is finished"
    return work


def jobs_planned(work: Path, *args: str) -> dict[str, int] | None:
    proc = plan(work, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, (args, out[-3000:])
    if "Nothing to be done" in out:
        return {}
    if "Job stats:" not in out:
        return None
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    found = re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)
    return {rule: int(n) for rule, n in found if rule not in ("all", "job")}


@pytest.mark.slow
def test_every_verb_plans_its_chain_and_changes_no_file(synthetic: Path) -> None:
    """Each verb of docs/reruns.md under `-n`, and `--summary`, `--dag`, `--rulegraph`,
    `ckpteval status` and `ckpteval check`: the chain the table promises, and every file keeps
    its bytes and modification time (the content-keyed cache and Snakemake's own logs aside)."""
    before = tree(synthetic)
    for args, jobs in SYNTHETIC_VERBS:
        planned_jobs = jobs_planned(synthetic, *args)
        if jobs is not None:
            assert planned_jobs == jobs, args
        assert changed(before, tree(synthetic)) == [], args
    for command in ("status", "check"):
        proc = ckpteval(synthetic, command)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert changed(before, tree(synthetic)) == [], command


@pytest.mark.slow
def test_damaged_files_are_planned_and_left_in_place(synthetic: Path) -> None:
    """A truncated generation file, a score cell that does not parse, a score cell whose
    samples file is gone, a model card that does not parse: a dry run plans each one's chain
    (redo inputs, the engine job's round as a target) and removes nothing."""
    results = synthetic / "results"
    cut = {
        results / SYN_GEN.removeprefix("results/"): 5,
        results / SYN_SCORE.removeprefix("results/"): 7,
        results / "models/sweep/step_300.json": 9,
    }
    samples = results / "scores/sweep/step_100/rustfunc/hot-s2.jsonl"
    saved = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in [*cut, samples]}
    try:
        for path, keep in cut.items():
            path.write_bytes(path.read_bytes()[:keep])
        samples.unlink()
        before = tree(synthetic)
        assert jobs_planned(synthetic, "-n") == {
            "infer": 2,  # step_100 for its truncated cell, step_300 for its new model
            "consolidate": 1,
            "redo": 3,
            "generation": 1 + 20,
            "evaluate": 1 + 1 + 1 + 20,
            **SUMMARY,
        }
        assert changed(before, tree(synthetic)) == []
    finally:
        for path, (data, mtime) in saved.items():
            path.write_bytes(data)
            os.utime(path, ns=(mtime, mtime))
    assert jobs_planned(synthetic, "-n") == {}


# --------------------------------------------------------------- a real sweep, finished and live


@pytest.mark.slow
def test_planning_a_finished_sweep_changes_no_file(sweep: Sweep) -> None:
    """`-n`, `--summary`, `--dag`, `--rulegraph`, every verb under `-n`, `ckpteval status` and
    `ckpteval check`: every file keeps its bytes and modification time, twice in a row (a first
    parse after the run must not tidy anything either)."""
    configfile = ("--configfile", str(sweep.work / "sweep.yaml"))
    before = tree(sweep.work)
    for args in PLANNING:
        proc = plan(sweep.work, *args, *configfile)
        assert proc.returncode == 0, (args, (proc.stdout + proc.stderr)[-3000:])
        assert changed(before, tree(sweep.work)) == [], args
    for command in ("status", "check"):
        proc = ckpteval(sweep.work, command, *configfile)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert changed(before, tree(sweep.work)) == [], command
    assert planned(sweep, sweep.config, "readonly") == Counter()
    # the config written for that dry run is the only new file
    assert changed(before, tree(sweep.work)) == ["readonly.yaml"]
    (sweep.work / "readonly.yaml").unlink()


def generations(work: Path) -> dict[str, bytes]:
    """The generation files of the vllm cells (what an engine job writes)."""
    vllm = [c for c in CELLS if c[4] == "vllm"]
    return {
        p: (work / "results" / p).read_bytes()
        for p in cell_files("generations", vllm)
        if p.endswith(".jsonl")
    }


@pytest.mark.slow
def test_dry_runs_and_status_beside_a_live_sweep_cost_it_nothing(sweep: Sweep) -> None:
    """Every generation redone by real engines (`-R infer`, the request cache set aside so that
    the engines start), while another process runs `snakemake -n` five times and `ckpteval
    status` twice: every job runs once, no retry, and the files equal the finished sweep's."""
    alone = generations(sweep.work)
    models = sweep.work / "results" / "models" / "demo"
    caches = [
        sweep.work / "results" / "cache" / cache_namespace(json.loads(m.read_text()))
        for m in sorted(models.glob("*.json"))
    ]
    for cache in caches:
        shutil.move(cache, cache.with_name(cache.name + ".aside"))
    log = sweep.work / "live.log"
    old_logs = set((sweep.work / "logs" / "infer").rglob("*.log"))
    configfile = ("--configfile", str(sweep.work / "sweep.yaml"))
    try:
        with open(log, "w") as out:
            live = subprocess.Popen(
                [*snakemake_cmd(sweep.work), "-R", "infer", "endpoint", *configfile],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=sweep.work,
                env={**os.environ, **WORKFLOW_ENV},
            )
        try:
            wait_for_engines(sweep.work, live, old_logs)
            said = []
            for i in range(5):
                proc = dry_snakemake(sweep.work, "-n", *configfile)
                assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
                # a good plan beside a live sweep prints no "Error:" line, and says why it is calm
                assert "Error" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
                said.append(LIVE_SWEEP_LINE in proc.stdout + proc.stderr)
                if i in (1, 3):
                    assert ckpteval(sweep.work, "status", *configfile).returncode == 0
            assert live.wait(timeout=1800) == 0, log.read_text()[-4000:]
            assert any(said), "no dry run met the live sweep's locks"
        finally:
            if live.poll() is None:
                live.kill()
    finally:
        for cache in caches:
            shutil.rmtree(cache, ignore_errors=True)
            shutil.move(cache.with_name(cache.name + ".aside"), cache)
    text = log.read_text()
    started = jobs_started_without_restart(text)
    engines = {"infer": 2, "endpoint": 1}
    assert {r: started[r] for r in engines} == engines, started
    assert started["generation"] == len(CELLS), started
    assert generations(sweep.work) == alone
    assert planned(sweep, sweep.config, "after-live") == Counter()


def wait_for_engines(
    work: Path, live: subprocess.Popen[bytes], old_logs: set[Path], timeout: float = 600
) -> None:
    """Until one of the live sweep's engine jobs has started (its log, a new name: each round
    has its own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set((work / "logs" / "infer").rglob("*.log")) - old_logs:
            return
        assert live.poll() is None, "the live sweep ended before its engines started"
        time.sleep(0.5)
    raise AssertionError("the live sweep's engine jobs did not start")
