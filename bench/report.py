"""Time the report (`ckpteval.report.write_html`) on a synthetic sweep, and open it in Chromium.

The sweep: 1 run x 100 checkpoints (a baseline and 99 trained steps) x 20 tasks x 500 problems,
one greedy sample each: 2,000 cells, 1,000,000 samples, each with its generation line (a ~150
character code completion whose constants vary per sample, finish reason, token count) and its
score line (verdict, error type, a ~100 character stderr tail on failures). Prompts (~400
characters) are the same at every checkpoint, as in a real sweep. Pass probabilities rise with
step, with a dip at two steps.

Printed: writing the files (not a target), the aggregate's tables (`summarize`, not a target),
the PNG plots (not a target), the report build (`write_html`; target < 60 s at 1,000 checkpoints,
10M samples) and a rebuild of the same cells from the cache the first left (`cache`;
what the aggregate step does after each new checkpoint), the page's size and that of the blob
files beside it (a report whose blobs exceed `ckpteval.report.EXTERNAL_BLOBS` keeps them in
`report_files/`), and in Chromium the time until the overview is drawn (target < 3 s), until
the page is ready and until a drill-down with its completions is shown.

Usage: python bench/report.py [--keep DIR] [--ckpts 100] [--tasks 20] [--problems 500]
[--no-plots]
(--keep DIR: write the sweep there and keep it; a later run with the same DIR reuses it, and
its aggregate tables, pickled there: at 10M samples they take longer than everything else;
--no-plots: skip the PNG plots, which the report does not use)
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ckpteval.report import files_dir, write_html, write_plots
from ckpteval.report.page import CHROMIUM_ARGS
from ckpteval.summary import summarize


def write_sweep(root: Path, ckpts: int, tasks: int, problems: int) -> list[Path]:
    """Every cell's json, score lines and generation lines; return the json paths."""
    rng = np.random.default_rng(0)
    paths = []
    steps = [0, *range(100, 100 * ckpts, 100)]
    for t in range(tasks):
        task = f"task{t:02d}"
        difficulty = rng.normal(0.3 * (t % 4), 1.0, problems)
        prompts = [json.dumps(_prompt(task, p)) for p in range(problems)]
        for step in steps:
            skill = -1.5 + 3.0 * step / steps[-1] - (0.6 if step in (3000, 7000) else 0.0)
            passed = rng.random(problems) < 1.0 / (1.0 + np.exp(difficulty - skill))
            ckpt = "base" if step == 0 else f"step_{step}"
            paths.append(_write_cell(root, rng, ckpt, step, task, passed, prompts))
    return paths


def _write_cell(
    root: Path,
    rng: np.random.Generator,
    ckpt: str,
    step: int,
    task: str,
    passed: np.ndarray,
    prompts: list[str],
) -> Path:
    """One cell's three files. The lines are formatted from templates (what `json.dumps` of
    `_generation` and `_score` would write; the prompt is JSON-encoded once per task): at 10M
    samples a `json.dumps` per line took longer than the report build it feeds."""
    rel = Path("r") / ckpt / task / "greedy-s1"
    scores, generations = root / "scores" / rel, root / "generations" / rel
    scores.parent.mkdir(parents=True, exist_ok=True)
    generations.parent.mkdir(parents=True, exist_ok=True)
    consts = rng.integers(2, 99, (len(passed), 3)).tolist()
    gen_lines, score_lines = [], []
    for p, ((a, b, c), ok) in enumerate(zip(consts, passed.tolist())):
        completion = (
            f"    total = 0\\n    for x in xs:\\n        if x % {a} == {b % a}:\\n"
            f"            total += x * {c}\\n    return total\\n"
        )
        gen_lines.append(
            f'{{"task_id": "{task}/{p}", "sample_idx": 0, "prompt": {prompts[p]}, '
            f'"completion": "{completion}", "finish_reason": "stop", '
            f'"completion_tokens": {40 + a % 7}}}\n'
        )
        score_lines.append(
            f'{{"task_id": "{task}/{p}", "sample_idx": 0, "passed": true, "score": 1.0, '
            '"error_type": null, "stderr_tail": ""}\n'
            if ok
            else f'{{"task_id": "{task}/{p}", "sample_idx": 0, "passed": false, "score": 0.0, '
            '"error_type": "runtime_error", "stderr_tail": "Traceback (most recent call '
            f'last):\\n  File \\"test.py\\", line {a}, in check\\nAssertionError: '
            f'expected {a * b}, got {a + b}"}}\n'
        )
    generations.with_suffix(".jsonl").write_text("".join(gen_lines))
    scores.with_suffix(".jsonl").write_text("".join(score_lines))
    n = len(passed)
    value = float(passed.mean())
    cell = {
        "run": "r",
        "ckpt": ckpt,
        "step": step,
        "task": task,
        "variant": "greedy-s1",
        "sampling": "greedy",
        "seed": 1,
        "is_baseline": step == 0,
        "scorer_version": "bench",
        "model_hash": f"hash-{ckpt}",
        "checker": "python",
        "scoring": {"checker": "python", "evaluate.timeout": 10},
        "metrics": {"pass@1": {"value": value, "stderr": (value * (1 - value) / n) ** 0.5, "n": n}},
        "error_types": {"runtime_error": int(n - passed.sum())},
    }
    scores.with_suffix(".json").write_text(json.dumps(cell))
    return scores.with_suffix(".json")


def _prompt(task: str, p: int) -> str:
    return (
        f'def solve_{p}(xs: list[int]) -> int:\n    """{task} problem {p}: given a list of '
        "integers, return the sum of the elements that leave the given remainder, each "
        "multiplied by the factor stated in the tests. Examples:\n    >>> solve([1, 2, 3])\n"
        '    6\n    >>> solve([])\n    0\n    """\n'
    )


def open_in_chromium(path: Path) -> tuple[float, float, float]:
    """Seconds until the overview is drawn, until the whole page is ready (every blob parsed,
    the first drill-down loaded) and until the drill-down's completions are shown."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path="/usr/bin/chromium", args=list(CHROMIUM_ARGS)
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        start = time.perf_counter()
        page.goto(path.resolve().as_uri(), wait_until="commit")
        page.wait_for_selector("body[data-overview=yes]", timeout=120_000)
        overview = time.perf_counter() - start
        _print_cpu(cdp, "overview drawn")
        page.wait_for_selector("body[data-ready=yes]", timeout=120_000)
        ready = time.perf_counter() - start
        page.wait_for_selector("#cmp-out[data-state=ready]", timeout=120_000)
        drill = time.perf_counter() - start
        _print_cpu(cdp, "drill-down shown")
        browser.close()
    if errors:
        raise SystemExit(f"bench: the page reported errors: {errors[:3]}")
    return overview, ready, drill


def _print_cpu(cdp: Any, when: str) -> None:
    """The page's renderer CPU time so far (Chromium's own count; the wall-clock figures depend
    on the machine's load, this one much less)."""
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    cpu = metrics.get("ProcessTime")
    tasks = metrics.get("TaskDuration")
    print(
        f"chromium at {when}: renderer CPU {cpu if cpu is None else f'{cpu:.2f} s'}, "
        f"main-thread tasks {tasks if tasks is None else f'{tasks:.2f} s'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="write the sweep here and keep it")
    parser.add_argument("--ckpts", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--problems", type=int, default=500)
    parser.add_argument("--open", type=Path, help="only open this report in Chromium")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args()
    if args.open:
        overview, ready, drill = open_in_chromium(args.open)
        print(f"chromium: overview {overview:.2f} s, ready {ready:.2f} s, drill-down {drill:.2f} s")
        return
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        run(root, args.ckpts, args.tasks, args.problems, plots=not args.no_plots)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def run(root: Path, ckpts: int, tasks: int, problems: int, *, plots: bool = True) -> None:
    start = time.perf_counter()
    if (root / "scores").is_dir():  # --keep DIR of an earlier run: reuse its files
        paths = sorted((root / "scores").glob("*/*/*/*.json"))
        print(f"reusing {len(paths)} cells in {root}")
    else:
        paths = write_sweep(root, ckpts, tasks, problems)
        print(f"wrote {len(paths)} cells, {len(paths) * problems} samples: {_since(start)}")
    start = time.perf_counter()
    cached = root / "summary.pickle"
    if cached.is_file():
        summary = pickle.loads(cached.read_bytes())
        print(f"reusing the aggregate tables in {cached}")
    else:
        summary = summarize(paths, bootstrap=200)
        cached.write_bytes(pickle.dumps(summary))
        print(f"aggregate tables (summarize, bootstrap 200): {_since(start)}")
    pngs = []
    if plots:
        start = time.perf_counter()
        pngs = write_plots(summary, root / "summary" / "plots")
        print(f"PNG plots ({len(pngs)}): {_since(start)}")
    report = root / "summary" / "report.html"
    shutil.rmtree(root / "report_cache", ignore_errors=True)  # the first build: nothing kept yet
    build(summary, pngs, report, "report build")
    # the aggregate step reruns after each new checkpoint: the same build again
    build(summary, pngs, report, "report rebuild (same cells)")
    overview, ready, drill = open_in_chromium(report)
    print(
        f"chromium: overview drawn at {overview:.2f} s (target < 3 s); whole page read and ready "
        f"at {ready:.2f} s; drill-down with completions at {drill:.2f} s"
    )
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} (2 cores)")


def build(summary: Any, pngs: list[Any], report: Path, what: str) -> None:
    """Build the report and print its time and size. The CPU time counts the processes that
    read the cells (ended, so counted in `os.times`' children) and this one."""
    start, cpu, workers = time.perf_counter(), time.process_time(), _children_cpu()
    write_html(summary, pngs, report, cache=report.parent.parent / "report_cache")
    files = [p for p in files_dir(report).glob("*") if p.is_file()]
    own, workers = time.process_time() - cpu, _children_cpu() - workers
    print(
        f"{what}: {_since(start)} wall, {own + workers:.1f} s CPU ({own:.1f} s in this process, "
        f"{workers:.1f} s in the processes reading cells) (target < 60 s wall at 10M samples); "
        f"page {report.stat().st_size / 1e6:.1f} MB, "
        f"{len(files)} blob files beside it {sum(p.stat().st_size for p in files) / 1e6:.1f} MB"
    )


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def _since(start: float) -> str:
    return f"{time.perf_counter() - start:.1f} s"


if __name__ == "__main__":
    main()
