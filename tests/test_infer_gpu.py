"""The same infer paths on a real GPU (skipped without one): a leased device, one engine for every
task, resume after SIGKILL, and lm-eval parity come from the CPU tests' module, run here with the
GPU pool given explicitly so the flock lease, not a scheduler, picks the device."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from test_infer_vllm import TASKS, _config, _rows, _spawn, model  # noqa: F401 - a fixture
from test_tasks_harness import local_code_tasks

from ckpteval.backends import cache_namespace
from ckpteval.io import read_json

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _devices() -> list[str]:
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def test_gpu_job_leases_a_device_and_resumes_after_sigkill(
    model: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("CKPTEVAL_GPU_LOCK_DIR", str(tmp_path / "locks"))
    include = local_code_tasks(tmp_path / "tasks")
    cache = tmp_path / "cache" / cache_namespace(read_json(model["manifest"])) / "arith.jsonl"
    killed = _spawn(
        tmp_path, "killed", _config({"arith": {}}, include, chunk_size=1), model, gpus=_devices()
    )
    deadline = time.monotonic() + 600
    while not (cache.exists() and _rows(cache)):
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    at_kill = len({r["key"] for r in _rows(cache)})
    # The killed holder's lease is free again: the rerun gets a device at once.
    proc = _spawn(
        tmp_path, "resumed", _config(TASKS, include, chunk_size=4), model, gpus=_devices()
    )
    assert proc.wait(timeout=900) == 0, (tmp_path / "resumed.log").read_text()[-4000:]
    metas: list[dict[str, Any]] = [
        json.loads(p.read_text()) for p in (tmp_path / "gen").rglob("*.meta.json")
    ]
    assert {m["engine_loads"] for m in metas} == {1}
    device = metas[0]["device"]
    assert device["lease"] == "lock" and device["cuda_visible_devices"] in _devices()
    assert device["gpu_name"] not in ("cpu", "unknown")
    arith = json.loads((tmp_path / "gen" / "arith" / "greedy-s42.meta.json").read_text())
    if at_kill < 20:  # a GPU may finish 20 tiny prompts before the kill lands
        assert (arith["n_cached_prompts"], arith["n_generated_prompts"]) == (at_kill, 20 - at_kill)
