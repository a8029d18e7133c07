"""The report's data: what the page's charts, tables and drill-down read, built from a `Summary`
and the cells' files.

Everything here comes from the summary's tables (the CIs are the seed table's intervals as the PNG
plots draw them, the significance is deltas.csv's bootstrap interval and Holm-adjusted McNemar p) or
from the cells'
own files; nothing is computed that the aggregate does not already state. Small tables go into
one JSON document; per-sample data goes into compressed blobs (`ckpteval.report.samples`).
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import re
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ckpteval.aggregate import Summary
from ckpteval.aggregate.markdown import error_marks
from ckpteval.aggregate.tables import (
    CONFIDENCE,
    HACK_RATE,
    REWARD_ERROR_RATE,
    truncation_flags,
)
from ckpteval.metrics import LENGTH_METRICS
from ckpteval.plan.layout import generation_file_of_score, score_samples_file
from ckpteval.report.cache import CellCache
from ckpteval.report.samples import encode_blob, read_cell_samples
from ckpteval.sandbox import describe_isolation

log = logging.getLogger(__name__)

#: The deltas.csv columns the page reads (the Tables section has them all).
DELTA_FIELDS = [
    "run",
    "task",
    "sampling",
    "comparison",
    "ckpt",
    "ref_ckpt",
    "delta",
    "ci_low",
    "ci_high",
    "significant",
    "regression",
    "mcnemar_p",
    "p_holm",
]
#: Metrics charted per task besides the main one.
SIDE_METRICS = (HACK_RATE, REWARD_ERROR_RATE, *LENGTH_METRICS)
#: A reward task's per-data-source metrics (`val-core/<data_source>/reward/mean@N`, named as
#: verl logs them): each task's "reward per data source" chart.
SOURCE_PREFIX = "val-core/"


@dataclass
class Payload:
    """The page's JSON document and its blobs (id -> base64 gzip JSON)."""

    data: dict[str, Any]
    blobs: dict[str, str] = field(default_factory=dict)
    #: The verdict matrices (blob id -> matrix), as built, for the build's own use.
    matrices: dict[str, dict[str, Any]] = field(default_factory=dict)


def build_payload(
    summary: Summary,
    focus: tuple[str, ...] | None = None,
    cache: Path | None = None,
    workers: int | None = None,
    reading: CellReading | None = None,
) -> Payload:
    """Every table the page shows, plus per-cell sample blobs. `focus` is the (ckpt_a, ckpt_b)
    pair the drill-down opens on (`ckpteval compare --html`), as "run:ckpt" labels, and
    optionally the "task|sampling" it opens on. `cache`: a directory where the build keeps
    what it read of each cell for the next build (`ckpteval.report.cache`). `workers`:
    processes that read cells (None: one per CPU this process may use). `reading`: the cells
    as a caller started reading them (`CellReading`; then `cache` and `workers` are its)."""
    if reading is None:
        with CellReading(summary, CellCache(cache), workers or cpus()) as started:
            return build_payload(summary, focus, reading=started)
    payload = Payload(
        {
            "title": summary.title,
            "confidence": CONFIDENCE,
            "tasks": [{"task": t, "metric": m} for t, m in summary.main_metrics.items()],
            "checkpoints": _checkpoints(summary.tidy),
            "series": _series(summary),
            "training": _training(summary),
            "deltas": _columns(summary.deltas[DELTA_FIELDS]),
            "errors": _errors(summary.errors),
            "flags": _flags(summary),
            "provenance": {},
            "focus": list(focus) if focus else None,
            "best": summary.best or None,
        }
    )
    raws = _add_samples(summary, payload, reading)
    _add_provenance(summary.tidy, raws, payload)
    return payload


def _add_provenance(tidy: pd.DataFrame, raws: dict[str, Any], payload: Payload) -> None:
    """Per task a blob of its cells' provenance (`_provenance`), named in the data's
    `provenance` (task -> blob id): read only when a number's provenance is asked for, so the
    overview's data does not grow with it (6 MB at 1,000 checkpoints x 20 tasks)."""
    by_task: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for key, cells in _provenance(tidy, raws).items():
        by_task.setdefault(key.rsplit("|", 1)[1], {})[key] = cells
    for index, (task, table) in enumerate(by_task.items()):
        payload.blobs[f"prov{index}"] = encode_blob(table)
        payload.data["provenance"][task] = f"prov{index}"


def cpus() -> int:
    """The CPUs this process may use (a Slurm job's share, not the node's)."""
    return max(1, len(os.sched_getaffinity(0)))


def _checkpoints(tidy: pd.DataFrame) -> list[dict[str, Any]]:
    """(run, ckpt, step, is_baseline) in the tidy table's order: baseline first, then by step."""
    rows = tidy[["run", "ckpt", "step", "is_baseline"]].drop_duplicates(["run", "ckpt"])
    return _records(rows)


def _series(summary: Summary) -> list[dict[str, Any]]:
    """Seed means with their 95% interval (the seed table's: Wilson's for scores in [0, 1]) and
    n, for each task's main metric,
    the side metrics (hack rate, reward errors, lengths, truncation) and a reward task's per
    data source rewards."""
    seeds = summary.seeds
    wanted = {*summary.main_metrics.values(), *SIDE_METRICS}
    per_source = seeds["metric"].astype(str).str.startswith(SOURCE_PREFIX)
    rows = seeds[seeds["metric"].isin(wanted) | per_source].copy()
    if rows.empty:
        return []
    keys = ["run", "ckpt", "task", "sampling", "metric"]
    n = summary.tidy.groupby(keys, sort=False)["n"].max().rename("n")
    rows = rows.join(n, on=keys)
    rows["lo"], rows["hi"] = rows["ci_low"], rows["ci_high"]
    marks, words = _error_words(summary)
    labels = list(zip(*(rows[k] for k in keys)))
    rows["errors"] = [words.get(label) for label in labels]
    rows["errors_mark"] = [marks.get(label) for label in labels]
    cols = ["run", "ckpt", "step", "is_baseline", "task", "sampling", "metric", "mean"]
    out = _records(rows[[*cols, "lo", "hi", "n", "seeds", "errors", "errors_mark"]])
    return [{k: v for k, v in r.items() if v is not None or k not in _ERROR_FIELDS} for r in out]


#: A series row's words on errored samples: absent on a row that has none (a chart's tooltip
#: then shows nothing for them).
_ERROR_FIELDS = ("errors", "errors_mark")


def _error_words(
    summary: Summary,
) -> tuple[dict[tuple[str, ...], str], dict[tuple[str, ...], str]]:
    """(run, ckpt, task, sampling, metric) -> the mark beside its value and its words, for each
    number of a checkpoint entry with errored samples (`Summary.reward_errors`); the entry's
    main metric gets the entry's words when it does not count them itself."""
    errors = summary.reward_errors
    marks = {key: mark.strip() for key, mark in error_marks(errors, summary.main_metrics).items()}
    words: dict[tuple[str, ...], str] = {}
    for key, entry in errors.items():
        for metric, errored in entry.numbers:
            clause = errored.words(metric)
            words[(*key, metric)] = "; ".join(filter(None, [words.get((*key, metric)), clause]))
        main = summary.main_metrics.get(key[2])
        if main is not None:
            words.setdefault((*key, main), entry.words())
    return marks, words


def _training(summary: Summary) -> list[dict[str, Any]]:
    """The trainer's logged validation curve beside ckpteval's value at the same steps, as the
    per-task panel draws them: a row per (run, variant, metric, step, source), where source is
    "ckpteval" (its 95% interval as lo/hi) or "trainer" (the logged value, under its own name)."""
    rows: list[dict[str, Any]] = []
    for r in _records(summary.training):
        base = {k: r[k] for k in ("run", "task", "step", "settings", "flagged")}
        label = f"{r['run']} {r['metric']} {r['variant']}"
        rows.append(
            {
                **base,
                "metric": r["metric"],
                "series": f"ckpteval {label}",
                "mean": r["ckpteval"],
                "lo": r["low"],
                "hi": r["high"],
            }
        )
        rows.append(
            {
                **base,
                "metric": r["trainer_metric"],
                "series": f"trainer {label}",
                "mean": r["trainer"],
                "lo": r["trainer"],
                "hi": r["trainer"],
            }
        )
    return rows


def _errors(errors: pd.DataFrame) -> list[dict[str, Any]]:
    """Fraction of samples per error type and checkpoint, mean over variants."""
    if errors.empty:
        return []
    keys = ["run", "ckpt", "step", "task", "error_type"]
    mean = errors.groupby(keys, sort=False, dropna=False)["fraction"].mean().reset_index()
    return _records(mean.dropna(subset=["fraction"]))


def _flags(summary: Summary) -> list[dict[str, Any]]:
    """What the overview lists first: regressions, truncated scores, reward hacks, reward
    function errors, missing files and broken checkpoints, each with where its detail is."""
    flags: list[dict[str, Any]] = []
    deltas = summary.deltas
    if not deltas.empty:
        for row in deltas[deltas["regression"].astype(bool)].itertuples(index=False):
            flags.append(
                {
                    "kind": "regression",
                    "text": f"{row.run} {row.ckpt} vs {row.ref_ckpt} ({row.comparison}): "
                    f"{row.task} {row.metric} {row.delta:+.3f} "
                    f"[{row.ci_low:+.3f}, {row.ci_high:+.3f}]",
                    "run": row.run,
                    "task": row.task,
                    "sampling": row.sampling,
                    "a": row.ref_ckpt,
                    "b": row.ckpt,
                }
            )
    for (run, ckpt, task, sampling, metric), share in truncation_flags(
        summary.truncation, summary.main_metrics
    ).items():
        text = f"{run} {ckpt} {task} ({sampling}): {metric} is a lower bound, {share:.0%} cut"
        flags.append({"kind": "truncation", "text": text, "run": run, "task": task})
    flags += _hack_flags(summary.seeds)
    for (run, ckpt, task, sampling), entry in summary.reward_errors.items():
        text = f"{run} {ckpt} {task} ({sampling}): {entry.words()}"
        flags.append({"kind": "reward_errors", "text": text, "run": run, "task": task})
    for row in summary.missing.itertuples(index=False):
        text = f"{row.kind} {row.path}: {row.reason}"
        flags.append({"kind": "missing", "text": text, "task": row.task or None})
    flags += [{"kind": "broken", "text": line} for line in summary.broken]
    flags += [{"kind": "waiting", "text": line} for line in summary.waiting]
    return flags


def _hack_flags(seeds: pd.DataFrame) -> list[dict[str, Any]]:
    rates = seeds[(seeds["metric"] == HACK_RATE) & (seeds["mean"] > 0)]
    return [
        {
            "kind": "hack",
            "text": f"{row.run} {row.ckpt} {row.task} ({row.sampling}): hack rate {row.mean:.1%}",
            "run": row.run,
            "task": row.task,
        }
        for row in rates.itertuples(index=False)
    ]


def _provenance(tidy: pd.DataFrame, raws: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """ "run|ckpt|task" -> its cells: file, variant, model hash, scorer version, and from the
    cell's json (`raws`: source -> fields) settings and sandbox (`bwrap (rootless); not
    counted: ...`)."""
    out: dict[str, list[dict[str, Any]]] = {}
    cells = tidy.drop_duplicates("source")
    for row in cells.itertuples(index=False):
        out.setdefault(f"{row.run}|{row.ckpt}|{row.task}", []).append(
            {
                "variant": row.variant,
                "source": row.source,
                "model_hash": row.model_hash,
                "scorer_version": row.scorer_version,
                **raws[row.source],
            }
        )
    return out


class CellReading:
    """The cells of a build being read: each cell's entry (blob, verdict counts, provenance
    fields) from `cache` when its files are the ones it saw, the others read by `workers`
    processes in the background (the constructor returns at once, `entries` waits), so that
    the build computes its tables meanwhile. Processes, not threads: all of a cell's work but
    zlib's holds the GIL (msgspec's parsing and encoding, the Python between them). The
    processes are forked, so they start in milliseconds with the parent's modules and a
    Snakemake script is not run again in them, as a spawned process would run it."""

    def __init__(self, summary: Summary, cache: CellCache, workers: int) -> None:
        self.cache = cache
        self.rows = list(summary.tidy.drop_duplicates("source").itertuples(index=False))
        cells = [(row.source, row.task) for row in self.rows]
        self.cells = cells
        self.keys = [
            cache.key(
                source, [source, score_samples_file(source), generation_file_of_score(source)]
            )
            for source, _ in cells
        ]
        self.found: list[dict[str, Any] | None] = [
            cache.get(source, key) for (source, _), key in zip(cells, self.keys)
        ]
        missing = [i for i, entry in enumerate(self.found) if entry is None]
        known = {task: set(cache.task_prompts(task)) for task in {cells[i][1] for i in missing}}
        parallel = workers > 1 and len(missing) >= PARALLEL_CELLS
        self.runs = _runs(missing, cells, workers) if parallel else [missing] if missing else []
        jobs = [[cells[i] for i in run] for run in self.runs]
        self.readers = _Readers(jobs, known, workers) if parallel else None
        self.results: list[Any] = [] if parallel else [_read_entries(job, known) for job in jobs]

    def entries(self) -> list[dict[str, Any]]:
        """Every cell's entry, in the cells' order; the read ones kept in the cache and their
        prompts added to the task's in the cells' order, so the prompts kept (a problem's
        first) are the same however the cells were shared among the processes."""
        if self.readers is not None:
            self.results = self.readers.results()
        read: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        for run, result in zip(self.runs, self.results):
            read.update(zip(run, result))
        for i in sorted(read):
            entry, prompts = read[i]
            source, task = self.cells[i]
            self.cache.add_prompts(task, prompts)
            self.cache.put(source, self.keys[i], entry)
            self.found[i] = entry
        return self.found  # type: ignore[return-value]

    def __enter__(self) -> CellReading:
        return self

    def __exit__(self, *exc: object) -> None:
        """The processes stopped (a build that failed meanwhile does not wait for them)."""
        if self.readers is not None:
            self.readers.stop()


class _Readers:
    """Forked processes that read `jobs` (lists of (source, task) cells): each takes the next
    job from a counter they share and sends all it read when none is left. Nothing passes
    through this process between two jobs: with a process pool each next job and each result
    waited for this process's threads, which wait for the GIL its tables hold (at 10M samples
    the readers stood idle seconds between jobs while the tables were built)."""

    def __init__(
        self, jobs: list[list[tuple[str, str]]], known: dict[str, set[str]], workers: int
    ) -> None:
        context = multiprocessing.get_context("fork")
        self.count = len(jobs)
        taken = context.Value("i", 0)
        self.pipes: list[Connection] = []
        self.processes: list[BaseProcess] = []
        for _ in range(min(workers, len(jobs))):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_read_jobs, args=(jobs, known, taken, send), daemon=True
            )
            process.start()
            send.close()
            self.pipes.append(receive)
            self.processes.append(process)

    def results(self) -> list[Any]:
        """Each job's entries, in the jobs' order, once every process sent its own."""
        out: list[Any] = [None] * self.count
        waiting = dict(zip(self.pipes, self.processes))
        while waiting:
            for pipe in wait(list(waiting)):
                process = waiting.pop(pipe)  # type: ignore[call-overload]
                try:
                    done = pipe.recv()
                except EOFError:
                    process.join()
                    raise RuntimeError(
                        f"report: a process reading cells ended (exit code {process.exitcode})"
                    ) from None
                if isinstance(done, str):
                    raise RuntimeError(f"report: a process reading cells failed:\n{done}")
                for index, result in done:
                    out[index] = result
                process.join()
        return out

    def stop(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()
        for pipe in self.pipes:
            pipe.close()


def _read_jobs(
    jobs: list[list[tuple[str, str]]],
    known: dict[str, set[str]],
    taken: Any,
    pipe: Connection,
) -> None:
    """A reading process: the next job not taken, until none is left; then (job index, its
    entries) of each it read, or the traceback of what failed, sent on `pipe`."""
    done = []
    try:
        while True:
            with taken.get_lock():
                index = taken.value
                taken.value += 1
            if index >= len(jobs):
                break
            done.append((index, _read_entries(jobs[index], known)))
    except Exception:
        pipe.send(traceback.format_exc())
    else:
        pipe.send(done)
    finally:
        pipe.close()


def _add_samples(summary: Summary, payload: Payload, reading: CellReading) -> dict[str, Any]:
    """Per cell a blob of its samples; per task a blob of the prompts of its problems; per
    (task, sampling) a blob of its verdict matrix and a `groups` entry naming them. A group's
    checkpoints are "run:ckpt" labels of every run, so any two can be compared, across runs
    too. A cell whose files the cache has seen is not read again. Returns each cell's fields
    of its json that the provenance shows (source -> fields)."""
    rows, entries, cache = reading.rows, reading.entries(), reading.cache
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    raws: dict[str, Any] = {}
    for index, (row, entry) in enumerate(zip(rows, entries)):
        cell_id = f"c{index}"
        payload.blobs[cell_id] = entry["blob"]
        raws[row.source] = entry["raw"]
        group = groups.setdefault((row.task, row.sampling), {})
        ckpt = group.setdefault(f"{row.run}:{row.ckpt}", {"cells": [], "verdicts": []})
        ckpt["cells"].append({"id": cell_id, "variant": row.variant})
        ckpt["verdicts"].append(entry["verdicts"])
    payload.data["groups"] = [
        _group(payload, index, key, ckpts) for index, (key, ckpts) in enumerate(groups.items())
    ]
    for task in dict.fromkeys(task for task, _ in groups):
        known = cache.task_prompts(task)
        shown = set().union(*(g["problems"] for g in _matrices(payload, task)))
        payload.blobs[f"p-{task}"] = encode_blob({k: v for k, v in known.items() if k in shown})
    cache.close()
    log.info("report: %d cells from the cache, %d read from their files", cache.hits, cache.misses)
    return raws


#: Cells read at least to use more than one process: below it (a rebuild after one new
#: checkpoint) starting them costs more than they save.
PARALLEL_CELLS = 64
#: Cells per job of a process at most: jobs of one task each (its prompts found once per job)
#: and small enough to share the cells evenly among the processes.
JOB_CELLS = 250


def _runs(indices: list[int], cells: list[tuple[str, str]], workers: int) -> list[list[int]]:
    """`indices` of `cells` cut into jobs: per task, runs of its cells in order, of near equal
    length, at most `JOB_CELLS` and at least two jobs per worker overall."""
    by_task: dict[str, list[int]] = {}
    for i in indices:
        by_task.setdefault(cells[i][1], []).append(i)
    size = max(1, min(JOB_CELLS, -(-len(indices) // (2 * workers))))
    jobs = []
    for run in by_task.values():
        parts = -(-len(run) // size)
        step = -(-len(run) // parts)
        jobs += [run[start : start + step] for start in range(0, len(run), step)]
    return jobs


def _read_entries(
    cells: list[tuple[str, str]], known: dict[str, set[str]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(entry, prompts it found) of each (source, task) cell, read in order; `known` (task ->
    the task_ids whose prompts are known) is not changed. A verdict column ("ids", "n") equal
    to the one of the task's cell before is that same list: the process pickles it once for
    all its cells (at 10M samples 10M task_ids were unpickled by the build, alone, after the
    processes ended) and the verdict matrices join the distinct lists only (`_group`)."""
    seen = {task: set(ids) for task, ids in known.items()}
    before: dict[str, dict[str, list[Any]]] = {}
    out = []
    for source, task in cells:
        samples = read_cell_samples(source, seen.setdefault(task, set()))
        seen[task].update(samples.prompts)
        verdicts = samples.verdicts
        last = before.setdefault(task, verdicts)
        for column in ("ids", "n"):
            if verdicts[column] == last[column]:
                verdicts[column] = last[column]
        before[task] = verdicts
        raw = _read_json(source)
        entry = {
            "blob": encode_blob(samples.blob()),
            "verdicts": verdicts,
            "raw": {
                "scoring": raw.get("scoring"),
                "checker": raw.get("checker"),
                "sandbox": describe_isolation(raw),
                "chat_template": raw.get("chat_template"),
                "generation_file": raw.get("generation_file"),
            },
        }
        out.append((entry, samples.prompts))
    return out


def _group(
    payload: Payload, index: int, key: tuple[str, str], ckpts: dict[str, Any]
) -> dict[str, Any]:
    """One (task, sampling): its checkpoints' cells and the verdict-matrix blob, whose
    `passed[c][p]` / `n[c][p]` are checkpoint c's passed and scored samples of problem p."""
    distinct = {id(v["ids"]): v["ids"] for c in ckpts.values() for v in c["verdicts"]}
    problems = sorted(set().union(*distinct.values()), key=_natural)
    passed, n = [], []
    for c in ckpts.values():
        row_passed, row_n = _verdict_row(c["verdicts"], problems)
        passed.append(row_passed)
        n.append(row_n)
    matrix = {"problems": problems, "passed": passed, "n": n}
    blob = f"v{index}"
    payload.blobs[blob] = encode_blob(matrix)
    payload.matrices[blob] = matrix
    task, sampling = key
    return {
        "task": task,
        "sampling": sampling,
        "ckpts": list(ckpts),
        "cells": [c["cells"] for c in ckpts.values()],
        "verdicts": blob,
        "prompts": f"p-{task}",
    }


def _verdict_row(
    verdicts: list[dict[str, list[Any]]], problems: list[str]
) -> tuple[list[int], list[int]]:
    """A checkpoint's passed and scored samples of each of `problems`, summed over its cells'
    verdict columns (0 where it has none). A checkpoint of one cell that scored every problem,
    in order (the usual one), is its columns as they are: at 10M samples a lookup per problem
    was seconds of a rebuild."""
    if len(verdicts) == 1 and verdicts[0]["ids"] == problems:
        return list(verdicts[0]["passed"]), list(verdicts[0]["n"])
    counts: dict[str, list[int]] = {}
    for cell in verdicts:
        for task_id, passed, n in zip(cell["ids"], cell["passed"], cell["n"]):
            count = counts.setdefault(task_id, [0, 0])
            count[0] += passed
            count[1] += n
    rows = [counts.get(p, _NONE) for p in problems]
    return [row[0] for row in rows], [row[1] for row in rows]


#: A problem's (passed, scored) samples at a checkpoint that has none of it.
_NONE = [0, 0]


def _matrices(payload: Payload, task: str) -> list[dict[str, Any]]:
    """The verdict matrices of `task`'s groups."""
    return [payload.matrices[g["verdicts"]] for g in payload.data["groups"] if g["task"] == task]


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts: NaN and NA become null, numpy scalars Python ones."""
    out = frame.astype(object).where(frame.notna(), None)
    return [{k: _plain(v) for k, v in row.items()} for row in out.to_dict("records")]


def _columns(frame: pd.DataFrame) -> dict[str, list[Any]]:
    """`frame` as JSON-ready columns (as `_records` writes rows): a long table's field names
    once, not once per row (deltas.csv at 1,000 checkpoints x 20 tasks: 4 MB, not 10)."""
    out = frame.astype(object).where(frame.notna(), None)
    return {name: [_plain(v) for v in out[name].tolist()] for name in out.columns}


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):  # math: a 30th of numpy's time
        return None
    return value


def _natural(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _read_json(path: str | Path) -> dict[str, Any]:
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def checkpoint_labels(payload: Payload) -> Sequence[str]:
    """ "run:ckpt" of every checkpoint, in order (what `focus` and the page's selects use)."""
    return [f"{c['run']}:{c['ckpt']}" for c in payload.data["checkpoints"]]
