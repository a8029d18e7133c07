"""Which results on disk are still valid, decided when the workflow is parsed.

Snakemake plans a job when an output is missing, an input is newer, or a declared param changed.
That is enough for consolidate, evaluate and aggregate, whose params are their identities
(ckpteval.contract). Generation files need one more step: one engine job per checkpoint writes
all of a checkpoint's generations, and a job that rewrote every file because one task was new
would rescore every cell. So the plan looks at each generation file's meta here and hands the
engine job only the cells that are missing or outdated; the others have no producing job in the
DAG and are plain inputs of their evaluate jobs. `explain` turns the same comparison into the
lines `snakemake -n` prints: which setting changed, old -> new.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.contract import Identity, generation_identity, model_identity, scoring_identity
from ckpteval.io import canonical_json, json_or_none, sha256_file
from ckpteval.plan.layout import CellKey, Layout

#: Why a cell whose files are there is stale all the same: a meta that does not parse, or a
#: generation file whose size is not the one its meta recorded (a truncated copy).
DAMAGED = "damaged (truncated or unreadable)"
#: Why a score cell that parses is redone all the same: it names another cell (a copy).
ANOTHER_CELL = "holds another cell's scores"
#: Why a replay cell is replayed: its files' content is not what its generation meta recorded
#: (new bytes, a task's files added, or a meta of an older ckpteval that recorded none).
NEW_SOLUTIONS = "its replayed files have new content"
#: Snakemake's `--max-checksum-file-size` default: an input newer than a job's output but no
#: larger than this, with the checksum recorded when the job ran, does not rerun the job.
SNAKEMAKE_CHECKSUM_MAX_BYTES = 1_000_000


@dataclass(frozen=True)
class StaleCell:
    """A generation file the engine job must (re)write, and why."""

    key: CellKey
    identity: Identity
    reason: str


def _read(path: str | Path) -> dict[str, Any] | None:
    data = json_or_none(path)
    return data if isinstance(data, dict) else None


#: What every evaluate job records in a score cell: the cell it scores, the settings it was
#: scored with and its metrics. A cell without one of them (`{}`, a hand-edited file) is no
#: score cell, whatever it parses as.
_CELL_FIELDS = ("run", "ckpt", "task", "variant")


def _cell_problem(read: dict[str, Any] | None, cell: CellKey) -> str | None:
    """Why a score cell read from `cell`'s path is not that cell's scores, or None: DAMAGED when
    it does not parse as one, ANOTHER_CELL when it names another cell (a copy)."""
    if read is None or not all(f in read for f in _CELL_FIELDS):
        return DAMAGED
    if not isinstance(read.get("scoring"), dict) or not isinstance(read.get("metrics"), dict):
        return DAMAGED
    if any(read[f] != getattr(cell, f) for f in _CELL_FIELDS):
        return ANOTHER_CELL
    return None


def _mtime(path: str | Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


class Freshness:
    """Parse-time comparison of the files under `outdir` with the plan (memoized per file)."""

    def __init__(self, plan: Any, outdir: Path | None = None) -> None:
        self.plan = plan
        self.layout = Layout(str(plan.outdir if outdir is None else outdir))

    def manifest_path(self, run: str, ckpt: str) -> Path:
        return Path(self.layout.manifest(run, ckpt))

    def source_id_path(self, run: str, ckpt: str) -> Path:
        """The checkpoint's content identity file (ckpteval.checkpoints.sync_source_identity)."""
        return Path(self.layout.source_id(run, ckpt))

    @functools.cache  # noqa: B019 - one Freshness per parse
    def generation_identity(self, run: str, task: str, variant: str) -> Identity:
        """A cell's generation identity: the same for every checkpoint of a run, so computed
        once per parse (ckpteval.contract; a pure function of the config)."""
        return generation_identity(self.plan, run, task, variant)

    @functools.cache  # noqa: B019
    def scoring_identity(self, run: str, task: str, variant: str) -> Identity:
        """A cell's scoring identity, once per (run, task, variant) and parse."""
        return scoring_identity(self.plan, run, task, variant)

    @functools.cache  # noqa: B019
    def _score(self, cell: CellKey) -> tuple[str | None, Any]:
        """(why it is not this cell's scores, or None; its recorded scoring settings) of a
        score cell: read once per parse, however many questions the plan asks of it (its rerun
        explanation, its redo input); only what they need is kept, not the cell's metrics. A
        cell copied from another one's path, or a `{}`, parses, but must be redone like a
        damaged one: Snakemake sees only a file newer than its inputs, and would keep it."""
        read = _read(self.layout.score(cell))
        return _cell_problem(read, cell), None if read is None else read.get("scoring")

    def score_damaged(self, cell: CellKey) -> bool:
        """A score cell that is there but does not parse as this cell's (ckpteval.verbs.
        damaged_json, sharing this parse's read of it), or whose samples file is gone."""
        return os.path.exists(self.layout.score(cell)) and (
            self._score(cell)[0] is not None or not os.path.exists(self.layout.score_samples(cell))
        )

    @functools.cache  # noqa: B019
    def model_identity(self, run: str, ckpt: str) -> Identity:
        """A checkpoint's model identity, once per parse (its consolidate job's param, and the
        rerun explanation's comparison)."""
        return model_identity(self.plan, run, ckpt)

    @functools.cache  # noqa: B019
    def manifest(self, run: str, ckpt: str) -> dict[str, Any] | None:
        """The model card as this parse found it, read once (the plan asks per cell)."""
        return _read(self.manifest_path(run, ckpt))

    def model_identity_changed(self, run: str, ckpt: str) -> bool:
        """A model (card) built with other settings than this config's: its job's identity
        param changed (what Snakemake's params trigger sees, given its metadata)."""
        manifest = self.manifest(run, ckpt)
        return manifest is not None and manifest.get("identity") != (
            self.model_identity(run, ckpt).digest
        )

    @functools.cache  # noqa: B019
    def model_change(self, run: str, ckpt: str) -> str | None:
        """Why this checkpoint's model (consolidation or model card) will be rebuilt, or None."""
        manifest = self.manifest(run, ckpt)
        if manifest is None:
            return "not built yet"
        if self.model_identity_changed(run, ckpt):
            changes = self.model_identity(run, ckpt).changes(manifest.get("settings"))
            return "; ".join(changes) if changes else "built by an older ckpteval"
        if not self.plan.runs[run].has_weights:
            return None
        if not os.path.isdir(self.layout.model_dir(run, ckpt)):
            return "its directory is missing"
        source, built = (
            _mtime(self.source_id_path(run, ckpt)),
            _mtime(self.manifest_path(run, ckpt)),
        )
        if source is not None and built is not None and source > built:
            return "the checkpoint's files have new content"
        return None

    def model_ids(self, run: str, ckpt: str) -> tuple[Any, Any]:
        """(weights hash, model card identity) of the model as it is now."""
        manifest = self.manifest(run, ckpt) or {}
        return manifest.get("weights_sha256"), manifest.get("identity_sha256")

    @functools.cache  # noqa: B019
    def _generation_stat(self, cell: CellKey) -> os.stat_result | None:
        """The generation file's stat, once per cell and parse: its size for `stale`, its
        modification time for `rescore_reason`."""
        try:
            return os.stat(self.layout.generation(cell))
        except OSError:
            return None

    @functools.cache  # noqa: B019
    def stale(self, cell: CellKey) -> StaleCell | None:
        """The cell if its generation file must be (re)written, else None."""
        run, ckpt = cell.run, cell.ckpt
        identity = self.generation_identity(run, cell.task, cell.variant)
        # Paths as strings: pathlib's `/` per part cost more than the reads themselves, paid
        # per cell in every parse and `ckpteval status`.
        meta_path = self.layout.generation_meta(cell)
        stat = self._generation_stat(cell)
        size = None if stat is None else stat.st_size
        meta = _read(meta_path) if size is not None else None
        if meta is None:
            damaged = size is not None or os.path.exists(meta_path)
            return StaleCell(cell, identity, DAMAGED if damaged else "missing")
        if meta.get("generation_bytes") not in (None, size):
            return StaleCell(cell, identity, DAMAGED)
        if meta.get("identity") != identity.digest:
            changes = identity.changes(meta.get("settings"))
            return StaleCell(cell, identity, "; ".join(changes) or "older format")
        solutions = self.plan.solutions_id(cell)
        if solutions is not None and meta.get("solutions_id") != solutions:
            return StaleCell(cell, identity, NEW_SOLUTIONS)
        model = self.model_change(run, ckpt)
        if model is not None:
            return StaleCell(cell, identity, f"model: {model}")
        if (meta.get("model_hash"), meta.get("model_identity")) != self.model_ids(run, ckpt):
            return StaleCell(cell, identity, "generated by another model")
        return None

    def stale_cells(self, run: str, ckpt: str, pairs: list[tuple[str, str]]) -> list[StaleCell]:
        return [
            stale for t, v in pairs if (stale := self.stale(CellKey(run, ckpt, t, v))) is not None
        ]

    def score_change(self, cell: CellKey) -> str | None:
        """Why a cell that exists will be rescored for a changed setting, or None."""
        problem, recorded = self._score(cell)
        return self._scoring_change(cell, recorded) if problem is None else None

    def _scoring_change(self, cell: CellKey, recorded: Any) -> str | None:
        """`recorded`: the cell's `scoring` (its provenance is merged into its top level)."""
        identity = self.scoring_identity(cell.run, cell.task, cell.variant)
        if recorded is None or canonical_json(recorded) == identity.canonical:
            return None
        return "; ".join(identity.changes(recorded))

    def rescore_reason(self, cell: CellKey, read: Any = None) -> str | None:
        """Why the next run scores again a cell whose score file is there, else None: each
        reason is an edge of its evaluate job (workflow/rules/common.smk, `get_evaluate_inputs`)
        that Snakemake sees. A damaged cell has a redo input; a changed scoring setting or
        reward function changes the job's identity param; generations the engine or replay job
        must (re)write precede it; a generation file or model card newer than the cell is
        Snakemake's mtime trigger. `ckpteval status` reads this, so it names the cells
        `snakemake -n` plans. `cell`: the score cell as the caller read it (status reads it
        anyway), else read here."""
        if isinstance(read, dict):
            problem, recorded = _cell_problem(read, cell), read.get("scoring")
        else:
            problem, recorded = self._score(cell)
        if not os.path.exists(self.layout.score_samples(cell)):
            return DAMAGED
        if problem is not None:
            return problem
        change = self._scoring_change(cell, recorded)
        if change:
            return f"scoring: {change}"
        stale = self.stale(cell)
        if stale is not None:
            return f"generations: {stale.reason}"
        scored = _mtime(self.layout.score(cell)) or 0.0
        generated = self._generation_stat(cell)
        generation = self.layout.generation(cell)
        if (
            generated is not None
            and generated.st_mtime > scored
            and not self._scored_these_bytes(cell, read, "generation_sha256", generation)
        ):
            return f"{generation} is newer than its scores"
        card = self.manifest_path(cell.run, cell.ckpt)
        if self._manifest_mtime(cell.run, cell.ckpt) > scored and not self._scored_these_bytes(
            cell, read, "manifest_sha256", card
        ):
            return f"{card} is newer than its scores"
        return None

    def _scored_these_bytes(self, cell: CellKey, read: Any, key: str, path: str | Path) -> bool:
        """Whether an input newer than the scores (the generation file, the model card) holds
        the bytes they were made from (rewritten alike: `-f` on it, a touch, served from the
        cache): the score cell records its sha256 as `key`. Snakemake then plans nothing for a
        file within its checksum threshold (it compares the checksum it recorded when the job
        ran). Only asked when the file is newer, so a parse hashes nothing in a sweep left
        alone; a cell without the record goes by the modification time."""
        record = read if isinstance(read, dict) else _read(self.layout.score(cell))
        recorded = record.get(key) if isinstance(record, dict) else None
        return bool(recorded) and recorded == self._checksum(str(path))

    @functools.cache  # noqa: B019
    def _checksum(self, path: str) -> str | None:
        """A file's sha256 where Snakemake would compare one (within its threshold), once per
        parse: a model card is asked for by each of its checkpoint's cells."""
        try:
            if os.stat(path).st_size > SNAKEMAKE_CHECKSUM_MAX_BYTES:
                return None
            return sha256_file(path)
        except OSError:
            return None

    @functools.cache  # noqa: B019
    def _manifest_mtime(self, run: str, ckpt: str) -> float:
        return _mtime(self.manifest_path(run, ckpt)) or 0.0

    def explain(self, pairs: list[tuple[str, str]]) -> list[str]:
        """One line per distinct reason: what a run of the workflow will redo, and why."""
        counts: dict[tuple[str, str], int] = {}

        def add(what: str, why: str) -> None:
            counts[(what, why)] = counts.get((what, why), 0) + 1

        for run_name, run in self.plan.runs.items():
            for ckpt in run.checkpoints:
                model = self.model_change(run_name, ckpt.name)
                if model is not None and model != "not built yet":
                    add(f"model of {run_name}", model)
                for stale in self.stale_cells(run_name, ckpt.name, pairs):
                    if stale.reason != "missing" and not stale.reason.startswith("model:"):
                        add(f"generations of {stale.key.task}", stale.reason)
                for task, variants in self.plan.task_variants.items():
                    for variant in variants:
                        why = self.score_change(CellKey(run_name, ckpt.name, task, variant))
                        if why:
                            add(f"scores of {task}", why)
        return [
            f"{what} ({n} {'checkpoint' if what.startswith('model') else 'cell'}"
            f"{'s' if n > 1 else ''}): {why}"
            for (what, why), n in sorted(counts.items())
        ]
