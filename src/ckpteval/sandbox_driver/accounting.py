"""CPU accounting: a command's CPU time and memory, from its cgroup or from BSD process
accounting and /proc; waiting for it within its budget.
"""

import ctypes
import os
import resource
import select
import struct
import time

from .privileges import _libc, _write_small

_ACCT_RECORD = struct.Struct("=BBHIIIIIIf8H16s")  # struct acct_v3 (linux/acct.h)
_ACCT_HZ = 100  # AHZ: the unit of acct_v3's times
_POLL_S = 0.05  # how often a running command's CPU is summed


class _Account:
    """The CPU time of every process of the sandbox's pid namespace, whoever reaps it.

    BSD process accounting (acct(2), per pid namespace) makes the kernel append a record, with
    the process's user + system time, for every process that exits here: children the kernel
    reaps by itself (SIGCHLD ignored) and double forks included, which no wait4 ever sees. While
    a command runs, its live processes' times come from /proc. Without acct(2) (no
    CAP_SYS_PACCT, or a kernel without BSD_PROCESS_ACCT) only what the driver reaps counts, and
    every result line says so ("cpu_account": "reaped")."""

    def __init__(self, path):
        self.kind = "acct"
        self.spare = ()  # a warm zygote: its CPU (its warm-up) is no command's
        self.fd = None
        self.buffer = b""
        self.dead_s = 0.0  # CPU of every process that ended so far
        self.tick = os.sysconf("SC_CLK_TCK")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))
            if _libc.acct(path.encode()) != 0:
                raise OSError(ctypes.get_errno(), "acct")
            self.fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            self.kind = "reaped"
            os.write(
                2,
                f"sandbox: no process accounting ({exc}): CPU of orphans the kernel "
                "reaps itself goes uncounted\n".encode(),
            )

    def ended(self):
        """CPU seconds of every process that has ended since the driver started."""
        if self.fd is None:
            return 0.0
        while chunk := os.read(self.fd, 1 << 16):
            self.buffer += chunk
        whole = len(self.buffer) - len(self.buffer) % _ACCT_RECORD.size
        for record in _ACCT_RECORD.iter_unpack(self.buffer[:whole]):
            self.dead_s += (_comp_t(record[10]) + _comp_t(record[11])) / _ACCT_HZ
        self.buffer = self.buffer[whole:]
        return self.dead_s

    def forget(self):
        """Empty the accounting file between commands (the kernel appends to it): a sample that
        forks and exits in a loop cannot grow it beyond what one command writes."""
        if self.fd is not None:
            self.ended()
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)
            self.buffer = b""

    def running(self):
        """CPU seconds of the processes alive now (with acct(2), ended ones have their record
        already). Without it, the dead that no one reaped yet count too, and what live ones
        reaped of their children (cutime, cstime): only the children the kernel reaps itself
        are missed."""
        me, total, dead_too = os.getpid(), 0, self.fd is None
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) in (1, me, *self.spare):
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if dead_too:
                total += int(fields[13]) + int(fields[14])
            if fields[0] != b"Z" or (dead_too and int(fields[17]) <= 1):
                total += int(fields[11]) + int(fields[12])
            elif int(fields[17]) > 1:  # its leader exited, its other threads run: count each
                total += _threads_ticks(pid)
        return total / self.tick


def _threads_ticks(pid):
    """CPU ticks of every thread of `pid`, one by one: a process whose leader thread exited shows
    only the dead leader's time in its own stat, while its other threads go on."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total


def _comp_t(value):
    """acct's comp_t: a 13-bit mantissa and a base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


class _Usage:
    """One command's CPU seconds and whether its memory limit killed it. With the batch's cgroup
    (the spec's "cgroup", made by `ckpteval.cgroups`, which this driver joined first and every
    command is born in): the kernel's count of every thread of every process in it, in ns, while
    the command ran, less this driver's own CPU meanwhile (commands run one after another and
    nothing of one outlives it). Without: the account's per-process counts (`_Account`)."""

    def __init__(self, command, account):
        self.account = account
        cgroup = account.cgroup.for_command(command)
        self.cpu, self.memory = cgroup.get("cpu"), cgroup.get("memory")
        self.kind = "cgroup" if self.cpu else account.kind
        self.before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.start_s = account.ended()
        if self.cpu:
            self.cgroup_s, self.own_s = _cgroup_cpu(*self.cpu), _own_cpu()
        self.ooms = _oom_kills(self.memory)

    def now(self):
        """CPU seconds used so far (while the command runs)."""
        if self.cpu:
            return (_cgroup_cpu(*self.cpu) - self.cgroup_s) - (_own_cpu() - self.own_s)
        return self.account.ended() - self.start_s + self.account.running()

    def final(self, reaped_elsewhere=0.0):
        """CPU seconds once every process of the command ended: the cgroup's count, or what the
        kernel's accounting recorded or the driver reaped (with `reaped_elsewhere`: what a warm
        zygote reaped of its sample) if that is more (acct's ticks are coarser)."""
        if self.cpu:
            return max(0.0, self.now())
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        reaped = (after.ru_utime - self.before.ru_utime) + (after.ru_stime - self.before.ru_stime)
        reaped += reaped_elsewhere
        return max(reaped, self.account.ended() - self.start_s)

    def oom_killed(self):
        """Whether the kernel killed a process of the command at the memory limit."""
        return _oom_kills(self.memory) > self.ooms


def _own_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _oom_kills(memory):
    """How many processes the kernel killed at the batch cgroup's memory limit so far."""
    if not memory:
        return 0
    version, path = memory
    name = "memory.events" if version == "v2" else "memory.oom_control"
    try:
        with open(f"{path}/{name}") as handle:
            for line in handle:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_cpu(version, path):
    """A cgroup's CPU seconds: v2 `cpu.stat` usage_usec, v1 `cpuacct.usage` (ns)."""
    if version == "v1":
        with open(f"{path}/cpuacct.usage") as handle:
            return int(handle.read()) / 1e9
    with open(f"{path}/cpu.stat") as handle:
        for line in handle:
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    raise OSError(f"no usage_usec in {path}/cpu.stat")


class _Cgroup:
    """The batch's cgroup as the driver uses it: joined once, before any command (so every
    command is born in it: no migration per command), and the memory limit set for each command
    above what the driver holds. At the limit the kernel kills a command's process, not the
    driver: each command's processes ask to go first (`_oom_first`)."""

    def __init__(self, spec):
        self.spec = spec or {}
        for path in self.spec.get("join", ()):
            with open(f"{path}/cgroup.procs", "w") as handle:
                handle.write("0\n")
        self.base = None
        self.limit = None

    def for_command(self, command):
        """Set the memory limit for `command`: what the driver holds now, plus its own."""
        memory = self.spec.get("memory")
        if not memory:
            return self.spec
        version, path = memory
        if self.base is None:  # after the preload: the driver's own pages
            self.base = _memory_usage(version, path)
        limit = self.base + command["memory_bytes"]
        if limit != self.limit:
            name = "memory.max" if version == "v2" else "memory.limit_in_bytes"
            with open(f"{path}/{name}", "w") as handle:
                handle.write(f"{limit}\n")
            self.limit = limit
        return self.spec


def _memory_usage(version, path):
    name = "memory.current" if version == "v2" else "memory.usage_in_bytes"
    with open(f"{path}/{name}") as handle:
        return int(handle.read())


def _oom_first(score=1000):
    """Make this process (a command's first, still root: its children inherit it) the kernel's
    first choice at the memory limit: an oom_score_adj of 1000 adds the whole limit to its
    score, so it outranks the driver, whatever the driver holds (bubblewrap cannot give the
    driver CAP_SYS_RESOURCE alone, to make itself exempt)."""
    try:
        _write_small("/proc/self/oom_score_adj", f"{score}\n")
    except OSError:
        pass


def _wait(fds, deadline, budget, usage):
    """Wait until one of `fds` is readable; False once the wall-clock `deadline` passed or the
    command's processes together used more than `budget` CPU seconds (`usage`: its `_Usage`)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return [], True
        ready, _, _ = select.select(fds, [], [], min(left, _POLL_S))
        if ready:
            return ready, False
        if usage.now() > budget:
            return [], True
