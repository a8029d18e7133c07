"""`ckpteval best`: the checkpoint a stated rule picks, with an interval that knows it was picked.

The rule is a weighted set of tasks (`--task code --task qa=2`; default every task, weight 1):
a checkpoint's score is the weighted mean of the tasks' main metrics, each the mean over its
problems of the per-problem mean of the per-sample value (`passed` for pass@1, else `score`;
seeds and samples of a problem pooled), over the problems every candidate scored. The candidates
are the trained checkpoints (of `--run`, or of every run) that scored every task of the rule.

The highest of many noisy scores is biased upward (the winner's curse), so the ordinary interval
of the winner is too optimistic. Problems are resampled (a bootstrap over problems of the whole
selection: every candidate and task at once, each task's problems drawn with replacement) and
the interval printed is the winner's part of a **simultaneous** 95% band: the 95% quantile of the
largest studentized deviation over all candidates, max_j |S*_j - S_j| / se_j. Such a band holds
every candidate's true score at once in 95% of samples of problems, so it holds the chosen one's
however it was chosen. `wins` is the share of resamples in which each candidate scores highest:
how sure the choice is.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ckpteval.aggregate.cells import Cell, load_cells, load_samples, zero_counted_lines
from ckpteval.aggregate.tables import main_metrics
from ckpteval.errors import UserError
from ckpteval.gate import read_summary_table
from ckpteval.plan.layout import CellKey, Layout
from ckpteval.stats import bootstrap_weights

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Selection:
    """What `select` found: the candidates' scores and the chosen one with its intervals."""

    candidates: list[str]  # "run:ckpt", in checkpoint order
    scores: list[float]
    best: str
    score: float
    low: float  # selection-aware (simultaneous) interval of the chosen checkpoint's score
    high: float
    naive_low: float  # the interval it would have if it had been the only one looked at
    naive_high: float
    wins: dict[str, float]  # candidate -> share of resamples it wins (only those that win any)
    weights: dict[str, float]
    n_boot: int
    #: One line per candidate and task whose reward function gave some samples no score: they
    #: count as 0 here (the score lines' score), whatever the cells' own numbers do with them.
    errored: list[str] = field(default_factory=list)


def selection_interval(
    per_problem: Sequence[np.ndarray],
    weights: Sequence[float],
    *,
    n_boot: int,
    rng: np.random.Generator,
    confidence: float = CONFIDENCE,
) -> tuple[np.ndarray, int, tuple[float, float], tuple[float, float], np.ndarray]:
    """The selection's statistics over tasks of (problems, candidates) per-problem scores.

    Returns (scores per candidate, chosen index, selection-aware interval, naive interval, share
    of resamples each candidate wins). Each task's problems are resampled independently, every
    candidate with the same draw (they answered the same problems). The products are einsum's own
    loop, not BLAS: a small product per call would wake every BLAS thread of a shared machine."""
    total = float(sum(weights))
    scores = sum(w * m.mean(axis=0) for w, m in zip(weights, per_problem)) / total
    resampled = (
        sum(
            w * np.einsum("bp,pc->bc", bootstrap_weights(m.shape[0], n_boot, rng), m) / m.shape[0]
            for w, m in zip(weights, per_problem)
        )
        / total
    )
    chosen = int(np.argmax(scores))
    se = resampled.std(axis=0, ddof=1)
    spread = np.abs(resampled - scores)
    with np.errstate(invalid="ignore", divide="ignore"):
        studentized = np.where(se > 0, spread / se, 0.0)
    band = float(np.quantile(studentized.max(axis=1), confidence))
    tail = (1 - confidence) / 2
    naive = np.quantile(resampled[:, chosen], [tail, 1 - tail])
    wins = np.bincount(resampled.argmax(axis=1), minlength=len(scores)) / n_boot
    low, high = scores[chosen] - band * se[chosen], scores[chosen] + band * se[chosen]
    return scores, chosen, (low, high), (float(naive[0]), float(naive[1])), wins


def select(
    outdir: Path,
    weights: Mapping[str, float],
    *,
    runs: Sequence[str] = (),
    sampling: str | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> Selection:
    """The rule's choice among the summary's trained checkpoints (see the module docstring)."""
    tidy = read_summary_table(outdir, "best")
    tasks, keep, rows = candidates(tidy, weights, runs=runs, sampling=sampling)
    cells, problems = load_cells(
        [
            Path(Layout(str(outdir)).score(CellKey(r.run, r.ckpt, r.task, r.variant)))
            for r in rows.itertuples()
        ]
    )
    if problems:
        raise UserError(f"best: {problems[0].path}: {problems[0].reason}; rerun the workflow")
    samples, _ = load_samples(cells)
    return select_among(cells, samples, tasks, keep, main_metrics(cells), n_boot=n_boot, seed=seed)


def candidates(
    tidy: pd.DataFrame,
    weights: Mapping[str, float],
    *,
    runs: Sequence[str] = (),
    sampling: str | None = None,
) -> tuple[dict[str, float], list[tuple[str, str]], pd.DataFrame]:
    """What the rule chooses among, from a tidy table: the rule's tasks with their weights, the
    candidate (run, ckpt)s in checkpoint order, and their tidy rows (one per cell). A rule no
    summary can answer is a `UserError`."""
    tidy = tidy[~tidy["is_baseline"].astype(bool)]
    if runs:
        unknown = sorted(set(runs) - set(tidy["run"]))
        if unknown:
            raise UserError(
                f"best: run {unknown[0]!r} has no trained checkpoint in the summary; runs: "
                + ", ".join(sorted(set(tidy["run"])))
            )
        tidy = tidy[tidy["run"].isin(runs)]
    if sampling is not None:
        tidy = tidy[tidy["sampling"] == sampling]
    tasks = dict(weights) or dict.fromkeys(sorted(set(tidy["task"])), 1.0)
    for task in tasks:
        samplings = sorted(set(tidy.loc[tidy["task"] == task, "sampling"]))
        if not samplings:
            raise UserError(
                f"best: task {task!r} has no trained checkpoint scored; tasks: "
                + ", ".join(sorted(set(tidy["task"])))
            )
        if len(samplings) > 1:
            raise UserError(
                f"best: task {task!r} is scored under {', '.join(samplings)}; choose one with "
                "--sampling"
            )
    rows = tidy[tidy["task"].isin(tasks)].drop_duplicates(["run", "ckpt", "task", "variant"])
    has = rows.groupby(["run", "ckpt"], sort=False)["task"].nunique()
    order = rows.drop_duplicates(["run", "ckpt"])
    keep = [(r, c) for r, c in zip(order["run"], order["ckpt"]) if has[(r, c)] == len(tasks)]
    if len(keep) < 2:
        raise UserError(f"best: {len(keep)} checkpoint(s) scored every task of the rule; need 2")
    kept = set(keep)
    rows = rows[[(r, c) in kept for r, c in zip(rows["run"], rows["ckpt"])]]
    return tasks, keep, rows


def select_among(
    cells: Sequence[Cell],
    samples: pd.DataFrame,
    tasks: Mapping[str, float],
    keep: Sequence[tuple[str, str]],
    metrics: Mapping[str, str],
    *,
    n_boot: int,
    seed: int = 0,
) -> Selection:
    """The selection over loaded cells and their samples (`load_samples`; `samples["cell"]`
    indexes `cells`): the candidates `keep` (from `candidates`), the rule's `tasks` with their
    weights and each task's main metric. Cells of other checkpoints or tasks, and of another
    sampling config than the candidates', are left out, so the report passes a whole summary's."""
    if n_boot < 2:
        raise UserError(f"best: --bootstrap {n_boot}: give at least 2 (1000 is usual)")
    candidate = {key: i for i, key in enumerate(keep)}
    samplings = {
        c.key.task: c.sampling
        for c in cells
        if (c.key.run, c.key.ckpt) in candidate and c.key.task in tasks
    }
    column = np.array(
        [
            candidate.get((c.key.run, c.key.ckpt), -1)
            if samplings.get(c.key.task) == c.sampling
            else -1
            for c in cells
        ]
    )
    task_of = np.array([c.key.task for c in cells], dtype=object)
    cell_of = samples["cell"].to_numpy()
    matrices = []
    for task in tasks:
        mine = samples[(task_of[cell_of] == task) & (column[cell_of] >= 0)]
        value = (mine["passed"] if metrics[task] == "pass@1" else mine["score"]).to_numpy()
        columns = column[mine["cell"].to_numpy()]
        means = _per_problem(value, mine["problem"].to_numpy(), columns, len(keep))
        complete = means[~np.isnan(means).any(axis=1)]
        if len(complete) < 2:
            raise UserError(f"best: task {task!r}: fewer than 2 problems scored by every candidate")
        matrices.append(complete)
    scores, chosen, (low, high), naive, wins = selection_interval(
        matrices, list(tasks.values()), n_boot=n_boot, rng=np.random.default_rng(seed)
    )
    labels = [f"{r}:{c}" for r, c in keep]
    return Selection(
        candidates=labels,
        scores=[float(s) for s in scores],
        best=labels[chosen],
        score=float(scores[chosen]),
        low=float(low),
        high=float(high),
        naive_low=naive[0],
        naive_high=naive[1],
        wins={labels[i]: float(wins[i]) for i in np.argsort(-wins, kind="stable") if wins[i] > 0},
        weights={t: float(w) for t, w in tasks.items()},
        n_boot=n_boot,
        errored=zero_counted_lines(
            [c for i, c in enumerate(cells) if column[i] >= 0 and c.key.task in tasks],
            metrics,
            "the rule's score",
        ),
    )


def _per_problem(
    values: np.ndarray, problems: np.ndarray, columns: np.ndarray, width: int
) -> np.ndarray:
    """(problem, candidate) mean of `values` ignoring NaN (NaN where none), problems in code
    order: `stats.per_problem_means` of the (sample, candidate) matrix with one value per row,
    without building that matrix (at 1,000 candidates it would not fit in memory)."""
    codes, row = np.unique(problems, return_inverse=True)
    ok = ~np.isnan(values)
    flat = row[ok] * width + columns[ok]
    size = len(codes) * width
    sums = np.bincount(flat, weights=values[ok], minlength=size)
    counts = np.bincount(flat, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sums / counts).reshape(len(codes), width)


def parse_weights(items: Sequence[str]) -> dict[str, float]:
    """`TASK` or `TASK=WEIGHT` items -> {task: weight}; a bad weight is a `UserError`."""
    out: dict[str, float] = {}
    for item in items:
        task, sep, text = item.partition("=")
        try:
            weight = float(text) if sep else 1.0
        except ValueError:
            weight = math.nan
        if not task or not math.isfinite(weight) or weight <= 0:
            raise UserError(f"best: --task {item!r}: give TASK or TASK=WEIGHT with a weight > 0")
        out[task] = weight
    return out


def format_text(s: Selection) -> str:
    rule = " + ".join(f"{w:g} x {t}" for t, w in s.weights.items())
    runners = ", ".join(f"{k} {v:.0%}" for k, v in list(s.wins.items())[:4])
    return "\n".join(
        [
            f"best of {len(s.candidates)} checkpoints by {rule}: {s.best}",
            f"  score {s.score:.3f}, {CONFIDENCE:.0%} interval accounting for the choice "
            f"[{s.low:.3f}, {s.high:.3f}] (alone it would be [{s.naive_low:.3f}, "
            f"{s.naive_high:.3f}])",
            f"  wins in {s.wins.get(s.best, 0.0):.0%} of {s.n_boot} resamples of the problems "
            f"({runners})",
            *(f"  note: {line}" for line in s.errored),
        ]
    )


def add_best_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`ckpteval best`."""
    parser = subparsers.add_parser(
        "best",
        help="the checkpoint a rule picks, with an interval that accounts for the choice",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="TASK[=WEIGHT]",
        help="a task of the rule, with its weight (repeatable; default: every task, weight 1)",
    )
    parser.add_argument("--run", action="append", default=[], help="only this run (repeatable)")
    parser.add_argument("--sampling", help="the sampling config (needed when a task has several)")
    parser.add_argument("--outdir", type=Path, default=Path("results"), help="default: results")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples (default: 1000)")
    parser.add_argument("--json", action="store_true", help="print the selection as JSON")
    parser.set_defaults(func=run_best)
    return parser


def run_best(args: argparse.Namespace) -> int:
    selection = select(
        args.outdir,
        parse_weights(args.task),
        runs=args.run,
        sampling=args.sampling,
        n_boot=args.bootstrap,
    )
    if args.json:
        print(json.dumps(asdict(selection), indent=1))
    else:
        print(format_text(selection))
    return 0
