"""Time `ckpteval.summary.build_summary` on a synthetic sweep of one million per-sample rows.

The sweep: 2 runs x 25 checkpoints (a baseline and 24 trained steps) x 5 tasks (4 code tasks with
pass@k, compile rate and error types, 1 math task with accuracy) x 4 variants (one sampling config,
seeds 1-4) x 1,000 samples (200 problems x 5 samples): 1,000 cells, 1,000,000 per-sample rows.
Pass probabilities rise with step, with a dip at two steps so some regressions are real.

Writing the synthetic files is not part of the target and is timed separately.

Usage: python bench/aggregate.py [--keep DIR] [--bootstrap 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ckpteval.plan.layout import CellKey, Layout
from ckpteval.summary import build_summary

RUNS = ("run-a", "run-b")
STEPS = tuple(range(100, 2401, 100))  # 24 trained checkpoints; plus the baseline
TASKS = ("py-easy", "py-hard", "rust-easy", "rust-hard", "gsm")
SAMPLING = "t0.8p0.95n5"
SEEDS = (1, 2, 3, 4)
PROBLEMS = 200
SAMPLES = 5
ERRORS = ("wrong_answer", "compile_error", "runtime_error", "timeout")


def write_sweep(root: Path, rng: np.random.Generator) -> list[Path]:
    """Write every cell's json and jsonl under `root/scores/...`; return the json paths."""
    paths = []
    for run_index, run in enumerate(RUNS):
        for task_index, task in enumerate(TASKS):
            difficulty = rng.normal(task_index * 0.4, 1.0, PROBLEMS)
            for ckpt, step in [("base", 0), *((f"step_{s}", s) for s in STEPS)]:
                skill = -1.5 + 3.0 * step / STEPS[-1] + 0.2 * run_index
                if step in (1200, 2000):
                    skill -= 0.6  # a real regression for the deltas to find
                p_pass = 1.0 / (1.0 + np.exp(difficulty - skill))
                for seed in SEEDS:
                    paths.append(
                        _write_cell(
                            root, rng, run, ckpt, step, task, seed, p_pass, is_baseline=step == 0
                        )
                    )
    return paths


def _write_cell(
    root: Path,
    rng: np.random.Generator,
    run: str,
    ckpt: str,
    step: int,
    task: str,
    seed: int,
    p_pass: np.ndarray,
    *,
    is_baseline: bool,
) -> Path:
    variant = f"{SAMPLING}-s{seed}"
    key = CellKey(run, ckpt, task, variant)
    layout = Layout(str(root))
    Path(layout.score(key)).parent.mkdir(parents=True, exist_ok=True)
    passed = rng.random((PROBLEMS, SAMPLES)) < p_pass[:, None]
    error_index = rng.integers(0, len(ERRORS), (PROBLEMS, SAMPLES))
    code = task != "gsm"
    lines = []
    for p in range(PROBLEMS):
        for s in range(SAMPLES):
            ok = bool(passed[p, s])
            error = "null" if ok else f'"{ERRORS[error_index[p, s]] if code else "wrong_answer"}"'
            lines.append(
                f'{{"task_id": "{task}/{p}", "sample_idx": {s}, '
                f'"passed": {"true" if ok else "false"}, "score": {1.0 if ok else 0.0}, '
                f'"error_type": {error}, "duration_s": 0.01}}\n'
            )
    Path(layout.score_samples(key)).write_text("".join(lines))
    per_problem = passed.mean(axis=1)
    failures = ~passed
    if code:
        metrics = {
            "pass@1": _metric(per_problem),
            "pass@5": _metric(passed.any(axis=1).astype(float)),
            "compile_rate": _metric(1.0 - ((error_index == 1) & failures).mean(axis=1)),
        }
        error_types = {e: int(((error_index == i) & failures).sum()) for i, e in enumerate(ERRORS)}
    else:
        metrics = {"accuracy": _metric(per_problem)}
        error_types = {"wrong_answer": int(failures.sum())}
    cell = {
        "checker": "python" if code else "math",
        "scorer_version": "bench-1",
        "n_problems": PROBLEMS,
        "n_samples": PROBLEMS * SAMPLES,
        "metrics": metrics,
        "error_types": error_types,
        "input_errors": [],
        "duration_s": 1.0,
        "run": run,
        "ckpt": ckpt,
        "step": step,
        "task": task,
        "variant": variant,
        "sampling": SAMPLING,
        "seed": seed,
        "model_hash": f"{run}-{ckpt}",
        "generation_file": "synthetic",
        "generation_sha256": "0" * 64,
        "is_baseline": is_baseline,
    }
    path = Path(layout.score(key))
    path.write_text(json.dumps(cell))
    return path


def _metric(per_problem: np.ndarray) -> dict[str, float]:
    n = len(per_problem)
    return {
        "value": float(per_problem.mean()),
        "stderr": float(per_problem.std(ddof=1) / np.sqrt(n)),
        "n": n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write the sweep and summary here and keep them")
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="ckpteval-bench-"))
    try:
        start = time.perf_counter()
        paths = write_sweep(root, np.random.default_rng(0))
        rows = len(paths) * PROBLEMS * SAMPLES
        print(
            f"wrote {len(paths)} cells, {rows:,} per-sample rows in "
            f"{time.perf_counter() - start:.1f} s (not part of the target)"
        )
        start, cpu = time.perf_counter(), time.process_time()
        build_summary(paths, root / "summary", title="bench", bootstrap=args.bootstrap, seed=0)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        # Wall time is the target; CPU time and the load average say how much other work on a
        # shared machine stretched it.
        print(
            f"build_summary: {seconds:.2f} s for {rows:,} rows (target < 10 s); "
            f"{cpu:.2f} s CPU; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        deltas = (root / "summary" / "deltas.csv").read_text().count("\n") - 1
        plots = len(list((root / "summary" / "plots").glob("*.png")))
        print(
            f"summary: {deltas} paired deltas, {plots} plots, report "
            f"{(root / 'summary' / 'report.html').stat().st_size / 1e6:.1f} MB"
        )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
