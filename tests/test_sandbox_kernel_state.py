"""Nothing a sample leaves in the kernel reaches a later sample, batch or run: each probe plants
state in one kernel-held place (keyrings, SysV and POSIX IPC, abstract sockets, memfds,
/dev/shm, a user namespace's own mounts) and the next command of the batch, a command of the
next batch (which may get the same sandbox uid) and the next run look for it. Real bubblewrap,
real kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import STARTS, sandbox_starting_by

from ckpteval.checkers.python import python_interpreter
from ckpteval.sandbox import Command, Limits, RunResult, Sandbox

PYTHON, PREFIX = python_interpreter()

LIBC = "import ctypes, os, socket, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
#: x86_64 numbers; the probes are skipped elsewhere.
KEYS = (
    "ADD_KEY, REQUEST_KEY, KEYCTL = 248, 249, 250\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def plant():\n"
    "    r = libc.syscall(ADD_KEY, b'user', b'ckpteval-probe', b'answer 42', 9, -4)\n"
    "    return 'planted' if r >= 0 else f'refused {ctypes.get_errno()}'\n"
    "def look():\n"
    "    r = libc.syscall(KEYCTL, 10, -4, b'user', b'ckpteval-probe', 0)\n"  # KEYCTL_SEARCH
    "    return 'found' if r >= 0 else 'absent'\n"
)

#: Each place: (code that plants, prints 'planted' when it could; code that prints 'found' or
#: 'absent'). A planter may also be refused outright: that is fine too.
PLACES = {
    "keyring": (LIBC + KEYS + "print(plant())\n", LIBC + KEYS + "print(look())\n"),
    "sysv_shm": (
        LIBC + "r = libc.shmget(0x4b45, 4096, 0o1666)\nprint('planted' if r >= 0 else 'no')\n",
        LIBC + "r = libc.shmget(0x4b45, 0, 0o666)\nprint('found' if r >= 0 else 'absent')\n",
    ),
    "sysv_msg": (
        LIBC + "r = libc.msgget(0x4b46, 0o1666)\nprint('planted' if r >= 0 else 'no')\n",
        LIBC + "r = libc.msgget(0x4b46, 0o666)\nprint('found' if r >= 0 else 'absent')\n",
    ),
    "posix_mq": (
        LIBC + "libc.mq_open.restype = ctypes.c_int\n"
        "r = libc.mq_open(b'/ckpteval-probe', 0o100 | 2, 0o666, None)\n"
        "print('planted' if r >= 0 else f'no {ctypes.get_errno()}')\n",
        LIBC + "r = libc.mq_open(b'/ckpteval-probe', 2)\nprint('found' if r >= 0 else 'absent')\n",
    ),
    "abstract_socket": (
        LIBC + "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.bind(b'\\0ckpteval-probe')\ns.listen()\n"
        "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(600)\n"
        "print('planted')\n",
        LIBC + "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "try:\n    s.connect(b'\\0ckpteval-probe')\n    print('found')\n"
        "except OSError:\n    print('absent')\n",
    ),
    "memfd": (
        LIBC + "fd = os.memfd_create('ckpteval-probe')\nos.write(fd, b'answer 42')\n"
        "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(600)\n"
        "print('planted')\n",
        LIBC + "import glob\nhits = []\nfor link in glob.glob('/proc/*/fd/*'):\n"
        "    try:\n        hits += ['ckpteval-probe' in os.readlink(link)]\n"
        "    except OSError:\n        pass\nprint('found' if any(hits) else 'absent')\n",
    ),
    "dev_shm": (
        LIBC + "try:\n    open('/dev/shm/ckpteval-probe', 'w').write('answer 42')\n"
        "    print('planted')\nexcept OSError as exc:\n    print('no', exc.errno)\n",
        LIBC + "print('found' if os.path.exists('/dev/shm/ckpteval-probe') else 'absent')\n",
    ),
}


@pytest.fixture(scope="module", params=STARTS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    if os.uname().machine != "x86_64":
        pytest.skip("the probes use x86_64 system call numbers")
    return sandbox_starting_by(request.param)


def run_batch(sandbox: Sandbox, workdir: Path, programs: list[str]) -> list[RunResult]:
    """Run each program as `s<i>/main.py` under `workdir`, one batch."""
    workdir.mkdir(exist_ok=True)
    os.chmod(workdir, 0o755)
    commands = []
    for i, code in enumerate(programs):
        sample = workdir / f"s{i}"
        sample.mkdir(mode=0o755)
        (sample / "main.py").write_text(code)
        commands.append(Command([PYTHON, "-I", "-S", "main.py"], Limits(wall_s=10), cwd=sample))
    return sandbox.run_many(commands, workdir=workdir, readable=[PREFIX])


@pytest.mark.parametrize("place", sorted(PLACES))
def test_state_a_sample_plants_reaches_no_later_sample(
    sandbox: Sandbox, tmp_path: Path, place: str
) -> None:
    plant, look = PLACES[place]
    first = run_batch(sandbox, tmp_path / "a", [plant, look, look])
    assert first[0].exit_code == 0, first[0].stderr
    # Within the batch, and in the next batch (the sandbox uid is often the same one).
    later = run_batch(sandbox, tmp_path / "b", [look])
    for result in [*first[1:], *later]:
        assert result.stdout == b"absent\n", (place, first[0].stdout, result.stdout, result.stderr)


def test_keyrings_are_refused_not_only_emptied(sandbox: Sandbox, tmp_path: Path) -> None:
    """The kernel keeps a uid's user keyring past its last process: a sample must not be able
    to put anything there at all (another run's sample may get the same uid)."""
    (result,) = run_batch(sandbox, tmp_path, [PLACES["keyring"][0]])
    assert result.stdout.startswith(b"refused"), result.stdout


def test_no_user_namespace_can_mount_past_the_limits(sandbox: Sandbox, tmp_path: Path) -> None:
    """A user namespace of its own would make a sample root of its own mounts: a tmpfs far past
    the /tmp limit, a /proc of its own. The sandbox refuses to create one, however asked."""
    probe = LIBC + (
        "CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x20000\n"
        "print('unshare', libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), ctypes.get_errno())\n"
        "import subprocess\n"
        "for argv in (['unshare', '-Ur', 'true'], ['unshare', '-Urm', 'true']):\n"
        "    try:\n        print(subprocess.run(argv).returncode != 0)\n"
        "    except OSError:\n        print(True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "pid = libc.syscall(56, CLONE_NEWUSER | 17, 0, 0, 0, 0)\n"  # raw clone(2)
        "if pid == 0:\n    os._exit(0)\n"
        "print('clone', pid < 0)\n"
    )
    (result,) = run_batch(sandbox, tmp_path, [probe])
    lines = result.stdout.decode().split("\n")
    assert lines[0].startswith("unshare -1 "), result.stdout
    assert lines[1:4] == ["True", "True", "clone True"], (result.stdout, result.stderr)


def test_a_correct_program_still_forks_threads_and_uses_subprocesses(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """What the refusals must not break: fork, threads (clone without a new namespace), and
    subprocesses (clone3 refused: glibc falls back to clone)."""
    honest = (
        "import os, subprocess, sys, threading\n"
        "t = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(3)\n"
        "print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "print(subprocess.run(['echo', 'child'], capture_output=True).stdout.decode().strip())\n"
    )
    (result,) = run_batch(sandbox, tmp_path, [honest])
    assert result.stdout == b"thread\nfork 3\nchild\n", result.stderr


def test_state_a_sample_plants_reaches_no_later_run(sandbox: Sandbox, tmp_path: Path) -> None:
    """Every place planted in one batch, then looked at by another process's sandbox (the next
    `ckpteval score`, which may get the same sandbox uid)."""
    planted = run_batch(sandbox, tmp_path / "a", [plant for plant, _ in PLACES.values()])
    assert all(r.exit_code == 0 for r in planted), [r.stderr for r in planted]
    looks = tmp_path / "looks.json"
    looks.write_text(json.dumps([look for _, look in PLACES.values()]))
    script = (
        "import json, sys\nfrom pathlib import Path\nsys.path.insert(0, sys.argv[3])\n"
        "from test_sandbox_kernel_state import run_batch\nfrom ckpteval.sandbox import Sandbox\n"
        "programs = json.loads(Path(sys.argv[1]).read_text())\n"
        "results = run_batch(Sandbox('bwrap'), Path(sys.argv[2]), programs)\n"
        "print(json.dumps([r.stdout.decode() for r in results]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(looks), str(tmp_path / "b"), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == ["absent\n"] * len(PLACES), dict(zip(PLACES, seen))
