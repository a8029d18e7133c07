"""`ckpteval compare RUN:CKPT RUN:CKPT`: two checkpoints side by side, from their score files.

For every task (and sampling config) both checkpoints scored, the second checkpoint is compared
with the first on the samples both have, the same pairing and statistics as `deltas.csv`
(`ckpteval.aggregate.deltas.delta_table`): the (task_id, seed, sample_idx) both cells scored, seeds of a
sampling config pooled; the delta (second minus first) with a 95% percentile bootstrap interval
over problems (`stats.paired_bootstrap`); McNemar's exact test on per-problem verdicts, the
minimum detectable effect and the flipped problems (`stats.paired_flips`). It reads
`scores/{run}/{ckpt}/{task}/{variant}.json` and `.jsonl` directly, so it needs no aggregate and
works across runs.

Cells that are not comparable are never compared silently: a warning line (stderr) says when the
two sides were generated with different chat templates (the cells' `chat_template.sha256`; cells
without the field are not checked), scored by a different checker or checker/scorer version, or
scored with different settings (the cells' `scoring` identity, `ckpteval.contract`), and, for
each side whose reward function gave no score for some samples, that its values count them as 0
while the cell's own number may leave them out (`errored_warnings`).

`--html OUT.html` also writes the report page of the two checkpoints' cells, opened on the
drill-down of the pair: the problems that flipped, each with its prompt and both completions
(`ckpteval.report`), from the score files and the generation files beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckpteval.aggregate.cells import Cell, CellError, load_cell, read_samples
from ckpteval.aggregate.deltas import MCNEMAR, NO_TEST_NO_PAIRS, NO_TEST_NOT_BINARY
from ckpteval.aggregate.tables import CONFIDENCE, main_metrics
from ckpteval.errored import errored_metrics, no_score
from ckpteval.errors import UserError
from ckpteval.jobs import chosen_main_metrics
from ckpteval.stats import (
    MDE_ALPHA,
    MDE_POWER,
    min_discordant,
    paired_bootstrap,
    paired_flips,
    per_problem_means,
)


@dataclass(frozen=True)
class Side:
    """One checkpoint of the comparison: its cells (scores/{run}/{ckpt}/*/*.json), raw and read."""

    run: str
    ckpt: str
    cells: list[Cell]
    raw: dict[str, dict[str, Any]]  # cell source -> its JSON
    scored_tasks: set[str]  # every task with a cell file, read or not

    @property
    def label(self) -> str:
        return f"{self.run}:{self.ckpt}"

    def cells_of(self, task: str, sampling: str) -> list[Cell]:
        return [c for c in self.cells if c.task == task and c.sampling == sampling]


@dataclass
class TaskComparison:
    """One (task, sampling) of `compare`: the second checkpoint minus the first."""

    task: str
    sampling: str
    metric: str
    seeds: list[int]
    n_problems: int
    n_pairs: int
    value_a: float
    value_b: float
    delta: float
    ci_low: float
    ci_high: float
    paired_test: str
    n_gained: int
    n_lost: int
    mcnemar_p: float
    mde: float
    gained: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def parse_target(text: str) -> tuple[str, str]:
    """`RUN:CKPT` -> (run, ckpt)."""
    run, sep, ckpt = text.partition(":")
    if not sep or not run or not ckpt:
        raise UserError(f"compare: {text!r}: give a checkpoint as RUN:CKPT, e.g. main:step_1000")
    return run, ckpt


def load_side(outdir: Path, run: str, ckpt: str, tasks: Sequence[str] = ()) -> Side:
    """The cells of one checkpoint (of `tasks` only, when given); an unknown run or checkpoint,
    or a cell that cannot be read, is a `UserError` (listing what exists)."""
    scores = outdir / "scores"
    if not (scores / run).is_dir():
        runs = sorted(p.name for p in scores.iterdir() if p.is_dir()) if scores.is_dir() else []
        raise UserError(
            f"compare: run {run!r} has no scores in {scores}; runs with scores: "
            + (", ".join(runs) or "none (run the workflow first, or pass --outdir)")
        )
    if not (scores / run / ckpt).is_dir():
        ckpts = sorted(p.name for p in (scores / run).iterdir() if p.is_dir())
        raise UserError(
            f"compare: run {run!r} has no checkpoint {ckpt!r} in {scores / run}; its checkpoints: "
            + (", ".join(ckpts) or "none")
        )
    cells: list[Cell] = []
    raw: dict[str, dict[str, Any]] = {}
    paths = sorted((scores / run / ckpt).glob("*/*.json"))
    for path in paths:
        if tasks and path.parent.name not in tasks:
            continue
        try:
            cell = load_cell(path)
        except CellError as exc:
            raise UserError(f"compare: {path}: {exc}; rescore the cell or remove it") from None
        cells.append(cell)
        raw[cell.source] = json.loads(path.read_text(encoding="utf-8"))
    return Side(run, ckpt, cells, raw, {p.parent.name for p in paths})


def compare(
    outdir: Path,
    a: tuple[str, str],
    b: tuple[str, str],
    *,
    tasks: Sequence[str] = (),
    sampling: str | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    main_metric: Mapping[str, str] | None = None,
) -> tuple[list[TaskComparison], list[str]]:
    """Compare checkpoint `b` with `a` on every (task, sampling) both scored (or those asked
    for), on each task's main metric (`main_metric`: the config's choices): the comparisons,
    and one warning line per thing that makes them less than comparable."""
    if n_boot < 1:
        raise UserError(f"compare: --bootstrap {n_boot}: give at least 1 (1000 is usual)")
    side_a, side_b = load_side(outdir, *a, tasks), load_side(outdir, *b, tasks)
    both = side_a.scored_tasks & side_b.scored_tasks
    unknown = [t for t in tasks if t not in both]
    if unknown:
        raise UserError(
            f"compare: task {unknown[0]!r} is not scored for both {side_a.label} and "
            f"{side_b.label}; tasks of both: {_names(both)}"
        )
    common = _pairs(side_a) & _pairs(side_b)
    if not common:
        raise UserError(
            f"compare: {side_a.label} and {side_b.label} have no scored task in common; "
            f"{side_a.label}: {_names(side_a.scored_tasks)}; "
            f"{side_b.label}: {_names(side_b.scored_tasks)}"
        )
    wanted = [(t, s) for t, s in sorted(common) if not tasks or t in tasks]
    if sampling is not None:
        samplings = sorted({s for _, s in wanted})
        if sampling not in samplings:
            raise UserError(
                f"compare: sampling config {sampling!r} is not scored for both checkpoints "
                f"(on the tasks asked); sampling configs of both: {', '.join(samplings)}"
            )
        wanted = [(t, s) for t, s in wanted if s == sampling]
    rng = np.random.default_rng(seed)
    metrics = main_metrics(side_a.cells + side_b.cells, main_metric)
    results, warnings = [], []
    for task in sorted(set(tasks or both) - {t for t, _ in common}):
        warnings.append(
            f"{task}: no sampling config scored by both; {side_a.label}: "
            f"{_names(s for t, s in _pairs(side_a) if t == task)}; {side_b.label}: "
            f"{_names(s for t, s in _pairs(side_b) if t == task)}"
        )
    for task, samp in wanted:
        cells_a, cells_b = side_a.cells_of(task, samp), side_b.cells_of(task, samp)
        results.append(_compare_cells(task, samp, metrics[task], cells_a, cells_b, n_boot, rng))
        warnings += [
            f"{task} ({samp}): {line}"
            for line in provenance_warnings(side_a, side_b, task, samp)
            + errored_warnings(side_a, side_b, task, samp, metrics[task])
        ]
    return results, warnings


def provenance_warnings(side_a: Side, side_b: Side, task: str, sampling: str) -> list[str]:
    """Why the two sides' cells of (task, sampling) may not be comparable, one line each."""
    raw_a = [side_a.raw[c.source] for c in side_a.cells_of(task, sampling)]
    raw_b = [side_b.raw[c.source] for c in side_b.cells_of(task, sampling)]
    out = []
    templates = [r.get("chat_template") for r in raw_a + raw_b]
    if all(isinstance(t, dict) for t in templates):
        sha_a = _values(raw_a, lambda r: _template(r["chat_template"]))
        sha_b = _values(raw_b, lambda r: _template(r["chat_template"]))
        if sha_a != sha_b:
            out.append(
                f"generated with different chat templates: {side_a.label} "
                f"{', '.join(sha_a)} vs {side_b.label} {', '.join(sha_b)}; "
                "the difference may come from the template, not the training"
            )
    for key in ("checker", "checker_version", "scorer_version"):
        va = _values(raw_a, lambda r, key=key: r.get(key))
        vb = _values(raw_b, lambda r, key=key: r.get(key))
        if va != vb:
            out.append(
                f"scored with a different {key.replace('_', ' ')}: {side_a.label} "
                f"{', '.join(va)} vs {side_b.label} {', '.join(vb)}"
            )
    scoring_a = _values(raw_a, lambda r: _scoring(r, side_a.run))
    scoring_b = _values(raw_b, lambda r: _scoring(r, side_b.run))
    if scoring_a != scoring_b:
        out.append(
            f"scored with different settings (the cells' scoring identity): {side_a.label} "
            f"{'; '.join(scoring_a)} vs {side_b.label} {'; '.join(scoring_b)}"
        )
    return out


def _compare_cells(
    task: str,
    sampling: str,
    metric: str,
    cells_a: list[Cell],
    cells_b: list[Cell],
    n_boot: int,
    rng: np.random.Generator,
) -> TaskComparison:
    values_a, values_b = _values_by_key(cells_a, metric), _values_by_key(cells_b, metric)
    keys = sorted(values_a.keys() & values_b.keys())
    seeds = sorted({c.seed for c in cells_a} & {c.seed for c in cells_b})
    ids = sorted({k[0] for k in keys}, key=_natural)
    code = {task_id: i for i, task_id in enumerate(ids)}
    problems = np.array([code[k[0]] for k in keys], dtype=np.int64)
    before = np.array([values_a[k] for k in keys], dtype=np.float64).reshape(-1, 1)
    after = np.array([values_b[k] for k in keys], dtype=np.float64).reshape(-1, 1)
    boot = paired_bootstrap(
        per_problem_means(after - before, problems), n_boot=n_boot, rng=rng, confidence=CONFIDENCE
    )
    flips = paired_flips(before, after, problems)
    return TaskComparison(
        task=task,
        sampling=sampling,
        metric=metric,
        seeds=seeds,
        n_problems=int(boot.n_problems[0]),
        n_pairs=len(keys),
        value_a=float(before.mean()) if keys else math.nan,
        value_b=float(after.mean()) if keys else math.nan,
        delta=float(boot.estimate[0]),
        ci_low=float(boot.low[0]),
        ci_high=float(boot.high[0]),
        paired_test=(
            NO_TEST_NOT_BINARY
            if not flips.binary[0]
            else MCNEMAR
            if flips.n_problems[0]
            else NO_TEST_NO_PAIRS
        ),
        n_gained=int(flips.gained[:, 0].sum()),
        n_lost=int(flips.lost[:, 0].sum()),
        mcnemar_p=float(flips.p_value[0]),
        mde=float(flips.mde[0]),
        gained=[ids[i] for i in flips.problems[flips.gained[:, 0]]],
        lost=[ids[i] for i in flips.problems[flips.lost[:, 0]]],
    )


def _values_by_key(cells: list[Cell], metric: str) -> dict[tuple[str, int, int], float]:
    """(task_id, seed, sample_idx) -> the per-sample value deltas use: `passed` for pass@1,
    else `score`; samples without one are left out (as in `delta_table`)."""
    column = "passed" if metric == "pass@1" else "score"
    out: dict[tuple[str, int, int], float] = {}
    for cell in cells:
        try:
            table, _ = read_samples(cell.samples_path)
        except FileNotFoundError:
            raise UserError(
                f"compare: {cell.samples_path}: per-sample file not found; rescore the cell"
            ) from None
        for task_id, idx, value in zip(
            table["task_id"].to_pylist(), table["sample_idx"].to_pylist(), table[column].to_pylist()
        ):
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                out[(task_id, cell.seed, idx)] = float(value)
    return out


def _natural(text: str) -> list[Any]:
    """Sort key putting `arith/2` before `arith/10`."""
    return [
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)
    ]


def _pairs(side: Side) -> set[tuple[str, str]]:
    return {(c.task, c.sampling) for c in side.cells}


def _names(names: Any) -> str:
    return ", ".join(sorted(set(names))) or "none"


def errored_warnings(
    side_a: Side, side_b: Side, task: str, sampling: str, metric: str
) -> list[str]:
    """For each side whose reward function gave no score for some samples of (task, sampling):
    how many, and what the compared values do with them. They are paired per sample (the score
    lines' `passed` or `score`), and an errored sample's line has score 0 and is not passed, so
    here they count as 0, whatever the cell's own number does with them (`ckpteval.errored`,
    said too when the side has one cell)."""
    out = []
    for side in (side_a, side_b):
        metrics = [side.raw[c.source].get("metrics") or {} for c in side.cells_of(task, sampling)]
        counts = [c for c in map(no_score, metrics) if c]
        errored = sum(c[0] for c in counts)
        if not errored:
            continue
        line = (
            f"{side.label}: the reward function gave no score for {errored} of "
            f"{sum(c[1] for c in counts)} samples; compare's {metric} counts them as 0 (their "
            "score lines' score)"
        )
        own = errored_metrics(metrics[0]).get(metric) if len(metrics) == 1 else None
        out.append(line + (f"; the cell's {own.words(metric)}" if own else ""))
    return out


def _values(raws: list[dict[str, Any]], get: Any) -> list[str]:
    return sorted({str(get(r)) for r in raws})


def _template(template: dict[str, Any]) -> str:
    sha = template.get("sha256")
    return f"{template.get('source')} ({sha[:12] if isinstance(sha, str) else 'no template'})"


def _scoring(raw: dict[str, Any], run: str) -> str:
    """The cell's scoring settings with its run's name replaced by `*`, so two runs' cells
    scored alike compare equal."""
    scoring = raw.get("scoring")
    if not isinstance(scoring, dict):
        return "unrecorded"
    prefix = f"runs.{run}."
    normal = {
        ("runs.*." + k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in scoring.items()
    }
    return json.dumps(normal, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# The command


def add_compare_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`ckpteval compare A B`: B minus A, task by task."""
    parser = subparsers.add_parser(
        "compare",
        help="paired comparison of two checkpoints: delta, McNemar's exact test, flipped problems",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("a", metavar="RUN:CKPT", help="the reference checkpoint")
    parser.add_argument("b", metavar="RUN:CKPT", help="the checkpoint compared with it")
    parser.add_argument(
        "--configfile",
        type=Path,
        help="the workflow config whose outdir holds the scores (as status and check take it)",
    )
    parser.add_argument(
        "--outdir", type=Path, help="results directory (default: the config's, else results)"
    )
    parser.add_argument(
        "--task", action="append", default=[], help="only this task (repeatable; default: all)"
    )
    parser.add_argument("--sampling", help="only this sampling config (default: all)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples (default: 1000)")
    parser.add_argument("--json", action="store_true", help="print the comparisons as JSON")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="OUT.html",
        help="also write the drill-down page of the pair (flipped problems, both completions)",
    )
    parser.set_defaults(func=run_compare)
    return parser


def run_compare(args: argparse.Namespace) -> int:
    a, b = parse_target(args.a), parse_target(args.b)
    config = _config(args.configfile)
    args.outdir = args.outdir or Path(config.get("outdir", "results"))
    results, warnings = compare(
        args.outdir,
        a,
        b,
        tasks=args.task,
        sampling=args.sampling,
        n_boot=args.bootstrap,
        main_metric=chosen_main_metrics(config),
    )
    for line in warnings:
        print(f"ckpteval: warning: {line}", file=sys.stderr)
    if args.html:
        write_pair_html(args.outdir, a, b, results, args.html, n_boot=args.bootstrap)
    if args.json:
        document = {
            "a": ":".join(a),
            "b": ":".join(b),
            "alpha": MDE_ALPHA,
            "power": MDE_POWER,
            "confidence": CONFIDENCE,
            "comparisons": [_jsonable(asdict(r)) for r in results],
            "warnings": warnings,
        }
        print(json.dumps(document, indent=1))
    else:
        print(format_text(":".join(a), ":".join(b), results))
    return 0


def _config(configfile: Path | None) -> dict[str, Any]:
    """`--configfile` read and validated as every command reads it (its `outdir` is the scores'
    unless `--outdir` says otherwise; its tasks' `main_metric`s are compared), or {}."""
    if configfile is None:
        return {}
    from ckpteval.config import load_config, validate_config

    config = load_config(configfile)
    validate_config(config)
    return config


def most_changed(results: Sequence[TaskComparison]) -> str | None:
    """The "task|sampling" of the comparison whose delta is largest in size (what the pair's
    page opens on), or None when no delta is known."""
    known = [r for r in results if r.delta is not None and r.delta == r.delta]
    if not known:
        return None
    top = max(known, key=lambda r: abs(r.delta))
    return f"{top.task}|{top.sampling}"


def write_pair_html(
    outdir: Path,
    a: tuple[str, str],
    b: tuple[str, str],
    results: Sequence[TaskComparison],
    path: Path,
    *,
    n_boot: int,
) -> None:
    """The report page of the two checkpoints' cells (of the compared tasks), opened on the
    drill-down of B against A, on the task that changed most: the same view as report.html's,
    for any pair."""
    from ckpteval.report import write_html
    from ckpteval.summary import summarize

    wanted = {(r.task, r.sampling) for r in results}
    cells = [
        cell.source
        for side in (load_side(outdir, *a), load_side(outdir, *b))
        for cell in side.cells
        if (cell.task, cell.sampling) in wanted
    ]
    label_a, label_b = ":".join(a), ":".join(b)
    summary = summarize(cells, title=f"{label_b} vs {label_a}", bootstrap=n_boot)
    try:
        focus = (label_a, label_b, *filter(None, [most_changed(results)]))
        write_html(summary, [], path, focus=focus)
    except OSError as exc:
        raise UserError(f"compare: --html {path}: {exc.strerror or exc}") from None


def format_text(label_a: str, label_b: str, results: Sequence[TaskComparison]) -> str:
    """The comparisons as a person reads them, a few lines per (task, sampling)."""
    lines = [f"{label_b} minus {label_a}, on the samples both scored"]
    for r in results:
        lines += [
            "",
            f"{r.task} ({r.sampling}, {r.metric}): {r.n_problems} problems, {r.n_pairs} paired "
            f"samples, seeds {' '.join(map(str, r.seeds))}",
            f"  {r.metric} {_num(r.value_a)} -> {_num(r.value_b)}, delta {_num(r.delta, '+')} "
            f"[{CONFIDENCE:.0%} CI {_num(r.ci_low, '+')}, {_num(r.ci_high, '+')}]",
        ]
        if r.paired_test != MCNEMAR:
            lines.append(f"  no McNemar test ({r.paired_test})")
            continue
        lines += [
            f"  McNemar exact p = {r.mcnemar_p:.4g} (gained {r.n_gained}, lost {r.n_lost})",
            f"  MDE {r.mde:.3f}: at n={r.n_problems}, differences below {r.mde:.3f} are not "
            f"detectable (alpha {MDE_ALPHA}, power {MDE_POWER})"
            if math.isfinite(r.mde)
            else f"  MDE none: at n={r.n_problems} no difference can reach p < {MDE_ALPHA} "
            f"(the exact test needs {min_discordant()} discordant problems)",
            f"  gained ({len(r.gained)}): {' '.join(r.gained) or '-'}",
            f"  lost ({len(r.lost)}): {' '.join(r.lost) or '-'}",
        ]
    return "\n".join(lines)


def _num(value: float, sign: str = "") -> str:
    return "n/a" if math.isnan(value) else f"{value:{sign}.3f}"


def _jsonable(obj: Any) -> Any:
    """NaN (no pairs, no test) and infinity (an MDE no difference reaches) as null: strict JSON
    has neither."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_jsonable(v) for v in obj]
    return obj
