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

from ckpteval.evaluate import score_samples


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
) -> tuple[float, dict, list[dict]]:
    """Score `samples` bubblewrap-sandboxed, self-test included: wall seconds, the score cell and
    the per-sample rows (`work/ckpteval.jsonl`)."""
    start = time.monotonic()
    cell = score_samples(
        checker,
        {p["task_id"]: p for p in problems},
        samples,
        work / "ckpteval.jsonl",
        work / "ckpteval.json",
        workers=workers,
        timeout=timeout,
        checker_options={"sandbox": "bwrap"},
    )
    wall = time.monotonic() - start
    return wall, cell, read_jsonl(work / "ckpteval.jsonl")


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
    disagreements: list[tuple], compared: int, ours_wall: float, theirs_wall: float, target: float
) -> int:
    """Print the verdict disagreements (the first 20) and the throughput ratio against `target`;
    the exit status: 1 if any verdict disagrees."""
    print(f"verdict disagreements: {len(disagreements)} of {compared} samples")
    for row in disagreements[:20]:
        print("  ", row)
    print(
        f"throughput ratio (same workers, so per core): ckpteval is {theirs_wall / ours_wall:.2f}x "
        f"as fast; target >= {target:g}x"
    )
    return 0 if not disagreements else 1
