"""What Snakemake's verbs (-f, -R, -F, --until, a deleted or damaged file) mean for an engine
job: which cells it (re)generates in this invocation, its round token, request and done files,
so that every verb plans a chain that can run while planning writes nothing.

A checkpoint's generations come from two rules. The engine job (`infer`, `infer_<group>`,
`endpoint`, ...) loads the model once and writes the cells of its engine group into a staging
directory; rule `generation`, one job per cell, moves a cell's file into place. Snakemake must be
able to plan either by its own file graph, for every verb (`-f`, `-R`, `-F`, `--until`, a deleted
or damaged file), without rerunning the neighbours of a cell the engine job rewrites, and without
the parse creating, moving or deleting any file (a dry run beside a running sweep, a Slurm job's
own parse). That is done with one *round* per engine job:

- When the workflow is parsed, each engine job gets a round token `r<N>`, one more than any round
  its checkpoint's staging directory holds (`next_round`: one directory listing per checkpoint).
  Its output is `staging/{run}/{ckpt}/{group}.r<N>.done`, a file that does not exist yet.
- A cell this invocation (re)generates (`requested`: stale on disk, damaged, or forced by a verb,
  every cell when the engine rule itself is forced) has that done file as an input of its
  generation job; every other cell has no edge to the engine job. A planned generation job finds
  its input missing and so plans the engine job; an engine job that runs reruns exactly the
  requested cells, so its neighbours' files, scores and the summary stay as they are. (An
  `ancient()` input would not do: Snakemake holds back a rerun only for ancient files that
  exist.)
- The done files of engine jobs with requested cells are targets of `all`: a cell Snakemake
  would not redo by itself (a truncated generation file, a meta that does not parse, a file made
  by another model) is redone through its engine job, and nothing deletes it first.
- Which cells an engine job generates is written to its request file
  (`{group}.r<N>.request.json`) when the run starts (`onstart`, under Snakemake's lock, never in a
  dry run), for the engine jobs Snakemake will run. The engine job reads it; its siblings read it
  to chain (ckpteval.engine.chain).

`Verbs` is what Snakemake was told to redo, read from its DAG settings when the input functions
run; `requested` adds it to what the files say is stale (ckpteval.freshness).

A damaged score cell or model card (a JSON file that does not parse, a score cell without its
samples file) is redone the same way, without being removed: its job gets a *redo* input
(`staging/redo/<key>`, named by the damaged file's path, size and mtime, so it never exists at
parse time) made by the trivial rule `redo`, which `all` asks for.
"""

from __future__ import annotations

import os
from base64 import urlsafe_b64encode
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError
from ckpteval.freshness import Freshness, StaleCell
from ckpteval.io import read_json, sha256_json, write_json
from ckpteval.plan.layout import ROUND, CellKey

#: The per-cell rule.
CELL_RULE = "generation"


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
        # Nothing forced by file (the usual case): no path to normalize, asked once per cell.
        return bool(self.files) and not self.files.isdisjoint(_norm(p) for p in paths)


def _norm(path: str | os.PathLike[str]) -> str:
    return os.path.normpath(os.path.abspath(path))


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
    model = Path(fresh.layout.model_dir(run, ckpt))
    # The rule whose rerun rewrites this run's model: consolidate for a run with weights,
    # model_card for a weightless one (openai, replay); forcing the other leaves its cells alone.
    model_rule = "consolidate" if fresh.plan.runs[run].backend == "vllm" else "model_card"
    model_forced = verbs.forces_rule(model_rule) or verbs.forces_file(model, f"{model}.json")
    cells = []
    for task, variant in pairs:
        cell = CellKey(run, ckpt, task, variant)
        stale = fresh.stale(cell)
        jsonl = Path(fresh.layout.generation(cell))
        meta = Path(fresh.layout.generation_meta(cell))
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
            identity = fresh.generation_identity(run, task, variant)
            cells.append(StaleCell(cell, identity, reason))
    return cells


def _older(path: Path, than: Path) -> bool:
    try:
        return path.stat().st_mtime < than.stat().st_mtime
    except OSError:
        return False


def _unreadable(path: Path) -> bool:
    try:
        return not isinstance(read_json(path), dict)
    except (UserError, OSError, ValueError):
        return True


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
            f"{path}: not a request file; run the workflow again (a run writes it when it starts)"
        )
    return {"cells": []}


def next_round(names: Iterable[str], group_dir: str) -> str:
    """The round token of a checkpoint's engine job of `group_dir`, given the names in its
    staging directory: one more than any round there, so its done file does not exist."""
    rounds = [
        int(m["token"][1:])
        for name in names
        if (m := ROUND.match(name)) is not None and m["group"] == group_dir
    ]
    return f"r{max(rounds, default=0) + 1}"


def request_body(
    cells: Sequence[StaleCell], invocation: str, payload: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An engine job's request: the cells it generates with their identities, the invocation
    that asked (an engine job chains only to requests of its own invocation: ckpteval.engine.chain)
    and `payload`, what the engine job builds its cells from besides their identities
    (ckpteval.contract.engine_payload)."""
    return {
        "invocation": invocation,
        "cells": [_request_cell(c) for c in cells],
        **(payload or {}),
    }


def write_request(path: Path, body: dict[str, Any]) -> None:
    """Write an engine job's request file (atomically: a sibling's chain may be reading)."""
    write_json(path, body)


def damaged_json(path: Path, *beside: Path) -> bool:
    """A result whose JSON file is there but does not parse (a truncated copy), or whose
    companions are gone: Snakemake would take it for finished. Reads, never removes."""
    try:
        exists = path.exists()
    except OSError:
        return False
    return exists and (_unreadable(path) or not all(p.exists() for p in beside))


def snakemake_has_record(output: str, workdir: str = ".") -> bool:
    """Whether Snakemake's metadata (`.snakemake/metadata/` under the working directory) holds a
    record of the job that wrote `output`, keyed as Snakemake keys it (the output's path as the
    rule names it, base64 in chunks of the file system's name limit). Without one (.snakemake/
    removed, a project copied without it, `--persistence-backend db`), Snakemake's params
    trigger does not see a changed setting: the plan then redoes the job through a redo input
    (ckpteval.plan.sweep). A layout this does not know reads as no record: a redo too many,
    never a stale result kept."""
    root = os.path.join(workdir, ".snakemake", "metadata")
    limit = _name_max(root)
    if limit is None:
        return False
    b64 = urlsafe_b64encode(output.encode()).decode()
    parts = [b64[i : i + limit - 1] for i in range(0, len(b64), limit - 1)]
    return os.path.exists(os.path.join(root, *["@" + s for s in parts[:-1]], parts[-1]))


_NAME_MAX: dict[str, int] = {}


def _name_max(directory: str) -> int | None:
    """The file system's name limit there (as Snakemake reads it), once per directory that
    exists; None: no such directory (yet)."""
    key = os.path.abspath(directory)
    if key not in _NAME_MAX:
        try:
            _NAME_MAX[key] = os.pathconf(key, "PC_NAME_MAX") or 255
        except OSError:
            return None
    return _NAME_MAX[key]


def redo_path(root: Path, damaged: Path, *, fresh: bool = True) -> Path:
    """The redo input of a damaged file's job: named by the file's path, size and mtime, so that
    it does not exist while the file is damaged this way (`fresh`: one that does was made for an
    earlier damage with the same name, and a serial number is added). Not `fresh` (a cluster
    job's own parse, after the main process planned and made it): the newest that exists."""
    stat = damaged.stat()
    key = sha256_json([str(damaged), stat.st_size, stat.st_mtime_ns])[:16]
    path, n = root / key, 0
    while path.exists():
        n += 1
        newer = root / f"{key}.{n}"
        if not fresh and not newer.exists():
            return path
        path = newer
    return path


def _request_cell(cell: StaleCell) -> dict[str, Any]:
    return {
        "task": cell.key.task,
        "variant": cell.key.variant,
        "reason": cell.reason,
        "record": cell.identity.record(),
    }


def write_done(path: Path, generated: Iterable[tuple[str, str]]) -> None:
    """An engine job's done file: its presence is what counts; the body lists the cells it
    generated."""
    write_json(path, {"generated": sorted(f"{t}/{v}" for t, v in generated)})
