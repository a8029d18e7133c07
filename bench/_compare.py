"""What the checker benchmarks (python.py, rust.py) do alike around their samples: the options,
ckpteval's timed run, the other tool's timed run and its results, and the closing report.

Both tools get the same workers and the same timeout, so the ratio of throughputs is the ratio
per core. Files are JSONL, one sample or result a line, in the samples' order.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from ckpteval.checkers import get_checker
from ckpteval.evaluate import score_samples, self_test_verdict


def options(description: str, timeout_help: str) -> argparse.ArgumentParser:
    """The options both benchmarks take (each may add its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-problem", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=3.0, help=timeout_help)
    return parser


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_ckpteval(
    checker: str,
    problems: list[dict],
    samples: list[dict],
    work: Path,
    workers: int,
    timeout: float,
) -> tuple[float, float, dict, list[dict]]:
    """Score `samples` bubblewrap-sandboxed as the workflow does: the checker's self-test first,
    as the `selftest` job runs it (once per task and configuration, whatever the number of
    checkpoints), then the cell, as an evaluate job scores it from that verdict. Returns the
    cell's wall seconds, the self-test's, the score cell and the per-sample rows
    (`work/ckpteval.jsonl`). `ckpteval score` runs both in one call: its wall is the sum."""
    opts = {"sandbox": "bwrap"}
    by_id = {p["task_id"]: p for p in problems}
    start = time.monotonic()
    impl = get_checker(checker, **opts)
    try:
        verdict = self_test_verdict(impl, by_id, workers=workers, timeout=timeout)
    finally:
        impl.close()
    self_test_wall = time.monotonic() - start
    start = time.monotonic()
    cell = score_samples(
        checker,
        by_id,
        samples,
        work / "ckpteval.jsonl",
        work / "ckpteval.json",
        workers=workers,
        timeout=timeout,
        checker_options=opts,
        passed_self_test=verdict,
    )
    wall = time.monotonic() - start
    return wall, self_test_wall, cell, read_jsonl(work / "ckpteval.jsonl")


def run_other(command: list[str], samples_file: Path, **popen: Any) -> tuple[float, list[dict]]:
    """Run the other tool's `evaluate_functional_correctness` (its output hidden): wall seconds
    and the per-sample results it writes beside the samples (`<samples_file>_results.jsonl`)."""
    start = time.monotonic()
    subprocess.run(
        command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen
    )
    wall = time.monotonic() - start
    return wall, read_jsonl(Path(f"{samples_file}_results.jsonl"))


def report(
    disagreements: list[tuple],
    compared: int,
    ours: tuple[float, float],
    theirs_wall: float,
    target: float,
) -> int:
    """Print the verdict disagreements (the first 20) and the throughput ratios against `target`:
    a workflow cell's (`ours[0]`; its task's self-test, `ours[1]`, is a job of its own, paid once
    per configuration) and a one-off `ckpteval score`'s (both). The exit status: 1 if any verdict
    disagrees."""
    cell_wall, self_test_wall = ours
    print(f"verdict disagreements: {len(disagreements)} of {compared} samples")
    for row in disagreements[:20]:
        print("  ", row)
    print(
        f"throughput ratio (same workers, so per core): a workflow cell is "
        f"{theirs_wall / cell_wall:.2f}x as fast (target >= {target:g}x); `ckpteval score`, its "
        f"self-test of {self_test_wall:.1f} s included, {theirs_wall / sum(ours):.2f}x"
    )
    return 0 if not disagreements else 1
