"""`ckpteval gate POLICY.yaml`: fail (exit 1) when a checkpoint dropped more than a policy allows.

A training script or CI job calls it after the aggregate step: it reads the summary's tidy table
(`summary/metrics.parquet`) to find the cells, and their per-sample scores to pair them. For every
(task, sampling config) both checkpoints scored, the change is the paired one of `deltas.csv`
(checkpoint minus reference on each task's main metric, over the (task_id, seed, sample_idx) both
scored, averaged per problem). A task fails when the data show, beyond noise, that it dropped by
more than its `max_drop`: the one-sided test of "the true change is at least -max_drop" (normal,
on the per-problem differences, so a problem counts once however many samples it has) rejects at
`alpha` after Holm's correction over the gated tasks. So a checkpoint whose true drop is within
the allowance fails with probability at most `alpha`, whatever the number of tasks; a drop
larger than the allowance but within noise passes (more problems or seeds make it visible).

The policy (YAML), every key but `checkpoint` optional::

    checkpoint: main:latest     # RUN:CKPT, or RUN:latest (the last trained checkpoint by step)
    reference: baseline         # baseline (the run's), previous (by step) or RUN:CKPT
    max_drop: 0.02              # allowed drop of the main metric, in its units (default 0)
    tasks: {code: 0.05}         # per-task max_drop (tasks both scored); others use max_drop
    alpha: 0.05                 # chance of failing a checkpoint that dropped no more than allowed
    outdir: results             # the results directory (default results; --outdir overrides)

Output: one line per failing task, then a line saying how many passed; exit 0 when all pass, 1
when any fails, 2 (one line) for a policy or results the gate cannot use.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd
import yaml

from ckpteval.aggregate.cells import load_cells, load_samples, zero_counted_lines
from ckpteval.aggregate.tables import main_metrics
from ckpteval.errors import UserError
from ckpteval.plan.layout import CellKey, Layout
from ckpteval.stats import drop_p_value, holm, per_problem_means

POLICY_KEYS = ("checkpoint", "reference", "max_drop", "tasks", "alpha", "outdir")


@dataclass(frozen=True)
class Policy:
    """A gate policy file, checked (`load_policy`)."""

    checkpoint: tuple[str, str]  # (run, ckpt or "latest")
    reference: str  # "baseline", "previous" or "RUN:CKPT"
    max_drop: float = 0.0
    tasks: Mapping[str, float] = field(default_factory=dict)
    alpha: float = 0.05
    outdir: Path = Path("results")


@dataclass(frozen=True)
class TaskVerdict:
    """One gated (task, sampling): the change and whether it fails the policy."""

    task: str
    sampling: str
    metric: str
    n_problems: int
    reference_value: float
    value: float
    delta: float
    upper: float  # one-sided (1 - alpha) upper bound of the change, before Holm's correction
    max_drop: float
    p_value: float  # of "the change is at least -max_drop"
    p_holm: float
    failed: bool

    def line(self, label: str, reference: str) -> str:
        return (
            f"FAIL {self.task} ({self.sampling}): {self.metric} {self.value:.3f} vs "
            f"{self.reference_value:.3f} at {reference}: change {self.delta:+.3f}, allowed "
            f"-{self.max_drop:.3f}; upper bound {self.upper:+.3f}, Holm p {self.p_holm:.3g} "
            f"({self.n_problems} problems, {label})"
        )


def load_policy(path: Path) -> Policy:
    """Read and check a policy file; anything wrong is one `UserError` line naming the key."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"gate: {path}: no such policy file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"gate: {path}: unreadable ({exc})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"gate: {path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise UserError(f"gate: {path}: a policy is a mapping with keys {', '.join(POLICY_KEYS)}")
    unknown = sorted(set(map(str, raw)) - set(POLICY_KEYS))
    if unknown:
        raise UserError(
            f"gate: {path}: unknown key {unknown[0]!r}; known: {', '.join(POLICY_KEYS)}"
        )
    checkpoint = raw.get("checkpoint")
    if not isinstance(checkpoint, str) or not _is_target(checkpoint):
        raise UserError(f"gate: {path}: checkpoint: give RUN:CKPT or RUN:latest")
    reference = raw.get("reference", "baseline")
    if not isinstance(reference, str) or not (
        reference in ("baseline", "previous") or _is_target(reference)
    ):
        raise UserError(f"gate: {path}: reference: give baseline, previous or RUN:CKPT")
    max_drop = _share(path, "max_drop", raw.get("max_drop", 0.0))
    tasks = raw.get("tasks") or {}
    if not isinstance(tasks, dict):
        raise UserError(f"gate: {path}: tasks: a mapping of task name to its max_drop")
    per_task = {str(t): _share(path, f"tasks.{t}", v) for t, v in tasks.items()}
    alpha = _share(path, "alpha", raw.get("alpha", 0.05))
    if not 0 < alpha < 0.5:
        raise UserError(f"gate: {path}: alpha: {alpha} is not in (0, 0.5); 0.05 is usual")
    outdir = raw.get("outdir", "results")
    if not isinstance(outdir, str) or not outdir:
        raise UserError(f"gate: {path}: outdir: a directory path")
    run, _, ckpt = checkpoint.partition(":")
    return Policy((run, ckpt), reference, max_drop, per_task, alpha, Path(outdir))


def _is_target(text: str) -> bool:
    run, sep, ckpt = text.partition(":")
    return bool(sep and run and ckpt)


def _share(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise UserError(f"gate: {path}: {key}: {value!r} is not a number in [0, 1]")
    return float(value)


def gate(policy: Policy) -> tuple[str, str, list[TaskVerdict], list[str]]:
    """(checkpoint label, reference label, a verdict per (task, sampling) both scored, a line
    per side and gated task whose reward function gave samples no score:
    `aggregate.cells.zero_counted_lines`)."""
    tidy = read_summary_table(policy.outdir, "gate")
    run, ckpt = _checkpoint(tidy, *policy.checkpoint)
    ref_run, ref_ckpt = _reference(tidy, run, ckpt, policy.reference)
    sides = {(run, ckpt): 1, (ref_run, ref_ckpt): 0}
    rows = tidy[[(r, c) in sides for r, c in zip(tidy["run"], tidy["ckpt"])]]
    rows = rows.drop_duplicates(["run", "ckpt", "task", "variant"])
    _check_task_allowances(policy.tasks, rows)
    paths = [
        Path(Layout(str(policy.outdir)).score(CellKey(r.run, r.ckpt, r.task, r.variant)))
        for r in rows.itertuples()
    ]
    cells, problems = load_cells(paths)
    if problems:
        raise UserError(f"gate: {problems[0].path}: {problems[0].reason}; rerun the workflow")
    samples, _ = load_samples(cells)
    metrics = main_metrics(cells)
    side = np.array([sides[(c.key.run, c.key.ckpt)] for c in cells])
    key = pd.DataFrame(
        {"task": [c.key.task for c in cells], "sampling": [c.sampling for c in cells]}
    ).assign(side=side, seed=[c.seed for c in cells])
    verdicts = []
    for (task, sampling), group in key.groupby(["task", "sampling"], sort=True):
        if set(group["side"]) != {0, 1}:
            continue
        allowed = policy.tasks.get(str(task), policy.max_drop)
        rows_of = samples[samples["cell"].isin(group.index)]
        verdicts.append(
            _verdict(str(task), str(sampling), metrics[task], rows_of, key, allowed, policy.alpha)
        )
    if not verdicts:
        raise UserError(f"gate: {run}:{ckpt} and {ref_run}:{ref_ckpt} share no scored task")
    adjusted = holm(np.array([v.p_value for v in verdicts]))
    verdicts = [
        replace(v, p_holm=float(p), failed=bool(p <= policy.alpha))
        for v, p in zip(verdicts, adjusted)
    ]
    gated = {(v.task, v.sampling) for v in verdicts}
    errored = zero_counted_lines(
        [c for c in cells if (c.key.task, c.sampling) in gated], metrics, "the gate's change"
    )
    return f"{run}:{ckpt}", f"{ref_run}:{ref_ckpt}", verdicts, errored


def _check_task_allowances(allowances: Mapping[str, float], rows: pd.DataFrame) -> None:
    """A per-task `max_drop` must name a task the gated checkpoints scored: a misspelt name
    would otherwise leave that task gated at the default allowance, and the policy's author
    would never learn it."""
    scored = set(map(str, rows["task"]))
    unknown = sorted(set(allowances) - scored)
    if unknown:
        raise UserError(
            f"gate: tasks: {unknown[0]!r} is not a task the gated checkpoints scored; "
            f"their tasks: {', '.join(sorted(scored)) or 'none'}"
        )


def read_summary_table(outdir: Path, command: str) -> pd.DataFrame:
    """The summary's tidy table, which names the cells a decision reads; a `UserError` naming
    `command` when the aggregate step has not written it."""
    path = Path(Layout(str(outdir)).summary("metrics.parquet"))
    if not path.exists():
        raise UserError(
            f"{command}: {path} not found; run the aggregate step first (or set outdir)"
        )
    return pd.read_parquet(path)


def _checkpoint(tidy: pd.DataFrame, run: str, ckpt: str) -> tuple[str, str]:
    """The gated checkpoint; `latest` is the run's last trained checkpoint by step (a final
    checkpoint, saved without a step, is last)."""
    ours = tidy[tidy["run"] == run]
    if ours.empty:
        runs = ", ".join(sorted(set(tidy["run"]))) or "none"
        raise UserError(f"gate: checkpoint: run {run!r} is not in the summary; runs: {runs}")
    if ckpt == "latest":
        trained = ours[~ours["is_baseline"]]
        if trained.empty:
            raise UserError(f"gate: checkpoint: run {run!r} has no trained checkpoint scored")
        order = trained.assign(_final=trained["final"].astype(bool)).sort_values(
            ["_final", "step"], kind="stable", na_position="first"
        )
        return run, str(order["ckpt"].iloc[-1])
    if ckpt not in set(ours["ckpt"]):
        raise UserError(
            f"gate: checkpoint: run {run!r} has no checkpoint {ckpt!r} in the summary; "
            f"its checkpoints: {', '.join(dict.fromkeys(ours['ckpt']))}"
        )
    return run, ckpt


def _reference(tidy: pd.DataFrame, run: str, ckpt: str, reference: str) -> tuple[str, str]:
    ours = tidy[tidy["run"] == run]
    if reference == "baseline":
        base = ours.loc[ours["is_baseline"], "ckpt"]
        if base.empty:
            raise UserError(f"gate: reference: run {run!r} has no baseline scored")
        return run, str(base.iloc[0])
    if reference == "previous":
        trained = ours[~ours["is_baseline"] & ours["step"].notna()]
        step = trained.loc[trained["ckpt"] == ckpt, "step"]
        earlier = trained[trained["step"] < step.iloc[0]] if len(step) else trained.iloc[:0]
        if earlier.empty:
            raise UserError(f"gate: reference: {run}:{ckpt} has no earlier checkpoint scored")
        return run, str(earlier.sort_values("step", kind="stable")["ckpt"].iloc[-1])
    ref_run, _, ref_ckpt = reference.partition(":")
    return _checkpoint(tidy, ref_run, ref_ckpt)


def _verdict(
    task: str,
    sampling: str,
    metric: str,
    rows: pd.DataFrame,
    key: pd.DataFrame,
    max_drop: float,
    alpha: float,
) -> TaskVerdict:
    """The change of one (task, sampling) and the one-sided p-value of "it is at least
    -max_drop" (not yet corrected: `gate` applies Holm's method over the tasks)."""
    value = (rows["passed"] if metric == "pass@1" else rows["score"]).to_numpy(np.float64)
    frame = pd.DataFrame(
        {
            "side": key.loc[rows["cell"], "side"].to_numpy(),
            "seed": key.loc[rows["cell"], "seed"].to_numpy(),
            "problem": rows["problem"].to_numpy(),
            "sample_idx": rows["sample_idx"].to_numpy(),
            "value": value,
        }
    ).dropna(subset=["value"])
    wide = frame.pivot_table(
        index=["problem", "seed", "sample_idx"], columns="side", values="value", aggfunc="mean"
    ).dropna()
    if wide.empty or set(wide.columns) != {0, 1}:
        n, ref_value, new_value, per_problem = 0, math.nan, math.nan, np.empty(0)
    else:
        problems = wide.index.get_level_values("problem").to_numpy()
        diffs = (wide[1] - wide[0]).to_numpy().reshape(-1, 1)
        per_problem = per_problem_means(diffs, problems)[:, 0]
        per_problem = per_problem[~np.isnan(per_problem)]
        n, ref_value, new_value = len(per_problem), wide[0].mean(), wide[1].mean()
    delta = float(per_problem.mean()) if n else math.nan
    stderr = float(per_problem.std(ddof=1) / math.sqrt(n)) if n >= 2 else math.nan
    upper = delta + NormalDist().inv_cdf(1 - alpha) * stderr
    p = drop_p_value(per_problem, max_drop)  # NaN with < 2 problems: the task cannot fail
    return TaskVerdict(
        task,
        sampling,
        metric,
        n,
        float(ref_value),
        float(new_value),
        delta,
        upper,
        max_drop,
        p,
        math.nan,
        False,
    )


def add_gate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`ckpteval gate POLICY.yaml`."""
    parser = subparsers.add_parser(
        "gate",
        help="exit 1 when a checkpoint dropped more than a policy allows on any task",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("policy", type=Path, metavar="POLICY.yaml")
    parser.add_argument("--outdir", type=Path, help="results directory (default: the policy's)")
    parser.set_defaults(func=run_gate)
    return parser


def run_gate(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    if args.outdir is not None:
        policy = replace(policy, outdir=args.outdir)
    label, reference, verdicts, errored = gate(policy)
    failed = [v for v in verdicts if v.failed]
    for verdict in failed:
        print(verdict.line(label, reference))
    for line in errored:
        print(f"gate: note: {line}")
    print(
        f"gate: {label} vs {reference}: {len(verdicts) - len(failed)} of {len(verdicts)} "
        f"task(s) pass (Holm-corrected, alpha {policy.alpha})"
    )
    return 1 if failed else 0
