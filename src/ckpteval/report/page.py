"""The report page: one HTML file with Vega, Vega-Lite and vega-embed inlined, the page's own
script and style, the data document, the per-sample blobs and the static tables.

Why Vega-Lite (over Plotly): its minified runtime is ~0.8 MB against Plotly's ~3.5 MB, a chart
is a small declarative JSON spec that Python writes and a test can read, faceting (the overview's
small multiples) and tooltips are built in, and it is BSD-3 licensed. Nothing is fetched at open
time: the file works from disk with no network.
"""

from __future__ import annotations

import html
import json
import os
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ckpteval.report.data import Payload
from ckpteval.report.samples import encode_blob

#: The vendored scripts, in load order (src/ckpteval/data/report/README.md gives their versions).
VENDOR_JS = ("vega.min.js", "vega-lite.min.js", "vega-embed.min.js")
#: How the tests and bench/report.py start Chromium on the report, offline: without the
#: background-networking flags it hangs on a closed network.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
_SOURCE_MAP = re.compile(r"//# sourceMappingURL=\S+\s*$")


@cache
def _asset(name: str) -> str:
    text = resources.files("ckpteval").joinpath("data", "report", name).read_text("utf-8")
    return _SOURCE_MAP.sub("", text)  # the .map files are not shipped


def script_json(value: Any) -> str:
    """JSON safe inside <script>: every "<" escaped, so no "</script>" or "<!--" can occur."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")


#: A static section longer than this (characters of HTML) is stored compressed and shown on
#: demand: thousands of table rows in the DOM cost the browser seconds at open.
LAZY_SECTION = 200_000
_HEADING = re.compile(r"\s*(<h2>.*?</h2>)", re.S)


def lazy_sections(payload: Payload, sections: list[str]) -> list[str]:
    """Small sections as they are; a large one becomes a blob and a button that shows it (its
    <h2> heading stays in place)."""
    out = []
    for index, section in enumerate(sections):
        if len(section) <= LAZY_SECTION:
            out.append(section)
            continue
        heading = _HEADING.match(section)
        body = section[heading.end() :] if heading else section
        payload.blobs[f"t{index}"] = encode_blob(body)
        out.append(
            (heading.group(1) if heading else "")
            + f"<div class='lazy-section' data-blob='t{index}'><button>Show this table "
            f"({body.count('<tr>')} rows)</button></div>"
        )
    return out


def render_page(payload: Payload, tables: list[str], blob_dir: str | None = None) -> str:
    """The whole document. `tables` are the static HTML sections (kept for reading without
    scripts and for the tests and tools that grep them). With `blob_dir` (a directory name
    relative to the page) the blobs are left out of the page: the caller writes them there
    (`write_blob_files`) and the page loads each when a view first needs it."""
    title = html.escape(payload.data["title"])
    tables = lazy_sections(payload, tables)
    if blob_dir is not None:
        payload.data["blob_dir"] = blob_dir
        payload.data["blob_ids"] = sorted(payload.blobs)
    scripts = "".join(f"<script>{_asset(name)}</script>" for name in VENDOR_JS)
    blobs = "".join(
        f"<script type='application/json' id='blob-{html.escape(key)}'>{value}</script>"
        for key, value in payload.blobs.items()
        if blob_dir is None
    )
    return "\n".join(
        [
            f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>",
            f"<style>{_asset('report.css')}</style>{scripts}</head><body>",
            f"<header><h1>{title}</h1>{_NAV}</header>",
            _SKELETON.replace("<div id='best'></div>", best_section(payload.data.get("best"))),
            # The data and the script before the bulk: the overview is drawn while the browser
            # still reads the tables and the sample blobs (the drill-down waits for those).
            f"<script type='application/json' id='report-data'>{script_json(payload.data)}</script>",
            f"<script>{_asset('report.js')}</script>",
            "<section id='tables' class='view'><h2>Tables</h2>",
            *tables,
            "</section>",
            blobs,
            "</body></html>\n",
        ]
    )


_NAV = (
    "<nav><a href='#overview'>Overview</a><a href='#tasks'>Per task</a>"
    "<a href='#compare'>Compare two checkpoints</a><a href='#several'>Several checkpoints</a>"
    "<a href='#problem'>One problem</a>"
    "<a href='#tables'>Tables</a></nav>"
)

_SKELETON = """
<section id='overview' class='view'>
  <h2>Overview</h2>
  <div id='flags'></div>
  <div id='best'></div>
  <h3>Main metric over training steps</h3>
  <p class='note'>One panel per task; bands are 95% intervals (Wilson for scores in [0, 1]), dashed lines the
  baselines, red triangles significant drops from the previous checkpoint. Hover a point for its
  value, n and interval.</p>
  <div id='grid' class='chart'></div>
  <h3>Checkpoint × task</h3>
  <p class='note'>Main metric per checkpoint (colour: the task's range). ▲/▼: the change from the
  previous checkpoint is significant (Holm-adjusted p at most 0.05 over every comparison, so
  any false mark has at most a 5% chance); the hover shows the delta, its interval and the p-values. Click a header to sort; click a cell for its
  provenance.</p>
  <div id='matrix'></div>
  <div id='provenance' class='panel' hidden></div>
</section>
<section id='tasks' class='view'><h2>Per task</h2><div id='task-panels'></div></section>
<section id='compare' class='view'>
  <h2>Compare two checkpoints</h2>
  <p class='note'>The problems whose verdict flipped: solved (more than half of the problem's
  samples pass) at one checkpoint and not at the other, with both completions.</p>
  <div class='controls'><label>Task · sampling <select id='cmp-group'></select></label>
  <label>From <select id='cmp-a'></select></label><label>to <select id='cmp-b'></select></label>
  </div>
  <div id='cmp-out'></div>
</section>
<section id='several' class='view'>
  <h2>Several checkpoints side by side</h2>
  <p class='note'>Up to six checkpoints of one task (first shown: the first checkpoint, the best
  by the rule above, the last): each one's main metric with its 95% interval, and each later
  one's change from the first where deltas.csv compares them (the first is its baseline or
  previous checkpoint); ▲/▼: significant after Holm's correction over every comparison of
  deltas.csv, as everywhere on this page. Below, the problems whose verdicts (solved: more than
  half of the problem's samples pass) differ among them; click a verdict for its completions.
  <code>ckpteval compare A B C ...</code> compares any checkpoints, with paired tests.</p>
  <div class='controls'><label>Task · sampling <select id='sev-group'></select></label>
  <span id='sev-ckpts'></span></div>
  <div id='sev-out'></div>
</section>
<section id='problem' class='view'>
  <h2>One problem across the run</h2>
  <div class='controls'><label>Task · sampling <select id='prob-group'></select></label>
  <label>Problem <select id='prob-id'></select></label></div>
  <div id='prob-out'></div>
</section>
"""


def best_section(best: dict[str, Any] | None) -> str:
    """The overview's "Best checkpoint": what `ckpteval best` prints with its default rule
    (`Summary.best`), or why the rule chose none."""
    if not best:
        return ""
    head = "<div id='best'><h3>Best checkpoint</h3>"
    if "none" in best:
        return f"{head}<p class='note'>No choice: {html.escape(best['none'])}.</p></div>"
    tasks = best["weights"]
    rule = (
        f"the mean of the main metric over the {len(tasks)} task(s) ({', '.join(tasks)}), "
        "weight 1 each"
    )
    runners = ", ".join(
        f"{html.escape(k)} {v:.0%}" for k, v in list(best["wins"].items())[:4] if k != best["best"]
    )
    return (
        f"{head}<p class='best'>Rule: {html.escape(rule)}, among the {len(best['candidates'])} "
        "trained checkpoints that scored every task (<code>ckpteval best</code>'s default; "
        "<code>--task TASK=WEIGHT</code> states another). Chosen: "
        f"<b>{html.escape(best['best'])}</b>, score {best['score']:.3f}, 95% interval "
        f"accounting for the choice [{best['low']:.3f}, {best['high']:.3f}] (alone it would be "
        f"[{best['naive_low']:.3f}, {best['naive_high']:.3f}]). It scores highest in "
        f"{best['wins'].get(best['best'], 0.0):.0%} of {best['n_boot']} resamples of the "
        f"problems{f' (others: {runners})' if runners else ''}.</p>"
        + "".join(f"<p class='note'>{html.escape(line)}.</p>" for line in best.get("errored", []))
        + "<p class='note'>The highest of many noisy scores is biased upward: the interval is the "
        "chosen checkpoint's part of a band that holds every candidate's true score at once "
        "(a bootstrap over problems of the whole selection), so it holds however the choice "
        "was made.</p></div>"
    )


def write_blob_files(blobs: dict[str, str], directory: Path) -> None:
    """Each blob as `<id>.js` in `directory`, a script that hands its text to the page
    (`ckptevalBlobText`): a script tag loads from file://, where fetch() is refused. Files of
    an earlier build that this one has not are removed."""
    directory.mkdir(parents=True, exist_ok=True)
    wanted = {f"{key}.js" for key in blobs}
    empty = True
    for old in directory.iterdir():
        empty = False
        if old.name not in wanted and old.is_file():  # an older build's, or a killed one's
            old.unlink()
    for key, value in blobs.items():
        # a blob is base64 text: a JSON string as it is
        text = f'ckptevalBlobText({json.dumps(key)},"{value}");\n'.encode("ascii")
        if empty:  # no page loads from a directory that was empty (the workflow's staging
            # one): written in place, without a rename per file (20,000 files at 10M samples)
            with open(directory / f"{key}.js", "wb") as handle:
                handle.write(text)
            continue
        # a temp name and a rename, as atomic_open does, without its scan of the directory for
        # debris per file (thousands of files)
        tmp = directory / f".{key}.js.tmp"
        tmp.write_bytes(text)
        os.replace(tmp, directory / f"{key}.js")


def page_data(page: str) -> dict[str, Any]:
    """The data document of a rendered page (what its script reads): for tests and tools."""
    text = page.split("id='report-data'>", 1)[1].split("</script>", 1)[0]
    return json.loads(text)
