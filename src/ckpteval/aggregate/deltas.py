"""Paired deltas (`deltas.csv`) and flipped problems (`flips.csv`) between the checkpoints of a run.

Paired deltas compare the mean per-sample value (`passed` for pass@1 tasks, so the delta is a
pass@1 difference; `score` otherwise) of two checkpoints over the (task_id, seed, sample_idx)
both have, for one sampling config with its seeds pooled; the interval is a percentile bootstrap
over problems (`ckpteval.stats.paired_bootstrap`).

Beside the interval, `deltas.csv` carries McNemar's exact test on per-problem verdicts
(`ckpteval.stats.paired_flips`; a problem is solved when more than half of its paired samples
pass): `paired_test` is `mcnemar-exact`, or says why there is none (`none: scores not 0/1` for a
harness metric such as an F1 score, `none: no pairs`); `n_gained` / `n_lost` count the problems
unsolved by the reference and solved by the checkpoint / the reverse, out of `n_problems`;
`mcnemar_p` is the two-sided exact p-value; `mde` the minimum detectable effect at alpha 0.05 and
power 0.8 for that many problems (`ckpteval.stats.paired_mde`): a smaller difference is not
detectable at this task's size. `p_value` is the comparison's own test (McNemar's exact p with one
0/1 pair per problem, else the normal test of the per-problem differences), `p_holm` it adjusted
by Holm's method over every comparison of the table, and `significant` / `regression` (a
significant drop) use `p_holm`: the chance of any false mark in the table is at most 5%.
`flips.csv` lists the gained and lost problems by task_id (`ckpt_a` the reference, `ckpt_b` the
checkpoint). Definitions: docs/statistics.md.

A comparison of cells whose prompts went through different chat templates (the cells'
`chat_template` provenance, ckpteval.chat_templates) is flagged (`chat_templates_differ`), and
`metrics.md` and the report say so in one line (`TEMPLATE_NOTE`). A comparison in which the
reward function gave no score for some samples says, in `errored_note`, how many on each side
and that the delta counts them as 0 (`errored_note`); empty otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ckpteval.aggregate.cells import Cell, identity_frame
from ckpteval.aggregate.tables import CONFIDENCE
from ckpteval.errored import REWARD_ERROR_RATE
from ckpteval.stats import (
    BootstrapResult,
    FlipResult,
    holm,
    paired_bootstrap,
    paired_flips,
    paired_z_p,
    per_problem_means,
)

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
    "p_value",
    "p_holm",
    "chat_templates_differ",
    "errored_note",
]
#: flips.csv: one row per problem whose per-problem verdict flipped in a deltas.csv comparison.
FLIP_COLUMNS = ["run", "task", "sampling", "ckpt_a", "ckpt_b", "task_id", "direction"]
#: `paired_test` of a comparison with McNemar's exact test, and of those without one.
MCNEMAR = "mcnemar-exact"
NO_TEST_NOT_BINARY = "none: scores not 0/1"
NO_TEST_NO_PAIRS = "none: no pairs"
#: The family-wise error rate the significance marks (`significant`, `regression`) keep.
ALPHA = 0.05
#: The line metrics.md and the report show when some comparison mixes chat templates.
TEMPLATE_NOTE = (
    "{n} comparison(s) in deltas.csv pair cells generated with different chat templates "
    "(column chat_templates_differ): their deltas include the template's effect."
)
#: (run, task, sampling, metric): what one group of comparisons shares.
GroupKey = tuple[str, str, str, str]
#: (ckpt, reference, kind): one comparison, kind "baseline" or "previous".
Comparison = tuple[str, str, str]


@dataclass(frozen=True)
class _Pairs:
    """One group's per-sample values as a matrix: a row per (problem, seed, sample_idx) that
    some checkpoint scored, a column per checkpoint (`ckpts`), NaN where it has no sample."""

    matrix: np.ndarray
    problem: np.ndarray  # each row's problem code
    ckpts: list[str]


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
    its pairs; the interval resamples problems. `significant` means the Holm-adjusted p-value
    is at most `ALPHA`, `regression` a significant drop (`_delta_frame`). McNemar's exact test and the minimum detectable effect
    come from `stats.paired_flips` on the same pairs; each flipped problem is appended to `flips`
    (when given) as a `FLIP_COLUMNS` row.
    """
    if samples.empty:
        return pd.DataFrame(columns=DELTA_COLUMNS)
    rng = np.random.default_rng(seed)  # one stream, drawn from group by group in order
    cell_frame = identity_frame(cells)
    bounds = np.searchsorted(samples["cell"].to_numpy(), np.arange(len(cells) + 1))
    task_ids = samples["task_id"].cat.categories
    results: list[dict[str, Any]] = []
    for (run, task, sampling), group in cell_frame.groupby(["run", "task", "sampling"], sort=False):
        key: GroupKey = (run, task, sampling, metrics_by_task.get(task, "score"))
        comparisons = _comparisons(group)
        if not comparisons:
            continue
        rows = pd.concat([samples.iloc[bounds[i] : bounds[i + 1]] for i in group.index])
        if rows.empty:
            continue
        pairs = _pairs(rows, group, key[3])
        a = [pairs.ckpts.index(c) for c, _, _ in comparisons]
        b = [pairs.ckpts.index(r) for _, r, _ in comparisons]
        diffs = pairs.matrix[:, a] - pairs.matrix[:, b]
        per_problem = per_problem_means(diffs, pairs.problem)
        boot = paired_bootstrap(per_problem, n_boot=n_boot, rng=rng, confidence=CONFIDENCE)
        flipped = paired_flips(pairs.matrix[:, b], pairs.matrix[:, a], pairs.problem)
        n_pairs = (~np.isnan(diffs)).sum(axis=0)
        # McNemar's exact p where it is the textbook test (one 0/1 pair per problem), else the
        # normal test of the per-problem differences: either way one unit per problem, and the
        # test is of the delta the row shows.
        textbook = flipped.binary & (n_pairs == boot.n_problems)
        p_value = np.where(textbook, flipped.p_value, paired_z_p(per_problem))
        results += _delta_rows(key, group, comparisons, boot, flipped, n_pairs, p_value, cells)
        if flips is not None:
            flips += _flip_rows(key, comparisons, flipped, task_ids)
    return _delta_frame(results)


def _pairs(rows: pd.DataFrame, group: pd.DataFrame, metric: str) -> _Pairs:
    """The group's sample rows (`rows`, of the cells `group` indexes) as a `_Pairs` matrix of
    `passed` (pass@1) or `score` (any other metric)."""
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
    return _Pairs(matrix, keys // (n_seeds * span), ckpts)


def _delta_rows(
    key: GroupKey,
    group: pd.DataFrame,
    comparisons: Sequence[Comparison],
    boot: BootstrapResult,
    flipped: FlipResult,
    n_pairs: np.ndarray,
    p_value: np.ndarray,
    cells: Sequence[Cell],
) -> list[dict[str, Any]]:
    """One `DELTA_COLUMNS` row per comparison of the group (column j of `boot` and `flipped`)."""
    run, task, sampling, metric = key
    info = group.drop_duplicates("ckpt").set_index("ckpt")
    seeds_of = group.groupby("ckpt")["seed"].agg(set)
    no_score = {
        (ckpt, seed): _no_score(cells[i])
        for i, ckpt, seed in zip(group.index, group.ckpt, group.seed)
    }
    templates_of = group.groupby("ckpt")["chat_template"].agg(lambda t: set(t.dropna()))
    return [
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
            "paired_test": _paired_test(flipped, j),
            "n_gained": int(flipped.gained[:, j].sum()),
            "n_lost": int(flipped.lost[:, j].sum()),
            "mcnemar_p": flipped.p_value[j],
            "mde": flipped.mde[j],
            "p_value": p_value[j],
            "chat_templates_differ": bool(
                templates_of[ckpt] and templates_of[ref] and templates_of[ckpt] != templates_of[ref]
            ),
            "errored_note": errored_note(
                metric, no_score, (ckpt, ref), seeds_of[ckpt] & seeds_of[ref]
            ),
        }
        for j, (ckpt, ref, kind) in enumerate(comparisons)
    ]


def _no_score(cell: Cell) -> tuple[int, int]:
    """(errored, all) samples of a cell by its `reward_error_rate` (`errored.no_score`'s count);
    (0, 0) for a cell that is not a reward cell."""
    value, _, n = cell.metrics.get(REWARD_ERROR_RATE, (math.nan, math.nan, math.nan))
    if not (math.isfinite(value) and math.isfinite(n)):
        return 0, 0
    return round(value * n), int(n)


def errored_note(
    metric: str,
    no_score: Mapping[tuple[str, int], tuple[int, int]],
    pair: tuple[str, str],
    seeds: Collection[int],
) -> str:
    """deltas.csv's `errored_note`: for each side of a comparison whose reward function gave no
    score for some samples of the paired seeds, how many (the cells' `reward_error_rate`
    counts), and that the delta counts them as 0, whatever the cells' own numbers do with them
    (the pairs are the score lines' `passed` or `score`, and an errored sample's line has score
    0 and is not passed); "" when no sample errored. Worded as `ckpteval compare`'s warning."""
    parts = []
    for ckpt in pair:
        counts = [no_score.get((ckpt, seed), (0, 0)) for seed in sorted(seeds)]
        errored = sum(c[0] for c in counts)
        if errored:
            parts.append(
                f"{ckpt}: the reward function gave no score for {errored} of "
                f"{sum(c[1] for c in counts)} samples; this delta's {metric} counts them as 0 "
                "(their score lines' score)"
            )
    return "; ".join(parts)


def _paired_test(flipped: FlipResult, j: int) -> str:
    """`paired_test` of comparison j: McNemar's, or why there is none."""
    if not flipped.binary[j]:
        return NO_TEST_NOT_BINARY
    return MCNEMAR if flipped.n_problems[j] else NO_TEST_NO_PAIRS


def _flip_rows(
    key: GroupKey, comparisons: Sequence[Comparison], flipped: FlipResult, task_ids: pd.Index
) -> list[dict[str, Any]]:
    """`FLIP_COLUMNS` rows of the group's flipped problems, per comparison gained before lost."""
    run, task, sampling, _ = key
    return [
        {
            "run": run,
            "task": task,
            "sampling": sampling,
            "ckpt_a": ref,
            "ckpt_b": ckpt,
            "task_id": task_ids[code],
            "direction": direction,
        }
        for j, (ckpt, ref, _) in enumerate(comparisons)
        for direction, which in (("gained", flipped.gained), ("lost", flipped.lost))
        for code in flipped.problems[which[:, j]]
    ]


def _delta_frame(results: list[dict[str, Any]]) -> pd.DataFrame:
    """`deltas.csv` from the rows, in (run, task, sampling, step) order: `p_holm` is `p_value`
    adjusted by Holm's method over every comparison of the table (the family the report and
    metrics.md mark from), `significant` that it is at most `ALPHA`, `regression` a significant
    drop."""
    frame = pd.DataFrame(results, columns=DELTA_COLUMNS)
    frame["p_holm"] = holm(frame["p_value"].to_numpy(np.float64))
    frame["significant"] = frame["p_holm"] <= ALPHA
    frame["regression"] = frame["significant"] & (frame["delta"] < 0)
    frame = frame.astype({"step": "Int64", "ref_step": "Int64"})
    frame = frame.sort_values(["run", "task", "sampling", "step"], kind="stable")
    return frame.reset_index(drop=True)


def _comparisons(group: pd.DataFrame) -> list[Comparison]:
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


def template_note(deltas: pd.DataFrame | None) -> str | None:
    """`TEMPLATE_NOTE` when some comparison pairs cells of different chat templates, else None."""
    if deltas is None or "chat_templates_differ" not in deltas or deltas.empty:
        return None
    n = int(deltas["chat_templates_differ"].astype(bool).sum())
    return TEMPLATE_NOTE.format(n=n) if n else None
