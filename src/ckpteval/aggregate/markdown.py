"""`metrics.md`: the seed table as text, checkpoints as rows and `task/metric` columns.

`metrics_wide` is also the report's metrics table (`ckpteval.report.tables`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pandas as pd

from ckpteval.aggregate.deltas import template_note
from ckpteval.aggregate.tables import STDERR_LEGEND, RewardErrors, checkpoint_order
from ckpteval.metrics import LENGTH_METRICS


def metrics_wide(
    seeds: pd.DataFrame, marks: dict[tuple[str, str, str, str, str], str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Checkpoints as rows ordered by (run, step), `task/metric` columns (with the sampling config
    when a task has several), each entry the mean over seeds with its 95% interval
    (`mean [low, high]`, the seed table's; `mean ± stderr` for a table without intervals):
    (header, rows) of text.
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
    low = seeds["ci_low"] if "ci_low" in seeds else pd.Series(np.nan, index=seeds.index)
    high = seeds["ci_high"] if "ci_high" in seeds else pd.Series(np.nan, index=seeds.index)
    for run, ckpt, label, value, stderr, lo, hi, task, sampling, metric in zip(
        seeds["run"],
        seeds["ckpt"],
        labels,
        seeds["mean"],
        seeds["cell_stderr"],
        low,
        high,
        seeds["task"],
        seeds["sampling"],
        seeds["metric"],
    ):
        mark = (marks or {}).get((run, ckpt, task, sampling, metric), "")
        texts.setdefault((run, ckpt), {})[label] = _format_value(value, stderr, lo, hi) + mark
    ckpts = checkpoint_order(seeds.drop_duplicates(["run", "ckpt"]), [])
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
    errors: Mapping[tuple[str, str, str, str], RewardErrors] | None = None,
    main_metrics: Mapping[str, str] | None = None,
) -> str:
    """`metrics.md`: the title, a one-line legend (and `template_note` of the `deltas` when it
    has one) and `metrics_wide` as a Markdown table (length metrics left out), then the length
    metrics' own table. Each entry of `flags` (`truncation_flags`) marks its value with a
    footnote saying the score is a lower bound. Each checkpoint entry of `errors`
    (`reward_errors`) has a footnote saying how many samples the reward function gave no score
    and what each number does with them; it marks its main metric (`main_metrics`) and every
    number that counts them, with a few words of how (`error_marks`)."""
    lines = [f"# {title}", ""]
    if seeds.empty:
        return "\n".join(lines + ["No scored cells.", ""])
    lengths = seeds["metric"].isin(LENGTH_METRICS)
    marks = {key: f" [^t{i}]" for i, key in enumerate(flags or {}, start=1)}
    for key, mark in error_marks(errors or {}, main_metrics or {}, " [^e{}]").items():
        marks[key] = marks.get(key, "") + mark
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
    for i, ((run, ckpt, task, sampling), entry) in enumerate((errors or {}).items(), start=1):
        lines.append(f"[^e{i}]: {run} {ckpt} {task} ({sampling}): {entry.words()}")
    if flags or errors:
        lines.append("")
    return "\n".join(lines)


def error_marks(
    errors: Mapping[tuple[str, str, str, str], RewardErrors],
    main_metrics: Mapping[str, str],
    reference: str = "",
) -> dict[tuple[str, str, str, str, str], str]:
    """(run, ckpt, task, sampling, metric) -> what follows the value in a table: for each number
    of an entry of `errors` that counts errored samples, how (" (excludes 6 of 20 errored)"),
    and for the entry's main metric at least a reference to the entry's words (`reference`,
    formatted with the entry's position from 1, e.g. a footnote)."""
    marks: dict[tuple[str, str, str, str, str], str] = {}
    for i, (key, entry) in enumerate(errors.items(), start=1):
        note = reference.format(i)
        for metric, errored in entry.numbers:
            mark = marks.get((*key, metric), "").removesuffix(note)
            marks[(*key, metric)] = f"{mark} ({errored.mark()}){note}"
        main = main_metrics.get(key[2])
        if main is not None and (*key, main) not in marks:
            marks[(*key, main)] = f" ({entry.errored} of {entry.samples} samples errored){note}"
    return marks


def _format_value(value: float, stderr: float, low: float, high: float) -> str:
    if pd.isna(value):
        return ""
    if pd.notna(low) and pd.notna(high) and low < high:
        return f"{value:.3f} [{low:.3f}, {high:.3f}]"
    if pd.notna(low) and pd.notna(high):
        return f"{value:.3f}"  # no spread to show: a mean of identical values
    if pd.isna(stderr) or stderr == 0:
        return f"{value:.3f}"
    return f"{value:.3f} ± {stderr:.3f}"


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(re.sub(r"\|", r"\\|", str(c)) for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])
