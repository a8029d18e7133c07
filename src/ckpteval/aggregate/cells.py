"""Reading the evaluate step's files: one cell's json, every cell of a sweep, their per-sample rows.

Input: one pair of files per cell (run, ckpt, task, variant) under `scores/{run}/{ckpt}/{task}/`:
- `{variant}.json`: the cell's metrics (`{"metrics": {name: {"value", "stderr", "n"}}}`, with
  `hack_rate` among them when the scorer reports reward hacks, and a reward cell's counts of
  errored samples, `ckpteval.errored`), error type and hack type counts
  (`error_types`, `hack_types`) and provenance (`run`, `ckpt`, `step`, `task`, `variant`, `sampling`, `seed`,
  `is_baseline`, `scorer_version`, `model_hash`, ...) and how many problems and samples it scored
  (`n_problems`, `n_samples`).
- `{variant}.jsonl`: one line per (problem, sample) with `task_id`, `sample_idx`, `passed`, `score`.

A file that cannot be used never stops the reading: it becomes a `Problem` (listed in
`missing.csv`), and everything else is read.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from ckpteval.errored import REWARD_ERROR_RATE, Errored, errored_metrics
from ckpteval.errors import UserError
from ckpteval.io import iter_jsonl
from ckpteval.plan.layout import CellKey, score_samples_of

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
    """One scored cell, as read from its `{variant}.json`."""

    source: str
    key: CellKey
    step: int | None
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
    #: Metric -> how it counts the samples the reward function gave no score, for the metrics
    #: that count any (`ckpteval.errored.errored_metrics`).
    errored: dict[str, Errored] = field(default_factory=dict)
    #: The problems and samples the cell scored (its json's `n_problems`, `n_samples`; None
    #: when it does not say): the unit an interval is clustered by, and how many draws it has.
    n_problems: int | None = None
    n_samples: int | None = None
    #: name -> the (low, high) a metric's entry states itself: a reward mean with errored samples
    #: reaches from them all at the bottom of the range to all at its top (`evaluate.bounded_mean`).
    stated_intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def samples_path(self) -> Path:
        return score_samples_of(Path(self.source))


@dataclass(frozen=True)
class Problem:
    """A file that could not be (fully) used: `kind` "cell" (left out) or "samples" (no deltas)."""

    kind: str
    path: str
    reason: str

    def row(self) -> dict[str, str]:
        cell = CellKey.at(self.path)
        return {
            "kind": self.kind,
            "path": self.path,
            "reason": self.reason,
            **{k: getattr(cell, k) if cell else "" for k in ("run", "ckpt", "task", "variant")},
        }


class CellError(Exception):
    """A cell file that cannot be used; the message says why, in one line."""


def load_cell(path: str | os.PathLike[str]) -> Cell:
    """Read and check one cell json; raise `CellError` naming what is wrong."""
    raw = _read_object(path)
    _check_identity(raw)
    parsed = _parse_metrics(raw.get("metrics"))
    primary = raw.get("primary_metric")
    return Cell(
        source=os.fspath(path),
        key=CellKey(raw["run"], raw["ckpt"], raw["task"], raw["variant"]),
        step=raw.get("step"),
        sampling=raw["sampling"],
        seed=raw["seed"],
        is_baseline=bool(raw.get("is_baseline", False)),
        scorer_version=_optional_str(raw.get("scorer_version")),
        model_hash=_optional_str(raw.get("model_hash")),
        metrics=parsed,
        error_types=_counts(raw, "error_types"),
        primary_metric=primary if isinstance(primary, str) and primary in parsed else None,
        hack_types=_counts(raw, "hack_types"),
        chat_template=_template_key(raw.get("chat_template")),
        errored=errored_metrics(raw["metrics"]),
        n_problems=_count(raw.get("n_problems")),
        n_samples=_count(raw.get("n_samples")),
        stated_intervals=_stated_intervals(raw["metrics"]),
    )


def _read_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The cell file's JSON object; `CellError` when it is missing, unreadable or not an object."""
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
    return raw


def _check_identity(raw: dict[str, Any]) -> None:
    """The keys naming the cell: non-empty strings, an integer seed, an integer step or none."""
    for key in ("run", "ckpt", "task", "variant", "sampling"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise CellError(f"key {key!r} missing or not a string")
    seed = raw.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise CellError("key 'seed' missing or not an integer")
    step = raw.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise CellError("key 'step' is not an integer")


def _parse_metrics(metrics: Any) -> dict[str, tuple[float, float, float]]:
    """name -> (value, stderr, n), NaN where absent; a value that is not a number (or null) or
    an n that is not an integer is a `CellError`: a number read wrong would go unnoticed."""
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
    return parsed


def _stated_intervals(metrics: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """The metrics whose entry states an `interval` of two numbers: name -> (low, high)."""
    out = {}
    for name, entry in metrics.items():
        interval = entry.get("interval")
        if (
            isinstance(interval, list)
            and len(interval) == 2
            and all(_is_number(v, allow_none=False) for v in interval)
        ):
            out[name] = (float(interval[0]), float(interval[1]))
    return out


def _counts(raw: dict[str, Any], key: str) -> dict[str, int]:
    """A mapping of counts (`error_types`, `hack_types`); absent or null is empty."""
    counts = raw.get(key) or {}
    if not isinstance(counts, dict) or not all(
        _is_number(v, allow_none=False) for v in counts.values()
    ):
        raise CellError(f"key {key!r} is not a mapping of counts")
    return {str(k): int(v) for k, v in counts.items()}


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
    seen: dict[CellKey, str] = {}
    for path in paths:
        try:
            cell = load_cell(path)
        except CellError as exc:
            problems.append(Problem("cell", os.fspath(path), str(exc)))
            continue
        if cell.key in seen:
            problems.append(Problem("cell", cell.source, f"duplicate of {seen[cell.key]}"))
            continue
        seen[cell.key] = cell.source
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


def identity_frame(cells: Sequence[Cell]) -> pd.DataFrame:
    """The cells' identity columns, indexed by position in `cells`."""
    return pd.DataFrame(
        [
            {
                "run": c.key.run,
                "ckpt": c.key.ckpt,
                "step": c.step,
                "is_baseline": c.is_baseline,
                "task": c.key.task,
                "sampling": c.sampling,
                "seed": c.seed,
                "chat_template": c.chat_template,
            }
            for c in cells
        ],
        columns=["run", "ckpt", "step", "is_baseline", "task", "sampling", "seed", "chat_template"],
    ).astype({"step": "Int64"})


def _is_number(value: Any, *, allow_none: bool) -> bool:
    if value is None:
        return allow_none
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any) -> float:
    """A JSON number as float; null, strings ("N/A" from lm-eval) and the rest as NaN."""
    return float(value) if _is_number(value, allow_none=False) else math.nan


def _count(value: Any) -> int | None:
    """A positive integer count, else None (unknown)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def zero_counted_lines(cells: Sequence[Cell], metrics: Mapping[str, str], what: str) -> list[str]:
    """For `ckpteval best` and `gate`, which average the score lines (where a sample the reward
    function gave no score has score 0): per (run, ckpt, task) of `cells` with such samples,
    how many, that `what` counts them as 0, and, for a single cell, what the cell's own main
    metric (`metrics`: task -> metric) does with them (a reward mean of unknown range leaves
    them out)."""
    grouped: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in cells:
        grouped.setdefault((cell.key.run, cell.key.ckpt, cell.key.task), []).append(cell)
    out = []
    for (run, ckpt, task), group in grouped.items():
        counts = [k for k in map(_cell_no_score, group) if k]
        if not counts:
            continue
        line = (
            f"{run}:{ckpt} {task}: the reward function gave no score for "
            f"{sum(k for k, _ in counts)} of {sum(n for _, n in counts)} samples; {what} counts "
            "them as 0"
        )
        own = group[0].errored.get(metrics[task]) if len(group) == 1 else None
        out.append(line + (f"; the cell's {own.words(metrics[task])}" if own else ""))
    return out


def _cell_no_score(cell: Cell) -> tuple[int, int] | None:
    """(errored, all) samples of a loaded cell with errored samples (its `reward_error_rate`)."""
    value, _, n = cell.metrics.get(REWARD_ERROR_RATE, (math.nan, math.nan, math.nan))
    if math.isnan(value) or math.isnan(n) or not round(value * n):
        return None
    return (round(value * n), int(n))
