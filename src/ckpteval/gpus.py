"""Which GPU an infer job uses.

Snakemake only counts `gpu` resources; it never says which device a job got. Locally, each job
leases one device by taking a non-blocking `flock` on a node-local lock file per device: the kernel
releases it on any exit, SIGKILL included, so a crashed job never strands a GPU. Under a scheduler
that already bound a device (Slurm sets CUDA_VISIBLE_DEVICES for `--gpus=1`), we step aside.
`CUDA_VISIBLE_DEVICES` must be set before vLLM (or torch.cuda) is imported.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckpteval.io import first_free_lock

log = logging.getLogger(__name__)

DEFAULT_LOCK_DIR = Path(os.environ.get("CKPTEVAL_GPU_LOCK_DIR", "/tmp/ckpteval-gpu-locks"))


@dataclass
class Lease:
    """A held device (`device` is None on CPU or when a scheduler assigned the device)."""

    device: str | None
    how: str
    fd: int | None = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def device_pool(configured: Sequence[int | str] | None) -> list[str]:
    """The devices this node may lease: the config's list, else the inherited CUDA_VISIBLE_DEVICES."""
    if configured is not None:
        return [str(d) for d in configured]
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [d.strip() for d in inherited.split(",") if d.strip()]


def lease_gpu(
    configured: Sequence[int | str] | None,
    lock_dir: Path = DEFAULT_LOCK_DIR,
    *,
    wait_seconds: float = 3600.0,
    poll_seconds: float = 2.0,
) -> Lease:
    """Lease one device and point CUDA_VISIBLE_DEVICES at it; see the module docstring."""
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("CUDA_VISIBLE_DEVICES"):
        return Lease(os.environ["CUDA_VISIBLE_DEVICES"], "scheduler")
    pool = device_pool(configured)
    if not pool:
        return Lease(None, "cpu")
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_seconds
    announced = False
    locks = [(device, lock_dir / f"gpu{device}.lock") for device in pool]
    while True:
        taken = first_free_lock(locks, 0o666)
        if taken is not None:
            device, fd = taken
            os.set_inheritable(fd, True)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            os.environ["CUDA_VISIBLE_DEVICES"] = device
            return Lease(device, "lock", fd)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no free GPU among {','.join(pool)} after {wait_seconds:.0f} s (locks in {lock_dir}); "
                "lower the profile's gpu resource or free a device"
            )
        if not announced:
            log.info("all GPUs %s busy; waiting for a free one", ",".join(pool))
            announced = True
        time.sleep(poll_seconds)


def lease_engine_device(gpus: Sequence[int | str] | None) -> Lease:
    """A GPU for a vLLM engine (ckpteval.gpus); without one, vLLM runs on CPU, where its
    engine-core subprocess only adds start-up time (measured: it adds seconds and saves nothing)."""
    lease = lease_gpu(gpus)
    if lease.device is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return lease
