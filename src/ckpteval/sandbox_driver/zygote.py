"""Warm zygotes (reward samples)

A reward function's first call can cost more than scoring (math_verify builds its parser on
first use: ~140 ms), and forking the driver, isolating and running the file per sample cost the
rest. So the first command with `warm` (and those sharing its file, `warm`, cwd, env and limits:
`_zygote_key`) gets a zygote, forked once per batch: `_child`'s per-batch part (its own mount and
IPC namespaces, a fresh /tmp, the work directory covered, `no_new_privs`, the seccomp filter,
rlimits, but CPU: `warm_s`, its warm-up's allowance, which is also how long the driver waits for
it; the sandbox uid or `_drop_root`), not dumpable, then, as the sandbox uid, it runs the
command's Python file once as `__ckpteval_zygote__` with `warm` as `__ckpteval_warm__` (the reward
runner runs the reward file and calls the function on a few fixed inputs, no sample's, then
imports the file again for its samples; it may refuse, raising SystemExit with its reason) and
freezes its heap out of the cyclic collector (`gc.freeze`: a fork's collections then copy none of
it). Before its warm-up it has sent the driver the directories its samples share (below); after
it, it drops the at-fork hooks the warm-up registered (the interpreter's lists, found at the
driver's start: `_find_at_fork_hooks`), and a warm-up that left anything reaching from one fork
to the next, or running code in the zygote, gets no zygote (`_ZygoteState`: a Python thread, a
descriptor, a signal handler, a trace or profile function, the zygote dumpable, SysV objects, a
shared mapping that may be made writable, a mapping of a writable file). What the warm-up's
code does to the zygote's own code (the driver's functions, the interpreter's memory) no check
in this process can rule out: the file is trusted that far.
Last, a zygote that serves 64 samples or more asks the kernel to back its private heap with
huge pages where it can (`_collapse_heap`, MADV_COLLAPSE, Linux 6.1+; best effort): a fork then
copies one page-table entry per 2 MiB instead of 512, and its exit tears down as few (a 65 MB
math_verify zygote: fork 1.8 -> 1.1 ms, exit 2.8 -> 2.0 ms; the collapse itself 10-90 ms once).
Only whole aligned 2 MiB ranges of a mapping can be: how much of the interpreter's arenas (1 MiB
mappings, often merged into mappings of a few MiB) that is depends on where they landed; what
the zygote itself writes while a sample lives is split again. A page a sample writes is still
copied alone, 4 KiB, as before.

Per command the driver opens its stdin, stdout and stderr; the zygote forks, and the *fork*
takes those files, with the command's result channel, from the driver (SCM_RIGHTS on the
zygote's channel, which the zygote does not read while its fork lives) and reads its job: the
zygote never holds a sample's files, so it holds no sample's text. The fork takes a session of
its own, those files as 0-3 and no other descriptor, its rlimits (RLIMIT_CPU counts from the
fork), asks to go first at the memory limit, and adds a seccomp filter refusing signals and pidfds aimed at the zygote (and,
rootless, the driver), kill(-1), and making SysV IPC objects or POSIX message queues (they would
live in the IPC namespace the zygote's samples share: refused, so nothing is left to remove);
then calls the file's `main()`. The zygote reports the fork's pid, waits for it and reports its
status, CPU and peak memory. The driver times, charges and kills it as any command (the cgroup's
count while it ran; the zygote's warm-up is before, and its pid is left out of the /proc count),
keeps only the fork's pid's result, then kills every process but the zygote and empties what the
samples share, the zygote's /tmp, covers and /dev/shm, through directory descriptors the zygote
sent it before dropping root: no symlink followed, no mount entered (`_empty_dir`). Rootless
a sample owns those directories (the user namespace's one uid) and may chmod or utime them, so
the driver then gives each, and each directory in it (a mount's skeleton), its mode and times
from before the first sample back (`_restore`). What the emptying leaves differs from what was
there before the first sample (entries, modes, owners)? The zygote goes (fail closed). Samples run
one at a time, so none sees another's files, processes or IPC; a sample's changes to the
warmed modules die with its fork. A zygote that does not warm up, stops answering or dies is
killed; the driver says so on its stderr once and runs the rest of the batch the usual way (the
command it was running, again from the start).
"""

import ctypes
import json
import math
import os
import resource
import select
import signal
import stat
import sys
import time

from .accounting import _oom_first, _Usage, _wait
from .isolation import _STAGE, _isolate, _visible
from .judged import _EXIT_GRACE_S
from .privileges import PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, _drop_root, _keep_fds, _libc
from .seccomp import _Filter, _refuse_kernel_state
from .spawn import _clean, _kill_group, _Outputs, _ResultChannel, _row, _write_result

#: `__name__` of a command's Python file when a zygote runs it to warm up.
ZYGOTE_NAME = "__ckpteval_zygote__"
#: What a command must share with the zygote's first to be forked from it.
_ZYGOTE_KEYS = (
    "python_file",
    "warm",
    "warm_s",
    "cwd",
    "env",
    "rlimits",
    "tmp_bytes",
    "memory_bytes",
    "hide",
)
#: The zygote's place at the memory limit: below its samples' (1000), above the driver's.
_ZYGOTE_OOM_SCORE = 500


def _warm_s(command):
    """How long the command's zygote may take to warm up (`warm_s`, else its wall limit)."""
    return max(command.get("warm_s") or command["wall_s"], 1.0)


def _zygote_key(command):
    """Commands with equal keys are forked from one zygote; None: this one never is."""
    if not command.get("warm") or not command.get("python_file") or command.get("python_tests"):
        return None
    if not command.get("result_channel"):
        return None
    return json.dumps([command.get(k) for k in _ZYGOTE_KEYS], sort_keys=True)


class _Zygote:
    """A warm process per batch that forks each of its commands (see "Warm zygotes" in the
    module's docstring). The driver's side: start it, fork a command from it, empty what the
    command left in the zygote's /tmp and covers, and fall back (None) once it is gone."""

    def __init__(self, command, spec, account):
        import socket

        self.key, self.spec, self.account = _zygote_key(command), spec, account
        self.ahead = None  # (command, its result channel, its files): opened while one ran
        self.pending = None  # (path, bytes): the last sample's result, written while one runs
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                self.control.close()
                _zygote_main(command, spec, theirs.detach())
            finally:
                os._exit(127)
        theirs.close()
        account.spare = (self.pid,)
        # (fd, st_dev) of each directory the samples share, to empty: sent before the file runs,
        # so that nothing of it holds or replaces them.
        roots, fds = self._receive(_warm_s(command), fds=8)
        self.roots = [(fd, os.fstat(fd).st_dev) for fd in fds]
        ready, _ = self._receive(_warm_s(command)) if roots == b"roots" else (roots, None)
        if ready != b"ready":
            self._die(ready.decode("utf-8", "replace") if ready else "its warm-up did not finish")
            return
        self.baseline = [_tree(fd, dev) for fd, dev in self.roots]  # what no sample wrote
        # The mode and times of each root and each directory in it (a mount's skeleton), restored
        # after each sample: rootless, a sample owns them (the user namespace's one uid), so it
        # may chmod or utime them (`_empty`). Taken after a first listing (which may set atimes).
        self.dirs = []
        for fd, dev in self.roots:
            self.dirs.append({})
            _tree(fd, dev, self.dirs[-1])
        account.cgroup.base = None  # the memory limit counts from the warm zygote's pages

    @classmethod
    def start(cls, spec, account):
        """The batch's zygote, for the first command that can have one; None if none can."""
        for command in spec["commands"]:
            if _zygote_key(command):
                return cls(command, spec, account)
        return None

    def serves(self, command):
        return self.pid is not None and _zygote_key(command) == self.key

    def _receive(self, timeout, fds=0):
        """The zygote's next message (and fds), or (None, []) if it ended or said nothing."""
        import socket

        ready, _, _ = select.select([self.control], [], [], timeout)
        if not ready:
            return None, []
        try:
            data, received, _, _ = socket.recv_fds(self.control, 4096, fds)
        except OSError:
            return None, []
        return data or None, received

    def _die(self, why):
        """The zygote is gone: kill it, say so once, and fork the rest from the driver."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        os.write(
            2,
            f"sandbox: warm zygote gone ({why}): the rest of the batch forks from "
            "the driver\n".encode(),
        )
        self.pid, self.account.spare = None, ()
        self.account.cgroup.base = None
        for fd, _ in self.roots:
            os.close(fd)
        self.roots = []
        self.control.close()
        self.settle()

    def close(self):
        self.settle()
        if self.pid is not None:
            self.control.close()
            try:  # a command run the usual way kills every process but the driver: it too
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            for fd, _ in self.roots:
                os.close(fd)

    def _prepare(self, command):
        """While a sample runs: write the one before's result file and open the next command's
        files and result channel (`command`, if the zygote serves it), so that neither waits
        between two samples (creating a file costs 0.05-0.5 ms; three go with each sample). Its
        files are the driver's: no sample sees them before its own fork gets them."""
        self._write_pending()
        if command is not None and self.ahead is None and self.serves(command):
            self.ahead = (command, _ResultChannel(), *_command_files(command))

    def _write_pending(self):
        if self.pending:
            _write_result(*self.pending)
            self.pending = None

    def settle(self):
        """Write what is pending and close what was opened ahead and not used."""
        self._write_pending()
        if self.ahead:
            _, channel, files, outputs = self.ahead
            channel.close()
            outputs.close()
            for fd in files:
                os.close(fd)
            self.ahead = None

    def run(self, command, upcoming=None):
        """Run `command` forked from the zygote; its result line, or None if the zygote is gone
        (the caller runs it the usual way: nothing of it ran, or its outcome is unknown).
        `upcoming`: the command after it, whose files are opened while this one runs."""
        import socket

        if self.ahead and self.ahead[0] is command:
            _, channel, files, outputs = self.ahead
            self.ahead = None
        else:
            self.settle()
            channel, (files, outputs) = _ResultChannel(), _command_files(command)
        start = time.monotonic()
        usage_of = _Usage(command, self.account)
        try:  # the files go to the fork, once it is there: the zygote never holds them
            self.control.send(b"fork")
            message, _ = self._receive(10.0)
            if message is not None and message.startswith(b"pid "):
                socket.send_fds(self.control, [b"files"], [*files, channel.theirs.fileno()])
        except OSError:
            message = None
        finally:
            for fd in files:
                os.close(fd)
            channel.started()
        if message is None or not message.startswith(b"pid "):
            outputs.close()
            self._die("it did not fork")
            return None
        pid = int(message[4:])
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # it ended, and the zygote reaped it, before this looked
            pidfd, timed_out = None, False
        self._prepare(upcoming)
        if pidfd is not None:
            deadline = start + command["wall_s"]
            _, timed_out = _wait([pidfd], deadline, command["cpu_budget_s"], usage_of)
            os.close(pidfd)
        if timed_out:
            _kill_group(pid)
        fate, _ = self._receive(_EXIT_GRACE_S)
        duration = time.monotonic() - start
        _clean(spare=(self.pid,) if fate else ())
        if fate is None:
            outputs.close()
            self._die("it died while a command ran")
            return None
        self._empty()
        status, cpu_s, max_rss = json.loads(fate)
        row = _row(command, usage_of, status, timed_out, duration, max_rss * 1024, cpu_s)
        kept, row["forged_results"] = channel.take(pid)
        self.pending = (command["result"], kept)  # written while the next sample runs
        row["zygote"] = True
        return outputs.save(row, command, self.spec)

    def _empty(self):
        """Delete what the command left in the directories the zygote's samples share (its
        /tmp, covers, /dev/shm): by descriptor, never following a symlink, nor entering a mount
        (a bound toolchain, a skeleton of one). Every process of the command is dead by now."""
        for fd, dev in self.roots:
            _empty_dir(fd, dev)
        # Rootless, every sample owns the roots and their skeleton directories: one could chmod
        # /tmp 0500 (the next could not write it) or set its times (a 64-bit message to the
        # next). Their modes back, then their times after the check below (whose listing may
        # set an atime); all through descriptors, no symlink followed.
        for (fd, dev), dirs in zip(self.roots, self.dirs):
            _restore(fd, dev, dirs, times=False)  # what fails, the check below sees
        # Fail closed: whatever could not be removed or restored (a deletion refused for any
        # reason; another mode, another owner) must reach no later sample, so the zygote goes
        # and the rest of the batch forks fresh.
        if [_tree(fd, dev) for fd, dev in self.roots] != self.baseline:
            self._die("a sample left files or modes that could not be removed")
            return
        for (fd, dev), dirs in zip(self.roots, self.dirs):
            if not _restore(fd, dev, dirs, times=True):
                self._die("the times of a directory its samples share could not be restored")
                return


def _tree(root, dev, dirs=None):
    """The directory `root` (an fd; path ".") and every entry under it on device `dev`, as
    sorted (path, kind, mode, uid, gid): symlinks not followed, mounts named (as their root
    shows) but not entered. The mode and owner count too: rootless, a sample owns the roots and
    could chmod them. `dirs`, if given, gets the (mode, atime, mtime) of the root and of each
    directory on `dev` by path (`_restore`)."""
    info = os.fstat(root)
    found = [(".", stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)]
    if dirs is not None:
        dirs["."] = (stat.S_IMODE(info.st_mode), info.st_atime_ns, info.st_mtime_ns)
    stack = [(os.dup(root), "")]
    while stack:
        fd, prefix = stack.pop()
        try:
            for entry in os.scandir(fd):
                path = prefix + entry.name
                try:
                    info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    found.append((path, "?", 0, -1, -1))
                    continue
                mode = stat.S_IMODE(info.st_mode)
                found.append((path, stat.S_IFMT(info.st_mode), mode, info.st_uid, info.st_gid))
                if info.st_dev == dev and stat.S_ISDIR(info.st_mode):
                    if dirs is not None:
                        dirs[path] = (mode, info.st_atime_ns, info.st_mtime_ns)
                    try:
                        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                        stack.append((os.open(entry.name, flags, dir_fd=fd), path + "/"))
                    except OSError:
                        found.append((path + "/", "unreadable", 0, -1, -1))
        finally:
            os.close(fd)
    return sorted(found)


def _restore(root, dev, dirs, times):
    """Give the root (an fd) and each directory below it in `dirs` (`_tree`'s) its mode back,
    or (`times`) its atime and mtime; False if one could not be. Each is opened a component at
    a time, no symlink followed, and left alone off `dev` (a sample cannot mount; nor move a
    mount point, only replace a skeleton, which the check after emptying sees). Only what
    differs is set (a read-only root, /dev/shm, never does)."""
    restored = True
    for path, (mode, atime, mtime) in dirs.items():
        fd = os.dup(root)
        try:
            for part in [] if path == "." else path.split("/"):
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                fd, parent = os.open(part, flags, dir_fd=fd), fd
                os.close(parent)
            info = os.fstat(fd)
            if info.st_dev != dev:
                restored = False
            elif times and (info.st_atime_ns, info.st_mtime_ns) != (atime, mtime):
                os.utime(fd, ns=(atime, mtime))
            elif not times and stat.S_IMODE(info.st_mode) != mode:
                os.fchmod(fd, mode)
        except OSError:
            restored = False
        finally:
            os.close(fd)
    return restored


def _empty_dir(root, dev):
    """Delete everything in the directory `root` (an fd) on device `dev`, iteratively (no
    depth a sample builds can exhaust the driver's stack)."""
    stack = [(os.dup(root), None, None, None)]  # (fd, its entries left, parent fd, name)
    while stack:
        fd, entries, parent, name = stack.pop()
        if entries is None:
            entries = [entry.name for entry in os.scandir(fd)]
        pushed = False
        while entries and not pushed:
            sub = _empty_entry(fd, entries.pop(), dev)
            if sub is not None:
                stack += [(fd, entries, parent, name), (sub[0], None, fd, sub[1])]
                pushed = True
        if pushed:
            continue
        os.close(fd)
        if parent is not None:
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                pass  # holds a mount point: the zygote's own skeleton


def _empty_entry(fd, name, dev):
    """Delete the file `name` in `fd`; a directory on `dev`: (its fd, name) to empty first."""
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if info.st_dev != dev:
            return None  # a mount point: a bind's, not the sample's
        if stat.S_ISDIR(info.st_mode):
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            return os.open(name, flags, dir_fd=fd), name
        os.unlink(name, dir_fd=fd)
    except OSError:
        pass  # a mount point's skeleton (busy), or gone
    return None


def _command_files(command):
    """The command's stdin, stdout and stderr, opened by the driver (a zygote's sample cannot
    open its stdin: a file of the sandbox's root, or in a directory hidden from it), and its
    `_Outputs`, which the driver keeps."""
    stdin = os.open(command["stdin"] or os.devnull, os.O_RDONLY)
    outputs = _Outputs()
    return [stdin, *outputs.ends()], outputs


def _zygote_main(command, spec, control):
    """The zygote: `_child`'s per-batch isolation, then, as the sandbox uid, the command's Python
    file run once as `ZYGOTE_NAME` (its warm-up, on no command's input), then one fork per
    command (`_zygote_serve`). Any failure ends it: the driver falls back."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    _keep_fds((control,))
    _oom_first(_ZYGOTE_OOM_SCORE)
    _isolate(command, spec)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    roots = [os.open(r, flags) for r in [*_visible(command, spec), _STAGE]]
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    driver = os.getppid()
    _refuse_kernel_state(protect=(driver,) if spec.get("rootless") else ())
    os.chdir(command["cwd"])
    # Its warm-up's CPU is no sample's: it may use `_warm_s` (each fork lowers it to its own).
    cpu = math.ceil(_warm_s(command))
    soft, hard = command["rlimits"].get("RLIMIT_CPU", (cpu, cpu + 1))
    rlimits = {**command["rlimits"], "RLIMIT_CPU": (max(soft, cpu), max(hard, cpu + 1))}
    for name, (soft, hard) in rlimits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    _become_sandbox_uid(spec)
    # Not dumpable: its samples (the same uid) can neither trace it nor open its /proc files.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # `random` and `threading` register at-fork hooks (a fork reseeds `random` and resets
    # `threading`'s state, as in any fork of CPython): before the file runs, so they are kept.
    import gc
    import random  # noqa: F401
    import socket
    import threading  # noqa: F401

    channel = socket.socket(fileno=3)
    socket.send_fds(channel, [b"roots"], roots)
    for fd in roots:
        os.close(fd)
    before = _ZygoteState()
    try:
        namespace = _warm(command)
    except SystemExit as exc:  # the file refuses to be a zygote, saying why
        channel.send(str(exc.code)[:300].encode())
        os._exit(1)
    left = before.left_by_warm_up()
    if left:  # a channel from one sample to the next, or code that would run in the zygote
        channel.send(f"its warm-up left {left}"[:300].encode())
        os._exit(1)

    sys.stdout.flush()  # nothing the warm-up printed reaches a sample's files
    sys.stderr.flush()
    gc.freeze()  # a sample's collections never walk (so never copy) the warm heap
    key = _zygote_key(command)
    if sum(_zygote_key(c) == key for c in spec["commands"]) >= _COLLAPSE_FROM:
        _collapse_heap()
    channel.send(b"ready")
    _zygote_serve(channel, namespace, command, driver if spec.get("rootless") else None)


PR_GET_DUMPABLE = 3
#: CPython's three lists of at-fork hooks (`os.register_at_fork`'s before, after in the parent
#: and after in the child), found at the driver's start (`_find_at_fork_hooks`).
_AT_FORK = []


def _find_at_fork_hooks():
    """Find the interpreter's at-fork hook lists, which no API lists or empties: register a
    placeholder in each and keep the one list that refers to it; then take the placeholders
    out. At the driver's start no module has registered a hook yet, so the lists are made
    here: the search covers only what is made after a freeze (the whole heap took ~15 ms)."""
    import gc

    gc.freeze()
    try:
        placeholders = (lambda: None, lambda: None, lambda: None)
        os.register_at_fork(
            before=placeholders[0], after_in_parent=placeholders[1], after_in_child=placeholders[2]
        )
        for placeholder in placeholders:
            (hooks,) = [r for r in gc.get_referrers(placeholder) if type(r) is list]
            hooks.remove(placeholder)
            _AT_FORK.append(hooks)
    finally:
        gc.unfreeze()


class _ZygoteState:
    """What the zygote's warm-up (a reward file's import: trusted code, but not the zygote's)
    could leave in the zygote's process that reaches from one sample to the next, or that runs
    its code in the zygote later: taken before the warm-up and compared after it
    (`left_by_warm_up`)."""

    def __init__(self):
        self.at_fork = [list(hooks) for hooks in _AT_FORK]
        self.fds = set(os.listdir("/proc/self/fd"))
        self.signals = _signal_state()
        self.hooks = (sys.gettrace(), sys.getprofile())

    def left_by_warm_up(self):
        """Drop the at-fork hooks the warm-up registered: they would run the file's code in the
        zygote before each fork and in each sample before its isolation (a fresh process, which
        never forks, runs none). Then what else it left, as a phrase, or None: Python threads,
        descriptors (what it dropped collected first), signal handlers, a trace or profile
        function (each would run the file's code in the zygote), the zygote made dumpable (a
        sample could write its memory), SysV IPC objects (a sample reaches them by id) or a
        mapping a sample could write and the next read (`_shared_mapping`)."""
        import gc

        for hooks, kept in zip(_AT_FORK, self.at_fork):
            hooks[:] = kept
        threads = len(sys._current_frames()) - 1  # a native one (BLAS's pool) runs no Python
        opened = set(os.listdir("/proc/self/fd")) - self.fds
        if opened:  # maybe held by what the warm-up dropped: collected, they close
            gc.collect()
            opened = set(os.listdir("/proc/self/fd")) - self.fds
        ipc = [kind for kind in ("shm", "sem", "msg") if _sysv_objects(kind)]
        if threads:
            return f"{threads} Python thread(s) running"
        if opened:
            return f"{len(opened)} descriptor(s) open"
        if _signal_state() != self.signals:
            return "a signal handler of its own"
        if (sys.gettrace(), sys.getprofile()) != self.hooks:
            return "a trace or profile function"
        if _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
            return "the zygote dumpable"
        if ipc:
            return f"SysV IPC objects ({', '.join(ipc)})"
        return _shared_mapping()


#: The real-time signals the C library keeps for itself, below SIGRTMIN (glibc: 32 and 33,
#: SIGCANCEL and SIGSETXID, whose handlers it installs when a process starts its first thread).
_LIBC_SIGNALS = sum(1 << (number - 1) for number in range(32, signal.SIGRTMIN))


def _signal_state():
    """The signals this process catches (the kernel's mask: C handlers too) and the Python
    handler of each. Not the C library's own (`_LIBC_SIGNALS`): a warm-up whose calls started a
    thread (a pool made at import) has them, as a fresh process that started one does, and they
    run none of the file's code."""
    with open("/proc/self/status") as handle:
        line = next((line for line in handle if line.startswith("SigCgt:")), "SigCgt: 0")
    caught = int(line.split()[1], 16) & ~_LIBC_SIGNALS
    handlers = []
    for number in signal.valid_signals():
        try:
            handlers.append(signal.getsignal(number))
        except (OSError, ValueError):
            handlers.append(None)
    return caught, handlers


def _sysv_objects(kind):
    """How many SysV IPC objects of `kind` (shm, sem, msg) this IPC namespace holds."""
    try:
        with open(f"/proc/sysvipc/{kind}") as handle:
            return len(handle.readlines()) - 1
    except OSError:
        return 0


def _shared_mapping():
    """A mapping of this process that one fork could write and the next read, as a phrase, or
    None: a mapping of a file this uid may write (through the file, whose changes its unwritten
    pages show), or a shared mapping that may be made writable (`mw`: whatever its protection
    now, mprotect can). A read-only file's shared mapping (glibc's gconv cache) is none, nor
    is a deleted file's private one: no sample can reach that file."""
    shared, files = set(), set()
    with open("/proc/self/maps") as handle:
        for line in handle:
            fields = line.split(maxsplit=5)
            path = fields[5].strip() if len(fields) > 5 else ""
            if fields[1][3] == "s":
                shared.add(fields[0])
            if fields[4] != "0" and path.startswith("/") and not path.endswith(" (deleted)"):
                files.add(path)
    for path in sorted(files):
        if os.access(path, os.W_OK):
            return f"a mapping of a writable file: {path}"[:200]
    if not shared:
        return None
    where = None  # the shared mapping whose flags come next
    with open("/proc/self/smaps") as handle:  # 10-40 ms: only when there is a shared mapping
        for line in handle:
            first = line.split(maxsplit=1)[0]
            if first in shared:
                where = line.strip()
            elif first == "VmFlags:":
                if where and " mw" in line:
                    return f"a shared mapping: {where}"[:200]
                where = None
    return None


MADV_COLLAPSE = 25
_HUGE = 1 << 21
#: Samples a zygote must serve to collapse its heap: collapsing costs 10-90 ms (a 40 MB heap),
#: and saves ~1.3 ms a fork.
_COLLAPSE_FROM = 64


def _collapse_heap():
    """Back the 2 MiB-aligned parts of this process's private writable anonymous memory (the
    interpreter's heap and arenas) with huge pages, where the kernel can (MADV_COLLAPSE: Linux
    6.1+, whatever the THP sysfs setting but `never`); what it cannot stays as it was. Only the
    page tables change: no content, no permission, nothing a fork shares."""
    with open("/proc/self/maps") as handle:
        lines = handle.read().splitlines()
    for line in lines:
        fields = line.split()
        if fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        low, high = -(-low // _HUGE) * _HUGE, high // _HUGE * _HUGE
        if high > low:
            _libc.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), MADV_COLLAPSE)


def _become_sandbox_uid(spec):
    if spec.get("rootless"):
        _drop_root()
    else:
        uid = spec["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def _warm(command):
    """Run the command's Python file as `ZYGOTE_NAME`, with its `warm` mapping as
    `__ckpteval_warm__`; its namespace (whose `main` each fork calls)."""
    import builtins

    os.environ.clear()
    os.environ.update(command["env"])
    path = command["python_file"]
    sys.argv = [path]
    namespace = {
        "__name__": ZYGOTE_NAME,
        "__file__": path,
        "__builtins__": builtins,
        "__ckpteval_warm__": command["warm"],
    }
    with open(path, encoding="utf-8") as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    exec(code, namespace)
    if not callable(namespace.get("main")):
        raise SystemExit(f"{path} defines no main()")
    return namespace


def _zygote_serve(channel, namespace, command, driver):
    """Fork one sample per message; the fork, not the zygote, then takes its stdin, stdout,
    stderr and result channel from the driver (`_zygote_sample`), so the zygote never holds a
    sample's files. Report its pid, then its exit status, CPU and peak memory."""
    me = os.getpid()
    refuse = _Filter(protect=(me, driver) if driver else (me,), ipc=True)
    while True:
        data = channel.recv(64)
        if not data:
            os._exit(0)
        if data != b"fork":
            continue  # the files of a fork killed before it took them (closed by the kernel)
        pid = os.fork()
        if pid == 0:
            _zygote_sample(namespace, channel, command, refuse)
        channel.send(f"pid {pid}".encode())
        _, status, usage = os.wait4(pid, 0)
        cpu = usage.ru_utime + usage.ru_stime
        channel.send(json.dumps([status, cpu, usage.ru_maxrss]).encode())


def _zygote_sample(namespace, channel, command, refuse):
    """A sample forked from the zygote: its own session, its files (taken from the driver on
    the zygote's channel) as 0-3 and nothing else of the zygote's, its rlimits (RLIMIT_CPU
    counts from the fork), first at the memory limit, and `refuse`, a filter that also refuses
    signals to the zygote (and driver) and making IPC objects (they would outlive it in the
    zygote's IPC namespace); then the file's `main()`."""
    import socket

    status = 127
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the zygote's: ignored
        os.setsid()
        _, fds, _, _ = socket.recv_fds(channel, 64, 4)
        if len(fds) != 4:  # the driver gave up on the zygote before sending them
            os._exit(127)
        channel.detach()  # its fd 3 becomes the result channel
        for fd, target in zip(fds[:3], (0, 1, 2)):
            os.dup2(fd, target)
        _keep_fds(fds[3:4])
        for name, (soft, hard) in command["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        _oom_first()
        refuse.install()
        status = 1
        namespace["main"]()
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the sample's failure: its status says so
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status & 0xFF)
