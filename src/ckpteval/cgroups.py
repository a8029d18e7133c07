"""A control group per sandboxed command: the kernel's own count of its CPU and its memory.

Per-process counts miss what a sample can hide from them: `/proc` and BSD process accounting
count CPU in whole 10 ms ticks per process (a thousand children of 9 ms each count as nothing),
a process whose main thread exited while its other threads run shows only its dead leader's time,
and RLIMIT_AS bounds one process's address space, not the memfds, shared memory or tmpfs pages it
holds. A cgroup counts every thread of every process in it, in nanoseconds, and charges every page
its members fault in, whatever holds it.

What this module finds, in order (`CgroupSupport`):

- CPU: cgroup v2's `cpu.stat` (`usage_usec`, present in every v2 cgroup, controller or not), else
  cgroup v1's `cpuacct.usage` (ns).
- Memory: cgroup v2's `memory.max`, when the memory controller can be enabled below this
  process's cgroup, else cgroup v1's `memory.limit_in_bytes`.

Each needs a hierarchy this process may make children in (root, or a cgroup v2 subtree delegated
to the user). `make_batch` creates one cgroup per sandbox batch, below this process's own; the
sandbox binds it into the sandbox, its driver joins it first, and charges each command the
cgroup's CPU while it ran less its own, and sets the memory limit before each command. Without
a hierarchy the sandbox falls back to its per-process counts (`ckpteval.sandbox`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: Where a Linux host mounts its cgroup hierarchies.
CGROUP_ROOT = Path("/sys/fs/cgroup")

#: A batch's cgroup name: the process that made it, and a random part.
_BATCH_NAME = re.compile(r"ckpteval-(\d+)-[0-9a-f]{8}")

#: A batch cgroup left by a process that is gone is removed once it is this old (seconds): a
#: process killed by SIGKILL cannot remove its own, and a new batch's directory is empty for a
#: moment before its driver joins it.
STALE_AFTER_S = 60.0


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: "v1" or "v2", where it is mounted, this process's cgroup."""

    version: str
    mount: Path
    own: Path  # this process's cgroup directory in it

    def counter(self) -> str:
        """The file the driver reads a command's CPU from."""
        return "cpu.stat" if self.version == "v2" else "cpuacct.usage"


@dataclass(frozen=True)
class CgroupSupport:
    """Which hierarchies a batch's commands get a cgroup in (None: that count is per process)."""

    cpu: Hierarchy | None
    memory: Hierarchy | None


def _own_paths() -> dict[str, str]:
    """This process's cgroup per v1 controller name (and "" for v2), from /proc/self/cgroup."""
    paths = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _mounts() -> list[tuple[Path, str, set[str]]]:
    """(mount point, filesystem type, options) of every cgroup mount, from /proc/self/mountinfo."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], set(fields[sep + 3].split(","))
            if fstype in ("cgroup", "cgroup2"):
                found.append((Path(fields[4]), fstype, options))
    return found


def _writable(directory: Path) -> bool:
    """Whether this process can make (and remove) a child cgroup in `directory`."""
    probe = directory / f"ckpteval-probe-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def detect() -> CgroupSupport:
    """The hierarchies this process can give each command a cgroup in (see the module doc)."""
    own = _own_paths()
    v1: dict[str, Hierarchy] = {}
    v2: Hierarchy | None = None
    for mount, fstype, options in _mounts():
        if fstype == "cgroup2" and "" in own:
            here = mount / own[""].lstrip("/")
            if here.is_dir() and _writable(here):
                v2 = v2 or Hierarchy("v2", mount, here)
        elif fstype == "cgroup":
            for name in ("cpuacct", "memory"):
                if name in options and name in own and name not in v1:
                    here = mount / own[name].lstrip("/")
                    if here.is_dir() and _writable(here):
                        v1[name] = Hierarchy("v1", mount, here)
    memory = v1.get("memory")
    if v2 is not None and "memory" in _read(v2.own / "cgroup.subtree_control").split():
        memory = v2  # a child of this cgroup (the batch's) has memory.max
    return CgroupSupport(cpu=v2 or v1.get("cpuacct"), memory=memory)


_SUPPORT: CgroupSupport | None = None


def support() -> CgroupSupport:
    """`detect()`, once per process."""
    global _SUPPORT
    if _SUPPORT is None:
        _SUPPORT = detect()
    return _SUPPORT


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@dataclass(frozen=True)
class Batch:
    """A batch's cgroup directories (to bind into the sandbox, one per hierarchy in use) and
    the driver's spec of them: {"join": [dirs], "cpu": [version, dir] or None, "memory":
    [version, dir] or None}."""

    roots: tuple[Path, ...]
    spec: dict


@contextlib.contextmanager
def make_batch(which: CgroupSupport | None = None) -> Iterator[Batch]:
    """One cgroup for a sandbox batch (one directory per hierarchy in use), removed after it.

    One per batch, not per command: moving a process between cgroups waits for an RCU grace
    period (cgroup_threadgroup_rwsem), 10-20 ms on a loaded machine, more than many samples
    take. So the batch's driver joins it once, every command is born in it, and the driver
    charges each command the cgroup's CPU during it less its own (the commands of a batch run
    one after another, and nothing of one survives it), and sets the memory limit for each."""
    which = which or support()
    hierarchies = [h for h in dict.fromkeys((which.cpu, which.memory)) if h is not None]
    name = f"ckpteval-{os.getpid()}-{secrets.token_hex(4)}"
    made: list[Path] = []
    try:
        for hierarchy in hierarchies:
            _remove_stale(hierarchy.own)
            (hierarchy.own / name).mkdir()
            made.append(hierarchy.own / name)
        dirs = {h: str(h.own / name) for h in hierarchies}
        spec = {
            "join": list(dirs.values()),
            "cpu": [which.cpu.version, dirs[which.cpu]] if which.cpu else None,
            "memory": [which.memory.version, dirs[which.memory]] if which.memory else None,
        }
        yield Batch(tuple(made), spec)
    finally:
        _remove(made)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(own: Path) -> None:
    """Remove the empty batch cgroups of processes that are gone (killed before their `finally`
    ran); one that still holds a process refuses (EBUSY) and stays."""
    try:
        names = os.listdir(own)
    except OSError:
        return
    for name in names:
        match = _BATCH_NAME.fullmatch(name)
        if match is None or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        path = own / name
        try:
            if time.time() - path.stat().st_mtime < STALE_AFTER_S:
                continue
            path.rmdir()
            log.info("sandbox: removed cgroup %s left by a process that is gone", path)
        except OSError:
            continue


def _remove(made: Sequence[Path], timeout_s: float = 5.0) -> None:
    """Remove the batch's cgroups, children first. A cgroup whose last process is still being
    torn down (the sandbox's pid namespace dying) refuses with EBUSY for a moment."""
    deadline = time.monotonic() + timeout_s
    for path in reversed(made):
        while True:
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.warning("sandbox: cannot remove cgroup %s: %s", path, exc)
                    break
                time.sleep(0.01)
