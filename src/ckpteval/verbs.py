"""Which cells an engine job writes, so that every Snakemake verb plans a chain that can run.

A checkpoint's generations come from two rules. The engine job (`infer`, `infer_<group>`,
`endpoint`, ...) loads the model once and writes the cells of its engine group into a staging
directory; rule `generation`, one job per cell, moves a cell's file into place. Snakemake must be
able to plan either by its own file graph, for every verb (`-f`, `-R`, `-F`, `--until`, a deleted
file), without rerunning the neighbours of a cell the engine job rewrites. That is done with one
marker file per cell, an output of the engine job and an `ancient()` input of the cell's job:

- A marker exists exactly when its cell needs no generation. Snakemake then never propagates an
  engine job's rerun to that cell (an existing `ancient()` input is not a reason to rerun), so the
  cell's file, its scores and the summary stay as they are.
- A cell that must be (re)generated has no marker. Its generation job, once planned (a missing
  output, a changed identity, a forced file or rule), finds its input missing and so plans the
  engine job: the chain always runs, never a job whose outputs cannot be made.
- The engine job reads which cells to generate from its request file (an `ancient()` input:
  writing it never plans anything) and writes every marker of its group.

`Verbs` is what Snakemake was told to redo, read from its DAG settings when the input functions
run in the main process; `requested` adds it to what the files say is stale
(ckpteval.freshness). `sync_markers` makes the markers and the request file agree with that. If
the engine rule itself is forced (`-R infer`), the cells' marker inputs are plain inputs instead,
so that Snakemake reruns every cell after it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.contract import generation_identity
from ckpteval.errors import UserError
from ckpteval.freshness import DAMAGED, Freshness, StaleCell
from ckpteval.io import read_json, write_json

#: The per-cell rule, and the rules whose rerun rewrites a checkpoint's model.
CELL_RULE = "generation"
MODEL_RULES = ("consolidate", "model_card")


@dataclass(frozen=True)
class Verbs:
    """What this Snakemake invocation forces: every job, some rules, some files."""

    forceall: bool = False
    rules: frozenset[str] = frozenset()
    files: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: Any, rule_names: Iterable[str]) -> Verbs:
        """From Snakemake's DAGSettings (None before the DAG is built: nothing forced)."""
        if settings is None:
            return cls()
        names = set(rule_names)
        items = [*settings.forcerun, *(settings.targets if settings.forcetargets else ())]
        return cls(
            forceall=bool(settings.forceall),
            rules=frozenset(i for i in items if i in names),
            files=frozenset(_norm(i) for i in items if i not in names),
        )

    def forces_rule(self, *names: str) -> bool:
        return self.forceall or not self.rules.isdisjoint(names)

    def forces_file(self, *paths: str | os.PathLike[str]) -> bool:
        return not self.files.isdisjoint(_norm(p) for p in paths)


def _norm(path: str | os.PathLike[str]) -> str:
    return os.path.normpath(os.path.abspath(path))


def marker_path(staging: Path, task: str, variant: str) -> Path:
    return staging / task / f"{variant}.ok"


def staged_paths(staging: Path, task: str, variant: str) -> tuple[Path, Path]:
    """Where an engine job writes a cell's generation file and meta."""
    base = staging / task / variant
    return base.with_suffix(".jsonl"), base.with_suffix(".meta.json")


def requested(
    fresh: Freshness,
    run: str,
    ckpt: str,
    pairs: Sequence[tuple[str, str]],
    verbs: Verbs,
    engine_rule: str,
) -> list[StaleCell]:
    """The cells of one engine job that a run of the workflow will (re)generate: stale on disk,
    older than their model, or forced by a verb."""
    out = Path(fresh.plan.outdir)
    model = out / "models" / run / ckpt
    model_forced = verbs.forces_rule(*MODEL_RULES) or verbs.forces_file(model, f"{model}.json")
    cells = []
    for task, variant in pairs:
        stale = fresh.stale(run, ckpt, task, variant)
        jsonl, meta = fresh.generation_paths(run, ckpt, task, variant)
        reason = stale.reason if stale else None
        if reason is None and (
            model_forced
            or verbs.forces_rule(CELL_RULE, engine_rule)
            or verbs.forces_file(jsonl, meta)
        ):
            reason = "forced"
        if reason is None and _older(jsonl, fresh.manifest_path(run, ckpt)):
            reason = "older than its model"
        if reason is not None:
            identity = generation_identity(fresh.plan, run, task, variant)
            cells.append(StaleCell(task, variant, identity, reason))
    return cells


def _older(path: Path, than: Path) -> bool:
    try:
        return path.stat().st_mtime < than.stat().st_mtime
    except OSError:
        return False


def drop_damaged(fresh: Freshness, run: str, ckpt: str, cells: Sequence[StaleCell]) -> None:
    """Remove the files of damaged cells (a truncated generation file, an unreadable meta):
    Snakemake sees only that a file exists, so it would otherwise never regenerate them."""
    for cell in cells:
        if cell.reason == DAMAGED:
            for path in fresh.generation_paths(run, ckpt, cell.task, cell.variant):
                path.unlink(missing_ok=True)


def drop_damaged_json(*paths: Path) -> list[Path]:
    """Remove a result whose JSON file does not parse (a truncated copy), with the files written
    beside it: Snakemake would take it for finished. Returns what was removed."""
    damaged = [p for p in paths[:1] if p.exists() and _unreadable(p)]
    if damaged or (paths[0].exists() and not all(p.exists() for p in paths[1:])):
        for path in paths:
            path.unlink(missing_ok=True)
        return list(paths)
    return []


def _unreadable(path: Path) -> bool:
    try:
        return not isinstance(read_json(path), dict)
    except (UserError, OSError, ValueError):
        return True


def sync_markers(
    staging: Path,
    request: Path,
    pairs: Sequence[tuple[str, str]],
    cells: Sequence[StaleCell],
    invocation: str = "",
    payload: dict[str, Any] | None = None,
) -> None:
    """Make the staging markers and the request file say what `cells` says: no marker for a
    cell to generate, a marker for every other cell; the request lists the first kind, with
    the invocation that asked (an engine job chains only to requests of its own invocation:
    ckpteval.chain) and `payload`, what the engine job builds its cells from besides their
    identities (ckpteval.jobs.engine_payload)."""
    wanted = {(c.task, c.variant) for c in cells}
    for task, variant in pairs:
        marker = marker_path(staging, task, variant)
        if (task, variant) in wanted:
            marker.unlink(missing_ok=True)
        elif not marker.exists():
            write_marker(marker, generated=False)
    # An empty request names no invocation: it is not rewritten by every parse.
    body = {
        "invocation": invocation if cells else "",
        "cells": [_request_cell(c) for c in cells],
        **(payload or {}),
    }
    if not request.exists() or _read_body(request) != body:
        write_json(request, body)


def _request_cell(cell: StaleCell) -> dict[str, Any]:
    return {
        "task": cell.task,
        "variant": cell.variant,
        "reason": cell.reason,
        "record": cell.identity.record(),
    }


def _read_body(path: Path) -> Any:
    try:
        return read_json(path)
    except UserError:
        return None


def read_request(path: Path, *, strict: bool = False) -> list[dict[str, Any]]:
    """The cells a request file lists; one that does not parse lists none, or, if `strict`
    (the engine job reading it), is a UserError naming it."""
    return read_request_body(path, strict=strict)["cells"]


def read_request_body(path: Path, *, strict: bool = False) -> dict[str, Any]:
    """A request file as a whole (its cells, invocation and what the engine job builds them
    from); one that does not parse has no cells, or, if `strict`, is a UserError naming it."""
    try:
        body = read_json(path)
    except (UserError, OSError, ValueError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("cells"), list):
        return body
    if strict:
        raise UserError(
            f"{path}: not a request file; run the workflow again (the parse rewrites it)"
        )
    return {"cells": []}


def write_marker(path: Path, *, generated: bool) -> None:
    """A cell's marker: its presence is what counts; the body says what the engine job did."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"generated": generated})
