"""GPUs follow tensor parallelism: an engine job allowed TP=N asks Snakemake (and Slurm) for N
GPUs and leases N distinct devices at once, all or none, so jobs never deadlock on halves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, dry_snakemake, write_config
from safetensors.numpy import save_file

from ckpteval.engine.gpus import engine_gpus, lease_gpu
from ckpteval.errors import UserError
from ckpteval.io import first_free_lock

HOLDER = """
import json, os, sys, time
from pathlib import Path
from ckpteval.engine.gpus import lease_gpu
lock_dir, seconds, start_line, count, pool = sys.argv[1:6]
(Path(start_line) / f"ready-{os.getpid()}").touch()
while not (Path(start_line) / "go").exists():
    time.sleep(0.02)
asked = time.time()
lease = lease_gpu(pool.split(","), Path(lock_dir), count=int(count), poll_seconds=0.05)
start = time.time()
time.sleep(float(seconds))
lease.release()
print(json.dumps({"devices": os.environ["CUDA_VISIBLE_DEVICES"].split(","), "asked": asked,
                  "start": start, "end": time.time()}))
"""


def _hold_together(tmp_path: Path, counts: list[int], pool: str, seconds: float) -> list[dict]:
    """One holder process per entry of `counts` (devices it leases from `pool`), all asking at
    once (a start line, whatever the machine's load); their spans."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")}
    start_line = tmp_path / "start"
    start_line.mkdir()
    args = [str(tmp_path), str(seconds), str(start_line)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, *args, str(count), pool],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for count in counts
    ]
    deadline = time.monotonic() + 120
    while len(list(start_line.glob("ready-*"))) < len(procs):
        assert time.monotonic() < deadline, "the holders did not start"
        time.sleep(0.05)
    (start_line / "go").touch()
    spans = [json.loads(p.communicate(timeout=120)[0]) for p in procs]  # a deadlock times out
    assert all(p.returncode == 0 for p in procs)
    return spans


def test_two_tp2_jobs_on_four_devices_never_wait(tmp_path: Path) -> None:
    spans = _hold_together(tmp_path, [2, 2], "0,1,2,3", seconds=3.0)
    for span in spans:
        assert len(span["devices"]) == len(set(span["devices"])) == 2
    assert not set(spans[0]["devices"]) & set(spans[1]["devices"])
    # Both started while the other held its pair: neither waited for the other's release.
    assert max(s["start"] for s in spans) < min(s["end"] for s in spans)


def test_tp2_and_tp1_on_two_devices_take_turns_without_deadlock(tmp_path: Path) -> None:
    spans = _hold_together(tmp_path, [2, 1, 2, 1], "0,1", seconds=0.5)
    assert sorted(len(s["devices"]) for s in spans) == [1, 1, 2, 2]
    for i, a in enumerate(spans):
        for b in spans[i + 1 :]:
            if set(a["devices"]) & set(b["devices"]):
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)


def test_lease_is_all_or_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With device 1 held elsewhere, a TP=2 lease over devices 0 and 1 waits holding nothing:
    device 0 stays free for anyone else meanwhile, and the lease fails after its wait."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after: lease_gpu sets it
    held = first_free_lock([("1", tmp_path / "gpu1.lock")], 0o666)
    assert held is not None
    try:
        with pytest.raises(TimeoutError, match=r"no free GPU among 0,1 .*\(2 needed at once\)"):
            lease_gpu(["0", "1"], tmp_path, count=2, wait_seconds=0.3, poll_seconds=0.05)
        free = first_free_lock([("0", tmp_path / "gpu0.lock")], 0o666)
        assert free is not None, "the failed lease kept device 0"
        os.close(free[1])
    finally:
        os.close(held[1])
    lease = lease_gpu(["0", "1"], tmp_path, count=2, wait_seconds=5, poll_seconds=0.05)
    assert lease.devices == ("0", "1") and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    lease.release()
    with pytest.raises(UserError, match="needs 3 GPUs .* this node has 2"):
        lease_gpu(["0", "1"], tmp_path, count=3)


def test_engine_gpus_follow_allowed_tensor_parallelism() -> None:
    assert engine_gpus({"tensor_parallel_size": 1}) == 1
    assert engine_gpus({"tensor_parallel_size": 2, "allow_tensor_parallel": True}) == 2
    assert engine_gpus({"tensor_parallel_size": 2, "allow_tensor_parallel": False}) == 1


def _fake_checkpoint(run: Path, name: str) -> None:
    d = run / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(d / "model.safetensors"))


def _planned_gpus(workdir: Path, engine: dict) -> dict[str, set[str]]:
    """Rule name -> the `gpu=` values `snakemake -n --profile profiles/2node` plans for it."""
    write_config(
        workdir,
        {
            "runs": {"demo": {"path": str(workdir / "run")}},
            "tasks": {"arith": {}, "pyfunc": {"engine_group": "code"}},
            "consolidate": {"smoke": "none"},
            "engine": engine,
        },
    )
    dry = dry_snakemake(workdir, "--profile", str(REPO / "profiles" / "2node"))
    assert dry.returncode == 0, dry.stderr[-3000:]
    planned: dict[str, set[str]] = {}
    for rule, body in re.findall(r"^rule (\w+):\n(.*?)\n\n", dry.stdout, re.S | re.M):
        found = re.search(r"resources: .*\bgpu=(\d+)", body)
        planned.setdefault(rule, set()).add(found.group(1) if found else "-")
    return planned


def test_dry_run_under_2node_plans_gpus_of_the_tensor_parallelism(tmp_path: Path) -> None:
    """The 2-node profile no longer pins engine jobs to one GPU: every engine job (both engine
    groups' rules, assist) asks for the engine's tensor parallelism, and 1 without it."""
    for step in (10, 20):
        _fake_checkpoint(tmp_path / "run", f"step_{step}")
    tp2 = _planned_gpus(tmp_path, {"allow_tensor_parallel": True, "tensor_parallel_size": 2})
    assert {rule: tp2[rule] for rule in ("infer", "infer_code", "assist")} == {
        "infer": {"2"},
        "infer_code": {"2"},
        "assist": {"2"},
    }, tp2
    tp1 = _planned_gpus(tmp_path, {})
    assert {rule: tp1[rule] for rule in ("infer", "infer_code", "assist")} == {
        "infer": {"1"},
        "infer_code": {"1"},
        "assist": {"1"},
    }, tp1
    assert tp1["evaluate"] == tp2["evaluate"] == {"-"}  # scoring never asks for a GPU
