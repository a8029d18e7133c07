"""The command loop: run each command of the spec, one after another, and write its result line."""

import json
import os
import signal
import sys
import time

from .accounting import _Account, _Cgroup, _Usage, _wait
from .judged import _JUDGE_PRELOAD, _judge_unsandboxed, _run_judged
from .privileges import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    _default_inherited_signals,
    _libc,
)
from .seccomp import _kernel_state_filter
from .spawn import _child, _clean, _kill_group, _launches, _Outputs, _ResultChannel, _row, _spawn
from .zygote import _find_at_fork_hooks, _Zygote


def _run(command, uid, spec, account):
    if command.get("python_tests"):
        return _run_judged(command, uid, spec, account)
    start = time.monotonic()
    usage_of = _Usage(command, account)
    channel = _ResultChannel() if command.get("result_channel") else None
    outputs = _Outputs()
    ends = outputs.ends()
    pid = None
    if _launches(command, spec):
        try:
            pid = _spawn(command, uid, spec, ends)
        except OSError as exc:  # the launcher cannot start: this command and the next fork
            os.write(2, f"sandbox: launcher failed ({exc}); commands start by fork\n".encode())
            spec["launcher"] = None
        except ValueError:  # text the launcher cannot take: this command forks (and fails so)
            pass
    if pid is None:
        pid = os.fork()
    if pid == 0:
        try:
            _child(command, uid, spec, ends, keep=channel.child_end() if channel else ())
        except BaseException as exc:  # noqa: BLE001 - report why, like a shell's 127
            os.write(2, f"sandbox: cannot run {command['argv'][0]}: {exc}\n".encode())
        finally:
            os._exit(127)
    for fd in ends:
        os.close(fd)
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
    return outputs.save(row, command, spec)


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


def _claim(directory, name):
    """Claim a command before running it (`ckpteval.sandbox.Claims`): whether it is still this
    batch's, as opposed to taken by the host for another worker (its file made first)."""
    try:
        os.close(os.open(os.path.join(directory, name), os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def main():
    if sys.argv[1] == "--judge":  # then the site directories of `evaluate.python_env`, if any
        _preload(sys.argv[5:], ())
        sys.exit(_judge_unsandboxed(*sys.argv[2:5]))
    # No signal handler: the driver is its pid namespace's init, and the kernel drops any signal
    # an init does not catch when it comes from inside (kill, sigqueue, a pidfd, SIGIO through
    # F_SETOWN alike). CPython's SIGINT handler was the one it caught: rootless, a command
    # raised KeyboardInterrupt in the driver (rt_sigqueueinfo, pidfd_send_signal of /proc/1)
    # and its whole batch failed. Its children (the zygote, a judged run's tests) keep it
    # ignored; each command gets Python's own back (`_child`, `_zygote_sample`).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _default_inherited_signals()
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
    # The commands' seccomp filter (`_child` protects its parent, this driver, when rootless).
    _kernel_state_filter((os.getpid(),) if spec.get("rootless") else ())
    import gc

    gc.freeze()  # a fork's collections never walk (so never copy) the preloaded heap
    zygote = _Zygote.start(spec, account)
    commands = spec["commands"]
    with open(spec["results"], "w") as results:
        for i, command in enumerate(commands):
            if spec.get("claims") and not _claim(spec["claims"], command["claim"]):
                break  # another worker took this command and every later one
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


if __name__ == "__main__":
    main()
