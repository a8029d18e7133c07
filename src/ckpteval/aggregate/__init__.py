"""Aggregate the scored cells of a sweep: one tidy table, seed/config analyses, paired deltas.

In memory only; `ckpteval.summary` writes the tables, `metrics.md`, the plots and the report.
- `cells`: reading the evaluate step's cell files and per-sample rows (`Cell`, `load_cells`,
  `load_samples`);
- `tables`: the tables of scores (tidy, seeds, configs, pass@k, errors, hacks, truncation,
  missing) and the main metric of a task;
- `deltas`: paired deltas and flipped problems between checkpoints;
- `markdown`: `metrics.md`;
- `training`: the metrics beside the validation curve the trainer logged.

`Summary` holds every table of one summary: what `ckpteval.summary` builds and writes and what
`ckpteval.report` draws. Nothing here imports `ckpteval.report` or `ckpteval.summary`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ckpteval.aggregate.deltas import FLIP_COLUMNS
from ckpteval.aggregate.tables import HACK_COLUMNS, TRUNCATION_COLUMNS, RewardErrors
from ckpteval.aggregate.training import TRAINING_COLUMNS


@dataclass
class Summary:
    """Every table of a summary, in memory: what `ckpteval.summary.build_summary` writes and
    the report shows."""

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
    #: One line per checkpoint being written (not complete yet, still changing): waiting.
    waiting: list[str] = field(default_factory=list)
    flips: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=FLIP_COLUMNS))
    #: Every cell's truncation rate against the threshold (`truncation_table`).
    truncation: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=TRUNCATION_COLUMNS)
    )
    #: (run, ckpt, task, sampling) -> how many samples its reward function gave no score and what
    #: each of its numbers does with them (`reward_errors`), for the entries with some.
    reward_errors: dict[tuple[str, str, str, str], RewardErrors] = field(default_factory=dict)
    #: ckpteval's metrics beside the trainer's logged curve (`ckpteval.aggregate.training`).
    training: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TRAINING_COLUMNS))
    #: The checkpoint `ckpteval best`'s default rule picks (every task, weight 1, every run):
    #: `ckpteval.best.Selection` as a dict, or {"none": why no checkpoint could be chosen}.
    best: dict[str, Any] = field(default_factory=dict)
