"""The sandbox's native launcher (`launch.rs`): a command's start without a fork of the driver.

In a sandbox run as root, the driver starts each plain program (no Python file, no result
channel) by spawning this small static program (vfork and exec), which isolates it exactly as the
driver's forked child would (`ckpteval.sandbox_driver.spawn._child`: namespaces, /tmp, SysV
limits, seccomp, rlimits, uid) and execs it. A fork of the Python driver costs the command's
start its copy-on-write faults and a Python run before its exec: 2.9 ms a command in all on
bench machines, 1.75 ms with the launcher; a Rust cell runs one command per sample.

It is built once per toolchain with the Rust checker's own rustc (`ensure`), into the user's
cache directory, and used only where it built; anything else (no rustc, rootless, a build that
fails) starts commands by the fork, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from ckpteval.io import user_cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("launch.rs")
NAME = "ckpteval-launch"
FLAGS = (
    "--edition=2021",
    "-C",
    "opt-level=2",
    "-C",
    "panic=abort",
    "-C",
    "target-feature=+crt-static",
    "-C",
    "strip=symbols",
    "-A",
    "warnings",
)


def _private_root() -> Path:
    """The second choice: this user's directory under the system's temporary directory."""
    return Path(tempfile.gettempdir()) / f"ckpteval-{os.geteuid()}-cache"


def _cache_dir() -> Path | None:
    """The first of `ckpteval.io.user_cache_dir()` and `_private_root()` that is, or can be made,
    a directory only this user or root may change (`_safe`), nothing made where that does not
    hold (a home another user may write); None if neither."""
    for root in (user_cache_dir(), _private_root()):
        if not root.is_absolute():
            continue
        existing = next(p for p in (root, *root.parents) if p.exists())
        if not _safe(existing):
            continue
        try:
            root.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError:
            continue
        if _safe(root):
            return root
    return None


@lru_cache(maxsize=4)
def ensure(rustc: str) -> Path | None:
    """The launcher built by `rustc` (built now if this toolchain and source have none yet), or
    None where it cannot be: not root (the sandbox is rootless and forks), not x86_64, a cache
    directory another user could change, or a failed build (each said once in the log). The
    sandbox runs it as root: a cached build is used only if it and every directory above it are
    this user's or root's and writable by nobody else (`_safe`), and each process reads it once
    (`program`), so what runs is what was checked."""
    if os.geteuid() != 0 or platform.machine() != "x86_64":  # its system call numbers: x86_64's
        return None
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([rustc, "-vV"], capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sandbox launcher: rustc not usable (%s); commands start by fork", exc)
        return None
    key = hashlib.sha256(source + b"\0" + version + b"\0" + " ".join(FLAGS).encode())
    root = _cache_dir()
    if root is None:
        log.warning(
            "sandbox launcher: no cache directory only this user may change (%s, %s); "
            "commands start by fork",
            user_cache_dir(),
            _private_root(),
        )
        return None
    home = root / f"launch-{key.hexdigest()[:16]}"
    binary = home / NAME
    if program(binary) is not None:
        return binary
    build = Path(tempfile.mkdtemp(prefix="launch-build-", dir=root))
    try:
        os.chmod(build, 0o755)
        result = subprocess.run(
            [rustc, *FLAGS, str(SOURCE), "-o", str(build / NAME)],
            capture_output=True,
            timeout=300,
            cwd=build,
        )
        if result.returncode != 0 or not (build / NAME).is_file():
            message = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
            log.warning("sandbox launcher: build failed (%s); commands start by fork", message)
            return None
        os.chmod(build / NAME, 0o755)
        if home.exists():  # one not to trust: made anew
            shutil.rmtree(home, ignore_errors=True)
        with contextlib.suppress(OSError):  # another process's build landed first: that one
            os.rename(build, home)
        return binary if program(binary) is not None else None
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sandbox launcher: build failed (%s); commands start by fork", exc)
        return None
    finally:
        shutil.rmtree(build, ignore_errors=True)


def program(binary: Path) -> bytes | None:
    """The launcher's bytes, read once per process from a file this user owns and nobody else
    may write, under directories only this user or root may change; None otherwise. The sandbox
    writes them into each batch's private directory: a file swapped later is never run."""
    if binary not in _PROGRAMS:
        read = _read_checked(binary)
        if read is None:
            return None
        _PROGRAMS[binary] = read
    return _PROGRAMS[binary]


#: `program`'s reads that passed, by path.
_PROGRAMS: dict[Path, bytes] = {}


def _read_checked(binary: Path) -> bytes | None:
    try:
        fd = os.open(binary, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != os.geteuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            or not _safe(binary.parent)
        ):
            return None
        return handle.read()


def _safe(directory: Path) -> bool:
    """Whether `directory` and every one above it are this user's or root's, and none is writable
    by others but a sticky one (as /tmp: nobody else may rename what is ours in it)."""
    path = directory.absolute()
    for part in (path, *path.parents):
        try:
            info = os.lstat(part)
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            return _safe(Path(os.path.realpath(part))) and _safe(part.parent)
        if info.st_uid not in (0, os.geteuid()):
            return False
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return False
    return True
