"""What lets `make test` run in two pytest-xdist workers: the cached demo build is taken in turns,
each worker leases fake GPUs from its own lock directory, and the long modules are collected first.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LONGEST_FIRST, REPO, exclusive

HOLD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from conftest import exclusive
with exclusive(Path(sys.argv[2])):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def test_a_second_holder_waits_until_the_first_releases(tmp_path: Path) -> None:
    """What keeps two workers from building the demo at once: the second blocks, then proceeds."""
    lock = tmp_path / "demo.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(REPO / "tests"), str(lock), "1.5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        held_at = time.monotonic()
        with open(lock, "a") as handle, pytest.raises(BlockingIOError):
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with exclusive(lock):  # the holder keeps it 1.5 s after saying so; load only adds to that
            assert time.monotonic() - held_at >= 1.4, "took the lock while the first had it"
        assert holder.wait(timeout=60) == 0
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_freed_when_its_holder_is_killed(tmp_path: Path) -> None:
    """A worker that dies mid-build does not leave the other waiting forever."""
    lock = tmp_path / "demo.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(REPO / "tests"), str(lock), "600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait()
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if still held


def test_each_xdist_worker_has_its_own_gpu_lock_dir() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        pytest.skip("runs only under pytest-xdist (make test)")
    from ckpteval.engine.gpus import DEFAULT_LOCK_DIR

    assert DEFAULT_LOCK_DIR.name.endswith(f"-{worker}")


def test_the_longest_modules_are_collected_first(request: pytest.FixtureRequest) -> None:
    """With --no-loadscope-reorder, xdist hands out modules in collection order."""
    modules = list(dict.fromkeys(item.path.name for item in request.session.items))
    listed = [name for name in modules if name in LONGEST_FIRST]
    assert listed == [name for name in LONGEST_FIRST if name in listed]
    assert modules[: len(listed)] == listed
    assert all((REPO / "tests" / name).exists() for name in LONGEST_FIRST), "a stale entry"
