"""Publish a sweep's metrics to experiment trackers, each checkpoint at its training step.

Input: the tidy table `summary/metrics.parquet` (`ckpteval.aggregate.tables.TIDY_COLUMNS`). Each
(run, checkpoint, task, sampling, metric) becomes one point: the mean over the cell's seeds (the
`mean` of `ckpteval.aggregate.tables.seed_table`, the number `metrics.md` shows), at the checkpoint's `step`
(the base checkpoint at its step, 0). Its key is `<prefix>/<task>/<metric>`, or
`<prefix>/<task>/<sampling>/<metric>` for a task the table has under several sampling configs.
The value's 95% interval (the seed table's `ci_low`, `ci_high`: Wilson's for a score in [0, 1],
clustered by problem) goes beside it as `<key>/ci_low` and `<key>/ci_high` (MLflow: `<key>_ci_low`, `<key>_ci_high`),
at the same step (none where the interval is unknown).
A checkpoint without a step, a NaN value, or a second checkpoint of a run at a step already
taken is skipped with one note line each.
With `trainer_names`, a metric the trainer logged too (the summary's `training_curve.csv`) is
keyed by the trainer's own name instead, and goes to an eval run beside the training run, never
into it (TensorBoard `<logdir>/<run>-eval/`; W&B refuses a `run_ids` run for it).

Idempotence: every (tracker, destination) has a ledger, `summary/published/<tracker>-<slug>.json`:
`{tracker, target, points: {run: {key: {step: value}}}, runs: {run: tracker state}}` (the state:
W&B's run id, MLflow's run id, TensorBoard's current event file). A publish sends only points
that are new or whose value changed, so publishing again sends nothing. What "a changed value
updates its point" means differs by tracker, because they differ in what can be rewritten:

| tracker | a changed value |
| --- | --- |
| TensorBoard | the run's ckpteval event file is rewritten whole (a new file with every current point, then the superseded file deleted): exactly one value per step remains |
| MLflow | logged again at the same step with a later timestamp: the metric's history keeps both; the newest timestamp at a step is the current value |
| W&B | logged again at the same custom step (`<prefix>/train_step`): W&B cannot rewrite logged history, so both rows stay; the run summary is set to the value at the last step |

Each tracker is an optional extra (`pip install 'ckpteval[wandb]'`, `[tensorboard]`, `[mlflow]`,
or `[trackers]` for all three); a missing one is a one-line `UserError` naming it.
`summary/published/<tracker>.json` records the last publish (`tracker, target, ledger, points,
new, changed, unchanged, runs, notes`): the output of the workflow's `publish` target.
Details: docs/publish.md.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import socket
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval.errors import UserError
from ckpteval.io import read_json, sha256_json, write_json
from ckpteval.plan.layout import Layout, published_in

if TYPE_CHECKING:
    import pandas as pd

TRACKERS = ("wandb", "tensorboard", "mlflow")
#: The seed table's 95% interval of each value, published beside it as `<key>/ci_low` and
#: `<key>/ci_high` (MLflow: `<key>_ci_low`, `<key>_ci_high`, see `mlflow_key`).
INTERVAL_BOUNDS = ("ci_low", "ci_high")
DEFAULT_PREFIX = "ckpteval"

#: Ledger -> run -> key -> step (as text: JSON keys) -> value.
Sent = dict[str, dict[str, dict[str, float]]]


@dataclass(frozen=True)
class Point:
    """One scalar of one run at one training step. `trainer` when `key` is the name the
    trainer logs the same metric under (`publish.trainer_names`)."""

    run: str
    key: str
    step: int
    value: float
    trainer: bool = False


#: (run, task, sampling, metric) -> the trainer's name of that metric.
TrainerNames = dict[tuple[str, str, str, str], str]


# ---------------------------------------------------------------------------------------------
# The table -> points


def table_points(
    tidy: pd.DataFrame, prefix: str = DEFAULT_PREFIX, names: TrainerNames | None = None
) -> tuple[list[Point], list[str]]:
    """Seed-mean points of a tidy table, ordered by run, step, key; and notes on what was skipped.

    Seeds are averaged per (run, ckpt, task, sampling, metric) with `aggregate.tables.seed_table`, so a
    published value is the number the report shows. A metric in `names` is keyed by the
    trainer's name for it instead (`trainer_names`)."""
    from ckpteval.aggregate.tables import excluding_errors, reward_errors, seed_table

    if tidy.empty:
        return [], []
    seeds = seed_table(tidy)
    multi = seeds.groupby("task")["sampling"].nunique()
    notes: list[str] = []
    no_step = seeds[seeds["step"].isna()].drop_duplicates(["run", "ckpt"])
    notes += [f"{r.run}/{r.ckpt}: no training step; not published" for r in no_step.itertuples()]
    points: dict[tuple[str, str, int], Point] = {}
    owner: dict[tuple[str, int], str] = {}
    flattering = excluding_errors(reward_errors(tidy, {}))  # order of numbers: unused
    excluded: dict[tuple[str, str], int] = {}
    for row in seeds[seeds["step"].notna()].itertuples():
        step = int(row.step)
        taken = owner.setdefault((row.run, step), row.ckpt)
        if taken != row.ckpt:
            note = f"{row.run}/{row.ckpt}: step {step} is {taken}'s; not published"
            if note not in notes:
                notes.append(note)
            continue
        parts = [prefix, row.task]
        if multi[row.task] > 1:
            parts.append(row.sampling)
        theirs = (names or {}).get((row.run, row.task, row.sampling, row.metric))
        key = theirs or "/".join([*parts, row.metric])
        if row.mean is None or math.isnan(row.mean):
            notes.append(f"{row.run}/{row.ckpt}: {key} has no value; not published")
            continue
        point = Point(row.run, key, step, float(row.mean), trainer=theirs is not None)
        points[(row.run, key, step)] = point
        for bound in INTERVAL_BOUNDS:
            value = getattr(row, bound)
            if value is not None and not math.isnan(value):
                bound_key = f"{key}/{bound}"
                points[(row.run, bound_key, step)] = Point(
                    row.run, bound_key, step, float(value), trainer=point.trainer
                )
        if (row.run, row.ckpt, row.task, row.sampling, row.metric) in flattering:
            excluded[(row.run, key)] = excluded.get((row.run, key), 0) + 1
    notes += [
        f"{run}: {key} leaves errored samples out of its mean at {count} step(s); a tracker "
        "shows it without saying so: read reward_error_rate beside it"
        for (run, key), count in sorted(excluded.items())
    ]
    return sorted(points.values(), key=lambda p: (p.run, p.step, p.key)), notes


def trainer_names(summary: Path) -> tuple[TrainerNames, list[str]]:
    """The trainer's name of each metric the trainer logged too, from the summary's
    `training_curve.csv` (`ckpteval.aggregate.training`: written with `runs.<run>.train_logs`);
    and notes. A trainer name that two cells of a run claim (two tasks, or one task under two
    sampling configs) names neither: both keep ckpteval's keys, with a note."""
    import pandas as pd

    from ckpteval.config import parse_variant

    curve = summary / "training_curve.csv"
    if not curve.exists():
        raise UserError(
            f"publish.trainer_names: {curve} does not exist: no run's metric was matched to a "
            "curve its trainer logged; set runs.<run>.train_logs (docs/evaluate.md) and rebuild "
            "the summary, or drop publish.trainer_names"
        )
    table = pd.read_csv(curve, usecols=["run", "task", "variant", "metric", "trainer_metric"])
    if table.empty:
        raise UserError(
            f"publish.trainer_names: {curve} pairs no metric with a curve its trainer logged; "
            "name the trainer's metrics in runs.<run>.train_logs.metrics (docs/evaluate.md), or "
            "drop publish.trainer_names"
        )
    claims: dict[tuple[str, str], set[tuple[str, str, str, str]]] = {}
    for row in table.drop_duplicates().itertuples():
        cell = (str(row.run), str(row.task), parse_variant(str(row.variant))[0], str(row.metric))
        claims.setdefault((cell[0], str(row.trainer_metric)), set()).add(cell)
    names: TrainerNames = {}
    notes = []
    for (run, theirs), cells in sorted(claims.items()):
        if len(cells) == 1:
            names[next(iter(cells))] = theirs
            continue
        which = ", ".join(
            f"{task}/{sampling}/{metric}" for _, task, sampling, metric in sorted(cells)
        )
        notes.append(
            f"{run}: the trainer's {theirs} matches {which}; published under ckpteval's keys"
        )
    return names, notes


def pending(points: Sequence[Point], sent: Sent) -> tuple[list[Point], list[Point]]:
    """(new, changed): the points the ledger `sent` does not have, or has with another value."""
    new, changed = [], []
    for p in points:
        old = sent.get(p.run, {}).get(p.key, {}).get(str(p.step))
        if old is None:
            new.append(p)
        elif old != p.value:
            changed.append(p)
    return new, changed


# ---------------------------------------------------------------------------------------------
# Trackers: one class each, registered in TRACKER_CLASSES


def require(module: str, extra: str) -> Any:
    """Import a tracker's package, or say in one line which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"publish: the {extra} tracker needs the package '{module}'; "
            f"install it with: pip install 'ckpteval[{extra}]'"
        ) from None


class Tracker:
    """A destination. `send` gets a run's points to send (new or changed) and all its current
    points, and the state it returned last time for that run; it returns the state to keep."""

    name: str

    def __init__(
        self, settings: Mapping[str, Any], prefix: str, trainer_names: bool = False
    ) -> None:
        self.settings = dict(settings)
        self.prefix = prefix
        self.trainer_names = trainer_names

    def target(self) -> dict[str, Any]:
        """What names the destination (and so the ledger)."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise a UserError for missing settings or package, before anything is sent."""

    def refuse(self, points: Sequence[Point]) -> None:
        """Raise a UserError for points this destination must not get, before anything is
        sent."""

    def failures(self) -> tuple[type[BaseException], ...]:
        """The tracker's own errors for what the user's setup causes (no login, no server, no
        permission): reported in one line, not as a traceback."""
        return ()

    def send(
        self, run: str, points: Sequence[Point], current: Sequence[Point], state: dict[str, Any]
    ) -> dict[str, Any]:
        raise NotImplementedError

    def _need(self, key: str) -> Any:
        value = self.settings.get(key)
        if value in (None, ""):
            raise UserError(
                f"config: publish.{self.name}.{key}: not set; set it in the config's publish "
                f"section or with --{self.name}-{key.replace('_', '-')}"
            )
        return value


class TensorBoard(Tracker):
    """Event files under `<logdir>/<run>/` (TensorBoard shows each directory as a run, so a
    training run logging to the same directory gets the eval curves beside its own). ckpteval's
    files end in `.ckpteval`; only those, and only ones it wrote, are ever deleted."""

    name = "tensorboard"

    def target(self) -> dict[str, Any]:
        target: dict[str, Any] = {"logdir": str(Path(self._need("logdir")).resolve())}
        if self.trainer_names:  # another directory per run: another destination, its own ledger
            target["runs"] = "<run>-eval"
        return target

    def run_dir(self, run: str) -> Path:
        """`<logdir>/<run>`; `<logdir>/<run>-eval` with the trainer's names, which the training
        run's own directory has already: TensorBoard merges a directory's files into one run,
        and a tag shown across runs is one chart, so beside the training run is where they
        belong."""
        return Path(self.target()["logdir"]) / (f"{run}-eval" if self.trainer_names else run)

    def check(self) -> None:
        self._need("logdir")
        require("tensorboard", "tensorboard")

    def send(
        self, run: str, points: Sequence[Point], current: Sequence[Point], state: dict[str, Any]
    ) -> dict[str, Any]:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        directory = self.run_dir(run)
        writer = EventFileWriter(str(directory), filename_suffix=".ckpteval")
        now = time.time()
        for p in sorted(current, key=lambda p: (p.step, p.key)):
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=p.key, simple_value=p.value)]
            )
            writer.add_event(event_pb2.Event(wall_time=now, step=p.step, summary=summary))
        writer.close()
        new_file = Path(writer._file_name).name  # noqa: SLF001 - the writer's only record of it
        for old in state.get("files", []):
            if old != new_file:
                (directory / old).unlink(missing_ok=True)
        return {"files": [new_file], "dir": str(directory)}


class MLflow(Tracker):
    """One MLflow run per ckpteval run in `experiment`, found again by its tag `ckpteval.run`
    (named `<run>-eval`). A `file:` store is used as given (MLflow 3 refuses it unless
    MLFLOW_ALLOW_FILE_STORE is set; ckpteval sets it for a file store the config names)."""

    name = "mlflow"

    def target(self) -> dict[str, Any]:
        return {
            "tracking_uri": str(self._need("tracking_uri")),
            "experiment": self.settings.get("experiment") or "ckpteval",
        }

    def check(self) -> None:
        self._need("tracking_uri")
        require("mlflow", "mlflow")

    def failures(self) -> tuple[type[BaseException], ...]:
        from mlflow.exceptions import MlflowException

        return (MlflowException, OSError)

    def client(self) -> Any:
        uri = str(self._need("tracking_uri"))
        probe_server(uri)
        if uri.startswith("file:") or "://" not in uri and ":" not in uri.split("/")[0]:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=uri)

    def run_id(self, client: Any, run: str, create: bool) -> str | None:
        """The MLflow run that holds `run`'s points (created if `create` and there is none)."""
        name = self.target()["experiment"]
        experiment = client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment is not None else client.create_experiment(name)
        )
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`ckpteval.run` = '{run}'", max_results=1
        )
        if found:
            return str(found[0].info.run_id)
        if not create:
            return None
        made = client.create_run(
            experiment_id, run_name=f"{run}-eval", tags={"ckpteval.run": run, "ckpteval": "eval"}
        )
        client.set_terminated(made.info.run_id)
        return str(made.info.run_id)

    def send(
        self, run: str, points: Sequence[Point], current: Sequence[Point], state: dict[str, Any]
    ) -> dict[str, Any]:
        from mlflow.entities import Metric

        client = self.client()
        run_id = self.run_id(client, run, create=True)
        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(p.key), p.value, now, p.step) for p in points]
        for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
            client.log_batch(run_id, metrics=metrics[start : start + 1000])
        return {"run_id": run_id}


#: Seconds a tracking server has to accept a connection before publish gives up on it.
PROBE_TIMEOUT = 10.0


def probe_server(uri: str, timeout: float = PROBE_TIMEOUT) -> None:
    """Fail fast on an http(s) tracking server that does not accept connections: MLflow's client
    retries a refused connection with backoff for minutes before it says so. Other URIs (file:,
    databases) are left to MLflow."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise OSError(f"cannot reach the tracking server {uri}: {reason}") from None


def mlflow_key(key: str) -> str:
    """MLflow allows only alphanumerics and `_-. :/` in a metric name: `pass@1` is `pass_at_1`.
    An interval bound is `<key>_ci_low` (not `<key>/ci_low`): MLflow's file store keeps a
    metric as a file named by its key, so `pass_at_1` cannot also be a directory."""
    for bound in INTERVAL_BOUNDS:
        if key.endswith(f"/{bound}"):
            key = f"{key[: -len(bound) - 1]}_{bound}"
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


class WandB(Tracker):
    """Into the training run itself when `run_ids` names its W&B id (resumed, `resume="allow"`),
    else into a sibling run `<run>-eval` (group `<run>`, a stable id derived from entity, project
    and run, so every publish lands in the same one). Points are logged against the custom step
    axis `<prefix>/train_step` (`define_metric`), which is what lets past steps in: W&B's own
    `_step` only grows."""

    name = "wandb"

    def target(self) -> dict[str, Any]:
        return {
            "project": str(self._need("project")),
            "entity": self.settings.get("entity"),
            "mode": self.settings.get("mode") or os.environ.get("WANDB_MODE") or "online",
        }

    def check(self) -> None:
        self._need("project")
        require("wandb", "wandb")

    def failures(self) -> tuple[type[BaseException], ...]:
        from wandb.errors import Error

        return (Error,)

    def run_id(self, run: str) -> tuple[str, bool]:
        """(W&B run id, whether it is the training run's own)."""
        given = (self.settings.get("run_ids") or {}).get(run)
        if given:
            return str(given), True
        target = self.target()
        return f"ckpteval-{sha256_json([target['entity'], target['project'], run])[:12]}", False

    def refuse(self, points: Sequence[Point]) -> None:
        """The training run itself already has its trainer's curve under those names: ckpteval's
        values there would interleave with it. They go to the sibling run instead."""
        given = self.settings.get("run_ids") or {}
        for run in sorted({p.run for p in points if p.trainer and p.run in given}):
            raise UserError(
                f"publish.trainer_names: run {run} publishes into its training run "
                f"(publish.wandb.run_ids.{run}), which has the trainer's own values under those "
                f"names; drop its run id to publish to the sibling run {run}-eval (same project, "
                f"group {run}), or drop publish.trainer_names"
            )

    def send(
        self, run: str, points: Sequence[Point], current: Sequence[Point], state: dict[str, Any]
    ) -> dict[str, Any]:
        wandb = require("wandb", "wandb")
        target = self.target()
        run_id, own = self.run_id(run)
        extra = {} if own else {"name": f"{run}-eval", "group": run, "job_type": "eval"}
        settings = wandb.Settings(
            console="off", silent=True, save_code=False, x_disable_stats=True, x_disable_meta=True
        )
        handle = wandb.init(
            project=target["project"],
            entity=target["entity"],
            id=run_id,
            resume="allow",
            mode=target["mode"],
            settings=settings,
            **extra,
        )
        try:
            step_key = f"{self.prefix}/train_step"
            handle.define_metric(step_key)
            handle.define_metric(f"{self.prefix}/*", step_metric=step_key)
            for key in sorted({p.key for p in current if p.trainer}):
                handle.define_metric(key, step_metric=step_key)
            by_step: dict[int, dict[str, float]] = {}
            for p in points:
                by_step.setdefault(p.step, {})[p.key] = p.value
            for step in sorted(by_step):
                handle.log({step_key: step, **by_step[step]})
            last: dict[str, Point] = {}
            for p in current:
                if p.key not in last or p.step >= last[p.key].step:
                    last[p.key] = p
            handle.summary.update({key: p.value for key, p in last.items()})
        finally:
            handle.finish()
        return {"run_id": run_id, "training_run": own}


TRACKER_CLASSES: dict[str, type[Tracker]] = {
    "wandb": WandB,
    "tensorboard": TensorBoard,
    "mlflow": MLflow,
}


# ---------------------------------------------------------------------------------------------
# Ledgers and the publish itself


def _slug(target: Mapping[str, Any]) -> str:
    words = "-".join(str(v) for v in target.values() if v not in (None, ""))
    readable = re.sub(r"[^A-Za-z0-9_.]+", "-", words).strip("-.")[-40:].strip("-.")
    return f"{readable}-{sha256_json(dict(target))[:8]}" if readable else sha256_json(target)[:8]


def ledger_path(summary: Path, tracker: Tracker) -> Path:
    return published_in(summary, f"{tracker.name}-{_slug(tracker.target())}")


def publish(
    summary: str | os.PathLike[str],
    settings: Mapping[str, Any],
    trackers: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Send the new or changed points of `summary/metrics.parquet` to each configured tracker
    (`settings` is the config's `publish` section; `trackers` limits which). Returns, and writes
    to `summary/published/<tracker>.json`, what each publish did."""
    summary = Path(summary)
    table = summary / "metrics.parquet"
    if not table.exists():
        raise UserError(f"{table}: no metrics table; run the aggregate step first")
    prefix = str(settings.get("prefix") or DEFAULT_PREFIX)
    chosen = [t for t in TRACKERS if settings.get(t) is not None]
    if trackers:
        unknown = sorted(set(trackers) - set(TRACKERS))
        if unknown:
            raise UserError(f"publish: unknown tracker {unknown[0]}; choose from {TRACKERS}")
        chosen = list(trackers)
    if not chosen:
        raise UserError(
            "config: publish: no tracker configured; add publish.wandb, publish.tensorboard or "
            "publish.mlflow (docs/publish.md)"
        )
    by_trainer = bool(settings.get("trainer_names"))
    instances = [TRACKER_CLASSES[t](settings.get(t) or {}, prefix, by_trainer) for t in chosen]
    for tracker in instances:
        tracker.check()
    import pandas as pd  # here, not at the top: every Snakefile parse imports this module

    names, notes = trainer_names(summary) if by_trainer else ({}, [])
    points, skipped = table_points(pd.read_parquet(table), prefix, names)
    notes += skipped
    for tracker in instances:
        tracker.refuse(points)
    reports = {}
    for tracker in instances:
        reports[tracker.name] = _publish_one(summary, tracker, points, notes)
    return reports


def _publish_one(
    summary: Path, tracker: Tracker, points: Sequence[Point], notes: Sequence[str]
) -> dict[str, Any]:
    path = ledger_path(summary, tracker)
    ledger = read_json(path) if path.exists() else {}
    sent: Sent = ledger.get("points", {})
    states: dict[str, dict[str, Any]] = ledger.get("runs", {})
    new, changed = pending(points, sent)
    runs = sorted({p.run for p in (*new, *changed)})
    for run in runs:
        todo = [p for p in (*new, *changed) if p.run == run]
        current = [p for p in points if p.run == run]
        try:
            states[run] = tracker.send(run, todo, current, states.get(run, {}))
        except tracker.failures() as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(
                f"publish: {tracker.name}: {first} (run {run}; the ledger {path.name} keeps "
                "what was sent before; publish again once fixed)"
            ) from None
        for p in todo:
            sent.setdefault(run, {}).setdefault(p.key, {})[str(p.step)] = p.value
        # After each run: a failure later leaves a ledger of exactly what was sent.
        write_json(
            path,
            {"tracker": tracker.name, "target": tracker.target(), "points": sent, "runs": states},
        )
    report = {
        "tracker": tracker.name,
        "target": tracker.target(),
        "ledger": path.name,
        "points": len(points),
        "new": len(new),
        "changed": len(changed),
        "unchanged": len(points) - len(new) - len(changed),
        "runs": {run: states[run] for run in sorted(states)},
        "notes": list(notes),
    }
    write_json(published_in(summary, tracker.name), report)
    return report


def merge_settings(config: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> dict:
    """The config's `publish` section with command-line `overrides` (`tracker.key -> value`,
    None for not given) laid over it."""
    merged: dict[str, Any] = {
        k: dict(v) if isinstance(v, Mapping) else v for k, v in (config or {}).items()
    }
    for dotted, value in overrides.items():
        if value is None:
            continue
        head, _, key = dotted.partition(".")
        if not key:
            merged[head] = value
            continue
        section = merged.get(head)
        section = dict(section) if isinstance(section, Mapping) else {}
        if isinstance(value, Mapping):
            value = {**(section.get(key) or {}), **value}
        section[key] = value
        merged[head] = section
    return merged


def format_report(reports: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per tracker (and one per note) for the terminal."""
    lines = []
    for name, r in reports.items():
        lines.append(
            f"{name}: {r['new']} new, {r['changed']} changed, {r['unchanged']} unchanged point(s) "
            f"of {r['points']} ({', '.join(f'{k}={v}' for k, v in r['target'].items() if v)})"
        )
    notes = next(iter(reports.values()))["notes"] if reports else []
    lines += [f"note: {n}" for n in notes]
    return lines


# ---------------------------------------------------------------------------------------------
# The `ckpteval publish` command

#: Command-line flag -> (publish setting it overrides, help).
_FLAGS: dict[str, tuple[str, str]] = {
    "--prefix": ("prefix", f"metric key prefix (default: {DEFAULT_PREFIX})"),
    "--wandb-project": ("wandb.project", "W&B project"),
    "--wandb-entity": ("wandb.entity", "W&B entity (team or user)"),
    "--wandb-mode": ("wandb.mode", "online or offline (default: WANDB_MODE, else online)"),
    "--tensorboard-logdir": ("tensorboard.logdir", "TensorBoard log directory"),
    "--mlflow-tracking-uri": ("mlflow.tracking_uri", "MLflow tracking URI (http://, file:, ...)"),
    "--mlflow-experiment": ("mlflow.experiment", "MLflow experiment (default: ckpteval)"),
}
#: Command-line switch -> (publish setting it sets, help).
_SWITCHES: dict[str, tuple[str, str]] = {
    "--trainer-names": (
        "trainer_names",
        "publish a metric the trainer logged too (runs.<run>.train_logs) under the trainer's "
        "name, beside its curve",
    ),
}


def add_publish_parser(subparsers: Any) -> Any:
    """`ckpteval publish`: the tidy table's points to W&B, TensorBoard, MLflow."""
    parser = subparsers.add_parser(
        "publish",
        help="send each checkpoint's metrics at its training step to W&B, TensorBoard, MLflow",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--configfile",
        type=Path,
        help="the workflow config: its publish section and outdir (default: config/config.yaml "
        "unless --summary is given)",
    )
    parser.add_argument(
        "--summary", type=Path, help="summary directory (default: <outdir>/summary)"
    )
    parser.add_argument(
        "--tracker",
        action="append",
        choices=TRACKERS,
        help="publish to this tracker only (repeatable; default: every configured one)",
    )
    for flag, (_, text) in _FLAGS.items():
        parser.add_argument(flag, help=text)
    for flag, (_, text) in _SWITCHES.items():
        parser.add_argument(flag, action="store_true", default=None, help=text)
    parser.add_argument(
        "--wandb-run-id",
        action="append",
        default=[],
        metavar="RUN=ID",
        help="log RUN into the existing W&B run ID (e.g. the training run; repeatable)",
    )
    parser.set_defaults(func=run_publish)
    return parser


def run_publish(args: Any) -> int:
    """Publish; print one line per tracker and one per skipped checkpoint."""
    config: dict[str, Any] = {}
    configfile = args.configfile or (None if args.summary else Path("config/config.yaml"))
    if configfile is not None:
        from ckpteval.config import load_config, validate_config

        config = load_config(configfile)
        validate_config(config)
    summary = args.summary or Path(Layout(config["outdir"]).summary_dir())
    overrides: dict[str, Any] = {
        setting: getattr(args, flag[2:].replace("-", "_"))
        for flag, (setting, _) in {**_FLAGS, **_SWITCHES}.items()
    }
    run_ids = {}
    for pair in args.wandb_run_id:
        run, sep, run_id = pair.partition("=")
        if not sep or not run or not run_id:
            raise UserError(f"--wandb-run-id {pair}: expected RUN=ID, e.g. demo=1a2b3c4d")
        run_ids[run] = run_id
    overrides["wandb.run_ids"] = run_ids or None
    settings = merge_settings(config.get("publish"), overrides)
    for line in format_report(publish(summary, settings, args.tracker)):
        print(line)
    return 0
