"""`ckpteval watch`: launches Snakemake when complete checkpoints appear, stops cleanly on Ctrl-C.

The end-to-end test runs the real command and real Snakemake on a stand-in Snakefile (discovery
through the same `ckpteval.checkpoints` code as the workflow, one cheap shell job per checkpoint),
so it exercises scanning, launching and interrupting without loading a model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from ckpteval.watch import describe_new, snakemake_command

LAUNCHER = textwrap.dedent("""\
    import argparse, sys
    from ckpteval.watch import add_watch_parser
    parser = argparse.ArgumentParser(prog="ckpteval")
    add_watch_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(sys.argv[1:])
    sys.exit(args.func(args))
""")

CONFIG = textwrap.dedent("""\
    runs:
      demo:
        path: run
        complete_marker: DONE
    tasks:
      arith: {}
""")

# Stands in for the workflow: the same parse-time discovery, one output per checkpoint, written the
# way every workflow output is (ckpteval.io.atomic_open: temp name, renamed when complete). The job
# for step 3 takes a minute, so the test can interrupt it half-way.
SNAKEFILE = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from ckpteval.checkpoints import discover_checkpoints

    CKPTS = [c.name for c in discover_checkpoints(Path("run"), ["step_{step}"], marker="DONE")]

    rule all:
        input: expand("out/{ckpt}.txt", ckpt=CKPTS)

    rule evaluate:
        output: "out/{ckpt}.txt"
        params: seconds=lambda w: 60 if w.ckpt == "step_3" else 0
        shell: sys.executable + " job.py {output} {params.seconds}"
""")

JOB = textwrap.dedent("""\
    import sys, time
    from ckpteval.io import atomic_open
    with atomic_open(sys.argv[1]) as handle:
        handle.write("started\\n")
        handle.flush()
        time.sleep(float(sys.argv[2]))
        handle.write("done\\n")
""")


def test_describe_new_reports_only_changes() -> None:
    one = frozenset({("demo", "step_1")})
    two = one | {("demo", "step_2")}
    assert describe_new(None, frozenset()) == "0 complete checkpoint(s) at start"
    assert describe_new(one, one) is None
    assert describe_new(one, two) == "1 new checkpoint(s): demo/step_2"
    assert describe_new(two, one) is None  # a rotated-out checkpoint triggers nothing
    many = frozenset(("demo", f"step_{i}") for i in range(10, 17))
    assert describe_new(frozenset(), many).endswith("and 2 more")


def test_snakemake_command_uses_this_interpreter_and_passes_extra_args() -> None:
    command = snakemake_command(Path("c.yaml"), "profiles/2node", ["-j", "16"])
    assert command == [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        "profiles/2node",
        "--configfile",
        "c.yaml",
        "-j",
        "16",
    ]


def test_watch_rejects_bad_arguments_with_one_line(tmp_path: Path) -> None:
    for args, expected in (
        (["--interval", "0"], "--interval"),
        (["--configfile", "missing.yaml"], "--configfile"),
    ):
        result = _launch(tmp_path, args, capture=True)
        assert result.returncode == 2 and expected in result.stderr
        assert "Traceback" not in result.stderr


def test_watch_stops_at_once_when_idle(tmp_path: Path) -> None:
    _workspace(tmp_path)
    log = tmp_path / "watch.log"
    watcher = _start_watch(tmp_path, log)
    try:
        _wait_for(lambda: "Snakemake finished" in log.read_text(), 60, log)
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=10) == 0
    finally:
        _reap(watcher)
    assert log.read_text().rstrip().endswith("ckpteval watch: stopped")


def test_watch_follows_training_and_stops_cleanly(tmp_path: Path) -> None:
    _workspace(tmp_path)
    _checkpoint(tmp_path, 1, complete=True)
    log = tmp_path / "watch.log"
    watcher = _start_watch(tmp_path, log)
    try:
        out = tmp_path / "out"
        _wait_for(lambda: (out / "step_1.txt").exists(), 60, log)

        # Written but not complete: no launch. Completed: evaluated.
        _checkpoint(tmp_path, 2, complete=False)
        time.sleep(2)
        assert not (out / "step_2.txt").exists()
        (tmp_path / "run" / "step_2" / "DONE").touch()
        _wait_for(lambda: (out / "step_2.txt").exists(), 60, log)

        # Interrupt while step 3's job is half-way through writing its output.
        _checkpoint(tmp_path, 3, complete=True)
        _wait_for(lambda: any(out.glob(".step_3.txt.*.tmp")), 60, log)
        watcher.send_signal(signal.SIGINT)
        status = watcher.wait(timeout=60)
    finally:
        _reap(watcher)
    text = log.read_text()
    assert status != 0, text
    assert not (out / "step_3.txt").exists(), "an interrupted job left a finished-looking output"
    assert not list(out.glob(".*.tmp")), "an interrupted job left its temporary file"
    assert (out / "step_1.txt").read_text() == "started\ndone\n"
    assert text.count("; running ") == 3, text
    assert "stopped; Snakemake exited with" in text
    assert not _jobs_running(tmp_path), "an interrupted job kept running"


def _workspace(root: Path) -> None:
    """Config, stand-in Snakefile and job, a one-core profile, an empty training run."""
    (root / "config.yaml").write_text(CONFIG)
    (root / "Snakefile").write_text(SNAKEFILE)
    (root / "job.py").write_text(JOB)
    (root / "profile").mkdir()
    (root / "profile" / "config.yaml").write_text("cores: 1\nlatency-wait: 1\n")
    (root / "run").mkdir()


def _start_watch(cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as handle:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                LAUNCHER,
                "watch",
                "--configfile",
                "config.yaml",
                "--profile",
                "profile",
                "--interval",
                "0.5",
            ],
            cwd=cwd,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


def _reap(process: subprocess.Popen[bytes]) -> None:
    """Kill a watch the test failed to stop (by pid), so no test leaves it running."""
    if process.poll() is None:
        process.kill()
        process.wait()


def _checkpoint(root: Path, step: int, *, complete: bool) -> None:
    path = root / "run" / f"step_{step}"
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"weights")
    if complete:
        (path / "DONE").touch()


def _launch(cwd: Path, args: list[str], *, capture: bool) -> subprocess.CompletedProcess[str]:
    code = LAUNCHER.replace(
        "sys.exit(args.func(args))",
        textwrap.dedent("""\
        from ckpteval.errors import UserError
        try:
            sys.exit(args.func(args))
        except UserError as exc:
            print(f"ckpteval: error: {exc}", file=sys.stderr)
            sys.exit(2)"""),
    )
    return subprocess.run(
        [sys.executable, "-c", code, "watch", *args],
        cwd=cwd,
        text=True,
        capture_output=capture,
        timeout=60,
        check=False,
    )


def _wait_for(condition: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; watch log:\n{log.read_text()}")
        time.sleep(0.2)


def _jobs_running(cwd: Path) -> list[int]:
    """Pids of stand-in jobs (`job.py`) still running in `cwd`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"job.py" in (entry / "cmdline").read_bytes() and os.readlink(entry / "cwd") == str(
                cwd
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found
