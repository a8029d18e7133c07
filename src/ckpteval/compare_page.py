"""The side-by-side page of `ckpteval compare A B C ... --html OUT.html`: one self-contained HTML
file (no script, no network) showing, per task, every checkpoint's score with its interval, each
later checkpoint's paired delta against the first with its Holm-corrected mark, and the problems
whose verdicts differ among them: one row per problem, every checkpoint's verdict in a
`<details>` that opens on that checkpoint's completions of the problem (every sample, every
seed), so each completion is one click away. All text from the files is HTML-escaped.

Completions come from `generations/{run}/{ckpt}/{task}/{variant}.jsonl` beside the score files
(the workflow's layout), joined to the score lines on (task_id, sample_idx); a cell without its
generation file says so in place of the completions. Texts longer than `MAX_TEXT` are cut (the
file has them whole). The page holds only the differing problems' completions, so its size grows
with what changed, not with the benchmark.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckpteval.aggregate.deltas import ALPHA
from ckpteval.aggregate.tables import CONFIDENCE
from ckpteval.compare import MCNEMAR, TaskComparison, TaskView, load_side, verdict_text
from ckpteval.errors import UserError
from ckpteval.io import atomic_open, iter_jsonl

#: Longest text of one completion or prompt kept on the page.
MAX_TEXT = 20_000

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.gain { color: #1a7f37; font-weight: bold; } .drop { color: #cf222e; font-weight: bold; }
.solved { background: #e6f4ea; } .unsolved { background: #fdecea; }
pre { white-space: pre-wrap; max-width: 60em; background: #f6f8fa; padding: 0.5em; margin: 0.3em 0; }
p.legend { max-width: 60em; }
"""

Completions = dict[str, list[tuple[str, str]]]  # task_id -> (sample heading, completion)
Prompts = dict[str, str]  # task_id -> the prompt of its first generation line


def write_compare_page(
    outdir: Path, targets: Sequence[tuple[str, str]], views: Sequence[TaskView], path: Path
) -> None:
    """Write the page of `views` (`compare.side_by_side`) to `path`; an unwritable path is a
    `UserError`."""
    labels = [":".join(t) for t in targets]
    sides = [load_side(outdir, *t, sorted({v.task for v in views})) for t in targets]
    family = sum(len(v.comparisons) for v in views)
    body = [
        f"<h1>{_e(', '.join(labels[1:]))} against {_e(labels[0])}</h1>",
        f'<p class="legend">Scores: each checkpoint\'s main metric over its own samples (seeds '
        f"pooled) with its {CONFIDENCE:.0%} interval (Wilson's for a score in [0, 1], else the "
        "mean ± 1.96 standard errors; clustered by problem). Deltas: each checkpoint minus "
        f"{_e(labels[0])} on the samples both scored, with a {CONFIDENCE:.0%} bootstrap interval "
        "over problems. Test: McNemar's exact test on per-problem verdicts (one 0/1 sample per "
        "problem), else the normal test of the per-problem differences. Marks: ▲ / ▼ a gain / "
        f"drop whose p-value, <b>Holm-adjusted over the {family} comparisons on this page</b>, "
        f"is at most {ALPHA} (the chance of any false mark is at most {ALPHA:.0%}).</p>",
    ]
    for view in views:
        prompts: Prompts = {}
        completions = [
            _completions(outdir, side.cells_of(view.task, view.sampling), view, prompts)
            for side in sides
        ]
        body += _task_section(view, labels, completions, prompts, family)
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(' vs '.join(labels))}</title><style>{_STYLE}</style></head>"
        "<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    try:
        with atomic_open(path) as handle:
            handle.write(page)
    except OSError as exc:
        raise UserError(f"compare: --html {path}: {exc.strerror or exc}") from None


def _task_section(
    view: TaskView,
    labels: list[str],
    completions: list[Completions],
    prompts: Prompts,
    family: int,
) -> list[str]:
    anchor = f"{view.task}|{view.sampling}"
    out = [
        f'<h2 id="{_e(anchor)}">{_e(view.task)} ({_e(view.sampling)}, {_e(view.metric)})</h2>',
        "<table><tr><th>checkpoint</th><th>score [interval]</th><th>delta [interval]</th>"
        f"<th>test p</th><th>Holm p ({family})</th><th>mark</th></tr>",
    ]
    for index, score in enumerate(view.scores):
        cells = [
            _e(score.label),
            f"{_num(score.value)} [{_num(score.ci_low)}, {_num(score.ci_high)}]",
        ]
        if index == 0:
            cells += ["reference", "", "", ""]
        else:
            cells += _comparison_cells(view.comparisons[index - 1])
        out.append(
            "<tr>"
            + "".join(
                f'<td class="num">{c}</td>' if i else f"<td>{c}</td>" for i, c in enumerate(cells)
            )
            + "</tr>"
        )
    out.append("</table>")
    out.append(f"<h3>Problems whose verdicts differ ({len(view.differing)})</h3>")
    if not view.differing:
        out.append("<p>None: every checkpoint gives every problem they all scored one verdict.</p>")
        return out
    out.append(
        "<table><tr><th>problem</th>"
        + "".join(f"<th>{_e(label)}</th>" for label in labels)
        + "</tr>"
    )
    for problem in view.differing:
        prompt = prompts.get(problem.task_id)
        row = [
            f"<td>{_e(problem.task_id)}</td>",
            "<td>"
            + (
                f"<details><summary>prompt</summary><pre>{_e(prompt)}</pre></details>"
                if prompt is not None
                else ""
            )
            + "</td>",
        ]
        for verdict, found in zip(problem.verdicts, completions):
            solved = 2 * verdict[0] > verdict[1]
            klass = f' class="{"solved" if solved else "unsolved"}"' if view.binary else ""
            samples = found.get(problem.task_id) or [("", "no completion found")]
            texts = "".join(
                (f"<div>{_e(head)}</div>" if head else "") + f"<pre>{_e(text)}</pre>"
                for head, text in samples
            )
            row.append(
                f"<td{klass}><details><summary>{_e(verdict_text(verdict, view.binary))}"
                f"</summary>{texts}</details></td>"
            )
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</table>")
    return out


def _comparison_cells(r: TaskComparison) -> list[str]:
    test = "McNemar" if r.p_test == MCNEMAR else "normal"
    mark = {"▲": '<span class="gain">▲</span>', "▼": '<span class="drop">▼</span>'}
    return [
        f"{_num(r.delta, '+')} [{_num(r.ci_low, '+')}, {_num(r.ci_high, '+')}]",
        f"{_p(r.p_value)} ({test})",
        _p(r.p_holm),
        mark.get(r.mark, ""),
    ]


def _completions(
    outdir: Path, cells: Sequence[Any], view: TaskView, prompts: Prompts
) -> Completions:
    """task_id -> (heading, completion) of every sample of the differing problems in `cells`
    (one per seed), headed by seed, sample and its score line's verdict; each problem's prompt
    is added to `prompts` when it is not there yet (prompts are the same at every checkpoint)."""
    wanted = {p.task_id for p in view.differing}
    out: Completions = {}
    for cell in cells:
        verdicts = {
            (str(row.get("task_id")), row.get("sample_idx")): row
            for row in iter_jsonl(cell.samples_path, errors=[])
            if str(row.get("task_id")) in wanted
        }
        generations = outdir / "generations" / cell.run / cell.ckpt / cell.task
        path = generations / f"{cell.variant}.jsonl"
        if not path.is_file():
            for task_id in sorted({k[0] for k in verdicts}):
                out.setdefault(task_id, []).append((f"seed {cell.seed}", f"no file {path}"))
            continue
        for row in iter_jsonl(path, errors=[]):
            task_id = str(row.get("task_id"))
            if task_id not in wanted:
                continue
            if "prompt" in row:
                prompts.setdefault(task_id, _text(row["prompt"]))
            score = verdicts.get((task_id, row.get("sample_idx")), {})
            verdict = (
                "passed"
                if score.get("passed") is True
                else f"failed ({score.get('error_type') or 'no error type'})"
                if score.get("passed") is False
                else f"score {score.get('score')}"
            )
            heading = f"seed {cell.seed}, sample {row.get('sample_idx')}: {verdict}"
            out.setdefault(task_id, []).append((heading, _text(row.get("completion"))))
    return out


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) > MAX_TEXT:
        return text[:MAX_TEXT] + f"\n[... {len(text) - MAX_TEXT} more characters in the file]"
    return text


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def _num(value: float, sign: str = "") -> str:
    return "n/a" if math.isnan(value) else f"{value:{sign}.3f}"


def _p(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.4g}"
