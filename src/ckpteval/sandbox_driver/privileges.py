"""What a driver's process keeps and gives up: libc's `prctl`, root's capabilities, inherited
descriptors and ignored signals.
"""

import ctypes
import fcntl
import os
import signal

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)


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


#: rt_sigaction's system call number by machine (none known: glibc's two stay as inherited)
_SYS_RT_SIGACTION = {"x86_64": 13, "aarch64": 134}.get(os.uname().machine)
#: the size of the kernel's signal set
_SIGSET_BYTES = 8


def _default_inherited_signals():
    """Give back the default action of every signal this driver was started with ignored (by
    nohup: SIGHUP; by a glibc posix_spawn up the process tree, such as GNU make's: its internal
    32 and 33), but the three Python and the driver keep ignored themselves (SIGINT, SIGPIPE,
    SIGXFSZ; each command gets those back in `_child` or the launcher's spawn). An ignored signal
    survives fork and exec: without this a forked command had them ignored where the launcher,
    which resets every signal, did not, and where a fresh shell's program does not. glibc's
    `sigaction` refuses its own two signals (32, 33): those by the system call, when ignored
    only (a handler glibc installed is kept; it installs one before it uses them)."""
    with open("/proc/self/status") as handle:
        line = next((line for line in handle if line.startswith("SigIgn:")), "SigIgn: 0")
    ignored = int(line.split()[1], 16)
    kept = {signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ}
    known = signal.valid_signals()
    default = (ctypes.c_uint64 * 4)()  # handler SIG_DFL, no flags, no restorer, an empty mask
    for number in range(1, 65):
        if not ignored >> (number - 1) & 1 or number in kept:
            continue
        if number in known:
            signal.signal(number, signal.SIG_DFL)
        elif _SYS_RT_SIGACTION is not None:  # a failure leaves it ignored, as it came
            _libc.syscall(_SYS_RT_SIGACTION, number, default, None, _SIGSET_BYTES)


def _keep_fds(keep):
    """Close every fd from 3 up, except `keep`, which become 3, 4, ..."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in keep]  # above every target
    for target, fd in enumerate(high, start=3):
        os.dup2(fd, target)
    os.closerange(3 + len(keep), 1 << 16)


def _write_small(path, text):
    """Write `text` to a kernel setting (/proc/self/oom_score_adj, /proc/sys/...) by `os.open` and
    `os.write`. A forked command's process writes several before any of its code runs, and its
    first `open()` costs ~0.3 ms of first touches of the io layers (copy-on-write faults, measured
    in a fork of the driver) that these calls do not pay."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_small(path):
    """A file's bytes by `os.open` and `os.read` (see `_write_small`): a judged run's tests or
    program, read by a process just forked."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _drop_capabilities():
    """Every capability of this process, gone: uid 0 that is no more than any other uid."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
