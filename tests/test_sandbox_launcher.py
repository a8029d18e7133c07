"""The native launcher (`ckpteval.launcher`) starts a plain program exactly as the driver's fork
does: the same probes, run once each way, see the same process state (credentials,
capabilities, no_new_privs, seccomp, signal dispositions, session, limits, mounts, /tmp, IPC
bounds, descriptors, environment), the same failures, and the launcher is used only where it
applies. The guarantees themselves are tested on both starts by the parametrised sandbox tests
(test_sandbox.py, test_sandbox_isolation.py, test_sandbox_kernel_state.py)."""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

import pytest
from conftest import ignoring_signals, sandbox_starting_by

from ckpteval import launcher
from ckpteval.sandbox import Command, Limits, Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher runs as root only")

#: What a program sees of its own process and sandbox; every line compared between the starts.
PROBE = r"""
set -e
grep -E '^(Uid|Gid|Groups|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp|Seccomp_filters|SigBlk|SigIgn|SigCgt|Umask)' /proc/self/status
cat /proc/self/limits
echo "oom $(cat /proc/self/oom_score_adj)"
echo "session leader $(ps -o pid=,sid= -p $$ | awk '{print ($1 == $2)}')"
echo "fds $(ls /proc/self/fd | tr '\n' ' ')"
echo "cwd $(pwd)"
echo "tmp $(ls -A /tmp | tr '\n' ' ')"
echo "parent $(ls -A .. | tr '\n' ' ')"
for f in shmmax shmall shmmni msgmni sem; do echo "$f $(cat /proc/sys/kernel/$f)"; done
awk '{print $5, $9, $10}' /proc/self/mountinfo | sort
env | sort
echo "stdin $(cat)"
"""


def probe(sandbox: Sandbox, tmp_path: Path) -> list[tuple[int | None, str, str]]:
    """Two probe commands (one per sample directory, as the checkers run them), a missing
    program, and a program that is not executable: (exit code, stdout, stderr) each."""
    work = tmp_path / "work"
    for name in ("s0", "s1"):
        (work / name).mkdir(parents=True)
    os.chmod(work, 0o755)
    stdin = (
        tmp_path / "in" / "stdin.txt"
    )  # its directory is bound for the batch: not `work`'s parent
    stdin.parent.mkdir()
    stdin.write_text("from the file\n")
    (work / "s1" / "not-executable").write_text("#!/bin/sh\necho ran\n")
    limits = Limits(wall_s=10)
    commands = [
        Command(["sh", "-c", PROBE], limits, cwd=work / "s0", stdin=stdin, env={"EXTRA": "1"}),
        Command(["sh", "-c", PROBE], limits, cwd=work / "s1"),
        Command(["no-such-program-here"], limits, cwd=work / "s0"),
        Command(["./not-executable"], limits, cwd=work / "s1"),
    ]
    results = sandbox.run_many(commands, workdir=work)
    return [(r.exit_code, r.stdout.decode(), r.stderr.decode()) for r in results]


def test_a_launched_program_sees_what_a_forked_one_sees(tmp_path: Path) -> None:
    """Started by a caller that ignores signals (nohup's SIGHUP; glibc's 32 and 33 as its
    posix_spawn leaves them, which CI's make did): every command gets each default action."""
    with ignoring_signals():
        forked = probe(sandbox_starting_by("fork"), tmp_path / "fork")
        launched = probe(sandbox_starting_by("launcher"), tmp_path / "launcher")

    def same_paths(text: str, which: str) -> str:
        """Each batch's own names (its directories, its io directory, its cgroup) and its uid
        (the first one free: another batch running beside takes the next) made alike, where all
        four of a line's ids are that one."""
        text = re.sub(r"^(Uid|Gid):\t(\d+)\t\2\t\2\t\2$", r"\1:\tID", text, flags=re.M)
        text = text.replace(str(tmp_path / which), "TMP")
        text = re.sub(r"ckpteval-held-io-\w+", "IO", text)
        return re.sub(r"ckpteval-\d+-[0-9a-f]+", "CGROUP", text)

    for (f_code, f_out, f_err), (l_code, l_out, l_err) in zip(forked, launched, strict=True):
        assert (f_code, same_paths(f_out, "fork")) == (l_code, same_paths(l_out, "launcher"))
        assert same_paths(f_err, "fork") == same_paths(l_err, "launcher")
    (code, out, _), (_, other, _), (missing, _, why), (denied, _, why_not) = launched
    assert code == 0
    # what the probe saw is the sandbox's, not a vacuous match of two broken runs
    assert re.search(r"^Uid:\s+(\d+)\s+\1\s+\1\s+\1$", out, re.M) and "Uid:\t0\t" not in out
    assert re.search(r"^CapEff:\s+0+$", out, re.M)
    assert re.search(r"^NoNewPrivs:\s+1$", out, re.M)
    assert re.search(r"^SigIgn:\s+0+$", out, re.M)  # none ignored, as in a fresh shell's program
    assert re.search(r"^Seccomp:\s+2$", out, re.M)
    assert "oom 1000" in out and "session leader 1" in out
    assert "fds 0 1 2 3 \n" in out  # 3: ls's own directory
    # of /tmp, only the way to the command's own directory and to the stdin file's
    assert f"tmp {tmp_path.relative_to('/tmp').parts[0]} \n" in out or not tmp_path.is_relative_to(
        "/tmp"
    )
    assert "parent s0 \n" in out and "parent s1 \n" in other
    assert "shmmni 64" in out and "EXTRA=1" in out and "stdin from the file" in out
    assert "stdin \n" in other and "EXTRA" not in other
    assert missing == 127 and "sandbox: cannot run no-such-program-here: [Errno 2]" in why
    assert denied == 127 and "[Errno 13] Permission denied" in why_not


def test_only_plain_programs_as_root_are_launched() -> None:
    """Python files (a fork of the warm driver), result channels and hidden files (what only
    `_child` does), and rootless sandboxes start by the fork."""
    from ckpteval.sandbox_driver.spawn import _launches

    plain = {"argv": ["x"], "python_file": None, "result_channel": False}
    spec = {"launcher": "/cache/ckpteval-launch"}
    assert _launches(plain, spec)
    assert not _launches(plain, {})
    assert not _launches(plain, {**spec, "rootless": True})
    assert not _launches({**plain, "python_file": "/w/main.py"}, spec)
    assert not _launches({**plain, "result_channel": True}, spec)
    assert not _launches({**plain, "hide": ["/w/tests.json"]}, spec)


def test_a_launcher_that_cannot_start_falls_back_to_the_fork(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A launcher gone from its cache while a checker holds its path: the batch says so once
    and its commands still run, isolated, by the fork."""
    broken = tmp_path / "cache" / launcher.NAME
    broken.parent.mkdir()
    broken.write_text("not a program\n")  # no exec permission: posix_spawn fails
    os.chmod(broken.parent, 0o755)
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(work, 0o755)
    sandbox = Sandbox("bwrap", launcher=broken)
    results = sandbox.run_many(
        [Command(["sh", "-c", "id -u; grep NoNewPrivs /proc/self/status"], Limits(wall_s=10))] * 2,
        workdir=work,
    )
    for result in results:
        assert result.exit_code == 0, result
        uid, nnp = result.stdout.decode().split("\n")[:2]
        assert uid != "0" and nnp.split() == ["NoNewPrivs:", "1"]
    said = [r.getMessage() for r in caplog.records if "launcher failed" in r.getMessage()]
    assert len(said) == 1 and "Exec format error" in said[0], said


def test_a_launcher_others_could_change_is_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox runs the launcher as root: a cached build that another user could have
    replaced (group or world writable) is not used, a fresh one is built in its place; under a
    directory another user may write nothing is made: the build goes to this user's private
    directory under the system's temporary directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rustc = shutil.which("rustc")
    assert rustc

    def fresh() -> Path | None:
        launcher.ensure.cache_clear()
        launcher._PROGRAMS.clear()
        return launcher.ensure(rustc)

    try:
        built = fresh()
        assert built is not None and built.is_relative_to(tmp_path)
        os.chmod(built, 0o777)
        rebuilt = fresh()
        assert rebuilt == built
        assert not os.stat(rebuilt).st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        # a cache under a directory others may write: nothing is built or made there
        shared = tmp_path / "shared"
        shared.mkdir()
        os.chmod(shared, 0o777)
        monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
        elsewhere = fresh()
        assert list(shared.iterdir()) == []
        assert elsewhere is not None and elsewhere.is_relative_to(launcher._private_root())
    finally:
        launcher.ensure.cache_clear()
        launcher._PROGRAMS.clear()


def test_an_argument_the_launcher_cannot_take_starts_by_the_fork(tmp_path: Path) -> None:
    """A lone surrogate (an undecodable byte of a file name, as Python spells it) is not UTF-8
    text: that command forks, and runs with its byte as it always did."""
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(work, 0o755)
    script = 'printf %s "$1" | od -An -tx1'
    result = sandbox_starting_by("launcher").run_many(
        [Command(["sh", "-c", script, "sh", "a\udcffb"], Limits(wall_s=10))], workdir=work
    )[0]
    assert result.exit_code == 0, result
    assert result.stdout.split() == [b"61", b"ff", b"62"]


def test_a_launcher_swapped_in_the_cache_after_its_check_is_never_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bytes a process checked are the ones every batch runs: a file put in the cache's
    place afterwards (here one that cannot run at all) changes nothing."""
    built = sandbox_starting_by("launcher").launcher
    swapped = tmp_path / "cache" / launcher.NAME
    swapped.parent.mkdir()
    shutil.copyfile(built, swapped)
    assert launcher.program(swapped) == launcher.program(built)
    swapped.write_text("not a program\n")
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(work, 0o755)
    result = Sandbox("bwrap", launcher=swapped).run_many(
        [Command(["sh", "-c", "grep SigIgn /proc/self/status"], Limits(wall_s=10))], workdir=work
    )[0]
    assert result.exit_code == 0, result
    assert not [r for r in caplog.records if "launcher failed" in r.getMessage()]
    launcher._PROGRAMS.pop(swapped)
