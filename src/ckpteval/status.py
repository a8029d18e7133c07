"""Progress of a sweep, read from the files: each expected cell is done, stale, running, failed or
missing.

A cell is (run, ckpt, task, variant). Its state is decided from the files alone, so it works while
Snakemake runs (locally or under Slurm), after it stopped, and from another shell:

- **done**: `scores/{run}/{ckpt}/{task}/{variant}.json` exists (it is written atomically, last).
- **running**: a temp file of one of its outputs (`.{name}.*.tmp`, as `ckpteval.io.atomic_open`
  makes them) was modified in the last `STALE_AFTER_S` seconds, or Snakemake marked one of the
  cell's outputs incomplete (`.snakemake/incomplete/`: its job started) and a running Snakemake
  holds a lock on it (`.snakemake/locks/*.output.lock`); an engine job's output is its done
  file, which stands for the cells its request file names. Locks count only while a Snakemake of
  this workflow is alive in the working directory (`claim_workdir`): a Snakemake killed with
  SIGKILL leaves its locks behind, and its started jobs then show as interrupted (its temp
  files too: an interrupted job's temp file is not a writer at work).
- **failed**: not done or running, and one of
  - the newest Snakemake log (`.snakemake/log/*.snakemake.log`) has an `Error in rule` block whose
    outputs concern the cell;
  - a job log concerning the cell ends with an error: its last non-empty line is a Python
    exception (`SomeError: ...`, `KeyboardInterrupt`), an `error:`/`fatal:` line (also Slurm's
    `slurmstepd: error: ... CANCELLED ...`) or `Killed`;
  - Snakemake's incomplete marker is there but no Snakemake holds the lock: the job was interrupted.
- **blocked**: its task's self-test (ckpteval.selftest) failed for the current configuration and
  has not passed since: the cell cannot be (re)scored, and its detail gives the self-test's line
  (and the score file kept from before, if there is one). Checked before everything else.
- **stale**: its score file is there, but the next run scores it again, for the reason its detail
  gives: a damaged cell, a changed scoring setting or reward function, generations to be
  (re)written or newer than the scores. The same decision the workflow's rules read
  (`ckpteval.freshness.Freshness.rescore_reason`), so `snakemake -n` plans exactly these cells
  (and the missing ones); or its job was interrupted after writing it (Snakemake's incomplete
  marker is there and no Snakemake is running: `--rerun-incomplete` scores it again).
- **missing**: none of the above (not started, or waiting for an upstream job).

Which files *concern* a cell: an output or log path whose parts after the step or rule directory
(`scores/`, `generations/`, `models/` under `outdir`; `logs/<rule>/`), with a `.json`, `.jsonl`,
`.log` or similar suffix dropped, are a prefix of (run, ckpt, task, variant) of length >= 2. So
`logs/infer/{run}/{ckpt}.log` (an engine job's round, `.r<N>`, left out) and `models/{run}/{ckpt}/`
concern every cell of that checkpoint,
`logs/evaluate/{run}/{ckpt}/{task}/{variant}.log` one cell.

Snakemake's working directory (for `.snakemake/`) and the logs directory default to the parent of
`outdir`, where the workflow keeps them (`results/` next to `logs/` and `.snakemake/`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import logging
import os
import re
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ckpteval.errored import errored_metrics, no_score
from ckpteval.errors import UserError
from ckpteval.freshness import Freshness
from ckpteval.io import json_or_none
from ckpteval.plan.layout import (
    CELL_STEPS,
    ROUND,
    CellKey,
    Layout,
    done_path,
    request_path,
    staging_of,
)

#: The config `status` reads when not told (`--configfile`), as Snakemake's profiles do.
DEFAULT_CONFIG = Path("config/config.yaml")
STATES = ("done", "stale", "running", "failed", "blocked", "missing")
CELL_COLUMNS = ["run", "ckpt", "step", "task", "variant", "state", "detail", "errors"]
STALE_AFTER_S = 600.0
_SUFFIXES = {".json", ".jsonl", ".log", ".txt", ".done", ".parquet", ".tmp"}
_TMP = re.compile(r"^\.(?P<name>.+)\.[^.]+\.tmp$")
_ERROR_LINE = re.compile(
    r"^(?:[\w.]*(?:Error|Exception|Interrupt)\b"  # a Python exception line ends a traceback
    r"|Killed\b"  # the kernel's OOM killer, as a shell reports it
    r"|.*\b(?:error|fatal)\s*:)",  # error: ..., ERROR: ..., slurmstepd: error: *** CANCELLED
    re.IGNORECASE,
)
_TAIL_BYTES = 4096
#: An engine job's round in its log's name (`{ckpt}.r3.log`: ckpteval.verbs).
_ROUND = re.compile(r"\.r[0-9]+$")

#: Held with a shared flock by every Snakemake process of this workflow in a working directory,
#: from parse time until it exits (`claim_workdir`). The kernel drops it when the process dies,
#: even of SIGKILL, so "nobody holds it" means "no Snakemake of ours is alive here".
OWNER_FILE = "ckpteval-owner.lock"

#: The names a file's path gives below a step or rule directory: a prefix (2 to 4 long) of a
#: cell's (run, ckpt, task, variant), so that a checkpoint's file concerns each of its cells.
Prefix = tuple[str, ...]
_owner_fd: int | None = None


def claim_workdir(snakemake_dir: Path = Path(".snakemake")) -> list[Path]:
    """Mark this process as a live Snakemake of the workflow, and remove stale Snakemake locks.

    Called at parse time by the main Snakemake process. Snakemake's own locks
    (`.snakemake/locks/`) carry no process id, so after a SIGKILL they stay and every later
    `snakemake` refuses to start until `--unlock`. Here the locks are removed only if no other
    live Snakemake holds the owner file; then this process holds it (shared) until it exits.
    Incomplete-output markers are kept: `--rerun-incomplete` redoes those jobs; the backups of
    their `update()` outputs (`.snakemake/backups/`) go, or the rerun could not start. Returns
    the lock files (and the backup directory) removed. On a filesystem that cannot lock,
    nothing is removed (Snakemake then asks for `--unlock` as usual).
    """
    global _owner_fd
    if _owner_fd is not None:
        return []
    try:
        snakemake_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(snakemake_dir / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return []
    removed: list[Path] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # another live Snakemake holds it: its locks are real
    else:
        for lock in sorted((snakemake_dir / "locks").glob("*.lock")):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
                removed.append(lock)
        # The backups of an interrupted job's `update()` outputs (rule summary): Snakemake
        # restores them only when the job fails while it runs, and backs a directory output up
        # with `copytree`, which refuses an existing one. Left by a Ctrl-C or SIGKILL, they made
        # every later run fail (FileExistsError: .snakemake/backups/.../summary/plots) before
        # the rerun of that job, which publishes the whole build again, could start.
        # (A finished job leaves only their empty parent directories: removed, not reported.)
        backups = snakemake_dir / "backups"
        if backups.is_dir():
            kept = any(files for _, _, files in os.walk(backups))
            shutil.rmtree(backups, ignore_errors=True)
            if kept:
                removed.append(backups)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while another process is cleaning up
    except OSError:
        os.close(fd)
        return removed
    _owner_fd = fd
    return removed


#: What Snakemake's dry run prints when another Snakemake holds locks on its files
#: (`Persistence.lock_warn_only`), before it plans as usual and exits 0.
SNAKEMAKE_LOCKED_LINE = "Error: Directory cannot be locked. Another Snakemake instance is running."
#: What a dry run beside a live sweep says instead: nothing is wrong.
LIVE_SWEEP_LINE = (
    "ckpteval: another Snakemake is running in this directory: this dry run shows the plan as of "
    "now (it locks nothing and changes no file)"
)


class _LiveSweepLine(logging.Filter):
    """Rewrites Snakemake's "Error:" line of a dry run beside a live sweep (`LIVE_SWEEP_LINE`):
    a user, or a script that greps for "Error", must not read a correct plan as a failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() == SNAKEMAKE_LOCKED_LINE:
            record.msg, record.args = LIVE_SWEEP_LINE, ()
        return True


def say_live_sweep_plainly() -> None:
    """Install `_LiveSweepLine` on Snakemake's logger (the workflow's parse, main process)."""
    from snakemake.logging import logger

    if not any(isinstance(f, _LiveSweepLine) for f in logger.filters):
        logger.addFilter(_LiveSweepLine())


def snakemake_alive(snakemake_dir: Path) -> bool:
    """Whether a Snakemake of this workflow holds the working directory (see `claim_workdir`).

    Without an owner file (a Snakemake older than `claim_workdir`, or none ever ran), its locks
    are taken at their word.
    """
    path = snakemake_dir / OWNER_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return any((snakemake_dir / "locks").glob("*.lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock, if it got one
    return False


def cell_states(
    outdir: Path,
    expected: Mapping[CellKey, int | None],
    *,
    workdir: Path | None = None,
    logdir: Path | None = None,
    now: float | None = None,
    blocked: Mapping[str, str] | None = None,
    rescore: Callable[[CellKey, Any], str | None] | None = None,
) -> pd.DataFrame:
    """One row per expected cell (`expected`: each with its checkpoint's step, as
    `Plan.cell_steps`): run, ckpt, step, task, variant, state, detail (why). `blocked` maps a task whose self-test failed to its line (`ckpteval.selftest.blocked_tasks`);
    `rescore(key, cell)` says why a cell with a score file (`cell`, as read here) is scored again by the next run, or None (`ckpteval.freshness.Freshness.rescore_reason`)."""
    outdir = Path(outdir).resolve()
    workdir = Path(workdir).resolve() if workdir else outdir.parent
    logdir = Path(logdir).resolve() if logdir else outdir.parent / "logs"
    now = time.time() if now is None else now
    evidence = _Evidence.collect(outdir, workdir, logdir, now)
    layout = Layout(str(outdir))
    rows = []
    for key, step in expected.items():
        state, detail = evidence.state(layout, key)
        score = detail if state == "done" else None
        # One read of a done cell: its errored samples and its freshness.
        record = json_or_none(detail) if state == "done" else None
        if state == "done" and rescore is not None and (why := rescore(key, record)):
            state, detail = "stale", why
        if state == "done" and (
            why := evidence.interrupted_scores.get((key.run, key.ckpt, key.task, key.variant))
        ):
            state, detail = "stale", why
        if blocked and key.task in blocked:
            # A blocked self-test holds back the rescoring a stale cell waits for: its scores stay.
            kept = f"; scores kept from before: {score}" if score else ""
            state, detail = "blocked", blocked[key.task] + kept
        errors = _errored_samples(record) if state == "done" else None
        if errors:
            detail += f": {errors[1]}"
        rows.append(
            {
                "run": key.run,
                "ckpt": key.ckpt,
                "step": step,
                "task": key.task,
                "variant": key.variant,
                "state": state,
                "detail": detail,
                "errors": errors[0] if errors else 0,
            }
        )
    return pd.DataFrame(rows, columns=CELL_COLUMNS).astype({"step": "Int64", "errors": "Int64"})


def _errored_samples(cell: Any) -> tuple[int, str] | None:
    """The samples of a done cell its reward function gave no score (its `reward_error_rate`,
    ckpteval.evaluate) and the words saying how many of all, and what each of its numbers does
    with them (`ckpteval.errored`, its primary metric first), else None: such a cell is done but
    marked."""
    try:
        metrics = cell["metrics"]
        counts = no_score(metrics)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not counts or not counts[0]:
        return None
    numbers = sorted(
        errored_metrics(metrics).items(), key=lambda item: item[0] != cell.get("primary_metric")
    )
    head = f"the reward function gave no score for {counts[0]} of {counts[1]} samples"
    return counts[0], ". ".join([head, *(e.words(metric) for metric, e in numbers)])


def status_matrix(
    outdir: Path,
    expected: Mapping[CellKey, int | None],
    *,
    workdir: Path | None = None,
    logdir: Path | None = None,
) -> pd.DataFrame:
    """Checkpoint x task: rows indexed by (run, ckpt) in the order given, a column per task, each
    entry the state of its variants taken together (failed > blocked > running > missing >
    stale > done)."""
    return matrix_from_cells(cell_states(outdir, expected, workdir=workdir, logdir=logdir))


def matrix_from_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Fold variants into one state per (run, ckpt, task); see `status_matrix`."""
    rank = {"failed": 0, "blocked": 1, "running": 2, "missing": 3, "stale": 4, "done": 5}
    worst = (
        cells.assign(rank=cells["state"].map(rank))
        .groupby(["run", "ckpt", "task"], sort=False)["rank"]
        .min()
    )
    matrix = worst.map({v: k for k, v in rank.items()}).unstack("task")
    order = list(dict.fromkeys(zip(cells["run"], cells["ckpt"])))
    tasks = list(dict.fromkeys(cells["task"]))
    return matrix.reindex(
        index=pd.MultiIndex.from_tuples(order, names=["run", "ckpt"]), columns=tasks
    )


def format_status(cells: pd.DataFrame, *, max_failed: int = 20) -> str:
    """The printable matrix (with `k/n` done when variants differ), totals, and why cells failed."""
    if cells.empty:
        return "No cells expected: the config lists no checkpoints or tasks."
    matrix = matrix_from_cells(cells)
    done = (
        cells.assign(d=cells["state"] == "done")
        .groupby(["run", "ckpt", "task"], sort=False)["d"]
        .agg(["sum", "size"])
    )
    steps = cells.drop_duplicates(["run", "ckpt"]).set_index(["run", "ckpt"])["step"]
    errors = (
        cells["errors"].fillna(0) > 0 if "errors" in cells else cells["state"] != cells["state"]
    )
    flagged = errors.groupby([cells["run"], cells["ckpt"], cells["task"]], sort=False).any()
    # Plain dicts and lists for the loop below: a pandas lookup per (checkpoint, task) took
    # ~0.6 ms, and a row of `iterrows` or a lookup per checkpoint ~0.2 ms at 1,000 checkpoints.
    done_of = {key: (int(d), int(n)) for key, d, n in zip(done.index, done["sum"], done["size"])}
    flagged_of = {key: bool(v) for key, v in flagged.items()}
    step_of = dict(steps.items())
    tasks = list(matrix.columns)
    header = ["checkpoint", *tasks]
    body = []
    for (run, ckpt), states in zip(matrix.index, matrix.to_numpy(dtype=object).tolist()):
        step = step_of.get((run, ckpt))
        label = f"{run}/{ckpt}" + ("" if pd.isna(step) else f" ({step})")
        entries = []
        for task, state in zip(tasks, states):
            n_done, n = done_of[(run, ckpt, task)]
            text = state.upper() if state in ("failed", "blocked") else state
            text += "*" if flagged_of.get((run, ckpt, task)) else ""
            entries.append(text if n_done in (0, n) else f"{text} {n_done}/{n}")
        body.append([label, *entries])
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *body]]
    counts = cells["state"].value_counts()
    # blocked and stale: rare, said if any
    shown = [s for s in STATES if s not in ("blocked", "stale") or counts.get(s)]
    lines += ["", ", ".join(f"{counts.get(s, 0)} {s}" for s in shown) + f" ({len(cells)} cells)"]
    lines += _listed(cells[cells["state"] == "failed"], "failed:", max_failed)
    lines += _listed(cells[cells["state"] == "blocked"], "blocked:", max_failed)
    heading = "stale (the next run scores them again):"
    lines += _listed(cells[cells["state"] == "stale"], heading, max_failed)
    heading = "* done, with errored samples (what each number does with them):"
    lines += _listed(cells[errors], heading, max_failed)
    return "\n".join(lines)


def _listed(cells: Any, heading: str, most: int) -> list[str]:
    """A section of the matrix's text: `heading`, then one line per cell (its detail), at most
    `most` of them; nothing for no cells."""
    if not len(cells):
        return []
    lines = ["", heading]
    for _, row in cells.head(most).iterrows():
        lines.append(
            f"  {row['run']}/{row['ckpt']}/{row['task']}/{row['variant']}: {row['detail']}"
        )
    if len(cells) > most:
        lines.append(f"  ... and {len(cells) - most} more")
    return lines


# ---------------------------------------------------------------------------------------------
# Evidence from the files


class _Evidence:
    """What the files say, indexed by the (run, ckpt[, task[, variant]]) prefixes they concern."""

    def __init__(self) -> None:
        self.running: dict[Prefix, str] = {}
        self.failed: dict[Prefix, str] = {}
        #: Score cells an interrupted job wrote whole but Snakemake marked incomplete: the next
        #: run (`--rerun-incomplete`) scores them again.
        self.interrupted_scores: dict[Prefix, str] = {}
        self.job_logs: dict[Prefix, list[Path]] = defaultdict(list)

    @classmethod
    def collect(cls, outdir: Path, workdir: Path, logdir: Path, now: float) -> _Evidence:
        ev = cls()
        temps: list[tuple[Prefix, Path]] = []
        for step in CELL_STEPS:
            for tmp in _walk(outdir / step, hidden=True):
                match = _TMP.match(tmp.name)
                if match and now - _mtime(tmp) < STALE_AFTER_S:
                    temps.append(
                        (_key(tmp.with_name(match["name"]).relative_to(outdir / step)), tmp)
                    )
        for log in _walk(logdir):
            rel = log.relative_to(logdir)
            if len(rel.parts) >= 3:  # <rule>/<run>/<ckpt>...
                key = _key(Path(*rel.parts[1:]))
                ev.job_logs[(*key[:-1], _ROUND.sub("", key[-1]))].append(log)
        snakemake_dir = workdir / ".snakemake"
        locked = (
            set(_locked_outputs(snakemake_dir, workdir))
            if snakemake_alive(snakemake_dir)
            else set()
        )
        for path in _incomplete_outputs(snakemake_dir, workdir):
            own = _output_key(outdir, path)
            for key in [own] if own is not None else _engine_cells(outdir, path):
                if path in locked:
                    ev.running.setdefault(key, f"Snakemake job running for {path}")
                else:
                    ev.failed.setdefault(
                        key,
                        f"interrupted: {path} is marked incomplete by Snakemake "
                        "but no Snakemake is running",
                    )
                    if own is not None and _in_step(outdir, path, "scores"):
                        ev.interrupted_scores.setdefault(
                            key,
                            f"interrupted: {path} is marked incomplete by Snakemake "
                            "(the next run scores it again)",
                        )
        # A recent temp file is a writer at work, unless its job was interrupted: a killed job
        # leaves its temp file, which must not read as running while no Snakemake is alive.
        for key, tmp in temps:
            if key not in ev.failed:
                ev.running.setdefault(key, f"writing {tmp}")
        for outputs, detail in _snakemake_errors(snakemake_dir):
            for output in outputs:
                path = Path(output) if Path(output).is_absolute() else workdir / output
                key = _output_key(outdir, path)
                if key is not None:
                    ev.failed.setdefault(key, detail)
        return ev

    def state(self, layout: Layout, cell: CellKey) -> tuple[str, str]:
        score = layout.score(cell)
        if os.path.exists(score):
            return "done", score
        whole = (cell.run, cell.ckpt, cell.task, cell.variant)
        prefixes = [whole[:n] for n in (4, 3, 2)]
        for prefix in prefixes:
            if prefix in self.running:
                return "running", self.running[prefix]
        for prefix in prefixes:
            if prefix in self.failed:
                return "failed", self.failed[prefix]
        for prefix in prefixes:
            for log in self.job_logs.get(prefix, ()):
                line = _last_line(log)
                if line is not None and _ERROR_LINE.match(line):
                    return "failed", f"{log}: {line[:400]}"
        return "missing", ""


def _walk(root: Path, *, hidden: bool = False) -> Iterable[Path]:
    """Regular files under `root` (none if it does not exist); dot-files only when `hidden`.
    One `scandir` per directory, whose entries know their type: `os.walk` also stats each
    subdirectory to skip links and lists every name, ~13,000 directories at 20,000 cells."""
    stack = [os.fspath(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                if entry.is_dir():
                    if not entry.is_symlink():  # as os.walk: a linked directory is not entered
                        stack.append(entry.path)
                elif hidden == entry.name.startswith("."):
                    yield Path(entry.path)


def _key(rel: Path) -> Prefix:
    """Path parts after the step/rule directory, the last one without a known file suffix."""
    parts = list(rel.parts)
    suffix = Path(parts[-1]).suffix
    if suffix in _SUFFIXES:
        parts[-1] = parts[-1][: -len(suffix)]
    return tuple(parts)


def _in_step(outdir: Path, path: Path, step: str) -> bool:
    """Whether `path` is under `outdir/<step>/`."""
    try:
        return path.resolve().relative_to(outdir).parts[0] == step
    except (ValueError, IndexError):
        return False


def _output_key(outdir: Path, path: Path) -> Prefix | None:
    """The key of an output path under `outdir/<step>/`, or None for other paths."""
    try:
        rel = path.resolve().relative_to(outdir)
    except ValueError:
        return None
    if len(rel.parts) < 3 or rel.parts[0] not in CELL_STEPS:
        return None
    return _key(Path(*rel.parts[1:]))


def _engine_cells(outdir: Path, path: Path) -> list[Prefix]:
    """The cells an engine job's output stands for. Its only output is a done file beside its
    staging directory (`staging/{run}/{ckpt}/{group}.r<N>.done`), so while it generates, its
    cells' own files do not exist yet; its request file beside it (written when the run starts)
    names them, and without one every cell of the checkpoint is concerned."""
    try:
        rel = path.resolve().relative_to(outdir)
    except ValueError:
        return []
    round_ = ROUND.match(rel.name)
    if (
        len(rel.parts) != 4
        or round_ is None
        or path != done_path(staging_of(path), round_["token"])
    ):
        return []
    run, ckpt = rel.parts[1:3]
    if Path(Layout(str(outdir)).staging(run, ckpt)).resolve() != path.parent:
        return []
    request = json_or_none(request_path(staging_of(path), round_["token"]))
    cells = request.get("cells") if isinstance(request, dict) else None
    if not isinstance(cells, list) or not cells:
        return [(run, ckpt)]
    return [
        (run, ckpt, str(c["task"]), str(c["variant"]))
        for c in cells
        if isinstance(c, dict) and "task" in c and "variant" in c
    ] or [(run, ckpt)]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # renamed into place while we looked
        return 0.0


def _incomplete_outputs(snakemake_dir: Path, workdir: Path) -> list[Path]:
    """Outputs Snakemake marked incomplete: file names under `incomplete/` are the urlsafe-base64
    of the output path, split into `@`-prefixed directories when longer than a file name."""
    root = snakemake_dir / "incomplete"
    out = []
    for marker in _walk(root):
        rel = marker.relative_to(root)
        encoded = "".join(p.removeprefix("@") for p in rel.parts)
        try:
            name = base64.urlsafe_b64decode(encoded).decode()
        except (ValueError, UnicodeDecodeError):
            continue  # not a marker (e.g. "migration_underway")
        out.append(_absolute(name, workdir))
    return out


def _locked_outputs(snakemake_dir: Path, workdir: Path) -> Iterable[Path]:
    """Outputs a running Snakemake has locked (`locks/N.output.lock`, one path per line)."""
    for lock in sorted((snakemake_dir / "locks").glob("*.output.lock")):
        try:
            text = lock.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            if line.strip():
                yield _absolute(line.strip(), workdir)


def _snakemake_errors(snakemake_dir: Path) -> list[tuple[list[str], str]]:
    """(outputs, detail) of each `Error in rule` block in the newest Snakemake log."""
    logs = sorted((snakemake_dir / "log").glob("*.snakemake.log"), key=_mtime)
    if not logs:
        return []
    newest = logs[-1]
    try:
        lines = newest.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    errors = []
    for i, line in enumerate(lines):
        match = re.match(r"\s*Error in rule (\S+?):?(?:,|$)", line)
        if not match:
            continue
        outputs: list[str] = []
        logs_of_job = ""
        for item in lines[i + 1 : i + 40]:
            field = re.match(r"\s+(output|log): (.*)", item)
            if field and field[1] == "output":
                outputs = [o.strip() for o in field[2].split(",") if o.strip()]
            elif field:
                logs_of_job = field[2].split(" (check log")[0]
            elif not item.startswith(" ") or item.startswith("Error in rule"):
                break
        detail = f"rule {match[1]} failed (see {logs_of_job or newest})"
        errors.append((outputs, detail))
    return errors


def _last_line(path: Path) -> str | None:
    """The last non-empty line of a file, read from its tail; None if unreadable or empty."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - _TAIL_BYTES))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _absolute(name: str, workdir: Path) -> Path:
    path = Path(name)
    return (path if path.is_absolute() else workdir / path).resolve()


# ---------------------------------------------------------------------------------------------
# Command line


def add_status_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`ckpteval status`: the progress matrix of the sweep a config describes."""
    parser = subparsers.add_parser(
        "status",
        help="progress of a sweep: checkpoint x task, done/running/failed/missing",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--configfile",
        type=Path,
        default=DEFAULT_CONFIG,
        help="the workflow config (default: %(default)s)",
    )
    parser.add_argument("--outdir", type=Path, help="results directory (default: the config's)")
    parser.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="redraw every SECONDS until every cell is done or failed",
    )
    parser.set_defaults(func=run_status)
    return parser


def run_status(args: argparse.Namespace) -> int:
    """Print the matrix; exit status 1 if any cell failed or is blocked, else 0."""
    expected, outdir, broken, waiting, plan = _expected_cells(args.configfile)
    outdir = args.outdir or outdir
    workdir = _snakemake_workdir(Path(outdir))
    while True:
        # A new Freshness each round: it memoizes what it read, and a watched sweep moves on.
        rescore = Freshness(plan, outdir).rescore_reason
        cells = cell_states(
            outdir,
            expected,
            workdir=workdir,
            logdir=workdir / "logs",
            blocked=_blocked(plan, outdir),
            rescore=rescore,
        )
        text = format_status(cells) + "".join(f"\nwarning: {line}" for line in broken)
        text += "".join(f"\n{line}" for line in waiting)
        if args.watch:
            sys.stdout.write("\033[H\033[J")  # clear the terminal, like `watch`
        print(text, flush=True)
        settled = cells["state"].isin(["done", "failed", "blocked"]).all()
        stuck = cells["state"].isin(["failed", "blocked"]).any()
        if not args.watch or settled:
            return 1 if stuck else 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 1 if stuck else 0


def _snakemake_workdir(outdir: Path) -> Path:
    """Where Snakemake keeps `.snakemake/` and the rules write `logs/`: the directory it runs in.
    That is the current one when it holds a `.snakemake/` (status is run where snakemake is, as
    the README shows, and an absolute `outdir` may be anywhere: its parent then holds neither),
    else `outdir`'s parent (`results/` beside them)."""
    here = Path.cwd()
    return here if (here / ".snakemake").is_dir() else outdir.resolve().parent


def _blocked(plan: Any, outdir: Path) -> dict[str, str]:
    """The plan's tasks whose self-test failed, looked up under `outdir` (`--outdir`)."""
    from ckpteval.selftest import blocked_tasks

    return blocked_tasks(plan, Path(outdir))


def _expected_cells(
    configfile: Path,
) -> tuple[Mapping[CellKey, int], Path, list[str], list[str], Any]:
    """The cells a config asks for, its outdir (relative paths resolve against the cwd, as in
    the workflow), a warning line per task left out (`Plan.left_out`) and per checkpoint that
    looks broken, and one per checkpoint being written (read once: its age in the line is as
    of the start)."""
    from ckpteval.config import build_plan, load_config, validate_config

    if not configfile.exists():
        hint = "" if configfile != DEFAULT_CONFIG else "; pass --configfile"
        raise UserError(f"{configfile}: config file not found{hint}")
    config = load_config(configfile)
    validate_config(config)
    plan = build_plan(config)
    broken = [*plan.left_out, *plan.broken_lines()]
    return plan.cell_steps, Path(plan.outdir), broken, plan.waiting_lines(), plan
