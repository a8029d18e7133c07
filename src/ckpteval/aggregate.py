"""Aggregate the scored cells of a sweep: one tidy table, seed/config analyses, paired deltas.

Input: the evaluate step's files, one pair per cell (run, ckpt, task, variant) under
`scores/{run}/{ckpt}/{task}/`:
- `{variant}.json`: the cell's metrics (`{"metrics": {name: {"value", "stderr", "n"}}}`, with
  `hack_rate` among them when the scorer reports reward hacks), error type and hack type counts
  (`error_types`, `hack_types`) and provenance (`run`, `ckpt`, `step`, `task`, `variant`, `sampling`, `seed`,
  `is_baseline`, `scorer_version`, `model_hash`, ...).
- `{variant}.jsonl`: one line per (problem, sample) with `task_id`, `sample_idx`, `passed`, `score`.

Output (`build_summary`), all under `summary_dir`, each file written atomically:

| file | one row per |
| --- | --- |
| `metrics.parquet`, `.csv` | (cell, metric): `TIDY_COLUMNS` (`source_deleted`: the checkpoint's source is gone, its scores kept) |
| `metrics.md` | checkpoint, by (run, step); `task/metric` columns, mean over seeds ± stderr |
| `seeds.csv` | (run, ckpt, task, sampling, metric): mean, std, stderr and count over seeds |
| `configs.csv` | (run, task, sampling, metric): the sampling config across the run's checkpoints |
| `passk.csv` | (run, ckpt, task, sampling, k): pass@k from per-sample verdicts, seeds pooled |
| `errors.csv` | (cell, error type): count and fraction of the cell's samples |
| `hacks.csv` | (cell, hack type): count and fraction of the cell's samples (`HACK_COLUMNS`) |
| `truncation.csv` | cell with a `truncation_rate`: the rate, the threshold, flagged (`TRUNCATION_COLUMNS`) |
| `deltas.csv` | paired comparison: each checkpoint vs the run's baseline and vs the previous one (`DELTA_COLUMNS`; McNemar columns below) |
| `flips.csv` | (comparison, problem) whose verdict flipped: `FLIP_COLUMNS`, `direction` gained or lost |
| `missing.csv` | cell or per-sample file that could not be used, with its path and why |
| `summary.json` | run, checkpoint, task, variant: pass rate, counts, per problem (`write_summary_json`) |
| `plots/*.png`, `report.html` | see `ckpteval.report` |

A missing or corrupt cell file never stops the build: the cell is listed in `missing.csv` and the
report, and everything else is built. A run without a baseline has no baseline comparisons.

The main metric of a task (plots, deltas) is the one its cells name as `primary_metric` (harness
tasks do: the metric their per-sample `score` holds), else `pass@1` when they report it, else the
first metric they report other than `compile_rate`, `hack_rate` and the length metrics
(`ckpteval.metrics.LENGTH_METRICS`: token counts and truncation rates). `hack_rate` (the share of a
cell's samples that attempted a reward hack, `ckpteval.checkers.HACK_TYPES`) is a metric row like
any other in the tidy table, `metrics.md` and the seed tables, and has its own plot and report
section. The length metrics are rows of the tidy table and the seed tables too, but `metrics.md` and
the report show them in a table of their own ("Length and truncation"), with curves over steps. A
cell whose `truncation_rate` exceeds the threshold (`aggregate.truncation_threshold`, default
`TRUNCATION_THRESHOLD`; a rate exactly at it is not flagged) has a score that is a lower bound:
its checkpoint's main-metric value is marked in `metrics.md` (with a footnote giving the share of
its samples that hit the token budget) and in the report, and `truncation.csv` lists every cell's
rate and flag. Paired deltas compare the mean per-sample value
(`passed` for pass@1 tasks, so the delta is a pass@1 difference; `score` otherwise) of two
checkpoints over the (task_id, seed, sample_idx) both have, for one sampling config with its seeds
pooled; the interval is a percentile bootstrap over problems (`ckpteval.stats.paired_bootstrap`).

Beside the interval, `deltas.csv` carries McNemar's exact test on per-problem verdicts
(`ckpteval.stats.paired_flips`; a problem is solved when more than half of its paired samples
pass): `paired_test` is `mcnemar-exact`, or says why there is none (`none: scores not 0/1` for a
harness metric such as an F1 score, `none: no pairs`); `n_gained` / `n_lost` count the problems
unsolved by the reference and solved by the checkpoint / the reverse, out of `n_problems`;
`mcnemar_p` is the two-sided exact p-value; `mde` the minimum detectable effect at alpha 0.05 and
power 0.8 for that many problems (`ckpteval.stats.paired_mde`): a smaller difference is not
detectable at this task's size. `flips.csv` lists the gained and lost problems by task_id
(`ckpt_a` the reference, `ckpt_b` the checkpoint). Definitions: docs/statistics.md.

A comparison of cells whose prompts went through different chat templates (the cells'
`chat_template` provenance, ckpteval.chat_templates) is flagged (`chat_templates_differ`), and
`metrics.md` and the report say so in one line (`TEMPLATE_NOTE`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from ckpteval.errors import UserError
from ckpteval.io import atomic_open, iter_jsonl
from ckpteval.metrics import LENGTH_METRICS
from ckpteval.stats import (
    conservative_stderr,
    paired_bootstrap,
    paired_flips,
    pass_at_k_curve,
    per_problem_means,
)

TIDY_COLUMNS = [
    "run",
    "step",
    "ckpt",
    "task",
    "variant",
    "sampling",
    "seed",
    "metric",
    "value",
    "stderr",
    "n",
    "scorer_version",
    "model_hash",
    "is_baseline",
    "source",
    "source_deleted",
]
SEED_COLUMNS = [
    "run",
    "step",
    "ckpt",
    "is_baseline",
    "task",
    "sampling",
    "metric",
    "mean",
    "std",
    "stderr",
    "n_seeds",
    "seeds",
    "cell_stderr",
]
CONFIG_COLUMNS = [
    "run",
    "task",
    "sampling",
    "metric",
    "n_ckpts",
    "n_seeds",
    "mean",
    "first_step",
    "first_value",
    "last_step",
    "last_value",
    "max_step",
    "max_value",
    "baseline_value",
]
PASSK_COLUMNS = [
    "run",
    "step",
    "ckpt",
    "is_baseline",
    "task",
    "sampling",
    "seeds",
    "k",
    "value",
    "stderr",
    "n_problems",
    "min_samples",
]
ERROR_COLUMNS = [
    "run",
    "step",
    "ckpt",
    "is_baseline",
    "task",
    "variant",
    "sampling",
    "seed",
    "error_type",
    "count",
    "fraction",
]
HACK_COLUMNS = [
    "run",
    "step",
    "ckpt",
    "is_baseline",
    "task",
    "variant",
    "sampling",
    "seed",
    "hack",
    "count",
    "fraction",
]
#: The metric of a cell's reward-hack share (`ckpteval.evaluate`); never a task's main metric.
HACK_RATE = "hack_rate"
#: Metrics that are never a task's main metric: they describe the samples, not their success.
NOT_MAIN_METRICS = ("compile_rate", HACK_RATE, *LENGTH_METRICS)
#: Default `aggregate.truncation_threshold`: a cell whose truncation_rate exceeds it is flagged.
TRUNCATION_THRESHOLD = 0.05
TRUNCATION_COLUMNS = [
    "run",
    "step",
    "ckpt",
    "is_baseline",
    "task",
    "variant",
    "sampling",
    "seed",
    "truncation_rate",
    "n",
    "threshold",
    "flagged",
]
DELTA_COLUMNS = [
    "run",
    "task",
    "sampling",
    "metric",
    "comparison",
    "ckpt",
    "step",
    "ref_ckpt",
    "ref_step",
    "seeds",
    "n_problems",
    "n_pairs",
    "delta",
    "ci_low",
    "ci_high",
    "significant",
    "regression",
    "paired_test",
    "n_gained",
    "n_lost",
    "mcnemar_p",
    "mde",
    "chat_templates_differ",
]
#: flips.csv: one row per problem whose per-problem verdict flipped in a deltas.csv comparison.
FLIP_COLUMNS = ["run", "task", "sampling", "ckpt_a", "ckpt_b", "task_id", "direction"]
#: `paired_test` of a comparison with McNemar's exact test, and of those without one.
MCNEMAR = "mcnemar-exact"
NO_TEST_NOT_BINARY = "none: scores not 0/1"
NO_TEST_NO_PAIRS = "none: no pairs"
#: The line metrics.md and the report show when some comparison mixes chat templates.
TEMPLATE_NOTE = (
    "{n} comparison(s) in deltas.csv pair cells generated with different chat templates "
    "(column chat_templates_differ): their deltas include the template's effect."
)
MISSING_COLUMNS = ["kind", "path", "reason", "run", "ckpt", "task", "variant"]
CONFIDENCE = 0.95
STDERR_LEGEND = (
    "Mean over seeds ± standard error (conservative for several seeds: the root mean square of the "
    "cells' standard errors)."
)

_SAMPLE_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("sample_idx", pa.int64()),
        ("passed", pa.bool_()),
        ("score", pa.float64()),
    ]
)
_SAMPLE_PARSE = pa_json.ParseOptions(
    explicit_schema=_SAMPLE_SCHEMA, unexpected_field_behavior="ignore"
)


@dataclass(frozen=True)
class Cell:
    """One scored (run, ckpt, task, variant), as read from its `{variant}.json`."""

    source: str
    run: str
    ckpt: str
    step: int | None
    task: str
    variant: str
    sampling: str
    seed: int
    is_baseline: bool
    scorer_version: str | None
    model_hash: str | None
    metrics: dict[str, tuple[float, float, float]]  # name -> (value, stderr, n); NaN when absent
    error_types: dict[str, int] = field(default_factory=dict)
    primary_metric: str | None = None
    hack_types: dict[str, int] = field(default_factory=dict)
    #: The chat template its prompts went through: its sha256, "plain" for none, None when the
    #: cell does not record it (cells scored before templates were recorded).
    chat_template: str | None = None

    @property
    def samples_path(self) -> Path:
        return Path(self.source).with_suffix(".jsonl")


@dataclass(frozen=True)
class Problem:
    """A file that could not be (fully) used: `kind` "cell" (left out) or "samples" (no deltas)."""

    kind: str
    path: str
    reason: str

    def row(self) -> dict[str, str]:
        parts = Path(self.path).with_suffix("").parts[-4:]
        names = dict(zip(("run", "ckpt", "task", "variant"), parts)) if len(parts) == 4 else {}
        return {
            "kind": self.kind,
            "path": self.path,
            "reason": self.reason,
            **{k: names.get(k, "") for k in ("run", "ckpt", "task", "variant")},
        }


class CellError(Exception):
    """A cell file that cannot be used; the message says why, in one line."""


@dataclass
class Summary:
    """Every table of a summary, in memory: what `build_summary` writes and the report shows."""

    title: str
    tidy: pd.DataFrame
    seeds: pd.DataFrame
    configs: pd.DataFrame
    passk: pd.DataFrame
    errors: pd.DataFrame
    deltas: pd.DataFrame
    missing: pd.DataFrame
    main_metrics: dict[str, str]
    n_cells: int
    hacks: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=HACK_COLUMNS))
    #: One line per checkpoint that looks broken (not completely written, unchanged for long).
    broken: list[str] = field(default_factory=list)
    flips: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=FLIP_COLUMNS))
    #: Every cell's truncation rate against the threshold (`truncation_table`).
    truncation: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=TRUNCATION_COLUMNS)
    )


# ---------------------------------------------------------------------------------------------
# Reading


def load_cell(path: str | os.PathLike[str]) -> Cell:
    """Read and check one cell json; raise `CellError` naming what is wrong."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except FileNotFoundError:
        raise CellError("file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CellError(f"not valid JSON ({exc})") from None
    except OSError as exc:
        raise CellError(f"unreadable ({exc.strerror})") from None
    if not isinstance(raw, dict):
        raise CellError("not a JSON object")
    for key in ("run", "ckpt", "task", "variant", "sampling"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise CellError(f"key {key!r} missing or not a string")
    seed = raw.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise CellError("key 'seed' missing or not an integer")
    step = raw.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise CellError("key 'step' is not an integer")
    metrics = raw.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise CellError("key 'metrics' missing or empty")
    parsed: dict[str, tuple[float, float, float]] = {}
    for name, entry in metrics.items():
        if not isinstance(entry, dict) or not _is_number(entry.get("value"), allow_none=True):
            raise CellError(f"metrics.{name} has no numeric 'value'")
        n = entry.get("n")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
            raise CellError(f"metrics.{name}.n is not an integer")
        parsed[name] = (
            _number(entry.get("value")),
            _number(entry.get("stderr")),
            _number(entry.get("n")),
        )
    error_types = raw.get("error_types") or {}
    if not isinstance(error_types, dict) or not all(
        _is_number(v, allow_none=False) for v in error_types.values()
    ):
        raise CellError("key 'error_types' is not a mapping of counts")
    hack_types = raw.get("hack_types") or {}
    if not isinstance(hack_types, dict) or not all(
        _is_number(v, allow_none=False) for v in hack_types.values()
    ):
        raise CellError("key 'hack_types' is not a mapping of counts")
    primary = raw.get("primary_metric")
    return Cell(
        source=os.fspath(path),
        run=raw["run"],
        ckpt=raw["ckpt"],
        step=step,
        task=raw["task"],
        variant=raw["variant"],
        sampling=raw["sampling"],
        seed=seed,
        is_baseline=bool(raw.get("is_baseline", False)),
        scorer_version=_optional_str(raw.get("scorer_version")),
        model_hash=_optional_str(raw.get("model_hash")),
        metrics=parsed,
        error_types={str(k): int(v) for k, v in error_types.items()},
        primary_metric=primary if isinstance(primary, str) and primary in parsed else None,
        hack_types={str(k): int(v) for k, v in hack_types.items()},
        chat_template=_template_key(raw.get("chat_template")),
    )


def _template_key(record: Any) -> str | None:
    """What two cells' chat templates are compared by: the template's sha256; "plain" for
    plain prompts; the source when it has no hash (an endpoint's own); None when unrecorded."""
    if not isinstance(record, dict):
        return None
    if record.get("sha256"):
        return str(record["sha256"])
    source = str(record.get("source") or "")
    return "plain" if source.startswith("none") else source or None


def load_cells(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Cell], list[Problem]]:
    """Read every cell json; unusable ones (and duplicates of a cell) become `Problem`s."""
    cells: list[Cell] = []
    problems: list[Problem] = []
    seen: dict[tuple[str, str, str, str], str] = {}
    for path in paths:
        try:
            cell = load_cell(path)
        except CellError as exc:
            problems.append(Problem("cell", os.fspath(path), str(exc)))
            continue
        key = (cell.run, cell.ckpt, cell.task, cell.variant)
        if key in seen:
            problems.append(Problem("cell", cell.source, f"duplicate of {seen[key]}"))
            continue
        seen[key] = cell.source
        cells.append(cell)
    return cells, problems


def read_samples(path: Path) -> tuple[pa.Table, list[str]]:
    """The per-sample rows of one cell as an Arrow table (`_SAMPLE_SCHEMA`), and what was skipped.

    The fast path is Arrow's JSON reader; a file it rejects (a torn or malformed line, a numeric
    task_id) is re-read line by line, keeping every usable line. Rows without a task_id or a
    sample_idx are dropped. A missing file raises `FileNotFoundError`.
    """
    size = path.stat().st_size
    notes: list[str] = []
    try:
        table = pa_json.read_json(
            path,
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(size + 1, 1 << 16)),
            parse_options=_SAMPLE_PARSE,
        )
    except pa.ArrowInvalid:
        table = _read_samples_slowly(path, notes)
    keep = pc.and_(pc.is_valid(table["task_id"]), pc.is_valid(table["sample_idx"]))
    dropped = len(table) - pc.sum(keep).as_py() if len(table) else 0
    if dropped:
        notes.append(f"{dropped} line(s) without task_id or sample_idx skipped")
        table = table.filter(keep)
    return table, notes


def _read_samples_slowly(path: Path, notes: list[str]) -> pa.Table:
    errors: list[str] = []
    columns: dict[str, list[Any]] = {name: [] for name in _SAMPLE_SCHEMA.names}
    for row in iter_jsonl(path, errors=errors):
        task_id, idx = row.get("task_id"), row.get("sample_idx")
        passed, score = row.get("passed"), row.get("score")
        columns["task_id"].append(None if task_id is None else str(task_id))
        is_index = isinstance(idx, int) and not isinstance(idx, bool)
        columns["sample_idx"].append(idx if is_index else None)
        columns["passed"].append(bool(passed) if isinstance(passed, (bool, int)) else None)
        columns["score"].append(float(score) if _is_number(score, allow_none=False) else None)
    if errors:
        notes.append(f"{len(errors)} malformed line(s) skipped (first: {errors[0]})")
    return pa.table(columns, schema=_SAMPLE_SCHEMA)


def load_samples(cells: Sequence[Cell]) -> tuple[pd.DataFrame, list[Problem]]:
    """Per-sample rows of every cell, sorted by `cell` (the index into `cells`): columns `cell`,
    `problem` (an integer code per distinct task_id), `sample_idx`, `passed` and `score` as
    floats (NaN when absent), and `task_id` (categorical; its codes are `problem`)."""
    tables: list[pa.Table] = []
    problems: list[Problem] = []
    for index, cell in enumerate(cells):
        path = cell.samples_path
        try:
            table, notes = read_samples(path)
        except FileNotFoundError:
            problems.append(Problem("samples", os.fspath(path), "file not found: no paired deltas"))
            continue
        except (OSError, UserError) as exc:
            problems.append(Problem("samples", os.fspath(path), f"unreadable ({exc})"))
            continue
        problems.extend(Problem("samples", os.fspath(path), note) for note in notes)
        tables.append(table.append_column("cell", pa.array(np.full(len(table), index, np.int32))))
    table = (
        pa.concat_tables(tables)
        if tables
        else _SAMPLE_SCHEMA.append(pa.field("cell", pa.int32())).empty_table()
    )
    task_ids = table["task_id"].combine_chunks().dictionary_encode()
    frame = pd.DataFrame(
        {
            "cell": table["cell"].to_numpy(),
            "problem": task_ids.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            "sample_idx": table["sample_idx"].to_numpy(),
            "passed": table["passed"].cast(pa.float64()).to_numpy(zero_copy_only=False),
            "score": table["score"].to_numpy(zero_copy_only=False),
        }
    )
    frame["task_id"] = pd.Categorical.from_codes(
        frame["problem"], categories=pd.Index(task_ids.dictionary.to_pylist(), dtype=object)
    )
    return frame, problems


# ---------------------------------------------------------------------------------------------
# Tables


def tidy_table(cells: Sequence[Cell]) -> pd.DataFrame:
    """One row per (cell, metric), ordered by run, baseline first, step, task, variant."""
    rows = [
        {
            "run": c.run,
            "step": c.step,
            "ckpt": c.ckpt,
            "task": c.task,
            "variant": c.variant,
            "sampling": c.sampling,
            "seed": c.seed,
            "metric": name,
            "value": value,
            "stderr": stderr,
            "n": n,
            "scorer_version": c.scorer_version,
            "model_hash": c.model_hash,
            "is_baseline": c.is_baseline,
            "source": c.source,
        }
        for c in cells
        for name, (value, stderr, n) in c.metrics.items()
    ]
    frame = pd.DataFrame(rows, columns=TIDY_COLUMNS)
    frame["source_deleted"] = False  # build_summary marks checkpoints whose source is gone
    frame = frame.astype(
        {
            "run": str,
            "ckpt": str,
            "task": str,
            "variant": str,
            "sampling": str,
            "metric": str,
            "source": str,
            "step": "Int64",
            "seed": np.int64,
            "value": np.float64,
            "stderr": np.float64,
            "n": "Int64",
            "is_baseline": bool,
            "scorer_version": "str",
            "model_hash": "str",
        }
    )
    return _checkpoint_order(frame, ["task", "variant"])


def main_metric(names: Sequence[str], primary: str | None = None) -> str:
    """The metric a task is judged by: the declared primary one, else pass@1 if reported, else
    the first one but compile_rate, hack_rate and the length metrics (`NOT_MAIN_METRICS`)."""
    if primary is not None:
        return primary
    if "pass@1" in names:
        return "pass@1"
    return next((n for n in names if n not in NOT_MAIN_METRICS), names[0])


def main_metrics(cells: Sequence[Cell]) -> dict[str, str]:
    """Task -> its main metric, from its cells' metric names (in their order) and declarations."""
    names: dict[str, dict[str, None]] = {}
    primary: dict[str, str] = {}
    for cell in cells:
        names.setdefault(cell.task, {}).update(dict.fromkeys(cell.metrics))
        if cell.primary_metric is not None:
            primary.setdefault(cell.task, cell.primary_metric)
    return {task: main_metric(list(found), primary.get(task)) for task, found in names.items()}


def seed_table(tidy: pd.DataFrame) -> pd.DataFrame:
    """Mean, std, stderr (std/sqrt(count)) and count over seeds per (run, ckpt, task, sampling,
    metric); `cell_stderr` is the conservative stderr of the seed mean from the cells' own
    stderrs (`stats.conservative_stderr`), the error bar the report draws."""
    keys = ["run", "step", "ckpt", "is_baseline", "task", "sampling", "metric"]
    if tidy.empty:
        return pd.DataFrame(columns=SEED_COLUMNS)
    work = tidy.assign(seed_text=tidy["seed"].astype(str))
    grouped = work.groupby(keys, sort=False, dropna=False)
    out = grouped.agg(
        mean=("value", "mean"),
        std=("value", "std"),
        n_seeds=("value", "count"),
        seeds=("seed_text", " ".join),
        cell_stderr=("stderr", conservative_stderr),
    ).reset_index()
    out["stderr"] = out["std"] / np.sqrt(out["n_seeds"])
    return out[SEED_COLUMNS]


def config_table(seeds: pd.DataFrame) -> pd.DataFrame:
    """Each sampling config across a run's checkpoints (baseline excluded from the ckpt columns):
    mean over checkpoints of the seed means, first/last/max values with their steps, baseline."""
    if seeds.empty:
        return pd.DataFrame(columns=CONFIG_COLUMNS)
    rows = []
    for (run, task, sampling, metric), group in seeds.groupby(
        ["run", "task", "sampling", "metric"], sort=False
    ):
        trained = group[~group["is_baseline"]].dropna(subset=["mean"])
        base = group[group["is_baseline"]]["mean"]
        row: dict[str, Any] = {
            "run": run,
            "task": task,
            "sampling": sampling,
            "metric": metric,
            "n_ckpts": len(trained),
            "n_seeds": int(group["n_seeds"].max()),
            "mean": trained["mean"].mean() if len(trained) else math.nan,
            "baseline_value": base.iloc[0] if len(base) else math.nan,
        }
        for label, pick in (("first", 0), ("last", -1)):
            row[f"{label}_step"] = trained["step"].iloc[pick] if len(trained) else pd.NA
            row[f"{label}_value"] = trained["mean"].iloc[pick] if len(trained) else math.nan
        best = trained.loc[trained["mean"].idxmax()] if len(trained) else None
        row["max_step"] = best["step"] if best is not None else pd.NA
        row["max_value"] = best["mean"] if best is not None else math.nan
        rows.append(row)
    frame = pd.DataFrame(rows, columns=CONFIG_COLUMNS)
    return frame.astype({"first_step": "Int64", "last_step": "Int64", "max_step": "Int64"})


def error_table(cells: Sequence[Cell], samples: pd.DataFrame) -> pd.DataFrame:
    """Error-type counts per cell; `fraction` is of the cell's scored samples (NaN without them)."""
    scored = samples.groupby("cell").size() if len(samples) else pd.Series(dtype=np.int64)
    rows = [
        {
            **_cell_key(c),
            "error_type": error_type,
            "count": count,
            "fraction": count / scored[index] if index in scored.index else math.nan,
        }
        for index, c in enumerate(cells)
        for error_type, count in c.error_types.items()
    ]
    frame = pd.DataFrame(rows, columns=ERROR_COLUMNS).astype({"step": "Int64"})
    return _checkpoint_order(frame, ["task", "variant", "error_type"])


def hack_table(cells: Sequence[Cell]) -> pd.DataFrame:
    """Reward-hack counts per cell and hack type; `fraction` is of the samples the cell's
    `hack_rate` counts (NaN for a cell without it)."""
    rows = []
    for c in cells:
        total = c.metrics.get(HACK_RATE, (math.nan, math.nan, math.nan))[2]
        for hack, count in c.hack_types.items():
            rows.append(
                {
                    **_cell_key(c),
                    "hack": hack,
                    "count": count,
                    "fraction": count / total if total and not math.isnan(total) else math.nan,
                }
            )
    frame = pd.DataFrame(rows, columns=HACK_COLUMNS).astype({"step": "Int64"})
    return _checkpoint_order(frame, ["task", "variant", "hack"])


def truncation_table(cells: Sequence[Cell], threshold: float) -> pd.DataFrame:
    """Each cell's `truncation_rate` (cells without one, whose samples' finish reasons are all
    unknown, are left out) and whether it exceeds `threshold` (strictly: a rate equal to the
    threshold is not flagged)."""
    rows = [
        {
            **_cell_key(c),
            "truncation_rate": c.metrics["truncation_rate"][0],
            "n": c.metrics["truncation_rate"][2],
            "threshold": threshold,
            "flagged": bool(c.metrics["truncation_rate"][0] > threshold),
        }
        for c in cells
        if "truncation_rate" in c.metrics and not math.isnan(c.metrics["truncation_rate"][0])
    ]
    frame = pd.DataFrame(rows, columns=TRUNCATION_COLUMNS).astype(
        {"step": "Int64", "n": "Int64", "flagged": bool}
    )
    return _checkpoint_order(frame, ["task", "variant"])


def truncation_flags(
    truncation: pd.DataFrame, main_metrics: dict[str, str]
) -> dict[tuple[str, str, str, str, str], float]:
    """(run, ckpt, task, sampling, main metric) -> the share of samples that hit the token budget,
    pooled over the seeds, for each checkpoint entry with a flagged cell (its score is a lower
    bound)."""
    if truncation.empty or not truncation["flagged"].any():
        return {}
    flags = {}
    keys = ["run", "ckpt", "task", "sampling"]
    for (run, ckpt, task, sampling), group in truncation.groupby(keys, sort=False):
        if group["flagged"].any() and task in main_metrics:
            n = group["n"].astype(np.float64)
            share = float((group["truncation_rate"] * n).sum() / n.sum())
            flags[(run, ckpt, task, sampling, main_metrics[task])] = share
    return flags


def passk_table(cells: Sequence[Cell], samples: pd.DataFrame, tidy: pd.DataFrame) -> pd.DataFrame:
    """pass@k for every k up to the smallest per-problem sample count, recomputed from the
    per-sample verdicts with all seeds of a sampling config pooled (more samples, larger k, less
    variance than one seed). Only for tasks whose cells report a pass@k metric."""
    code_tasks = set(tidy.loc[tidy["metric"].str.match(r"pass@\d+$"), "task"])
    if not code_tasks or samples.empty:
        return pd.DataFrame(columns=PASSK_COLUMNS)
    cell_frame = _cell_frame(cells)
    wanted = cell_frame[cell_frame["task"].isin(code_tasks)]
    if wanted.empty:
        return pd.DataFrame(columns=PASSK_COLUMNS)
    group_keys = ["run", "ckpt", "task", "sampling"]
    wanted = wanted.assign(group=wanted.groupby(group_keys, sort=False).ngroup())
    group_of_cell = np.full(len(cells), -1, np.int64)
    group_of_cell[wanted.index] = wanted["group"]
    rows = samples[(group_of_cell[samples["cell"]] >= 0) & samples["passed"].notna()]
    n_codes = int(samples["problem"].max()) + 1
    keys, key_index = np.unique(
        group_of_cell[rows["cell"]] * n_codes + rows["problem"].to_numpy(), return_inverse=True
    )
    n_of_key = np.bincount(key_index)
    c_of_key = np.bincount(key_index, weights=rows["passed"].to_numpy()).round().astype(np.int64)
    group_of_key = keys // n_codes
    bounds = np.searchsorted(group_of_key, np.arange(wanted["group"].max() + 2))
    seeds_by_group = wanted.groupby("group")["seed"].agg(lambda s: " ".join(map(str, sorted(s))))
    first_cell = wanted.drop_duplicates("group").set_index("group")
    out = []
    for group in range(len(bounds) - 1):
        n = n_of_key[bounds[group] : bounds[group + 1]]
        if len(n) == 0:
            continue
        c = c_of_key[bounds[group] : bounds[group + 1]]
        ks = np.arange(1, n.min() + 1)
        mean, stderr = pass_at_k_curve(n, c, ks)
        info = first_cell.loc[group]
        out.append(
            pd.DataFrame(
                {
                    "run": info["run"],
                    "step": info["step"],
                    "ckpt": info["ckpt"],
                    "is_baseline": info["is_baseline"],
                    "task": info["task"],
                    "sampling": info["sampling"],
                    "seeds": seeds_by_group.loc[group],
                    "k": ks,
                    "value": mean,
                    "stderr": stderr,
                    "n_problems": len(n),
                    "min_samples": n.min(),
                }
            )
        )
    if not out:
        return pd.DataFrame(columns=PASSK_COLUMNS)
    frame = pd.concat(out, ignore_index=True)[PASSK_COLUMNS].astype({"step": "Int64"})
    return _checkpoint_order(frame, ["task", "sampling", "k"])


def delta_table(
    cells: Sequence[Cell],
    samples: pd.DataFrame,
    metrics_by_task: dict[str, str],
    *,
    n_boot: int,
    seed: int,
    flips: list[dict[str, Any]] | None = None,
) -> pd.DataFrame:
    """Paired differences (checkpoint minus reference) with bootstrap intervals and McNemar.

    For each (run, task, sampling), every non-baseline checkpoint is compared with the run's
    baseline (if the run has one) and with the previous checkpoint by step. The pairs are the
    (task_id, seed, sample_idx) both checkpoints scored; a problem's difference is the mean over
    its pairs; the interval resamples problems. `significant` means the interval excludes zero,
    `regression` that it lies below zero. McNemar's exact test and the minimum detectable effect
    come from `stats.paired_flips` on the same pairs; each flipped problem is appended to `flips`
    (when given) as a `FLIP_COLUMNS` row.
    """
    if samples.empty:
        return pd.DataFrame(columns=DELTA_COLUMNS)
    rng = np.random.default_rng(seed)
    cell_frame = _cell_frame(cells)
    bounds = np.searchsorted(samples["cell"].to_numpy(), np.arange(len(cells) + 1))
    task_ids = samples["task_id"].cat.categories
    results = []
    for (run, task, sampling), group in cell_frame.groupby(["run", "task", "sampling"], sort=False):
        metric = metrics_by_task.get(task, "score")
        comparisons = _comparisons(group)
        if not comparisons:
            continue
        rows = pd.concat([samples.iloc[bounds[i] : bounds[i + 1]] for i in group.index])
        if rows.empty:
            continue
        value = (rows["passed"] if metric == "pass@1" else rows["score"]).to_numpy(np.float64)
        ckpts = list(dict.fromkeys(group["ckpt"]))
        ckpt_code = pd.Categorical(group.loc[rows["cell"], "ckpt"], categories=ckpts).codes
        seed_code, _ = pd.factorize(group.loc[rows["cell"], "seed"])
        sample_idx = rows["sample_idx"].to_numpy()
        sample_idx = sample_idx - sample_idx.min()
        span = int(sample_idx.max()) + 1
        n_seeds = int(seed_code.max()) + 1
        composite = (rows["problem"].to_numpy() * n_seeds + seed_code) * span + sample_idx
        keys, key_code = np.unique(composite, return_inverse=True)
        matrix = np.full((len(keys), len(ckpts)), np.nan)
        matrix[key_code, ckpt_code] = value
        key_problem = keys // (n_seeds * span)
        a = [ckpts.index(c) for c, _, _ in comparisons]
        b = [ckpts.index(r) for _, r, _ in comparisons]
        diffs = matrix[:, a] - matrix[:, b]
        boot = paired_bootstrap(
            per_problem_means(diffs, key_problem), n_boot=n_boot, rng=rng, confidence=CONFIDENCE
        )
        n_pairs = (~np.isnan(diffs)).sum(axis=0)
        flipped = paired_flips(matrix[:, b], matrix[:, a], key_problem)
        info = group.drop_duplicates("ckpt").set_index("ckpt")
        seeds_of = group.groupby("ckpt")["seed"].agg(set)
        templates_of = group.groupby("ckpt")["chat_template"].agg(lambda t: set(t.dropna()))
        for j, (ckpt, ref, kind) in enumerate(comparisons):
            results.append(
                {
                    "run": run,
                    "task": task,
                    "sampling": sampling,
                    "metric": metric,
                    "comparison": kind,
                    "ckpt": ckpt,
                    "step": info.at[ckpt, "step"],
                    "ref_ckpt": ref,
                    "ref_step": info.at[ref, "step"],
                    "seeds": " ".join(str(s) for s in sorted(seeds_of[ckpt] & seeds_of[ref])),
                    "n_problems": int(boot.n_problems[j]),
                    "n_pairs": int(n_pairs[j]),
                    "delta": boot.estimate[j],
                    "ci_low": boot.low[j],
                    "ci_high": boot.high[j],
                    "paired_test": (
                        NO_TEST_NOT_BINARY
                        if not flipped.binary[j]
                        else MCNEMAR
                        if flipped.n_problems[j]
                        else NO_TEST_NO_PAIRS
                    ),
                    "n_gained": int(flipped.gained[:, j].sum()),
                    "n_lost": int(flipped.lost[:, j].sum()),
                    "mcnemar_p": flipped.p_value[j],
                    "mde": flipped.mde[j],
                    "chat_templates_differ": bool(
                        templates_of[ckpt]
                        and templates_of[ref]
                        and templates_of[ckpt] != templates_of[ref]
                    ),
                }
            )
            if flips is not None:
                for direction, which in (("gained", flipped.gained), ("lost", flipped.lost)):
                    flips.extend(
                        {
                            "run": run,
                            "task": task,
                            "sampling": sampling,
                            "ckpt_a": ref,
                            "ckpt_b": ckpt,
                            "task_id": task_ids[code],
                            "direction": direction,
                        }
                        for code in flipped.problems[which[:, j]]
                    )
    frame = pd.DataFrame(results, columns=DELTA_COLUMNS)
    frame["significant"] = (frame["ci_low"] > 0) | (frame["ci_high"] < 0)
    frame["regression"] = frame["ci_high"] < 0
    frame = frame.astype({"step": "Int64", "ref_step": "Int64"})
    frame = frame.sort_values(["run", "task", "sampling", "step"], kind="stable")
    return frame.reset_index(drop=True)


def _comparisons(group: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(ckpt, reference, kind) for one (run, task, sampling): vs baseline and vs previous step."""
    ckpts = group.drop_duplicates("ckpt")
    baselines = list(ckpts.loc[ckpts["is_baseline"], "ckpt"])
    trained = ckpts[~ckpts["is_baseline"]].sort_values("step", kind="stable", na_position="first")
    out = []
    previous: str | None = None
    for ckpt in trained["ckpt"]:
        if baselines:
            out.append((ckpt, baselines[0], "baseline"))
        if previous is not None:
            out.append((ckpt, previous, "previous"))
        previous = ckpt
    return out


def flip_table(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """`flips.csv` from `delta_table`'s flip rows, in comparison order, gained before lost."""
    return pd.DataFrame(list(rows), columns=FLIP_COLUMNS)


def missing_table(problems: Sequence[Problem]) -> pd.DataFrame:
    return pd.DataFrame([p.row() for p in problems], columns=MISSING_COLUMNS)


def metrics_wide(
    seeds: pd.DataFrame, marks: dict[tuple[str, str, str, str, str], str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Checkpoints as rows ordered by (run, step), `task/metric` columns (with the sampling config
    when a task has several), each entry `mean ± stderr` over seeds: (header, rows) of text.
    `marks` appends a marker to the entries it names by (run, ckpt, task, sampling, metric)."""
    multi = seeds.groupby("task")["sampling"].nunique()
    labels = (
        seeds["task"]
        + "/"
        + seeds["metric"]
        + np.where(seeds["task"].map(multi) > 1, " (" + seeds["sampling"] + ")", "")
    )
    columns = list(dict.fromkeys(labels))
    texts: dict[tuple[str, str], dict[str, str]] = {}
    for run, ckpt, label, value, stderr, task, sampling, metric in zip(
        seeds["run"],
        seeds["ckpt"],
        labels,
        seeds["mean"],
        seeds["cell_stderr"],
        seeds["task"],
        seeds["sampling"],
        seeds["metric"],
    ):
        mark = (marks or {}).get((run, ckpt, task, sampling, metric), "")
        texts.setdefault((run, ckpt), {})[label] = _format_value(value, stderr) + mark
    ckpts = _checkpoint_order(seeds.drop_duplicates(["run", "ckpt"]), [])
    rows = [
        [
            run,
            ckpt + (" (baseline)" if base else ""),
            "" if pd.isna(step) else str(step),
            *[texts[(run, ckpt)].get(label, "") for label in columns],
        ]
        for run, ckpt, step, base in zip(
            ckpts["run"], ckpts["ckpt"], ckpts["step"], ckpts["is_baseline"]
        )
    ]
    return ["run", "ckpt", "step", *columns], rows


def metrics_markdown(
    seeds: pd.DataFrame,
    title: str,
    deltas: pd.DataFrame | None = None,
    flags: dict[tuple[str, str, str, str, str], float] | None = None,
) -> str:
    """`metrics.md`: the title, a one-line legend (and `template_note` of the `deltas` when it
    has one) and `metrics_wide` as a Markdown table (length metrics left out), then the length
    metrics' own table. Each entry of `flags` (`truncation_flags`) marks its value with a
    footnote saying the score is a lower bound."""
    lines = [f"# {title}", ""]
    if seeds.empty:
        return "\n".join(lines + ["No scored cells.", ""])
    lengths = seeds["metric"].isin(LENGTH_METRICS)
    marks = {key: f" [^t{i}]" for i, key in enumerate(flags or {}, start=1)}
    note = template_note(deltas)
    lines += [STDERR_LEGEND, "", *([f"**{note}**", ""] if note else [])]
    if not lengths.all():
        header, rows = metrics_wide(seeds[~lengths], marks)
        lines += [_markdown_table(header, rows), ""]
    if lengths.any():
        header, rows = metrics_wide(seeds[lengths])
        lines += ["## Length and truncation", "", _markdown_table(header, rows), ""]
    for i, ((run, ckpt, task, sampling, _), share) in enumerate((flags or {}).items(), start=1):
        lines.append(
            f"[^t{i}]: {run} {ckpt} {task} ({sampling}): score is a lower bound: "
            f"{share:.0%} of samples hit the token budget"
        )
    if flags:
        lines.append("")
    return "\n".join(lines)


def template_note(deltas: pd.DataFrame | None) -> str | None:
    """`TEMPLATE_NOTE` when some comparison pairs cells of different chat templates, else None."""
    if deltas is None or "chat_templates_differ" not in deltas or deltas.empty:
        return None
    n = int(deltas["chat_templates_differ"].astype(bool).sum())
    return TEMPLATE_NOTE.format(n=n) if n else None


# ---------------------------------------------------------------------------------------------
# The whole summary


def summarize(
    cell_jsons: Sequence[str | os.PathLike[str]],
    *,
    title: str = "ckpteval",
    bootstrap: int = 1000,
    seed: int = 0,
    truncation_threshold: float = TRUNCATION_THRESHOLD,
) -> Summary:
    """Every table of the summary, in memory; `build_summary` writes them."""
    cells, problems = load_cells(cell_jsons)
    samples, sample_problems = load_samples(cells)
    tidy = tidy_table(cells)
    metrics_by_task = main_metrics(cells)
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
    )


def build_summary(
    cell_jsons: Sequence[Path],
    summary_dir: Path,
    *,
    title: str = "ckpteval",
    bootstrap: int = 1000,
    seed: int = 0,
    deleted: Collection[str] = (),
    broken: Sequence[str] = (),
    truncation_threshold: float | None = None,
) -> Summary:
    """Build `summary_dir` from the cell jsons (see the module docstring for what is written);
    return what was built.
    `deleted` names checkpoints (`run/ckpt`) whose source is gone: their cells stay, marked in
    the tidy table's `source_deleted` column and listed in the report. `broken` are lines about
    checkpoints that look broken (ckpteval.config.Plan.broken_lines), shown in the report.
    `truncation_threshold` (None: `TRUNCATION_THRESHOLD`) is the truncation rate above which a
    cell's score is flagged as a lower bound."""
    from ckpteval import report

    if bootstrap < 1:
        raise UserError(f"bootstrap: {bootstrap} resamples; give at least 1 (1000 is usual)")
    summary_dir = Path(summary_dir)
    threshold = TRUNCATION_THRESHOLD if truncation_threshold is None else truncation_threshold
    if not 0 <= threshold <= 1:
        raise UserError(
            f"aggregate.truncation_threshold: {threshold} is not a share; give one in [0, 1]"
        )
    summary = summarize(
        cell_jsons, title=title, bootstrap=bootstrap, seed=seed, truncation_threshold=threshold
    )
    summary.broken = list(broken)
    summary.tidy["source_deleted"] = (
        summary.tidy["run"].astype(str) + "/" + summary.tidy["ckpt"].astype(str)
    ).isin(set(deleted))
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
    with atomic_open(summary_dir / "metrics.md") as handle:
        handle.write(
            metrics_markdown(
                summary.seeds,
                title,
                summary.deltas,
                truncation_flags(summary.truncation, summary.main_metrics),
            )
        )
    plots = report.write_plots(summary, summary_dir / "plots")
    report.write_html(summary, plots, summary_dir / "report.html")
    write_summary_json(cell_jsons, summary_dir / "summary.json")
    return summary


def write_summary_json(cell_jsons: Sequence[Path], path: Path) -> None:
    """`summary.json`: per run, checkpoint (by step), task and variant, what the users' own
    per-checkpoint scripts print: the pass rate (pass@1, else accuracy) with its counts, the
    official and generated tests' pass rates (stdio), the error types, the per-file breakdown of
    replayed solutions, and per problem: samples, passes, the first sample's verdict and (stdio)
    the test it failed first. Cells that cannot be read are left out (missing.csv lists them)."""
    from ckpteval.io import write_json

    runs: dict[str, Any] = {}
    for cell_path in sorted(map(Path, cell_jsons)):
        try:
            cell = json.loads(cell_path.read_text(encoding="utf-8"))
            run, ckpt, task, variant = (str(cell[k]) for k in ("run", "ckpt", "task", "variant"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
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
        problems: dict[str, dict[str, Any]] = {}
        samples = cell_path.with_suffix(".jsonl")
        if samples.exists():
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
            entry["n_passed"] = sum(r["passed"] for r in problems.values())
            entry["problems"] = problems
        ckpts = runs.setdefault(run, {})
        ckpts.setdefault(ckpt, {"step": cell.get("step"), "tasks": {}})["tasks"].setdefault(
            task, {}
        )[variant] = entry
    ordered = {
        run: dict(
            sorted(ckpts.items(), key=lambda kv: (kv[1]["step"] is None, kv[1]["step"] or 0, kv[0]))
        )
        for run, ckpts in sorted(runs.items())
    }
    write_json(path, {"runs": ordered})


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


# ---------------------------------------------------------------------------------------------
# Helpers


def _cell_key(c: Cell) -> dict[str, Any]:
    """The columns that name a cell in the per-cell tables (errors, hacks, truncation)."""
    return {
        "run": c.run,
        "step": c.step,
        "ckpt": c.ckpt,
        "is_baseline": c.is_baseline,
        "task": c.task,
        "variant": c.variant,
        "sampling": c.sampling,
        "seed": c.seed,
    }


def _cell_frame(cells: Sequence[Cell]) -> pd.DataFrame:
    """The cells' identity columns, indexed by position in `cells`."""
    return pd.DataFrame(
        [
            {
                "run": c.run,
                "ckpt": c.ckpt,
                "step": c.step,
                "is_baseline": c.is_baseline,
                "task": c.task,
                "sampling": c.sampling,
                "seed": c.seed,
                "chat_template": c.chat_template,
            }
            for c in cells
        ],
        columns=["run", "ckpt", "step", "is_baseline", "task", "sampling", "seed", "chat_template"],
    ).astype({"step": "Int64"})


def _checkpoint_order(frame: pd.DataFrame, then: list[str]) -> pd.DataFrame:
    """Sort by run, baseline first, step, ckpt, then `then`; stable, so metric order survives."""
    if frame.empty:
        return frame.reset_index(drop=True)
    order = frame.assign(_not_base=~frame["is_baseline"].astype(bool))
    order = order.sort_values(
        ["run", "_not_base", "step", "ckpt", *then], kind="stable", na_position="first"
    )
    return order.drop(columns="_not_base").reset_index(drop=True)


def _is_number(value: Any, *, allow_none: bool) -> bool:
    if value is None:
        return allow_none
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any) -> float:
    """A JSON number as float; null, strings ("N/A" from lm-eval) and the rest as NaN."""
    return float(value) if _is_number(value, allow_none=False) else math.nan


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _format_value(value: float, stderr: float) -> str:
    if pd.isna(value):
        return ""
    if pd.isna(stderr) or stderr == 0:
        return f"{value:.3f}"
    return f"{value:.3f} ± {stderr:.3f}"


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(re.sub(r"\|", r"\\|", str(c)) for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])
