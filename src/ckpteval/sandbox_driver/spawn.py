"""A command's process: becoming the command (`_child`), its result channel and row, and killing
what it left.
"""

import ctypes
import os
import resource
import signal
import struct
import sys
import time

from .accounting import _oom_first
from .isolation import _STAGE, _covers, _ipc_settings, _isolate, _isolation_error, _isolation_report
from .privileges import PR_SET_NO_NEW_PRIVS, _drop_root, _keep_fds, _libc
from .sample import _serve_sample
from .seccomp import _kernel_state_filter, _refuse_kernel_state


def _child(command, uid, spec, outputs, keep=()):
    """Become `command`: its stdin, `outputs` (`_Outputs.ends`) as its stdout and stderr, its own
    namespaces and /tmp (`_isolate`), rlimits, the sandbox uid, exec (or run its Python file).
    `keep` are fds that stay open as 3, 4, ... (a judged sample's channel)."""
    signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # as any program's (the driver's: ignored)
    os.setsid()
    stdin = os.open(command["stdin"] or os.devnull, os.O_RDONLY)
    for fd, target in ((stdin, 0), *zip(outputs, (1, 2))):
        os.dup2(fd, target)
        os.close(fd)
    _keep_fds(keep)  # the driver's files (results!) must not reach a forked command
    try:
        _oom_first()
        _isolate(command, spec)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        _refuse_kernel_state(protect=(os.getppid(),) if spec.get("rootless") else ())
    except OSError as exc:  # the sandbox's failure, not the program's: say so to the driver
        with open(_isolation_report(command), "w") as handle:
            handle.write(f"{exc}\n")
        os._exit(127)
    os.chdir(command["cwd"])
    for name, (soft, hard) in command["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if spec.get("rootless"):
        _drop_root()
    else:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if command.get("python_tests"):
        _serve_sample(command["python_file"], command["env"], command["python_tests"])
    if command.get("python_file"):
        _exec_python(command["python_file"], command["env"])
    # CPython ignores these at start-up and an ignored signal survives exec: a program must get
    # SIGXFSZ at the output cap and SIGPIPE on a closed pipe like from any shell.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    os.execvpe(command["argv"][0], command["argv"], command["env"])


def _launches(command, spec):
    """Whether the command starts by the spec's native launcher (`ckpteval.launcher`) instead of
    a fork of this driver: a plain program (no Python file, no result channel, nothing hidden
    in its own directory) in a sandbox run as root."""
    return bool(
        spec.get("launcher")
        and not spec.get("rootless")
        and not command.get("python_file")
        and not command.get("result_channel")
        and not command.get("hide")
    )


def _spawn(command, uid, spec, outputs):
    """Start the command through the launcher (vfork and exec: this driver's memory is neither
    copied nor run): a new session, its stdin, `outputs` (`_Outputs.ends`) as its stdout and
    stderr, and default SIGINT, SIGPIPE and SIGXFSZ here; the rest of `_child` (`_isolate`,
    no_new_privs, the seccomp filter, its directory, rlimits, no groups, the uid, exec) there,
    in the same order, with the same failures (an isolation report and 127, or `sandbox: cannot
    run` and 127). Returns its pid; raises OSError if the launcher itself cannot start, and
    ValueError for a command whose text it cannot take (a NUL byte, a lone surrogate)."""
    seccomp = _kernel_state_filter(()).buffer.raw.hex()
    argv = [spec["launcher"], _isolation_report(command), seccomp, command["cwd"], str(uid)]
    covers = _covers(command, spec)
    argv += [_STAGE, str(len(covers))]
    for root, paths, options in covers:
        argv += [root, options, str(len(paths)), *paths]
    settings = _ipc_settings(command["tmp_bytes"])
    argv.append(str(len(settings)))
    for path, text in settings:
        argv += [path, text]
    argv.append(str(len(command["rlimits"])))
    for name, (soft, hard) in command["rlimits"].items():
        argv += [str(getattr(resource, name)), str(soft), str(hard)]
    argv += ["--", *command["argv"]]
    for arg in argv:  # the launcher reads UTF-8 text: anything else starts by the fork
        if "\0" in arg:
            raise ValueError("a NUL byte in an argument")
        arg.encode("utf-8")  # UnicodeEncodeError, a ValueError, for a lone surrogate
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, command["stdin"] or os.devnull, os.O_RDONLY, 0),
        *((os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(outputs, (1, 2))),
    ]
    defaults = (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)
    return os.posix_spawn(
        spec["launcher"],
        argv,
        command["env"],
        file_actions=actions,
        setsid=True,
        setsigdef=defaults,
    )


def _exec_python(path, env):
    """Run a Python file in this (forked) interpreter, as `python -I -S -B path` would, minus the
    interpreter's start-up; exit with the status the interpreter would have."""
    import builtins
    import traceback

    os.environ.clear()
    os.environ.update(env)
    sys.argv = [path]
    status = 0
    try:
        with open(path, encoding="utf-8") as handle:
            code = compile(handle.read(), path, "exec", dont_inherit=True)
        exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": builtins})
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = status or 120
    os._exit(status & 0xFF)


class _Outputs:
    """A command's stdout and stderr: two memfds, which the command gets write-only (`ends`; what
    it could read back by reopening one is its own output), and which the driver appends to the
    batch's one outputs file once every process of the command has ended (`save`: their offsets
    and sizes go in its row). No other command's process, the zygote included, ever holds them.
    A file created per command cost more than the rest of a command's start: on ext4 each
    new inode took ~1 ms of CPU (`__ext4_new_inode` scans past recently deleted inodes, more so
    the longer a machine has run batches), a fifth of a Rust test run's. Their pages count
    toward the command's memory while it runs (its cgroup's), the file size limit (RLIMIT_FSIZE)
    bounds them as it bounds any file, and the driver holds no more than two commands' at a
    time (a zygote's next command's are made while one runs)."""

    _sink = None  # the batch's outputs file, opened once: [fd, its size]

    def __init__(self):
        self.fds = [os.memfd_create(name, os.MFD_CLOEXEC) for name in ("stdout", "stderr")]

    def ends(self):
        """Write-only descriptors of both, for the command's process."""
        return [os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC) for fd in self.fds]

    def save(self, row, command, spec):
        """Append what the command wrote (up to its file size limit) to the outputs file and put
        where, [offset, size] for stdout and for stderr, in `row["output"]`; returns `row`. Every
        process of the command has ended: nothing writes to them any more."""
        if _Outputs._sink is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            _Outputs._sink = [os.open(spec["outputs"], flags, 0o600), 0]
        sink = _Outputs._sink
        cap = command["rlimits"]["RLIMIT_FSIZE"][0]
        row["output"] = []
        for memfd in self.fds:
            data, size = b"", min(os.fstat(memfd).st_size, cap)
            while len(data) < size:
                chunk = os.pread(memfd, size - len(data), len(data))
                if not chunk:
                    break
                data += chunk
            row["output"].append([sink[1], len(data)])
            view = memoryview(data)
            while view:
                view = view[os.write(sink[0], view) :]
            sink[1] += len(data)
        self.close()
        return row

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class _ResultChannel:
    """A command's result channel (`result_channel` in the spec): a socket whose other end is
    the command's fd 3, on which only the command's own first process can deliver its result.

    Anything that process starts may inherit the descriptor (a fork keeps it whatever its
    close-on-exec flag), so the driver does not trust the descriptor: it asks the kernel who
    sent each message (SO_PASSCRED: the sender's pid, which only CAP_SYS_ADMIN could forge) and
    keeps the first message of the command's pid. Others are counted ("forged_results")."""

    def __init__(self):
        import socket

        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def child_end(self):
        return (self.theirs.fileno(),)

    def started(self):
        self.theirs.close()

    def collect(self, pid, path):
        """Write the command's own result (if it sent one) to `path`; the number of messages
        that came from another process."""
        kept, forged = self.take(pid)
        _write_result(path, kept)
        return forged

    def take(self, pid):
        """(the message the command's own process `pid` sent first, or None; how many came from
        another process), once every process of the command has ended."""
        import socket

        self.ours.setblocking(False)
        forged, kept = 0, None
        while True:
            try:
                data, ancillary, _, _ = self.ours.recvmsg(1 << 20, socket.CMSG_SPACE(12))
            except (BlockingIOError, OSError):
                break
            if not data and not ancillary:  # every sender closed its end: the end
                break
            sender = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    sender = struct.unpack("=iII", payload[:12])[0]
            if sender == pid and kept is None:
                kept = data
            else:
                forged += 1
        self.ours.close()
        return kept, forged

    def close(self):
        """A channel opened for a command that then did not run here: both ends go."""
        self.ours.close()
        self.theirs.close()


def _write_result(path, kept):
    if kept is not None:
        with open(path, "wb") as handle:
            handle.write(kept)


def _row(command, usage_of, status, timed_out, duration, max_rss, reaped_elsewhere=0.0):
    """A command's result line. CPU used past the budget is a timeout even when the command
    ended before a poll saw it (what its processes did between polls, or after it exited)."""
    cpu_s = usage_of.final(reaped_elsewhere)
    return {
        "status": status,
        "timed_out": timed_out or cpu_s > command["cpu_budget_s"],
        "duration_s": duration,
        "cpu_s": cpu_s,
        "max_rss_bytes": max_rss,
        "oom_killed": usage_of.oom_killed(),
        "cpu_account": usage_of.kind,
        "isolation_error": _isolation_error(command),
    }


def _kill_group(pid, reaped=False):
    """Kill the process group a command's process `pid` leads, and, unless it was `reaped`
    (then its number may be another's), `pid` itself: a process still starting, before its
    `setsid`, leads no group yet. A judged run's sample process that the driver killed by its
    group alone, before it got that far, went on to start once its tests had ended, waited for
    a kill that had come and gone, and the driver waited for it: the batch hung (seen under
    load)."""
    kills = (os.killpg,) if reaped else (os.killpg, os.kill)
    for kill in kills:
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _clean(spare=()):
    """Kill whatever the command left running and reap it (its CPU time counts). Its files went
    with its mount namespace; nothing is walked or deleted here. `spare`: a warm zygote's pid,
    the one process that outlives a command (its samples' files are emptied by `_Zygote`)."""
    me = os.getpid()
    keep = {1, me, *spare}
    deadline = time.monotonic() + 10
    others = []
    while True:
        if not spare:
            others = ["-1"]  # every process but this one, the namespace's init
        for pid in others:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap()
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep]
        if not others:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"processes survived the cleanup: {others}")
        time.sleep(0.001)


def _reap():
    """Reap every child that has ended: the command's orphans are re-parented to the driver."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
