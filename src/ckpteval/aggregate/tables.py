"""The summary's tables of scores: tidy, seeds, configs, pass@k, errors, hacks, truncation, missing.

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
rate and flag. A checkpoint entry whose reward function gave no score for some samples has a
`RewardErrors` (`reward_errors`): how many, and what each of its numbers does with them, in the
words `metrics.md`, the report and the plots show beside those numbers.

Every score row carries its 95% interval (`ci_low`, `ci_high`, `ci_method`, `n_eff`; the rules
are in docs/statistics.md and `score_intervals`): Wilson's score interval for scores in [0, 1],
the normal interval of a mean otherwise, both clustered by problem. The tables, the plots, the
comparison with the trainer's curve and `ckpteval gate` read these columns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ckpteval.aggregate.cells import Cell, Problem, identity_frame
from ckpteval.errored import EXCLUDED, REWARD_ERROR_RATE, Errored
from ckpteval.errors import UserError
from ckpteval.metrics import LENGTH_METRICS
from ckpteval.stats import (
    NORMAL,
    WILSON,
    conservative_stderr,
    design_effect,
    pass_at_k_curve,
    score_interval,
    wilson_interval,
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
    "errored",
    "errored_as",
    "errored_at",
    "n_problems",
    "n_eff",
    "ci_low",
    "ci_high",
    "ci_method",
    "scorer_version",
    "model_hash",
    "is_baseline",
    "source",
    "source_deleted",
    "final",
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
    "n_eff",
    "ci_low",
    "ci_high",
    "ci_method",
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
#: What names one cell of a run in the per-cell tables (errors, hacks, truncation).
CELL_KEY_COLUMNS = [
    "run",
    "step",
    "ckpt",
    "is_baseline",
    "task",
    "variant",
    "sampling",
    "seed",
]
ERROR_COLUMNS = [
    *CELL_KEY_COLUMNS,
    "error_type",
    "count",
    "fraction",
]
HACK_COLUMNS = [
    *CELL_KEY_COLUMNS,
    "hack",
    "count",
    "fraction",
]
#: The metric of a cell's reward-hack share (`ckpteval.evaluate`); never a task's main metric.
HACK_RATE = "hack_rate"
#: Metrics that are never a task's main metric: they describe the samples, not their success.
NOT_MAIN_METRICS = ("compile_rate", HACK_RATE, REWARD_ERROR_RATE, *LENGTH_METRICS)
#: Default `aggregate.truncation_threshold`: a cell whose truncation_rate exceeds it is flagged.
TRUNCATION_THRESHOLD = 0.05
TRUNCATION_COLUMNS = [
    *CELL_KEY_COLUMNS,
    "truncation_rate",
    "n",
    "threshold",
    "flagged",
]
MISSING_COLUMNS = ["kind", "path", "reason", "run", "ckpt", "task", "variant"]
CONFIDENCE = 0.95
#: The normal quantile of a two-sided `CONFIDENCE` interval.
Z_95 = 1.959963984540054
#: Metrics that are shares of samples or problems by construction: always in [0, 1]. lm-eval's
#: `exact_match`, `acc` and `acc_norm` are 0/1 per document under any filter (`,strict-match`):
#: only the task's primary one is its per-sample `score`, so the others are known by name.
SHARE_METRICS = re.compile(r"pass@\d+|acc(_norm)?(,.*)?|exact_match(,.*)?|(?!reward_extra/).*_rate")
#: Metrics that are the mean of the per-sample `score`: in [0, 1] when every score of the task is.
SCORE_MEANS = re.compile(r"accuracy|reward_mean|val-core/.*/reward/mean@\d+")
STDERR_LEGEND = (
    "Mean over seeds [95% interval]: Wilson's for scores in [0, 1], the mean ± 1.96 standard "
    "errors otherwise; clustered by problem, and for several seeds no narrower than one seed's "
    "(docs/statistics.md)."
)


def tidy_table(cells: Sequence[Cell], samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (cell, metric), ordered by run, baseline first, step, task, variant.
    `errored`, `errored_as` and `errored_at` say how the metric counts the samples the reward
    function gave no score (`ckpteval.errored.Errored`: count, how, value; 0, "" and NaN for a
    metric that counts none). Each row has its interval (`score_intervals`; `samples`, the
    cells' per-sample rows, tell it which scores lie in [0, 1] and how alike one problem's
    samples are)."""
    rows = [
        {
            "run": c.key.run,
            "step": c.step,
            "ckpt": c.key.ckpt,
            "task": c.key.task,
            "variant": c.key.variant,
            "sampling": c.sampling,
            "seed": c.seed,
            "metric": name,
            "value": value,
            "stderr": stderr,
            "n": n,
            "errored": c.errored[name].count if name in c.errored else 0,
            "errored_as": c.errored[name].how if name in c.errored else "",
            "errored_at": c.errored[name].at if name in c.errored else math.nan,
            "n_problems": c.n_problems,
            "cell": index,
            "scorer_version": c.scorer_version,
            "model_hash": c.model_hash,
            "is_baseline": c.is_baseline,
            "source": c.source,
        }
        for index, c in enumerate(cells)
        for name, (value, stderr, n) in c.metrics.items()
    ]
    frame = pd.DataFrame(rows, columns=[*TIDY_COLUMNS, "cell"])
    frame["source_deleted"] = False  # build_summary marks checkpoints whose source is gone
    frame["final"] = False  # ... and the final checkpoints, saved without a step
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
            "errored": "Int64",
            "errored_as": str,
            "errored_at": np.float64,
            "n_problems": "Int64",
            "is_baseline": bool,
            "scorer_version": "str",
            "model_hash": "str",
        }
    )
    frame = score_intervals(frame, cells, samples)
    return checkpoint_order(frame.drop(columns="cell"), ["task", "variant"])


def score_intervals(
    frame: pd.DataFrame, cells: Sequence[Cell], samples: pd.DataFrame | None
) -> pd.DataFrame:
    """`frame` (tidy rows with a `cell` column indexing `cells`) with `n_eff`, `ci_low`,
    `ci_high` and `ci_method` filled in.

    A score in [0, 1] gets Wilson's interval (`stats.score_interval`): the shares
    (`SHARE_METRICS`), and the means of the per-sample score (`SCORE_MEANS`, and a cell's
    declared primary metric) of a task whose every per-sample score lies in [0, 1]. The rest get
    value ± 1.96 standard errors. Clustering by problem: pass@k's standard error is already over
    problems; a metric over samples, where a problem has several, has its standard error
    inflated by the design effect: estimated from the cell's per-sample scores for the score
    means, else the worst case (every sample of a problem alike: samples / problems). An
    interval the cell states (a reward mean with errored samples: from them all at the bottom of
    the range to all at its top) widens it: errors never flatter.
    """
    if frame.empty:
        return frame.assign(n_eff=np.nan, ci_low=np.nan, ci_high=np.nan, ci_method="")
    cell_index = frame["cell"].to_numpy()
    metric = frame["metric"].astype(str)
    primary = np.array([c.primary_metric or "" for c in cells], dtype=object)[cell_index]
    score_mean = metric.str.fullmatch(SCORE_MEANS.pattern).to_numpy() | (metric == primary)
    unit_scores = _unit_score_tasks(cells, samples)
    proportion = metric.str.fullmatch(SHARE_METRICS.pattern).to_numpy() | (
        score_mean & frame["task"].isin(unit_scores).to_numpy()
    )
    n = frame["n"].astype("float64").to_numpy()
    problems = frame["n_problems"].astype("float64").to_numpy()
    problems = np.where(np.isnan(problems) | (problems > n), n, problems)
    per_sample = n > problems
    worst = np.divide(n, problems, out=np.ones_like(n), where=problems > 0)
    measured = _design_effects(cells, samples)[cell_index]
    deff = np.where(per_sample, np.where(score_mean & ~np.isnan(measured), measured, worst), 1.0)
    stderr = frame["stderr"].to_numpy(np.float64) * np.sqrt(deff)
    cell_samples = np.array([c.n_samples or 0 for c in cells], dtype=np.float64)[cell_index]
    n_max = np.where(per_sample, n / deff, np.maximum(n, cell_samples))
    low, high, n_eff = score_interval(
        frame["value"].to_numpy(np.float64), stderr, problems, n_max, proportion, CONFIDENCE
    )
    stated = np.array(
        [cells[i].stated_intervals.get(m, (np.nan, np.nan)) for i, m in zip(cell_index, metric)],
        dtype=np.float64,
    ).reshape(-1, 2)
    low, high = np.fmin(low, stated[:, 0]), np.fmax(high, stated[:, 1])
    return frame.assign(
        n_eff=n_eff, ci_low=low, ci_high=high, ci_method=np.where(proportion, WILSON, NORMAL)
    )


def _unit_score_tasks(cells: Sequence[Cell], samples: pd.DataFrame | None) -> set[str]:
    """The tasks with per-sample scores, every one of them in [0, 1]."""
    if samples is None or samples.empty:
        return set()
    scored = samples[samples["score"].notna()]
    task = np.array([c.key.task for c in cells], dtype=object)[scored["cell"].to_numpy()]
    inside = scored["score"].between(0.0, 1.0).to_numpy()
    frame = pd.DataFrame({"task": task, "inside": inside})
    verdict = frame.groupby("task")["inside"].all()
    return set(verdict.index[verdict])


def _design_effects(cells: Sequence[Cell], samples: pd.DataFrame | None) -> np.ndarray:
    """Per cell, the design effect of the mean of its per-sample scores
    (`stats.design_effect`); NaN for a cell without per-sample scores."""
    out = np.full(len(cells), np.nan)
    if samples is None or samples.empty:
        return out
    scored = samples[samples["score"].notna()]
    codes = scored["problem"].to_numpy()
    values = scored["score"].to_numpy(np.float64)
    bounds = np.searchsorted(scored["cell"].to_numpy(), np.arange(len(cells) + 1))
    for index in range(len(cells)):
        start, stop = bounds[index], bounds[index + 1]
        if stop > start:
            out[index] = design_effect(values[start:stop], codes[start:stop])
    return out


def main_metric(names: Sequence[str], primary: str | None = None) -> str:
    """The metric a task is judged by: the declared primary one, else pass@1 if reported, else
    the first one but compile_rate, hack_rate and the length metrics (`NOT_MAIN_METRICS`)."""
    if primary is not None:
        return primary
    if "pass@1" in names:
        return "pass@1"
    return next((n for n in names if n not in NOT_MAIN_METRICS), names[0])


def main_metrics(cells: Sequence[Cell], chosen: Mapping[str, str] | None = None) -> dict[str, str]:
    """Task -> its main metric: the one the config `chosen` for it (`tasks.<task>.main_metric`,
    which its cells must report: else one line naming the ones they do), else from its cells'
    metric names (in their order) and declarations."""
    names: dict[str, dict[str, None]] = {}
    primary: dict[str, str] = {}
    for cell in cells:
        names.setdefault(cell.key.task, {}).update(dict.fromkeys(cell.metrics))
        if cell.primary_metric is not None:
            primary.setdefault(cell.key.task, cell.primary_metric)
    for task, metric in (chosen or {}).items():
        if task in names and metric not in names[task]:
            raise UserError(
                f"config: tasks.{task}.main_metric: its cells report no {metric!r}; they report "
                f"{', '.join(names[task])}"
            )
        if task in names:
            primary[task] = metric
    return {task: main_metric(list(found), primary.get(task)) for task, found in names.items()}


def seed_table(tidy: pd.DataFrame) -> pd.DataFrame:
    """Mean, std, stderr (std/sqrt(count)) and count over seeds per (run, ckpt, task, sampling,
    metric); `cell_stderr` is the conservative stderr of the seed mean from the cells' own
    stderrs (`stats.conservative_stderr`).

    The seed mean's interval (what the report draws) is as conservative: seeds share the
    problems, so the mean of several seeds is given no more weight than one of its cells.
    Wilson's interval at the mean of the cells' `n_eff`, or the mean ± 1.96 times the root mean
    square of the cells' clustered standard errors; widened to the mean of the cells' own bounds
    where those reach further (a cell's stated interval: one seed's is the cell's). A tidy table
    without intervals (written before they existed) gives NaN ones."""
    keys = ["run", "step", "ckpt", "is_baseline", "task", "sampling", "metric"]
    if tidy.empty:
        return pd.DataFrame(columns=SEED_COLUMNS)
    if "ci_method" not in tidy:
        tidy = tidy.assign(n_eff=np.nan, ci_low=np.nan, ci_high=np.nan, ci_method="")
    clustered = tidy["stderr"] * np.sqrt(tidy["n"].astype("float64") / tidy["n_eff"])
    work = tidy.assign(seed_text=tidy["seed"].astype(str), clustered=clustered)
    grouped = work.groupby(keys, sort=False, dropna=False)
    out = grouped.agg(
        mean=("value", "mean"),
        std=("value", "std"),
        n_seeds=("value", "count"),
        seeds=("seed_text", " ".join),
        cell_stderr=("stderr", conservative_stderr),
        clustered=("clustered", conservative_stderr),
        n_eff=("n_eff", "mean"),
        ci_method=("ci_method", "first"),
        cells_low=("ci_low", "mean"),
        cells_high=("ci_high", "mean"),
    ).reset_index()
    out["stderr"] = out["std"] / np.sqrt(out["n_seeds"])
    wilson = out["ci_method"] == WILSON
    w_low, w_high = wilson_interval(out["mean"], out["n_eff"], CONFIDENCE)
    half = Z_95 * out["clustered"]
    out["ci_low"] = np.fmin(np.where(wilson, w_low, out["mean"] - half), out["cells_low"])
    out["ci_high"] = np.fmax(np.where(wilson, w_high, out["mean"] + half), out["cells_high"])
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
    return checkpoint_order(frame, ["task", "variant", "error_type"])


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
    return checkpoint_order(frame, ["task", "variant", "hack"])


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
    return checkpoint_order(frame, ["task", "variant"])


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


@dataclass(frozen=True)
class RewardErrors:
    """A checkpoint entry (run, ckpt, task, sampling) whose reward function gave no score for
    some samples: `errored` of its `samples` (over its seeds, from `REWARD_ERROR_RATE`), and
    how each of its numbers counts them (`numbers`: metric and `Errored`, the main metric
    first; a metric whose seeds count them in different ways is listed once per way)."""

    errored: int
    samples: int
    numbers: tuple[tuple[str, Errored], ...] = ()

    def words(self) -> str:
        """The entry's sentences: how many errored, then what each number does with them."""
        head = f"the reward function gave no score for {self.errored} of {self.samples} samples."
        return " ".join([head, *(f"{e.words(metric)}." for metric, e in self.numbers)])


def reward_errors(
    tidy: pd.DataFrame, main_metrics: Mapping[str, str]
) -> dict[tuple[str, str, str, str], RewardErrors]:
    """(run, ckpt, task, sampling) -> its `RewardErrors`, for each checkpoint entry whose reward
    function gave no score for some samples (`REWARD_ERROR_RATE` above 0 in a cell), in the
    tidy table's order. A number's counts add up over the seeds it is the mean of (their
    samples that returned a score, for one that excludes errors), named when there are several."""
    if tidy.empty:
        return {}
    keys = ["run", "ckpt", "task", "sampling"]
    rates = tidy[tidy["metric"] == REWARD_ERROR_RATE]
    n = rates["n"].to_numpy(dtype=np.float64, na_value=np.nan)
    counts = rates.assign(errored=(rates["value"] * n).round(), n=n)
    totals = counts.groupby(keys, sort=False)[["errored", "n"]].sum()
    totals = totals[totals["errored"] > 0]
    if totals.empty:
        return {}
    entries = tidy.set_index(keys).index.isin(totals.index)
    rows = tidy[entries & (tidy["metric"] != REWARD_ERROR_RATE)]
    counted = rows["errored"].fillna(0).groupby([rows[k] for k in [*keys, "metric"]], sort=False)
    rows = rows[counted.transform("max") > 0]  # the numbers that count errored samples
    # Plain Python over their rows, as lists: a pandas groupby per number took ~7 ms.
    columns = [rows[k].tolist() for k in [*keys, "metric", "errored_as"]]
    seeds = rows["seed"].to_numpy(np.int64).tolist()
    ns = rows["n"].to_numpy(np.int64, na_value=0).tolist()
    counts = rows["errored"].to_numpy(np.int64, na_value=0).tolist()
    ats = rows["errored_at"].to_numpy(np.float64).tolist()
    cells_of: dict[tuple[Any, ...], list[tuple[int, int, int, str, float]]] = {}
    for run, ckpt, task, sampling, metric, how, seed, n, count, at in zip(
        *columns, seeds, ns, counts, ats
    ):
        cells_of.setdefault((run, ckpt, task, sampling, metric), []).append(
            (seed, n, count, how, at)
        )
    numbers: dict[tuple[Any, ...], list[tuple[str, Errored]]] = {}
    for (*key, metric), cells in cells_of.items():
        ways: dict[tuple[str, float | None], list[tuple[int, int, int, str, float]]] = {}
        for cell in cells:
            seed, n, count, how, at = cell
            if count > 0:
                ways.setdefault((how, None if math.isnan(at) else at), []).append(cell)
        for (how, at), way in ways.items():
            # One way for all of the number's seeds: its counts over every seed (those without
            # errors add samples that returned a score); several: each over its own seeds.
            over = cells if len(ways) == 1 else way
            errored = Errored(
                count=sum(c[2] for c in way),
                how=how,
                n=sum(c[1] for c in over),
                at=math.nan if at is None else at,
                seeds=tuple(sorted(c[0] for c in over)) if len(cells) > 1 else (),
            )
            numbers.setdefault(tuple(key), []).append((metric, errored))
    out = {}
    for key, errored, samples in zip(totals.index, totals["errored"], totals["n"]):
        found = numbers.get(key, [])
        main = main_metrics.get(key[2])
        found.sort(key=lambda item: item[0] != main)  # stable: the main metric first
        out[key] = RewardErrors(int(errored), int(samples), tuple(found))
    return out


def excluding_errors(
    entries: Mapping[tuple[str, str, str, str], RewardErrors],
) -> set[tuple[str, str, str, str, str]]:
    """(run, ckpt, task, sampling, metric) of the numbers of `reward_errors`' entries that are
    means over the samples that returned a score, the errored ones left out (`EXCLUDED`)."""
    return {
        (*key, metric)
        for key, entry in entries.items()
        for metric, errored in entry.numbers
        if errored.how == EXCLUDED
    }


def passk_table(cells: Sequence[Cell], samples: pd.DataFrame, tidy: pd.DataFrame) -> pd.DataFrame:
    """pass@k for every k up to the smallest per-problem sample count, recomputed from the
    per-sample verdicts with all seeds of a sampling config pooled (more samples, larger k, less
    variance than one seed). Only for tasks whose cells report a pass@k metric."""
    code_tasks = set(tidy.loc[tidy["metric"].str.match(r"pass@\d+$"), "task"])
    if not code_tasks or samples.empty:
        return pd.DataFrame(columns=PASSK_COLUMNS)
    cell_frame = identity_frame(cells)
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
    return checkpoint_order(frame, ["task", "sampling", "k"])


def missing_table(problems: Sequence[Problem]) -> pd.DataFrame:
    return pd.DataFrame([p.row() for p in problems], columns=MISSING_COLUMNS)


def _cell_key(c: Cell) -> dict[str, Any]:
    """The columns that name a cell in the per-cell tables (errors, hacks, truncation)."""
    return {
        "run": c.key.run,
        "step": c.step,
        "ckpt": c.key.ckpt,
        "is_baseline": c.is_baseline,
        "task": c.key.task,
        "variant": c.key.variant,
        "sampling": c.sampling,
        "seed": c.seed,
    }


def checkpoint_order(frame: pd.DataFrame, then: list[str]) -> pd.DataFrame:
    """Sort by run, baseline first, step, ckpt, then `then`; stable, so metric order survives."""
    if frame.empty:
        return frame.reset_index(drop=True)
    order = frame.assign(_not_base=~frame["is_baseline"].astype(bool))
    order = order.sort_values(
        ["run", "_not_base", "step", "ckpt", *then], kind="stable", na_position="first"
    )
    return order.drop(columns="_not_base").reset_index(drop=True)
