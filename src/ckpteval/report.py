"""Plots (PNG) and a self-contained HTML report of a summary built by `ckpteval.aggregate`.

Plots, one set per task, under `summary/plots/`:
- `{task}-steps.png`: the task's main metric over training step, one line per run (and sampling
  config when a task has several), a 95% band of ±1.96 standard errors, the run's baseline as a
  dashed horizontal line, and a marker where a checkpoint is significantly worse than the previous.
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

`report.html` holds the tables and the plots inlined as base64, so it can be mailed or archived as
one file. Its "Paired comparisons" section is the compare view of each run (`_paired_section`):
the last checkpoint against the baseline and each checkpoint against the previous one, with the
delta's interval, McNemar's exact p, the minimum detectable effect and the flipped problems. Figures are drawn with matplotlib's object API (no pyplot, no global backend state).
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from ckpteval.aggregate import (
    CONFIDENCE,
    HACK_RATE,
    MCNEMAR,
    STDERR_LEGEND,
    Summary,
    metrics_wide,
    template_note,
    truncation_flags,
)
from ckpteval.io import atomic_open
from ckpteval.metrics import LENGTH_METRICS

PASSK_CURVES = 4
# Fixed margins with the legend right of the axes: matplotlib's automatic layouts cost ~40% more.
_MARGINS = {"left": 0.08, "right": 0.74, "top": 0.92, "bottom": 0.12}
_LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": "small"}
_Z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)  # 1.96 for 95%
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
    for task, metric in summary.main_metrics.items():
        slug = _slug(task)
        steps = summary.seeds[(summary.seeds["task"] == task) & (summary.seeds["metric"] == metric)]
        if not steps.empty:
            path = plot_dir / f"{slug}-steps.png"
            _save(_steps_figure(task, metric, steps, summary.deltas, deleted), path)
            plots.append(
                Plot(
                    task,
                    path,
                    (
                        f"{task}: {metric} over training step; bands are 95% intervals (±1.96 stderr), "
                        "dashed lines the runs' baselines, red triangles significant drops from the "
                        "previous checkpoint."
                    ),
                )
            )
        passk = summary.passk[summary.passk["task"] == task]
        if not passk.empty and passk["k"].max() > 1:
            path = plot_dir / f"{slug}-passk.png"
            _save(_passk_figure(task, passk), path)
            plots.append(
                Plot(
                    task,
                    path,
                    (
                        f"{task}: pass@k against k (unbiased estimator, seeds pooled) for the baseline and "
                        "checkpoints spread over each run."
                    ),
                )
            )
        errors = summary.errors[summary.errors["task"] == task].dropna(subset=["fraction"])
        if not errors.empty:
            path = plot_dir / f"{slug}-errors.png"
            _save(_errors_figure(task, errors), path)
            plots.append(
                Plot(
                    task,
                    path,
                    (
                        f"{task}: fraction of samples per error type at each checkpoint (mean over "
                        "variants)."
                    ),
                )
            )
    plots += _length_plots(summary, plot_dir)
    hacking = summary.seeds[summary.seeds["metric"] == HACK_RATE]
    if not hacking.empty:
        path = plot_dir / HACK_PLOT
        _save(_hacks_figure(hacking), path)
        plots.append(
            Plot(
                "",
                path,
                (
                    "Reward hacking: share of samples that attempted a reward hack (exit before the "
                    "tests, faked test report, redefined assertions, tampering with the tests, reading "
                    "the harness's files, always-equal objects, ...) over training step, per task and "
                    "run; bands are 95% intervals. Hacks never pass; a rising curve means the policy is "
                    "learning to game the checker."
                ),
            )
        )
    written = {p.path.name for p in plots}
    for stale in plot_dir.glob("*.png"):
        if stale.name not in written:
            stale.unlink()
    return plots


def _length_plots(summary: Summary, plot_dir: Path) -> list[Plot]:
    """Per task: `lengths-{task}.png` and `truncation-{task}.png`, when its cells report them."""
    plots = []
    threshold = _threshold(summary)
    for task in dict.fromkeys(summary.seeds["task"]):
        rows = summary.seeds[summary.seeds["task"] == task]
        if rows["metric"].isin(["completion_tokens_mean", "reasoning_tokens_mean"]).any():
            path = plot_dir / f"lengths-{_slug(task)}.png"
            _save(_lengths_figure(task, rows), path)
            plots.append(
                Plot(
                    task,
                    path,
                    f"{task}: mean completion tokens (solid, 95% band; median dashed) and mean "
                    "reasoning tokens (dotted) over training step.",
                    LENGTHS_SECTION,
                )
            )
        if rows["metric"].isin(["truncation_rate", "truncated_reasoning_rate"]).any():
            path = plot_dir / f"truncation-{_slug(task)}.png"
            _save(_truncation_figure(task, rows, threshold), path)
            plots.append(
                Plot(
                    task,
                    path,
                    f"{task}: share of samples cut at the token budget (finish_reason length; "
                    "solid, 95% band) and with unfinished reasoning (dotted) over training step; "
                    f"the grey line is the flag threshold ({threshold:.0%}).",
                    LENGTHS_SECTION,
                )
            )
    return plots


def _threshold(summary: Summary) -> float:
    from ckpteval.aggregate import TRUNCATION_THRESHOLD

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
            trained = rows[~rows["is_baseline"] & rows["step"].notna()].sort_values("step")
            if not trained.empty:
                x = trained["step"].to_numpy(np.float64)
                y = trained["mean"].to_numpy(np.float64)
                ax.plot(x, y, style, marker="o", markersize=3, color=color, label=f"{label} {name}")
                if band:
                    half = _Z * trained["cell_stderr"].fillna(0).to_numpy(np.float64)
                    low, high = y - half, y + half
                    if clip:
                        low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
                    ax.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)
            for value in rows.loc[rows["is_baseline"], "mean"].dropna():
                ax.axhline(
                    value,
                    color=color,
                    linestyle=style,
                    linewidth=0.8,
                    alpha=0.6,
                    label=f"{label} {name} (baseline)",
                )


def _lengths_figure(task: str, seeds: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(9, 4.2), dpi=100)
    fig.subplots_adjust(**_MARGINS)
    ax = fig.subplots()
    styles = {
        "completion_tokens_mean": ("-", "mean", True),
        "completion_tokens_median": ("--", "median", False),
        "reasoning_tokens_mean": (":", "reasoning mean", True),
    }
    _metric_curves(ax, seeds, styles, clip=False)
    ax.set_xlabel("training step")
    ax.set_ylabel("tokens per sample")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{task}: completion length")
    ax.grid(alpha=0.3)
    ax.legend(**_LEGEND)
    return fig


def _truncation_figure(task: str, seeds: pd.DataFrame, threshold: float) -> Figure:
    fig = Figure(figsize=(9, 4.2), dpi=100)
    fig.subplots_adjust(**_MARGINS)
    ax = fig.subplots()
    styles = {
        "truncation_rate": ("-", "truncated", True),
        "truncated_reasoning_rate": (":", "unfinished reasoning", True),
    }
    _metric_curves(ax, seeds, styles, clip=True)
    ax.axhline(threshold, color="grey", linewidth=1, label=f"threshold {threshold:.0%}")
    ax.set_xlabel("training step")
    ax.set_ylabel("share of samples")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{task}: truncation")
    ax.grid(alpha=0.3)
    ax.legend(**_LEGEND)
    return fig


def _deleted(summary: Summary) -> set[tuple[str, str]]:
    """(run, ckpt) of the checkpoints whose source is gone (their scores are kept)."""
    tidy = summary.tidy
    if "source_deleted" not in tidy or not tidy["source_deleted"].any():
        return set()
    gone = tidy.loc[tidy["source_deleted"], ["run", "ckpt"]].drop_duplicates()
    return set(gone.itertuples(index=False, name=None))


def _steps_figure(
    task: str,
    metric: str,
    seeds: pd.DataFrame,
    deltas: pd.DataFrame,
    deleted: set[tuple[str, str]] | None = None,
) -> Figure:
    """The main metric over training steps; a checkpoint whose source was deleted keeps its point,
    drawn hollow ("source deleted" in the legend)."""
    fig = Figure(figsize=(9, 4.2), dpi=100)
    fig.subplots_adjust(**_MARGINS)
    ax = fig.subplots()
    several = seeds["sampling"].nunique() > 1
    colors = _colors()
    flagged_label = "significant drop vs previous"
    deleted_label = "source deleted (scores kept)"
    for (run, sampling), group in seeds.groupby(["run", "sampling"], sort=False):
        color = next(colors)
        label = f"{run} · {sampling}" if several else run
        trained = group[~group["is_baseline"] & group["step"].notna()].sort_values("step")
        if not trained.empty:
            x = trained["step"].to_numpy(np.float64)
            y = trained["mean"].to_numpy(np.float64)
            half = _Z * trained["cell_stderr"].to_numpy(np.float64)
            ax.plot(x, y, marker="o", markersize=3, color=color, label=label)
            ax.fill_between(x, y - half, y + half, color=color, alpha=0.2, linewidth=0)
            gone = trained[[(run, ckpt) in (deleted or set()) for ckpt in trained["ckpt"]]]
            if not gone.empty:
                ax.plot(
                    gone["step"].to_numpy(np.float64),
                    gone["mean"].to_numpy(np.float64),
                    linestyle="none",
                    marker="o",
                    markersize=9,
                    markerfacecolor="white",
                    markeredgecolor=color,
                    label=deleted_label,
                )
                deleted_label = "_nolegend_"
            drops = deltas[
                (deltas["run"] == run)
                & (deltas["task"] == task)
                & (deltas["sampling"] == sampling)
                & (deltas["comparison"] == "previous")
                & deltas["regression"]
            ]
            at = trained.set_index("step")["mean"].reindex(drops["step"]).dropna()
            if len(at):
                ax.plot(
                    at.index.to_numpy(np.float64),
                    at.to_numpy(),
                    linestyle="none",
                    marker="v",
                    markersize=8,
                    color="red",
                    label=flagged_label,
                )
                flagged_label = "_nolegend_"
        for value in group.loc[group["is_baseline"], "mean"].dropna():
            ax.axhline(value, color=color, linestyle="--", linewidth=1, label=f"{label} baseline")
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    ax.set_title(f"{task}: {metric}")
    ax.grid(alpha=0.3)
    ax.legend(**_LEGEND)
    return fig


def _hacks_figure(seeds: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(9, 4.2), dpi=100)
    fig.subplots_adjust(**_MARGINS)
    ax = fig.subplots()
    colors = _colors()
    several = seeds.groupby("task")["sampling"].nunique().max() > 1
    for (task, run, sampling), group in seeds.groupby(["task", "run", "sampling"], sort=False):
        color = next(colors)
        label = f"{task} · {run}" + (f" · {sampling}" if several else "")
        trained = group[~group["is_baseline"] & group["step"].notna()].sort_values("step")
        if not trained.empty:
            x = trained["step"].to_numpy(np.float64)
            y = trained["mean"].to_numpy(np.float64)
            half = _Z * trained["cell_stderr"].fillna(0).to_numpy(np.float64)
            ax.plot(x, y, marker="o", markersize=3, color=color, label=label)
            ax.fill_between(
                x,
                np.clip(y - half, 0, 1),
                np.clip(y + half, 0, 1),
                color=color,
                alpha=0.2,
                linewidth=0,
            )
        for value in group.loc[group["is_baseline"], "mean"].dropna():
            ax.axhline(value, color=color, linestyle="--", linewidth=1, label=f"{label} baseline")
    ax.set_xlabel("training step")
    ax.set_ylabel("hack rate (share of samples)")
    ax.set_ylim(bottom=0)
    ax.set_title("Reward hacking")
    ax.grid(alpha=0.3)
    ax.legend(**_LEGEND)
    return fig


def _passk_figure(task: str, passk: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(9, 4.2), dpi=100)
    fig.subplots_adjust(**_MARGINS)
    ax = fig.subplots()
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
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_title(f"{task}: pass@k ({sampling})")
    ax.grid(alpha=0.3)
    ax.legend(**_LEGEND)
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


# ---------------------------------------------------------------------------------------------
# HTML


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { padding: 0.2em 0.6em; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f4f4f4; position: sticky; top: 0; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; } figcaption { font-size: 0.85em; color: #555; max-width: 750px; }
.bad { color: #b00; } .note { color: #555; font-size: 0.9em; }
details > summary { cursor: pointer; font-weight: 600; margin: 0.5em 0; }
"""


def write_html(summary: Summary, plots: Sequence[Plot], path: Path) -> None:
    """Write the self-contained report: summary line, missing files, regressions, plots, tables."""
    with atomic_open(path, "w") as handle:
        handle.write(render_html(summary, plots))


def render_html(summary: Summary, plots: Sequence[Plot]) -> str:
    tidy = summary.tidy
    title = html.escape(summary.title)
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{_CSS}</style></head><body><h1>{title}</h1>",
        f"<p>{summary.n_cells} scored cells: {tidy['run'].nunique()} run(s), "
        f"{tidy[['run', 'ckpt']].drop_duplicates().shape[0]} checkpoint(s), "
        f"{tidy['task'].nunique()} task(s), {tidy['variant'].nunique()} variant(s). "
        f"{len(summary.missing)} file(s) missing or unusable.</p>",
    ]
    if summary.broken:
        parts += [
            "<h2 class='bad'>Checkpoints that look broken</h2>",
            "<p class='note'>Not completely written and unchanged for longer than the run's "
            "settle_seconds: not evaluated until they are fixed or removed.</p>",
            "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in summary.broken) + "</ul>",
        ]
    note = template_note(summary.deltas)
    if note:
        parts.append(f"<p class='bad'>{html.escape(note)}</p>")
    if "source_deleted" in tidy and tidy["source_deleted"].any():
        gone = tidy[tidy["source_deleted"]][["run", "ckpt", "step"]].drop_duplicates()
        parts += [
            "<h2>Checkpoints whose source was deleted</h2>",
            "<p class='note'>Their scores were computed before the trainer removed them; "
            "they stay in every table and plot.</p>",
            _table(gone),
        ]
    if not summary.missing.empty:
        parts += [
            "<h2 class='bad'>Missing or unusable files</h2>",
            "<p class='note'>Cells of kind <i>cell</i> are left out of every table; "
            "<i>samples</i> files only lose paired deltas and pass@k curves.</p>",
            _table(summary.missing),
        ]
    parts.append("<h2>Regressions</h2>")
    deltas = summary.deltas
    regressions = deltas[deltas["regression"].astype(bool)] if not deltas.empty else deltas
    if regressions.empty:
        parts.append(
            "<p>No checkpoint is significantly worse (95% paired bootstrap interval "
            "below zero) than its run's baseline or its previous checkpoint.</p>"
        )
    else:
        parts += [
            f"<p class='bad'>{len(regressions)} comparison(s) with a 95% interval below "
            "zero. With many comparisons some are expected by chance (5% each).</p>",
            _table(regressions),
        ]
    parts.append("<h2>Plots</h2>")
    task_plots = [plot for plot in plots if plot.path.name != HACK_PLOT and plot.section is None]
    parts += [_figure(plot) for plot in task_plots]
    if not task_plots:
        parts.append("<p>No plots: no scored cells.</p>")
    parts += _hacking_section(summary, [plot for plot in plots if plot.path.name == HACK_PLOT])
    parts += _lengths_section(summary, [plot for plot in plots if plot.section == LENGTHS_SECTION])
    parts += ["<h2>Metrics</h2>", f"<p class='note'>{html.escape(STDERR_LEGEND)}</p>"]
    scores = summary.seeds[~summary.seeds["metric"].isin(LENGTH_METRICS)]
    if not scores.empty:
        flags = truncation_flags(summary.truncation, summary.main_metrics)
        header, rows = metrics_wide(scores, {key: " (lower bound)" for key in flags})
        parts.append(_table(pd.DataFrame(rows, columns=header)))
    parts += _paired_section(summary)
    parts += [
        "<h2>Paired deltas</h2>",
        "<p class='note'>Checkpoint minus reference on the samples both scored (same task_id, "
        "seed, sample_idx), seeds of a sampling config pooled; 95% percentile bootstrap "
        "interval over problems.</p>",
        _table(deltas),
        _section("Seeds: spread over seeds", summary.seeds),
        _section("Sampling configs across checkpoints", summary.configs),
        _section("pass@k (seeds pooled)", _passk_wide(summary.passk)),
        _section("Error types (fraction of samples)", _errors_wide(summary.errors)),
        "</body></html>\n",
    ]
    return "\n".join(parts)


def _figure(plot: Plot) -> str:
    data = base64.b64encode(plot.path.read_bytes()).decode("ascii")
    return (
        f"<figure><img alt='{html.escape(plot.path.name)}' "
        f"src='data:image/png;base64,{data}'><figcaption>{html.escape(plot.caption)}"
        "</figcaption></figure>"
    )


def _hacking_section(summary: Summary, plots: Sequence[Plot]) -> list[str]:
    """ "Reward hacking": the hack-rate curve, the rate per checkpoint and task, and the hack
    types per checkpoint (counts summed over variants)."""
    parts = ["<h2>Reward hacking</h2>"]
    rates = summary.seeds[summary.seeds["metric"] == HACK_RATE]
    if rates.empty:
        return parts + [
            "<p>No cell reports a hack rate (scored before ckpteval recorded reward "
            "hacks, or by a scorer that does not).</p>"
        ]
    parts.append(
        "<p class='note'>A sample's verdict records the reward hack it attempted "
        "(<code>ckpteval.checkers.HACK_TYPES</code>); a hack never makes a sample pass. "
        "Hack rate: share of a cell's samples with one, mean over seeds.</p>"
    )
    parts += [_figure(plot) for plot in plots]
    keys = ["run", "ckpt", "step"]
    wide = rates.groupby([*keys, "task"], sort=False, dropna=False)["mean"].mean().unstack("task")
    wide.columns = [f"{task} hack_rate" for task in wide.columns]
    table = wide.reset_index()
    hacks = summary.hacks
    if not hacks.empty:
        counts = (
            hacks.groupby([*keys, "hack"], sort=False, dropna=False)["count"]
            .sum()
            .unstack("hack", fill_value=0)
        )
        table = table.merge(counts.reset_index(), on=keys, how="left")
        for hack in counts.columns:
            table[hack] = table[hack].fillna(0).astype(int)
    parts.append(_table(table))
    if hacks.empty:
        parts.append("<p>No sample attempted a reward hack.</p>")
    return parts


def _lengths_section(summary: Summary, plots: Sequence[Plot]) -> list[str]:
    """ "Length and truncation": the checkpoints whose score is a lower bound, the curves, and the
    length metrics per checkpoint."""
    parts = ["<h2>Length and truncation</h2>"]
    lengths = summary.seeds[summary.seeds["metric"].isin(LENGTH_METRICS)]
    if lengths.empty:
        return parts + [
            "<p>No cell reports token counts or finish reasons (replayed solutions, or scored "
            "before ckpteval recorded them).</p>"
        ]
    threshold = _threshold(summary)
    parts.append(
        "<p class='note'>From the generation lines: completion (and reasoning) tokens per "
        "sample, the share of samples cut at the token budget (finish_reason length) and with "
        "unfinished reasoning, over the samples whose line states them. A cell whose truncation "
        f"rate exceeds {threshold:.0%} (aggregate.truncation_threshold) is flagged.</p>"
    )
    flags = truncation_flags(summary.truncation, summary.main_metrics)
    if flags:
        items = "".join(
            f"<li>{html.escape(f'{run} {ckpt} {task} ({sampling})')}: {metric} — score is a "
            f"lower bound: {share:.0%} of samples hit the token budget</li>"
            for (run, ckpt, task, sampling, metric), share in flags.items()
        )
        parts.append(
            f"<p class='bad'>{len(flags)} checkpoint score(s) are lower bounds: more than "
            f"{threshold:.0%} of their samples hit the token budget, and a cut answer counts as "
            f"wrong.</p><ul>{items}</ul>"
        )
    elif not summary.truncation.empty:
        parts.append(f"<p>No cell's truncation rate exceeds {threshold:.0%}.</p>")
    parts += [_figure(plot) for plot in plots]
    header, rows = metrics_wide(lengths)
    parts.append(_table(pd.DataFrame(rows, columns=header)))
    return parts


def _paired_section(summary: Summary) -> list[str]:
    """ "Paired comparisons": per run, the first and the last checkpoint vs the baseline and every
    checkpoint vs the previous one (so every step's change is there): delta with its interval, McNemar's exact p, the minimum detectable
    effect, and the flipped problems in a <details> list."""
    parts = [
        "<h2>Paired comparisons</h2>",
        "<p class='note'>Checkpoint minus reference on the samples both scored. Delta: mean "
        f"per-sample difference, {CONFIDENCE:.0%} bootstrap interval over problems. McNemar: "
        "exact two-sided test on per-problem verdicts (solved when more than half of the "
        "problem's paired samples pass); gained = unsolved by the reference, solved now; lost "
        "the reverse. MDE: the smallest difference this many problems can detect (alpha 0.05, "
        "power 0.8); a smaller delta is not evidence either way; with fewer than 6 problems "
        "none is detectable. Tasks whose scores are not "
        "pass/fail get no McNemar test.</p>",
    ]
    deltas = summary.deltas
    if deltas.empty:
        return parts + ["<p>No paired comparisons: no run has two checkpoints scored.</p>"]
    steps = deltas.groupby(["run", "task", "sampling"])["step"]
    first, last = steps.transform("min"), steps.transform("max")
    shown = deltas[
        (deltas["comparison"] == "previous")
        | (
            (deltas["comparison"] == "baseline")
            & ((deltas["step"] == last) | (deltas["step"] == first))
        )
    ]
    # (run, task, sampling, ckpt_a, ckpt_b) -> direction -> the flipped task_ids, in one pass
    flipped: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for *key, task_id, direction in summary.flips[
        ["run", "task", "sampling", "ckpt_a", "ckpt_b", "task_id", "direction"]
    ].itertuples(index=False, name=None):
        flipped.setdefault(tuple(map(str, key)), {}).setdefault(direction, []).append(str(task_id))
    for run, rows in shown.groupby("run", sort=False):
        table = pd.DataFrame(
            {
                "task": rows["task"],
                "sampling": rows["sampling"],
                "checkpoint": rows["ckpt"] + " vs " + rows["ref_ckpt"],
                "problems": rows["n_problems"],
                "delta [95% CI]": [
                    f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" if pd.notna(d) else ""
                    for d, lo, hi in zip(rows["delta"], rows["ci_low"], rows["ci_high"])
                ],
                "gained": rows["n_gained"],
                "lost": rows["n_lost"],
                "McNemar p": [
                    f"{p:.3g}" if t == MCNEMAR else t
                    for p, t in zip(rows["mcnemar_p"], rows["paired_test"])
                ],
                "MDE": [
                    "" if pd.isna(m) else f"{m:.3f}" if np.isfinite(m) else "none (too few)"
                    for m in rows["mde"]
                ],
            }
        )
        items = []
        for task, sampling, ckpt, ref in zip(
            rows["task"], rows["sampling"], rows["ckpt"], rows["ref_ckpt"]
        ):
            ids = flipped.get((str(run), task, sampling, ref, ckpt))
            if not ids:
                continue
            items.append(
                f"<li>{html.escape(f'{task} ({sampling}) {ckpt} vs {ref}')}: "
                f"gained {html.escape(', '.join(ids.get('gained', [])) or '-')}; "
                f"lost {html.escape(', '.join(ids.get('lost', [])) or '-')}</li>"
            )
        parts += [f"<h3>{html.escape(str(run))}</h3>", _table(table)]
        if items:
            parts.append(
                f"<details><summary>Flipped problems ({len(items)} comparison(s))</summary>"
                f"<ul>{''.join(items)}</ul></details>"
            )
    return parts


def _section(heading: str, frame: pd.DataFrame) -> str:
    if frame.empty:
        return f"<h2>{html.escape(heading)}</h2><p>None.</p>"
    return (
        f"<h2>{html.escape(heading)}</h2><details><summary>{len(frame)} rows</summary>"
        f"{_table(frame)}</details>"
    )


def _table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, na_rep="", border=0, float_format=lambda v: f"{v:.4g}")


def _passk_wide(passk: pd.DataFrame) -> pd.DataFrame:
    if passk.empty:
        return passk
    keys = ["run", "ckpt", "step", "task", "sampling", "seeds", "n_problems"]
    wide = passk.pivot_table(index=keys, columns="k", values="value", sort=False, dropna=False)
    wide.columns = [f"pass@{k}" for k in wide.columns]
    return wide.dropna(how="all").reset_index()


def _errors_wide(errors: pd.DataFrame) -> pd.DataFrame:
    if errors.empty:
        return errors
    keys = ["run", "ckpt", "step", "task", "variant"]
    wide = errors.pivot_table(
        index=keys, columns="error_type", values="fraction", sort=False, dropna=False
    )
    return wide.dropna(how="all").reset_index()
