"""Slurm scale-out, for real: a two-node x 8-GPU Slurm cluster on this host runs the 2node profile.

The cluster (tests/slurm/cluster.py) is munged + slurmctld + two slurmd with fake GPU character
devices; it is started once for this module and every daemon is stopped by pid afterwards. Jobs
record the GPU they saw (CUDA_VISIBLE_DEVICES), their SLURM_JOB_ID and when they ran; the node
comes from SLURMD_NODENAME or the controller's job records. The tests assert on those records:
every job ran, both nodes were used, never more than 16 GPU jobs at once, never two at once on one
(node, GPU); first for a toy workflow of 17 GPU jobs (more than the profile's 16 GPUs and -j 16),
then for the repository's workflow, whose engine job then runs again while dry runs and
`ckpteval status` plan beside it (planning is read-only even where every Slurm job's own Snakemake
parses the workflow again).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import forked_main, jobs_started_without_restart, small_config, write_config
from slurm.cluster import SlurmCluster, missing_binaries, slurm_cluster

from ckpteval.backends import cache_namespace

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "2node"
# The profile polls job states 20 s apart; a test cluster answers at once, so poll every 2 s to
# keep the module inside its CI budget. Everything else comes from the profile unchanged. The
# plugin adds 10 s after every poll that saw no job end (polls 2, 14, 36, 68 s after a submission),
# and has no setting for that: most of the module's wall time is these waits, not CPU (1 s here
# gave 1, 12, 33, 64 and no measurable change of the module's time).
FAST_POLL = ["--slurm-init-seconds-before-status-checks", "2"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(missing_binaries()), reason="needs slurm-wlm and munge installed"),
    pytest.mark.skipif(sys.platform != "linux", reason="Slurm test cluster runs on Linux only"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One cluster for the module: start-up costs ~5 s, every test shares it."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm test cluster needs root")
    with slurm_cluster(
        tmp_path_factory.mktemp("slurm"), cpus_per_node=64, real_memory_mb=256000
    ) as running:
        yield running


# --- records: what a job saw, and the properties a correct schedule has ----------------------


def load_records(paths: Iterable[Path]) -> list[dict]:
    """Read the per-job JSON records the jobs wrote."""
    return [json.loads(Path(p).read_text()) for p in paths]


def max_concurrent(records: list[dict]) -> int:
    """Largest number of records whose [start, end) intervals overlap at one instant."""
    events = sorted(
        [(r["start"], 1) for r in records] + [(r["end"], -1) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _time, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def device_overlaps(records: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of records that held the same (node, GPU) at the same time."""
    by_device: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        by_device.setdefault((record["node"], record["cuda_visible_devices"]), []).append(record)
    clashes = []
    for held in by_device.values():
        held.sort(key=lambda r: r["start"])
        clashes += [(a, b) for a, b in zip(held, held[1:]) if b["start"] < a["end"]]
    return clashes


def test_schedule_checks_catch_violations() -> None:
    """The two checks above fail on schedules that break the rules (else they prove nothing)."""
    a = {"node": "node1", "cuda_visible_devices": "0", "start": 0.0, "end": 2.0}
    b = {"node": "node1", "cuda_visible_devices": "0", "start": 1.0, "end": 3.0}
    c = {"node": "node2", "cuda_visible_devices": "0", "start": 1.0, "end": 3.0}
    d = {"node": "node1", "cuda_visible_devices": "0", "start": 2.0, "end": 4.0}
    assert device_overlaps([a, b]) == [(a, b)]
    assert device_overlaps([a, c, d]) == []
    assert max_concurrent([a, b, c]) == 3
    assert max_concurrent([a, d]) == 1


# --- the cluster itself ----------------------------------------------------------------------


def test_cluster_hands_out_distinct_fake_gpus(cluster: SlurmCluster, tmp_path: Path) -> None:
    """srun and sbatch with --gpus=1 get CUDA_VISIBLE_DEVICES from gres.conf on both nodes."""
    probe = 'echo "$CUDA_VISIBLE_DEVICES $SLURMD_NODENAME"'
    srun = cluster.run(["srun", "--gpus=1", "bash", "-c", probe]).stdout.split()
    assert srun[0] in {str(i) for i in range(8)} and srun[1] in cluster.nodes

    for index in range(18):
        cluster.run(
            [
                "sbatch",
                "--gpus=1",
                f"--output={tmp_path}/job{index}.out",
                "--wrap",
                f"sleep 2; {probe}",
            ],
            cwd=tmp_path,
        )
    _wait_for_empty_queue(cluster, timeout=60)
    seen = [tuple((tmp_path / f"job{i}.out").read_text().split()) for i in range(18)]
    assert {node for _gpu, node in seen} == set(cluster.nodes)
    assert all(gpu in {str(i) for i in range(8)} for gpu, _node in seen)
    # 18 two-second jobs on 16 GPUs: the first 16 start together, so they hold 16 distinct devices.
    assert len(set(seen)) == 16


# --- the 2node profile on a toy workflow -----------------------------------------------------

TOY_JOBS = 17  # > 16 GPUs and > -j 16

TOY_SNAKEFILE = """\
import sys

N = {n}

localrules: all, aggregate

rule all:
    input: "summary.json"

rule infer:
    output: "records/{{i}}.json"
    resources: gpu=1  # as the workflow's engine rules ask (the profile sets no gpu of its own)
    shell: sys.executable + " {recorder} {{output}} {seconds}"

rule aggregate:
    input: expand("records/{{i}}.json", i=range(N))
    output: "summary.json"
    shell: "cat {{input}} > {{output}}"
"""

RECORDER = """\
import json, os, socket, sys, time
start = time.time()
time.sleep(float(sys.argv[2]))
record = {
    "node": os.environ.get("SLURMD_NODENAME", ""),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
    "host": socket.gethostname(),
    "start": start,
    "end": time.time(),
}
with open(sys.argv[1], "w") as handle:
    json.dump(record, handle)
"""


def test_profile_spreads_gpu_jobs_over_both_nodes(cluster: SlurmCluster, tmp_path: Path) -> None:
    """17 GPU jobs through profiles/2node -j 16: both nodes, <= 16 at once, no device shared.

    17 is enough to exceed the 16 GPUs and the -j 16 cap, so the cap is exercised; each job is a
    Snakemake start inside Slurm (seconds of CPU on a 2-core machine), so more only cost time."""
    (tmp_path / "recorder.py").write_text(RECORDER)
    (tmp_path / "Snakefile").write_text(
        TOY_SNAKEFILE.format(n=TOY_JOBS, recorder=tmp_path / "recorder.py", seconds=3)
    )
    result = run_snakemake(cluster, tmp_path, ["--snakefile", str(tmp_path / "Snakefile")])
    assert result.returncode == 0, result.stderr[-4000:]

    records = load_records((tmp_path / "records").glob("*.json"))
    assert len(records) == TOY_JOBS
    assert all(r["slurm_job_id"] for r in records), "an infer job ran outside Slurm"
    assert len({r["slurm_job_id"] for r in records}) == TOY_JOBS
    assert {r["node"] for r in records} == set(cluster.nodes)
    assert all(r["cuda_visible_devices"] in {str(i) for i in range(8)} for r in records)
    assert max_concurrent(records) <= 16
    assert device_overlaps(records) == []
    # The aggregate rule is local: it ran in this process's environment, not as a Slurm job.
    assert "rule aggregate" in result.stderr and "localrule aggregate" in result.stderr


# --- the real workflow through profiles/2node -------------------------------------------------

# With the one vLLM checkpoint, 4 GPU jobs: the test cluster's LLN=YES puts two jobs that run at
# once on both nodes. The -j 16 cap is the toy workflow's to exceed (17 jobs of a few seconds' CPU
# each, where the workflow's are two parses of the Snakefile and a script each): the cap is the
# profile's `jobs` and `resources: gpu`, which Snakemake enforces whatever the workflow, and what
# the workflow adds to it, every GPU job asking Slurm for its GPU, is checked on each job below.
REPLAY_STEPS = 3
ARITH = [
    json.loads(line)
    for line in (REPO / "src" / "ckpteval" / "data" / "tasks" / "arith.jsonl")
    .read_text()
    .splitlines()
]


def test_workflow_runs_through_the_2node_profile(
    cluster: SlurmCluster, demo_dir: Path, tmp_path: Path
) -> None:
    """The repository's workflow, unchanged, through profiles/2node -j 16 on the test cluster.

    Two runs in one config: `demo`, a real checkpoint (consolidate -> infer with a real vLLM engine
    on CPU, its GPU chosen by Slurm -> evaluate), and `replayed`, 3 steps of existing solutions
    (the replay backend: no engine). Engines cannot run side by side on this 2-core machine, so
    the replay jobs stand in for more GPU jobs: the test profile is profiles/2node plus `gpu: 1`
    for rule `replay`. Both kinds record where they ran in their generation meta. Tail assist is
    off: with 16 GPUs it would add 15 assist jobs, each a Snakemake start on a node that finds
    nothing to do on this tiny sweep, beside the engine job on two cores (assist is
    tests/test_share.py's).
    """
    source = sorted((demo_dir / "run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[-1]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / source.name).symlink_to(source)
    for step in range(1, REPLAY_STEPS + 1):
        answers = tmp_path / "solutions" / f"step_{step}" / "arith.jsonl"
        answers.parent.mkdir(parents=True)
        # Step s answers the first s problems right: scores rise over training, as they should.
        answers.write_text(
            "".join(
                json.dumps(
                    {"task_id": p["task_id"], "completion": p["answer"] if i < step else " #### -1"}
                )
                + "\n"
                for i, p in enumerate(ARITH)
            )
        )
    config = small_config(
        tmp_path / "run",
        tasks={"arith": {"limit": 20}},
        sampling={"greedy": {"temperature": 0.0, "max_new_tokens": 24}},
        consolidate={"smoke": "none"},
        assist=False,
    )
    config["runs"]["replayed"] = {
        "backend": "replay",
        "solutions": str(tmp_path / "solutions/step_{step}/{task}.jsonl"),
    }
    write_config(tmp_path, config)
    profile = replay_as_gpu_profile(tmp_path / "profile")

    result = run_workflow(cluster, tmp_path, profile, [])
    assert result.returncode == 0, result.stderr[-4000:]

    results = tmp_path / "results"
    scores = sorted(results.glob("scores/*/step_*/arith/greedy-s42.json"))
    assert len(scores) == REPLAY_STEPS + 1
    table = pd.read_parquet(results / "summary" / "metrics.parquet")
    replayed = table[(table.run == "replayed") & (table.metric == "pass@1")].sort_values("step")
    assert replayed["value"].tolist() == [s / 20 for s in range(1, REPLAY_STEPS + 1)]
    # The summary is a local rule: made in this process's environment, not as a Slurm job.
    assert "localrule aggregate" in result.stderr

    metas = {
        (p.parts[-4], p.parts[-3]): json.loads(p.read_text())
        for p in results.glob("generations/*/step_*/arith/greedy-s42.meta.json")
    }
    demo = metas[("demo", source.name)]
    assert demo["backend"] == "vllm" and demo["engine_loads"] == 1
    assert demo["device"]["lease"] == "scheduler", "the GPU lease did not step aside for Slurm"

    # Where each GPU job ran: the node from the controller's own records (one host carries both
    # nodes, so the hostname cannot tell them apart); the GPU it saw and when, from its meta.
    nodes = slurm_job_nodes(cluster)
    records = []
    for (run, ckpt), meta in metas.items():
        device = meta["device"]
        assert device["slurm_job_id"] in nodes, f"{run}/{ckpt} did not run as a Slurm job"
        assert device["cuda_visible_devices"] in {str(i) for i in range(8)}, (run, ckpt)
        records.append(
            {
                "node": nodes[device["slurm_job_id"]],
                "cuda_visible_devices": device["cuda_visible_devices"],
                "start": meta["started_at"],
                "end": meta["finished_at"],
            }
        )
    assert len({meta["device"]["slurm_job_id"] for meta in metas.values()}) == REPLAY_STEPS + 1
    assert {r["node"] for r in records} == set(cluster.nodes)
    assert max_concurrent(records) <= 16
    assert device_overlaps(records) == []

    # A partial rerun by target file works as under any profile: that file's job and nothing else.
    target = results / "scores" / "replayed" / "step_3" / "arith" / "greedy-s42.json"
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()}
    rerun = run_workflow(cluster, tmp_path, profile, ["-f", str(target.relative_to(tmp_path))])
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    changed = {p for p, mtime in before.items() if p.stat().st_mtime_ns != mtime}
    assert changed == {target, target.with_suffix(".jsonl")}, sorted(map(str, changed))

    live_rerun_beside_planning(cluster, tmp_path, profile, source.name)


def live_rerun_beside_planning(cluster: SlurmCluster, work: Path, profile: Path, ckpt: str) -> None:
    """The demo's engine job again (`-R infer`, its request cache set aside so that a real engine
    generates) while `snakemake -n` runs five times and `ckpteval status` twice in the same
    directory (each forked from this process, parsing from scratch: conftest.forked_main): under
    Slurm each job's own Snakemake parses the workflow again, so a parse that removed or rewrote a
    marker or request file would cost the running job its outputs (a retry, or a failed sweep).
    Every job runs once (Snakemake's log, and the controller's new job ids: no resubmission), and
    the results equal the sweep's run alone above.

    Folded into the sweep above rather than a sweep of its own: one engine job and its evaluate
    (two Slurm jobs, each a parse), ~1 minute on top of the module."""
    from ckpteval.cli import main as ckpteval_main

    results = work / "results"
    generation = results / "generations" / "demo" / ckpt / "arith" / "greedy-s42.jsonl"
    alone = generation.read_bytes()
    table_alone = metric_values(results)
    card = json.loads((results / "models" / "demo" / f"{ckpt}.json").read_text())
    cache = results / "cache" / cache_namespace(card)
    aside = cache.with_name(cache.name + ".aside")
    shutil.move(cache, aside)
    jobs_before = set(slurm_job_nodes(cluster))
    old_logs = set((work / "logs" / "infer").rglob("*.log"))
    log = work / "live.log"
    try:
        with open(log, "w") as out:
            live = subprocess.Popen(
                workflow_command(work, profile, ["-R", "infer"]),
                cwd=REPO,
                env=workflow_env(cluster),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for_new_log(work / "logs" / "infer", old_logs, live)
            for i in range(5):
                dry = dry_workflow(cluster, work, profile)
                assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
                if i in (1, 3):
                    status = forked_main(ckpteval_main, ["status"], work, timeout=300)
                    assert status.returncode == 0, status.stderr[-3000:]
            assert live.wait(timeout=600) == 0, log.read_text()[-4000:]
        finally:
            if live.poll() is None:
                live.kill()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.move(aside, cache)
    text = log.read_text()
    started = jobs_started_without_restart(text)
    # One job per rule on this one checkpoint's one cell, each exactly once.
    assert {"infer", "generation", "evaluate", "aggregate"} <= set(started), started
    assert set(started.values()) == {1}, started
    # Slurm saw exactly the two submitted jobs (infer, evaluate): none was resubmitted.
    assert len(set(slurm_job_nodes(cluster)) - jobs_before) == 2
    assert generation.read_bytes() == alone
    assert metric_values(results).equals(table_alone)
    after = dry_workflow(cluster, work, profile)
    planned = after.stdout + after.stderr
    assert "Nothing to be done" in planned, planned[-3000:]


def metric_values(results: Path) -> pd.DataFrame:
    """The summary's (run, step, task, variant, metric, value) rows, in a fixed order."""
    table = pd.read_parquet(results / "summary" / "metrics.parquet")
    keys = ["run", "step", "task", "variant", "metric"]
    return table[[*keys, "value"]].sort_values(keys).reset_index(drop=True)


def wait_for_new_log(
    logs: Path, old: set[Path], live: subprocess.Popen[bytes], timeout: float = 300
) -> None:
    """Until the live sweep's engine job has started on its node (its log, a new name: each round
    has its own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(logs.rglob("*.log")) - old:
            return
        assert live.poll() is None, "the live sweep ended before its engine job started"
        time.sleep(0.5)
    raise AssertionError("the live sweep's engine job did not start")


# --- helpers ---------------------------------------------------------------------------------


def replay_as_gpu_profile(directory: Path) -> Path:
    """profiles/2node with one addition: replay jobs ask for a GPU, standing in for engines."""
    config = yaml.safe_load((PROFILE / "config.yaml").read_text())
    config.setdefault("set-resources", {})["replay"] = {"gpu": 1}
    directory.mkdir()
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    return directory


def run_snakemake(
    cluster: SlurmCluster, workdir: Path, args: list[str], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """`snakemake --profile profiles/2node -j 16 ...` against the test cluster, in `workdir`."""
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        str(PROFILE),
        "-j",
        "16",
        *FAST_POLL,
        *args,
    ]
    return subprocess.run(
        command,
        cwd=workdir,
        env=cluster.env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def workflow_env(cluster: SlurmCluster) -> dict[str, str]:
    return {**cluster.env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}


def workflow_command(workdir: Path, profile: Path, args: list[str]) -> list[str]:
    """The repository's workflow in `workdir` through `profile` with -j 16 (run from REPO)."""
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--profile",
        str(profile),
        "-j",
        "16",
        *FAST_POLL,
        *args,
    ]


def run_workflow(
    cluster: SlurmCluster, workdir: Path, profile: Path, args: list[str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """The repository's workflow in `workdir` through `profile` with -j 16 on the test cluster."""
    return subprocess.run(
        workflow_command(workdir, profile, args),
        cwd=REPO,
        env=workflow_env(cluster),
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def dry_workflow(
    cluster: SlurmCluster, workdir: Path, profile: Path
) -> subprocess.CompletedProcess[str]:
    """`run_workflow(..., ["-n"])` in a process forked from this one (conftest.forked_main): the
    child parses the workflow from scratch as a new interpreter would, without paying its
    imports again."""
    import snakemake.cli

    argv = workflow_command(workdir, profile, ["-n"])[3:]  # after `python -m snakemake`
    return forked_main(
        snakemake.cli.main, argv, REPO, timeout=600, prog="snakemake", env=workflow_env(cluster)
    )


def slurm_job_nodes(cluster: SlurmCluster) -> dict[str, str]:
    """Job id -> node, for every job the controller still remembers (MinJobAge=3600)."""
    out = cluster.run(["scontrol", "--oneliner", "show", "job"]).stdout
    nodes = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "JobId" in fields:
            nodes[fields["JobId"]] = fields.get("NodeList", "")
    return nodes


def _wait_for_empty_queue(cluster: SlurmCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while cluster.job_ids():
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs still queued after {timeout} s: {cluster.job_ids()}")
        time.sleep(0.5)
