"""`ckpteval watch`: evaluations follow training.

For runs still training, scan the run directories every `--interval` seconds and, whenever
complete checkpoints appeared since the last launch, run Snakemake once with the chosen profile;
the workflow itself decides what is missing (discovery happens when the Snakefile is parsed, so a
new checkpoint simply appears in the DAG). One Snakemake at a time: checkpoints that complete during
a run are picked up by the next scan. A checkpoint that disappears (a trainer rotating old ones
out) triggers nothing.

Ctrl-C (or SIGTERM) while idle stops at once. During a run, watch sends one SIGINT to Snakemake's
process group, as a terminal would: Snakemake kills its local jobs, cancels its Slurm jobs and marks
their outputs incomplete, and watch waits for it to exit. Every workflow output is written under a
temporary name and renamed only when complete, so an interrupted job leaves nothing that looks
finished, and the next run redoes it. A second Ctrl-C escalates to SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from ckpteval.errors import UserError

Snapshot = frozenset[tuple[str, str]]


def add_watch_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `ckpteval watch` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "watch",
        help="evaluate new checkpoints as training writes them (runs Snakemake on each change)",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument(
        "--configfile",
        default=Path("config/config.yaml"),
        type=Path,
        help="workflow config naming the runs to watch (default: %(default)s)",
    )
    p.add_argument(
        "--profile",
        default="profiles/local",
        help="Snakemake profile for each launch, e.g. profiles/2node (default: %(default)s)",
    )
    p.add_argument(
        "--interval",
        default=60.0,
        type=float,
        help="seconds between scans of the run directories (default: %(default)s)",
    )
    p.add_argument(
        "snakemake_args",
        nargs=argparse.REMAINDER,
        help="after --: extra Snakemake arguments, e.g. -- -j 16 --config shard=0/2",
    )
    p.set_defaults(func=run_watch)


def run_watch(args: argparse.Namespace) -> int:
    """Entry point of `ckpteval watch`; returns the process exit status."""
    if args.interval <= 0:
        raise UserError(f"--interval: {args.interval} must be a positive number of seconds")
    if not args.configfile.is_file():
        raise UserError(f"--configfile: {args.configfile} not found")
    extra = list(args.snakemake_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    command = snakemake_command(args.configfile, args.profile, extra)
    return watch(
        lambda: complete_checkpoints(args.configfile, Path.cwd()), command, interval=args.interval
    )


def complete_checkpoints(configfile: Path, base_dir: Path) -> Snapshot:
    """(run, checkpoint) for every checkpoint the workflow would evaluate right now.

    The same discovery the Snakefile runs at parse time, so watch and workflow agree on what
    "complete" means (a marker file, or the checkpoint format's own rule).
    """
    from ckpteval.config import build_plan, load_config, validate_config

    config = load_config(configfile)
    validate_config(config)
    plan = build_plan(config, base_dir, allow_empty_runs=True)  # training may not have saved yet
    return frozenset((run.name, c.name) for run in plan.runs.values() for c in run.checkpoints)


def snakemake_command(configfile: Path, profile: str, extra: Sequence[str]) -> list[str]:
    """The Snakemake invocation for one launch (same interpreter, so the same environment)."""
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        str(profile),
        "--configfile",
        str(configfile),
        *extra,
    ]


def describe_new(previous: Snapshot | None, current: Snapshot) -> str | None:
    """Why a launch is due: the first scan, or checkpoints that `previous` lacked (else None)."""
    if previous is None:
        return f"{len(current)} complete checkpoint(s) at start"
    added = sorted(current - previous)
    if not added:
        return None
    shown = ", ".join(f"{run}/{ckpt}" for run, ckpt in added[:5])
    more = f" and {len(added) - 5} more" if len(added) > 5 else ""
    return f"{len(added)} new checkpoint(s): {shown}{more}"


class _Stopper:
    """Turns SIGINT/SIGTERM into a stop request and forwards it to the running Snakemake."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.forwarded = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested.set()
        self.forward()

    def forward(self) -> None:
        """Signal the child's process group, as a terminal's Ctrl-C would: SIGINT, then SIGTERM.

        Snakemake's local jobs share its group and must see the signal too; Snakemake cancels
        its Slurm jobs itself.
        """
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGINT if self.forwarded == 0 else signal.SIGTERM)
            self.forwarded += 1


def watch(
    scan: Callable[[], Snapshot],
    command: Sequence[str],
    *,
    interval: float,
    log: Callable[[str], None] | None = None,
) -> int:
    """Scan, launch `command` when the scan changed, repeat until SIGINT/SIGTERM.

    Returns 0 when stopped while idle, otherwise the interrupted Snakemake's exit status (130 if
    it reported success after being interrupted). A config error found by a later scan (someone
    editing the file) is logged and the previous snapshot kept; at the first scan it is raised.
    """
    say = log or (lambda text: print(f"ckpteval watch: {text}", file=sys.stderr, flush=True))
    stopper = _Stopper()
    previous_handlers = {
        sig: signal.signal(sig, stopper) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        launched: Snapshot | None = None
        first = True
        while not stopper.requested.is_set():
            try:
                current = scan()
            except UserError as exc:
                if first:
                    raise
                say(f"scan failed, keeping the last state: {exc}")
                current = launched or frozenset()
            first = False
            reason = describe_new(launched, current)
            if reason is not None and not stopper.requested.is_set():
                say(f"{reason}; running {' '.join(command[2:])}")
                status = _run(command, stopper)
                launched = current if launched is None else launched | current
                if stopper.requested.is_set():
                    say(f"stopped; Snakemake exited with {status} after cleaning up")
                    return status or 130
                say(
                    "Snakemake finished"
                    if status == 0
                    else f"Snakemake exited with {status}; failed jobs are retried on the next change"
                )
            stopper.requested.wait(interval)
        say("stopped")
        return 0
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)


def _run(command: Sequence[str], stopper: _Stopper) -> int:
    """Run one Snakemake in its own session (so a terminal's Ctrl-C reaches it only via us)."""
    child = subprocess.Popen(list(command), start_new_session=True, stdin=subprocess.DEVNULL)
    stopper.child = child
    try:
        if stopper.requested.is_set() and stopper.forwarded == 0:
            stopper.forward()  # the stop request arrived while the child was being started
        return child.wait()
    finally:
        stopper.child = None
