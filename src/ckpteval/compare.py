"""`ckpteval compare RUN:CKPT RUN:CKPT [...]`: 2 to 6 checkpoints side by side, from their score
files.

For every task (and sampling config) all the checkpoints scored, each checkpoint after the first
is compared with the first on the samples both have, the same pairing and statistics as
`deltas.csv` (`ckpteval.aggregate.deltas.delta_table`): the (task_id, seed, sample_idx) both cells
scored, seeds of a sampling config pooled; the delta (later minus first) with a 95% percentile
bootstrap interval over problems (`stats.paired_bootstrap`); McNemar's exact test on per-problem
verdicts, the minimum detectable effect and the flipped problems (`stats.paired_flips`); the
comparison's own test (McNemar's with one 0/1 pair per problem, else the normal test of the
per-problem differences) and its p-value after Holm's correction over every comparison shown,
which the ▲ / ▼ marks use. It reads `scores/{run}/{ckpt}/{task}/{variant}.json` and `.jsonl`
directly, so it needs no aggregate and works across runs.

With three or more checkpoints the output is the side-by-side view (`side_by_side`): each
checkpoint's score with the summary's interval, and the problems whose verdicts differ among
them, every checkpoint's verdict in one row. Two checkpoints keep the paired text they always had.

Cells that are not comparable are never compared silently: a warning line (stderr) says when
a checkpoint's cells were generated with different chat templates from the first's (the cells'
`chat_template.sha256`; cells without the field are not checked), scored by a different checker
or checker/scorer version, or scored with different settings (the cells' `scoring` identity,
`ckpteval.contract`), and, for each checkpoint whose reward function gave no score for some
samples, that its values count them as 0 while the cell's own number may leave them out
(`errored_warnings`).

`--html OUT.html` also writes a page. For two checkpoints, the report page of their cells, opened
on the drill-down of the pair: the problems that flipped, each with its prompt and both
completions (`ckpteval.report`). For more, the side-by-side page (`write_compare_page`): the
same view with every checkpoint's completions of each differing problem one click away.
"""

from __future__ import annotations

import argparse
import html
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
from ckpteval.aggregate.deltas import ALPHA, MCNEMAR, NO_TEST_NO_PAIRS, NO_TEST_NOT_BINARY
from ckpteval.aggregate.tables import CONFIDENCE, main_metrics
from ckpteval.errored import errored_metrics, no_score
from ckpteval.errors import UserError
from ckpteval.io import atomic_open, iter_jsonl
from ckpteval.jobs import chosen_main_metrics
from ckpteval.plan.layout import Layout
from ckpteval.stats import (
    MDE_ALPHA,
    MDE_POWER,
    holm,
    min_discordant,
    paired_bootstrap,
    paired_flips,
    paired_z_p,
    per_problem_means,
)

#: How many checkpoints `compare` puts side by side: a pair at least, and no more than a page's
#: columns can hold (the last few, the best, the baseline).
#: `p_test` of a comparison whose scores are not one 0/1 pair per problem: the normal test of the
#: mean per-problem difference (`stats.paired_z_p`), as deltas.csv's `p_value`.
PAIRED_NORMAL = "paired-normal"
MIN_CHECKPOINTS = 2
MAX_CHECKPOINTS = 6


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
        return [c for c in self.cells if c.key.task == task and c.sampling == sampling]


@dataclass
class TaskComparison:
    """One (task, sampling) of `compare`: checkpoint `b` minus the reference `a`.

    `p_value` is the comparison's own test, as in deltas.csv (McNemar's exact p with one 0/1
    pair per problem, else the normal test of the per-problem differences); `p_holm` it adjusted
    by Holm's method over every comparison `compare` returns (the ones it shows)."""

    task: str
    sampling: str
    metric: str
    a: str
    b: str
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
    p_test: str
    p_value: float
    p_holm: float = math.nan
    gained: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    @property
    def mark(self) -> str:
        """▲ / ▼: a gain / drop significant after Holm's correction (family-wise 5%), else ""."""
        if not self.p_holm <= ALPHA:
            return ""
        return "▲" if self.delta > 0 else "▼"


def parse_target(text: str) -> tuple[str, str]:
    """`RUN:CKPT` -> (run, ckpt)."""
    run, sep, ckpt = text.partition(":")
    if not sep or not run or not ckpt:
        raise UserError(f"compare: {text!r}: give a checkpoint as RUN:CKPT, e.g. main:step_1000")
    return run, ckpt


def load_side(outdir: Path, run: str, ckpt: str, tasks: Sequence[str] = ()) -> Side:
    """The cells of one checkpoint (of `tasks` only, when given); an unknown run or checkpoint,
    or a cell that cannot be read, is a `UserError` (listing what exists)."""
    layout = Layout(str(outdir))
    scores, of_run = Path(layout.scores()), Path(layout.scores_of(run))
    of_ckpt = Path(layout.checkpoint_scores(run, ckpt))
    if not of_run.is_dir():
        runs = sorted(p.name for p in scores.iterdir() if p.is_dir()) if scores.is_dir() else []
        raise UserError(
            f"compare: run {run!r} has no scores in {scores}; runs with scores: "
            + (", ".join(runs) or "none (run the workflow first, or pass --outdir)")
        )
    if not of_ckpt.is_dir():
        ckpts = sorted(p.name for p in of_run.iterdir() if p.is_dir())
        raise UserError(
            f"compare: run {run!r} has no checkpoint {ckpt!r} in {of_run}; its checkpoints: "
            + (", ".join(ckpts) or "none")
        )
    cells: list[Cell] = []
    raw: dict[str, dict[str, Any]] = {}
    paths = sorted(of_ckpt.glob("*/*.json"))
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
    *targets: tuple[str, str],
    tasks: Sequence[str] = (),
    sampling: str | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    main_metric: Mapping[str, str] | None = None,
) -> tuple[list[TaskComparison], list[str]]:
    """Compare every checkpoint of `targets` after the first with the first, on every (task,
    sampling) all of them scored (or those asked for), on each task's main metric
    (`main_metric`: the config's choices): the comparisons, task by task in the order of
    `targets`, their `p_holm` adjusted over all of them; and one warning line per thing that
    makes them less than comparable."""
    if not MIN_CHECKPOINTS <= len(targets) <= MAX_CHECKPOINTS:
        raise UserError(
            f"compare: give {MIN_CHECKPOINTS} to {MAX_CHECKPOINTS} checkpoints as RUN:CKPT, "
            f"got {len(targets)}"
        )
    twice = next((t for i, t in enumerate(targets) if t in targets[:i]), None)
    if twice is not None:
        raise UserError(f"compare: {':'.join(twice)} is given twice; give each checkpoint once")
    if n_boot < 1:
        raise UserError(f"compare: --bootstrap {n_boot}: give at least 1 (1000 is usual)")
    sides = [load_side(outdir, *t, tasks) for t in targets]
    every = _every(s.label for s in sides)
    scored = set.intersection(*(s.scored_tasks for s in sides))
    unknown = [t for t in tasks if t not in scored]
    if unknown:
        raise UserError(
            f"compare: task {unknown[0]!r} is not scored for {every}; tasks of "
            f"{'both' if len(sides) == 2 else 'all'}: {_names(scored)}"
        )
    common = set.intersection(*map(_pairs, sides))
    if not common:
        raise UserError(
            f"compare: {every} have no scored task in common; "
            + "; ".join(f"{s.label}: {_names(s.scored_tasks)}" for s in sides)
        )
    wanted = [(t, s) for t, s in sorted(common) if not tasks or t in tasks]
    if sampling is not None:
        samplings = sorted({s for _, s in wanted})
        if sampling not in samplings:
            raise UserError(
                f"compare: sampling config {sampling!r} is not scored for "
                f"{'both' if len(sides) == 2 else 'all'} checkpoints (on the tasks asked); "
                f"sampling configs of {'both' if len(sides) == 2 else 'all'}: "
                f"{', '.join(samplings)}"
            )
        wanted = [(t, s) for t, s in wanted if s == sampling]
    rng = np.random.default_rng(seed)
    metrics = main_metrics([c for s in sides for c in s.cells], main_metric)
    results, warnings = [], []
    for task in sorted(set(tasks or scored) - {t for t, _ in common}):
        warnings.append(
            f"{task}: no sampling config scored by {'both' if len(sides) == 2 else 'all'}; "
            + "; ".join(
                f"{s.label}: {_names(samp for t, samp in _pairs(s) if t == task)}" for s in sides
            )
        )
    reference = sides[0]
    for task, samp in wanted:
        for side in sides[1:]:
            results.append(
                _compare_cells(
                    task,
                    samp,
                    metrics[task],
                    (reference.label, side.label),
                    reference.cells_of(task, samp),
                    side.cells_of(task, samp),
                    n_boot,
                    rng,
                )
            )
            warnings += [
                f"{task} ({samp}): {line}"
                for line in provenance_warnings(reference, side, task, samp)
                + errored_warnings(reference, side, task, samp, metrics[task])
            ]
    for result, adjusted in zip(results, holm(np.array([r.p_value for r in results]))):
        result.p_holm = float(adjusted)
    return results, list(dict.fromkeys(warnings))  # the reference's own lines once


def _every(labels: Any) -> str:
    """ "both A and B", or "all of A, B, C"."""
    labels = list(labels)
    if len(labels) == 2:
        return f"both {labels[0]} and {labels[1]}"
    return "all of " + ", ".join(labels)


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
    labels: tuple[str, str],
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
    per_problem = per_problem_means(after - before, problems)
    boot = paired_bootstrap(per_problem, n_boot=n_boot, rng=rng, confidence=CONFIDENCE)
    flips = paired_flips(before, after, problems)
    textbook = bool(flips.binary[0]) and len(keys) == int(boot.n_problems[0])
    return TaskComparison(
        task=task,
        sampling=sampling,
        metric=metric,
        a=labels[0],
        b=labels[1],
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
        p_test=MCNEMAR if textbook else PAIRED_NORMAL,
        p_value=float(flips.p_value[0] if textbook else paired_z_p(per_problem)[0]),
        gained=[ids[i] for i in flips.problems[flips.gained[:, 0]]],
        lost=[ids[i] for i in flips.problems[flips.lost[:, 0]]],
    )


@dataclass(frozen=True)
class Score:
    """One checkpoint's score on a (task, sampling): its main metric over its own cells (seeds
    pooled) with the summary's 95% interval (`aggregate.tables.seed_table`: Wilson's for a score
    in [0, 1], else the normal one; clustered by problem)."""

    label: str
    value: float
    ci_low: float
    ci_high: float
    ci_method: str


@dataclass(frozen=True)
class ProblemVerdicts:
    """One problem's verdict at every checkpoint, in the order given: (passed, samples) for 0/1
    scores, (mean score, samples) otherwise."""

    task_id: str
    verdicts: list[tuple[float, int]]


@dataclass
class TaskView:
    """One (task, sampling) of several checkpoints side by side: each one's score, each later
    one against the first (`comparisons`), and the problems their verdicts differ on."""

    task: str
    sampling: str
    metric: str
    scores: list[Score]
    comparisons: list[TaskComparison]
    binary: bool
    differing: list[ProblemVerdicts]


def side_by_side(
    outdir: Path, targets: Sequence[tuple[str, str]], results: Sequence[TaskComparison]
) -> list[TaskView]:
    """The views of `compare`'s results: per (task, sampling), every checkpoint's score with its
    interval and the problems every checkpoint scored on which their verdicts differ. A problem's
    verdict at a checkpoint is over all its samples there (seeds pooled): solved when more than
    half pass, as `stats.paired_flips` decides, for 0/1 scores; its mean score otherwise."""
    from ckpteval.aggregate.cells import load_samples
    from ckpteval.aggregate.tables import seed_table, tidy_table

    wanted = list(dict.fromkeys((r.task, r.sampling, r.metric) for r in results))
    tasks = sorted({t for t, _, _ in wanted})
    sides = [load_side(outdir, *t, tasks) for t in targets]
    cells = [
        c
        for side in sides
        for c in side.cells
        if (c.key.task, c.sampling) in {w[:2] for w in wanted}
    ]
    samples, _ = load_samples(cells)
    seeds = seed_table(tidy_table(cells, samples))
    rows = {
        (row.run, row.ckpt, row.task, row.sampling, row.metric): Score(
            f"{row.run}:{row.ckpt}",
            float(row.mean),
            float(row.ci_low),
            float(row.ci_high),
            str(row.ci_method),
        )
        for row in seeds.itertuples()
    }
    views = []
    for task, samp, metric in wanted:
        scores = [
            rows.get(
                (s.run, s.ckpt, task, samp, metric),
                Score(s.label, math.nan, math.nan, math.nan, ""),
            )
            for s in sides
        ]
        per_side = [_per_problem(_values_by_key(s.cells_of(task, samp), metric)) for s in sides]
        binary = all(v in (0.0, 1.0) for p in per_side for vs in p.values() for v in vs)
        shared = set.intersection(*(set(p) for p in per_side))
        differing = []
        for task_id in sorted(shared, key=_natural):
            values = [p[task_id] for p in per_side]
            verdicts = [(float(sum(v)) if binary else float(np.mean(v)), len(v)) for v in values]
            decided = {2 * n_pass > n for n_pass, n in verdicts} if binary else None
            if (len(decided) > 1) if decided is not None else np.ptp([v for v, _ in verdicts]):
                differing.append(ProblemVerdicts(task_id, verdicts))
        comparisons = [r for r in results if (r.task, r.sampling) == (task, samp)]
        views.append(TaskView(task, samp, metric, scores, comparisons, binary, differing))
    return views


def _per_problem(values: Mapping[tuple[str, int, int], float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for (task_id, _, _), value in values.items():
        out.setdefault(task_id, []).append(value)
    return out


def verdict_text(verdict: tuple[float, int], binary: bool) -> str:
    """ "2/3 ✓" (passed of samples, solved by majority), or a mean score "0.412 (3)"."""
    value, n = verdict
    if binary:
        return f"{value:.0f}/{n} {'✓' if 2 * value > n else '✗'}"
    return f"{value:.3f}" + (f" ({n})" if n > 1 else "")


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
    return {(c.key.task, c.sampling) for c in side.cells}


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
    """`ckpteval compare A B [C ...]`: each later checkpoint minus A, task by task."""
    parser = subparsers.add_parser(
        "compare",
        help="2 to 6 checkpoints side by side: scores with intervals, paired deltas, "
        "Holm-corrected tests, the problems whose verdicts differ",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "targets",
        nargs="*",
        metavar="RUN:CKPT",
        help=f"{MIN_CHECKPOINTS} to {MAX_CHECKPOINTS} checkpoints; the first is the reference",
    )
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
        help="also write a page: for two checkpoints the report's drill-down of the pair, for "
        "more the side-by-side page (scores, marks, differing problems, their completions)",
    )
    parser.set_defaults(func=run_compare)
    return parser


def run_compare(args: argparse.Namespace) -> int:
    targets = [parse_target(t) for t in args.targets]
    config = _config(args.configfile)
    args.outdir = args.outdir or Path(config.get("outdir", "results"))
    results, warnings = compare(
        args.outdir,
        *targets,
        tasks=args.task,
        sampling=args.sampling,
        n_boot=args.bootstrap,
        main_metric=chosen_main_metrics(config),
    )
    for line in warnings:
        print(f"ckpteval: warning: {line}", file=sys.stderr)
    labels = [":".join(t) for t in targets]
    views = side_by_side(args.outdir, targets, results) if len(targets) > 2 else []
    if args.html and len(targets) == 2:
        write_pair_html(args.outdir, *targets, results, args.html, n_boot=args.bootstrap)
    elif args.html:
        write_compare_page(args.outdir, targets, views, args.html)
    if args.html:  # on stderr: stdout stays the comparison (JSON with --json)
        print(f"ckpteval: wrote {args.html}", file=sys.stderr)
    if args.json:
        document = {
            "checkpoints": labels,
            "a": labels[0],
            **({"b": labels[1]} if len(labels) == 2 else {}),
            "alpha": MDE_ALPHA,
            "power": MDE_POWER,
            "confidence": CONFIDENCE,
            "correction": CORRECTION,
            "comparisons": [_jsonable(asdict(r)) for r in results],
            **({"tasks": [_jsonable(asdict(v)) for v in views]} if views else {}),
            "warnings": warnings,
        }
        print(json.dumps(document, indent=1))
    elif views:
        print(format_views(labels, views, len(results)))
    else:
        print(format_text(*labels, results))
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
        if (cell.key.task, cell.sampling) in wanted
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
        if r.p_test != MCNEMAR:
            lines.append(f"  {_corrected(r, len(results))}")
        if r.paired_test != MCNEMAR:
            lines.append(f"  no McNemar test ({r.paired_test})")
            continue
        holm_part = _corrected(r, len(results), test=False) if r.p_test == MCNEMAR else ""
        lines += [
            f"  McNemar exact p = {r.mcnemar_p:.4g} (gained {r.n_gained}, lost {r.n_lost})"
            + (f"; {holm_part}" if holm_part else ""),
            f"  MDE {r.mde:.3f}: at n={r.n_problems}, differences below {r.mde:.3f} are not "
            f"detectable (alpha {MDE_ALPHA}, power {MDE_POWER})"
            if math.isfinite(r.mde)
            else f"  MDE none: at n={r.n_problems} no difference can reach p < {MDE_ALPHA} "
            f"(the exact test needs {min_discordant()} discordant problems)",
            f"  gained ({len(r.gained)}): {' '.join(r.gained) or '-'}",
            f"  lost ({len(r.lost)}): {' '.join(r.lost) or '-'}",
        ]
    return "\n".join(lines)


#: The correction `compare`'s marks use, as the pages and the JSON name it.
CORRECTION = "holm"


def _corrected(r: TaskComparison, family: int, *, test: bool = True) -> str:
    """The comparison's test (unless not `test`) and its p-value after Holm's correction over
    the `family` shown, with the verdict when it is significant."""
    if r.p_value != r.p_value:
        return "no test (fewer than 2 paired problems)"
    name = "McNemar exact" if r.p_test == MCNEMAR else "paired normal test"
    mark = {"▲": ": significant gain", "▼": ": significant drop"}.get(r.mark, "")
    return (
        f"{name} p = {r.p_value:.4g}; " if test else ""
    ) + f"Holm-adjusted over the {family} comparison(s) shown: {r.p_holm:.4g}{mark}"


#: Most differing problems the text lists per task (`--html` and `--json` have them all).
TEXT_PROBLEMS = 20


def format_views(labels: Sequence[str], views: Sequence[TaskView], family: int) -> str:
    """Several checkpoints as a person reads them: per (task, sampling), each one's score with
    its interval and (after the first) its paired delta against the first with the corrected
    test, then the problems whose verdicts differ, every checkpoint's verdict side by side."""
    width = max(map(len, labels))
    lines = [
        f"{', '.join(labels[1:])} against {labels[0]}, each on the samples both scored; "
        f"{CONFIDENCE:.0%} intervals; ▲ / ▼ a gain / drop significant after Holm's correction "
        f"over the {family} comparisons shown (family-wise error rate {ALPHA:.0%})"
    ]
    for view in views:
        lines += ["", f"{view.task} ({view.sampling}, {view.metric})"]
        for index, score in enumerate(view.scores):
            line = (
                f"  {score.label:<{width}}  {_num(score.value)} "
                f"[{_num(score.ci_low)}, {_num(score.ci_high)}]"
            )
            if index:
                r = view.comparisons[index - 1]
                line += (
                    f"  delta {_num(r.delta, '+')} [{_num(r.ci_low, '+')}, "
                    f"{_num(r.ci_high, '+')}]  {_corrected(r, family)} {r.mark}".rstrip()
                )
            lines.append(line)
        lines.append(f"  verdicts differ on {len(view.differing)} problem(s) all scored")
        if view.differing:
            ids = [p.task_id for p in view.differing[:TEXT_PROBLEMS]]
            id_width = max(len("problem"), *map(len, ids))
            lines.append(f"    {'problem':<{id_width}}  " + "  ".join(labels))
            for problem in view.differing[:TEXT_PROBLEMS]:
                cells = [
                    f"{verdict_text(v, view.binary):<{len(label)}}"
                    for v, label in zip(problem.verdicts, labels)
                ]
                lines.append(f"    {problem.task_id:<{id_width}}  " + "  ".join(cells).rstrip())
            if len(view.differing) > TEXT_PROBLEMS:
                lines.append(
                    f"    ... and {len(view.differing) - TEXT_PROBLEMS} more (--html, --json)"
                )
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


# ---------------------------------------------------------------------------------------------
# The side-by-side page of `ckpteval compare A B C ... --html OUT.html`: one self-contained HTML
# file (no script, no network) showing, per task, every checkpoint's score with its interval,
# each later checkpoint's paired delta against the first with its Holm-corrected mark, and the
# problems whose verdicts differ among them: one row per problem (its prompt folded), every
# checkpoint's verdict in a `<details>` that opens on that checkpoint's completions of the
# problem (every sample, every seed), so each completion is one click away. All text from the
# files is HTML-escaped. Completions come from `generations/{run}/{ckpt}/{task}/{variant}.jsonl`
# (the workflow's layout), joined to the score lines on (task_id, sample_idx); a cell without its
# generation file says so in place of the completions. The page holds only the differing
# problems' completions, so its size grows with what changed, not with the benchmark.


#: Longest text of one completion or prompt kept on the side-by-side page.
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
        path = Path(Layout(str(outdir)).generation(cell.key))
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


def _p(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.4g}"
