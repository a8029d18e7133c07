"""SIGKILL the whole Snakemake process tree at random points of a demo sweep, several times in a
row; plain `snakemake` again must finish with results identical to an uninterrupted run, never
accept a half-written file, and never regenerate a finished generation.

One uninterrupted reference sweep and one killed sweep of the same config (one demo checkpoint,
all four kinds of task, generation chunks of one request so that a job is killed between cache
appends). The killed sweep is started five times and killed: during consolidate, twice inside
the infer job mid-generation (the second time after it resumed), inside a scoring job, and during
aggregate; the sixth start runs to the end. Each kill freezes the tree (SIGSTOP) at a random
moment of its phase, checks that the phase is still under way, then SIGKILLs every process. After
each kill no process of the tree is left, every output present under its final name is complete,
and the next start is not refused for the killed run's stale lock.
Generation requests are counted from the content-addressed cache: no key is ever appended twice,
and a resumed job reports exactly the cached prompts it found.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import REPO, dry_snakemake, run_snakemake, small_config, write_config

#: The sweeps score a Rust task, whose cells the tests read.
pytestmark = pytest.mark.needs("rustc")

TASKS = {
    "arith": {"limit": 20},
    "arith_harness": {"limit": 8},
    "pyfunc": {"limit": 4},
    "rustfunc": {"limit": 3},
}
RNG = random.Random(8)
#: Fields of a score line that measure time, not the verdict.
TIMING_FIELDS = {"duration_s", "compile_s", "cpu_s", "wall_s"}


def _sweep_dir(root: Path, demo_dir: Path) -> Path:
    run = root / "run"
    run.mkdir(parents=True)
    steps = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    (run / steps[-1].name).symlink_to(steps[-1])
    write_config(
        root,
        small_config(
            run,
            tasks=TASKS,
            engine={"gpu_memory_utilization": 0.15, "enforce_eager": True, "chunk_size": 1},
        ),
    )
    return root


# ---------------------------------------------------------------------------- killing a tree


def _children(pid: int) -> list[int]:
    """Children of every thread of `pid` (Snakemake starts jobs from worker threads)."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


def _tree(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(_children(pid))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return (
            f"{pid} ({state}): "
            + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        )
    except OSError:
        return f"{pid} (gone)"


def signal_tree(proc: subprocess.Popen[bytes], sig: int) -> list[int]:
    """Send `sig` to Snakemake and every descendant (jobs, vLLM, bwrap and the sandboxed programs),
    again until no new process appears. Returns every pid signalled."""
    done: set[int] = set()
    for _ in range(50):
        pids = [p for p in _tree(proc.pid) if p not in done]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            done.add(pid)
    return sorted(done)


@dataclass
class Kill:
    """What one interrupted start did: the phase it was killed in and what was on disk then."""

    phase: str
    pids: list[int]
    cache_rows: dict[str, list[str]]
    seconds: float


def start_and_kill(
    work: Path,
    phase: str,
    ready: Callable[[], bool],
    delay: tuple[float, float],
    still_in_phase: Callable[[], bool],
    timeout: float = 900,
) -> Kill:
    """Start `snakemake` in `work`; once `ready()`, wait a random delay and SIGKILL the whole tree.

    The tree is first frozen with SIGSTOP, so that what is on disk at the moment of the kill can
    be recorded and the phase checked (a kill that landed after the phase proves nothing); SIGKILL
    then ends every process where it stood.
    """
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}
    cmd = [
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
    log = (work / f"kill-{phase}.log").open("wb")
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    pids: list[int] = []
    try:
        while not ready():
            if proc.poll() is not None:
                raise AssertionError(
                    f"snakemake ended (status {proc.returncode}) before the "
                    f"{phase} phase: {(work / f'kill-{phase}.log').read_text()[-3000:]}"
                )
            if time.monotonic() - start > timeout:
                raise AssertionError(f"no {phase} phase within {timeout} s")
            time.sleep(0.005)
        time.sleep(RNG.uniform(*delay))
        pids = signal_tree(proc, signal.SIGSTOP)
        assert still_in_phase(), f"the {phase} phase ended before the kill"
        cache = cache_rows(work)
    finally:
        pids = sorted({*pids, *signal_tree(proc, signal.SIGKILL)})
        proc.wait(timeout=60)
        log.close()
    deadline = time.monotonic() + 60  # a process with GBs mapped takes a moment to be torn down
    while (survivors := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert survivors == [], f"processes survived the kill: {[_cmdline(p) for p in survivors]}"
    assert_outputs_complete(work)
    return Kill(phase, pids, cache, time.monotonic() - start)


# --------------------------------------------------------------------------- reading results


def cache_rows(work: Path) -> dict[str, list[str]]:
    """Cache file -> the keys of its complete lines, in order (a torn last line is left out)."""
    rows: dict[str, list[str]] = {}
    for path in sorted((work / "results" / "cache").glob("*/*.jsonl")):
        keys = []
        for line in path.read_bytes().splitlines(keepends=True):
            if not line.endswith(b"\n"):
                continue
            try:
                keys.append(json.loads(line)["key"])
            except (ValueError, KeyError):
                continue
        rows[path.name] = keys
    return rows


def assert_outputs_complete(work: Path) -> None:
    """Every output under its final name parses completely: a kill never leaves a file that
    looks finished (temp files and staging directories start with a dot)."""
    results = work / "results"
    for path in results.rglob("*"):
        if any(part.startswith(".") for part in path.relative_to(results).parts):
            continue
        if path.is_dir() or path.relative_to(results).parts[0] == "cache":
            continue
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            data = path.read_bytes()
            assert data.endswith(b"\n"), f"{path} ends mid-line"
            for line in data.splitlines():
                json.loads(line)
        elif path.suffix == ".parquet":
            pd.read_parquet(path)
        elif path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as handle:
                for name in handle.keys():
                    handle.get_tensor(name)
    for manifest in (results / "models").glob("*/*.json"):
        model = manifest.with_suffix("")
        files = json.loads(manifest.read_text())["files"]
        assert model.is_dir() and files, f"{manifest} describes a missing model directory"


def generations(work: Path) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for path in sorted((work / "results" / "generations").rglob("*.jsonl")):
        out[str(path.relative_to(work))] = [
            (
                g["task_id"],
                g["sample_idx"],
                g["completion"],
                g.get("finish_reason"),
                g.get("completion_tokens"),
            )
            for g in map(json.loads, path.read_text().splitlines())
        ]
    return out


def verdicts(work: Path) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for path in sorted((work / "results" / "scores").rglob("*.jsonl")):
        out[str(path.relative_to(work))] = [
            {k: v for k, v in json.loads(line).items() if k not in TIMING_FIELDS}
            for line in path.read_text().splitlines()
        ]
    return out


def metrics(work: Path) -> pd.DataFrame:
    table = pd.read_parquet(work / "results" / "summary" / "metrics.parquet")
    keys = ["run", "ckpt", "task", "variant", "metric"]
    return table[[*keys, "value", "stderr", "n"]].sort_values(keys).reset_index(drop=True)


# ------------------------------------------------------------------------------------ sweeps


@dataclass
class Sweeps:
    reference: Path
    killed: Path
    kills: list[Kill]
    reference_seconds: float
    final_seconds: float


def _exists(path: Path) -> Callable[[], bool]:
    return path.exists


def _missing(path: Path) -> Callable[[], bool]:
    return lambda: not path.exists()


@pytest.fixture(scope="module")
def sweeps(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Sweeps:
    reference = _sweep_dir(tmp_path_factory.mktemp("reference"), demo_dir)
    start = time.monotonic()
    proc = run_snakemake(reference)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reference_seconds = time.monotonic() - start

    work = _sweep_dir(tmp_path_factory.mktemp("killed"), demo_dir)
    ckpt = next((work / "run").iterdir()).name
    results = work / "results"
    manifest = results / "models" / "demo" / f"{ckpt}.json"
    n_prompts = sum(opts["limit"] for opts in TASKS.values())
    kills = []

    def generated() -> int:
        return sum(len(keys) for keys in cache_rows(work).values())

    def infer_running() -> bool:
        return 0 < generated() < n_prompts

    # 1. consolidate: its log exists, its manifest does not yet.
    kills.append(
        start_and_kill(
            work,
            "consolidate",
            _exists(work / "logs" / "consolidate" / "demo" / f"{ckpt}.log"),
            (0.2, 1.5),
            _missing(manifest),
        )
    )
    # 2. infer, mid-generation: some requests are in the cache, not all.
    kills.append(
        start_and_kill(work, "infer", lambda: generated() >= 2, (0.0, 0.05), infer_running)
    )
    # 3. infer again, after the resumed job generated a few more.
    before = generated()
    kills.append(
        start_and_kill(
            work, "infer-again", lambda: generated() >= before + 3, (0.0, 0.05), infer_running
        )
    )
    # 4. scoring: the rust cell's evaluate job (compiling and running in the sandbox) has started,
    # its cell is not written yet.
    rust_cell = f"demo/{ckpt}/rustfunc/greedy-s42"
    kills.append(
        start_and_kill(
            work,
            "scoring",
            _exists(work / "logs" / "evaluate" / f"{rust_cell}.log"),
            (0.05, 0.3),
            _missing(results / "scores" / f"{rust_cell}.json"),
        )
    )
    # 5. aggregate: its log exists, the report does not.
    kills.append(
        start_and_kill(
            work,
            "aggregate",
            _exists(work / "logs" / "aggregate" / "aggregate.log"),
            (0.1, 0.6),
            _missing(results / "summary" / "report.html"),
        )
    )
    start = time.monotonic()
    proc = run_snakemake(work)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Sweeps(reference, work, kills, reference_seconds, time.monotonic() - start)


# ------------------------------------------------------------------------------------- tests


@pytest.mark.slow
def test_each_kill_hit_its_phase_and_left_nothing_running(sweeps: Sweeps) -> None:
    assert [k.phase for k in sweeps.kills] == [
        "consolidate",
        "infer",
        "infer-again",
        "scoring",
        "aggregate",
    ]
    infer_kill = sweeps.kills[1]
    assert (
        0 < sum(map(len, infer_kill.cache_rows.values())) < sum(o["limit"] for o in TASKS.values())
    )
    # Every kill took a real tree down: Snakemake, its job processes and theirs.
    assert all(len(k.pids) >= 2 for k in sweeps.kills), [(k.phase, k.pids) for k in sweeps.kills]
    for kill in sweeps.kills:
        print(
            f"\nkilled in {kill.phase} after {kill.seconds:.1f} s: {len(kill.pids)} processes, "
            f"{sum(map(len, kill.cache_rows.values()))} requests in the cache"
        )
    print(
        f"reference sweep {sweeps.reference_seconds:.0f} s, final run after the kills "
        f"{sweeps.final_seconds:.0f} s"
    )


@pytest.mark.slow
def test_results_equal_an_uninterrupted_run(sweeps: Sweeps) -> None:
    assert generations(sweeps.killed) == generations(sweeps.reference)
    assert verdicts(sweeps.killed) == verdicts(sweeps.reference)
    pd.testing.assert_frame_equal(metrics(sweeps.killed), metrics(sweeps.reference))
    ref_cells = {
        p.relative_to(sweeps.reference)
        for p in (sweeps.reference / "results/scores").rglob("*.json")
    }
    assert {
        p.relative_to(sweeps.killed) for p in (sweeps.killed / "results/scores").rglob("*.json")
    } == ref_cells


@pytest.mark.slow
def test_no_finished_generation_was_redone(sweeps: Sweeps) -> None:
    final = cache_rows(sweeps.killed)
    reference = cache_rows(sweeps.reference)
    # The cache is append-only: a request generated twice would appear twice.
    for name, keys in final.items():
        assert len(keys) == len(set(keys)), f"{name}: {Counter(keys).most_common(1)}"
    assert {n: sorted(k) for n, k in final.items()} == {n: sorted(k) for n, k in reference.items()}
    # What each kill found in the cache was still there, unchanged, after the next start.
    for kill in sweeps.kills:
        for name, keys in kill.cache_rows.items():
            assert final[name][: len(keys)] == keys, (kill.phase, name)


#: An engine job's count per cell at its start: "arith greedy-s42: 20 prompts, 3 cached, ..." or,
#: for a harness task, "... 8 lm-eval generate_until requests, 3 cached, ...".
FOUND = re.compile(
    r"(\w+) greedy-s42: (\d+) (?:prompts|lm-eval generate_until requests), (\d+) cached"
)


@pytest.mark.slow
def test_a_resumed_job_counts_exactly_what_it_found(sweeps: Sweeps) -> None:
    """The engine job after the last infer kill found, per task, exactly the requests that kill
    left in the cache (its log says so); every generation meta counts cached + generated = all
    of them. A later round may re-serve a cell whose generation file the scoring kill cut off
    (an engine job that finds everything cached and loads no engine): its meta then says all
    cached, none generated."""
    last_kill = next(k for k in reversed(sweeps.kills) if k.phase.startswith("infer"))
    left = {task: len(last_kill.cache_rows.get(f"{task}.jsonl", [])) for task in TASKS}
    logs = sorted(
        (sweeps.killed / "logs" / "infer").rglob("*.log"), key=lambda p: p.stat().st_mtime
    )
    counts = [{m[1]: (int(m[2]), int(m[3])) for m in FOUND.finditer(p.read_text())} for p in logs]
    resumed = next(c for c in counts if c.get("arith") == (TASKS["arith"]["limit"], left["arith"]))
    assert resumed == {task: (TASKS[task]["limit"], left[task]) for task in TASKS}, counts
    for path in (sweeps.killed / "results" / "generations").rglob("*.meta.json"):
        meta = json.loads(path.read_text())
        task = path.parent.name
        n = TASKS[task]["limit"]
        assert meta["n_cached_prompts"] + meta["n_generated_prompts"] == n, meta
        assert meta["n_cached_prompts"] == left[task] or meta["n_generated_prompts"] == 0, (
            task,
            meta,
        )


@pytest.mark.slow
def test_no_half_written_output_and_no_debris(sweeps: Sweeps) -> None:
    assert_outputs_complete(sweeps.killed)
    debris = [
        p for p in (sweeps.killed / "results").rglob(".*") if p.name != ".snakemake_timestamp"
    ]
    assert debris == [], debris
    proc = dry_snakemake(sweeps.killed, "-n")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_stale_locks_of_a_killed_run_are_cleared_and_reported(sweeps: Sweeps) -> None:
    logs = [(sweeps.killed / f"kill-{k.phase}.log").read_text() for k in sweeps.kills[1:]]
    assert all(
        re.search(r"removed \d+ stale Snakemake lock file\(s\) left by a killed run", log)
        for log in logs
    )
    assert all("LockException" not in log and "cannot be locked" not in log for log in logs)


# ----------------------------------------------------------------------- stale Snakemake locks

_CLAIM = (
    "import sys, time\nfrom pathlib import Path\nfrom ckpteval.status import claim_workdir\n"
    "print(len(claim_workdir(Path(sys.argv[1]))), flush=True)\ntime.sleep(float(sys.argv[2]))\n"
)


def _claim(snakemake_dir: Path, hold_s: float) -> subprocess.Popen[str]:
    """A stand-in for a Snakemake process: claims the directory at 'parse time', then runs."""
    return subprocess.Popen(
        [sys.executable, "-c", _CLAIM, str(snakemake_dir), str(hold_s)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _fake_locks(snakemake_dir: Path, output: str) -> None:
    (snakemake_dir / "locks").mkdir(parents=True, exist_ok=True)
    (snakemake_dir / "locks" / "0.input.lock").write_text("run/step_5\n")
    (snakemake_dir / "locks" / "0.output.lock").write_text(output + "\n")


def test_locks_of_a_live_snakemake_stay_those_of_a_killed_one_go(tmp_path: Path) -> None:
    from ckpteval.status import snakemake_alive

    smk = tmp_path / ".snakemake"
    first = _claim(smk, 300)
    assert first.stdout.readline().strip() == "0"
    _fake_locks(smk, "results/x.json")
    second = _claim(smk, 300)  # started while the first one runs: must not touch its locks
    assert second.stdout.readline().strip() == "0"
    assert snakemake_alive(smk) and len(list((smk / "locks").iterdir())) == 2
    first.kill()
    first.wait()
    assert snakemake_alive(smk), "the second one is still alive"
    second.send_signal(signal.SIGKILL)
    second.wait()
    assert not snakemake_alive(smk)
    third = _claim(smk, 0)
    assert third.stdout.readline().strip() == "2"
    third.wait()
    assert list((smk / "locks").iterdir()) == []


def test_status_calls_the_jobs_of_a_killed_snakemake_interrupted(tmp_path: Path) -> None:
    import base64

    from ckpteval.plan.layout import CellKey
    from ckpteval.status import cell_states

    target = "results/scores/r/step_5/a/greedy-s1.json"
    smk = tmp_path / ".snakemake"
    (smk / "incomplete").mkdir(parents=True)
    (smk / "incomplete" / base64.urlsafe_b64encode(target.encode()).decode()).touch()
    cell = {CellKey("r", "step_5", "a", "greedy-s1"): 5}
    holder = _claim(smk, 300)
    assert holder.stdout.readline().strip() == "0"
    _fake_locks(smk, target)
    assert cell_states(tmp_path / "results", cell)["state"].tolist() == ["running"]
    holder.kill()
    holder.wait()
    state = cell_states(tmp_path / "results", cell).iloc[0]
    assert state["state"] == "failed" and "interrupted" in state["detail"]


def test_backups_of_a_killed_runs_update_outputs_go_those_of_a_live_one_stay(
    tmp_path: Path,
) -> None:
    """Ctrl-C or SIGKILL while rule `summary` publishes left Snakemake's backup of its `plots`
    directory (an `update()` output) in `.snakemake/backups/`, and every later run failed
    before the rerun could start: `FileExistsError: .../backups/results/summary/plots`
    (Snakemake backs a directory up with `copytree`, which refuses an existing one, and
    restores it only for a job that fails while it watches). A parse with no live Snakemake
    removes them; a live one's stay; a finished job's empty parents go without a word."""
    smk = tmp_path / ".snakemake"
    plots = smk / "backups" / "results" / "summary" / "plots"
    holder = _claim(smk, 300)
    assert holder.stdout.readline().strip() == "0"
    plots.mkdir(parents=True)  # its summary job backs up the published plots
    (plots / "arith-steps.png").write_bytes(b"png")
    second = _claim(smk, 0)  # beside a live Snakemake: its backups are real
    assert second.stdout.readline().strip() == "0"
    second.wait()
    assert (plots / "arith-steps.png").exists()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    third = _claim(smk, 0)
    assert third.stdout.readline().strip() == "1"
    third.wait()
    assert not (smk / "backups").exists()
    (smk / "backups" / "results" / "summary").mkdir(parents=True)  # what a finished job leaves
    fourth = _claim(smk, 0)
    assert fourth.stdout.readline().strip() == "0"
    fourth.wait()
    assert not (smk / "backups").exists()
