"""ckpteval's reward beside the validation curve the trainer logged (`runs.<run>.train_logs`).

`training_table` pairs each metric of a run's cells that the trainer logged under the same name
(verl's `val-core/<data_source>/reward/mean@<N>`, which reward cells report per data source;
`metrics:` maps other names) with the trainer's value at the checkpoint's step. The two agree only
if the generation does: verl's validation settings, when the run gives them (`val_kwargs`: n,
temperature, top_p, do_sample; `response_length`), are compared with the cell's sampling config,
and a step is flagged when the trainer's value lies outside ckpteval's 95% interval only when
every given setting matches (`ckpteval.trainlogs.compare_curves`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ckpteval.config import parse_variant, resolve_path
from ckpteval.trainlogs import compare_curves, read_curves, settings_differences

TRAINING_COLUMNS = [
    "run",
    "task",
    "variant",
    "metric",
    "trainer_metric",
    "step",
    "trainer",
    "ckpteval",
    "low",
    "high",
    "settings",
    "flagged",
]


def training_table(
    tidy: pd.DataFrame,
    train_logs: Mapping[str, Mapping[str, Any]],
    sampling: Mapping[str, Mapping[str, Any]],
) -> pd.DataFrame:
    """One row per (run, task, variant, metric, step) where ckpteval and the trainer both have
    a value: `TRAINING_COLUMNS`. `settings` is "match" (every given validation setting is the
    cell's), "not given" (none given: nothing is flagged) or the differences, `; `-joined."""
    rows: list[dict[str, Any]] = []
    for run, logs in train_logs.items():
        ours = tidy[tidy["run"] == run]
        names = dict(logs.get("metrics") or {})
        for metric in ours["metric"].unique():
            if str(metric).startswith("val-core/"):
                names.setdefault(str(metric), str(metric))
        names = {mine: theirs for mine, theirs in names.items() if mine in set(ours["metric"])}
        if not names:
            continue
        # the path as the config check resolved it (ckpteval.config.build_plan)
        curves = read_curves(resolve_path(str(logs["path"]), Path.cwd()), set(names.values()))
        for (task, variant, metric), group in ours[ours["metric"].isin(names)].groupby(
            ["task", "variant", "metric"], sort=True
        ):
            curve = curves.get(names[metric])
            if not curve:
                continue
            rows += _rows(run, task, variant, metric, names[metric], group, curve, logs, sampling)
    return pd.DataFrame(rows, columns=TRAINING_COLUMNS)


def _rows(
    run: str,
    task: str,
    variant: str,
    metric: str,
    trainer_metric: str,
    group: pd.DataFrame,
    curve: Mapping[int, float],
    logs: Mapping[str, Any],
    sampling: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    given = {**(logs.get("val_kwargs") or {})}
    if logs.get("response_length") is not None:
        given["response_length"] = logs["response_length"]
    samples = _samples(metric)
    name, _ = parse_variant(variant)
    differ = settings_differences(given, sampling.get(name, {}), samples) if given else []
    settings = "not given" if not given else ("; ".join(differ) or "match")
    ours = [
        (int(r.step), float(r.value), *_interval(r.ci_low, r.ci_high))
        for r in group.sort_values("step").itertuples()
        if pd.notna(r.step) and pd.notna(r.value)
    ]
    points = compare_curves(curve, ours, settings_match=settings == "match")
    return [
        {
            "run": run,
            "task": task,
            "variant": variant,
            "metric": metric,
            "trainer_metric": trainer_metric,
            "step": p.step,
            "trainer": p.trainer,
            "ckpteval": p.ckpteval,
            "low": p.low,
            "high": p.high,
            "settings": settings,
            "flagged": p.flagged,
        }
        for p in points
    ]


def _samples(metric: str) -> int:
    """N of a `.../mean@N` metric name (the samples per problem), else 1."""
    _, _, tail = metric.rpartition("@")
    return int(tail) if tail.isdigit() else 1


def _interval(low: Any, high: Any) -> tuple[float | None, float | None]:
    """The tidy table's interval of a row (`aggregate.tables.score_intervals`: Wilson's for a
    reward in [0, 1], never zero-width at 0 or 1), None where it has none."""
    if pd.isna(low) or pd.isna(high):
        return None, None
    return float(low), float(high)
