"""Scratch directories (ckpteval.scratch): private while used, removed after, and what a killed
process left is removed by the next one, never a running process's directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import processes_with

from ckpteval import scratch
from ckpteval.checkers.python import python_interpreter
from ckpteval.scratch import PREFIX, UNHELD, scratch_dir, sweep

PYTHON, _ = python_interpreter()


def child(code: str, root: Path, **popen: object) -> subprocess.Popen[str]:
    """A Python process whose scratch directories go under `root` (its TMPDIR)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import logging, os, sys, time\n" + code],
        env={**os.environ, "TMPDIR": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[arg-type]
    )


def killed_holder(root: Path, kind: str) -> Path:
    """A directory a process made and filled as a sealed Rust batch is (an execute-only tree,
    0111, its top included), then was SIGKILLed in its block: it never reached the removal."""
    proc = child(
        "from ckpteval.scratch import scratch_dir\n"
        f"with scratch_dir({kind!r}) as path:\n"
        "    (path / 'u0').mkdir()\n"
        "    (path / 'u0' / 'main').write_bytes(b'x' * 4096)\n"
        "    os.chmod(path / 'u0' / 'main', 0o111)\n"
        "    os.chmod(path / 'u0', 0o111)\n"
        "    os.chmod(path, 0o111)\n"
        "    print(path, flush=True)\n"
        "    os.kill(os.getpid(), 9)\n",
        root,
    )
    path = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
    assert proc.wait() == -signal.SIGKILL and path.is_dir()
    return path


def backdate(path: Path, seconds: float = 600) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_scratch_dir_is_private_and_gone_once_the_process_exits(tmp_path: Path) -> None:
    """A batch's scratch directory is removed off the worker's path, in the background: it is
    private while used, and still gone when the process exits right after its block (exit waits
    for the removals), even with hundreds of files in it."""
    code = (
        "from ckpteval.scratch import scratch_dir\n"
        "with scratch_dir('test') as path:\n"
        "    print(path, oct(os.stat(path).st_mode & 0o777), flush=True)\n"
        "    for i in range(300):\n"
        "        (path / f's{i}').mkdir()\n"
        "        (path / f's{i}' / 'main.py').write_text('x')\n"
    )
    proc = child(code, tmp_path)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    path, mode = out.split()
    assert Path(path).parent == tmp_path and Path(path).name.startswith(PREFIX + "test-")
    assert mode == "0o700"
    assert not Path(path).exists() and list(tmp_path.iterdir()) == []


def test_what_a_killed_process_left_is_removed_by_the_next_never_a_running_ones(
    tmp_path: Path,
) -> None:
    """The adversarial cases of the sweep: a directory held by a running process (older than
    the age guard), a dead one too young to tell from one being made, another uid's, a name
    outside the prefix and a symlink to a dead one's tree are all left; only the dead, aged
    directory of this uid goes, and the next process says so in one log line."""
    dead = killed_holder(tmp_path, "rs")
    young = killed_holder(tmp_path, "io")
    running = child(
        "from ckpteval.scratch import scratch_dir\n"
        "with scratch_dir('py') as path:\n"
        "    print(path, flush=True)\n"
        "    time.sleep(120)\n",
        tmp_path,
    )
    held = Path(running.stdout.readline().strip())  # type: ignore[union-attr]
    other = tmp_path / "unrelated-dir"
    other.mkdir()
    link = tmp_path / f"{PREFIX}link"
    link.symlink_to(dead)  # a link named like one, to a dead directory
    foreign = tmp_path / f"{PREFIX}foreign"
    foreign.mkdir()
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)
    for path in (dead, held, other, foreign):
        backdate(path)
    try:
        nxt = child(
            "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
            "from ckpteval.scratch import scratch_dir\n"
            "with scratch_dir('next') as path:\n"
            "    print(path, flush=True)\n",
            tmp_path,
        )
        out, err = nxt.communicate()
        assert nxt.returncode == 0, err
        assert not dead.exists()  # the killed process's, aged: removed with its 0111 tree
        assert held.is_dir() and young.is_dir() and other.is_dir() and link.is_symlink()
        assert not Path(out.strip()).exists()  # the next process's own: removed at its end
        if os.geteuid() == 0:
            assert foreign.is_dir()  # another uid's: not ours to judge
            swept = "1 scratch directory"
        else:  # a user cannot give it away: it is this uid's, aged, held by none, and goes too
            assert not foreign.exists()
            swept = "2 scratch directories"
        assert f"removed {swept} left under {tmp_path} by killed processes" in err
    finally:
        running.kill()
        running.wait()
    # Its holder gone (SIGKILL: the kernel drops the lock), the aged directory is swept; the
    # young one only once it has aged.
    assert sweep(str(tmp_path)) == [held.name]
    assert young.is_dir()
    assert sweep(str(tmp_path), min_age=0) == [young.name]


def test_a_killed_sandbox_run_leaves_its_io_directory_to_the_next_process(
    tmp_path: Path,
) -> None:
    """End to end: a process SIGKILLed while its command runs in the real sandbox leaves the
    batch's io directory (the sandbox's own processes die with it and hold no lock); the next
    process that makes a scratch directory removes it."""
    work = tmp_path / "work"
    work.mkdir(mode=0o755)
    root = tmp_path / "tmp"
    root.mkdir()
    marker = f"sandboxed-{tmp_path.name}"  # in the sandboxed command's line, not the child's
    proc = child(
        "from ckpteval.sandbox import Command, Limits, Sandbox\n"
        f"mark = 'sandboxed-' + {tmp_path.name!r}\n"
        f"Sandbox('bwrap').run_many([Command([{PYTHON!r}, '-I', '-S', '-c', "
        f"'import time; time.sleep(60)', mark], Limits(wall_s=90))], workdir={str(work)!r})\n",
        root,
    )
    deadline = time.monotonic() + 60
    while not processes_with(marker):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    left = [p for p in root.iterdir() if p.name.startswith(PREFIX + "io-")]
    assert left, "the killed run left no io directory: nothing was tested"
    for path in left:
        backdate(path)
    deadline = time.monotonic() + 30
    while processes_with(marker):  # bubblewrap's --die-with-parent, then its init
        assert time.monotonic() < deadline
        time.sleep(0.05)
    nxt = child("from ckpteval.scratch import scratch_dir\nwith scratch_dir('next'): pass\n", root)
    _, err = nxt.communicate()
    assert nxt.returncode == 0, err
    assert [p for p in left if p.exists()] == []


def test_a_sweep_of_a_missing_root_is_a_no_op(tmp_path: Path) -> None:
    assert sweep(str(tmp_path / "missing")) == []


def test_where_flock_fails_a_directory_is_renamed_out_of_every_sweeps_sight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some NFS and Lustre mounts refuse `flock` (EBADF on a read-only descriptor, ENOSYS,
    ENOLCK). Such a file system cannot run here, so its refusal is simulated: the directory is
    then used unheld under a name no sweep reads, and a sweep that could lock it (the refusal
    was passing) still leaves it."""
    real = scratch.fcntl.flock

    def refuse(fd: int, operation: int) -> None:
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(scratch.fcntl, "flock", refuse)
    with scratch_dir("nfs", str(tmp_path)) as path:
        assert path.is_dir() and path.name.startswith(UNHELD + "nfs-")
        monkeypatch.setattr(scratch.fcntl, "flock", real)
        backdate(path)
        assert sweep(str(tmp_path), min_age=0) == [] and path.is_dir()
