"""A sandboxed command's reach into every other process it can list, as Python source that
hostile test programs include (`REACH`): the reward zygote's samples (test_reward_zygote) and
plain commands run by a user who is not root (test_sandbox_rootless)."""

#: Defines `reach(marker=b"")`: for every other process of /proc (pid 1 too: bubblewrap's own
#: init once, rootless of the commands' uid and dumpable), trace it, write its memory, enter its
#: root (a mount namespace where the driver's files are not covered), read and write each of its
#: descriptors (searching them for `marker`), copy them with pidfd_getfd, and open the driver's
#: results file through its root. Returns {"opened": [...], "written": [...], "found": n}.
REACH = r"""
import ctypes as _ctypes, os as _os

_reach_libc = _ctypes.CDLL(None, use_errno=True)


def reach(marker=b""):
    opened, written, found = set(), set(), 0
    for pid in _os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == _os.getpid():
            continue
        comm = open(f"/proc/{pid}/comm").read().strip()
        if _reach_libc.ptrace(16, int(pid), None, None) == 0:  # PTRACE_ATTACH: it runs our code
            written.add(f"{comm} (ptrace)")
            _os.waitpid(int(pid), 0x40000000)  # __WALL: until it stops, then let it go on
            _reach_libc.ptrace(17, int(pid), None, None)
        try:
            open(f"/proc/{pid}/mem", "r+b").close()
            written.add(f"{comm} (mem)")
        except OSError:
            pass
        try:  # its root: a mount namespace where what a command's own covers is visible
            _os.listdir(f"/proc/{pid}/root/")
            opened.add(f"{comm} (root)")
        except OSError:
            pass
        for arg in open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0"):
            if arg.endswith("spec.json"):  # the driver's: its results file is beside it
                try:  # opened, not written: the run must still end to report
                    open(f"/proc/{pid}/root{_os.path.dirname(arg)}/results.jsonl", "ab").close()
                    written.add(f"{comm} (results)")
                except OSError:
                    pass
        try:
            fds = _os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            where = f"{comm} {fd}"
            try:
                with open(f"/proc/{pid}/fd/{fd}", "rb") as handle:
                    opened.add(where)
                    found += bool(marker) and marker in handle.read(1 << 20)
            except OSError:
                pass
            try:
                with open(f"/proc/{pid}/fd/{fd}", "ab") as handle:
                    handle.write(b"\nsandbox: warm zygote gone (forged by a sample)\n")
                    written.add(where)
            except OSError:
                pass
            pidfd = _reach_libc.syscall(434, int(pid), 0)  # pidfd_open, then pidfd_getfd
            if pidfd >= 0:
                if _reach_libc.syscall(438, pidfd, int(fd), 0) >= 0:
                    written.add(where + " (pidfd_getfd)")
                _os.close(pidfd)
    return {"opened": sorted(opened), "written": sorted(written), "found": found}
"""
