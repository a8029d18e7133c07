"""Private temporary directories that a killed process does not leave behind.

A scoring job writes each batch's programs, compiled binaries and results into a directory of its
own (a Rust batch's static test binary in /dev/shm, where it is memory). A job stopped by SIGKILL
(an out-of-memory kill, a scheduler's time limit, `scancel` after its grace period) or by a SIGTERM
that Python does not turn into cleanup never removes them, and on a node shared for weeks they add
up. So each directory is held: its process keeps an exclusive `flock` on it from creation to
removal. The kernel drops the lock when the process ends, however it ends, so a directory whose
lock can be taken belongs to no running process. The first scratch directory a process makes under
a root sweeps that root of such directories (its own uid's only, unchanged for `MIN_AGE_S`: the
age covers the instant between `mkdtemp` and the `flock` of a directory being made). Where the
file system has no `flock` (some NFS and Lustre mounts of a cluster's temp dir), a directory is
renamed to `UNHELD`'s prefix, which no sweep reads: a killed process leaves it, as before.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

#: Every held directory's name starts with this (then its kind): the sweep touches nothing else.
PREFIX = "ckpteval-held-"
#: A directory that could not be held (no `flock` on its file system) is renamed to this prefix.
UNHELD = "ckpteval-unheld-"
#: A directory modified this recently is never swept, held or not.
MIN_AGE_S = 60.0

_removers: dict[int, concurrent.futures.ThreadPoolExecutor] = {}  # per process (pid)
_swept: set[tuple[int, str]] = set()  # (pid, root) already swept
_lock = threading.Lock()


@contextlib.contextmanager
def scratch_dir(kind: str, root: str | None = None) -> Iterator[Path]:
    """A private directory (0700) under `root` (the temp dir by default), held by this process
    and removed in the background once the block ends. On a journaling file system, removing a
    batch's few hundred small files is mostly waiting (ext4 at load 12: 0.1-0.3 s for 64 samples'
    directories, a tenth of it CPU), which the worker would otherwise spend idle before its next
    batch. Interpreter exit waits for the removals (the executor's threads are joined then); a
    forked process gets its own thread."""
    root = root or tempfile.gettempdir()
    _sweep_once(root)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=root))
    held = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
    except OSError:  # no flock on this file system: renamed out of every sweep's sight
        unheld = path.with_name(UNHELD + path.name[len(PREFIX) :])
        os.rename(path, unheld)
        path = unheld
    try:
        yield path
    finally:
        with _lock:
            remover = _removers.get(os.getpid())
            if remover is None:
                remover = _removers[os.getpid()] = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="ckpteval-scratch"
                )
        try:
            remover.submit(_remove, path, held)
        except RuntimeError:  # the interpreter is shutting down: no new threads
            _remove(path, held)


def _remove(path: Path, held: int) -> None:
    """Remove `path`, then let go of it: a sweep never sees it unheld while it still exists."""
    try:
        _rmtree(path)
    finally:
        os.close(held)


def _open_dir(path: str, info: os.stat_result) -> int:
    """A descriptor of the directory `path` (`info`: its lstat), to take its lock. One this
    uid may not read (a user who is not root: a sealed Rust batch's top, execute-only) is made
    readable for the instant of the open, then given its mode back."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags)
    except PermissionError:
        if info.st_mode & 0o400:
            raise
    mode = stat.S_IMODE(info.st_mode)
    os.chmod(path, mode | 0o400)
    try:
        fd = os.open(path, flags)
    except OSError:
        os.chmod(path, mode)
        raise
    os.fchmod(fd, mode)
    return fd


def _rmtree(path: str | Path) -> None:
    """Remove the tree `path`, errors ignored. What a first pass leaves (a user who is not root:
    directories it owns but may not list or change, a sealed Rust batch's, execute-only) is
    opened up to its owner, then removed."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        _open_up(path)
        shutil.rmtree(path, ignore_errors=True)


def _open_up(path: str | Path) -> None:
    """Give this uid rwx on each directory under `path` (itself included) that it owns and
    that lacks some of them; symlinks not followed."""
    uid, stack = os.geteuid(), [str(path)]
    while stack:
        current = stack.pop()
        try:
            info = os.lstat(current)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
                continue
            if info.st_mode & 0o700 != 0o700:
                os.chmod(current, stat.S_IMODE(info.st_mode) | 0o700)
            with os.scandir(current) as entries:
                stack += [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue


def _sweep_once(root: str) -> None:
    key = (os.getpid(), root)
    with _lock:
        if key in _swept:
            return
        _swept.add(key)
    removed = sweep(root)
    if removed:
        log.info(
            "removed %d scratch director%s left under %s by killed processes",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            root,
        )


def sweep(root: str, min_age: float = MIN_AGE_S) -> list[str]:
    """Remove the held directories under `root` that no process holds any more (this uid's,
    unmodified for `min_age` seconds); returns their names."""
    removed: list[str] = []
    now, uid = time.time(), os.geteuid()
    try:
        entries = os.scandir(root)
    except OSError:
        return removed
    with entries:
        for entry in entries:
            if not entry.name.startswith(PREFIX):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if (
                    not stat.S_ISDIR(info.st_mode)
                    or info.st_uid != uid
                    or now - info.st_mtime < min_age
                ):
                    continue
                fd = _open_dir(entry.path, info)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # its process is running (or this file system has no flock)
                _rmtree(entry.path)
                removed.append(entry.name)
            finally:
                os.close(fd)
    return removed
