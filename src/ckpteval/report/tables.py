"""The report's static sections: the tables of a summary as plain HTML (the page's "Tables").

They read without scripts, and tools and tests can grep them; the interactive views above them
(`ckpteval.report.page`) show the same numbers as charts and drill-downs.
"""

from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ckpteval.aggregate import Summary
from ckpteval.aggregate.deltas import MCNEMAR, template_note
from ckpteval.aggregate.markdown import error_marks, metrics_wide
from ckpteval.aggregate.tables import (
    CONFIDENCE,
    HACK_RATE,
    STDERR_LEGEND,
    truncation_flags,
)
from ckpteval.metrics import LENGTH_METRICS
from ckpteval.report.plots import _threshold


def table_sections(summary: Summary) -> list[str]:
    """Every static section, in reading order."""
    deltas = summary.deltas
    return [
        *_header(summary),
        *_regressions(summary),
        *_hacking_section(summary),
        *_lengths_section(summary),
        *_metrics(summary),
        *_paired_section(summary),
        "<h2>Paired deltas</h2>",
        "<p class='note'>Checkpoint minus reference on the samples both scored (same task_id, "
        "seed, sample_idx), seeds of a sampling config pooled; 95% percentile bootstrap "
        "interval over problems.</p>",
        _table(deltas),
        _section("Seeds: spread over seeds", summary.seeds),
        _section("Sampling configs across checkpoints", summary.configs),
        _section("pass@k (seeds pooled)", _passk_wide(summary.passk)),
        _section("Error types (fraction of samples)", _errors_wide(summary.errors)),
    ]


def _header(summary: Summary) -> list[str]:
    """Counts, broken and waiting checkpoints, the chat-template note, deleted sources and missing files."""
    tidy = summary.tidy
    parts = [
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
    if summary.waiting:
        parts += [
            "<h2>Checkpoints being written</h2>",
            "<p class='note'>Not completely written yet: evaluated by the first run after "
            "their writer finishes (<code>ckpteval watch</code> does this by itself).</p>",
            "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in summary.waiting) + "</ul>",
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
    return parts


def _regressions(summary: Summary) -> list[str]:
    deltas = summary.deltas
    regressions = deltas[deltas["regression"].astype(bool)] if not deltas.empty else deltas
    if regressions.empty:
        return [
            "<h2>Regressions</h2><p>No checkpoint is significantly worse (Holm-adjusted p at "
            "most 0.05 over every comparison) than its run's baseline or its previous "
            "checkpoint.</p>"
        ]
    return [
        "<h2>Regressions</h2>",
        f"<p class='bad'>{len(regressions)} significant drop(s): Holm-adjusted p at most 0.05 "
        "over every comparison in deltas.csv, so the chance that any of them is noise is at "
        "most 5%.</p>",
        _table(regressions),
    ]


def _metrics(summary: Summary) -> list[str]:
    parts = ["<h2>Metrics</h2>", f"<p class='note'>{html.escape(STDERR_LEGEND)}</p>"]
    scores = summary.seeds[~summary.seeds["metric"].isin(LENGTH_METRICS)]
    if not scores.empty:
        flags = truncation_flags(summary.truncation, summary.main_metrics)
        marks = {key: " (lower bound)" for key in flags}
        for key, mark in error_marks(summary.reward_errors, summary.main_metrics).items():
            marks[key] = marks.get(key, "") + mark
        header, rows = metrics_wide(scores, marks)
        parts.append(_table(pd.DataFrame(rows, columns=header)))
    return parts


def _hacking_section(summary: Summary) -> list[str]:
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


def _lengths_section(summary: Summary) -> list[str]:
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
    header, rows = metrics_wide(lengths)
    parts.append(_table(pd.DataFrame(rows, columns=header)))
    return parts


_PAIRED_NOTE = (
    "<p class='note'>Checkpoint minus reference on the samples both scored. Delta: mean "
    f"per-sample difference, {CONFIDENCE:.0%} bootstrap interval over problems. McNemar: "
    "exact two-sided test on per-problem verdicts (solved when more than half of the "
    "problem's paired samples pass); gained = unsolved by the reference, solved now; lost "
    "the reverse. MDE: the smallest difference this many problems can detect (alpha 0.05, "
    "power 0.8); a smaller delta is not evidence either way; with fewer than 6 problems "
    "none is detectable. Tasks whose scores are not "
    "pass/fail get no McNemar test. Holm p: the comparison's p-value (McNemar's with one "
    "pass/fail sample per problem, else a normal test of the per-problem differences) "
    "adjusted by Holm's method over every comparison of the summary; a mark for a change "
    "means Holm p at most 0.05.</p>"
)


def _paired_section(summary: Summary) -> list[str]:
    """ "Paired comparisons": per run, the first and the last checkpoint vs the baseline and every
    checkpoint vs the previous one (so every step's change is there): delta with its interval,
    McNemar's exact p, the minimum detectable effect, and the flipped problems in a <details>
    list."""
    parts = ["<h2>Paired comparisons</h2>", _PAIRED_NOTE]
    deltas = summary.deltas
    if deltas.empty:
        return parts + ["<p>No paired comparisons: no run has two checkpoints scored.</p>"]
    flipped = _flipped_ids(summary.flips)
    for run, rows in _shown_comparisons(deltas).groupby("run", sort=False):
        items = _flip_items(str(run), rows, flipped)
        parts += [f"<h3>{html.escape(str(run))}</h3>", _table(_comparison_table(rows))]
        if items:
            parts.append(
                f"<details><summary>Flipped problems ({len(items)} comparison(s))</summary>"
                f"<ul>{''.join(items)}</ul></details>"
            )
    return parts


def _shown_comparisons(deltas: pd.DataFrame) -> pd.DataFrame:
    """Every comparison with the previous checkpoint, and with the baseline the first and the
    last checkpoint's."""
    steps = deltas.groupby(["run", "task", "sampling"])["step"]
    first, last = steps.transform("min"), steps.transform("max")
    return deltas[
        (deltas["comparison"] == "previous")
        | (
            (deltas["comparison"] == "baseline")
            & ((deltas["step"] == last) | (deltas["step"] == first))
        )
    ]


def _flipped_ids(flips: pd.DataFrame) -> dict[tuple[str, ...], dict[str, str]]:
    """(run, task, sampling, ckpt_a, ckpt_b) -> direction -> the flipped task_ids, joined by
    ", " in their order in `flips`: grouped by Arrow (single-threaded, so in order), not a
    Python step per flip (1,000 checkpoints x 20 tasks have millions)."""
    if flips.empty:
        return {}
    keys = ["run", "task", "sampling", "ckpt_a", "ckpt_b", "direction"]
    columns = {}
    for name in [*keys, "task_id"]:
        column = pa.Table.from_pandas(flips[[name]], preserve_index=False).column(0)
        columns[name] = column if pa.types.is_string(column.type) else pc.cast(column, pa.string())
    grouped = pa.table(columns).group_by(keys, use_threads=False).aggregate([("task_id", "list")])
    flipped: dict[tuple[str, ...], dict[str, str]] = {}
    for row in grouped.to_pylist():
        key = tuple(str(row[name]) for name in keys[:-1])
        flipped.setdefault(key, {})[str(row["direction"])] = ", ".join(row["task_id_list"])
    return flipped


def _comparison_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One run's comparisons as the section shows them: numbers formatted, tests explained."""
    return pd.DataFrame(
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
            "Holm p": ["" if pd.isna(p) else f"{p:.3g}" for p in rows["p_holm"]],
        }
    )


def _flip_items(
    run: str, rows: pd.DataFrame, flipped: dict[tuple[str, ...], dict[str, str]]
) -> list[str]:
    """An <li> per comparison of `rows` with flipped problems: the gained and the lost ones."""
    items = []
    for task, sampling, ckpt, ref in zip(
        rows["task"], rows["sampling"], rows["ckpt"], rows["ref_ckpt"]
    ):
        ids = flipped.get((run, task, sampling, ref, ckpt))
        if not ids:
            continue
        items.append(
            f"<li>{html.escape(f'{task} ({sampling}) {ckpt} vs {ref}')}: "
            f"gained {html.escape(ids.get('gained') or '-')}; "
            f"lost {html.escape(ids.get('lost') or '-')}</li>"
        )
    return items


def _section(heading: str, frame: pd.DataFrame) -> str:
    if frame.empty:
        return f"<h2>{html.escape(heading)}</h2><p>None.</p>"
    return (
        f"<h2>{html.escape(heading)}</h2><details><summary>{len(frame)} rows</summary>"
        f"{_table(frame)}</details>"
    )


def _table(frame: pd.DataFrame) -> str:
    """`frame` as an HTML table, as pandas' to_html writes it (floats with 4 significant digits,
    missing values empty), in a tenth of its time: the report has tables of tens of thousands
    of rows, so each column is formatted by the rule of its type (`_column_cells`)."""
    head = "".join(f"<th>{html.escape(str(name))}</th>" for name in frame.columns)
    cells = [_column_cells(frame[name]) for name in frame.columns]
    body = "".join("<tr>" + "".join(row) + "</tr>\n" for row in zip(*cells))
    return (
        f"<table class='dataframe'>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n"
        "</table>"
    )


def _column_cells(column: pd.Series) -> list[str]:
    """A column's <td> cells: floats formatted without a type test per value, texts escaped
    only when one has a character to escape; any other column value by value (`_cell`)."""
    values = column.tolist()
    numpy = isinstance(column.dtype, np.dtype)
    if numpy and column.dtype.kind == "f":
        return [f"<td>{v:.4g}</td>" if v == v else "<td></td>" for v in values]
    if numpy and column.dtype.kind in "iu":
        return [f"<td>{v}</td>" for v in values]
    if all(type(v) is str for v in values) and not _ESCAPED.search("".join(values)):
        return [f"<td>{v}</td>" for v in values]
    return [f"<td>{_cell(v)}</td>" for v in values]


def _cell(value: object) -> str:
    if value is None or value is pd.NA or isinstance(value, float) and value != value:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


#: The characters `html.escape` replaces.
_ESCAPED = re.compile("[&<>\"']")


def _passk_wide(passk: pd.DataFrame) -> pd.DataFrame:
    if passk.empty:
        return passk
    keys = ["run", "ckpt", "step", "task", "sampling", "seeds", "n_problems"]
    wide = _wide(passk, keys, "k", "value")
    wide.columns = [f"pass@{k}" for k in wide.columns]
    return wide.dropna(how="all").reset_index()


def _errors_wide(errors: pd.DataFrame) -> pd.DataFrame:
    if errors.empty:
        return errors
    keys = ["run", "ckpt", "step", "task", "variant"]
    return _wide(errors, keys, "error_type", "fraction").dropna(how="all").reset_index()


def _wide(frame: pd.DataFrame, keys: list[str], column: str, values: str) -> pd.DataFrame:
    """`frame.pivot_table(index=keys, columns=column, values=values, sort=False,
    dropna=False)` (mean per cell, rows with missing keys kept) without its product of every
    key's values, which `dropna(how="all")` then drops: at 1,000 checkpoints x 20 tasks the
    pass@k pivot made 20 billion rows' index, 27 s of a report build. The rows and columns
    come in the same order."""
    groups = frame.groupby([*keys, column], sort=False, dropna=False, observed=True)
    return groups[values].mean().unstack(column)
