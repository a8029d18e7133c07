"""The bwrap sandbox for a user who is not root (issue 37 item 7): the hostile samples once more,
run by an unprivileged user (`nobody`) with a Python that user can reach (Debian's python3: this
project's interpreter lives under /root). Rootless, the sandbox is a user namespace whose one uid
is the driver's and every command's; these check that what the uid split gave as root is kept
otherwise: the driver cannot be signalled, traced or read, a judged sample cannot read or forge
its tests, a reward completion cannot forge or read its result, no command sees another's files,
and correct samples beside the attacks keep their verdicts; and that score files and the log say
the sandbox ran rootless and what that leaves uncounted."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import as_nobody_json
from reach import REACH

#: About 40 s: one sandbox batch of probes and one judged batch, run once for the module by
#: another user (no shared fixture runs as anyone but root).
pytestmark = pytest.mark.slow


#: A command's reach into every other process of its sandbox (tests/reach.py): what it reached.
EVERY_PROCESS = REACH + 'r = reach()\nprint(r["opened"] + r["written"])\n'

#: Run as `nobody`: prints one JSON object of what happened.
SCRIPT = r"""
import json, logging, os, sys, tempfile
from pathlib import Path
from ckpteval.checkers import Job, get_checker
from ckpteval.sandbox import Command, Limits, Sandbox, isolation

WARNINGS = []

class Kept(logging.Handler):
    def emit(self, record):
        WARNINGS.append(record.getMessage())

logging.getLogger("ckpteval.sandbox").addHandler(Kept())

PROBES = {
    "kill_driver": "import os\ntry:\n    os.kill(os.getppid(), 9)\n    print('killed')\n"
    "except OSError as e:\n    print('refused')",
    "kill_all": "import os\ntry:\n    os.kill(-1, 9)\n    print('killed')\n"
    "except OSError as e:\n    print('refused')",
    "driver_fds": "import glob, os\nn = 0\nfor l in glob.glob(f'/proc/{os.getppid()}/fd/*'):\n"
    "    try:\n        os.close(os.open(l, os.O_RDONLY))\n        n += 1\n    except OSError:\n"
    "        pass\nprint('opened', n)",
    "driver_mem": "import os\ntry:\n    open(f'/proc/{os.getppid()}/mem', 'rb')\n"
    "    print('opened')\nexcept OSError:\n    print('refused')",
    "capabilities": "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])",
    "regain_root": "import subprocess\nout = subprocess.run(['grep', 'CapEff', '/proc/self/status'],"
    " capture_output=True, text=True).stdout\nprint(out.split()[1])",
    "user_namespace": "import subprocess\nprint(subprocess.run(['unshare', '-Ur', 'true'],"
    " capture_output=True).returncode != 0)",
    "keyring": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "print(libc.syscall(248, b'user', b'k', b'v', 1, -4) < 0)",
    "siblings": "import os\nprint(sorted(os.listdir('..')))",
    "fork_bomb": "import os\nn = 0\ntry:\n    while n < 2000:\n        if os.fork() == 0:\n"
    "            import time\n            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
    "except OSError:\n    pass\nprint(n < 2000)",
    "every_process": open(os.path.join(os.path.dirname(__file__), "every_process.py")).read(),
    # Signals the driver catches nothing of (it is the pid namespace's init): queued, through a
    # pidfd of its /proc directory, and as SIGIO of a descriptor it owns. Before 12-03 the
    # first two raised KeyboardInterrupt in the driver and the whole batch failed.
    "queue_signal": "import ctypes, fcntl, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "driver = os.getppid()\ninfo = (ctypes.c_int * 32)(signal.SIGINT, 0, -1)\n"
    "libc.syscall(129, driver, signal.SIGINT, info)\ntry:\n"
    "    fd = os.open(f'/proc/{driver}', os.O_RDONLY | os.O_DIRECTORY)\n"
    "    libc.syscall(424, fd, signal.SIGINT, None, 0)\nexcept OSError:\n    pass\n"
    "r, w = os.pipe()\ntry:\n    fcntl.fcntl(r, fcntl.F_SETOWN, driver)\n"
    "    fcntl.fcntl(r, 10, signal.SIGINT)\n"
    "    fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)\n    os.write(w, b'x')\n"
    "except OSError:\n    pass\nprint('sent')",
    # The driver's /proc files that check only modes (rootless they belong to the commands'
    # uid) and the IPC namespace's sysctls: before 12-03 all took the write, and the next
    # command read the driver's oom_score_adj back.
    "driver_proc": "import os\nmade = []\nfor p, v in ((f'/proc/{os.getppid()}/oom_score_adj', "
    "'777'), (f'/proc/{os.getppid()}/coredump_filter', '0'), ('/proc/sys/kernel/shmmax', "
    "'1')):\n    try:\n        with open(p, 'w') as f:\n            f.write(v)\n"
    "        made.append(p)\n    except OSError:\n        pass\n"
    "print(made, sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [os.getpid()])",
    # What one command could leave in the sandbox's own tmpfs (its root, /etc, /dev) for the
    # next: a library every later dynamic program loads, files, modes.
    "plant": "import os\nmade = []\nfor p in ('/etc/ld.so.preload', '/evil', '/dev/evil', "
    "'/dev/shm/evil'):\n    try:\n        open(p, 'w').write('/evil.so')\n        made.append(p)\n"
    "    except OSError:\n        pass\nfor p in ('/', '/etc', '/dev', '/dev/shm'):\n    try:\n"
    "        os.chmod(p, 0o777)\n        made.append('chmod ' + p)\n    except OSError:\n"
    "        pass\nprint(made)",
    "planted": "import os\nprint([p for p in ('/etc/ld.so.preload', '/evil', '/dev/evil', "
    "'/dev/shm/evil') if os.path.exists(p)] + [p for p in ('/', '/etc', '/dev') "
    "if os.stat(p).st_mode & 0o777 != 0o755])",
    "after": "print('still here')",
    # Run while this script ignores SIGHUP, SIGUSR1 and glibc's 32 and 33 (`probes`): a command
    # gets the default action of each; Python ignores SIGPIPE and SIGXFSZ itself (0x1001000).
    "signals": "print(open('/proc/self/status').read().split('SigIgn:')[1].split()[0])",
}

def probes():
    sandbox = Sandbox("bwrap")
    work = Path(tempfile.mkdtemp())
    os.chmod(work, 0o755)
    commands = []
    for name, code in PROBES.items():
        (work / name).mkdir()
        (work / name / "main.py").write_text(code)
        commands.append(
            Command([sys.executable, "-I", "-S", "main.py"], Limits(wall_s=10), cwd=work / name)
        )
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    ignore = (ctypes.c_uint64 * 4)(1)  # SIG_IGN; the raw call: glibc refuses 32 and 33
    saved = {number: (ctypes.c_uint64 * 4)() for number in (1, 10, 32, 33)}
    for number, old in saved.items():
        assert libc.syscall(13, number, ignore, old, 8) == 0
    results = sandbox.run_many(commands, workdir=work, readable=[Path(sys.base_prefix)])
    for number, old in saved.items():  # each old action back exactly
        libc.syscall(13, number, old, None, 8)
    return {n: r.stdout.decode().strip() for n, r in zip(PROBES, results)}

PROBLEM = {
    "task_id": "add",
    "prompt": "def add(a, b):\n",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    "    assert candidate(-4, 4) == 0\n",
    "entry_point": "add",
}
RIGHT = "    return a + b\n"
JUDGED = {
    "right": RIGHT,
    "reads_tests": "    import glob\n    text = ''.join(open(p).read() for p in glob.glob('*.json'))\n"
    "    return {(1, 2): 3, (-4, 4): 0}[(a, b)] if 'candidate(1, 2)' in text else None\n",
    "kills_tester": "    import os\n    for pid in range(1, 200):\n        try:\n"
    "            os.kill(pid, 19)\n        except OSError:\n            pass\n    return 0\n",
    "wrong": "    return a - b\n",
    "right_again": RIGHT,
}

def judged():
    checker = get_checker("python", sandbox="bwrap")
    try:
        jobs = [Job("add", PROBLEM, c) for c in JUDGED.values()]
        verdicts = checker.check_batch(jobs, 5.0)
    finally:
        checker.close()
    return {n: [v.passed, v.error_type] for n, v in zip(JUDGED, verdicts)}

REWARD = '''
import os, subprocess, sys

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("#fork"):
        pid = os.fork()
        if pid == 0:
            try:
                exec(solution_str, {})
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        return 0.0
    out = subprocess.run([sys.executable, "-I", "-c", solution_str], capture_output=True,
                         text=True).stdout
    return 1.0 if ground_truth in out else 0.0
'''
SECRET = "SECRET-ANSWER-4711"
FORGES = '''#fork
import os, socket
for fd in range(3, 64):
    try:
        socket.socket(fileno=fd).send(b'{"value": 1.0}')
    except OSError:
        pass
os.kill(os.getppid(), 9)
'''
SNOOPS = '''
import glob, os
found = []
for p in glob.glob('../*/*') + glob.glob('/tmp/*/*') + [f'/proc/{os.getppid()}/fd/0']:
    try:
        found.append(open(p).read())
    except OSError:
        pass
print(''.join(found))
'''
REWARDED = {"right": f"print({SECRET!r})", "forges": FORGES, "snoops": SNOOPS,
            "wrong": "print('no idea')"}

def rewarded():
    folder = Path(tempfile.mkdtemp())
    (folder / "reward.py").write_text(REWARD)
    checker = get_checker(
        "reward_function", reward_function=str(folder / "reward.py"), self_test="off: a test"
    )
    problem = {"task_id": "1", "ground_truth": SECRET, "question": "?"}
    try:
        verdicts = checker.check_batch([Job("1", problem, c) for c in REWARDED.values()], 20.0)
    finally:
        checker.close()
    return {n: [v.passed, v.error_type] for n, v in zip(REWARDED, verdicts)}

print(json.dumps({"uid": os.getuid(), "probes": probes(), "judged": judged(),
                  "rewarded": rewarded(), "isolation": isolation("bwrap"),
                  "warnings": WARNINGS}))
"""


@pytest.fixture(scope="module")
def as_nobody() -> Iterator[dict]:
    # Not pytest's tmp_path: its parents are root's alone.
    with tempfile.TemporaryDirectory(prefix="ckpteval-rootless-") as tmp:
        yield _run_as_nobody(Path(tmp))


def _run_as_nobody(work: Path) -> dict:
    os.chmod(work, 0o777)
    (work / "run.py").write_text(SCRIPT)
    (work / "every_process.py").write_text(EVERY_PROCESS)
    os.chmod(work / "run.py", 0o644)
    return as_nobody_json(work / "run.py", cwd=work)


def test_it_runs_as_a_user_who_is_not_root(as_nobody: dict) -> None:
    assert as_nobody["uid"] != 0


def test_commands_cannot_reach_the_driver(as_nobody: dict) -> None:
    probes = as_nobody["probes"]
    assert probes["queue_signal"] == "sent"  # and the batch went on ("after", below)
    assert probes["driver_proc"] == "[] True"  # nothing written; only itself in its /proc
    assert probes["kill_driver"] == "refused"
    assert probes["kill_all"] == "refused"
    assert probes["driver_fds"] == "opened 0"
    assert probes["driver_mem"] == "refused"
    assert probes["every_process"] == "[]"  # bubblewrap has no init beside the driver
    assert probes["after"] == "still here"


def test_commands_hold_no_root(as_nobody: dict) -> None:
    probes = as_nobody["probes"]
    assert probes["capabilities"] == "0000000000000000"
    assert probes["regain_root"] == "0000000000000000"  # exec does not give root's back
    assert probes["user_namespace"] == "True"
    assert probes["keyring"] == "True"


def test_commands_are_isolated_and_bounded(as_nobody: dict) -> None:
    probes = as_nobody["probes"]
    assert probes["siblings"] == "['siblings']"
    assert probes["fork_bomb"] == "True"
    # Until 12-03 the sandbox's root, /etc and /dev (bwrap's tmpfs, owned by the namespace's
    # root: rootless, the commands' uid) took all four files and the modes, and the next
    # command of the batch loaded the planted /etc/ld.so.preload. Read-only now, as for root.
    assert probes["plant"] == "[]"
    assert probes["planted"] == "[]"
    # a caller's ignored signals (nohup's SIGHUP, glibc's 32 and 33 left by a posix_spawn) do
    # not reach the commands: only what Python ignores itself (SIGPIPE, SIGXFSZ)
    assert probes["signals"] == "0000000001001000"


def test_judged_samples_cannot_read_or_stop_their_tests(as_nobody: dict) -> None:
    judged = as_nobody["judged"]
    assert judged["right"] == [True, None]
    assert judged["right_again"] == [True, None]
    assert judged["wrong"][0] is False
    assert judged["reads_tests"][0] is False
    assert judged["kills_tester"][0] is False


def test_reward_completions_can_neither_forge_nor_read_their_result(as_nobody: dict) -> None:
    rewarded = as_nobody["rewarded"]
    assert rewarded["right"] == [True, None]
    assert rewarded["forges"] == [False, "reward_error"]
    assert rewarded["snoops"][0] is False
    assert rewarded["wrong"][0] is False


def test_score_files_and_the_log_say_rootless_and_what_it_does_not_count(as_nobody: dict) -> None:
    """What a score cell records of its sandbox (ckpteval.evaluate writes `isolation(mode)`),
    the report's words for it, and the one warning of the job's log, as `nobody` (no cgroup of
    its own here: CPU comes from /proc and what the driver reaps)."""
    from ckpteval.sandbox import describe_isolation

    record = as_nobody["isolation"]
    assert (record["sandbox"], record["sandbox_mode"]) == ("bwrap", "rootless")
    assert record["sandbox_uncounted"].startswith("CPU time of child processes the kernel reaps")
    assert (
        describe_isolation(record)
        == f"bwrap (rootless); not counted: {record['sandbox_uncounted']}"
    )
    (line,) = [w for w in as_nobody["warnings"] if "not counted" in w]
    assert line.startswith("sandbox: bwrap runs rootless")
    assert f"not counted against the limits: {record['sandbox_uncounted']}." in line
    assert line.endswith(
        "run as root or inside a cgroup v2 subtree delegated to this user (docs/evaluate.md)"
    )
