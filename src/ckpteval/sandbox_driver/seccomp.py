"""Kernel state a sample may not hold: the seccomp filter that refuses it."""

import ctypes
import os
import struct

from .privileges import _libc

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
    _kernel_state_filter(protect, ipc).install()


def _kernel_state_filter(protect=(), ipc=False):
    """`_refuse_kernel_state`'s filter, assembled once per process and kept (`_FILTERS`): the
    driver assembles its commands' before its first fork (`loop.main`), so that each forked
    command only installs it (assembling it there cost each sample ~0.4 ms of its CPU)."""
    key = (tuple(protect), ipc)
    if key not in _FILTERS:
        _FILTERS[key] = _Filter(protect, ipc)
    return _FILTERS[key]


#: `_refuse_kernel_state`'s filters by (protect, ipc), as assembled in this process or the one it
#: was forked from: plain bytes that only the process installing one reads.
_FILTERS = {}


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
