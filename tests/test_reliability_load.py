"""20,000 samples scored with workers = cores while every core is busy: no verdict moves, and
memory does not grow with the number of samples.

The samples are cheap on purpose (the budget is about two minutes on two cores): math answers,
most compared exactly in-process, 1,000 of them symbolic so that they go through math-verify's
helper processes under a wall-clock limit (the timing-sensitive path), plus a small batch of
trivial sandboxed Python programs. Every sample's verdict is known by construction. While they
are scored, one busy-looping process per core competes for the CPU. Memory is measured as the
Python allocations traced while scoring 1,000 and 5,000 long samples read lazily from a file, in
chunks smaller than either (peak RSS is reported too, but allocator arenas make it too noisy to
assert on).
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpteval.evaluate import read_samples, score_samples
from ckpteval.io import iter_jsonl

pytestmark = pytest.mark.slow

CORES = len(os.sched_getaffinity(0))
N_SAMPLES = 20_000
N_PROBLEMS = 500
N_SYMBOLIC_PROBLEMS = 25  # 40 samples each: 1,000 symbolic samples
REASONING = "Let me work it out step by step, checking each step twice. " * 15
PYFUNC = (
    Path(__file__).resolve().parents[1] / "src" / "ckpteval" / "data" / "tasks" / "pyfunc.jsonl"
)


def _problems() -> list[dict[str, Any]]:
    rows = []
    for i in range(N_PROBLEMS):
        if i < N_SYMBOLIC_PROBLEMS:
            rows.append(
                {
                    "task_id": f"q{i}",
                    "question": f"Simplify {i + 1}/{i + 2}.",
                    "solution": f"It is $\\boxed{{\\frac{{{i + 1}}}{{{i + 2}}}}}$.",
                }
            )
        else:
            rows.append(
                {
                    "task_id": f"q{i}",
                    "question": f"What is {i} + 3?",
                    "answer": f"{i} + 3 = {i + 3} #### {i + 3}",
                }
            )
    return rows


def _samples(n: int) -> Iterator[tuple[dict[str, Any], str | None]]:
    """(sample, expected error type) in a fixed order: right, wrong and answerless samples."""
    for j in range(n):
        i, idx = j % N_PROBLEMS, j // N_PROBLEMS
        kind = j % 7
        if i < N_SYMBOLIC_PROBLEMS:  # equivalent forms that only math-verify can recognise
            k = idx % 3 + 2
            right = f"\\frac{{{(i + 1) * k}}}{{{(i + 2) * k}}}"
            completion, expected = (
                (f"{REASONING} so the answer is $\\boxed{{{right}}}$.", None)
                if kind % 2
                else (f"{REASONING} so $\\boxed{{\\frac{{{i + 2}}}{{{i + 1}}}}}$.", "wrong_answer")
            )
        elif kind == 0:
            completion, expected = f"{REASONING} I am not sure.", "no_answer"
        elif kind in (1, 2):
            completion, expected = f"{REASONING} {i} + 3 = {i + 4}\n#### {i + 4}", "wrong_answer"
        else:
            completion, expected = f"{REASONING} {i} + 3 = {i + 3}\n#### {i + 3:,}", None
        yield {"task_id": f"q{i}", "sample_idx": idx, "completion": completion}, expected


@dataclass
class Scored:
    status: int
    seconds: float
    max_rss_mb: float
    lines: list[dict[str, Any]]
    expected: list[str | None]
    stderr: str


def _write(tmp: Path, n: int) -> tuple[Path, Path, list[str | None]]:
    problems, samples = tmp / "problems.jsonl", tmp / f"samples-{n}.jsonl"
    problems.write_text("".join(json.dumps(p) + "\n" for p in _problems()))
    expected = []
    with samples.open("w") as handle:
        for sample, error in _samples(n):
            handle.write(json.dumps(sample) + "\n")
            expected.append(error)
    return problems, samples, expected


#: `ckpteval score ...` in a fresh interpreter that reports its own peak RSS (not its helpers').
_SCORE_AND_MEASURE = (
    "import resource, sys\nfrom ckpteval.cli import main\nstatus = main(sys.argv[1:])\n"
    "print(f'peak_rss_kb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}', file=sys.stderr)\n"
    "sys.exit(status)\n"
)


def _score_in_subprocess(tmp: Path, n: int) -> Scored:
    """`ckpteval score math` on n samples with workers = cores, in its own process."""
    tmp.mkdir(parents=True, exist_ok=True)
    problems, samples, expected = _write(tmp, n)
    out = tmp / f"scores-{n}.jsonl"
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCORE_AND_MEASURE,
            "score",
            "math",
            "--problems",
            str(problems),
            "--samples",
            str(samples),
            "--out",
            str(out),
            "--workers",
            str(CORES),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - start
    peak = re.search(r"peak_rss_kb=(\d+)", proc.stderr)
    lines = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return Scored(
        proc.returncode,
        seconds,
        int(peak.group(1)) / 1024 if peak else float("nan"),
        lines,
        expected,
        proc.stderr + proc.stdout,
    )


class _Hogs:
    """One busy-looping process per core: the machine is busy while samples are scored."""

    def __enter__(self) -> _Hogs:
        self.procs = [
            subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
            for _ in range(CORES)
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory: pytest.TempPathFactory) -> Scored:
    with _Hogs():
        return _score_in_subprocess(tmp_path_factory.mktemp("load"), N_SAMPLES)


def test_20000_samples_under_load_keep_their_verdicts(busy_run: Scored) -> None:
    assert busy_run.status == 0, busy_run.stderr[-3000:]
    assert len(busy_run.lines) == N_SAMPLES
    got = [line["error_type"] for line in busy_run.lines]
    wrong = [
        (i, busy_run.lines[i]["task_id"], e, g)
        for i, (e, g) in enumerate(zip(busy_run.expected, got))
        if e != g
    ]
    assert wrong == [], f"{len(wrong)} verdicts moved under load, first: {wrong[:5]}"
    assert sum(e is None for e in busy_run.expected) > N_SAMPLES // 3  # not a trivial all-fail
    print(
        f"\n{N_SAMPLES} samples, {CORES} workers, {CORES} busy loops: {busy_run.seconds:.1f} s, "
        f"peak RSS {busy_run.max_rss_mb:.0f} MB"
    )


def test_trivial_python_under_load_keeps_its_verdicts(tmp_path: Path) -> None:
    problems = {row["task_id"]: row for row in iter_jsonl(PYFUNC)}
    samples, expected = [], []
    for copy in range(25):
        for task_id, problem in problems.items():
            samples.append(
                {
                    "task_id": task_id,
                    "sample_idx": 2 * copy,
                    "completion": problem["canonical_solution"],
                }
            )
            expected.append(None)
            samples.append(
                {"task_id": task_id, "sample_idx": 2 * copy + 1, "completion": "    return None\n"}
            )
            expected.append("wrong_answer")
    with _Hogs():
        score_samples(
            "python", problems, samples, tmp_path / "s.jsonl", tmp_path / "s.json", workers=CORES
        )
    got = [
        json.loads(line)["error_type"] for line in (tmp_path / "s.jsonl").read_text().splitlines()
    ]
    assert got == expected


def test_memory_does_not_grow_with_the_number_of_samples(tmp_path: Path) -> None:
    """Python allocations traced while scoring 1,000 and then 5,000 long samples read lazily from
    a file, checked 100 at a time: a streaming scorer's peak is set by its chunk, not by how many
    samples there are. (The scorer that held every sample traced more than the file's size: 7 MB
    for 4 MB of samples, 31 MB for 19 MB.)"""
    problems = {p["task_id"]: p for p in _problems()[N_SYMBOLIC_PROBLEMS:]}
    long_reasoning = "x" * 8000

    def write(n: int) -> Path:
        path = tmp_path / f"long-{n}.jsonl"
        with path.open("w") as handle:
            for j in range(n):
                task_id = list(problems)[j % len(problems)]
                handle.write(
                    json.dumps(
                        {
                            "task_id": task_id,
                            "sample_idx": j // len(problems),
                            "completion": f"{long_reasoning}\n#### 7",
                        }
                    )
                    + "\n"
                )
        return path

    def score(path: Path) -> dict[str, Any]:
        errors: list[str] = []
        return score_samples(
            "gsm8k",
            problems,
            read_samples(path, errors),
            tmp_path / "o.jsonl",
            tmp_path / "o.json",
            workers=CORES,
            input_errors=errors,
            chunk_size=100,
        )

    score(write(10))  # imports and helper processes: not part of either measurement
    peaks, sizes = [], []
    for n in (1_000, 5_000):
        path = write(n)
        gc.collect()  # garbage of earlier runs would be freed at an arbitrary point of this one
        tracemalloc.start()
        try:
            cell = score(path)
            peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        finally:
            tracemalloc.stop()
        assert cell["n_samples"] == n and sum(1 for _ in (tmp_path / "o.jsonl").open()) == n
        sizes.append(path.stat().st_size / 2**20)
    print(
        f"\ntraced peak: {peaks[0]:.2f} MB for {sizes[0]:.1f} MB of samples, "
        f"{peaks[1]:.2f} MB for {sizes[1]:.1f} MB"
    )
    assert peaks[1] - peaks[0] < (sizes[1] - sizes[0]) / 100, peaks  # ~0.3 MB for 31 MB more
    assert peaks[1] < sizes[1] / 8, peaks
