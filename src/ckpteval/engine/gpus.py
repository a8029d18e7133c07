"""Which GPUs an engine job uses, and how many it asks Snakemake for.

Snakemake only counts `gpu` resources; it never says which device a job got. Locally, each job
leases its devices by taking non-blocking `flock`s on a node-local lock file per device: the kernel
releases them on any exit, SIGKILL included, so a crashed job never strands a GPU. A job whose
engine splits the model over N devices (tensor parallelism) takes N at once or none: it never
holds some while waiting for others, so two such jobs can never each hold half of what the other
needs. Under a scheduler that already bound the devices (Slurm sets CUDA_VISIBLE_DEVICES for
`--gpus=N`), we step aside. `CUDA_VISIBLE_DEVICES` must be set before vLLM (or torch.cuda) is
imported.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckpteval.errors import UserError
from ckpteval.io import first_free_lock

log = logging.getLogger(__name__)

DEFAULT_LOCK_DIR = Path(os.environ.get("CKPTEVAL_GPU_LOCK_DIR", "/tmp/ckpteval-gpu-locks"))


def engine_gpus(engine: dict) -> int:
    """GPUs one engine job needs: its tensor parallelism when the config allows it (the config
    refuses tensor_parallel_size > 1 without engine.allow_tensor_parallel), else 1. The engine
    rules ask Snakemake (and so Slurm's `--gpus`) for this many, and the job leases as many."""
    if not engine.get("allow_tensor_parallel"):
        return 1
    return max(1, int(engine.get("tensor_parallel_size", 1)))


@dataclass
class Lease:
    """Held devices: `device` is the CUDA_VISIBLE_DEVICES value this job set ("0" or "2,3"),
    None on CPU; `fds` are the lock files' descriptors (none when a scheduler assigned them)."""

    device: str | None
    how: str
    fds: tuple[int, ...] = ()

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.device.split(",")) if self.device else ()

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = ()


def device_pool(configured: Sequence[int | str] | None) -> list[str]:
    """The devices this node may lease: the config's list, else the inherited CUDA_VISIBLE_DEVICES."""
    if configured is not None:
        return [str(d) for d in configured]
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [d.strip() for d in inherited.split(",") if d.strip()]


def _take(locks: list[tuple[str, Path]], count: int) -> list[tuple[str, int]] | None:
    """`count` free devices of `locks`, all locked, or None with nothing held (all or none)."""
    held: list[tuple[str, int]] = []
    for pair in locks:
        taken = first_free_lock([pair], 0o666)
        if taken is not None:
            held.append(taken)
            if len(held) == count:
                return held
    for _, fd in held:
        os.close(fd)
    return None


def lease_gpu(
    configured: Sequence[int | str] | None,
    lock_dir: Path = DEFAULT_LOCK_DIR,
    *,
    count: int = 1,
    wait_seconds: float = 3600.0,
    poll_seconds: float = 2.0,
) -> Lease:
    """Lease `count` devices at once and point CUDA_VISIBLE_DEVICES at them; see the module
    docstring."""
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("CUDA_VISIBLE_DEVICES"):
        return Lease(os.environ["CUDA_VISIBLE_DEVICES"], "scheduler")
    pool = device_pool(configured)
    if not pool:
        return Lease(None, "cpu")
    if count > len(pool):
        raise UserError(
            f"an engine needs {count} GPUs (engine.tensor_parallel_size) but this node has "
            f"{len(pool)} ({','.join(pool)}): lower engine.tensor_parallel_size or list more `gpus`"
        )
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_seconds
    announced = False
    locks = [(device, lock_dir / f"gpu{device}.lock") for device in pool]
    while True:
        held = _take(locks, count)
        if held is not None:
            for _, fd in held:
                os.set_inheritable(fd, True)
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            device = ",".join(d for d, _ in held)
            os.environ["CUDA_VISIBLE_DEVICES"] = device
            return Lease(device, "lock", tuple(fd for _, fd in held))
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no free GPU among {','.join(pool)} after {wait_seconds:.0f} s"
                f"{f' ({count} needed at once)' if count > 1 else ''} (locks in {lock_dir}); "
                "lower the profile's gpu resource or free a device"
            )
        if not announced:
            log.info("GPUs %s busy; waiting for %d free one(s)", ",".join(pool), count)
            announced = True
        time.sleep(poll_seconds)


def lease_engine_device(gpus: Sequence[int | str] | None, count: int = 1) -> Lease:
    """`count` GPUs for a vLLM engine (ckpteval.engine.gpus); without one, vLLM runs on CPU, where its
    engine-core subprocess only adds start-up time (measured: it adds seconds and saves nothing)."""
    lease = lease_gpu(gpus, count=count)
    if lease.device is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return lease
