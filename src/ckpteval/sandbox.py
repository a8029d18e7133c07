"""Run untrusted code: bubblewrap, a non-root uid, no network, rlimits, process-group kill.

Every generated program is hostile until proven otherwise. A sandbox is

    bwrap (as root: namespaces, mounts)  ->  driver (root, 5 capabilities)  ->  program (uid U)

- bubblewrap runs as root so it can bind toolchains that live under `/root` (pyenv, rustup). Inside,
  a small driver (`ckpteval.sandbox_driver`, standard library only) keeps just the capabilities to
  switch uid, kill and clean up, and starts each program as a non-root uid with no groups, no
  capabilities, `no_new_privs`, its own session and its rlimits (CPU, address space, file size,
  processes). The kernel ignores RLIMIT_NPROC for root, so the uid drop is what makes the process
  limit (fork bombs) hold.
- Each concurrent sandbox takes its own uid from a pool guarded by lock files shared by every
  process on the host: RLIMIT_NPROC counts all processes of a uid, so a fork bomb in one sample
  cannot starve a sample running beside it.
- New pid, network, ipc, uts and cgroup namespaces: no network at all; programs cannot see or
  signal anything outside, nor the driver (another uid). The driver is the pid namespace's init
  (`--as-pid-1`): bubblewrap's own init would be one more process a command can see, which,
  rootless, has the command's uid and is dumpable (traced, its memory written, its root a way
  past the command's mount namespace). Within a batch, each command also gets mount and IPC
  namespaces of its own (see `run_many`).
- Nothing a command leaves in the kernel outlives it: its processes are killed, its files, SysV
  and POSIX IPC go with its namespaces, and a seccomp filter refuses what would outlive them
  all: kernel keyrings (a uid's user keyring outlives its processes and Linux has no keyring
  namespace; the uid pool is shared by every run on the host) and new user namespaces (root of
  its own mounts, a program could mount a tmpfs past every limit).
- The filesystem is an empty root with read-only binds of `/usr`, a few `/etc` files the loader
  and compilers need, the interpreter or toolchain the checker names, and the work directory
  (read-only or writable as asked); `/tmp` is a private size-limited tmpfs, fresh for each command.
  Home directories and the repository are not visible.
- stdout and stderr go to memfds the program gets write-only; once all its processes have ended,
  the driver appends them to the batch's outputs file, outside the program's reach (no file is
  created per command: on ext4 that cost ~1 ms of a command's ~5). RLIMIT_FSIZE caps them (and
  any file the program writes), so printing gigabytes ends the program instead of filling a disk
  or memory; while it runs they count toward its memory.
- The time limit is the CPU time of all of a command's processes together (`Limits.cpu_budget`),
  counted by the kernel in a cgroup of the command's own (`ckpteval.cgroups`: every thread, to
  the nanosecond), which also bounds its memory in all (`Limits.memory_bytes`: memfds and shared
  memory included); without a writable cgroup, per process by the driver (BSD process accounting
  and /proc, in ticks). A wall clock of `Limits.wall_limit` only stops programs that block.
  RLIMIT_CPU bounds each process. After each command of a batch (`run_many`) the driver kills
  every leftover process.

Without root (`ckpteval` run by a user, as on a Slurm cluster), bwrap mode runs rootless:
bubblewrap makes a user namespace too, whose one uid (the user's) is root inside, the driver's
and every command's. What the uid split gives as root is kept otherwise: each command gives up
every capability, its bounding set and root's right to regain them on exec (securebits, locked);
the seccomp filter also refuses any signal or pidfd aimed at the driver, and kill(-1); the
driver and a judged run's test process are not dumpable, so a command can neither trace them nor
open their descriptors or memory through /proc; the driver's directories, a judged run's tests
and a command's stdin directory are covered in the command's own mount namespace; RLIMIT_NPROC
counts per user namespace, so the process limit holds. What it loses: BSD process accounting
(acct(2) needs the host's root) and, unless the host delegates a cgroup v2 subtree to the user,
the per-command cgroup, so CPU is counted from /proc and the processes the driver reaps
(children the kernel reaps itself, SIGCHLD ignored, go uncounted) and memory held outside address
spaces (memfds, shared memory) is bounded only by /tmp's and SysV's sizes; a judged sample can
signal its own tests' process (it can only fail itself that way). `tests/test_sandbox_rootless.py`
runs the attacks as `nobody`.

`mode="none"` runs the same commands without bubblewrap and without the uid drop (rlimits via
`prlimit` and the timeout still apply). It exists for machines where bubblewrap cannot run; it
must be chosen explicitly and warns every time it is set up.

Failures of the sandbox itself (bwrap missing, refusing to start, the driver dying) raise
`SandboxError`: they are failures of the run, never of the sample.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ckpteval import cgroups, sandbox_driver
from ckpteval import launcher as launch
from ckpteval.errors import UserError
from ckpteval.io import first_free_lock
from ckpteval.scratch import scratch_dir

log = logging.getLogger(__name__)

SANDBOX_MODES = ("bwrap", "none")

#: The uids sandboxed programs run as: one per concurrent run, never 0, no passwd entry needed.
UID_POOL = range(61000, 61512)
_LOCK_DIR = Path(tempfile.gettempdir()) / "ckpteval-sandbox-uids"

#: Files from /etc a dynamically linked program or a compiler driver needs; nothing else of /etc.
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
)

#: Directories the sandbox creates itself; binds below them need their own mount points.
_MOUNT_POINTS = (Path("/"), Path("/etc"), Path("/tmp"), Path("/proc"), Path("/dev"))

_BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
}


#: What the batch driver keeps of root inside the sandbox: switch uid, kill strays, give each
#: command its own mount and IPC namespaces (SYS_ADMIN), account every process's CPU (SYS_PACCT).
_DRIVER_CAPS = (
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_KILL",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_SYS_ADMIN",
    "CAP_SYS_PACCT",
)
#: A command's wall clock is a backstop for programs that block (sleep, wait): at least this many
#: times its CPU budget, so that load on the machine does not turn a CPU-bound pass into a timeout.
WALL_FACTOR = 2.0


@functools.cache
def _driver_code() -> bytes:
    """The driver (`ckpteval.sandbox_driver.program`) compiled once per process, marshalled: a
    batch's driver loads it in ~1 ms, where compiling its source took 170-250 ms of every batch
    (a few samples' worth of a core). The sandbox runs it with the base interpreter of this very
    Python: the same marshal format."""
    return sandbox_driver.program()


#: The driver's bootstrap: run its modules' code objects, in order, in one namespace, from the
#: file named first (`write_driver`), leaving the driver's own arguments from `argv[1]` on.
_DRIVER_BOOTSTRAP = "import marshal,sys\nfor c in marshal.load(open(sys.argv.pop(1),'rb')):exec(c)"


def write_driver(directory: Path) -> Path:
    """Write the compiled driver into `directory` (for one `driver_command` or many); returns its
    path. A sandbox's is its io directory, which no command can enter or see."""
    path = Path(directory) / "driver.code"
    path.write_bytes(_driver_code())
    return path


def driver_command(code: Path, *args: str) -> list[str]:
    """The driver (`write_driver`'s `code`) run by the base interpreter with `args`."""
    interpreter = os.path.realpath(sys._base_executable)  # type: ignore[attr-defined]
    return [interpreter, "-I", "-S", "-B", "-c", _DRIVER_BOOTSTRAP, str(code), *args]


class SandboxError(RuntimeError):
    """The sandbox could not run a program at all: an infrastructure failure, not a verdict."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run. `cpu_s` defaults to the wall time rounded up, plus one second."""

    wall_s: float = 10.0
    cpu_s: int | None = None
    memory_bytes: int = 2 << 30
    file_bytes: int = 32 << 20
    nproc: int = 64
    tmp_bytes: int = 256 << 20

    @property
    def cpu_limit(self) -> int:
        """Each process's RLIMIT_CPU (a backstop: `cpu_budget` bounds them all together)."""
        return self.cpu_s if self.cpu_s is not None else math.ceil(self.wall_s) + 1

    @property
    def cpu_budget(self) -> float:
        """CPU seconds of every process of one command together (bwrap mode): the time limit."""
        return float(self.cpu_s) if self.cpu_s is not None else self.wall_s

    @property
    def wall_limit(self) -> float:
        """When a command that has not used its CPU budget (it blocks) is stopped (bwrap mode)."""
        return max(self.wall_s, WALL_FACTOR * self.cpu_budget)


@dataclass(frozen=True)
class RunResult:
    """What happened to one program. `exit_code` is None when a signal ended it. `cpu_s` is the
    user + system time of every process it started, orphans included (bwrap mode: the driver
    reaps them all; `none`: the program and the children it reaped)."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    output_limit: bool
    stdout: bytes
    stderr: bytes
    duration_s: float
    cpu_s: float
    max_rss_bytes: int
    #: A judged Python run's report (`Command.python_tests`), else None.
    judge: dict | None = None
    #: The kernel killed one of its processes at the command's memory limit (its cgroup's).
    memory_limit: bool = False
    #: What the command's own first process sent on its result channel (`Command.result_channel`),
    #: else None; `forged_results` counts messages that other processes of it sent there.
    channel: bytes | None = None
    forged_results: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_limit


@dataclass(frozen=True)
class Command:
    """One program for `Sandbox.run_many`: its argv, current directory, stdin and limits."""

    argv: Sequence[str]
    limits: Limits
    cwd: Path | None = None
    stdin: Path | None = None
    env: Mapping[str, str] | None = None
    #: Run this Python file in a fork of the sandbox's interpreter (`run_many` only): the same
    #: as exec'ing `argv` = [base interpreter, -I, -S, -B, file], without the start-up cost,
    #: with `run_many`'s `site_dirs` on its path and its `preload` modules already imported.
    python_file: Path | None = None
    #: With `python_file`: judge it, the tests (this JSON file, readable by root only) running in
    #: a process of their own (see `ckpteval.sandbox_driver.judged`); `RunResult.judge` has their report.
    python_tests: Path | None = None
    #: bwrap mode: give the command a result channel as its fd 3 (a socket), on which only the
    #: command's own first process can deliver its result (`RunResult.channel`): not a process it
    #: starts, even one that inherited the descriptor.
    result_channel: bool = False
    #: bwrap mode, with `python_file` and `result_channel`: fork the command from a warm zygote,
    #: one per batch (see `ckpteval.sandbox_driver.zygote`): a process with the batch's
    #: isolation that ran the file once as `__ckpteval_zygote__`, this mapping (plain JSON data,
    #: never a command's input) as its `__ckpteval_warm__`; each command is a fork that calls the
    #: file's `main()`. Commands with equal `warm`, file, cwd, env and limits share the zygote;
    #: if it cannot start or dies, the rest run as without.
    warm: Mapping[str, object] | None = None
    #: With `warm`: the seconds (wall clock, and CPU) the zygote may take to run the file once,
    #: on top of the commands' own limits and charged to none of them: a slow import is paid
    #: once per batch. 0: the command's wall limit.
    warm_s: float = 0.0


class Claims:
    """Which commands of one `run_many` batch its driver runs, and which another worker takes
    instead (`take`), while it runs: a worker left idle takes what the batch has not started
    (the samples queued behind an endless one) rather than wait.

    The batch's commands stand for items (a checker's jobs, `assign`), some of which may have no
    command. Before each command the driver claims it: it creates the file named by its item in
    the batch's claims directory (O_EXCL); `take` creates the files of the last items not yet
    claimed, from the end down, and stops at the first the driver holds. A create succeeds for
    one side only, so every command is run exactly once, by the driver or by whoever took it,
    and what the driver runs is always a prefix of the items (`kept`): it stops at the first
    command it finds taken. Only the driver and the host can reach the directory (the batch's io
    directory, which no command can enter or see)."""

    #: A command running this long is slow or endless (a HumanEval sample's takes ~20 ms): every
    #: command behind it is taken.
    STUCK_S = 0.5
    #: Otherwise half the commands not started are taken only if they are at least this many: a
    #: sandbox's start costs about as much as 4-8 samples.
    LEAST = 8

    def __init__(self, items: int) -> None:
        self.items = items
        #: Items 0..kept-1 are the driver's to run; the rest were taken.
        self.kept = items
        self._commands: list[int] = []  # the item of each command, ascending
        self._has_command: set[int] = set()
        self._directory: Path | None = None
        self._lock = threading.Lock()

    def assign(self, commands: Sequence[int]) -> None:
        """The item each of the batch's commands stands for (ascending), before `run_many`."""
        self._commands = list(commands)
        self._has_command = set(self._commands)

    def open(self, directory: Path) -> list[str]:
        """Make the claims directory, before the driver starts; the commands' claim names."""
        directory.mkdir(mode=0o700)
        with self._lock:
            self._directory = directory
        return [str(item) for item in self._commands]

    def close(self) -> int:
        """After the driver ended: nothing more can be taken. How many commands it owned."""
        with self._lock:
            self._directory = None
            return sum(item < self.kept for item in self._commands)

    def take(self) -> int:
        """Take items the driver has not started, the last ones of `kept` (which shrinks by as
        many); returns how many. All of them when the command it runs has run `STUCK_S` (the
        rest would wait for a slow or endless sample); else the later half, when that is at
        least `LEAST`; none before the driver starts, after it ended, or when it started all.
        Which jobs a batch keeps depends on timing; its verdicts do not."""
        with self._lock:
            directory = self._directory
            if directory is None:
                return 0
            commands = [item for item in self._commands if item < self.kept]
            started = _claimed_prefix(directory, commands)
            first_free = commands[started] if started < len(commands) else self.kept
            unstarted = self.kept - first_free
            want = unstarted // 2 if unstarted // 2 >= self.LEAST else 0
            if started and unstarted:
                claimed = directory / str(commands[started - 1])
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - claimed.stat().st_mtime >= self.STUCK_S:
                        want = unstarted
            taken = 0
            for item in range(self.kept - 1, self.kept - 1 - want, -1):
                if item in self._has_command:
                    try:
                        os.close(os.open(directory / str(item), os.O_CREAT | os.O_EXCL, 0o600))
                    except FileExistsError:  # the driver got there first: it holds the rest
                        break
                taken += 1
            self.kept -= taken
            return taken


def _claimed_prefix(directory: Path, items: Sequence[int]) -> int:
    """How many of `items` (ascending) have a claim file: the driver claims them in order, so
    those that have are a prefix (a binary search; the answer may lag the driver by a few)."""
    low, high = 0, len(items)
    while low < high:
        middle = (low + high) // 2
        if (directory / str(items[middle])).exists():
            low = middle + 1
        else:
            high = middle
    return low


def check_mode(mode: str) -> str:
    """Validate a sandbox mode name; a typo is a `UserError`."""
    if mode not in SANDBOX_MODES:
        raise UserError(f"sandbox: unknown mode {mode!r}; choose one of {', '.join(SANDBOX_MODES)}")
    return mode


class Sandbox:
    """Runs commands under one isolation mode; safe to share between threads."""

    def __init__(self, mode: str = "bwrap", launcher: Path | None = None) -> None:
        """`launcher`: the native launcher (`ckpteval.launcher.ensure`), with which a sandbox run
        as root starts plain programs without a fork of its driver; None: by the fork."""
        self.mode = check_mode(mode)
        self.launcher = launcher
        if mode == "bwrap":
            if shutil.which("bwrap") is None:
                raise SandboxError(
                    "sandbox: bwrap not found; install Debian's `bubblewrap`, or choose "
                    "`sandbox: none` to run generated code unconfined"
                )
        else:
            if shutil.which("prlimit") is None:
                raise SandboxError("sandbox: prlimit not found; install Debian's `util-linux`")
            warn_unsandboxed()

    def wall_clock(self, limits: Limits) -> float:
        """When this sandbox stops a command still running under `limits`: bwrap at
        `Limits.wall_limit` (it bounds CPU time by the budget), unsandboxed at `wall_s`."""
        return limits.wall_limit if self.mode == "bwrap" else limits.wall_s

    def run(
        self,
        argv: Sequence[str],
        *,
        limits: Limits,
        workdir: Path,
        writable: bool = False,
        readable: Sequence[Path] = (),
        stdin: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run `argv` with `workdir` as its current directory and return what happened.

        `workdir` is visible at its own path, writable only if asked; `readable` are further
        host paths (interpreters, toolchains) bound read-only at their own paths, so the same argv
        works in both modes. Raises `SandboxError` if the sandbox itself failed to start.
        """
        if self.mode == "bwrap":
            return self.run_many(
                [Command(argv, limits, stdin=stdin, env=env)],
                workdir=workdir,
                writable=writable,
                readable=readable,
            )[0]
        rlimits = [
            "prlimit",
            *(
                f"--{_PRLIMIT_NAMES[name]}={soft}:{hard}"
                for name, (soft, hard) in _unsandboxed_rlimits(limits).items()
            ),
            "--",
        ]
        with scratch_dir("io") as io_dir:
            return _execute(
                [*rlimits, *argv],
                limits,
                Path(io_dir),
                stdin,
                {**_BASE_ENV, **(env or {})},
                Path(workdir).resolve(),
            )

    def run_many(
        self,
        commands: Sequence[Command],
        *,
        workdir: Path,
        writable: bool = False,
        readable: Sequence[Path] = (),
        preload: Sequence[str] = (),
        site_dirs: Sequence[Path] = (),
        claims: Claims | None = None,
    ) -> list[RunResult]:
        """Run `commands` one after another in one sandbox; same contract as `run` for each.

        `preload` names modules the driver imports once, so that commands with `python_file`
        find them already imported; one that fails to import is skipped. `site_dirs` (bound
        read-only) are added to the driver's path first, as site directories: an environment's
        site-packages, whose packages are then importable and preloadable. Both are trusted
        code run as the sandbox's root before any command: never a directory a command's code
        comes from.

        Starting a sandbox costs more than most generated programs take to run, so a batch shares
        one: a driver (`ckpteval.sandbox_driver`) runs as the sandbox's root with only the capabilities
        it needs, runs each command as the sandbox uid under its own limits, in mount and IPC
        namespaces of its own (a fresh /tmp; of `workdir` only the command's `cwd` is visible;
        its own SysV IPC), charges it the CPU of every process it started, and after it kills
        every leftover process. Commands cannot reach the driver (another uid) or each other
        (nothing survives a command, and no command sees another's files). Each command's `cwd`
        defaults to `workdir` and must lie under it.

        With `claims` (bwrap mode; `Claims.assign` told it the commands' items), another worker
        may take commands not yet started while the batch runs: the results are those of the
        commands the driver kept, a prefix of `commands`.
        """
        if not commands:
            return []
        if self.mode != "bwrap":
            return [
                self.run(
                    c.argv,
                    limits=c.limits,
                    workdir=c.cwd or workdir,
                    writable=writable,
                    readable=readable,
                    stdin=c.stdin,
                    env=c.env,
                )
                for c in commands
            ]
        return _run_batch(
            commands,
            Path(workdir).resolve(),
            writable,
            [*readable, *site_dirs],
            (preload, site_dirs),
            claims,
            self.launcher,
        )


def _run_batch(
    commands: Sequence[Command],
    workdir: Path,
    writable: bool,
    readable: Sequence[Path],
    preload: tuple[Sequence[str], Sequence[Path]],
    claims: Claims | None = None,
    launcher: Path | None = None,
) -> list[RunResult]:
    """`Sandbox.run_many` in bwrap mode: one sandbox, its driver, the result of every command it
    ran (all, or with `claims` those it kept). `preload`: the modules the driver imports first,
    and the site directories it adds for them. `launcher`: see `Sandbox` (as root only)."""
    with contextlib.ExitStack() as stack:
        io_dir = stack.enter_context(scratch_dir("io"))
        rootless = os.geteuid() != 0
        uid = 0 if rootless else stack.enter_context(_uid_slot())
        groups = stack.enter_context(cgroups.make_batch())
        status_r, status_w = os.pipe()
        stack.callback(os.close, status_r)
        stdins = [Path(c.stdin).resolve().parent for c in commands if c.stdin]
        binds = [*(Path(p).resolve() for p in readable), Path(sys.base_prefix), *stdins]
        spec = _batch_spec(commands, uid, io_dir, workdir, [*binds, workdir], preload)
        spec["cgroup"] = groups.spec
        program = launch.program(launcher) if launcher is not None and not rootless else None
        if program is not None:
            # a copy, as read and checked once, in the driver's own directory, which no command
            # sees (a bind of the cache would show in every command's mount table)
            fd = os.open(io_dir / "launch", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
            with os.fdopen(fd, "wb") as handle:
                handle.write(program)
            spec["launcher"] = str(io_dir / "launch")
        if rootless:
            _rootless_spec(spec, commands, [io_dir, *groups.roots])
        if claims is not None:
            spec["claims"] = str(io_dir / "claims")
            names = claims.open(io_dir / "claims")
            for command_spec, name in zip(spec["commands"], names, strict=True):
                command_spec["claim"] = name
            stack.callback(claims.close)  # however the batch ends: nothing is taken after it
        (io_dir / "spec.json").write_text(json.dumps(spec))
        driver = write_driver(io_dir)
        bwrap = _bwrap_argv(
            workdir, writable, binds, status_w, private=[io_dir, *groups.roots], rootless=rootless
        )
        if writable and not rootless:
            _chown_tree(workdir, uid)
        outer = _execute(
            [*bwrap, *driver_command(driver, str(io_dir / "spec.json"))],
            _batch_limits(commands),
            stack.enter_context(scratch_dir("io")),
            None,
            _BASE_ENV,
            workdir,
            pass_fds=(status_w,),
            close_after_start=status_w,
        )
        if b"child-pid" not in _read_all(status_r):
            hint = (
                " (not root: the sandbox needs unprivileged user namespaces, e.g. sysctl "
                "kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0; or run as "
                "root, or choose `sandbox: none`)"
                if rootless
                else ""
            )
            raise SandboxError(
                "sandbox: bubblewrap failed to start: "
                + outer.stderr.decode("utf-8", "replace").strip()[-500:]
                + hint
            )
        if writable and not rootless:
            _chown_tree(workdir, os.geteuid())
        ran = claims.close() if claims is not None else len(commands)
        lines = _result_lines(io_dir, None if rootless else uid, outer, ran)
        for line in outer.stderr.decode("utf-8", "replace").splitlines():
            if line.startswith(("sandbox: warm zygote gone", "sandbox: launcher failed")):
                log.warning("%s", line)
        # "a+b": the driver makes the file with its first command's output; none may have run
        with open(io_dir / "outputs", "a+b") as outputs:
            return [
                _result(command, json.loads(line), outputs, io_dir / str(i), outer.stderr)
                for i, (command, line) in enumerate(zip(commands, lines))
            ]


def _memory_cap(limits: Limits) -> int:
    """A command's memory in all (every process's pages, its memfds, shared memory and /tmp
    files, counted by its cgroup): its address-space limit, which bounds a single process."""
    return limits.memory_bytes


def _rootless_spec(spec: dict, commands: Sequence[Command], private: Sequence[Path]) -> None:
    """Not root: the sandbox is a user namespace with one uid, the driver's and every command's
    (see "Without root" in the module's docstring). What file permissions keep from a command
    as root's sandbox uid is kept from it by its mount namespace instead: the driver's
    directories, a judged run's tests, its stdin's directory when that is not its own."""
    spec["rootless"] = True
    spec["hide"] = [str(p) for p in private]
    for command_spec, command in zip(spec["commands"], commands):
        hide = [str(command.python_tests)] if command.python_tests else []
        if command.stdin:
            hide.append(str(Path(command.stdin).resolve().parent))
        command_spec["hide"] = hide


def _batch_limits(commands: Sequence[Command]) -> Limits:
    """The whole batch's backstop: every command's wall clock, a warm zygote's start and a
    margin, its largest memory."""
    warm_s = max((c.warm_s for c in commands if c.warm), default=0.0)
    return Limits(
        wall_s=sum(c.limits.wall_limit for c in commands) + warm_s + 5 + 0.5 * len(commands),
        memory_bytes=max(c.limits.memory_bytes for c in commands) + (1 << 30),
        file_bytes=1 << 20,
    )


def _result_lines(io_dir: Path, uid: int | None, outer: RunResult, expected: int) -> list[str]:
    """The driver's result lines, one per command; a `SandboxError` if it stopped early."""
    results = io_dir / "results.jsonl"
    lines = results.read_text().splitlines() if results.exists() else []
    if outer.timed_out and uid is not None:
        _wait_uid_empty(uid)
    if len(lines) != expected or outer.timed_out:
        raise SandboxError(
            f"sandbox: the batch driver stopped after {len(lines)} of "
            f"{expected} commands: " + outer.stderr.decode("utf-8", "replace").strip()[-500:]
        )
    return lines


def _batch_spec(
    commands: Sequence[Command],
    uid: int,
    io_dir: Path,
    workdir: Path,
    binds: Sequence[Path],
    preload: tuple[Sequence[str], Sequence[Path]],
) -> dict:
    """What the batch driver reads (`ckpteval.sandbox_driver` documents the fields). `binds`: every
    path bound into the sandbox for all commands (a command sees, of `workdir`, its `cwd`).
    `preload`: the modules the driver imports first, and the site directories it adds for them."""
    return {
        "uid": uid,
        "results": str(io_dir / "results.jsonl"),
        "outputs": str(io_dir / "outputs"),
        "acct": str(io_dir / "acct"),
        "workdir": str(workdir),
        "binds": [str(p) for p in binds],
        "preload": list(preload[0]),
        "site_dirs": [str(Path(p).resolve()) for p in preload[1]],
        "commands": [
            {
                "argv": [str(a) for a in c.argv],
                "cwd": str(c.cwd or workdir),
                "python_file": str(c.python_file) if c.python_file else None,
                "python_tests": str(c.python_tests) if c.python_tests else None,
                "env": {**_BASE_ENV, **(c.env or {})},
                "stdin": str(c.stdin) if c.stdin else None,
                "isolation": str(io_dir / f"{i}.isolation"),
                "result_channel": c.result_channel,
                "warm": c.warm,
                "warm_s": c.warm_s,
                "memory_bytes": _memory_cap(c.limits),
                "result": str(io_dir / f"{i}.result"),
                "wall_s": c.limits.wall_limit,
                "cpu_budget_s": c.limits.cpu_budget,
                "tmp_bytes": c.limits.tmp_bytes,
                "rlimits": _rlimits(c.limits),
            }
            for i, c in enumerate(commands)
        ],
    }


def _result(
    command: Command, row: dict, outputs: BinaryIO, files: Path, driver_stderr: bytes
) -> RunResult:
    """One command's result from the driver's line, the batch's `outputs` file (where its stdout
    and stderr are: the line's "output") and its result file (`files`.result). A command the
    driver could not isolate fails the whole batch: nothing ran unisolated."""
    if row.get("isolation_error"):
        raise SandboxError(
            "sandbox: could not give a command its own namespaces and /tmp "
            f"(bubblewrap's root needs CAP_SYS_ADMIN): {row['isolation_error']}"
        )
    if row.get("cpu_account") != "cgroup":
        _warn_cpu_account(row.get("cpu_account"), driver_stderr)
    code = os.waitstatus_to_exitcode(row["status"])
    cap = command.limits.file_bytes
    stdout, stderr = (_read_at(outputs, *place, cap) for place in row["output"])
    sig = -code if code < 0 else None
    return RunResult(
        exit_code=code if code >= 0 else None,
        signal=sig,
        timed_out=row["timed_out"] or _cpu_killed(sig, row["cpu_s"], command.limits),
        output_limit=len(stdout) >= cap or len(stderr) >= cap,
        stdout=stdout,
        stderr=stderr,
        duration_s=row["duration_s"],
        cpu_s=row["cpu_s"],
        max_rss_bytes=row["max_rss_bytes"],
        judge=row.get("judge"),
        memory_limit=row.get("oom_killed", False),
        channel=_read_capped(files.with_suffix(".result"), 1 << 20)
        if files.with_suffix(".result").exists()
        else None,
        forged_results=row.get("forged_results", 0),
    )


def warn_unsandboxed() -> None:
    """Say loudly that generated code is about to run unconfined (once per Sandbox created)."""
    log.warning(
        "sandbox: none: generated code runs WITHOUT isolation (no bwrap, same uid, "
        "network reachable); use only for code you trust"
    )


def isolation(mode: str | None) -> dict[str, Any]:
    """What a score cell records of the sandbox its samples ran in: `sandbox`, the mode (None: a
    checker that runs no code); in bwrap mode `sandbox_mode`, `root` or `rootless` (ckpteval is
    not root: see "Without root" in the module doc), and `sandbox_uncounted`, what the limits do
    not count on this host (None: nothing), from the facts the sandbox itself goes by (this
    process's uid, the cgroups it may make)."""
    if mode != "bwrap":
        return {"sandbox": mode}
    rootless = os.geteuid() != 0
    support = cgroups.support()
    missed = []
    if support.cpu is None:
        missed.append(
            "CPU time of child processes the kernel reaps itself (SIGCHLD ignored)"
            if rootless
            else "CPU time of child processes the kernel reaps itself, under a 10 ms tick "
            "(all of it without BSD process accounting)"
        )
    if support.memory is None:
        missed.append("memory held in memfds and shared memory")
    return {
        "sandbox": "bwrap",
        "sandbox_mode": "rootless" if rootless else "root",
        "sandbox_uncounted": "; ".join(missed) or None,
    }


def describe_isolation(record: Mapping[str, Any]) -> str | None:
    """A score cell's sandbox (`isolation`) in words: `bwrap (rootless); not counted: ...`."""
    mode = record.get("sandbox")
    if mode is None:
        return None
    text = f"{mode} (rootless)" if record.get("sandbox_mode") == "rootless" else str(mode)
    uncounted = record.get("sandbox_uncounted")
    return f"{text}; not counted: {uncounted}" if uncounted else text


def _warn_cpu_account(kind: str | None, stderr: bytes) -> None:
    """Say (once per process) what CPU limits miss without the batch's cgroup."""
    global _WARNED_CPU_ACCOUNT
    if _WARNED_CPU_ACCOUNT:
        return
    _WARNED_CPU_ACCOUNT = True
    if os.geteuid() != 0:
        log.warning(
            "sandbox: bwrap runs rootless (ckpteval is not root) and without a writable cgroup, "
            "so these are not counted against the limits: %s. To count them, run as root or "
            "inside a cgroup v2 subtree delegated to this user (docs/evaluate.md)",
            isolation("bwrap")["sandbox_uncounted"],
        )
        return
    if kind == "acct":
        log.warning(
            "sandbox: no writable cgroup (v2 cpu.stat or v1 cpuacct), so CPU time is counted per "
            "process in 10 ms ticks: children under a tick that the kernel reaps itself are not "
            "counted against time limits, and memfds and shared memory not against memory limits"
        )
        return
    log.warning(
        "sandbox: no cgroup and no BSD process accounting in the sandbox, so CPU time of "
        "processes the kernel reaps by itself is not counted against time limits: %s",
        stderr.decode("utf-8", "replace").strip()[-300:],
    )


_WARNED_CPU_ACCOUNT = False


def _bwrap_argv(
    workdir: Path,
    writable: bool,
    readable: Sequence[Path],
    status_fd: int,
    *,
    private: Sequence[Path] = (),
    rootless: bool = False,
) -> list[str]:
    """The bubblewrap half of the command: namespaces, an empty root and the binds.

    `private` directories are bound writable but stay root-only (the driver's files). Root inside
    keeps only the driver's capabilities.
    """
    argv = _bwrap_namespaces(status_fd, rootless) + _bwrap_system()
    rw = {Path(p).resolve() for p in private} | ({workdir} if writable else set())
    argv += _bwrap_binds([*(Path(p).resolve() for p in readable), workdir, *rw], rw)
    # The empty root and /dev are tmpfs mounts bwrap makes, owned by the sandbox's root: rootless,
    # that is the commands' uid, which could then write /, /etc and /dev (/dev/shm) and chmod
    # them, and what one command left there (an /etc/ld.so.preload) every later command of the
    # batch saw. Read-only once made, as for a command of another uid (root): only the binds
    # asked writable and each command's own /tmp are.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return argv + ["--chdir", str(workdir), "--"]


def _bwrap_namespaces(status_fd: int, rootless: bool = False) -> list[str]:
    """New namespaces (no network), a session of its own, the driver as the pid namespace's init
    (no bubblewrap init beside it: see the module's docstring), and root with the driver's
    capabilities only; bwrap reports its child's pid on `status_fd`. Rootless: a user namespace
    too, whose one uid (ours) is its root; CAP_SETPCAP lets the driver's children give up that
    root for good."""
    argv = [
        "bwrap",
        "--unshare-pid",
        "--as-pid-1",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--info-fd",
        str(status_fd),
        "--hostname",
        "sandbox",
    ]
    caps = [*_DRIVER_CAPS]
    if rootless:
        argv += ["--unshare-user", "--uid", "0", "--gid", "0"]
        caps.append("CAP_SETPCAP")
    return argv + ["--cap-drop", "ALL", *(x for cap in caps for x in ("--cap-add", cap))]


def _bwrap_system() -> list[str]:
    """The empty root's system part: /usr and its top-level links, the few /etc files the loader
    needs, /proc, /dev and the driver's small /tmp."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        target = Path("/") / name
        if target.is_symlink():
            argv += ["--symlink", os.readlink(target), str(target)]
        elif target.is_dir():
            argv += ["--ro-bind", str(target), str(target)]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for path in _ETC_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    return argv + [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "0755",
        "--size",
        str(1 << 20),
        "--tmpfs",
        "/tmp",  # the driver's: each command mounts a fresh one of its own over it
    ]


def _bwrap_binds(paths: Sequence[Path], rw: set[Path]) -> list[str]:
    """Bind each of `paths` at its own path, writable if in `rw`, else read-only (skipped when a
    parent's read-only bind shows it already), creating the directories above it."""
    argv: list[str] = []
    made = set(_MOUNT_POINTS) | {Path("/usr")}
    bound = {Path("/usr")}
    for path in dict.fromkeys(paths):
        if path not in rw and (path in bound or any(p in bound for p in path.parents)):
            continue  # already visible through a bind of it or of a parent
        for parent in reversed(path.parents):
            if parent not in made:
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        argv += ["--bind" if path in rw else "--ro-bind", str(path), str(path)]
        made.add(path)
        bound.add(path)
    return argv


_PRLIMIT_NAMES = {
    "RLIMIT_AS": "as",
    "RLIMIT_CPU": "cpu",
    "RLIMIT_FSIZE": "fsize",
    "RLIMIT_NPROC": "nproc",
    "RLIMIT_CORE": "core",
}


def _rlimits(limits: Limits) -> dict[str, tuple[int, int]]:
    """(soft, hard) per rlimit. CPU's hard limit is one second above the soft one, so the program
    first gets SIGXCPU (reported as a timeout) rather than an anonymous SIGKILL."""
    return {
        "RLIMIT_AS": (limits.memory_bytes, limits.memory_bytes),
        "RLIMIT_CPU": (limits.cpu_limit, limits.cpu_limit + 1),
        "RLIMIT_FSIZE": (limits.file_bytes, limits.file_bytes),
        "RLIMIT_NPROC": (limits.nproc, limits.nproc),
        "RLIMIT_CORE": (0, 0),
    }


def _unsandboxed_rlimits(limits: Limits) -> dict[str, tuple[int, int]]:
    """`_rlimits` for a program run without the sandbox. RLIMIT_NPROC counts every thread of the
    real uid, not the program's: for a user who is not root (root is exempt), the program's
    `nproc` comes on top of the threads the user runs already (a trainer, vLLM's workers, a
    desktop), else every sample of a user with more than `nproc` of them failed to fork."""
    rlimits = _rlimits(limits)
    if os.geteuid() != 0:
        soft, hard = rlimits["RLIMIT_NPROC"]
        running = _own_threads()
        rlimits["RLIMIT_NPROC"] = (soft + running, hard + running)
    return rlimits


def _own_threads() -> int:
    """How many threads this process's real uid runs now (what RLIMIT_NPROC counts)."""
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count


def _execute(
    command: list[str],
    limits: Limits,
    io_dir: Path,
    stdin: Path | None,
    env: Mapping[str, str],
    cwd: Path,
    *,
    pass_fds: Sequence[int] = (),
    close_after_start: int | None = None,
) -> RunResult:
    """Start `command` in its own process group, enforce the wall clock, collect its outputs."""
    out_path, err_path = io_dir / "stdout", io_dir / "stderr"
    start = time.monotonic()
    with (
        open(out_path, "wb") as out,
        open(err_path, "wb") as err,
        open(stdin, "rb") if stdin is not None else open(os.devnull, "rb") as inp,
    ):
        try:
            proc = subprocess.Popen(
                command,
                stdin=inp,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
                pass_fds=tuple(pass_fds),
            )
        except OSError as exc:
            raise SandboxError(f"sandbox: cannot start {command[0]}: {exc}") from exc
        finally:
            if close_after_start is not None:
                os.close(close_after_start)
        status, usage, timed_out = _wait_group(proc.pid, limits.wall_s)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    duration = time.monotonic() - start
    return _outcome(status, usage, timed_out, duration, limits, out_path, err_path)


def _wait_group(pid: int, wall_s: float) -> tuple[int, resource.struct_rusage, bool]:
    """Wait for the process `pid` (its group's leader), killing the group after `wall_s`; then
    kill whatever it left in its group (with `none`, nothing reaps it otherwise). Returns its
    wait status, its resource usage and whether the wall clock ran out."""
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    timer = threading.Timer(wall_s, kill)
    timer.start()
    try:
        _, status, usage = os.wait4(pid, 0)
    finally:
        timer.cancel()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return status, usage, timed_out.is_set()


def _outcome(
    status: int,
    usage: resource.struct_rusage,
    timed_out: bool,
    duration: float,
    limits: Limits,
    out_path: Path,
    err_path: Path,
) -> RunResult:
    """A finished program's `RunResult`: its status, usage and (capped) outputs."""
    code = os.waitstatus_to_exitcode(status)
    stdout, stderr = (
        _read_capped(out_path, limits.file_bytes),
        _read_capped(err_path, limits.file_bytes),
    )
    sig = -code if code < 0 else None
    cpu_s = usage.ru_utime + usage.ru_stime
    return RunResult(
        exit_code=None if sig else code,
        signal=sig,
        timed_out=timed_out or _cpu_killed(sig, cpu_s, limits),
        output_limit=len(stdout) >= limits.file_bytes or len(stderr) >= limits.file_bytes,
        stdout=stdout,
        stderr=stderr,
        duration_s=duration,
        cpu_s=cpu_s,
        max_rss_bytes=usage.ru_maxrss * 1024,
    )


def _cpu_killed(sig: int | None, cpu_s: float, limits: Limits) -> bool:
    """A SIGKILL once the CPU limit was used up is the kernel's hard RLIMIT_CPU kill (a program
    that ignores SIGXCPU gets it): a timeout, not a crash."""
    return sig == signal.SIGKILL and cpu_s >= limits.cpu_limit - 0.05


def _read_at(handle: BinaryIO, offset: int, size: int, cap: int) -> bytes:
    """`size` bytes (at most `cap`) at `offset` of the batch's outputs file: a command's stdout or
    stderr, as the driver appended it."""
    handle.seek(offset)
    return handle.read(min(size, cap))


def _read_capped(path: Path, cap: int) -> bytes:
    """The first `cap` bytes of the file `path` (a command's output unsandboxed, a result file);
    nothing if it was never made."""
    try:
        with open(path, "rb") as handle:
            return handle.read(cap)
    except FileNotFoundError:
        return b""


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


@contextlib.contextmanager
def _uid_slot() -> Iterator[int]:
    """Hold an exclusive uid from `UID_POOL` for one run, across every process on this host."""
    _LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    deadline = time.monotonic() + 600
    while True:
        # made as tried: the first is nearly always free, and 512 paths cost ~1 ms a sandbox
        taken = first_free_lock(((uid, _LOCK_DIR / f"{uid}.lock") for uid in UID_POOL), 0o600)
        if taken is not None:
            uid, fd = taken
            try:
                yield uid
            finally:
                os.close(fd)
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"sandbox: all {len(UID_POOL)} sandbox uids stayed busy for 10 min")
        time.sleep(0.05)


def _wait_uid_empty(uid: int, timeout_s: float = 5.0) -> None:
    """After a kill, wait until the pid namespace is torn down so the uid's process count is 0."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_proc_uid(pid) == uid for pid in os.listdir("/proc") if pid.isdigit()):
            return
        time.sleep(0.01)
    raise SandboxError(f"sandbox: processes of sandbox uid {uid} survived their run's kill")


def _proc_uid(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _chown_tree(root: Path, uid: int) -> None:
    """Hand a writable work directory to the sandbox uid, and back to us after the run."""
    gid = uid if uid != os.geteuid() else os.getegid()
    for dirpath, dirnames, filenames in os.walk(root):
        os.lchown(dirpath, uid, gid)
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, gid)
