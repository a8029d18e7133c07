"""Plots (PNG) of a summary (`ckpteval.aggregate.Summary`).

Plots, one set per task, under `summary/plots/`:
- `{task}-steps.png`: the task's main metric over training step, one line per run (and sampling
  config when a task has several), its 95% interval as a band (docs/statistics.md), the run's
  baseline as a dashed horizontal line, a marker where a checkpoint is significantly worse than
  the previous, and a cross on a value that is a mean over the samples that returned a score, its
  errored samples left out (`ckpteval.errored`; metrics.md and the report say how many).
- `{task}-passk.png` (tasks with pass@k): pass@k against k for the baseline and up to
  `PASSK_CURVES` checkpoints spread over each run, seeds pooled.
- `{task}-errors.png` (tasks whose cells count error types): the fraction of samples per error type
  at each checkpoint, averaged over variants, one panel per run.
- `reward-hacking.png` (when cells report `hack_rate`): the share of samples that attempted a
  reward hack over training step, one line per task and run, with a 95% band; shown in the
  report's "Reward hacking" section with a table of the hack types per checkpoint.
- `lengths-{task}.png` (tasks whose cells report token counts): mean completion tokens (with the
  median dashed) and mean reasoning tokens over training step, one colour per run (and sampling
  config), 95% bands on the means.
- `truncation-{task}.png` (tasks whose cells report a truncation rate): `truncation_rate` and
  `truncated_reasoning_rate` (dotted) over training step, with the flag threshold as a grey line.
  Both are shown in the report's "Length and truncation" section, with the table of the length
  metrics and the checkpoints whose truncation rate exceeds the threshold stated plainly (their
  score is a lower bound); those scores are also marked in the report's metrics table.

These PNGs are what `snakemake --report` packs with their captions; `report.html` draws the same
curves as interactive charts (`ckpteval.report.page`). Figures are drawn with matplotlib's object
API (no pyplot, no global backend state).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from ckpteval.aggregate import Summary
from ckpteval.aggregate.tables import HACK_RATE, TRUNCATION_THRESHOLD, excluding_errors
from ckpteval.config import parse_variant
from ckpteval.io import atomic_open

PASSK_CURVES = 4
# Fixed margins with the legend right of the axes: matplotlib's automatic layouts cost ~40% more.
_MARGINS = {"left": 0.08, "right": 0.74, "top": 0.92, "bottom": 0.12}
_LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": "small"}
#: The one plot of every task's hack rate (not a task's own plot: shown under "Reward hacking").
HACK_PLOT = "reward-hacking.png"


#: The report section of the length and truncation plots (`Plot.section`).
LENGTHS_SECTION = "lengths"


@dataclass(frozen=True)
class Plot:
    """A written PNG and the caption the report (and Snakemake's `--report`) shows with it."""

    task: str
    path: Path
    caption: str
    #: The report section showing it other than "Plots" (`LENGTHS_SECTION`), or None.
    section: str | None = None


# ---------------------------------------------------------------------------------------------
# Plots


def write_plots(summary: Summary, plot_dir: Path) -> list[Plot]:
    """Draw every plot of the summary into `plot_dir`; PNGs left from earlier builds are removed."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    plots: list[Plot] = []
    deleted = _deleted(summary)
    excluding = _excluding(summary)
    for task, metric in summary.main_metrics.items():
        plots += _task_plots(summary, task, metric, plot_dir, deleted, excluding)
    plots += _length_plots(summary, plot_dir)
    plots += _training_plots(summary, plot_dir, excluding)
    hacking = summary.seeds[summary.seeds["metric"] == HACK_RATE]
    if not hacking.empty:
        plots.append(_drawn("", _hacks_figure(hacking), plot_dir / HACK_PLOT, _HACKS_CAPTION))
    written = {p.path.name for p in plots}
    for stale in plot_dir.glob("*.png"):
        if stale.name not in written:
            stale.unlink()
    return plots


def _training_plots(
    summary: Summary, plot_dir: Path, excluding: set[tuple[str, str, str, str, str]]
) -> list[Plot]:
    """Per (run, task): ckpteval's metrics (with their 95% intervals) beside the curve the
    trainer logged at the same steps, flagged steps marked, the settings that differ said, and
    each mean that leaves errored samples out crossed (`excluding`, as in `_steps_figure`)."""
    plots = []
    step_of = dict(zip(zip(summary.seeds["run"], summary.seeds["ckpt"]), summary.seeds["step"]))
    crossed = {(r, step_of.get((r, c)), t, s, m) for r, c, t, s, m in excluding}
    for (run, task), rows in summary.training.groupby(["run", "task"], sort=True):
        figure = Figure(figsize=(7, 3.6))
        ax = figure.add_subplot()
        colours = cycle(colormaps["tab10"].colors)
        excluded_label = "errored samples excluded"
        for (variant, metric), curve in rows.groupby(["variant", "metric"], sort=True):
            colour = next(colours)
            curve = curve.sort_values("step")
            label = f"{metric} {variant}"
            ax.plot(curve["step"], curve["ckpteval"], "o-", color=colour, label=f"ckpteval {label}")
            if curve["low"].notna().any():
                ax.fill_between(
                    curve["step"], curve["low"], curve["high"], color=colour, alpha=0.15
                )
            ax.plot(curve["step"], curve["trainer"], "s--", color=colour, label=f"trainer {label}")
            flagged = curve[curve["flagged"].astype(bool)]
            ax.plot(flagged["step"], flagged["trainer"], "rx", markersize=10)
            sampling = parse_variant(variant)[0]
            out = [(run, step, task, sampling, metric) in crossed for step in curve["step"]]
            means = curve[out].rename(columns={"ckpteval": "mean"})
            if _mark(ax, means, excluded_label, **_EXCLUDING):
                excluded_label = "_nolegend_"
        ax.set_xlabel("training step")
        ax.legend(fontsize=6)
        settings = "; ".join(sorted(set(rows["settings"])))
        caption = (
            f"{task} ({run}): ckpteval's reward (solid, 95% band) beside the validation curve "
            f"the trainer logged (dashed) at the same steps; settings: {settings}. Red crosses: "
            "the trainer's value outside ckpteval's interval with every setting matching."
        )
        if excluded_label == "_nolegend_":
            caption += (
                " Black crosses: ckpteval means over the samples that returned a score, the "
                "reward function's errored samples left out (how many: metrics.md)."
            )
        name = f"training-{_slug(run)}-{_slug(task)}.png"
        plots.append(_drawn(task, figure, plot_dir / name, caption))
    return plots


_HACKS_CAPTION = (
    "Reward hacking: share of samples that attempted a reward hack (exit before the "
    "tests, faked test report, redefined assertions, tampering with the tests, reading "
    "the harness's files, always-equal objects, ...) over training step, per task and "
    "run; bands are 95% intervals. Hacks never pass; a rising curve means the policy is "
    "learning to game the checker."
)


def _task_plots(
    summary: Summary,
    task: str,
    metric: str,
    plot_dir: Path,
    deleted: set[tuple[str, str]],
    excluding: set[tuple[str, str, str, str, str]],
) -> list[Plot]:
    """A task's own plots: its main metric over steps, pass@k against k, its error types."""
    plots = []
    slug = _slug(task)
    steps = summary.seeds[(summary.seeds["task"] == task) & (summary.seeds["metric"] == metric)]
    if not steps.empty:
        crossed = {(k[0], k[1], k[3]) for k in excluding if k[2] == task and k[4] == metric}
        figure = _steps_figure(
            task, metric, steps, summary.deltas, deleted, _finals(summary), crossed
        )
        caption = (
            f"{task}: {metric} over training step; bands are 95% intervals (Wilson for scores "
            "in [0, 1]), dashed lines the runs' baselines, red triangles significant drops from the "
            "previous checkpoint"
            + (
                "; crosses: means over the samples that returned a score, the reward "
                "function's errored samples left out (metrics.md says how many)."
                if crossed
                else "."
            )
        )
        plots.append(_drawn(task, figure, plot_dir / f"{slug}-steps.png", caption))
    passk = summary.passk[summary.passk["task"] == task]
    if not passk.empty and passk["k"].max() > 1:
        caption = (
            f"{task}: pass@k against k (unbiased estimator, seeds pooled) for the baseline and "
            "checkpoints spread over each run."
        )
        plots.append(
            _drawn(task, _passk_figure(task, passk), plot_dir / f"{slug}-passk.png", caption)
        )
    errors = summary.errors[summary.errors["task"] == task].dropna(subset=["fraction"])
    if not errors.empty:
        caption = (
            f"{task}: fraction of samples per error type at each checkpoint (mean over variants)."
        )
        plots.append(
            _drawn(task, _errors_figure(task, errors), plot_dir / f"{slug}-errors.png", caption)
        )
    return plots


def _length_plots(summary: Summary, plot_dir: Path) -> list[Plot]:
    """Per task: `lengths-{task}.png` and `truncation-{task}.png`, when its cells report them."""
    plots = []
    threshold = _threshold(summary)
    for task in dict.fromkeys(summary.seeds["task"]):
        rows = summary.seeds[summary.seeds["task"] == task]
        if rows["metric"].isin(["completion_tokens_mean", "reasoning_tokens_mean"]).any():
            caption = (
                f"{task}: mean completion tokens (solid, 95% band; median dashed) and mean "
                "reasoning tokens (dotted) over training step."
            )
            path = plot_dir / f"lengths-{_slug(task)}.png"
            plots.append(_drawn(task, _lengths_figure(task, rows), path, caption, LENGTHS_SECTION))
        if rows["metric"].isin(["truncation_rate", "truncated_reasoning_rate"]).any():
            caption = (
                f"{task}: share of samples cut at the token budget (finish_reason length; "
                "solid, 95% band) and with unfinished reasoning (dotted) over training step; "
                f"the grey line is the flag threshold ({threshold:.0%})."
            )
            figure = _truncation_figure(task, rows, threshold)
            path = plot_dir / f"truncation-{_slug(task)}.png"
            plots.append(_drawn(task, figure, path, caption, LENGTHS_SECTION))
    return plots


def _drawn(task: str, figure: Figure, path: Path, caption: str, section: str | None = None) -> Plot:
    """Save `figure` as `path`: the `Plot` the report and Snakemake's `--report` show."""
    _save(figure, path)
    return Plot(task, path, caption, section)


def _threshold(summary: Summary) -> float:
    values = summary.truncation["threshold"] if not summary.truncation.empty else []
    return float(values.iloc[0]) if len(values) else TRUNCATION_THRESHOLD


def _metric_curves(
    ax: Axes, seeds: pd.DataFrame, styles: dict[str, tuple[str, str, bool]], clip: bool
) -> None:
    """One colour per (run, sampling); per metric of `styles` (name -> line style, label, band)
    its trained checkpoints' seed means over step, and the baseline as a horizontal line."""
    several = seeds["sampling"].nunique() > 1
    colors = _colors()
    for (run, sampling), group in seeds.groupby(["run", "sampling"], sort=False):
        color = next(colors)
        label = f"{run} · {sampling}" if several else run
        for metric, (style, name, band) in styles.items():
            rows = group[group["metric"] == metric]
            _trained_curve(ax, rows, color, f"{label} {name}", style=style, band=band, clip=clip)
            _baselines(
                ax,
                rows,
                color,
                f"{label} {name} (baseline)",
                linestyle=style,
                linewidth=0.8,
                alpha=0.6,
            )


def _trained_curve(
    ax: Axes,
    rows: pd.DataFrame,
    color: tuple[float, ...],
    label: str,
    *,
    style: str = "-",
    band: bool = True,
    clip: bool = False,
    unknown_stderr_as_zero: bool = True,
) -> pd.DataFrame:
    """The trained checkpoints' seed means over step, with a 95% band (the seed table's
    interval: Wilson's for scores in [0, 1]; clipped to [0, 1] for shares); return those rows
    (by step). An unknown interval is a zero-width band, or (`unknown_stderr_as_zero` False) a
    gap in it."""
    trained = rows[~rows["is_baseline"] & rows["step"].notna()].sort_values("step")
    if trained.empty:
        return trained
    x = trained["step"].to_numpy(np.float64)
    y = trained["mean"].to_numpy(np.float64)
    ax.plot(x, y, style, marker="o", markersize=3, color=color, label=label)
    if band:
        low = trained["ci_low"].to_numpy(np.float64)
        high = trained["ci_high"].to_numpy(np.float64)
        if unknown_stderr_as_zero:
            low, high = np.where(np.isnan(low), y, low), np.where(np.isnan(high), y, high)
        if clip:
            low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
        ax.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)
    return trained


def _baselines(
    ax: Axes,
    rows: pd.DataFrame,
    color: tuple[float, ...],
    label: str,
    *,
    linestyle: str = "--",
    linewidth: float = 1,
    alpha: float | None = None,
) -> None:
    """The baseline's seed mean as a horizontal line (one per baseline checkpoint)."""
    for value in rows.loc[rows["is_baseline"], "mean"].dropna():
        ax.axhline(
            value, color=color, linestyle=linestyle, linewidth=linewidth, alpha=alpha, label=label
        )


def _axes() -> tuple[Figure, Axes]:
    """A figure of the plots' size with one axes, the legend's margin on the right."""
    fig = Figure(figsize=(9, 4.2), dpi=100)
    fig.subplots_adjust(**_MARGINS)
    return fig, fig.subplots()


def _finish(ax: Axes, xlabel: str, ylabel: str, title: str, *, from_zero: bool = False) -> None:
    """Labels, title, grid and the legend right of the axes; `from_zero` starts the y axis at 0."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if from_zero:
        ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(**_LEGEND)


def _lengths_figure(task: str, seeds: pd.DataFrame) -> Figure:
    fig, ax = _axes()
    styles = {
        "completion_tokens_mean": ("-", "mean", True),
        "completion_tokens_median": ("--", "median", False),
        "reasoning_tokens_mean": (":", "reasoning mean", True),
    }
    _metric_curves(ax, seeds, styles, clip=False)
    _finish(ax, "training step", "tokens per sample", f"{task}: completion length", from_zero=True)
    return fig


def _truncation_figure(task: str, seeds: pd.DataFrame, threshold: float) -> Figure:
    fig, ax = _axes()
    styles = {
        "truncation_rate": ("-", "truncated", True),
        "truncated_reasoning_rate": (":", "unfinished reasoning", True),
    }
    _metric_curves(ax, seeds, styles, clip=True)
    ax.axhline(threshold, color="grey", linewidth=1, label=f"threshold {threshold:.0%}")
    _finish(ax, "training step", "share of samples", f"{task}: truncation", from_zero=True)
    return fig


def _deleted(summary: Summary) -> set[tuple[str, str]]:
    """(run, ckpt) of the checkpoints whose source is gone (their scores are kept)."""
    tidy = summary.tidy
    if "source_deleted" not in tidy or not tidy["source_deleted"].any():
        return set()
    gone = tidy.loc[tidy["source_deleted"], ["run", "ckpt"]].drop_duplicates()
    return set(gone.itertuples(index=False, name=None))


def _finals(summary: Summary) -> set[tuple[str, str]]:
    """(run, ckpt) of the final checkpoints (saved without a step)."""
    tidy = summary.tidy
    if "final" not in tidy or not tidy["final"].any():
        return set()
    return set(tidy.loc[tidy["final"], ["run", "ckpt"]].drop_duplicates().itertuples(False, None))


def _label_finals(ax: Axes, trained: pd.DataFrame, run: str, finals: set[tuple[str, str]]) -> None:
    """Write "final" above the point of a run's final checkpoint (its step is only its place)."""
    for row in trained[[(run, ckpt) in finals for ckpt in trained["ckpt"]]].itertuples():
        ax.annotate(
            "final",
            (float(row.step), float(row.mean)),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=8,
        )


def _steps_figure(
    task: str,
    metric: str,
    seeds: pd.DataFrame,
    deltas: pd.DataFrame,
    deleted: set[tuple[str, str]] | None = None,
    finals: set[tuple[str, str]] | None = None,
    excluding: set[tuple[str, str, str]] | None = None,
) -> Figure:
    """The main metric over training steps; a checkpoint whose source was deleted keeps its point,
    drawn hollow ("source deleted" in the legend); a final checkpoint is labelled "final"; a
    value of `excluding` ((run, ckpt, sampling): a mean that leaves errored samples out) is
    crossed."""
    fig, ax = _axes()
    several = seeds["sampling"].nunique() > 1
    colors = _colors()
    flagged_label = "significant drop vs previous"
    deleted_label = "source deleted (scores kept)"
    excluded_label = "errored samples excluded"
    for (run, sampling), group in seeds.groupby(["run", "sampling"], sort=False):
        color = next(colors)
        label = f"{run} · {sampling}" if several else run
        trained = _trained_curve(ax, group, color, label, unknown_stderr_as_zero=False)
        if not trained.empty:
            gone = trained[[(run, ckpt) in (deleted or set()) for ckpt in trained["ckpt"]]]
            if _mark(ax, gone, deleted_label, markeredgecolor=color, **_DELETED):
                deleted_label = "_nolegend_"
            out = [(run, ckpt, sampling) in (excluding or set()) for ckpt in trained["ckpt"]]
            if _mark(ax, trained[out], excluded_label, **_EXCLUDING):
                excluded_label = "_nolegend_"
            _label_finals(ax, trained, run, finals or set())
            drops = _drops(deltas, run, task, sampling)
            if _mark_drops(
                ax, trained.set_index("step")["mean"].reindex(drops).dropna(), flagged_label
            ):
                flagged_label = "_nolegend_"
        _baselines(ax, group, color, f"{label} baseline")
    _finish(ax, "training step", metric, f"{task}: {metric}")
    return fig


def _drops(deltas: pd.DataFrame, run: str, task: str, sampling: str) -> pd.Series:
    """The steps of the checkpoints significantly worse than the previous one."""
    return deltas[
        (deltas["run"] == run)
        & (deltas["task"] == task)
        & (deltas["sampling"] == sampling)
        & (deltas["comparison"] == "previous")
        & deltas["regression"]
    ]["step"]


#: How `_mark` draws each kind of point: deleted checkpoints get a hollow circle in their
#: line's colour, means that leave errored samples out a black cross.
_DELETED = {"marker": "o", "markerfacecolor": "white"}
_EXCLUDING = {"marker": "x", "color": "black"}


def _mark(ax: Axes, points: pd.DataFrame, label: str, **style: Any) -> bool:
    """A marker (`style`) on each point of `points`; whether there was one."""
    if points.empty:
        return False
    ax.plot(
        points["step"].to_numpy(np.float64),
        points["mean"].to_numpy(np.float64),
        linestyle="none",
        markersize=9,
        label=label,
        **style,
    )
    return True


def _excluding(summary: Summary) -> set[tuple[str, str, str, str, str]]:
    """The summary's means that leave errored samples out (`aggregate.tables.excluding_errors`)."""
    return excluding_errors(summary.reward_errors)


def _mark_drops(ax: Axes, at: pd.Series, label: str) -> bool:
    """A red triangle at each (step, mean) of `at`; whether there was one."""
    if not len(at):
        return False
    ax.plot(
        at.index.to_numpy(np.float64),
        at.to_numpy(),
        linestyle="none",
        marker="v",
        markersize=8,
        color="red",
        label=label,
    )
    return True


def _hacks_figure(seeds: pd.DataFrame) -> Figure:
    fig, ax = _axes()
    colors = _colors()
    several = seeds.groupby("task")["sampling"].nunique().max() > 1
    for (task, run, sampling), group in seeds.groupby(["task", "run", "sampling"], sort=False):
        color = next(colors)
        label = f"{task} · {run}" + (f" · {sampling}" if several else "")
        _trained_curve(ax, group, color, label, clip=True)
        _baselines(ax, group, color, f"{label} baseline")
    _finish(ax, "training step", "hack rate (share of samples)", "Reward hacking", from_zero=True)
    return fig


def _passk_figure(task: str, passk: pd.DataFrame) -> Figure:
    fig, ax = _axes()
    sampling = passk.groupby("sampling")["k"].max().idxmax()
    rows = passk[passk["sampling"] == sampling]
    styles = ["-", "--", ":", "-."]
    for index, (run, group) in enumerate(rows.groupby("run", sort=False)):
        style = styles[index % len(styles)]
        ckpts = group.drop_duplicates("ckpt")
        trained = ckpts[~ckpts["is_baseline"]].sort_values("step")
        spread = np.linspace(0, len(trained) - 1, PASSK_CURVES).round().astype(int)
        picks = trained.iloc[np.unique(spread)] if len(trained) else trained
        steps = trained["step"].astype(np.float64)
        span = (steps.max() - steps.min()) or 1.0
        for _, ckpt in ckpts[ckpts["is_baseline"]].iterrows():
            curve = group[group["ckpt"] == ckpt["ckpt"]]
            ax.plot(
                curve["k"],
                curve["value"],
                style,
                color="black",
                marker=".",
                label=f"{run} baseline",
            )
        for _, ckpt in picks.iterrows():
            curve = group[group["ckpt"] == ckpt["ckpt"]]
            shade = (
                0.15 + 0.75 * (float(ckpt["step"]) - steps.min()) / span
                if pd.notna(ckpt["step"])
                else 0.5
            )
            ax.plot(
                curve["k"],
                curve["value"],
                style,
                marker=".",
                color=_viridis(shade),
                label=f"{run} {ckpt['ckpt']}",
            )
    if rows["k"].max() > 2:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
    _finish(ax, "k", "pass@k", f"{task}: pass@k ({sampling})")
    return fig


def _errors_figure(task: str, errors: pd.DataFrame) -> Figure:
    runs = list(dict.fromkeys(errors["run"]))
    height = 2.8 * len(runs) + 0.8
    fig = Figure(figsize=(9, height), dpi=100)
    fig.subplots_adjust(
        left=0.08, right=0.77, top=1 - 0.4 / height, bottom=0.7 / height, hspace=0.45
    )
    axes = np.atleast_1d(fig.subplots(len(runs), 1, squeeze=False)[:, 0])
    types = list(errors.groupby("error_type")["count"].sum().sort_values(ascending=False).index)
    colors = dict(zip(types, _colors_list(len(types))))
    for ax, run in zip(axes, runs):
        rows = errors[errors["run"] == run]
        table = (
            rows.groupby(["is_baseline", "step", "ckpt", "error_type"], sort=False, dropna=False)[
                "fraction"
            ]
            .mean()
            .unstack("error_type", fill_value=0.0)
            .reset_index()
            .sort_values(["is_baseline", "step"], ascending=[False, True], na_position="first")
        )
        labels = [
            "base" if b else (str(s) if pd.notna(s) else c)
            for b, s, c in zip(table["is_baseline"], table["step"], table["ckpt"])
        ]
        bottom = np.zeros(len(table))
        x = np.arange(len(table))
        for error_type in types:
            if error_type not in table:
                continue
            heights = table[error_type].to_numpy(np.float64)
            ax.bar(x, heights, bottom=bottom, color=colors[error_type], label=error_type)
            bottom += heights
        ax.set_xticks(x, labels, rotation=90 if len(x) > 12 else 0, fontsize="small")
        ax.set_ylabel("fraction of samples")
        ax.set_title(f"{task}: error types ({run})")
        ax.legend(**_LEGEND)
    axes[-1].set_xlabel("checkpoint (step)")
    return fig


def _save(fig: Figure, path: Path) -> None:
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png")


def _colors() -> Iterator[tuple[float, ...]]:
    return cycle(_colors_list(10))


def _colors_list(n: int) -> list[tuple[float, ...]]:
    palette = colormaps["tab10"].colors
    return [palette[i % len(palette)] for i in range(n)]


def _viridis(x: float) -> tuple[float, ...]:
    return colormaps["viridis"](x)


def _slug(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name)
