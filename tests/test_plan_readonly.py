"""Planning is read-only (docs/reruns.md#planning-is-read-only): parsing the workflow creates,
moves, rewrites and deletes no file a job reads or writes, on a finished sweep and beside a
running one. Only the cache keyed by content (`results/sources/`) may be written by a parse.

The module runs the rerun-contract sweep of tests/contract_sweep.py once (each long module runs
its own copy so that pytest-xdist can give them to separate workers; the other modules' sweeps
are changed by their own tests while they run, so none can be shared with a live sweep here).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_snakemake
from contract_sweep import CELLS, Sweep, cell_files, finished_sweep, planned

from ckpteval.backends import cache_namespace

#: Content-keyed caches a parse may write (checkpoint content identities, hashes of big files).
CACHES = ("results/sources/",)


@pytest.fixture(scope="module")
def sweep(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    with finished_sweep(demo_dir, tmp_path_factory.mktemp("plan-readonly")) as finished:
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


def ckpteval(sweep: Sweep, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpteval.cli",
            *args,
            "--configfile",
            str(sweep.work / "sweep.yaml"),
        ],
        cwd=sweep.work,
        capture_output=True,
        text=True,
        timeout=600,
    )


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


@pytest.mark.slow
def test_planning_a_finished_sweep_changes_no_file(sweep: Sweep) -> None:
    """`-n`, `--summary`, `--dag`, `--rulegraph`, every verb under `-n`, `ckpteval status` and
    `ckpteval check`: every file keeps its bytes and modification time, twice in a row (a first
    parse after the run must not tidy anything either)."""
    configfile = ("--configfile", str(sweep.work / "sweep.yaml"))
    before = tree(sweep.work)
    for args in PLANNING:
        proc = run_snakemake(sweep.work, *args, *configfile)
        assert proc.returncode == 0, (args, (proc.stdout + proc.stderr)[-3000:])
        assert changed(before, tree(sweep.work)) == [], args
    for command in ("status", "check"):
        proc = ckpteval(sweep, command)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert changed(before, tree(sweep.work)) == [], command
    assert planned(sweep, sweep.config, "readonly") == Counter()
    # the config written for that dry run is the only new file
    assert changed(before, tree(sweep.work)) == ["readonly.yaml"]
    (sweep.work / "readonly.yaml").unlink()


@pytest.mark.slow
def test_damaged_files_are_planned_and_left_in_place_by_a_dry_run(sweep: Sweep) -> None:
    """A truncated generation file, a score cell and a model card that do not parse: a dry run
    plans their jobs (the chain a real run then runs: tests/test_contract_verbs.py) and removes
    none of them."""
    root = sweep.work / "results"
    damaged = {
        root / GEN.removeprefix("results/"): 40,
        root / SCORE.removeprefix("results/"): 20,
        root / "models/ep/step_7.json": 30,
    }
    saved = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in damaged}
    try:
        for path, keep in damaged.items():
            path.write_bytes(path.read_bytes()[:keep])
        before = tree(sweep.work)
        jobs = planned(sweep, sweep.config, "damaged")
        assert changed(before, tree(sweep.work)) == ["damaged.yaml"]
        ep = [c for c in CELLS if c[0] == "ep"]
        assert jobs == Counter(
            {
                "infer": 1,  # the truncated cell, alone
                "endpoint": 1,  # every cell of the rebuilt model card
                "model_card": 1,
                "generation": 1 + len(ep),
                "evaluate": 1 + len(ep),
                "redo": 2,  # the score cell and the model card that do not parse
                "aggregate": 1,
            }
        ), jobs
    finally:
        for path, (data, mtime) in saved.items():
            path.write_bytes(data)
            os.utime(path, ns=(mtime, mtime))
        (sweep.work / "damaged.yaml").unlink(missing_ok=True)
    assert planned(sweep, sweep.config, "repaired") == Counter()
    (sweep.work / "repaired.yaml").unlink()


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
            )
        try:
            wait_for_engines(sweep.work, live, old_logs)
            for i in range(5):
                proc = run_snakemake(sweep.work, "-n", *configfile)
                assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
                if i in (1, 3):
                    assert ckpteval(sweep, "status").returncode == 0
            assert live.wait(timeout=1800) == 0, log.read_text()[-4000:]
        finally:
            if live.poll() is None:
                live.kill()
    finally:
        for cache in caches:
            shutil.rmtree(cache, ignore_errors=True)
            shutil.move(cache.with_name(cache.name + ".aside"), cache)
    text = log.read_text()
    assert "Trying to restart" not in text and "MissingOutputException" not in text, text[-4000:]
    started = Counter(
        line.split()[1].rstrip(":")
        for line in text.splitlines()
        if line.startswith(("rule ", "localrule "))
    )
    engines = {"infer": 2, "endpoint": 1}
    assert {r: started[r] for r in engines} == engines, started
    assert started["generation"] == len(CELLS), started
    assert generations(sweep.work) == alone
    assert planned(sweep, sweep.config, "after-live") == Counter()


def snakemake_cmd(work: Path) -> list[str]:
    from conftest import REPO

    return [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(work),
        "--profile",
        str(REPO / "profiles" / "local"),
    ]


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
