"""Per-sample isolation inside one sandbox batch: each command sees only its own files, a fresh
/tmp and its own IPC namespace, and is charged for the CPU of every process it started, reaped or
not. Real bubblewrap, real namespaces, real process accounting."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from conftest import STARTS, sandbox_starting_by

from ckpteval import cgroups
from ckpteval import sandbox as sandbox_module
from ckpteval.checkers.python import python_interpreter
from ckpteval.sandbox import Command, Limits, RunResult, Sandbox, SandboxError, isolation

PYTHON, PREFIX = python_interpreter()

#: SysV shared memory through ctypes (the standard library has no binding for it).
SHM = (
    "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.shmat.restype = ctypes.c_void_p\n"
    "libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n"
)


@pytest.fixture(scope="module", params=STARTS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return sandbox_starting_by(request.param)


def run_batch(
    sandbox: Sandbox, workdir: Path, programs: list[str], **limits: float
) -> list[RunResult]:
    """Run each program in a directory of its own (`s<i>/main.py`) under `workdir`, one batch."""
    os.chmod(workdir, 0o755)
    commands = []
    for i, code in enumerate(programs):
        sample = workdir / f"s{i}"
        sample.mkdir(mode=0o755)
        (sample / "main.py").write_text(code)
        (sample / "secret.txt").write_text(f"secret of sample {i}\n")
        commands.append(
            Command(
                [PYTHON, "-I", "-S", "main.py"],
                Limits(**{"wall_s": 10, **limits}),
                cwd=sample,
            )
        )
    return sandbox.run_many(commands, workdir=workdir, readable=[PREFIX])


def only_the_way_to(workdir: Path) -> bytes:
    """What `print(sorted(os.listdir('/tmp')))` shows in a fresh /tmp: the way to the command's
    own directory when the work directory lies under /tmp, else nothing."""
    parts = workdir.resolve().parts
    names = [parts[2]] if parts[1] == "tmp" else []
    return f"{names}\n".encode()


def test_a_command_sees_only_its_own_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    spy = (
        "import os\nprint(sorted(os.listdir('..')))\n"
        "for path in ('../s0/secret.txt', '../s0/main.py', os.path.abspath('../s0/secret.txt')):\n"
        "    try:\n        print(open(path).read().strip())\n"
        "    except OSError as exc:\n        print(type(exc).__name__)\n"
        "print(open('secret.txt').read().strip())\n"
    )
    results = run_batch(sandbox, tmp_path, ["print('hello')\n", spy])
    assert results[0].stdout == b"hello\n"
    lines = results[1].stdout.decode().splitlines()
    assert lines == [
        "['s1']",
        "FileNotFoundError",
        "FileNotFoundError",
        "FileNotFoundError",
        "secret of sample 1",
    ], results[1].stderr


def test_each_command_gets_a_fresh_tmp(sandbox: Sandbox, tmp_path: Path) -> None:
    leave = "open('/tmp/left', 'w').write('state')\nimport os\nos.mkdir('/tmp/dir')\n"
    look = "import os\nprint(sorted(os.listdir('/tmp')))\n"
    results = run_batch(sandbox, tmp_path, [leave, look])
    assert results[0].ok, results[0].stderr
    assert results[1].stdout == only_the_way_to(tmp_path), results[1].stdout


def test_a_very_deep_tree_neither_crashes_the_driver_nor_survives(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    deep = (
        "import os\nos.chdir('/tmp')\nfor _ in range(10000):\n"
        "    os.mkdir('d')\n    os.chdir('d')\nprint('built')\n"
    )
    look = "import os\nprint(sorted(os.listdir('/tmp')))\n"
    results = run_batch(sandbox, tmp_path, [deep, look, "print('fine')\n"])
    assert results[0].stdout == b"built\n", results[0].stderr
    assert results[1].stdout == only_the_way_to(tmp_path)
    assert results[2].stdout == b"fine\n"


def test_sysv_shared_memory_does_not_reach_the_next_command(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    write = SHM + (
        "shm = libc.shmget(4242, 4096, 0o1666)\nassert shm >= 0, ctypes.get_errno()\n"
        "addr = libc.shmat(shm, None, 0)\nctypes.memmove(addr, b'from sample 0', 13)\n"
        "print('written')\n"
    )
    read = SHM + (
        "shm = libc.shmget(4242, 0, 0o666)\n"
        "print('found' if shm >= 0 else 'absent', ctypes.get_errno())\n"
    )
    results = run_batch(sandbox, tmp_path, [write, read])
    assert results[0].stdout == b"written\n", results[0].stderr
    assert results[1].stdout == b"absent 2\n"  # ENOENT: another IPC namespace


def test_sysv_shared_memory_is_bounded(sandbox: Sandbox, tmp_path: Path) -> None:
    """Segments created and detached never count against the address space: the namespace's own
    limits (`Limits.tmp_bytes` in all) stop them."""
    hog = SHM + (
        "made = 0\nfor key in range(1, 4096):\n"
        "    shm = libc.shmget(key, 64 << 20, 0o1600)\n    if shm < 0:\n        break\n"
        "    made += 1\nprint(made)\n"
    )
    (result,) = run_batch(sandbox, tmp_path, [hog], tmp_bytes=256 << 20)
    assert result.ok, result.stderr
    assert int(result.stdout) <= 4


def test_cpu_of_children_the_kernel_reaps_is_counted(sandbox: Sandbox, tmp_path: Path) -> None:
    """SIGCHLD ignored: the kernel reaps the children itself and no wait4 ever sees their CPU."""
    if os.geteuid() != 0 and isolation("bwrap")["sandbox_uncounted"]:
        pytest.skip(
            "rootless without a delegated cgroup this CPU is not counted, as documented and "
            "said by the warning test_sandbox_rootless.py checks"
        )
    dodge = (
        "import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        "for _ in range(3):\n    if os.fork() == 0:\n        t = time.process_time()\n"
        "        while time.process_time() - t < 0.6:\n            pass\n        os._exit(0)\n"
        "while True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        break\n"
        "time.sleep(0.2)\nprint('done')\n"
    )
    (result,) = run_batch(sandbox, tmp_path, [dodge], wall_s=30)
    assert result.stdout == b"done\n", result.stderr
    assert result.cpu_s >= 1.2, result.cpu_s


def test_the_cpu_limit_covers_every_process_of_a_command(sandbox: Sandbox, tmp_path: Path) -> None:
    """Many busy processes, each under its own RLIMIT_CPU, in sessions of their own: their sum
    is what the limit bounds."""
    spread = (
        "import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        "for _ in range(8):\n    if os.fork() == 0:\n        os.setsid()\n"
        "        while True:\n            pass\ntime.sleep(120)\n"
    )
    (result,) = run_batch(sandbox, tmp_path, [spread], wall_s=30, cpu_s=2)
    assert result.timed_out
    assert result.duration_s < 15


@pytest.mark.slow
def test_a_correct_sample_keeps_its_cpu_beside_a_process_storm(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Two workers: a correct CPU-heavy program (about 1 s of CPU, limit 6 s) beside one that forks
    busy processes, each in a session of its own; the correct one passes every time."""
    heavy = "x = 0\nfor i in range(12_000_000):\n    x += i\nprint(x)\n"
    storm = (
        "import os, time\nfor _ in range(40):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        os.setsid()\n"
        "        while True:\n            pass\ntime.sleep(120)\n"
    )
    expected = f"{sum(range(12_000_000))}\n".encode()
    for attempt in range(3):
        results: dict[str, list[RunResult]] = {}

        def worker(
            name: str, code: str, work: Path, results: dict[str, list[RunResult]] = results
        ) -> None:
            work.mkdir()
            results[name] = run_batch(sandbox, work, [code], wall_s=6)

        threads = [
            threading.Thread(target=worker, args=(name, code, tmp_path / f"{name}{attempt}"))
            for name, code in (("storm", storm), ("heavy", heavy))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        (correct,) = results["heavy"]
        assert correct.ok and correct.stdout == expected, (attempt, correct)
        assert results["storm"][0].timed_out


def test_without_namespaces_the_batch_fails_loudly(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver that cannot unshare or mount runs nothing unisolated: a SandboxError."""
    caps = tuple(c for c in sandbox_module._DRIVER_CAPS if c != "CAP_SYS_ADMIN")
    monkeypatch.setattr(sandbox_module, "_DRIVER_CAPS", caps)
    with pytest.raises(SandboxError, match="own namespaces"):
        run_batch(sandbox, tmp_path, ["print('hello')\n"])


def test_without_process_accounting_cpu_limits_degrade_loudly(
    sandbox: Sandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if os.geteuid() != 0:
        pytest.skip(
            "rootless has no BSD process accounting to lose: its own warning is checked in "
            "test_sandbox_rootless.py"
        )
    caps = tuple(c for c in sandbox_module._DRIVER_CAPS if c != "CAP_SYS_PACCT")
    monkeypatch.setattr(sandbox_module, "_DRIVER_CAPS", caps)
    monkeypatch.setattr(cgroups, "_SUPPORT", cgroups.CgroupSupport(cpu=None, memory=None))
    monkeypatch.setattr(sandbox_module, "_WARNED_CPU_ACCOUNT", False)
    (result,) = run_batch(sandbox, tmp_path, ["print('hello')\n"])
    assert result.stdout == b"hello\n"
    assert "no BSD process accounting" in caplog.text
