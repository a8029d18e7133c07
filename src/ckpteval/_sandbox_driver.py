"""Runs inside one bubblewrap sandbox, as its root (a few capabilities, no others), and executes
many commands one after another; `ckpteval.sandbox.Sandbox.run_many` starts it.

Standard library only: it runs under the base interpreter with `-I -S`, compiled by the host
(`ckpteval.sandbox.write_driver`) and loaded by a `-c` bootstrap.

For each command: fork; in the child, a new session, the command's stdin/stdout/stderr files,
mount and IPC namespaces of its own (`_isolate`: a fresh tmpfs as /tmp, the batch's work
directory covered but for the command's own `cwd`, bounded SysV IPC), `no_new_privs` and a
seccomp filter refusing the kernel state that would outlive it (`_refuse_kernel_state`:
keyrings, user namespaces), its rlimits, no groups, the sandbox uid, exec. The driver waits (a pidfd) until the command's processes
together used up their CPU budget or the wall-clock backstop passed, kills the command's process
group on overrun, then kills every other process in the pid namespace (strays that left the
group). The command's files and IPC objects go with its namespaces: the next command starts from
the same state and the driver never walks what a sample built. Commands cannot signal, trace or
overwrite the driver: it runs as another uid, and the results file lives in a directory only root
can enter.

A command's `cpu_s` is the CPU time of every process it started (`_Usage`): with the batch's
cgroup (the spec's "cgroup", made by `ckpteval.cgroups`; the driver joins it first, so every
command is born in it), the kernel's count of every thread in it while the command ran, in ns,
less the driver's own; the memory limit is the cgroup's too, set for each command (`_Cgroup`).
Without one (`_Account`), BSD process accounting (per pid namespace) records each process that
exits, even those the kernel reaps by itself (SIGCHLD ignored) that no wait4 sees, in ticks; while
the command runs, its live processes' times come from /proc.

A command with `result_channel` gets a socket as its fd 3; the driver keeps the first message the
command's own first process sent there (`_ResultChannel`), whoever else holds the descriptor.

Rootless (`"rootless"` in the spec: ckpteval is not root, bubblewrap made a user namespace whose
one uid is this driver's) a command keeps that uid and gives up root instead (`_drop_root`); the
seccomp filter also protects the driver from its signals, the driver is not dumpable, and the
spec's and the command's "hide" paths are covered in the command's mount namespace. The driver
is the pid namespace's init (bwrap `--as-pid-1`; also a child subreaper, PR_SET_CHILD_SUBREAPER),
so orphans are re-parented to it and reaped by it once the cleanup has killed them, and no other
process of the sandbox (bubblewrap's init, with the commands' uid and dumpable) offers a command
its memory, its descriptors or its root, where the hidden paths are not covered.

A command with `python_file` runs that file in a fork of this interpreter instead of exec'ing a
new one (Python start-up costs more than most tests take); the fork drops privileges first, like
any command. The driver imports the spec's `preload` modules once, before any command, so that
each fork finds them imported: the standard library's (the Python checker), or an environment's
installed packages with its `site_dirs` on the path (the reward checker: sympy, math_verify, ...
cost 0.3-1 s each to import). Only trusted code runs before the fork; a fork's changes to a
preloaded module (its globals, patched functions) die with it.

Commands with `warm` (the reward checker's samples) are forked from a warm zygote instead: see
"Warm zygotes" below.

A command with `python_file` *and* `python_tests` is judged: see "Judged Python runs" below. Its
result line adds "judge": what the test runner reported.

argv: spec.json. spec: {"uid", "results", "site_dirs": [dir, ...], "preload": [module, ...],
"commands": [{"argv", "python_file", "python_tests", "warm", "warm_s", "cwd", "env", "stdin",
"stdout", "stderr", "wall_s", "rlimits": {"RLIMIT_AS": n, ...}}]}.
One JSON result line per command. `--judge TESTS PROGRAM REPORT` runs one judged program
without the sandbox (`sandbox: none`: same protocol, no uid split, so no protection).

Warm zygotes
------------
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
sent it before dropping root: no symlink followed, no mount entered (`_empty_dir`). What
the emptying leaves differs from what was there before the first sample? The zygote goes
(fail closed). Samples run
one at a time, so none sees another's files, processes or IPC; a sample's changes to the
warmed modules die with its fork. A zygote that does not warm up, stops answering or dies is
killed; the driver says so on its stderr once and runs the rest of the batch the usual way (the
command it was running, again from the start).

Judged Python runs
------------------
A pass must be earned by the tests, and nothing a sample can do in its own process can prove that:
whatever its code runs (threads, `atexit`, trace hooks, patched builtins, `gc`/frame walks,
`/proc/self/mem`, `os._exit`) can also write any "success" a test runner in that process could
write, secret tokens included. So the tests do not run in the sample's process at all:

- the *sample* process (uid U, the sandbox uid, its rlimits, like any command) runs the program
  (prompt + completion, no tests) and then only serves calls: "call f with these arguments",
  answering with the returned value as data (`_encode`: plain data inline; standard-library
  values by tag; instances of the program's classes by class name and attributes, shared and
  cyclic references kept; Enum members by class and name; iterators lazily, in chunks; see
  `_Outbound`) or, for any other object, an opaque reference. The tests' callables and other
  objects the call gets are references: the sample's call of one (or, for a `unittest.mock`
  mock, its attribute, item, iteration, `with`) comes back to the test process, which does
  it on the arguments as data (`_Callback`, `_operate`). A patch the tests start is started
  on the same module or class attribute here too (`_forward_patches`), its value such a
  reference, and stopped with it;
- the *test* process (a fork of this driver: uid 0 with every capability dropped, the command's
  rlimits, `no_new_privs`, its own session) runs the trusted code: the prompt (for its helpers),
  the tests and `check(candidate)`, where `candidate` and every other name the tests take from
  the program are proxies that ask the sample process. Replies are parsed with
  `ast.literal_eval` into fresh values, so every comparison is the built-in one or the
  prompt's: an instance of the program's class becomes one of the tests' copy of the prompt's
  class, made and filled without calling its code (`_fill`: an attribute that would shadow a
  method of it is refused), so `__eq__` tricks, patched `AssertionError` or builtins, a
  replaced `check` live in the other process and reach nothing here. An opaque reference
  equals only itself.
- The verdict is the test process's own report, sent on a pipe only it and the driver hold, and
  its exit status, which only the driver (its parent) sees. The sample process cannot read the
  tests (a 0600 file of uid 0), the test process's memory or fds (another uid: no ptrace, no
  /proc/<pid>/mem, no signals), nor write anything but replies; it exiting, crashing or
  hanging ends the tests with a failure (or a timeout).
"""

import ast
import collections
import ctypes
import datetime
import fcntl
import json
import math
import os
import resource
import select
import signal
import struct
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)


def _child(command, uid, spec, keep=()):
    """Become `command`: its stdio files, its own namespaces and /tmp (`_isolate`), rlimits, the
    sandbox uid, exec (or run its Python file). `keep` are fds that stay open as 3, 4, ... (a
    judged sample's channel)."""
    os.setsid()
    stdin = os.open(command["stdin"] or os.devnull, os.O_RDONLY)
    stdout = os.open(command["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stderr = os.open(command["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
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


PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_DUMPABLE = 24, 28, 4
#: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS and NO_CAP_AMBIENT_RAISE, each set (but KEEP_CAPS) and locked
_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80


def _drop_root():
    """Rootless (a user namespace with one uid): the command keeps the driver's uid, so it drops
    what makes that uid root instead: every capability, the bounding set, and root's right to
    regain them on exec (securebits, locked)."""
    if _libc.prctl(PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECUREBITS)")
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    _drop_capabilities()


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


def _keep_fds(keep):
    """Close every fd from 3 up, except `keep`, which become 3, 4, ..."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in keep]  # above every target
    for target, fd in enumerate(high, start=3):
        os.dup2(fd, target)
    os.closerange(3 + len(keep), 1 << 16)


# --------------------------------------------------------------------- per-command isolation

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 4096, 8192, 16384, 1 << 18
#: An empty directory outside /tmp where a command's covers are built (bubblewrap's /dev has it).
_STAGE = "/dev/shm"
#: SysV IPC limits of a command's own IPC namespace (shared memory: `tmp_bytes` in all).
_SHM_SEGMENTS = 64
_MSG_QUEUES = 16
_SEMAPHORES = "250 8000 32 32"  # per set, in all, per semop, sets


def _under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _isolation_report(command):
    """Where a command's child says that its isolation failed (the driver's private directory)."""
    return command["stdout"] + ".isolation"


def _isolation_error(command):
    """Why the command's isolation failed, or None (then its program ran)."""
    try:
        with open(_isolation_report(command)) as handle:
            return handle.read().strip() or "unknown"
    except FileNotFoundError:
        return None


def _visible(command, spec):
    """Per hidden root (the fresh /tmp; the batch's work directory, unless the command's `cwd`
    is all of it), the paths bound into the sandbox below it that the command may see: the
    toolchains, and of the work directory only the command's own `cwd`. Nested paths are seen
    through their parent's bind."""
    workdir, cwd = spec["workdir"], command["cwd"]
    roots = ["/tmp"]
    if cwd != workdir and not _under(workdir, "/tmp"):
        roots.append(workdir)
    # The driver's own directories (results, cgroups), and what only the command's first process
    # opens (its stdin's directory, a judged run's tests) when it is not the command's own.
    secret = [p for p in (*spec.get("hide", ()), *command.get("hide", ())) if os.path.isdir(p)]
    roots += [p for p in secret if not any(_under(p, r) or _under(cwd, p) for r in roots)]
    paths = sorted({cwd if p == workdir else p for p in spec["binds"]}, key=len)
    kept = []
    for path in paths:
        if any(_under(path, root) for root in roots) and not any(_under(path, k) for k in kept):
            kept.append(path)
    return {root: [p for p in kept if _under(p, root) and p != root] for root in roots}


def _mount(source, target, fstype, flags, data=None):
    def enc(text):
        return None if text is None else text.encode()

    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def _isolate(command, spec):
    """Give the command (still root, in its forked child) its own mount and IPC namespaces: a
    fresh size-limited tmpfs as /tmp, the batch's work directory covered so that only its own
    `cwd` shows, and bounded SysV IPC. Everything goes with the command's last process: nothing
    is left for a cleanup to miss, and no cleanup walks what a sample built."""
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS | CLONE_NEWIPC)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing of this namespace leaks back
    for root, paths in _visible(command, spec).items():
        size, mode = (command["tmp_bytes"], "1777") if root == "/tmp" else (1 << 16, "0755")
        _cover(root, paths, f"size={size},mode={mode}")
    for path in command.get("hide", ()):
        if os.path.isfile(path):  # e.g. a judged run's tests in the command's own directory
            _mount("/dev/null", path, None, MS_BIND)
    _limit_ipc(command["tmp_bytes"])


def _cover(root, paths, options):
    """Mount a fresh tmpfs over `root` showing only `paths` of what was there: built on a staging
    mount point (the paths are still reachable), then moved over `root`."""
    _mount("tmpfs", _STAGE, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for path in paths:
        staged = _STAGE + path[len(root) :]
        if os.path.isdir(path):
            os.makedirs(staged, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(staged), mode=0o755, exist_ok=True)
            os.close(os.open(staged, os.O_CREAT | os.O_WRONLY, 0o600))
        _mount(path, staged, None, MS_BIND | MS_REC)
    _mount(_STAGE, root, None, MS_MOVE)


def _limit_ipc(shm_bytes):
    """Bound the command's own IPC namespace: shared memory `shm_bytes` in all (detached
    segments count too), a few message queues and semaphores."""
    page = os.sysconf("SC_PAGE_SIZE")
    for name, value in (
        ("shmmax", shm_bytes),
        ("shmall", max(1, shm_bytes // page)),
        ("shmmni", _SHM_SEGMENTS),
        ("msgmni", _MSG_QUEUES),
        ("sem", _SEMAPHORES),
    ):
        with open(f"/proc/sys/kernel/{name}", "w") as handle:
            handle.write(f"{value}\n")


# ------------------------------------------------------------- kernel state a sample may not hold

#: Per architecture: its AUDIT_ARCH, the first number of a foreign ABI on it (x32) or None, and
#: the numbers of the calls the filter looks at.
_SYSCALLS = {
    "x86_64": (
        0xC000003E,
        0x40000000,
        {"add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "clone": 56},
        {"clone3": 435, "kill": 62, "tkill": 200, "tgkill": 234, "pidfd_open": 434},
    ),
    "aarch64": (
        0xC00000B7,
        None,
        {"add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97, "clone": 220},
        {"clone3": 435, "kill": 129, "tkill": 130, "tgkill": 131, "pidfd_open": 434},
    ),
}
CLONE_NEWUSER = 0x10000000
_EPERM, _ENOSYS = 1, 38
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_BPF = {"ld": 0x20, "jeq": 0x15, "jge": 0x35, "jset": 0x45, "ret": 0x06}
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


#: Per architecture: the calls that make SysV IPC objects and POSIX message queues, which live
#: in an IPC namespace: refused to the samples of a warm zygote, who share the zygote's.
_IPC_SYSCALLS = {
    "x86_64": {"shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240},
    "aarch64": {"shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180},
}


def _seccomp_program(machine, protect=(), ipc=False):
    """The BPF program of `_refuse_kernel_state` as (code, jt, jf, k) tuples, or None for an
    architecture it does not know. `protect`: pids no signal of the command's may reach. `ipc`:
    also refuse making SysV IPC objects and POSIX message queues."""
    if machine not in _SYSCALLS:
        return None
    arch, foreign, numbers, more = _SYSCALLS[machine]
    numbers = {**numbers, **more}
    ops = [("ld", 4), ("jeq", arch, None, "deny"), ("ld", 0)]
    if foreign:
        ops.append(("jge", foreign, "deny", None))
    ops += [("jeq", numbers[name], "deny", None) for name in ("add_key", "request_key", "keyctl")]
    if ipc:
        ops += [("jeq", number, "deny", None) for number in _IPC_SYSCALLS[machine].values()]
    ops += [("jeq", numbers["clone3"], "enosys", None)]
    ops += [("jeq", numbers[name], "flags", None) for name in ("unshare", "clone")]
    if protect:
        ops += [
            ("jeq", numbers[name], "target", None)
            for name in ("kill", "tkill", "tgkill", "pidfd_open")
        ]
    ops += [("ret", _SECCOMP_RET_ALLOW)]
    ops += [("label", "flags"), ("ld", 16), ("jset", CLONE_NEWUSER, "deny", None)]
    ops += [("ret", _SECCOMP_RET_ALLOW)]
    if protect:
        values = {0xFFFFFFFF} | {p & 0xFFFFFFFF for pid in protect for p in (pid, -pid)}
        ops += [("label", "target"), ("ld", 16)]
        ops += [("jeq", value, "deny", None) for value in sorted(values)]
        ops += [("ret", _SECCOMP_RET_ALLOW)]
    ops += [("label", "deny"), ("ret", _SECCOMP_RET_ERRNO | _EPERM)]
    ops += [("label", "enosys"), ("ret", _SECCOMP_RET_ERRNO | _ENOSYS)]
    return _assemble(ops)


def _assemble(ops):
    """(op, k[, jump if true, jump if false]) with labels -> BPF instructions (jumps count from
    the next instruction; None is the next one)."""
    at, labels = 0, {}
    for op in ops:
        if op[0] == "label":
            labels[op[1]] = at
        else:
            at += 1
    program = []
    for op in ops:
        if op[0] == "label":
            continue
        here = len(program)
        if op[0] in ("ld", "ret"):
            program.append((_BPF[op[0]], 0, 0, op[1]))
            continue
        jt, jf = (0 if t is None else labels[t] - here - 1 for t in op[2:4])
        program.append((_BPF[op[0]], jt, jf, op[1]))
    return program


def _refuse_kernel_state(protect=(), ipc=False):
    """Install a seccomp filter (needs `no_new_privs`) that refuses, for this process and all it
    starts: the keyring calls (add_key, request_key, keyctl: a uid's keyrings outlive its
    processes, and Linux has no keyring namespace), a new user namespace (unshare or clone with
    CLONE_NEWUSER: root of its own mounts, a sample could mount a tmpfs past every limit) and
    clone3 (its flags are out of the filter's reach; ENOSYS makes libc fall back to clone), and
    on x86_64 the x32 ABI's numbers. Container runtimes refuse the same calls. `protect`: pids
    (the driver's, rootless) that no kill, tkill, tgkill or pidfd_open may name, nor kill(-1).
    `ipc`: also refuse shmget, semget, msgget and mq_open (a warm zygote's samples)."""
    _Filter(protect, ipc).install()


class _Filter:
    """`_refuse_kernel_state`'s filter, assembled once and installed by each process that needs
    it: a warm zygote builds its samples' before the first fork, so that each fork only installs
    it (assembling it in Python cost a fork a few tenths of a millisecond)."""

    def __init__(self, protect=(), ipc=False):
        program = _seccomp_program(os.uname().machine, protect, ipc)
        if program is None:
            raise OSError(_ENOSYS, f"no seccomp filter for {os.uname().machine}")
        instructions = b"".join(struct.pack("=HBBI", *ins) for ins in program)
        self.buffer = ctypes.create_string_buffer(instructions, len(instructions))
        self.fprog = struct.pack("=HxxxxxxQ", len(program), ctypes.addressof(self.buffer))

    def install(self):
        """Install it on this process (and all it starts); needs `no_new_privs`."""
        if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(self.fprog), 0, 0):
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


# ------------------------------------------------------------------------- CPU accounting

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
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write(f"{score}\n")
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


def _run(command, uid, spec, account):
    if command.get("python_tests"):
        return _run_judged(command, uid, spec, account)
    start = time.monotonic()
    usage_of = _Usage(command, account)
    channel = _ResultChannel() if command.get("result_channel") else None
    pid = os.fork()
    if pid == 0:
        try:
            _child(command, uid, spec, keep=channel.child_end() if channel else ())
        except BaseException as exc:  # noqa: BLE001 - report why, like a shell's 127
            os.write(2, f"sandbox: cannot run {command['argv'][0]}: {exc}\n".encode())
        finally:
            os._exit(127)
    if channel:
        channel.started()
    pidfd = os.pidfd_open(pid)
    _, timed_out = _wait([pidfd], start + command["wall_s"], command["cpu_budget_s"], usage_of)
    if timed_out:
        _kill_group(pid)
    _, status, usage = os.wait4(pid, 0)
    os.close(pidfd)
    duration = time.monotonic() - start
    _clean()
    row = _row(command, usage_of, status, timed_out, duration, usage.ru_maxrss * 1024)
    if channel:
        row["forged_results"] = channel.collect(pid, command["result"])
    return row


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


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
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


def _preload(site_dirs, modules):
    """Import `modules` once here instead of once per forked Python command, after adding
    `site_dirs` (an environment's site-packages, .pth files included) to the path. This is
    trusted code (the standard library, installed packages) running as the sandbox's root: no
    command's file is on the path yet. A module that fails to import is skipped: a command
    that needs it imports it itself, and fails alone if it must."""
    if site_dirs:
        import site

        for path in site_dirs:
            site.addsitedir(path)
    for module in modules:
        try:
            __import__(module)
        except BaseException as exc:  # noqa: BLE001 - even SystemExit: the batch goes on
            os.write(2, f"sandbox: preload {module} skipped: {type(exc).__name__}\n".encode())


# ----------------------------------------------------------------- warm zygotes (reward samples)

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
            self.ahead = (command, _ResultChannel(), _command_files(command))

    def _write_pending(self):
        if self.pending:
            _write_result(*self.pending)
            self.pending = None

    def settle(self):
        """Write what is pending and close what was opened ahead and not used."""
        self._write_pending()
        if self.ahead:
            _, channel, files = self.ahead
            channel.close()
            for fd in files:
                os.close(fd)
            self.ahead = None

    def run(self, command, upcoming=None):
        """Run `command` forked from the zygote; its result line, or None if the zygote is gone
        (the caller runs it the usual way: nothing of it ran, or its outcome is unknown).
        `upcoming`: the command after it, whose files are opened while this one runs."""
        import socket

        if self.ahead and self.ahead[0] is command:
            _, channel, files = self.ahead
            self.ahead = None
        else:
            self.settle()
            channel, files = _ResultChannel(), _command_files(command)
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
            self._die("it died while a command ran")
            return None
        self._empty()
        status, cpu_s, max_rss = json.loads(fate)
        row = _row(command, usage_of, status, timed_out, duration, max_rss * 1024, cpu_s)
        kept, row["forged_results"] = channel.take(pid)
        self.pending = (command["result"], kept)  # written while the next sample runs
        row["zygote"] = True
        return row

    def _empty(self):
        """Delete what the command left in the directories the zygote's samples share (its
        /tmp, covers, /dev/shm): by descriptor, never following a symlink, nor entering a mount
        (a bound toolchain, a skeleton of one). Every process of the command is dead by now."""
        for fd, dev in self.roots:
            _empty_dir(fd, dev)
        # Fail closed: whatever could not be removed (a deletion refused for any reason) must
        # reach no later sample, so the zygote goes and the rest of the batch forks fresh.
        if [_tree(fd, dev) for fd, dev in self.roots] != self.baseline:
            self._die("a sample left files that could not be removed")


def _tree(root, dev):
    """Every entry under the directory `root` (an fd) on device `dev`, as sorted (path, kind)
    pairs: symlinks not followed, mounts named but not entered."""
    import stat

    found, stack = [], [(os.dup(root), "")]
    while stack:
        fd, prefix = stack.pop()
        try:
            for entry in os.scandir(fd):
                path = prefix + entry.name
                try:
                    info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    found.append((path, "?"))
                    continue
                found.append((path, stat.S_IFMT(info.st_mode)))
                if info.st_dev == dev and stat.S_ISDIR(info.st_mode):
                    try:
                        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                        stack.append((os.open(entry.name, flags, dir_fd=fd), path + "/"))
                    except OSError:
                        found.append((path + "/", "unreadable"))
        finally:
            os.close(fd)
    return sorted(found)


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
    import stat

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
    open its stdin: a file of the sandbox's root, or in a directory hidden from it)."""
    stdin = os.open(command["stdin"] or os.devnull, os.O_RDONLY)
    stdout = os.open(command["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stderr = os.open(command["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return [stdin, stdout, stderr]


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


def _signal_state():
    """The signals this process catches (the kernel's mask: C handlers too) and the Python
    handler of each."""
    with open("/proc/self/status") as handle:
        caught = [line for line in handle if line.startswith("SigCgt:")]
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


def main():
    if sys.argv[1] == "--judge":  # then the site directories of `evaluate.python_env`, if any
        _preload(sys.argv[5:], ())
        sys.exit(_judge_unsandboxed(*sys.argv[2:5]))
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become the commands' subreaper: CPU times would miss orphans")
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    if spec.get("rootless"):  # the commands share this uid: no tracing, no /proc/<me>/fd or mem
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    account = _Account(spec["acct"])
    account.cgroup = _Cgroup(spec.get("cgroup"))
    _find_at_fork_hooks()  # before the preload: its packages' hooks are kept in every fork
    _preload(spec.get("site_dirs", []), spec.get("preload", []))
    if any(command.get("python_tests") for command in spec["commands"]):
        _preload((), _JUDGE_PRELOAD)
    import gc

    gc.freeze()  # a fork's collections never walk (so never copy) the preloaded heap
    zygote = _Zygote.start(spec, account)
    commands = spec["commands"]
    with open(spec["results"], "w") as results:
        for i, command in enumerate(commands):
            upcoming = commands[i + 1] if i + 1 < len(commands) else None
            row = zygote.run(command, upcoming) if zygote and zygote.serves(command) else None
            if row is None and zygote:
                zygote.settle()  # the last sample's result file, before this command runs
            if row is None:
                row = _run(command, spec["uid"], spec, account)
            results.write(json.dumps(row) + "\n")
            results.flush()
            account.forget()
    if zygote:
        zygote.close()


# ------------------------------------------------------------------------- judged Python runs

_MAX_MESSAGE = 64 << 20  # bytes of one reply; more is a failure of the sample
_MAX_REPORT = 48 << 10  # a report fits in a pipe's buffer: the test process never blocks on it
_MAX_ITEMS = 1 << 20  # items materialised from an iterator the sample returns
_BIG_INT_BITS = 12000  # ints above this go as hex: decimal parsing is capped (and quadratic)
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_TOOLING = (
    "linecache",
    "tokenize",
    "warnings",
    "traceback",
    "importlib",
    "codecs",
    "encodings",
    "inspect",
    "doctest",
    "unittest",
    "pydoc",
)  # read sources for honest reasons


#: What every judged run's test process imports (tracebacks, the tests' modules), and a failing
#: sample's process too: imported once per batch, not once per process (~5 ms of each sample).
_JUDGE_PRELOAD = ("linecache", "importlib", "traceback")

#: How long a sample whose channel closed is given to become a finished process: it closes its
#: pipes on its way out, a moment before the kernel records its exit status.
_EXIT_GRACE_S = 5.0


def _judge_report(report):
    """The test process's report (a dict; empty if it wrote none or garbage)."""
    try:
        judge = json.loads(report.decode("utf-8")) if report else {}
    except ValueError:
        judge = {}
    return judge if isinstance(judge, dict) else {}


def _sample_fate(sample, gone):
    """(ended, status, usage) of the sample process without killing it. When the tests saw its
    channel close (`gone`), it is on its way out: wait for it, boundedly, so that whether its
    exit counts does not depend on how busy the machine is."""
    ended, status, usage = os.wait4(sample, os.WNOHANG)
    if ended or not gone:
        return ended, status, usage
    fd = os.pidfd_open(sample)
    try:
        select.select([fd], [], [], _EXIT_GRACE_S)
    finally:
        os.close(fd)
    return os.wait4(sample, os.WNOHANG)


def _run_judged(command, uid, spec, account):
    """Run a sample process and a test process (see the module docstring); the result line's
    status is the test process's, with the sample process's fate and the report in "judge"."""
    start = time.monotonic()
    usage_of = _Usage(command, account)
    sample, tester, report_r = _start_judged(command, uid, spec)
    pidfd = os.pidfd_open(tester)
    report, timed_out = _collect_report(command, pidfd, report_r, start, usage_of)
    # Did the sample end on its own while the tests needed it? (before we kill it)
    judge = _judge_report(report)
    ended, sample_status, sample_usage = _sample_fate(sample, judge.get("sample_gone") is True)
    for group in (tester, sample):
        _kill_group(group)
    _, status, usage = os.wait4(tester, 0)
    if not ended:
        _, _, sample_usage = os.wait4(sample, 0)
    os.close(pidfd)
    duration = time.monotonic() - start
    _clean()
    judge["sample_status"] = sample_status if ended else None
    judge["sample_cpu_s"] = sample_usage.ru_utime + sample_usage.ru_stime
    max_rss = max(usage.ru_maxrss, sample_usage.ru_maxrss) * 1024
    return {**_row(command, usage_of, status, timed_out, duration, max_rss), "judge": judge}


def _start_judged(command, uid, spec):
    """Fork the sample process and the test process, joined by two pipes; returns their pids and
    the read end of the test process's report pipe."""
    calls_r, calls_w = os.pipe()  # test -> sample
    replies_r, replies_w = os.pipe()  # sample -> test
    report_r, report_w = os.pipe()  # test -> driver
    sample = os.fork()
    if sample == 0:
        try:
            _child(command, uid, spec, keep=(calls_r, replies_w))
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"sandbox: cannot run {command['argv'][0]}: {exc}\n".encode())
        finally:
            os._exit(127)
    tester = os.fork()
    if tester == 0:
        status = 1
        try:
            status = _test_child(command, replies_r, calls_w, report_w)
        finally:
            os._exit(status)
    for fd in (calls_r, calls_w, replies_r, replies_w, report_w):
        os.close(fd)
    return sample, tester, report_r


def _collect_report(command, pidfd, report_r, start, usage_of):
    """Read the test process's report until it exits, the wall clock runs out or the command's
    processes used up their CPU budget; returns (report, timed_out). Closes `report_r`."""
    report = b""
    deadline = start + command["wall_s"]
    open_fds = [pidfd, report_r]
    timed_out = False
    while pidfd in open_fds or report_r in open_fds:
        ready, timed_out = _wait(open_fds, deadline, command["cpu_budget_s"], usage_of)
        if timed_out:
            break
        if report_r in ready:
            chunk = os.read(report_r, 65536)
            if not chunk or len(report) > _MAX_REPORT:
                open_fds.remove(report_r)
            report += chunk
        if pidfd in ready:
            open_fds.remove(pidfd)
            if report_r in open_fds:  # the report was written before exit: read what is left
                os.set_blocking(report_r, False)
                try:
                    while chunk := os.read(report_r, 65536):
                        report += chunk
                except BlockingIOError:
                    pass
                open_fds.remove(report_r)
    os.close(report_r)
    return report, timed_out


def _test_child(command, replies, calls, report):
    """The test process: trusted code only, no capabilities; returns its exit status. It is in
    the command's cgroup too: the tests' CPU is part of the command's, as without cgroups."""
    os.setsid()
    _oom_first()
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    _keep_fds((replies, calls, report))
    with open(command["python_tests"], encoding="utf-8") as handle:
        tests = json.load(handle)
    os.chdir("/")
    for name, (soft, hard) in command["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    _drop_capabilities()
    # Rootless, the sample process has this uid too: not dumpable, it cannot be traced or read.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return 126
    return _run_tests(tests, _Channel(3, 4), 5)


def _drop_capabilities():
    """Every capability of this process, gone: uid 0 that is no more than any other uid."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


class _SampleGone(BaseException):
    """The sample process ended (exit, crash, kill), raised what no test may catch
    (KeyboardInterrupt...) or broke the protocol while the tests ran: the sample fails whatever
    the tests catch, as in one process, where its exit ends the tests. A BaseException, so that
    `except Exception:` in the tests lets it through; `_Tests` also keeps the first one and
    `_run_tests` fails the sample on it even if the tests caught it (`except:`).
    `forged`: what came was no reply the sample process's loop writes: someone else wrote it."""

    def __init__(self, message, forged=False):
        super().__init__(message)
        self.forged = forged


class _SampleExited(_SampleGone):
    """The sample raised SystemExit / called exit() while the tests called it."""


class _Channel:
    """Length-prefixed `repr`s of literals over a pair of pipes."""

    def __init__(self, read_fd, write_fd):
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, message):
        data = repr(message).encode("utf-8", "surrogatepass")
        data = len(data).to_bytes(8, "big") + data
        view = memoryview(data)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def receive_raw(self):
        header = self._exactly(8)
        size = int.from_bytes(header, "big")
        if size > _MAX_MESSAGE:
            raise _SampleGone(f"a reply of {size} bytes", size > 1 << 40)
        return self._exactly(size)

    def _exactly(self, size):
        chunks, got = [], 0
        while got < size:
            chunk = os.read(self.read_fd, min(size - got, 1 << 20))
            if not chunk:
                raise _SampleGone("the sample process ended while the tests ran")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)


#: How deep `_encode` nests one tree: deeper values go out of line (see `_Outbound`), so a
#: message's literal stays within what `ast.literal_eval` parses (200 nested brackets; a level
#: takes up to 3) and no structure's depth is bounded by a recursion limit.
_SPILL_DEPTH = 48
_MAX_SPILLS = 1 << 14  # so a depth of 786k levels; a list that contains itself ends here

#: Built-in types and functions that cross as themselves (`defaultdict(list)`, `key=len`).
_BUILTIN_TYPES = (
    "bool",
    "bytes",
    "complex",
    "dict",
    "float",
    "frozenset",
    "int",
    "list",
    "object",
    "set",
    "str",
    "tuple",
)
_BUILTIN_FUNCTIONS = ("abs", "len", "max", "min", "ord", "chr", "repr", "round", "sorted", "sum")


def _encode(value, out, depth=0):  # noqa: C901 - one branch per plain type the channel carries, kept flat to audit
    """Plain data as a tree of literals, exact types first (the fast path); anything else
    through `out.rich` (tagged values, program classes, opaque references: `_Outbound`)."""
    if depth > _SPILL_DEPTH:
        return out.spill(value)
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if value.bit_length() <= _BIG_INT_BITS else ("I", format(value, "x"))
    if kind is float:
        return value if math.isfinite(value) else ("F", repr(value))
    if kind is list:
        return ("L", [_encode(item, out, depth + 1) for item in value])
    if kind is tuple:
        return ("T", [_encode(item, out, depth + 1) for item in value])
    if kind is dict:
        return (
            "D",
            [(_encode(k, out, depth + 1), _encode(v, out, depth + 1)) for k, v in value.items()],
        )
    if kind is bytes:
        return value
    if kind is set or kind is frozenset:
        return ("S" if kind is set else "Z", [_encode(item, out, depth + 1) for item in value])
    if kind is complex:
        return ("C", _encode(value.real, out), _encode(value.imag, out))
    if kind is range:
        return ("R", value.start, value.stop, value.step)
    if isinstance(value, bool):
        return bool(value)
    module = kind.__module__
    if module in _TAGGED_MODULES:
        return out.rich(value, depth)
    fields = getattr(kind, "_fields", None)
    if isinstance(value, tuple) and type(fields) is tuple and all(type(f) is str for f in fields):
        return (
            "N",
            str(kind.__name__),
            list(fields),
            [_encode(item, out, depth + 1) for item in tuple.__iter__(value)],
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        tag = (
            "L"
            if isinstance(value, list)
            else "T"
            if isinstance(value, tuple)
            else "S"
            if isinstance(value, set)
            else "Z"
        )
        base = list if tag == "L" else tuple if tag == "T" else set if tag == "S" else frozenset
        return (tag, [_encode(item, out, depth + 1) for item in base.__iter__(value)])
    if isinstance(value, dict):
        return (
            "D",
            [
                (_encode(k, out, depth + 1), _encode(v, out, depth + 1))
                for k, v in dict.items(value)
            ],
        )
    enum = sys.modules.get("enum")
    if enum is not None and isinstance(value, enum.Enum):  # an IntEnum's member is an int too
        return out.rich(value, depth)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return _encode(int.__index__(value), out)
    if isinstance(value, float):
        return _encode(float.__float__(value), out)
    if isinstance(value, bytes):
        return bytes(value)
    if module == "fractions" and kind.__name__ == "Fraction":
        return ("Q", _encode(value.numerator, out), _encode(value.denominator, out))
    if module == "decimal" and kind.__name__ == "Decimal":
        return ("M", str(value))
    return out.rich(value, depth)


def _pairs(mapping, out, depth):
    return [(_encode(k, out, depth + 1), _encode(v, out, depth + 1)) for k, v in mapping.items()]


def _encode_date(value, out, depth):
    return ("Yd", value.year, value.month, value.day)


def _encode_tz(tz):
    """A fixed-offset `datetime.timezone` as (days, seconds, microseconds, name); another
    tzinfo (its code decides its offsets) makes the value opaque."""
    if tz is None:
        return None
    if type(tz) is not datetime.timezone:
        raise TypeError("a tzinfo other than datetime.timezone")
    offset = tz.utcoffset(None)
    name = tz.tzname(None)
    name = None if tz is datetime.UTC else name
    return (offset.days, offset.seconds, offset.microseconds, name)


def _encode_datetime(value, out, depth):
    fields = (value.year, value.month, value.day, value.hour, value.minute, value.second)
    return ("Yt", *fields, value.microsecond, value.fold, _encode_tz(value.tzinfo))


def _encode_time(value, out, depth):
    fields = (value.hour, value.minute, value.second, value.microsecond, value.fold)
    return ("Yh", *fields, _encode_tz(value.tzinfo))


def _encode_timedelta(value, out, depth):
    return ("Yz", value.days, value.seconds, value.microseconds)


def _encode_deque(value, out, depth):
    items = [_encode(item, out, depth + 1) for item in value]
    return ("Cq", items, value.maxlen)


def _encode_counter(value, out, depth):
    return ("Cc", _pairs(value, out, depth))


def _encode_ordered(value, out, depth):
    return ("Co", _pairs(value, out, depth))


def _encode_defaultdict(value, out, depth):
    return ("Cd", _encode(value.default_factory, out, depth + 1), _pairs(value, out, depth))


def _encode_keys(value, out, depth):
    return ("Vk", [_encode(item, out, depth + 1) for item in value])


def _encode_values(value, out, depth):
    return ("Vv", [_encode(item, out, depth + 1) for item in value])


def _encode_items(value, out, depth):
    return ("Vi", [(_encode(k, out, depth + 1), _encode(v, out, depth + 1)) for k, v in value])


#: Standard-library value types that cross by tag, by exact type (a subclass's code is its own:
#: it stays opaque). Their state is read through the C type's own accessors.
_TAGGED = {
    datetime.date: _encode_date,
    datetime.datetime: _encode_datetime,
    datetime.time: _encode_time,
    datetime.timedelta: _encode_timedelta,
    collections.deque: _encode_deque,
    collections.Counter: _encode_counter,
    collections.OrderedDict: _encode_ordered,
    collections.defaultdict: _encode_defaultdict,
    type({}.keys()): _encode_keys,
    type({}.values()): _encode_values,
    type({}.items()): _encode_items,
    type(collections.OrderedDict().keys()): _encode_keys,
    type(collections.OrderedDict().values()): _encode_values,
    type(collections.OrderedDict().items()): _encode_items,
}
_TAGGED_MODULES = ("datetime", "collections")


class _PlainOnly:
    """An `_encode` target that takes plain data only (what `_SampleServer.changed` compares)."""

    def spill(self, value):
        raise TypeError("not plain data")

    rich = spill


class _Outbound:
    """One message being encoded by `side` (`_Tests` or `_SampleServer`). What `_encode` does not
    carry inline goes through `rich`: a standard-library value by tag (`_TAGGED`), an Enum member
    by class and name, an instance of a class the program defines (the prompt's, on both sides)
    by class and state, an iterator as a lazy reference, a callable of the tests' as a callback,
    anything else as the side's opaque reference. Instances and values deeper than
    `_SPILL_DEPTH` go out of line, into `work`: entry k is ("s", tree) for a spilled value (its
    place says ("^", k)) or ("p", module, qualname, ref, [(name, tree), ...]) for an instance
    (its places say ("P", k); `memo` gives one object one entry, so shared and cyclic references
    survive). A message with entries is ("X", tree, entries); an entry refers only to later
    entries and to instances, so `_load` decodes them last to first without recursing."""

    __slots__ = ("side", "work", "memo", "spills")

    def __init__(self, side):
        self.side = side
        self.work = []
        self.memo = {}
        self.spills = 0

    def spill(self, value):
        self.spills += 1
        if self.spills > _MAX_SPILLS:
            raise ValueError("a value nested too deeply, or a list or dict that contains itself")
        self.work.append(("s", value))
        return ("^", len(self.work) - 1)

    def rich(self, value, depth):
        kind = type(value)
        tagged = _TAGGED.get(kind)
        if tagged is not None:
            try:
                return tagged(value, self, depth)
            except TypeError:  # a tzinfo with code of its own
                return self.side.refer(value)
        side = self.side
        if kind is side.callback_type:
            return side.own_callback(value)
        enum = sys.modules.get("enum")
        if enum is not None and isinstance(value, enum.Enum):
            return ("E", kind.__module__, kind.__qualname__, value._name_, side.enum_extra(value))
        if kind is type and value.__module__ == "builtins" and value.__name__ in _BUILTIN_TYPES:
            return ("B", value.__name__)
        if kind is type(len) and value.__name__ in _BUILTIN_FUNCTIONS:
            import builtins

            if getattr(builtins, value.__name__) is value:  # `key=len`: no callback per call
                return ("B", value.__name__)
        if isinstance(value, type) and value.__module__ == side.program_module:
            return ("C", value.__module__, value.__qualname__, side.enum_extra(value))
        if (
            kind.__module__ == side.program_module
            and kind.__new__ is object.__new__
            and not isinstance(value, (type, BaseException))
            and not callable(value)
        ):
            return self.instance(value)
        mock = sys.modules.get("unittest.mock")
        if mock is not None and isinstance(value, mock.NonCallableMock):
            return side.callable(value)  # `iter(mock)` below would be a call its record shows
        if getattr(kind, "__next__", None) is not None and iter(value) is value:
            return side.iterator(value)
        if callable(value) and not isinstance(value, type):
            return side.callable(value)
        return side.refer(value)

    def instance(self, value):
        key = id(value)
        if key in self.memo:
            return ("P", self.memo[key])
        self.work.append(("p", value))
        self.memo[key] = len(self.work) - 1
        return ("P", len(self.work) - 1)

    def finish(self, tree):
        """The message with out-of-line entries: ("X", tree, entries)."""
        work = self.work
        entries = []
        for what, value in work:  # grows while it runs: entries add entries
            if what == "s":
                entries.append(("s", _encode(value, self)))
            else:
                kind = type(value)
                state = [(name, _encode(item, self, 1)) for name, item in _state(value)]
                ref = self.side.refer(value) if self.side.program_module == "__main__" else None
                entries.append(("p", kind.__module__, kind.__qualname__, ref, state))
        return ("X", tree, entries)


def _dump(value, side):
    """`value` encoded by `side`, as one message's tree."""
    out = _Outbound(side)
    tree = _encode(value, out)
    return out.finish(tree) if out.work else tree


def _state(obj):
    """An instance's attributes: its `__dict__`, then its slots that are set."""
    state = list(obj.__dict__.items()) if hasattr(obj, "__dict__") else []
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if type(slots) is str else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                state.append((name, object.__getattribute__(obj, name)))
            except AttributeError:  # unset
                pass
    return state


class _Inbound:
    """One message being decoded for `side`: its out-of-line entries (see `_Outbound`), decoded
    so far, and the index of the entry being decoded (an entry refers only to later ones)."""

    __slots__ = ("side", "entries", "floor", "kinds")

    def __init__(self, side):
        self.side = side
        self.entries = ()
        self.kinds = ()
        self.floor = -1

    def entry(self, tag, k):
        if type(k) is not int or not 0 <= k < len(self.entries) or self.kinds[k] != tag:
            raise _SampleGone("a malformed reference in a reply")
        if tag == "s" and k <= self.floor:
            raise _SampleGone("a reply's entry refers back")
        return self.entries[k]


def _load(tree, side, root=None):
    """The value `_dump` made, decoded for `side` (untrusted: see `_decode`). `root`: an
    instance the message's first entry stands for (a call changed it: `_Tests._mutate`)."""
    kind = type(tree)
    if tree is None or kind is bool or kind is int or kind is float or kind is str:
        return tree
    inbound = _Inbound(side)
    if kind is not tuple or not tree or tree[0] != "X":
        return _decode(tree, inbound)
    if len(tree) != 3 or type(tree[2]) is not list:
        raise _SampleGone("a malformed reply")
    entries = tree[2]
    if not all(type(e) is tuple and e and e[0] in ("s", "p") for e in entries):
        raise _SampleGone("a malformed entry in a reply")
    inbound.kinds = [e[0] for e in entries]
    inbound.entries = [None] * len(entries)
    for k, entry in enumerate(entries):  # instances first: entries may refer to any of them
        if entry[0] == "p":
            inbound.entries[k] = _shell(entry, inbound)
    if root is not None and tree[1] == ("P", 0) and type(inbound.entries[0]) is type(root):
        root.__dict__.clear()
        inbound.entries[0] = root
    for k in range(len(entries) - 1, -1, -1):
        inbound.floor = k
        entry = entries[k]
        if entry[0] == "s" and len(entry) == 2:
            inbound.entries[k] = _decode(entry[1], inbound)
        elif entry[0] == "p" and type(entry[4]) is list:
            state = []
            for pair in entry[4]:
                if type(pair) is not tuple or len(pair) != 2 or type(pair[0]) is not str:
                    raise _SampleGone("a malformed instance in a reply")
                state.append((pair[0], _decode(pair[1], inbound)))
            side.fill(inbound.entries[k], state)
        else:
            raise _SampleGone("a malformed entry in a reply")
    inbound.floor = -1
    return _decode(tree[1], inbound)


def _shell(entry, inbound):
    """The instance an entry ("p", module, qualname, ref, state) becomes, still without state:
    one of the class the receiving side's program defines by that name, made without calling
    its `__init__`, or (the tests' side, no such class) the sample's object as a reference."""
    if len(entry) != 5 or type(entry[1]) is not str or type(entry[2]) is not str:
        raise _SampleGone("a malformed instance in a reply")
    cls = inbound.side.program_class(entry[1], entry[2])
    if cls is None:
        return inbound.side.stand_in(entry[2], entry[3], inbound)
    return object.__new__(cls)


def _fill(obj, state, trusted_class):
    """Set an instance's attributes as pickle does (its `__dict__`, or its slots), calling none
    of its code. A class the side trusts (the tests' copy of the prompt's) gets data only: a
    name that its class binds to a method or a descriptor (an instance attribute would shadow
    the prompt's method with the sample's callable) is a malformed reply."""
    for name, value in state:
        if not name.isidentifier() or name.startswith("__"):
            raise _SampleGone("a malformed attribute name in a reply")
        static = None
        for cls in type(obj).__mro__:
            if name in cls.__dict__:
                static = cls.__dict__[name]
                break
        if type(static).__name__ == "member_descriptor":
            object.__setattr__(obj, name, value)
        elif (
            trusted_class
            and static is not None
            and (callable(static) or hasattr(type(static), "__get__"))
        ):
            raise _SampleGone(f"a reply's instance state shadows its class's {name!r}")
        elif hasattr(obj, "__dict__"):
            obj.__dict__[name] = value
        else:
            raise _SampleGone(f"a reply's instance has no attribute {name!r}")


def _decode_tz(tz):
    if tz is None:
        return None
    if type(tz) is not tuple or len(tz) != 4 or type(tz[3]) not in (str, type(None)):
        raise TypeError("a malformed tzinfo")
    offset = datetime.timedelta(*_ints(tz[:3]))
    if tz[3] is None:
        return datetime.timezone(offset)
    return datetime.timezone(offset, tz[3])


def _decode_pairs(pairs, inbound, depth):
    if type(pairs) is not list:
        raise _SampleGone("a malformed mapping in a reply")
    result = []
    for pair in pairs:
        if type(pair) is not tuple or len(pair) != 2:
            raise _SampleGone("a malformed mapping in a reply")
        result.append((_decode(pair[0], inbound, depth + 1), _decode(pair[1], inbound, depth + 1)))
    return result


def _decode_items(items, inbound, depth):
    if type(items) is not list:
        raise _SampleGone("a malformed container in a reply")
    return [_decode(item, inbound, depth + 1) for item in items]


def _ints(values):
    if not all(type(x) is int for x in values):
        raise TypeError("fields must be ints")
    return values


def _decode_rich(tag, rest, inbound, depth):  # noqa: C901 - the mirror of `_Outbound.rich`, kept flat to audit
    """The tagged values `_Outbound.rich` made; `_UNKNOWN` for a tag it never makes."""
    side = inbound.side
    if tag == "^" and len(rest) == 1:
        return inbound.entry("s", rest[0])
    if tag == "P" and len(rest) == 1:
        return inbound.entry("p", rest[0])
    if tag == "Yd" and len(rest) == 3:
        return datetime.date(*_ints(rest))
    if tag == "Yt" and len(rest) == 9:
        return datetime.datetime(
            *_ints(rest[:7]), tzinfo=_decode_tz(rest[8]), fold=_ints(rest[7:8])[0]
        )
    if tag == "Yh" and len(rest) == 6:
        return datetime.time(*_ints(rest[:4]), tzinfo=_decode_tz(rest[5]), fold=_ints(rest[4:5])[0])
    if tag == "Yz" and len(rest) == 3:
        return datetime.timedelta(*_ints(rest))
    if tag == "Cq" and len(rest) == 2 and (rest[1] is None or type(rest[1]) is int):
        return collections.deque(_decode_items(rest[0], inbound, depth), rest[1])
    if tag == "Cc" and len(rest) == 1:
        return collections.Counter(dict(_decode_pairs(rest[0], inbound, depth)))
    if tag == "Co" and len(rest) == 1:
        return collections.OrderedDict(_decode_pairs(rest[0], inbound, depth))
    if tag == "Cd" and len(rest) == 2:
        factory = _decode(rest[0], inbound, depth + 1)
        if factory is not None and not callable(factory):
            raise TypeError("a defaultdict's factory must be callable")
        return collections.defaultdict(factory, _decode_pairs(rest[1], inbound, depth))
    if tag == "Vk" and len(rest) == 1:
        return dict.fromkeys(_decode_items(rest[0], inbound, depth)).keys()
    if tag == "Vv" and len(rest) == 1:
        return dict(enumerate(_decode_items(rest[0], inbound, depth))).values()
    if tag == "Vi" and len(rest) == 1:
        return dict(_decode_pairs(rest[0], inbound, depth)).items()
    if tag == "B" and len(rest) == 1 and rest[0] in _BUILTIN_TYPES + _BUILTIN_FUNCTIONS:
        import builtins

        return getattr(builtins, rest[0])
    if tag == "C" and len(rest) == 3 and type(rest[0]) is str and type(rest[1]) is str:
        return side.program_type(rest[0], rest[1], rest[2], inbound)
    if tag == "E" and len(rest) == 4 and type(rest[0]) is str and type(rest[1]) is str:
        return side.enum_member(rest[0], rest[1], rest[2], rest[3], inbound)
    if tag in ("G", "K", "J") and len(rest) == 1:
        return side.crossing(tag, rest[0])
    return _UNKNOWN


_UNKNOWN = object()


def _decode(tree, inbound, depth=0):  # noqa: C901 - the mirror of _encode, kept flat to audit
    """The value `_encode` made (untrusted input: anything unexpected is a `_SampleGone`)."""
    if depth > 400:
        raise _SampleGone("a reply nested too deeply")
    kind = type(tree)
    if tree is None or kind in (bool, int, float, str, bytes):
        return tree
    if kind is not tuple or not tree or type(tree[0]) is not str:
        raise _SampleGone(f"a malformed reply ({kind.__name__})")
    tag, rest = tree[0], tree[1:]
    try:
        if tag in ("L", "T", "S", "Z") and len(rest) == 1 and type(rest[0]) is list:
            items = [_decode(item, inbound, depth + 1) for item in rest[0]]
            return {"L": list, "T": tuple, "S": set, "Z": frozenset}[tag](items)
        if tag == "D" and len(rest) == 1 and type(rest[0]) is list:
            result = {}
            for pair in rest[0]:
                if type(pair) is not tuple or len(pair) != 2:
                    raise _SampleGone("a malformed dict in a reply")
                result[_decode(pair[0], inbound, depth + 1)] = _decode(pair[1], inbound, depth + 1)
            return result
        if (
            tag == "N"
            and len(rest) == 3
            and type(rest[0]) is str
            and type(rest[1]) is list
            and type(rest[2]) is list
            and len(rest[1]) == len(rest[2]) <= 255
        ):
            return _named_tuple(rest[0], tuple(rest[1]))(
                *[_decode(item, inbound, depth + 1) for item in rest[2]]
            )
        if tag == "I" and len(rest) == 1 and type(rest[0]) is str:
            return int(rest[0], 16)
        if tag == "F" and len(rest) == 1 and rest[0] in ("inf", "-inf", "nan"):
            return float(rest[0])
        if tag == "C" and len(rest) == 2 and all(type(x) in (int, float) for x in rest):
            return complex(rest[0], rest[1])
        if tag == "R" and len(rest) == 3 and all(type(x) is int for x in rest):
            return range(*rest)
        if tag == "O" and len(rest) == 2:
            return inbound.side.lookup(rest[0], rest[1])
        if tag == "Q" and len(rest) == 2 and all(type(x) is int for x in rest) and rest[1]:
            import fractions

            return fractions.Fraction(rest[0], rest[1])
        if tag == "M" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) < 10000:
            import decimal

            return decimal.Decimal(rest[0])
        value = _decode_rich(tag, rest, inbound, depth)
        if value is not _UNKNOWN:
            return value
    except (TypeError, ValueError, OverflowError) as exc:  # an unhashable key, a bad date, ...
        raise _SampleGone(f"a malformed reply: {exc}") from None
    raise _SampleGone(f"a malformed reply (tag {tag!r})")


def _program_class(namespace, qualname):
    """The class named `qualname` that the code run in `namespace` defines, if it does."""
    parts = qualname.split(".")
    cls = namespace.get(parts[0])
    for part in parts[1:]:
        cls = getattr(cls, part, None) if isinstance(cls, type) else None
    if not isinstance(cls, type) or cls.__module__ != namespace.get("__name__"):
        return None
    return cls if cls.__qualname__ == qualname else None


def _next_items(iterator, args):
    """(ended, up to `args[0]` next items of `iterator`): one chunk of a lazy iterator."""
    if len(args) != 1 or type(args[0]) is not int or not 0 < args[0] <= _CHUNK:
        raise TypeError("a malformed request for items")
    items = []
    try:
        while len(items) < args[0]:
            items.append(next(iterator))
    except StopIteration:
        return (True, items)
    return (False, items)


#: Most items one request takes from a lazy iterator; the first takes 1, each next twice as
#: many: at most about as many items are computed ahead as were asked for.
_CHUNK = 1024


def _remote_items(tests, ref):
    """The sample's iterator, seen from the tests: a generator that asks the sample for its
    items in chunks as it is consumed (a partly consumed or endless one works as in one
    process; an exception the sample's iterator raises comes where its item would)."""
    size = 1
    while True:
        reply = tests.ask("next", ref, (size,))
        if type(reply) is not tuple or len(reply) != 2 or type(reply[1]) is not list:
            tests._gone(_SampleGone("a malformed reply to next"))
        yield from reply[1]
        if reply[0] is True:
            return
        size = min(size * 2, _CHUNK)


_NAMED_TUPLES = {}


def _named_tuple(name, fields):
    """A namedtuple class like the sample's (its fields, its name): equal to tuples like it."""
    if (name, fields) not in _NAMED_TUPLES:
        import collections

        if not all(type(f) is str for f in fields):
            raise TypeError("field names must be strings")
        _NAMED_TUPLES[name, fields] = collections.namedtuple(name, fields)
    return _NAMED_TUPLES[name, fields]


class _Remote:
    """An object of the sample process, seen from the tests: equal only to itself; its truth,
    length, items, attributes, string forms and calls are asked of the sample (its answer is the
    sample's answer, as plain data), its comparisons never are."""

    __slots__ = ("_ckpteval_id", "_ckpteval_tests", "_ckpteval_name")

    def __init__(self, tests, ref, name):
        object.__setattr__(self, "_ckpteval_id", ref)
        object.__setattr__(self, "_ckpteval_tests", tests)
        object.__setattr__(self, "_ckpteval_name", name)

    def _ask(self, op, *args, **kwargs):
        return self._ckpteval_tests.ask(op, self._ckpteval_id, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def __eq__(self, other):
        if other is not self:
            self._ckpteval_tests.compared = True
        return other is self

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __bool__(self):
        return bool(self._ask("bool"))

    def __len__(self):
        return int(self._ask("len"))

    def __iter__(self):
        return iter(list(self._ask("list")))

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __str__(self):
        return str(self._ask("str"))

    def __repr__(self):
        return f"<sample object {self._ckpteval_name}>"


class _Tests:
    """The test process's side of the channel."""

    def __init__(self, channel):
        self.channel = channel
        self.remotes = {}
        self.hacks = []
        self.compared = False
        self.mutated = ()
        self.gone = None  # the first _SampleGone: the verdict, whatever the tests caught
        self.namespace = {}  # the tests' globals: the prompt's exception classes
        self.callbacks = []  # the tests' callables and iterators the sample holds, by index
        self.callback_index = {}  # id of a callback (kept alive in `callbacks`) -> its index

    # -- what `_Outbound` and `_Inbound` ask of this side (see them)

    program_module = "__ckpteval_tests__"
    callback_type = _Remote

    def own_callback(self, value):
        return ("O", value._ckpteval_id, None)

    def refer(self, value):
        """A tests' object that is no data (a mock, what a mock returns): by reference, as a
        callable is (`_operate` says what the sample may do with it). A module never crosses: its
        functions would run here on the sample's word."""
        if isinstance(value, type(sys)):
            raise TypeError(f"a test passes a {type(value).__name__} the sample process cannot get")
        return self.callable(value)

    def enum_extra(self, value):
        return None

    def callable(self, value):
        index = self.callback_index.get(id(value))
        if index is None:  # one object, one index: the sample sees one object as one (`is`)
            self.callbacks.append(value)
            index = self.callback_index[id(value)] = len(self.callbacks) - 1
        return ("K", index)

    def iterator(self, value):
        self.callbacks.append(value)
        return ("J", len(self.callbacks) - 1)

    def program_class(self, module, qualname):
        """The tests' copy of the prompt's class (or the tests' own) named `qualname`: a plain
        class (no `__new__` of its own), never an exception or an enum."""
        if module not in ("__main__", "__ckpteval_tests__"):
            return None
        cls = _program_class(self.namespace, qualname)
        if cls is None or cls.__new__ is not object.__new__ or issubclass(cls, BaseException):
            return None
        return cls

    def program_type(self, module, qualname, ref, inbound):
        """A class of the program's: the tests' copy of the prompt's, or the sample's, opaque."""
        cls = _program_class(self.namespace, qualname) if module == "__main__" else None
        return cls if cls is not None else self.stand_in(qualname, ref, inbound)

    def stand_in(self, qualname, ref, inbound):
        if type(ref) is tuple and ref[:1] == ("O",):
            return _decode(ref, inbound)  # a class of the sample's own: its object, opaque
        raise _SampleGone(f"an instance of {qualname[:100]!r}, which the tests do not know")

    def fill(self, obj, state):
        if not isinstance(obj, _Remote):
            _fill(obj, state, True)

    def enum_member(self, module, qualname, name, extra, inbound):
        """A member of the prompt's Enum or of an already imported module's (by class and
        name); another one is the sample's object, opaque."""
        if module in ("__main__", "__ckpteval_tests__"):
            cls = _program_class(self.namespace, qualname)
        elif module.split(".")[0] in _RUNNER_MODULES or module not in sys.modules:
            cls = None
        else:
            cls = sys.modules[module]
            for part in qualname.split("."):
                cls = getattr(cls, part, None)
        enum = sys.modules["enum"]
        if isinstance(cls, type) and issubclass(cls, enum.Enum) and type(name) is str:
            member = cls.__members__.get(name)
            if member is not None:
                return member
        if type(extra) is tuple and extra[:1] == ("O",):
            return _decode(extra, inbound)
        raise _SampleGone(f"a member of {qualname[:100]!r}, which the tests do not know")

    def crossing(self, tag, index):
        if tag == "G":
            return _remote_items(self, index)
        if type(index) is not int or not 0 <= index < len(self.callbacks):
            raise _SampleGone("a malformed callback in a reply")
        return self.callbacks[index]

    def lookup(self, ref, info):
        """The remote object a reply refers to (by the sample's number for it)."""
        if type(ref) is not int:
            raise _SampleGone("a malformed reference in a reply")
        if isinstance(info, dict) and info.get("always_equal") is True:
            self._hack("always_equal_object")
        if ref not in self.remotes:
            name = info.get("type", "object") if isinstance(info, dict) else "object"
            self.remotes[ref] = _Remote(self, ref, str(name)[:100])
        return self.remotes[ref]

    def named(self, name):
        """The sample's top-level `name`, as a remote object."""
        return _Remote(self, ("name", name), name)

    def _hack(self, name):
        if name not in self.hacks:
            self.hacks.append(name)

    def ask(self, op, target, args=(), kwargs=None):
        kwargs = kwargs or {}
        request = (op, target, _dump(list(args), self), _dump(kwargs, self))
        if self.gone is not None:
            raise self.gone  # no second conversation with a sample that is gone
        try:
            self.channel.send(request)
        except OSError:  # its end of the pipe is closed: it ended
            self._gone(_SampleGone("the sample process ended while the tests ran"))
        self.mutated = ()
        value = self.answer()
        for key, tree in self.mutated if type(self.mutated) is list else ():
            self._mutate(
                args[key]
                if type(key) is int and 0 <= key < len(args)
                else kwargs.get(key)
                if type(key) is str
                else None,
                tree,
            )
        return value

    def _mutate(self, arg, tree):
        """What the call did to a list, dict or set or an instance of the prompt's class the tests
        passed: done to the tests' own object too, as if the call had run here (the new contents
        are the sample's, as data; an instance keeps its identity, so a cycle back to it too)."""
        instance = type(arg).__module__ == self.program_module and hasattr(arg, "__dict__")
        try:
            new = _load(tree, self, arg if instance else None)
        except _SampleGone as exc:
            self._gone(exc)
        if type(arg) is list and type(new) is list:
            arg[:] = new
        elif type(arg) in (dict, set) and type(new) is type(arg):
            arg.clear()
            arg.update(new)

    def _gone(self, exc):
        if self.gone is None:
            self.gone = exc
        raise exc

    def answer(self, ready=False):
        try:
            return self._answer(ready)
        except _SampleGone as exc:
            self._gone(exc)

    def _receive(self):
        raw = self.channel.receive_raw()
        try:
            reply = ast.literal_eval(raw.decode("utf-8", "surrogatepass"))
        except (
            ValueError,
            SyntaxError,
            TypeError,
            MemoryError,
            RecursionError,
            UnicodeDecodeError,
        ) as exc:
            raise _SampleGone(f"a malformed reply: {type(exc).__name__}", True) from None
        if type(reply) is not tuple or not reply:
            raise _SampleGone("a malformed reply", True)
        return reply

    def _answer(self, ready):
        reply = self._receive()
        while reply[0] == "cb":  # the sample calls one of the tests' callables first
            self._call_back(reply)
            reply = self._receive()
        for hack in (
            reply[2]
            if reply[0] in ("ok", "err") and len(reply) > 2 and type(reply[2]) is list
            else ()
        ):
            if hack in _HACKS:
                self._hack(hack)
        if reply[0] == "ok" and len(reply) >= 2:
            if (
                len(reply) > 3
                and type(reply[3]) is list
                and all(type(m) is tuple and len(m) == 2 for m in reply[3])
            ):
                self.mutated = reply[3]
            return _load(reply[1], self)
        if reply[0] == "err" and len(reply) >= 4 and type(reply[1]) is str:
            raise self._exception(reply)
        if reply[0] == "exit":
            if not ready:  # during the tests; at start-up it may be a __main__ block's exit
                self._hack("exit_before_tests")
            raise _SampleExited(f"the sample called exit({reply[1]!r}) while the tests ran")
        raise _SampleGone("a malformed reply")

    def _exception(self, reply):
        """The exception the sample raised (an "err" reply), as the tests' own: the first class
        of its MRO that `_exception_class` finds here, with its args and plain attributes (as
        data), and the sample's traceback as a note. What no `except Exception:` catches in one
        process (KeyboardInterrupt, GeneratorExit, ...) ends the sample's verdict instead."""
        classes = [("builtins", reply[1]), ("builtins", "Exception")]
        classes = reply[4] if len(reply) > 4 and type(reply[4]) is list else classes
        cls = None
        for entry in classes[:64]:
            if type(entry) is tuple and len(entry) == 2 and all(type(x) is str for x in entry):
                cls = _exception_class(entry[0], entry[1], self.namespace)
                if cls is not None:
                    break
        if cls is None or not issubclass(cls, Exception):
            raise _SampleGone(f"the sample raised {reply[1][:100]}, which ends the tests")
        args = _load(reply[5], self) if len(reply) > 5 else ()
        args = args if type(args) is tuple else ()
        try:
            exc = cls.__new__(cls, *args)
        except Exception:  # noqa: BLE001 - a __new__ that wants other arguments
            exc = cls.__new__(cls)
        exc.args = args
        attrs = _load(reply[6], self) if len(reply) > 6 else {}
        for name, value in attrs.items() if type(attrs) is dict else ():
            if type(name) is str and not name.startswith("__"):
                try:
                    setattr(exc, name, value)
                except Exception:  # noqa: BLE001 - a read-only attribute of the class
                    pass
        exc.add_note(f"raised by the sample:\n{str(reply[3])[-1500:]}")
        return exc

    def _call_back(self, request):
        """Do what the sample did with one of the tests' objects ("cb", op, index, args, kwargs):
        call a callable, take the next items of an iterator ("next", [n]), or use a mock
        (`_operate`): trusted code on the sample's arguments as data; the reply is its result or
        what it raised (`_raised`). A read of a mock's own record (`call_count`,
        `assert_called_once_with`, `reset_mock`...) is no library's attribute: a sample that
        tries is tampering with the tests, and fails."""
        if (
            len(request) != 5
            or request[1] not in _CALLBACK_OPS
            or type(request[2]) is not int
            or not 0 <= request[2] < len(self.callbacks)
        ):
            raise _SampleGone("a malformed callback request")
        target = self.callbacks[request[2]]
        args, kwargs = _load(request[3], self), _load(request[4], self)
        if type(args) is not list or type(kwargs) is not dict:
            raise _SampleGone("a malformed callback request")
        if request[1] == "getattr" and (len(args) != 1 or type(args[0]) is not str):
            raise _SampleGone("a malformed callback request")
        if request[1] == "getattr" and args[0] in _mock_api():
            raise _SampleGone(f"the sample read the tests' mock's {args[0][:50]!r}", True)
        try:
            message = ("ret", _dump(_operate(target, request[1], args, kwargs), self))
        except Exception as exc:  # noqa: BLE001 - the sample's to catch, as in one process
            message = self._raised(exc)
        try:
            self.channel.send(message)
        except OSError:
            raise _SampleGone("the sample process ended while the tests ran") from None

    def _raised(self, exc):
        """The reply for an exception one of the tests' objects raised (a mock's `side_effect`):
        its name and message, its classes (its MRO, by module and qualname: the sample takes the
        first its process has) and its args."""
        classes = [(str(c.__module__), str(c.__qualname__)) for c in type(exc).__mro__]
        try:
            args = _dump(tuple(exc.args), self)
        except Exception:  # noqa: BLE001 - args that cannot cross: its message alone
            args = _dump((str(exc)[:2000],), self)
        return ("raise", type(exc).__name__, str(exc)[:2000], classes[:64], args)

    def patch(self, target, attribute):
        """The tests patched `attribute` of `target` (`unittest.mock`'s patch, started): the same
        attribute of the same module or class in the sample's process becomes what the patch put
        here, by reference (the sample's calls of it run the mock here, where the tests then
        assert on it). Returns the sample's number for the patch (None: the target is no module
        or class the sample's process has, such as an object of the tests': the patch stays
        here, as before)."""
        where = _patch_target(target, self.namespace)
        if where is None:
            return None
        return self.ask("patch", None, [*where, attribute, getattr(target, attribute)])

    def patch_environ(self, values, clear):
        """`patch.dict(os.environ, values, clear=clear)` started: the same in the sample's
        process (only the values the tests give cross, never this process's environment)."""
        return self.ask("environ", None, [values, clear])

    def unpatch(self, number):
        """A patch the sample's process has (`patch`, `patch_environ`) stopped: undone there."""
        if number is not None and self.gone is None:
            self.ask("unpatch", None, [number])


#: What the sample may do with an object of the tests' (`_Tests._call_back`).
_CALLBACK_OPS = (
    "call",
    "next",
    "getattr",
    "getitem",
    "contains",
    "iter",
    "len",
    "bool",
    "str",
    "enter",
    "exit",
)


def _mock_api():
    """The names of a mock's own record and methods (`call_count`, `assert_called_with`,
    `reset_mock`, ...): none is a library's attribute that honest code reads."""
    mock = sys.modules.get("unittest.mock")
    if mock is None:
        return frozenset()
    return frozenset(n for n in dir(mock.NonCallableMock) if not n.startswith("_"))


def _operate(obj, op, args, kwargs):
    """`op` done to one of the tests' objects for the sample. Attributes only of a mock
    (`unittest.mock`'s): its attributes are children or what the tests configured, while
    another object's attributes lead anywhere (a generator's frame, its globals, `open`); a
    module-level builtin (`os.write`) never crosses. The other operations run the object's own
    code on data."""
    if op == "call":
        return obj(*args, **kwargs)
    if op == "next":
        return _next_items(obj, args)
    if op == "getattr":
        mock = sys.modules.get("unittest.mock")
        if mock is None or not isinstance(obj, mock.NonCallableMock) or args[0][:1] == "_":
            raise AttributeError(f"the tests' {type(obj).__name__} has no {args[0][:50]!r} here")
        value = getattr(obj, args[0])
        if type(value) is type(len) and isinstance(value.__self__, (type(None), type(sys))):
            raise AttributeError(args[0])
        return value
    if op == "getitem" and len(args) == 1:
        return obj[args[0]]
    if op == "contains" and len(args) == 1:
        return args[0] in obj
    if args:
        raise TypeError(f"{op} takes no arguments")
    if op == "iter":
        return iter(obj)
    if op == "len":
        return len(obj)
    if op == "bool":
        return bool(obj)
    if op == "str":
        return str(obj)
    if op == "enter":
        return type(obj).__enter__(obj)
    return type(obj).__exit__(obj, None, None, None)  # "exit"


def _patch_target(target, namespace):
    """How the sample's process finds a patch's target: ("module", name, ""), ("class",
    module, qualname), ("program", "", qualname) for a class the prompt defines or
    ("program", "", "") for the program's own names (the prompt's helper); None for anything
    else."""
    if isinstance(target, type(sys)):
        name = target.__name__
        if name == namespace.get("__name__") and target.__dict__ is namespace:
            return ("program", "", "")  # the tests' own names: the program's, there
        return ("module", name, "") if sys.modules.get(name) is target else None
    if not isinstance(target, type):
        return None
    module, qualname = target.__module__, target.__qualname__
    if module == namespace.get("__name__"):
        found = _program_class(namespace, qualname)
        return ("program", "", qualname) if found is target else None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return ("class", module, qualname) if found is target else None


def _forward_patches(runner):
    """Make `unittest.mock`'s patches (decorators, `with`, `start`/`stop`, `patch.object`,
    `patch.dict(os.environ)`) reach the sample's process as they reach code in one process:
    each patch, once started here, is started there (`_Tests.patch`) and stopped there when it
    stops here. Only in the tests' process, which is this sample's alone."""
    from unittest import mock

    enter, leave = mock._patch.__enter__, mock._patch.__exit__
    start_dict, stop_dict = mock._patch_dict._patch_dict, mock._patch_dict._unpatch_dict

    def forwarded_enter(patcher):
        new = enter(patcher)
        patcher.ckpteval_number = runner.patch(patcher.target, patcher.attribute)
        return new

    def forwarded_exit(patcher, *exc_info):
        number = getattr(patcher, "ckpteval_number", None)
        try:
            return leave(patcher, *exc_info)
        finally:
            runner.unpatch(number)

    def forwarded_start_dict(patcher):
        start_dict(patcher)
        patcher.ckpteval_number = None
        if patcher.in_dict is os.environ:
            values = {str(k): str(v) for k, v in dict(patcher.values).items()}
            patcher.ckpteval_number = runner.patch_environ(values, bool(patcher.clear))

    def forwarded_stop_dict(patcher):
        try:
            stop_dict(patcher)
        finally:
            runner.unpatch(getattr(patcher, "ckpteval_number", None))

    mock._patch.__enter__, mock._patch.__exit__ = forwarded_enter, forwarded_exit
    mock._patch_dict._patch_dict = forwarded_start_dict
    mock._patch_dict._unpatch_dict = forwarded_stop_dict


def _run_test_cases(namespace):
    """BigCodeBench's shape: tests that are `unittest.TestCase` classes and no `check`. Every
    class the tests define runs, as BigCodeBench's harness runs its `TestCases`; a failure or
    an error of any test fails the sample (the first one's traceback is the reason)."""
    import unittest

    cases = [
        value
        for value in list(namespace.values())
        if isinstance(value, type)
        and issubclass(value, unittest.TestCase)
        and value.__module__ == namespace["__name__"]
    ]
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(loader.loadTestsFromTestCase(case) for case in cases)
    result = unittest.TestResult()
    suite.run(result)
    for test, text in result.failures + result.errors:
        raise AssertionError(f"{test.id()}: {text[-2000:]}")
    if not cases:
        raise AssertionError("the tests define no check(candidate) and no unittest.TestCase")


#: Modules whose exceptions mean something to a test runner (a skip, a test framework's own
#: failure): a sample's exception is never one of them.
_RUNNER_MODULES = ("unittest", "pytest", "_pytest", "doctest")


def _exception_class(module, qualname, namespace):
    """The class `module`.`qualname` as the tests know it, if it is an exception a sample may
    raise there: a builtin one, one of a module already imported here (by the tests, the prompt
    or the driver's preload: importing one a sample names would run code on its word), or one the
    prompt defines (the sample's `__main__`, the tests' namespace). Never a test runner's or a
    stopper of iteration (StopIteration crossing a generator means something else)."""
    import builtins

    if module == "builtins":
        cls = getattr(builtins, qualname, None)
    elif module == "__main__":
        cls = namespace.get(qualname.split(".")[0])
        for part in qualname.split(".")[1:]:
            cls = getattr(cls, part, None) if isinstance(cls, type) else None
        prompt = namespace.get("__name__")
        if not isinstance(cls, type) or cls.__module__ != prompt or cls.__qualname__ != qualname:
            return None
        return cls if issubclass(cls, BaseException) else None
    elif module.split(".")[0] in _RUNNER_MODULES or module not in sys.modules:
        return None
    else:
        cls = sys.modules[module]
        for part in qualname.split("."):
            cls = getattr(cls, part, None)
    if not isinstance(cls, type) or not issubclass(cls, BaseException):
        return None
    if issubclass(cls, (StopIteration, StopAsyncIteration)):
        return None
    if cls.__module__.split(".")[0] in _RUNNER_MODULES:
        return None
    return cls


_HACKS = (
    "exit_before_tests",
    "fake_test_report",
    "redefines_assertions",
    "tampers_with_tests",
    "reads_harness_files",
    "always_equal_object",
)


def _format_failure(exc):
    """A traceback without the harness's own frames (this file runs as `<string>`)."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != "<string>"]
    lines = traceback.format_list(frames) if frames else []
    head = ["Traceback (most recent call last):\n"] if lines else []
    return "".join(head + lines + traceback.format_exception_only(type(exc), exc))


def _cache_source(name, source):
    """Let tracebacks quote `source` (compiled as `name`)."""
    import linecache

    linecache.cache[name] = (len(source), None, source.splitlines(True), name)


def _test_names(code):
    """Every name the test code's objects refer to (nested functions included)."""
    names, stack = set(), [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(c for c in current.co_consts if hasattr(c, "co_names"))
    return names


def _import_modules_used(source, namespace, entry):
    """Bind every standard-library module the tests use as one (`math.isclose(...)`) to the real
    module, unless the tests' own code bound the name: such names are never asked of the sample,
    so a sample's `class math` or `math = types.ModuleType('math')` cannot stand in for them."""
    import ast
    import importlib

    used = {
        node.value.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    for name in sorted(used - set(namespace) - {entry}):
        if name in sys.stdlib_module_names:
            try:
                namespace[name] = importlib.import_module(name)
            except ImportError:
                pass  # not on this machine: the tests fail on the name, as they would anywhere


def _run_tests(tests, channel, report_fd):
    """Run the problem's tests against the sample process; report and return the exit status."""
    runner = _Tests(channel)
    _cache_source("<tests>", tests["test"])
    report = {"ok": False}
    try:
        _judge(tests, runner)
        report = {"ok": True}
    except BaseException as exc:  # noqa: BLE001 - any failure of the tests is the sample's
        report = _failed_tests_report(exc)
    gone = runner.gone  # the sample ended: its verdict, whatever the tests caught
    if isinstance(gone, _SampleExited):
        report = {"ok": False, "exception": "", "sample_exit": True, "traceback": str(gone)}
    elif gone is not None:
        report = {"ok": False, "exception": "", "sample_gone": True, "traceback": str(gone)}
        if gone.forged:
            runner._hack("tampers_with_tests")
    report["hacks"] = runner.hacks
    report["compared_object"] = runner.compared
    data = json.dumps(report).encode()[:_MAX_REPORT]
    try:
        os.write(report_fd, data)
    except OSError:
        return 1
    return 0 if report["ok"] else 1


def _judge(tests, runner):
    """The tests' one audited sequence: their namespace, the sample's names in it as proxies,
    their patches forwarded to the sample, the tests, `check(candidate)` (or their
    `unittest.TestCase` classes). Returns if they passed; raises whatever failed them."""
    import builtins

    namespace = _tests_namespace(tests)
    runner.namespace = namespace
    code = compile(tests["test"], "<tests>", "exec", dont_inherit=True)
    entry = tests.get("entry_point")
    _import_modules_used(tests["test"], namespace, entry)
    wanted = sorted(
        n
        for n in _test_names(code) | ({entry} if entry else set())
        if n not in namespace and not hasattr(builtins, n)
    )
    runner.answer(ready=True)  # the program has run (or failed to)
    _bind_sample_names(runner, namespace, wanted)
    if any("mock" in str(tests.get(part) or "") for part in ("prompt", "imports", "setup", "test")):
        _forward_patches(runner)  # no test can patch without naming mock
    exec(code, namespace)
    if entry and "check" not in namespace:
        _run_test_cases(namespace)
    elif entry:
        namespace["check"](runner.named(entry))


def _tests_namespace(tests):
    """The tests' globals before their own code: the prompt's helpers (its imports alone if it
    is a stub that needs its body), without the prompt's stub of the entry point; the tests'
    imports and setup. They are a module's, registered as BigCodeBench's harness registers its
    own, so that `patch(f"{__name__}.helper")` finds them (and is forwarded to the program's)."""
    import builtins

    module = type(sys)("__ckpteval_tests__")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    namespace["__builtins__"] = builtins
    if tests.get("prompt"):
        try:
            exec(compile(tests["prompt"], "<prompt>", "exec", dont_inherit=True), namespace)
        except Exception:  # noqa: BLE001 - a stub that needs its body: its imports suffice
            imports = "\n".join(
                line
                for line in tests["prompt"].splitlines()
                if line.startswith(("import ", "from "))
            )
            exec(compile(imports, "<prompt>", "exec", dont_inherit=True), namespace)
    if tests.get("entry_point"):
        namespace.pop(tests["entry_point"], None)  # the prompt's stub
    for part in ("imports", "setup"):
        if tests.get(part):
            exec(compile(tests[part], "<tests>", "exec", dont_inherit=True), namespace)
    return namespace


def _bind_sample_names(runner, namespace, wanted):
    """Bind the `wanted` names the sample's program defines: callables as proxies, standard-
    library modules it imported as the real module, plain values as the data it sent."""
    found = runner.ask("names", None, wanted)
    if type(found) is not dict:
        runner._gone(_SampleGone("a malformed reply to names"))
    for name, kind in found.items():
        if type(name) is not str or name not in wanted:
            continue
        if kind == "callable":
            namespace[name] = runner.named(name)
        elif kind == ("module", name) and name in sys.stdlib_module_names:
            namespace[name] = __import__(name)  # `import math` in the program, not in the tests
        elif type(kind) is tuple and kind[:1] == ("value",) and len(kind) == 2:
            namespace[name] = kind[1]


def _failed_tests_report(exc):
    """The report of tests that failed with `exc` (raised in the tests, or by the sample)."""
    try:
        text = _format_failure(exc)
    except BaseException:  # noqa: BLE001
        text = type(exc).__name__
    return {"ok": False, "exception": type(exc).__name__, "traceback": text[-4000:]}


def _serve_sample(path, env, tests_path):
    """The sample process: run the program, then answer the test process's calls, forever (the
    driver kills it once the tests ended). Nothing here is trusted by anyone."""
    import functools

    os.environ.clear()
    os.environ.update(env)
    sys.argv = [path]
    channel = _Channel(3, 4)
    server = _SampleServer(path, channel)
    sys.addaudithook(server.hook)
    reply = server.run(server.program)
    if reply[0] == "err" and reply[1] == "MemoryError":
        server.namespace.clear()
    while True:
        try:
            channel.send(reply)
        except BrokenPipeError:  # the tests ended first (e.g. on a reply the sample forged):
            _wait_for_kill()  # an exit now would count as the sample's own, a race
        except BaseException:  # noqa: BLE001 - e.g. the output cap: the tests see it end
            os._exit(1)
        try:
            op, target, args, kwargs = ast.literal_eval(channel.receive_raw().decode())
        except _SampleGone:  # the tests ended: wait for the driver's kill (an exit is the sample's)
            _wait_for_kill()
        # a partial, not a lambda: no frame of ours between the request and the sample's code
        reply = server.run(functools.partial(server.step, op, target, args, kwargs))


_PAUSE = signal.pause  # bound here: the tests may have patched `time.sleep` in this process


def _wait_for_kill():
    """The sample process, once the tests ended: it waits for the driver's kill, so that it
    ends as the driver ends it (its own exit would count as the sample's)."""
    while True:
        _PAUSE()


class _Callback:
    """An object of the tests' (a callable they pass, what a patch put in a module's place, what
    a mock returns), seen from the program: what the program does with it (a call, an
    attribute, items, iteration, `with`, `len`, truth, `str`) is asked of the tests' process,
    which does it (`_operate`) and answers with the result, as data or as another such object
    (`_SampleServer.call_back`). An attribute the program sets stays here: the tests' object is
    never changed by the sample but through its calls."""

    __slots__ = ("_server", "_index", "_local")

    def __init__(self, server, index):
        object.__setattr__(self, "_server", server)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_local", {})

    def _ask(self, op, *args, **kwargs):
        return self._server.call_back(op, self._index, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def __getattr__(self, name):
        if name in _Callback.__slots__:  # unset: `copy` makes one without `__init__`
            raise AttributeError(name)
        if name in self._local:
            return self._local[name]
        if name.startswith("_"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        if name in _Callback.__slots__:
            object.__setattr__(self, name, value)
        else:
            self._local[name] = value

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __contains__(self, item):
        return self._ask("contains", item)

    def __iter__(self):
        return self._ask("iter")

    def __len__(self):
        return self._ask("len")

    def __bool__(self):
        return self._ask("bool")

    def __enter__(self):
        return self._ask("enter")

    def __exit__(self, *exc_info):
        return self._ask("exit")

    def __str__(self):
        return self._ask("str")

    def __repr__(self):
        return f"<tests' object {self._index}>"


#: The tests' requests about the program as a whole (the names they take from it, their
#: patches started and stopped here), and the methods that serve them.
_REQUESTS = {"names": "names", "patch": "patch", "environ": "patch_environ", "unpatch": "unpatch"}


class _SampleServer:
    """The sample process's side of the channel: the program's namespace, the objects it handed
    out (by number), and the hints of hacks its audit hook saw."""

    def __init__(self, path, channel):
        import builtins

        self.path = path
        self.channel = channel
        self.pending = {}  # the exception an iterator raised after the items it sent last
        self.stand_ins = {}
        self.hacks = []
        self.auditing = False
        self.busy = False  # the hook's own calls (sys._getframe) are not the sample's
        self.workdir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
        self.objects = {}
        self.proxies = {}  # the tests' objects, by their number: one object, one proxy
        self.patches = {}  # number -> how to undo a patch of the tests' (`patch`)
        self.mutated = []
        self.namespace = {"__name__": "__main__", "__file__": path, "__builtins__": builtins}

    # -- what the audit hook flags (hints, not proof)

    def flag(self, name):
        if name not in self.hacks:
            self.hacks.append(name)

    def caused_by_sample(self, frame, direct):
        for _ in range(1 if direct else 40):
            if frame is None:
                return False
            if frame.f_code.co_filename == self.path:
                return True
            if str(frame.f_globals.get("__name__", "")).split(".")[0] in _TOOLING:
                return False
            frame = frame.f_back
        return False

    def harness_path(self, name):
        if isinstance(name, int) or name is None:
            return False
        try:
            name = os.path.abspath(os.fsdecode(name))
        except (TypeError, ValueError):
            return False
        workdir = self.workdir
        return name == workdir or name.startswith((workdir + "/", "/proc", "/dev/fd"))

    def hook(self, event, args):
        """What the program does that only a hack would (hints, not proof)."""
        if not self.auditing or self.busy:
            return
        if event in ("open", "os.listdir", "os.scandir"):
            if not (args and self.harness_path(args[0])):
                return
            kind, direct = "reads_harness_files", False
        elif event in _TAMPERING_EVENTS:
            kind, direct = "tampers_with_tests", True
        else:
            return
        self.busy = True
        try:
            if self.caused_by_sample(sys._getframe(1), direct):
                self.flag(kind)
        finally:
            self.busy = False

    # -- the program and the calls

    def refer(self, value):
        ref = len(self.objects)
        self.objects[ref] = value
        info = {"type": type(value).__name__}
        try:
            info["always_equal"] = (value == _Unequal()) is True
        except BaseException:  # noqa: BLE001
            pass
        return ("O", ref, info)

    # -- what `_Outbound` and `_Inbound` ask of this side (see them)

    program_module = "__main__"
    callback_type = _Callback

    def own_callback(self, value):
        return ("K", value._index)

    def enum_extra(self, value):
        return self.refer(value)

    callable = refer

    def iterator(self, value):
        return ("G", self.refer(value)[1])

    def program_class(self, module, qualname):
        if module not in ("__main__", "__ckpteval_tests__"):
            return None
        return _program_class(self.namespace, qualname)

    def program_type(self, module, qualname, _ref, _inbound):
        cls = self.program_class(module, qualname)
        return cls if cls is not None else type(self.stand_in(qualname, None, None))

    def stand_in(self, qualname, _ref, _inbound):
        """An instance of a class the tests define and the program does not: one of a class of
        that name with no methods, its attributes alone (what duck typing needs)."""
        if qualname not in self.stand_ins:
            name = qualname.rsplit(".", 1)[-1]
            cls = type(name, (), {"__module__": "__main__", "__qualname__": qualname})
            self.stand_ins[qualname] = cls
        return object.__new__(self.stand_ins[qualname])

    def fill(self, obj, state):
        _fill(obj, state, False)

    def enum_member(self, module, qualname, name, _extra, _inbound):
        import importlib

        if module in ("__main__", "__ckpteval_tests__"):
            cls = _program_class(self.namespace, qualname)
        else:
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
        return cls.__members__[name]

    def crossing(self, tag, index):
        if type(index) is not int:
            raise TypeError("a malformed reference")
        if tag == "K":
            if index not in self.proxies:
                self.proxies[index] = _Callback(self, index)
            return self.proxies[index]
        if tag == "J":
            return self.pull(index)
        return self.objects[index]

    def pull(self, index):
        """An iterator of the tests', seen from the program (see `_remote_items`)."""
        size = 1
        while True:
            ended, items = self.call_back("next", index, (size,), {})
            yield from items
            if ended:
                return
            size = min(size * 2, _CHUNK)

    def call_back(self, op, index, args, kwargs):
        """Call one of the tests' callables (or take items of an iterator): the tests' process
        runs it and answers; calls the tests make meanwhile are served here first."""
        import functools

        auditing = self.auditing
        self.auditing = False
        try:
            self.channel.send(("cb", op, index, _dump(list(args), self), _dump(kwargs, self)))
            while True:
                try:
                    message = ast.literal_eval(self.channel.receive_raw().decode())
                except _SampleGone:  # the tests ended (they refused this call, or failed)
                    _wait_for_kill()
                if message[0] == "ret":
                    return _load(message[1], self)
                if message[0] == "raise":
                    raise self.tests_exception(message)
                self.channel.send(self.run(functools.partial(self.step, *message)))
        finally:
            self.auditing = auditing

    def tests_exception(self, message):
        """What one of the tests' objects raised ("raise", name, text, classes, args), as an
        exception of this process: the first class of its MRO this process has (a builtin, one
        of a module imported here, one the program defines as the prompt does), made with its
        args, so that `except requests.RequestException` or `except CalledProcessError as e:
        e.returncode` see it as in one process."""
        import builtins

        classes = message[3] if len(message) > 4 else [("builtins", message[1])]
        cls = Exception
        for module, qualname in classes:
            if module == "__ckpteval_tests__":
                found = _program_class(self.namespace, qualname)
            else:
                found = builtins if module == "builtins" else sys.modules.get(module)
                for part in qualname.split("."):
                    found = getattr(found, part, None)
            if isinstance(found, type) and issubclass(found, Exception):
                cls = found
                break
        args = tuple(_load(message[4], self)) if len(message) > 4 else (message[2],)
        try:
            return cls(*args)
        except Exception:  # noqa: BLE001 - an __init__ that wants other arguments
            exc = cls.__new__(cls)
            exc.args = args
            return exc

    def patch(self, kind, module, qualname, attribute, value):
        """Start a patch of the tests' here (`_Tests.patch`): `attribute` of the module, the
        class, the program's class or the program's own names becomes `value`; returns its
        number (None: no such target here)."""
        import importlib

        if kind == "program" and not qualname:
            target = self.namespace
        elif kind == "program":
            target = _program_class(self.namespace, qualname)
        else:
            target = importlib.import_module(module)
            for part in qualname.split(".") if kind == "class" else ():
                target = getattr(target, part)
        if target is None:
            return None
        number = max(self.patches, default=-1) + 1
        if target is self.namespace:
            self.patches[number] = (target, attribute, target.get(attribute, _UNKNOWN))
            target[attribute] = value
        else:
            self.patches[number] = (target, attribute, target.__dict__.get(attribute, _UNKNOWN))
            setattr(target, attribute, value)
        return number

    def patch_environ(self, values, clear):
        number = max(self.patches, default=-1) + 1
        self.patches[number] = (os.environ, None, dict(os.environ))
        if clear:
            os.environ.clear()
        os.environ.update(values)
        return number

    def unpatch(self, number):
        target, attribute, original = self.patches.pop(number)
        if attribute is None:
            target.clear()
            target.update(original)
        elif target is self.namespace:
            if original is _UNKNOWN:
                target.pop(attribute, None)
            else:
                target[attribute] = original
        elif original is _UNKNOWN:
            delattr(target, attribute)
        else:
            setattr(target, attribute, original)

    def lookup(self, ref, _info):
        if type(ref) is tuple and len(ref) == 2 and ref[0] == "name":
            if ref[1] not in self.namespace:
                raise NameError(f"name {ref[1]!r} is not defined")
            return self.namespace[ref[1]]
        return self.objects[ref]

    def failure(self, exc):
        """The reply for an exception the program raised: its name, traceback, classes (its
        MRO, by module and qualname, for the tests to find the first they know), args and
        instance attributes (as data, objects by reference)."""
        try:
            text = _format_failure(exc)
        except BaseException:  # noqa: BLE001
            text = type(exc).__name__
        reply = ("err", type(exc).__name__, list(self.hacks), text[-3000:])
        try:
            classes = [
                (str(c.__module__), str(c.__qualname__))
                for c in type(exc).__mro__
                if issubclass(c, BaseException)
            ]
            args = _dump(tuple(exc.args), self)
            attrs = {
                k: v
                for k, v in getattr(exc, "__dict__", {}).items()
                if type(k) is str and not k.startswith("__")
            }
            attrs.update(_builtin_exception_fields(exc))
            return (*reply, classes, args, _dump(attrs, self))
        except BaseException:  # noqa: BLE001 - args the channel cannot carry: the name only
            return reply

    def run(self, step):
        """Run one step of the program's, audited; its reply."""
        self.auditing = True
        self.mutated.clear()
        try:
            value = step()
            self.auditing = False
            return ("ok", _dump(value, self), list(self.hacks), list(self.mutated))
        except SystemExit as exc:
            self.auditing = False
            return ("exit", exc.code if isinstance(exc.code, (int, str, type(None))) else 1)
        except MemoryError:
            self.auditing = False
            return ("err", "MemoryError", list(self.hacks), "MemoryError")
        except BaseException as exc:  # noqa: BLE001
            self.auditing = False
            return self.failure(exc)

    def changed(self, args, kwargs, sent_args, sent_kwargs):
        """The lists, dicts and sets among the arguments that the call changed (plain data
        only), and the instances of the program's classes (as they are now), for the tests to
        see the change (a test may check an in-place sort, or a linked list reordered)."""
        sent_args = sent_args[1] if sent_args[0] == "X" else sent_args
        sent_kwargs = sent_kwargs[1] if sent_kwargs[0] == "X" else sent_kwargs
        try:
            pairs = [(i, a, sent_args[1][i]) for i, a in enumerate(args)]
            pairs += [(k, v, sent[1]) for (k, v), sent in zip(kwargs.items(), sent_kwargs[1])]
            for key, value, before in pairs:
                if type(value) in (list, dict, set):
                    after = _encode(value, _PlainOnly())
                    if after != before:
                        self.mutated.append((key, after))
                elif type(before) is tuple and before[:1] == ("P",):
                    self.mutated.append((key, _dump(value, self)))
        except (TypeError, IndexError, RecursionError):
            pass

    def program(self):
        with open(self.path, encoding="utf-8") as handle:
            source = handle.read()
        exec(compile(source, self.path, "exec", dont_inherit=True), self.namespace)

    def names(self, *wanted):
        found = {}
        for name in wanted:
            if name not in self.namespace:
                continue
            value = self.namespace[name]
            if type(value).__name__ == "module":
                found[name] = ("module", value.__name__)
            elif callable(value):
                found[name] = "callable"
            else:
                found[name] = ("value", value)
        return found

    def step(self, op, target, sent_args, sent_kwargs):
        """One request of the tests': names, or an operation on one of the program's objects."""
        args, kwargs = _load(sent_args, self), _load(sent_kwargs, self)
        if op in _REQUESTS:
            return getattr(self, _REQUESTS[op])(*args)
        obj = self.lookup(target, None)
        if op == "call":
            result = obj(*args, **kwargs)
            self.auditing = False
            self.changed(args, kwargs, sent_args, sent_kwargs)
            return result
        if op == "bool":
            return bool(obj)
        if op == "len":
            return len(obj)
        if op == "list":
            return list(obj)
        if op == "next":
            if target in self.pending:
                raise self.pending.pop(target)
            size = args[0] if len(args) == 1 and type(args[0]) is int else 1
            items = []
            try:
                while len(items) < min(max(size, 1), _CHUNK):
                    items.append(next(obj))
            except StopIteration:
                return (True, items)
            except Exception as exc:  # noqa: BLE001 - raised after some items: comes after them
                if not items:
                    raise
                self.pending[target] = exc
            return (False, items)
        if op == "getitem":
            return obj[args[0]]
        if op == "getattr":
            return getattr(obj, args[0])
        if op == "str":
            return str(obj)
        raise TypeError(f"unknown request {op!r}")


def _builtin_exception_fields(exc):
    """The fields of `exc` that built-in exception classes keep outside `__dict__` and `args`
    (OSError's `filename`, UnicodeError's `start`, SyntaxError's `lineno`, ...)."""
    fields = {}
    for cls in type(exc).__mro__:
        if cls.__module__ != "builtins" or cls is BaseException:
            continue
        for name, member in vars(cls).items():
            kind = type(member).__name__
            if kind in ("getset_descriptor", "member_descriptor") and not name.startswith("__"):
                try:
                    fields.setdefault(name, getattr(exc, name))
                except AttributeError:  # unset (OSError.characters_written)
                    pass
    return fields


#: Audit events only a program that tampers with the tests' machinery raises.
_TAMPERING_EVENTS = (
    "sys._getframe",
    "sys._current_frames",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sys.settrace",
    "sys.setprofile",
    "sys.addaudithook",
)


class _Unequal:
    """Equal to nothing but itself: what a sample's object is compared with to see whether it
    claims to equal anything."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__


def _judge_unsandboxed(tests_path, program, report_path):
    """`sandbox: none`: the same two processes, one uid, no isolation; the report to a file."""
    calls_r, calls_w = os.pipe()
    replies_r, replies_w = os.pipe()
    sample = os.fork()
    if sample == 0:
        try:
            _keep_fds((calls_r, replies_w))
            _serve_sample(program, dict(os.environ), tests_path)
        finally:
            os._exit(127)
    os.close(calls_r)
    os.close(replies_w)
    with open(tests_path, encoding="utf-8") as handle:
        tests = json.load(handle)
    report_r, report_w = os.pipe()
    status = _run_tests(tests, _Channel(replies_r, calls_w), report_w)
    os.close(report_w)
    report = json.loads(os.read(report_r, _MAX_REPORT + 1) or b"{}")
    ended, sample_status = os.waitpid(sample, os.WNOHANG)
    try:
        os.kill(sample, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if not ended:
        os.waitpid(sample, 0)
    report["sample_status"] = sample_status if ended else None
    with open(report_path, "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    return status


if __name__ == "__main__":
    main()
