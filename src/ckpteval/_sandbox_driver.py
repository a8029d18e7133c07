"""Runs inside one bubblewrap sandbox, as its root (a few capabilities, no others), and executes
many commands one after another; `ckpteval.sandbox.Sandbox.run_many` starts it.

Standard library only: it runs under the base interpreter with `-I -S`, passed as `-c` source.

For each command: fork; in the child, a new session, the command's stdin/stdout/stderr files,
its rlimits, no groups, the sandbox uid, `no_new_privs`, exec. The driver waits up to the wall
limit (a pidfd), kills the command's process group on overrun, then kills every other process
in the pid namespace (strays that left the group) and empties /tmp, so the next command starts
from the same state. Commands cannot signal, trace or overwrite the driver: it runs as another
uid, and the results file lives in a directory only root can enter.

A command's `cpu_s` is the CPU time of its whole process tree, exactly: the driver is a child
subreaper (PR_SET_CHILD_SUBREAPER), so every process a command leaves behind (orphans included)
is re-parented to it and reaped by it once the cleanup has killed them, and the growth of the
driver's RUSAGE_CHILDREN over the command is the user + system time of every process the command
started (the kernel's per-task accounting, not a sample of the clock, so load does not change it).

A command with `python_file` runs that file in a fork of this interpreter instead of exec'ing a
new one (Python start-up costs more than most tests take); the fork drops privileges first, like
any command.

argv: spec.json. spec: {"uid", "results", "preload": [module, ...], "commands": [{"argv", "python_file", "cwd", "env",
"stdin", "stdout", "stderr", "wall_s", "rlimits": {"RLIMIT_AS": n, ...}}]}. One JSON result line
per command.
"""

import ctypes
import json
import os
import resource
import select
import shutil
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)


def _child(command, uid):
    os.setsid()
    stdin = os.open(command["stdin"] or os.devnull, os.O_RDONLY)
    stdout = os.open(command["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stderr = os.open(command["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.closerange(3, 1 << 16)  # the driver's files (results!) must not reach a forked command
    os.chdir(command["cwd"])
    for name, (soft, hard) in command["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        os._exit(126)
    if command.get("python_file"):
        _exec_python(command["python_file"], command["env"])
    # CPython ignores these at start-up and an ignored signal survives exec: a program must get
    # SIGXFSZ at the output cap and SIGPIPE on a closed pipe like from any shell.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    os.execvpe(command["argv"][0], command["argv"], command["env"])


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


def _run(command, uid):
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    if pid == 0:
        try:
            _child(command, uid)
        except BaseException as exc:  # noqa: BLE001 - report why, like a shell's 127
            os.write(2, f"sandbox: cannot run {command['argv'][0]}: {exc}\n".encode())
        finally:
            os._exit(127)
    pidfd = os.pidfd_open(pid)
    ready, _, _ = select.select([pidfd], [], [], command["wall_s"])
    timed_out = not ready
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status, usage = os.wait4(pid, 0)
    os.close(pidfd)
    duration = time.monotonic() - start
    _clean()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process of the command reaped
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"status": status, "timed_out": timed_out, "duration_s": duration,
            "cpu_s": cpu_s, "max_rss_bytes": usage.ru_maxrss * 1024}


def _protected_paths():
    """Mount points under /tmp and the directories leading to them: never emptied."""
    protected = set()
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            mount_point = line.split()[4]
            while mount_point.startswith("/tmp/"):
                protected.add(mount_point)
                mount_point = os.path.dirname(mount_point)
    return protected


_PROTECTED = _protected_paths()


def _clean():
    """Kill whatever the command left running, reap it (its CPU time counts), empty /tmp."""
    me = os.getpid()
    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(-1, signal.SIGKILL)  # every process but the namespace's init and this one
        except ProcessLookupError:
            pass
        _reap()
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"processes survived the cleanup: {others}")
        time.sleep(0.001)
    for entry in os.scandir("/tmp"):
        if entry.path in _PROTECTED:
            continue  # a bind of the host (work dir, results) or a directory leading to one
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass


def _reap():
    """Reap every child that has ended: the command's orphans are re-parented to the driver."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become the commands' subreaper: CPU times would miss orphans")
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    for module in spec.get("preload", []):
        __import__(module)  # imported once here instead of once per forked Python command
    with open(spec["results"], "w") as results:
        for command in spec["commands"]:
            results.write(json.dumps(_run(command, spec["uid"])) + "\n")
            results.flush()


if __name__ == "__main__":
    main()
