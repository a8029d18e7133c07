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
to the user). `make_batch` creates one directory per hierarchy for a sandbox batch, below this
process's own cgroup, and one child per command with its memory limit; the sandbox binds the
batch's directories into the sandbox and its driver moves each command's first process into the
command's child before it drops privileges. Without a hierarchy the sandbox falls back to its
per-process counts (`ckpteval.sandbox`, "CPU without cgroups").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: Where a Linux host mounts its cgroup hierarchies.
CGROUP_ROOT = Path("/sys/fs/cgroup")


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
    if v2 is not None and "memory" in _read(v2.own / "cgroup.controllers").split():
        memory = v2
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
    """A batch's cgroup directories (to bind into the sandbox) and each command's cgroups."""

    roots: tuple[Path, ...]
    #: Per command: {"join": [dirs its first process moves into], "cpu": [version, dir] or None,
    #: "memory": [version, dir] or None} (the driver's spec).
    commands: tuple[dict, ...]


@contextlib.contextmanager
def make_batch(memory_limits: Sequence[int], which: CgroupSupport | None = None) -> Iterator[Batch]:
    """A cgroup per command (one per hierarchy in use), each with its memory limit; removed
    after the batch (once its processes are gone)."""
    which = which or support()
    hierarchies = [h for h in dict.fromkeys((which.cpu, which.memory)) if h is not None]
    name = f"ckpteval-{os.getpid()}-{secrets.token_hex(4)}"
    roots = [h.own / name for h in hierarchies]
    made: list[Path] = []
    try:
        for root in roots:
            root.mkdir()
            made.append(root)
        if which.memory is not None and which.memory.version == "v2":
            (which.memory.own / name / "cgroup.subtree_control").write_text("+memory\n")
        commands = []
        for i, limit in enumerate(memory_limits):
            dirs = {h: h.own / name / f"c{i}" for h in hierarchies}
            for path in dirs.values():
                path.mkdir()
                made.append(path)
            memory = None
            if which.memory is not None:
                memory = [which.memory.version, str(dirs[which.memory])]
                _set_memory_limit(which.memory.version, dirs[which.memory], limit)
            cpu = [which.cpu.version, str(dirs[which.cpu])] if which.cpu else None
            commands.append({"join": [str(p) for p in dirs.values()], "cpu": cpu, "memory": memory})
        yield Batch(tuple(roots), tuple(commands))
    finally:
        _remove(made)


def _set_memory_limit(version: str, directory: Path, limit: int) -> None:
    if version == "v2":
        (directory / "memory.max").write_text(f"{limit}\n")
        with contextlib.suppress(OSError):  # no swap accounting: nothing to bound
            (directory / "memory.swap.max").write_text("0\n")
    else:
        (directory / "memory.limit_in_bytes").write_text(f"{limit}\n")
        with contextlib.suppress(OSError):
            (directory / "memory.swappiness").write_text("0\n")


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
