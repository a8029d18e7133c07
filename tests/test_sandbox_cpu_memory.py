"""CPU and memory counted by the kernel, per command (`ckpteval.cgroups`): the attacks that per-
process counts miss, each beside a correct program that keeps its verdict. Real bubblewrap, real
cgroups (the module is skipped where this process cannot make one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from ckpteval import cgroups
from ckpteval import sandbox as sandbox_module
from ckpteval.checkers.python import python_interpreter
from ckpteval.sandbox import Command, Limits, RunResult, Sandbox

PYTHON, PREFIX = python_interpreter()

#: A process whose leader thread exits while another thread computes for `SPIN` CPU seconds; the
#: program waits for its answer. /proc shows the dead leader's time only.
LEADER_EXIT = (
    "import ctypes, os, threading, time\nSPIN = {spin}\nr, w = os.pipe()\n"
    "for _ in range({procs}):\n"
    "    if os.fork() == 0:\n        os.setsid()\n"
    "        def spin():\n            t = time.thread_time()\n"
    "            while time.thread_time() - t < SPIN:\n                pass\n"
    "            os.write(w, b'x')\n"
    "        threading.Thread(target=spin).start()\n"
    "        ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: the leader thread alone\n"
    "for _ in range({procs}):\n    os.read(r, 1)\nprint('done')\n"
)
#: Children under a tick each, reaped by the kernel (SIGCHLD ignored): per-process counts round
#: each to 0 and no wait4 sees them.
SUB_TICK = (
    "import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\nr, w = os.pipe()\n"
    "for _ in range(800):\n    if os.fork() == 0:\n        t = time.process_time()\n"
    "        while time.process_time() - t < 0.004:\n            pass\n"
    "        os.write(w, b'x')\n        os._exit(0)\n    os.read(r, 1)\nprint('done')\n"
)
SUB_TICK_CPP = r"""
#include <csignal>
#include <ctime>
#include <cstdio>
#include <unistd.h>
int main() {
    signal(SIGCHLD, SIG_IGN);
    int fds[2]; pipe(fds);
    for (int i = 0; i < 800; i++) {
        if (fork() == 0) {
            clock_t t = clock();
            while (clock() - t < CLOCKS_PER_SEC / 250) {}
            write(fds[1], "x", 1); _exit(0);
        }
        char c; read(fds[0], &c, 1);
    }
    puts("done");
}
"""
#: The same in Rust: libc's fork, signal and clock through `extern "C"` (no crates).
SUB_TICK_RUST = r"""
extern "C" {
    fn fork() -> i32;
    fn signal(signum: i32, handler: usize) -> usize;
    fn clock() -> i64;
    fn pipe(fds: *mut i32) -> i32;
    fn write(fd: i32, buf: *const u8, n: usize) -> isize;
    fn read(fd: i32, buf: *mut u8, n: usize) -> isize;
    fn _exit(status: i32) -> !;
}
fn main() {
    unsafe {
        signal(17, 1); // SIGCHLD, SIG_IGN
        let mut fds = [0i32; 2];
        pipe(fds.as_mut_ptr());
        for _ in 0..800 {
            if fork() == 0 {
                let t = clock();
                while clock() - t < 4000 {} // 4 ms of CPU (CLOCKS_PER_SEC is 10^6)
                write(fds[1], b"x".as_ptr(), 1);
                _exit(0);
            }
            let mut c = 0u8;
            read(fds[0], &mut c, 1);
        }
    }
    println!("done");
}
"""
HEAVY = "x = 0\nfor i in range(12_000_000):\n    x += i\nprint(x)\n"
HEAVY_OUT = f"{sum(range(12_000_000))}\n".encode()
#: A correct neighbour in the same batch, well under a 1 s budget.
LIGHT = "x = 0\nfor i in range(1_000_000):\n    x += i\nprint(x)\n"
LIGHT_OUT = f"{sum(range(1_000_000))}\n".encode()


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    if cgroups.support().cpu is None:
        pytest.skip("this process cannot make a cgroup (not root, no delegated cgroup v2)")
    return Sandbox("bwrap")


def run_batch(
    sandbox: Sandbox, workdir: Path, programs: list[str], **limits: float
) -> list[RunResult]:
    """Run each program (Python source, or an argv list) in `workdir/s<i>`, one batch."""
    workdir.mkdir(exist_ok=True)
    os.chmod(workdir, 0o755)
    commands = []
    for i, program in enumerate(programs):
        sample = workdir / f"s{i}"
        sample.mkdir(mode=0o755, exist_ok=True)
        argv = program if isinstance(program, list) else [PYTHON, "-I", "-S", "main.py"]
        if isinstance(program, str):
            (sample / "main.py").write_text(program)
        commands.append(Command(argv, Limits(**{"wall_s": 60, **limits}), cwd=sample))
    return sandbox.run_many(commands, workdir=workdir, readable=[PREFIX])


def test_threads_of_a_process_whose_leader_exited_are_counted(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """20 s of CPU hidden behind dead leaders, a 2 s budget: stopped at the budget, not after."""
    attack = LEADER_EXIT.format(spin=10, procs=2)
    attacker, neighbour = run_batch(sandbox, tmp_path, [attack, LIGHT], cpu_s=2)
    assert attacker.timed_out, attacker
    assert attacker.cpu_s < 4 and attacker.duration_s < 15, attacker
    assert neighbour.ok and neighbour.stdout == LIGHT_OUT, neighbour


def test_children_under_a_tick_are_counted(sandbox: Sandbox, tmp_path: Path) -> None:
    """800 children of 4 ms each (3.2 s), each reaped by the kernel, against a 1 s budget."""
    attacker, neighbour = run_batch(sandbox, tmp_path, [SUB_TICK, LIGHT], cpu_s=1)
    assert attacker.timed_out and attacker.stdout == b"", attacker
    assert neighbour.ok and neighbour.stdout == LIGHT_OUT, neighbour


def run_compiled_attack(
    sandbox: Sandbox, tmp_path: Path, compile_argv: list[str], source: str, suffix: str
) -> None:
    """Compile `source` (argv `compile_argv` + [binary, source file]), run it beside LIGHT with a
    1 s budget: the attack is stopped at its budget, the neighbour keeps its verdict."""
    path = tmp_path / f"attack{suffix}"
    path.write_text(source)
    binary = tmp_path / "w" / "s0" / "attack"  # the command sees its own directory only
    binary.parent.mkdir(parents=True)
    subprocess.run([*compile_argv, str(binary), str(path)], check=True, timeout=300)
    binary.chmod(0o755)
    attacker, neighbour = run_batch(
        sandbox, tmp_path / "w", [["./attack"], LIGHT], cpu_s=1, wall_s=30
    )
    assert attacker.timed_out and attacker.stdout == b"", attacker
    assert neighbour.ok and neighbour.stdout == LIGHT_OUT, neighbour


def test_compiled_children_under_a_tick_are_counted(sandbox: Sandbox, tmp_path: Path) -> None:
    """C++: 800 forked children of 4 ms of CPU each, reaped by the kernel, a 1 s budget."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++")
    run_compiled_attack(sandbox, tmp_path, [compiler, "-O1", "-o"], SUB_TICK_CPP, ".cpp")


def test_rust_children_under_a_tick_are_counted(sandbox: Sandbox, tmp_path: Path) -> None:
    """Rust: the same 800 children of 4 ms each, a 1 s budget."""
    compiler = shutil.which("rustc")
    if compiler is None:
        pytest.skip("no rustc")
    run_compiled_attack(
        sandbox, tmp_path, [compiler, "--edition", "2021", "-O", "-o"], SUB_TICK_RUST, ".rs"
    )


def test_a_correct_sample_keeps_its_verdict_beside_hidden_cpu(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Two workers: a correct program (about 0.25 s of CPU, budget 3 s, so stopped after 6 s of
    wall clock) beside one that hides 16 busy threads behind dead leaders, each meant to run
    30 s; the storm is stopped at its budget (2 s of CPU, about 1 s on two cores), so the correct
    one gets its share of the machine whatever else runs on it."""
    storm = LEADER_EXIT.format(spin=30, procs=16)
    medium = "x = 0\nfor i in range(3_000_000):\n    x += i\nprint(x)\n"
    results: dict[str, list[RunResult]] = {}

    def worker(name: str, code: str, **limits: float) -> None:
        results[name] = run_batch(sandbox, tmp_path / name, [code], **limits)

    threads = [
        threading.Thread(target=worker, args=("storm", storm), kwargs={"cpu_s": 2}),
        threading.Thread(target=worker, args=("heavy", medium), kwargs={"cpu_s": 3, "wall_s": 3}),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (correct,) = results["heavy"]
    assert correct.ok and correct.stdout == f"{sum(range(3_000_000))}\n".encode(), correct
    (storm_result,) = results["storm"]
    assert storm_result.timed_out and storm_result.duration_s < 20, storm_result


def test_memory_held_in_memfds_is_counted(sandbox: Sandbox, tmp_path: Path) -> None:
    """200 MB written into memfds (no address space used; each under the file size limit)
    against a 64 MB limit."""
    hog = (
        "import os\nchunk = b'x' * (1 << 20)\nfds = [os.memfd_create('hog') for _ in range(10)]\n"
        "for fd in fds:\n    for _ in range(20):\n        os.write(fd, chunk)\nprint('held')\n"
    )
    small = "print(sum(range(1000)))\n"
    hogged, neighbour = run_batch(
        sandbox, tmp_path, [hog, small], memory_bytes=64 << 20, tmp_bytes=16 << 20
    )
    assert not hogged.ok and hogged.memory_limit and hogged.stdout == b"", hogged
    assert neighbour.ok and neighbour.stdout == b"499500\n", neighbour


def test_each_command_is_charged_its_own_cpu_and_no_cgroup_is_left(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """The first command's CPU is not charged to the second (they share the batch's cgroup), the
    batch removes its cgroup, and the next batch removes an old one left by a process that is
    gone (SIGKILLed before it could). Only this process's and the dead one's cgroups are looked
    at: other test workers make and remove theirs meanwhile."""
    hierarchies = {h for h in (cgroups.support().cpu, cgroups.support().memory) if h is not None}
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = f"ckpteval-{dead.pid}-0badc0de"
    for hierarchy in hierarchies:
        (hierarchy.own / left).mkdir()
        os.utime(hierarchy.own / left, (0, 0))  # older than cgroups.STALE_AFTER_S

    def ours() -> dict:
        mine = (f"ckpteval-{os.getpid()}-", left)
        return {h: {n for n in os.listdir(h.own) if n.startswith(mine)} for h in hierarchies}

    busy, idle = run_batch(sandbox, tmp_path, [HEAVY, "print(1)\n"], cpu_s=6)
    assert busy.cpu_s > 0.3 and idle.cpu_s < busy.cpu_s / 2, (busy.cpu_s, idle.cpu_s)
    assert ours() == {h: set() for h in hierarchies}


def test_without_cgroups_threads_behind_a_dead_leader_still_count(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback (no writable cgroup: per-process counts) reads each thread of a process whose
    leader exited, so the leader-exit attack is stopped at its budget there too."""
    monkeypatch.setattr(cgroups, "_SUPPORT", cgroups.CgroupSupport(cpu=None, memory=None))
    attack = LEADER_EXIT.format(spin=10, procs=2)
    attacker, neighbour = run_batch(sandbox, tmp_path, [attack, LIGHT], cpu_s=2)
    assert attacker.timed_out and attacker.stdout == b"", attacker
    assert attacker.cpu_s < 4 and attacker.duration_s < 15, attacker
    assert neighbour.ok and neighbour.stdout == LIGHT_OUT, neighbour


def test_without_cgroups_or_accounting_reaped_children_stop_a_command_at_its_budget(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poorest fallback (no cgroup, no acct(2): a user who is not root): children that the
    program waits for count while it runs (its cutime), so it is stopped at its budget instead
    of running to the end."""
    monkeypatch.setattr(cgroups, "_SUPPORT", cgroups.CgroupSupport(cpu=None, memory=None))
    caps = tuple(c for c in sandbox_module._DRIVER_CAPS if c != "CAP_SYS_PACCT")
    monkeypatch.setattr(sandbox_module, "_DRIVER_CAPS", caps)
    waits = (
        "import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n"
        "        t = time.process_time()\n        while time.process_time() - t < 0.03:\n"
        "            pass\n        os._exit(0)\n    os.wait()\nprint('done')\n"
    )
    attacker, neighbour = run_batch(sandbox, tmp_path, [waits, LIGHT], cpu_s=1)
    assert attacker.timed_out and attacker.stdout == b"", attacker
    assert attacker.cpu_s < 2.5, attacker
    assert neighbour.ok and neighbour.stdout == LIGHT_OUT, neighbour


#: Sample code that holds 400 MB in memfds (20 of 20 MB, each under the file size limit): no
#: MemoryError and no allocation failure to read, only the kernel's kill at the command's limit.
MEMFD_HOG = (
    "import os\nchunk = b'x' * (1 << 20)\nfds = [os.memfd_create('hog') for _ in range(20)]\n"
    "for fd in fds:\n    for _ in range(20):\n        os.write(fd, chunk)\n"
)


def test_a_sample_killed_at_its_memory_limit_says_so_in_its_verdict(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """The python checker and a reward function, each with a 200 MB limit: a sample the kernel
    kills for memory is `memory_limit` (not a crash, nor a reward error), its correct neighbour
    passes."""
    from ckpteval.checkers import Job, get_checker

    problem = {
        "task_id": "t/0",
        "prompt": "def double(x):\n",
        "test": "def check(candidate):\n    assert candidate(2) == 4\n",
        "entry_point": "double",
    }
    hog = "".join("    " + line + "\n" for line in MEMFD_HOG.splitlines())
    checker = get_checker("python", sandbox="bwrap", memory_bytes=200 << 20)
    jobs = [
        Job("t/0", problem, hog + "    return 2 * x\n"),
        Job("t/0", problem, "    return 2 * x\n"),
    ]
    hogged, neighbour = checker.check(jobs, workers=1, timeout=10)
    assert hogged.error_type == "memory_limit", hogged
    assert neighbour.passed, neighbour

    reward = tmp_path / "reward.py"
    reward.write_text(
        "import os\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str == 'hog':\n"
        + "".join("        " + line + "\n" for line in MEMFD_HOG.splitlines())
        + "    return float(solution_str == ground_truth)\n"
    )
    checker = get_checker(
        "reward_function",
        reward_function=str(reward),
        memory_bytes=200 << 20,
        self_test="off: test",
    )
    row = {"task_id": "r/0", "ground_truth": "4", "question": "2 + 2?"}
    try:
        hogged, neighbour = checker.check(
            [Job("r/0", row, "hog"), Job("r/0", row, "4")], workers=1, timeout=10
        )
    finally:
        checker.close()
    assert hogged.error_type == "memory_limit" and "reward" not in hogged.extras, hogged
    assert neighbour.passed and neighbour.extras["reward"] == 1.0, neighbour
