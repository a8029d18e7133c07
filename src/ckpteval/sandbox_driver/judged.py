"""Judged Python runs

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

import json
import os
import resource
import select
import signal
import time

from .accounting import _oom_first, _Usage, _wait
from .channel import _Channel
from .judge import _MAX_REPORT, _run_tests
from .privileges import (
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    _drop_capabilities,
    _keep_fds,
    _libc,
    _read_small,
)
from .sample import _serve_sample
from .spawn import _child, _clean, _kill_group, _Outputs, _row

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
    outputs = _Outputs()
    sample, tester, report_r = _start_judged(command, uid, spec, outputs)
    pidfd = os.pidfd_open(tester)
    report, timed_out = _collect_report(command, pidfd, report_r, start, usage_of)
    # Did the sample end on its own while the tests needed it? (before we kill it)
    judge = _judge_report(report)
    ended, sample_status, sample_usage = _sample_fate(sample, judge.get("sample_gone") is True)
    _kill_group(tester)
    _kill_group(sample, reaped=bool(ended))
    _, status, usage = os.wait4(tester, 0)
    if not ended:
        _, _, sample_usage = os.wait4(sample, 0)
    os.close(pidfd)
    duration = time.monotonic() - start
    _clean()
    judge["sample_status"] = sample_status if ended else None
    judge["sample_cpu_s"] = sample_usage.ru_utime + sample_usage.ru_stime
    max_rss = max(usage.ru_maxrss, sample_usage.ru_maxrss) * 1024
    row = {**_row(command, usage_of, status, timed_out, duration, max_rss), "judge": judge}
    return outputs.save(row, command, spec)


def _start_judged(command, uid, spec, outputs):
    """Fork the sample process (`outputs`: its stdout and stderr) and the test process, joined
    by two pipes; returns their pids and the read end of the test process's report pipe."""
    calls_r, calls_w = os.pipe()  # test -> sample
    replies_r, replies_w = os.pipe()  # sample -> test
    report_r, report_w = os.pipe()  # test -> driver
    ends = outputs.ends()
    sample = os.fork()
    if sample == 0:
        try:
            _child(command, uid, spec, ends, keep=(calls_r, replies_w))
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"sandbox: cannot run {command['argv'][0]}: {exc}\n".encode())
        finally:
            os._exit(127)
    for fd in ends:  # not the test process's
        os.close(fd)
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
    tests = json.loads(_read_small(command["python_tests"]).decode("utf-8"))
    os.chdir("/")
    for name, (soft, hard) in command["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    _drop_capabilities()
    # Rootless, the sample process has this uid too: not dumpable, it cannot be traced or read.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return 126
    return _run_tests(tests, _Channel(3, 4), 5)


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
