"""GPU leases: never two holders of one device, freed by the kernel when a holder is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ckpteval.engine.gpus import device_pool, lease_gpu

HOLDER = """
import json, os, sys, time
from pathlib import Path
from ckpteval.engine.gpus import lease_gpu
if len(sys.argv) > 3:  # a start line: lease only once every holder is up (any machine load)
    (Path(sys.argv[3]) / f"ready-{os.getpid()}").touch()
    while not (Path(sys.argv[3]) / "go").exists():
        time.sleep(0.02)
lease = lease_gpu([str(i) for i in range(8)], Path(sys.argv[1]), poll_seconds=0.05)
start = time.time()
time.sleep(float(sys.argv[2]))
print(json.dumps({"device": os.environ["CUDA_VISIBLE_DEVICES"], "start": start, "end": time.time()}))
"""


def test_sixteen_concurrent_jobs_on_eight_devices_never_overlap(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")}
    start_line = tmp_path / "start"
    start_line.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path), "0.6", str(start_line)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(16)
    ]
    import json

    deadline = time.monotonic() + 120
    while len(list(start_line.glob("ready-*"))) < 16:
        assert time.monotonic() < deadline, "the holders did not start"
        time.sleep(0.05)
    (start_line / "go").touch()

    spans = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {s["device"] for s in spans} <= {str(i) for i in range(8)}
    for i, a in enumerate(spans):
        for b in spans[i + 1 :]:
            if a["device"] == b["device"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    assert len({s["device"] for s in spans}) == 8  # every device was used


def test_sigkilled_holder_frees_its_device(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after: lease_gpu sets it
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")}
    code = HOLDER.replace("range(8)", "range(1)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), "60"], env=env)
    lock = tmp_path / "gpu0.lock"
    deadline = time.monotonic() + 30
    while not (lock.exists() and lock.read_text().strip() == str(holder.pid)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        lease_gpu(["0"], tmp_path, wait_seconds=0.3, poll_seconds=0.05)
    except TimeoutError as exc:
        assert "no free GPU among 0" in str(exc)
    else:
        raise AssertionError("leased a device another process holds")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lease = lease_gpu(["0"], tmp_path, wait_seconds=5, poll_seconds=0.05)
    assert lease.device == "0" and lease.how == "lock"
    lease.release()


def test_scheduler_binding_and_cpu(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    lease = lease_gpu(None, tmp_path)
    assert (lease.device, lease.how) == ("3", "scheduler")
    assert not list(tmp_path.iterdir())  # stepped aside: no lock taken
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert device_pool(None) == []
    assert lease_gpu(None, tmp_path).how == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert device_pool(None) == ["2", "5"]
