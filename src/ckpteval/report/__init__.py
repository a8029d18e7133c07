"""Plots and the self-contained HTML report of a summary (`ckpteval.aggregate.Summary`).

- `plots`: the matplotlib PNGs under `summary/plots/` (what `snakemake --report` packs).
- `report.html` (`write_html`): one file that opens from disk with no network: an overview
  (flags, small multiples of every task's main metric, a sortable checkpoint x task table with
  each step's significance), per-task interactive charts, the drill-down of the problems that
  flipped between any two checkpoints with both completions, one problem's verdict at every
  checkpoint, provenance one click from every number, and the static tables (`tables`).
  Completions are compressed per-cell blobs decoded on demand (`samples`): inside the page, or,
  for a large report, one small script file each in `report_files/` beside it, loaded when a
  view first needs it (`write_html`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ckpteval.aggregate import Summary
from ckpteval.io import atomic_open
from ckpteval.report.cache import CellCache
from ckpteval.report.data import CellReading, build_payload, cpus
from ckpteval.report.page import render_page, write_blob_files
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
    "files_dir",
    "render_html",
    "write_html",
    "write_plots",
]


def render_html(
    summary: Summary, plots: Sequence[Plot] = (), focus: tuple[str, ...] | None = None
) -> str:
    """The report as one string, every blob inside it. `plots` is accepted for callers that
    pass the PNGs: the page draws its own charts. `focus` ("run:ckpt" labels) is the pair the
    drill-down opens on."""
    del plots
    return render_page(build_payload(summary, focus), table_sections(summary))


#: Blob characters above which the report keeps its blobs in files beside it (`files_dir`):
#: a browser parses a page of hundreds of megabytes for many seconds before drawing anything.
#: Below it the report is one file, which `snakemake --report` and a mail attachment keep whole.
EXTERNAL_BLOBS = 20_000_000


def files_dir(path: Path) -> Path:
    """Where the report at `path` keeps its blobs when they are too large for it:
    `report.html` -> `report_files/` beside it."""
    return path.with_name(f"{path.stem}_files")


def write_html(
    summary: Summary,
    plots: Sequence[Plot],
    path: Path,
    focus: tuple[str, ...] | None = None,
    *,
    external_blobs: int = EXTERNAL_BLOBS,
    cache: Path | None = None,
    workers: int | None = None,
) -> None:
    """Write the report (atomically: a reader never sees half a file). When its blobs exceed
    `external_blobs` characters they go to `files_dir(path)`, written before the page that
    loads them; otherwise the page holds them (and that directory, if there, is emptied).
    `cache`: a directory where the build keeps what it read of each cell, so that the next
    build reads only the cells whose files changed (`ckpteval.report.cache`). `workers`:
    processes that read cells, while this one builds the tables (None: one per CPU this
    process may use)."""
    del plots
    with CellReading(summary, CellCache(cache), workers or cpus()) as reading:
        tables = table_sections(summary)
        payload = build_payload(summary, focus, reading=reading)
    directory = files_dir(path)
    external = sum(map(len, payload.blobs.values())) > external_blobs
    page = render_page(payload, tables, directory.name if external else None)
    if external or directory.is_dir():  # emptied when an earlier build filled it
        write_blob_files(payload.blobs if external else {}, directory)
    with atomic_open(path, "w") as handle:
        handle.write(page)
