"""Shared fixtures: the demo training run (built once, cached by its stamp), workflow runs, and a
look at the host's live processes (what tests of kills and sandboxes check afterwards).

End-to-end tests run real Snakemake in a subprocess (`python -m snakemake`) on a temporary working
directory holding a small config, against the repository's Snakefile and profiles.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist (`make test` runs two workers) each worker leases fake GPUs from a lock
# directory of its own, so one worker's leases never make the other's tests wait. Set before any
# test imports ckpteval.engine.gpus, which reads it once; subprocesses (Snakemake jobs) inherit it.
if os.environ.get("PYTEST_XDIST_WORKER") and "CKPTEVAL_GPU_LOCK_DIR" not in os.environ:
    os.environ["CKPTEVAL_GPU_LOCK_DIR"] = (
        f"/tmp/ckpteval-gpu-locks-{os.getuid()}-{os.getppid()}-{os.environ['PYTEST_XDIST_WORKER']}"
    )


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


# The modules that take longest (minutes each, measured on a 2-core machine), longest first. Under
# pytest-xdist (`make test`: `-n 2 --dist loadfile --no-loadscope-reorder`) a module is one unit of
# work, handed to whichever worker is free in collection order; starting the long ones first keeps
# one worker from running a long module alone at the end. Only the order depends on this list: a
# stale or missing entry costs minutes, never a test. The three contract modules share one sweep
# (tests/contract_sweep.py): the first builds it while the other worker starts a long module that
# does not need it, instead of waiting on the sweep's lock.
LONGEST_FIRST = (
    "test_contract_verbs.py",
    "test_reliability_interrupt.py",  # ~10 min quiet: a demo sweep interrupted at each rule x 3 signals
    "test_swap_workflow.py",
    "test_contract.py",
    "test_contract_walk.py",
    "test_bench_gpu.py",
    "test_slurm.py",
    "test_reliability_kills.py",
    "test_reliability_hostile.py",
    "test_workflow.py",
    "test_plan_readonly.py",
    "test_share.py",
    "test_infer_vllm.py",
    "test_reasoning.py",
    "test_reliability_stale.py",
    "test_chat_templates.py",
    "test_workflow_stdio.py",
    "test_swap.py",
    "test_lengths.py",
    "test_reliability_load.py",
    "test_reward.py",
    "test_report_browser.py",
    "test_consolidate_verl.py",  # ~1.5 min: two FSDP runs on gloo, verl's merger, one sweep
    "test_consolidate_deepspeed.py",  # ~1.5 min: a 2-rank DeepSpeed run, one sweep
    "test_consolidate.py",
)


#: Debian's package of each optional program a test may need (`@pytest.mark.needs(program)`):
#: scripts/setup-env.sh installs them as root and says in one line what a user without one
#: misses; the tests that need a missing one skip, each saying which, and the run ends with one
#: line per missing program saying how many.
OPTIONAL_PROGRAMS = {"rustc": "rustc", "g++": "g++"}

#: The reason of a test skipped for want of programs (the programs: group 1).
_NEEDS_REASON = re.compile(r"(?:Skipped: )?needs (.+?): not found on PATH")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_module_rank)  # stable: tests keep their order inside a module
    for item in items:
        needed = [p for mark in item.iter_markers("needs") for p in mark.args]
        missing = [p for p in needed if shutil.which(p) is None]
        if missing:
            packages = " ".join(OPTIONAL_PROGRAMS[p] for p in missing)
            item.add_marker(
                pytest.mark.skip(
                    reason=f"needs {', '.join(missing)}: not found on PATH "
                    f"(sudo apt-get install {packages})"
                )
            )
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per optional program this machine lacks: how many tests skipped for it (from
    the skip reasons, which pytest-xdist's workers report to the controller)."""
    missing: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        # (path, line, reason); a list once pytest-xdist has sent it from a worker
        longrepr = report.longrepr
        reason = str(longrepr[2]) if isinstance(longrepr, (tuple, list)) else ""
        if match := _NEEDS_REASON.match(reason):
            missing.update(match[1].split(", "))
    for program, n in sorted(missing.items()):
        terminalreporter.write_line(
            f"{program} not found: {n} test(s) that need it skipped "
            f"(sudo apt-get install {OPTIONAL_PROGRAMS[program]} to run them)"
        )


def _module_rank(item: pytest.Item) -> int:
    """Position of the item's module in LONGEST_FIRST; every other module after those."""
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


@pytest.fixture(scope="session")
def demo_dir(request: pytest.FixtureRequest) -> Path:
    """The demo training run (`run/step_*`, `base/`), built once and reused while its stamp holds."""
    from ckpteval.demo import build

    out = Path(request.config.cache.mkdir("ckpteval-demo"))
    with exclusive(out.with_name(out.name + ".lock")):
        build(out, echo=lambda line: None)
    return out


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` for the block: two pytest-xdist workers that need
    the same cached build take turns, so the second waits for the first's build and then finds
    its stamp valid instead of deleting the run the first is writing. The kernel frees the lock
    if a worker dies."""
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_config(workdir: Path, config: dict[str, Any]) -> Path:
    """Write `config` as the working directory's config/config.yaml (what the Snakefile reads)."""
    path = workdir / "config" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def small_config(run_dir: Path, **overrides: Any) -> dict[str, Any]:
    """A config that exercises every kind of task on the tiny model in little time."""
    config: dict[str, Any] = {
        "runs": {"demo": {"path": str(run_dir)}},
        "tasks": {
            "arith": {},
            "arith_harness": {"limit": 10},
            "pyfunc": {"limit": 3},
            "rustfunc": {"limit": 2},
        },
        "sampling": {"greedy": {"temperature": 0.0, "max_new_tokens": 48}},
        "engine": {"gpu_memory_utilization": 0.15, "enforce_eager": True},
        # No smoke generation: the tests' claims are about what runs after consolidating (the
        # consolidation tests and the demo's own config run the smoke generations).
        "consolidate": {"smoke": "none"},
        "evaluate": {"workers": 2, "timeout": 10},
    }
    config.update(overrides)
    return config


#: What every workflow run of the tests runs in: vLLM in the job's own process, unbuffered output.
WORKFLOW_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1"}

#: Debian's python3, which `nobody` can run (the project's venv may sit in root's home).
SYSTEM_PYTHON = Path("/usr/bin/python3")


def as_nobody_json(script: Path, *args: str, cwd: Path, tmpdir: str | None = None) -> Any:
    """Run `script` with Debian's python3 as `nobody` (a user who is not root: rootless
    bubblewrap), this checkout's package on its path, `tmpdir` (default `cwd`) its TMPDIR; the
    JSON of its last stdout line. Skips without root, runuser or that python3."""
    if os.geteuid() != 0 or shutil.which("runuser") is None or not SYSTEM_PYTHON.exists():
        pytest.skip("needs root (to become nobody), runuser and Debian's python3")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "src"), "HOME": str(cwd)}
    done = subprocess.run(
        [str(shutil.which("runuser")), "-u", "nobody", "--", str(SYSTEM_PYTHON), str(script)]
        + list(args),
        cwd=cwd,
        env={**env, "TMPDIR": tmpdir or str(cwd)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def path_without(bin_dir: Path, *programs: str, path: str | None = None) -> str:
    """A PATH that finds every program `path` (default: this process's PATH) does but
    `programs`: `bin_dir`, made here, holding a link to the first of each name (a machine
    without rustc, say, as a user who cannot uninstall it sees one)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.chmod(0o755)
    for entry in (path or os.environ["PATH"]).split(os.pathsep):
        if not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            link, target = bin_dir / name, Path(entry) / name
            if name in programs or os.path.lexists(link) or not target.is_file():
                continue
            if os.access(target, os.X_OK):
                link.symlink_to(target)
    return str(bin_dir)


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """`python -m snakemake` on the repository's workflow in `workdir`, with the local profile."""
    return [
        *(sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")),
        *("--directory", str(workdir), "--profile", str(REPO / "profiles" / "local"), *args),
    ]


def run_snakemake(
    workdir: Path, *args: str, timeout: float = 1800, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`snakemake_cmd` run to its end (with `env` for its environment, the test's own by
    default)."""
    env = {**(env or os.environ), **WORKFLOW_ENV}
    cmd = snakemake_cmd(workdir, *args)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def why_failed(proc: subprocess.CompletedProcess[str], workdir: Path, tail: int = 2000) -> str:
    """What a failed Snakemake run says about each failed job (its "Error in rule" block and
    the end of the log file it names), then the end of its stderr: a failure early in a long
    run is not lost to a tail."""
    parts = []
    for block in re.findall(r"Error in rule .*?(?=\n\S|\Z)", proc.stderr, re.S)[:3]:
        parts.append(block[:1500])
        for log in re.findall(r"log: (\S+)", block):
            path = workdir / log.rstrip(",")
            if path.is_file():
                parts.append(f"--- {log}:\n" + path.read_text(errors="replace")[-1500:])
    return "\n".join([*parts, "--- stderr, last lines:", proc.stderr[-tail:]])


def dry_snakemake(
    workdir: Path, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`snakemake -n` as `run_snakemake` runs it (same arguments, profile and environment), in a
    process forked from this one instead of a new interpreter: the fork inherits Snakemake and
    ckpteval already imported, which is most of a dry run's ~4 s, and it proves the same thing,
    since the child parses the workflow from scratch in its own process (its own working
    directory, Snakemake logger and parse-time state), exactly as `python -m snakemake` would.
    Only for dry runs: jobs that run for real start from `run_snakemake`'s fresh interpreter."""
    import snakemake.cli

    args = ("-n", *args) if "-n" not in args and "--dry-run" not in args else args
    argv = [
        *("--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)),
        *("--profile", str(REPO / "profiles" / "local"), *args),
    ]
    done = forked_main(snakemake.cli.main, argv, REPO, timeout, prog="snakemake")
    return subprocess.CompletedProcess(
        ["snakemake", *argv], done.returncode, done.stdout, done.stderr
    )


def forked_main(
    main: Callable[[list[str]], object],
    argv: list[str],
    cwd: Path,
    timeout: float = 600,
    prog: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`main(argv)` (a command's entry point: `snakemake.cli.main`, `ckpteval.cli.main`) in a
    process forked from this one, run from `cwd` with the workflow's environment (on top of
    `env`, e.g. a test Slurm cluster's), its exit code and output captured as `subprocess.run`
    would. As in `dry_snakemake` (which adds `-n`), the child inherits the imports, not the
    state: it parses its workflow or config from scratch in its own process. For planning
    commands only (`--summary`, `--dag`, `ckpteval status`...): jobs that run for real start
    from `run_snakemake`'s fresh interpreter."""
    if getattr(main, "__module__", None) == "snakemake.cli":
        _snakemake_plugins_collected()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                os.chdir(cwd)
                os.environ.update({**(env or {}), **WORKFLOW_ENV})
                sys.argv = [prog or str(getattr(main, "__module__", "main")), *argv]
                result = main(argv)
                code = result if isinstance(result, int) else 0
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 1
            except BaseException:  # noqa: BLE001 - reported to the parent as a failed run
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        returncode = _wait(pid, timeout)
        out.seek(0)
        err.seek(0)
        text = (out.read().decode(errors="replace"), err.read().decode(errors="replace"))
    return subprocess.CompletedProcess([main.__module__, *argv], returncode, *text)


@functools.cache
def _snakemake_plugins_collected() -> None:
    """Collect Snakemake's plugins (executors, storage, loggers, reports, schedulers) once in
    this process, as its CLI does when it builds its argument parser: importing each plugin (the
    Slurm executor's pandas among them) was a third of a forked dry run's CPU (0.76 s -> 0.44 s
    a run, measured on the contract sweep), paid again in every fork. The forks find the same
    registries a fresh `python -m snakemake` fills itself: the installed plugins, no run's
    settings (test_contract.py's forked-versus-fresh test compares what they plan and say)."""
    import snakemake.cli

    snakemake.cli.get_argument_parser()


def _wait(pid: int, timeout: float) -> int:
    """The exit code of child `pid`; killed (and a TimeoutExpired raised) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(["snakemake", "-n"], timeout)
        time.sleep(0.02)


def processes_with(marker: str) -> dict[str, bytes]:
    """Live processes whose command line contains `marker`: pid -> command line (arguments
    separated by NUL). A process that exits during the scan is left out."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found[pid] = cmdline
    return found


def jobs_started_without_restart(log_text: str) -> Counter[str]:
    """How many jobs of each rule a Snakemake log started, after checking that no job was
    restarted and no output went missing (what a planning process beside a live sweep must never
    cause: tests/test_plan_readonly.py, tests/test_slurm.py)."""
    assert "Trying to restart" not in log_text, log_text[-4000:]
    assert "MissingOutputException" not in log_text, log_text[-4000:]
    return Counter(
        line.split()[1].rstrip(":")
        for line in log_text.splitlines()
        if line.startswith(("rule ", "localrule "))
    )


#: Signals a sandbox's caller may have ignored, which an ignored signal's survival of fork and
#: exec would pass to every command: nohup's SIGHUP, any ignored one (SIGUSR1), and glibc's own
#: two (32, 33), which its posix_spawn leaves ignored in what it starts (GNU make spawns so).
INHERITED_IGNORES = (signal.SIGHUP, signal.SIGUSR1, 32, 33)


@contextmanager
def ignoring_signals(numbers: tuple[int, ...] = INHERITED_IGNORES) -> Iterator[None]:
    """This process ignores `numbers` meanwhile (what its children inherit), by the raw
    rt_sigaction (glibc's `sigaction` refuses 32 and 33); each old action is put back exactly."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ignore = (ctypes.c_uint64 * 4)(1)  # SIG_IGN, no flags, no restorer, an empty mask
    saved = {number: (ctypes.c_uint64 * 4)() for number in numbers}
    for number, old in saved.items():
        assert libc.syscall(13, number, ignore, old, 8) == 0, ctypes.get_errno()
    try:
        yield
    finally:
        for number, old in saved.items():
            libc.syscall(13, number, old, None, 8)


#: The two ways a root sandbox starts a plain program: a fork of its driver, or the native
#: launcher (`ckpteval.launcher`). Sandbox tests of what a command may see and do run on both.
STARTS = ("fork", "launcher")


def sandbox_starting_by(start: str) -> Any:
    """A bwrap `Sandbox` whose plain programs start by `start` (one of `STARTS`). The launcher
    needs root and builds with the Rust toolchain the tests install: as root a failed build is
    a failure, not a skip."""
    from ckpteval import launcher
    from ckpteval.sandbox import Sandbox

    if start == "fork":
        return Sandbox("bwrap")
    if os.geteuid() != 0:
        pytest.skip("the launcher starts commands in a sandbox run as root only")
    rustc = shutil.which("rustc")
    assert rustc, "rustc not on PATH: the launcher is built with it"
    path = launcher.ensure(rustc)
    assert path is not None, "the launcher did not build (see the log)"
    return Sandbox("bwrap", launcher=path)
