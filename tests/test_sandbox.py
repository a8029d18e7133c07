"""The sandbox contains hostile programs: real bubblewrap, real rlimits, real kills."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import STARTS, processes_with, sandbox_starting_by

from ckpteval.checkers.python import python_interpreter
from ckpteval.errors import UserError
from ckpteval.sandbox import UID_POOL, Claims, Command, Limits, RunResult, Sandbox, SandboxError

PYTHON, PREFIX = python_interpreter()


@pytest.fixture(scope="module", params=STARTS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return sandbox_starting_by(request.param)


def run_py(sandbox: Sandbox, tmp_path: Path, code: str, **limits: float) -> RunResult:
    """Run `code`; its argv carries `tmp_path`, so `survivors(tmp_path)` finds its processes."""
    (tmp_path / "main.py").write_text(code)
    os.chmod(tmp_path, 0o755)
    return sandbox.run(
        [PYTHON, "-I", "-S", "main.py", str(tmp_path)],
        limits=Limits(**{"wall_s": 5, **limits}),
        workdir=tmp_path,
        readable=[PREFIX],
    )


def survivors(marker: Path) -> list[str]:
    """Processes of this test's program still alive (other runs may share the machine)."""
    return [pid for pid, cmdline in processes_with(str(marker)).items() if b"main.py" in cmdline]


def test_runs_as_non_root_without_privileges(sandbox: Sandbox, tmp_path: Path) -> None:
    result = run_py(
        sandbox,
        tmp_path,
        "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
        "print(open('/proc/self/status').read())",
    )
    assert result.ok, result.stderr
    uid, gid, groups = result.stdout.decode().splitlines()[0].split(" ", 2)
    status = result.stdout.decode()
    assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status
    if os.geteuid() == 0:
        assert int(uid) in UID_POOL and int(gid) == int(uid) and groups == "[]"
    else:  # rootless: the namespace's one uid (ours outside), every capability given up for good
        assert (uid, gid) == ("0", "0") and "CapBnd:\t0000000000000000" in status


def test_home_directory_and_host_files_are_invisible(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path.parent / f"{tmp_path.name}-secret.txt"
    secret.write_text("credentials")
    work = tmp_path / "work"
    work.mkdir()
    code = (
        f"import os\nprint(sorted(os.listdir('/')))\nprint(os.path.exists({str(secret)!r}))\n"
        "print(sorted(os.listdir('/root')) if os.path.isdir('/root') else None)\n"
        "print(os.path.exists('/root/.bashrc'), os.path.exists('/work/main'), "
        "os.path.exists('/etc/passwd'), os.path.exists('/etc/shadow'))\n"
    )
    result = run_py(sandbox, work, code)
    assert result.ok, result.stderr
    top, secret_seen, root_listing, files = result.stdout.decode().splitlines()
    assert secret_seen == "False"
    assert files == "False False False False"
    assert "work" not in top and "home" not in top
    # /root holds at most the path to the bound interpreter, nothing of the real home.
    assert root_listing in ("None", "[]", "['.pyenv']")


def test_cannot_write_outside_its_temp_dir(sandbox: Sandbox, tmp_path: Path) -> None:
    marker = f"/tmp/ckpteval-sandbox-escape-{os.getpid()}"
    code = (
        "import os\nresults = []\n"
        f"for path in ['/usr/evil', '/etc/evil', '{tmp_path}/evil', '/evil', '{marker}']:\n"
        "    try:\n        open(path, 'w').write('x'); results.append('ok')\n"
        "    except OSError as exc:\n        results.append(type(exc).__name__)\n"
        "print(results)\n"
    )
    result = run_py(sandbox, tmp_path, code)
    assert result.ok, result.stderr
    outcome = eval(result.stdout.decode())  # noqa: S307 - our own program's list of names
    assert all(o != "ok" for o in outcome[:4])
    assert outcome[4] == "ok"  # its private /tmp is writable ...
    assert not Path(marker).exists()  # ... and is not the host's
    assert not (tmp_path / "evil").exists()


def test_no_network_not_even_loopback_of_the_host(sandbox: Sandbox, tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    code = (
        "import socket\nout = []\n"
        f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80), ('pypi.org', 443)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=2); out.append('connected')\n"
        "    except OSError as exc:\n        out.append(type(exc).__name__)\n"
        "print(out)\n"
    )
    result = run_py(sandbox, tmp_path, code)
    server.close()
    assert result.ok, result.stderr
    assert "connected" not in result.stdout.decode()
    assert not accepted


def test_fork_bomb_is_contained_and_cleaned_up(sandbox: Sandbox, tmp_path: Path) -> None:
    code = (
        "import os, time\nfor _ in range(10000):\n    try:\n        os.fork()\n"
        "    except OSError:\n        pass\ntime.sleep(60)\n"
    )
    start = time.monotonic()
    result = run_py(sandbox, tmp_path, code, wall_s=3, nproc=32)
    assert result.timed_out and not result.ok
    assert time.monotonic() - start < 15
    assert survivors(tmp_path) == []


def test_nproc_limit_holds(sandbox: Sandbox, tmp_path: Path) -> None:
    code = (
        "import os\nn = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        import time; time.sleep(5); os._exit(0)\n"
        "    n += 1\nprint(n, flush=True)\nos._exit(0)\n"
    )
    result = run_py(sandbox, tmp_path, code, nproc=10)
    assert result.exit_code == 0, result.stderr
    assert int(result.stdout.decode().split()[0]) < 10


def test_memory_bomb_hits_the_address_space_limit(sandbox: Sandbox, tmp_path: Path) -> None:
    result = run_py(sandbox, tmp_path, "x = bytearray(8 << 30)\n", memory_bytes=1 << 30)
    assert result.exit_code == 1 and b"MemoryError" in result.stderr


def test_printing_gigabytes_stops_at_the_output_cap(sandbox: Sandbox, tmp_path: Path) -> None:
    start = time.monotonic()
    result = run_py(
        sandbox,
        tmp_path,
        "import sys\nwhile True:\n    sys.stdout.write('x' * (1 << 20))\n",
        file_bytes=8 << 20,
        wall_s=20,
    )
    assert result.output_limit and not result.ok
    assert len(result.stdout) == 8 << 20
    assert time.monotonic() - start < 10


def test_timeout_kills_the_whole_process_tree(sandbox: Sandbox, tmp_path: Path) -> None:
    code = (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', 'main.py', sys.argv[1]],\n"
        "                 start_new_session=True)\n"
        "if os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\ntime.sleep(300)\n"
    )
    start = time.monotonic()
    result = run_py(sandbox, tmp_path, code, wall_s=1.5)
    assert result.timed_out and result.signal == 9
    assert time.monotonic() - start < 8
    assert survivors(tmp_path) == []


def test_killing_the_parent_reaches_nothing_outside(sandbox: Sandbox, tmp_path: Path) -> None:
    code = (
        "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except OSError as exc:\n"
        "        print(type(exc).__name__)\nprint('survived')\n"
    )
    result = run_py(sandbox, tmp_path, code)
    # Inside its pid namespace the parent (the driver) is the namespace's init, immune to its own
    # children.
    assert result.ok and result.stdout.decode().endswith("survived\n"), result
    assert run_py(sandbox, tmp_path, "print('next run fine')").ok


def test_cpu_limit_ends_busy_loops_even_without_wall_clock(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    result = run_py(sandbox, tmp_path, "while True:\n    pass\n", wall_s=30, cpu_s=1)
    # RLIMIT_CPU's SIGXCPU, or the driver's kill at the budget (the cgroup's count is exact, so
    # either may come first)
    assert result.signal == 24 or (result.timed_out and result.signal == 9), result
    assert result.duration_s < 10


def test_missing_bwrap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="bwrap.*not found"):
        Sandbox("bwrap")


def test_unknown_mode_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown mode 'firejail'"):
        Sandbox("firejail")


def test_none_mode_warns_and_still_enforces_limits(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with caplog.at_level("WARNING"):
        unconfined = Sandbox("none")
    assert "WITHOUT isolation" in caplog.text
    result = run_py(unconfined, tmp_path, "import time\ntime.sleep(30)\n", wall_s=1)
    assert result.timed_out


def test_run_many_isolates_commands_from_each_other(sandbox: Sandbox, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    scripts = {
        "leave.py": "import os, subprocess, sys\nopen('/tmp/left-behind', 'w').write('x')\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
        " start_new_session=True)\nprint('left')\n",
        "look.py": "import os\nprint(os.listdir('/tmp'), len([p for p in os.listdir('/proc') if p.isdigit()]))\n",
        "kill.py": "import os, signal\nfor pid in range(1, 4096):\n    if pid != os.getpid():\n"
        "        try:\n            os.kill(pid, signal.SIGKILL)\n        except OSError:\n"
        "            pass\nprint('tried')\n",
        "exit3.py": "import os\nfor fd in range(3, 1024):\n    try:\n"
        "        os.write(fd, b'{\"forged\": true}\\n')\n        print('wrote', fd)\n"
        "    except OSError:\n        pass\nraise SystemExit(3)\n",
        "loop.py": "while True:\n    pass\n",
    }
    for name, code in scripts.items():
        (tmp_path / name).write_text(code)
    order = ["leave.py", "look.py", "kill.py", "look.py", "exit3.py", "loop.py", "look.py"]
    commands = [
        Command(
            [PYTHON, "-I", "-S", name],
            Limits(wall_s=2),
            python_file=tmp_path / name if name != "look.py" else None,
        )
        for name in order
    ]
    results = sandbox.run_many(commands, workdir=tmp_path, readable=[PREFIX])
    assert [r.exit_code for r in results] == [0, 0, 0, 0, 3, None, 0]
    assert results[0].stdout == b"left\n"
    # After each command: no file it left in /tmp, no process it left behind (the driver, pid 1,
    # and itself: bubblewrap runs no init beside it; rootless the driver, not dumpable, is not
    # even listed: each command has a /proc of its own with hidepid).
    for look in (results[1], results[3], results[6]):
        files, processes = look.stdout.decode().rsplit(" ", 1)
        assert not any(name.startswith("left") for name in eval(files))  # noqa: S307
        assert int(processes) == (2 if os.geteuid() == 0 else 1)
    assert results[2].stdout == b"tried\n"  # the driver survived its kill attempts
    assert results[4].stdout == b""  # no descriptor of the driver's (its results file) leaked
    assert results[5].timed_out and results[5].signal == 9


def test_each_command_gets_exactly_its_own_output_whatever_it_leaves_writing(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Outputs are memfds the driver appends to one file per batch: every command, run by exec
    or forked (`python_file`), gets back exactly what it wrote, whatever its size; a process it
    leaves behind, still holding its stdout, writes nothing into it or into a later command's;
    its descriptors are write-only; and the cap holds for both ways of running."""
    os.chmod(tmp_path, 0o755)
    (tmp_path / "write.py").write_text(
        "import os, sys\n"
        "n = int(os.environ['N'])\n"
        "sys.stdout.write(f'out{n}:' + 'o' * (n * 37_000))\n"
        "sys.stderr.write(f'err{n}:' + 'e' * (n * 11_000))\n"
        "sys.stdout.flush(); sys.stderr.flush()\n"
        "for fd in (1, 2):\n"
        "    try:\n"
        "        os.pread(fd, 1, 0)\n"
        "        raise SystemExit(f'read back fd {fd}')\n"
        "    except OSError:\n"
        "        pass\n"
        "if n % 3 == 0 and os.fork() == 0:\n"  # left behind, writing once the command has ended
        "    os.setsid()\n"
        "    import time\n"
        "    time.sleep(0.5)\n"
        "    os.write(1, b'LATE'); os.write(2, b'LATE')\n"
        "    os._exit(0)\n"
    )
    (tmp_path / "flood.py").write_text(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    )
    commands = [
        Command(
            [PYTHON, "-I", "-S", "write.py"],
            Limits(wall_s=5),
            env={"N": str(n)},
            python_file=tmp_path / "write.py" if n % 2 else None,
        )
        for n in range(12)
    ]
    commands.insert(
        5, Command([PYTHON, "-I", "-S", "flood.py"], Limits(wall_s=5, file_bytes=1 << 20))
    )
    results = sandbox.run_many(commands, workdir=tmp_path, readable=[PREFIX])
    flooded = results.pop(5)
    assert flooded.output_limit and len(flooded.stdout) == 1 << 20
    for n, result in enumerate(results):
        assert result.exit_code == 0, (n, result.stderr[-300:])
        assert result.stdout == f"out{n}:".encode() + b"o" * (n * 37_000), n
        assert result.stderr == f"err{n}:".encode() + b"e" * (n * 11_000), n


def test_run_many_gives_up_the_commands_another_worker_claims(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """A worker left idle takes the commands a batch has not started (`Claims.take`): here all
    of those queued behind a slow first one. The driver runs exactly the others, a prefix: each
    command runs once, and the batch's results are those of the commands it ran."""
    os.chmod(tmp_path, 0o755)
    dirs = []
    for i in range(8):
        (path := tmp_path / f"c{i}").mkdir(mode=0o777)
        dirs.append(path)
    slow = "import time\ntime.sleep(2)\nopen('ran', 'w').close()\n"
    (dirs[0] / "main.py").write_text(slow)
    for path in dirs[1:]:
        (path / "main.py").write_text("open('ran', 'w').close()\n")
    commands = [
        Command([PYTHON, "-I", "-S", "main.py"], Limits(wall_s=5), cwd=p, python_file=p / "main.py")
        for p in dirs
    ]
    claims = Claims(8)
    claims.assign(range(8))
    taken: list[int] = []
    ended = threading.Event()

    def idle_worker() -> None:
        while not (taken and taken[-1]) and not ended.is_set():
            time.sleep(0.05)
            taken.append(claims.take())

    thread = threading.Thread(target=idle_worker)
    thread.start()
    try:
        results = sandbox.run_many(
            commands, workdir=tmp_path, writable=True, readable=[PREFIX], claims=claims
        )
    finally:
        ended.set()
        thread.join()
    assert taken[-1] == 7 and claims.kept == 1  # every command behind the slow one
    assert [r.exit_code for r in results] == [0]
    assert [(p / "ran").exists() for p in dirs] == [True] + [False] * 7
    assert claims.take() == 0  # the batch ended: nothing more to take


def test_claims_take_half_of_what_was_not_started_or_all_behind_a_slow_command(
    tmp_path: Path,
) -> None:
    """`Claims.take` against a driver's claims (the files it makes before each command): half of
    the commands not started when that is worth a sandbox, all of them once the running one is
    slow, none that the driver claimed first; items without a command (decided before running)
    go with the items around them."""
    claims = Claims(40)
    claims.assign([i for i in range(40) if i != 30])  # item 30: a compile error, no command
    directory = tmp_path / "claims"
    claims.open(directory)
    for item in range(4):  # the driver started items 0-3 just now
        (directory / str(item)).touch()
    assert claims.take() == 18 and claims.kept == 22  # half of 36, from the end (item 30 too)
    assert claims.take() == 9 and claims.kept == 13
    assert claims.take() == 0  # 4 of 9 left: not worth a sandbox
    past = time.time() - Claims.STUCK_S - 1
    os.utime(directory / "3", (past, past))  # item 3 has run for a while: take all behind it
    (directory / "12").touch()  # but the driver claimed the last one first
    assert claims.take() == 0 and claims.kept == 13
    os.remove(directory / "12")
    assert claims.take() == 9 and claims.kept == 4
    assert claims.close() == 4 and claims.take() == 0
