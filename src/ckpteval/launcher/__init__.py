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


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/ckpteval`, or `~/.cache/ckpteval`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ckpteval"


@lru_cache(maxsize=4)
def ensure(rustc: str) -> Path | None:
    """The launcher built by `rustc` (built now if this toolchain and source have none yet), or
    None where it cannot be: not root (the sandbox is rootless and forks), not x86_64, or the
    build failed (said once in the log). A cached build is used only if this user owns it and nobody else may
    write to it: the sandbox runs it as root."""
    if os.geteuid() != 0 or platform.machine() != "x86_64":  # its system call numbers: x86_64's
        return None
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([rustc, "-vV"], capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sandbox launcher: rustc not usable (%s); commands start by fork", exc)
        return None
    key = hashlib.sha256(source + b"\0" + version + b"\0" + " ".join(FLAGS).encode())
    home = cache_root() / f"launch-{key.hexdigest()[:16]}"
    binary = home / NAME
    if _trusted(binary):
        return binary
    try:
        cache_root().mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix="launch-build-", dir=cache_root()))
    except OSError as exc:
        log.warning("sandbox launcher: no cache directory (%s); commands start by fork", exc)
        return None
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
        if binary.parent.exists():  # untrusted (or another process's build just landed)
            if _trusted(binary):
                return binary
            shutil.rmtree(binary.parent, ignore_errors=True)
        try:
            os.rename(build, home)
        except OSError:  # another process renamed its build first
            if not _trusted(binary):
                return None
        return binary if _trusted(binary) else None
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sandbox launcher: build failed (%s); commands start by fork", exc)
        return None
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _trusted(binary: Path) -> bool:
    """Whether `binary` and its directory are this user's, writable by nobody else."""
    try:
        for path in (binary.parent, binary):
            info = os.lstat(path)
            if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return False
        return stat.S_ISREG(os.lstat(binary).st_mode)
    except OSError:
        return False
