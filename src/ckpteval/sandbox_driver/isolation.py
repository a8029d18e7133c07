"""Per-command isolation: a command's own mount and IPC namespaces, its /tmp, its covers."""

import ctypes
import os

from .privileges import _libc, _write_small

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 4096, 8192, 16384, 1 << 18
MS_RDONLY, MS_NOEXEC, MS_REMOUNT = 1, 8, 32
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
    return command["isolation"]


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
    for root, paths, options in _covers(command, spec):
        _cover(root, paths, options)
    for path in command.get("hide", ()):
        if os.path.isfile(path):  # e.g. a judged run's tests in the command's own directory
            _mount("/dev/null", path, None, MS_BIND)
    _limit_ipc(command["tmp_bytes"])
    if spec.get("rootless"):
        _own_proc()


def _own_proc():
    """Rootless, a /proc of the command's own: the /proc files of a process that is not
    dumpable (the driver, the zygote, a judged run's tests) belong to the namespace's root,
    which is the command's uid, and those that check only file modes (`oom_score_adj`,
    `coredump_filter`, `clear_refs`, `autogroup`) took a command's writes, which the next
    command read back (a channel between samples, and the driver made the first OOM victim or
    niced to 19). With `hidepid=2` (invisible) a command sees no process it could not trace, so
    none of these; and /proc/sys is read-only, as its IPC namespace's sysctls, also the
    command's, would lift `_limit_ipc`'s bounds."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    _mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
    _mount(None, "/proc/sys", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC)


def _covers(command, spec):
    """Each root the command's mount namespace covers (`_visible`), the paths it shows of it and
    its tmpfs's options: `/tmp` the command's size and mode 1777, the work directory 64 KiB."""
    covers = []
    for root, paths in _visible(command, spec).items():
        size, mode = (command["tmp_bytes"], "1777") if root == "/tmp" else (1 << 16, "0755")
        covers.append((root, paths, f"size={size},mode={mode}"))
    return covers


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
    for path, text in _ipc_settings(shm_bytes):
        _write_small(path, text)


def _ipc_settings(shm_bytes):
    """`_limit_ipc`'s writes: (the setting's path, its text)."""
    page = os.sysconf("SC_PAGE_SIZE")
    return [
        (f"/proc/sys/kernel/{name}", f"{value}\n")
        for name, value in (
            ("shmmax", shm_bytes),
            ("shmall", max(1, shm_bytes // page)),
            ("shmmni", _SHM_SEGMENTS),
            ("msgmni", _MSG_QUEUES),
            ("sem", _SEMAPHORES),
        )
    ]
