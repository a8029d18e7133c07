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
import re
from functools import cache
from importlib import resources
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


def render_page(payload: Payload, tables: list[str]) -> str:
    """The whole document. `tables` are the static HTML sections (kept for reading without
    scripts and for the tests and tools that grep them)."""
    title = html.escape(payload.data["title"])
    tables = lazy_sections(payload, tables)
    scripts = "".join(f"<script>{_asset(name)}</script>" for name in VENDOR_JS)
    blobs = "".join(
        f"<script type='application/json' id='blob-{html.escape(key)}'>{value}</script>"
        for key, value in payload.blobs.items()
    )
    return "\n".join(
        [
            f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>",
            f"<style>{_asset('report.css')}</style>{scripts}</head><body>",
            f"<header><h1>{title}</h1>{_NAV}</header>",
            _SKELETON,
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
    "<a href='#compare'>Compare two checkpoints</a><a href='#problem'>One problem</a>"
    "<a href='#tables'>Tables</a></nav>"
)

_SKELETON = """
<section id='overview' class='view'>
  <h2>Overview</h2>
  <div id='flags'></div>
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
<section id='problem' class='view'>
  <h2>One problem across the run</h2>
  <div class='controls'><label>Task · sampling <select id='prob-group'></select></label>
  <label>Problem <select id='prob-id'></select></label></div>
  <div id='prob-out'></div>
</section>
"""


def page_data(page: str) -> dict[str, Any]:
    """The data document of a rendered page (what its script reads): for tests and tools."""
    text = page.split("id='report-data'>", 1)[1].split("</script>", 1)[0]
    return json.loads(text)
