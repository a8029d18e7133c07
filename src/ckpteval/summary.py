"""Build a summary directory from the scored cells of a sweep: the aggregate step's outputs.

Input: the evaluate step's cell files (`ckpteval.aggregate.cells`). Output (`build_summary`), all
under `summary_dir`, each file written atomically:

| file | one row per |
| --- | --- |
| `metrics.parquet`, `.csv` | (cell, metric): `TIDY_COLUMNS` (`source_deleted`: the checkpoint's source is gone, its scores kept; `final`: the run's final checkpoint, saved without a step; `errored`, `errored_as`, `errored_at`: how the metric counts the samples the reward function gave no score) |
| `metrics.md` | checkpoint, by (run, step); `task/metric` columns, mean over seeds [95% interval] |
| `seeds.csv` | (run, ckpt, task, sampling, metric): mean, std, stderr and count over seeds |
| `configs.csv` | (run, task, sampling, metric): the sampling config across the run's checkpoints |
| `passk.csv` | (run, ckpt, task, sampling, k): pass@k from per-sample verdicts, seeds pooled |
| `errors.csv` | (cell, error type): count and fraction of the cell's samples |
| `hacks.csv` | (cell, hack type): count and fraction of the cell's samples (`HACK_COLUMNS`) |
| `truncation.csv` | cell with a `truncation_rate`: the rate, the threshold, flagged (`TRUNCATION_COLUMNS`) |
| `deltas.csv` | paired comparison: each checkpoint vs the run's baseline and vs the previous one (`DELTA_COLUMNS`; McNemar columns in `ckpteval.aggregate.deltas`) |
| `flips.csv` | (comparison, problem) whose verdict flipped: `FLIP_COLUMNS`, `direction` gained or lost |
| `training_curve.csv` | (run, task, variant, metric, step) the trainer logged too (`runs.<run>.train_logs`): both values, ckpteval's interval, the settings that differ, flagged (`ckpteval.aggregate.training`); only with `train_logs` |
| `missing.csv` | cell or per-sample file that could not be used, with its path and why |
| `summary.json` | run, checkpoint, task, variant: pass rate, counts, per problem (`write_summary_json`) |
| `plots/*.png`, `report.html`, `report_files/` | see `ckpteval.report` |

A missing or corrupt cell file never stops the build: the cell is listed in `missing.csv` and the
report, and everything else is built. A run without a baseline has no baseline comparisons.

A summary is built into a directory of its own and then put in place by `publish_summary`, so
that a build that fails (a full disk, logs the trainer moved) leaves the previous summary whole:
the workflow's aggregate job builds into `<outdir>/staging/_summary/` and rule `summary`
publishes it to `summary/`; `ckpteval aggregate` does the same in one go.

This module joins the two sides: `ckpteval.aggregate` computes the tables (and never imports the
report), `ckpteval.report` draws them (and never imports this module).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ckpteval import report
from ckpteval.aggregate import Summary
from ckpteval.aggregate.cells import Cell, load_cells, load_samples
from ckpteval.aggregate.deltas import delta_table, flip_table
from ckpteval.aggregate.markdown import metrics_markdown
from ckpteval.aggregate.tables import (
    TRUNCATION_THRESHOLD,
    config_table,
    error_table,
    hack_table,
    main_metrics,
    missing_table,
    passk_table,
    reward_errors,
    seed_table,
    tidy_table,
    truncation_flags,
    truncation_table,
)
from ckpteval.aggregate.training import training_table
from ckpteval.best import candidates, select_among
from ckpteval.errors import UserError
from ckpteval.io import atomic_open, iter_jsonl, write_json
from ckpteval.plan.layout import score_samples_of


def summarize(
    cell_jsons: Sequence[str | os.PathLike[str]],
    *,
    title: str = "ckpteval",
    bootstrap: int = 1000,
    seed: int = 0,
    truncation_threshold: float = TRUNCATION_THRESHOLD,
    main_metric: Mapping[str, str] | None = None,
) -> Summary:
    """Every table of the summary, in memory; `build_summary` writes them. `main_metric` is
    each task's chosen main metric (`tasks.<task>.main_metric`), where the config chooses one."""
    cells, problems = load_cells(cell_jsons)
    samples, sample_problems = load_samples(cells)
    tidy = tidy_table(cells, samples)
    metrics_by_task = main_metrics(cells, main_metric)
    seeds = seed_table(tidy)
    flips: list[dict[str, Any]] = []
    deltas = delta_table(cells, samples, metrics_by_task, n_boot=bootstrap, seed=seed, flips=flips)
    return Summary(
        title=title,
        tidy=tidy,
        seeds=seeds,
        configs=config_table(seeds),
        passk=passk_table(cells, samples, tidy),
        errors=error_table(cells, samples),
        deltas=deltas,
        missing=missing_table([*problems, *sample_problems]),
        main_metrics=metrics_by_task,
        n_cells=len(cells),
        hacks=hack_table(cells),
        flips=flip_table(flips),
        truncation=truncation_table(cells, truncation_threshold),
        reward_errors=reward_errors(tidy, metrics_by_task),
        best=default_selection(tidy, cells, samples, n_boot=bootstrap, seed=seed),
    )


def default_selection(
    tidy: pd.DataFrame, cells: Sequence[Cell], samples: pd.DataFrame, *, n_boot: int, seed: int
) -> dict[str, Any]:
    """What `ckpteval best` prints with its default rule (every task, weight 1, every run) on
    this summary, computed alike (`best.select_among` on the same cells and the same seed), for
    the report's "best" section; {"none": the reason} where the rule cannot choose (fewer than
    two trained checkpoints, a task under several sampling configs)."""
    try:
        tasks, keep, _ = candidates(tidy, {})
        chosen = select_among(
            cells, samples, tasks, keep, main_metrics(cells), n_boot=n_boot, seed=seed
        )
    except UserError as exc:
        return {"none": str(exc)}
    return asdict(chosen)


def build_summary(
    cell_jsons: Sequence[Path],
    summary_dir: Path,
    *,
    title: str = "ckpteval",
    bootstrap: int = 1000,
    seed: int = 0,
    deleted: Collection[str] = (),
    broken: Sequence[str] = (),
    waiting: Sequence[str] = (),
    finals: Collection[str] = (),
    truncation_threshold: float | None = None,
    main_metric: Mapping[str, str] | None = None,
    train_logs: Mapping[str, Mapping[str, Any]] | None = None,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    report_cache: Path | None = None,
    report_workers: int | None = None,
) -> Summary:
    """Build `summary_dir` from the cell jsons (see the module docstring for what is written);
    return what was built.
    `deleted` names checkpoints (`run/ckpt`) whose source is gone: their cells stay, marked in
    the tidy table's `source_deleted` column and listed in the report. `broken` are lines about
    checkpoints that look broken (ckpteval.config.Plan.broken_lines), shown in the report;
    `waiting` lines about checkpoints being written (Plan.waiting_lines), listed as waiting.
    `finals` names the final checkpoints (`run/ckpt`, saved without a step): the tidy table's
    `final` column, labelled "final" on the plots.
    `truncation_threshold` (None: `TRUNCATION_THRESHOLD`) is the truncation rate above which a
    cell's score is flagged as a lower bound.
    `train_logs` maps a run to its `train_logs` setting (`path`, `val_kwargs`, ...), whose curves
    are put beside the cells' metrics; `sampling` the sampling configs by name, to say which
    of the trainer's validation settings differ. `report_cache`: a directory outside
    `summary_dir` where the report keeps what it read of each cell for the next build
    (`ckpteval.report.cache`; None: nothing kept). `report_workers`: the processes the report
    reads cells in (None: one per CPU this process may use)."""
    threshold = _checked_settings(bootstrap, truncation_threshold)
    summary_dir = Path(summary_dir)
    summary = summarize(
        cell_jsons,
        title=title,
        bootstrap=bootstrap,
        seed=seed,
        truncation_threshold=threshold,
        main_metric=main_metric,
    )
    summary.broken = list(broken)
    summary.waiting = list(waiting)
    summary.tidy["source_deleted"] = (
        summary.tidy["run"].astype(str) + "/" + summary.tidy["ckpt"].astype(str)
    ).isin(set(deleted))
    summary.tidy["final"] = (
        summary.tidy["run"].astype(str) + "/" + summary.tidy["ckpt"].astype(str)
    ).isin(set(finals))
    if train_logs:
        summary.training = training_table(summary.tidy, train_logs, sampling or {})
    write_tables(summary, summary_dir, training_curve=bool(train_logs))
    plots = report.write_plots(summary, summary_dir / "plots")
    # report_files/ always exists: the workflow declares it (empty when the page holds its blobs)
    report.files_dir(summary_dir / "report.html").mkdir(parents=True, exist_ok=True)
    report.write_html(
        summary, plots, summary_dir / "report.html", cache=report_cache, workers=report_workers
    )
    write_summary_json(cell_jsons, summary_dir / "summary.json")
    return summary


def _checked_settings(bootstrap: int, truncation_threshold: float | None) -> float:
    """The truncation threshold to use; a `UserError` for settings no summary can be built with,
    before any file is read."""
    if bootstrap < 1:
        raise UserError(f"bootstrap: {bootstrap} resamples; give at least 1 (1000 is usual)")
    threshold = TRUNCATION_THRESHOLD if truncation_threshold is None else truncation_threshold
    if not 0 <= threshold <= 1:
        raise UserError(
            f"aggregate.truncation_threshold: {threshold} is not a share; give one in [0, 1]"
        )
    return threshold


def write_tables(summary: Summary, summary_dir: Path, *, training_curve: bool = False) -> None:
    """`metrics.parquet`, every CSV and `metrics.md` of the summary; `training_curve.csv` if
    `training_curve` (a run has `train_logs`: the file is then an output of the workflow, written
    even when no metric matched a logged curve)."""
    write_parquet(summary.tidy, summary_dir / "metrics.parquet")
    for name, frame in (
        ("metrics.csv", summary.tidy),
        ("seeds.csv", summary.seeds),
        ("configs.csv", summary.configs),
        ("passk.csv", summary.passk),
        ("errors.csv", summary.errors),
        ("hacks.csv", summary.hacks),
        ("truncation.csv", summary.truncation),
        ("deltas.csv", summary.deltas),
        ("flips.csv", summary.flips),
        ("missing.csv", summary.missing),
    ):
        write_csv(frame, summary_dir / name)
    if training_curve:
        write_csv(summary.training, summary_dir / "training_curve.csv")
    with atomic_open(summary_dir / "metrics.md") as handle:
        handle.write(
            metrics_markdown(
                summary.seeds,
                summary.title,
                summary.deltas,
                truncation_flags(summary.truncation, summary.main_metrics),
                summary.reward_errors,
                summary.main_metrics,
            )
        )


#: Files a summary has only with some settings (`training_curve.csv`: with `train_logs`): one
#: that the new summary has not is removed when it is published, not left from an older one.
OPTIONAL_FILES = ("training_curve.csv",)


#: Directories a build by an older ckpteval does not have (its report holds their files):
#: published empty from such a build, so a workflow that gained them needs no rebuild.
NEWER_DIRS = ("report_files",)


def publish_summary(built: Path, outputs: Sequence[Path]) -> None:
    """Put the complete summary in `built` in place: each of `outputs` (files and the plots
    directory of a summary directory) becomes its namesake in `built`, and an optional file that
    is not among them is removed beside them.

    Each file is hard-linked (copied where the file system has no hard links) under a temp name
    and renamed over the old one, the plots directory is swapped whole: a reader sees the old
    file or the new one, never a part. Called only once `built` is complete, so a build that
    failed never touches the summary people read."""
    outputs = [Path(out) for out in outputs]
    for out in outputs:
        source = Path(built) / out.name
        if not source.exists() and out.name not in NEWER_DIRS:
            raise FileNotFoundError(f"{source}: the summary build did not write it")
        out.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir() or out.name in NEWER_DIRS:
            _publish_dir(source, out)
        else:
            tmp = out.with_name(f".{out.name}.tmp")  # one publisher at a time: a stale one
            tmp.unlink(missing_ok=True)  # is debris of a killed one
            _link(source, tmp)
            os.replace(tmp, out)
    names = {out.name for out in outputs}
    for out_dir in {out.parent for out in outputs}:
        for name in OPTIONAL_FILES:
            if name not in names:
                (out_dir / name).unlink(missing_ok=True)


def _publish_dir(source: Path, out: Path) -> None:
    """`out` becomes a directory of the files of `source` (hidden ones left out: Snakemake's
    timestamp flag), swapped in by two renames."""
    new, old = (out.with_name(f".{out.name}.{part}") for part in ("new", "old"))
    for stale in (new, old):
        shutil.rmtree(stale, ignore_errors=True)
    new.mkdir()
    for file in sorted(source.iterdir()) if source.is_dir() else []:
        if file.is_file() and not file.name.startswith("."):
            _link(file, new / file.name)
    if out.exists():
        out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _link(source: Path, dest: Path) -> None:
    """`dest` as a hard link to `source`: the summary costs no second copy of its files (each
    build writes new ones, so the link never sees a file change); a copy where the file system
    has no hard links."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def write_summary_json(cell_jsons: Sequence[Path], path: Path) -> None:
    """`summary.json`: per run, checkpoint (by step), task and variant, what the users' own
    per-checkpoint scripts print: the pass rate (pass@1, else accuracy) with its counts, the
    official and generated tests' pass rates (stdio), the error types, the per-file breakdown of
    replayed solutions, and per problem: samples, passes, the first sample's verdict and (stdio)
    the test it failed first. Cells that cannot be read are left out (missing.csv lists them)."""
    runs: dict[str, Any] = {}
    for cell_path in sorted(map(Path, cell_jsons)):
        try:
            cell = json.loads(cell_path.read_text(encoding="utf-8"))
            run, ckpt, task, variant = (str(cell[k]) for k in ("run", "ckpt", "task", "variant"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        ckpts = runs.setdefault(run, {})
        ckpts.setdefault(ckpt, {"step": cell.get("step"), "tasks": {}})["tasks"].setdefault(
            task, {}
        )[variant] = _cell_entry(cell, score_samples_of(cell_path))
    ordered = {
        run: dict(
            sorted(ckpts.items(), key=lambda kv: (kv[1]["step"] is None, kv[1]["step"] or 0, kv[0]))
        )
        for run, ckpts in sorted(runs.items())
    }
    write_json(path, {"runs": ordered})


def _cell_entry(cell: dict[str, Any], samples: Path) -> dict[str, Any]:
    """One cell's `summary.json` entry; per problem only when its per-sample file exists."""
    metrics = cell.get("metrics") or {}
    main = metrics.get("pass@1") or metrics.get("accuracy") or {}
    entry: dict[str, Any] = {
        "pass_rate": main.get("value"),
        "n_problems": cell.get("n_problems"),
        "n_samples": cell.get("n_samples"),
        "error_types": cell.get("error_types", {}),
        **{
            name: metrics[name]["value"]
            for name in ("official_tests_pass_rate", "generated_tests_pass_rate")
            if name in metrics
        },
    }
    if "per_file" in cell:
        entry["per_file"] = cell["per_file"]
    if samples.exists():
        problems = _problem_records(samples)
        entry["n_passed"] = sum(r["passed"] for r in problems.values())
        entry["problems"] = problems
    return entry


def _problem_records(samples: Path) -> dict[str, dict[str, Any]]:
    """task_id -> samples, passes, the first sample's verdict and (stdio) the test it failed
    first; damaged lines are skipped (the tables' reading names them in missing.csv)."""
    problems: dict[str, dict[str, Any]] = {}
    for line in iter_jsonl(samples, errors=[]):
        tid = str(line.get("task_id"))
        record = problems.setdefault(tid, {"samples": 0, "passed": 0})
        record["samples"] += 1
        record["passed"] += bool(line.get("passed"))
        if "verdict" not in record:
            record["verdict"] = line.get("error_type") or "passed"
            if line.get("first_failed_set"):
                record["first_failed_test"] = line.get("first_failed_test")
                record["first_failed_set"] = line["first_failed_set"]
    return problems


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_open(path, "w") as handle:
        frame.to_csv(handle, index=False)


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Parquet through a temp name in the same directory, renamed when complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
