"""Plots and the self-contained HTML report of a summary (`ckpteval.aggregate.Summary`).

- `plots`: the matplotlib PNGs under `summary/plots/` (what `snakemake --report` packs).
- `report.html` (`write_html`): one file that opens from disk with no network: an overview
  (flags, small multiples of every task's main metric, a sortable checkpoint x task table with
  each step's significance), per-task interactive charts, the drill-down of the problems that
  flipped between any two checkpoints with both completions, one problem's verdict at every
  checkpoint, provenance one click from every number, and the static tables (`tables`).
  Completions are inlined as compressed per-cell blobs decoded on demand (`samples`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ckpteval.aggregate import Summary
from ckpteval.io import atomic_open
from ckpteval.report.data import build_payload
from ckpteval.report.page import render_page
from ckpteval.report.plots import (
    HACK_PLOT,
    LENGTHS_SECTION,
    PASSK_CURVES,
    Plot,
    _deleted,
    _lengths_figure,
    _steps_figure,
    _truncation_figure,
    write_plots,
)
from ckpteval.report.tables import table_sections

__all__ = [
    "HACK_PLOT",
    "LENGTHS_SECTION",
    "PASSK_CURVES",
    "Plot",
    "_deleted",
    "_lengths_figure",
    "_steps_figure",
    "_truncation_figure",
    "render_html",
    "write_html",
    "write_plots",
]


def render_html(
    summary: Summary, plots: Sequence[Plot] = (), focus: tuple[str, ...] | None = None
) -> str:
    """The report as one string. `plots` is accepted for callers that pass the PNGs: the page
    draws its own charts. `focus` ("run:ckpt" labels) is the pair the drill-down opens on."""
    del plots
    return render_page(build_payload(summary, focus), table_sections(summary))


def write_html(
    summary: Summary,
    plots: Sequence[Plot],
    path: Path,
    focus: tuple[str, ...] | None = None,
) -> None:
    """Write the self-contained report (atomically: a reader never sees half a file)."""
    with atomic_open(path, "w") as handle:
        handle.write(render_html(summary, plots, focus))
